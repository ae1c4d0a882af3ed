// The EAGLE-3 drafter on the GPU (issue 18) beside SmolLM2 on the CUDA stage, against the CPU EAGLE-3 drafter on the
// same GPU target: the draft-vocabulary logits of forced chains, the greedy drafts of every propose of a run (both
// drafters fed the same context; agreement reported, ≥ 90 % of draft positions asserted), greedy speculation equal
// to plain GPU decoding token for token (8 prompts × 64 tokens), τ within 5 % of the CPU drafter's, sampled
// drafting (drawn on the device, q left there: lossless by a χ² of the 2nd and 3rd tokens), and no draft KV page left
// in use. Skips without a GPU or without the checkpoint. Run on a GPU machine:
// `node --test packages/native-cuda/test-gpu/eagle3.test.mjs` (part of npm run test:gpu).
import * as assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import {
  DRAFTERS,
  greedyRequests,
  haveDrafter,
  heldOutPrompts,
  loadGpuDrafter,
  loadGpuTarget,
  runEngine,
  sampledChiSquare,
  tee,
} from './common.mjs';

let gpu;
let skip;
let prompts;
before(async () => {
  if (!haveDrafter('eagle3')) {
    skip = 'no eagle3 checkpoint here';
    return;
  }
  try {
    gpu = await loadGpuTarget(1024);
  } catch (err) {
    skip = `no GPU: ${err.message.split('\n')[0]}`;
    return;
  }
  prompts = heldOutPrompts(4); // 4 chat + 4 plain
});
after(() => gpu?.model.dispose());

/** The EAGLE-3 drafter on `device` ('cuda' or 'cpu') for the GPU target. */
async function eagle3(device, maxSeqs = 1) {
  const { BUILTIN_PLUGIN_PACKAGES, loadDrafter } = await import('@specd/core');
  const r = await loadDrafter(
    { dir: DRAFTERS.eagle3, settings: { device } },
    BUILTIN_PLUGIN_PACKAGES,
    gpu,
    1024,
    maxSeqs,
  );
  return r.drafter;
}

test('the plugin puts EAGLE-3 on the GPU for the CUDA stage; forced chains match the CPU drafter', async (t) => {
  if (skip) return t.skip(skip);
  const g = await eagle3('auto');
  const c = await eagle3('cpu');
  try {
    assert.equal(g.device, 'cuda');
    assert.equal(g.constructor.name, 'Eagle3CudaDrafter');
    assert.equal(c.constructor.name, 'Eagle3Drafter');
    const Vd = g.config.draftVocabSize;
    let worst = 0;
    let agree = 0;
    let rows = 0;
    for (const p of prompts.slice(0, 4)) {
      // the target's taps of the prompt, then the same context rows into both drafters
      const cache = gpu.model.createCache({ pageSize: 16, numPages: 64, numSlots: 1, maxSequenceLength: 1000 });
      cache.add(1);
      const taps = g.captureSetter(gpu.model.info);
      const res = gpu.model.forward({ sequences: [{ id: 1, position: 0, tokens: p.ids, logits: 'last' }] }, cache, {
        taps,
      });
      cache.finish(1);
      const n = p.ids.length;
      const next = new Int32Array(n);
      next.set(p.ids.subarray(1));
      next[n - 1] = res.argmax[0];
      const span = [{ id: p.id, position: 0, numTokens: n, nextTokens: next }];
      for (const d of [g, c]) {
        d.addSequence(p.id);
        d.writeProjectedContextKV(d.projectTargetHiddenPartial(res.taps, n), span);
      }
      const seq = { id: p.id, position: n, lastToken: next[n - 1] };
      const forced = Int32Array.from({ length: 5 }, (_, j) => (17 * j + 3) % Vd);
      const a = g.forcedChainLogits(seq, forced);
      const b = c.forcedChainLogits(seq, forced);
      for (let j = 0; j <= forced.length; j++) {
        let maxRef = 0;
        let maxDiff = 0;
        let ia = 0;
        let ib = 0;
        for (let e = 0; e < Vd; e++) {
          const x = a[j * Vd + e];
          const y = b[j * Vd + e];
          maxRef = Math.max(maxRef, Math.abs(y));
          maxDiff = Math.max(maxDiff, Math.abs(x - y));
          if (x > a[j * Vd + ia]) ia = e;
          if (y > b[j * Vd + ib]) ib = e;
        }
        worst = Math.max(worst, maxDiff / maxRef);
        agree += ia === ib ? 1 : 0;
        rows++;
      }
      g.freeSequence(p.id);
      c.freeSequence(p.id);
    }
    console.log(`# forced chains: argmax equal on ${agree} / ${rows} steps; worst max |Δ| / max |logit| ${worst}`);
    assert.ok(worst <= 3e-2, `worst relative draft-logit difference ${worst}`);
    assert.ok(agree >= 0.9 * rows, `argmax agreement ${agree} / ${rows}`);
    assert.equal(g.pagesInUse + c.pagesInUse, 0);
  } finally {
    g.dispose();
    c.dispose();
  }
});

test('greedy drafts agree with the CPU drafter; speculation equals plain GPU decoding; τ within 5 %', async (t) => {
  if (skip) return t.skip(skip);
  const reqs = greedyRequests(prompts, 64);
  const plain = runEngine(gpu.model, undefined, reqs).results;
  const g = await eagle3('cuda');
  const c = await eagle3('cpu');
  try {
    // both drafters on the same contexts (the GPU drafter's proposals verified)
    const both = tee(g, c);
    const teed = runEngine(gpu.model, both, reqs, { draftPolicy: 'max' });
    const s = both.stats;
    const pct = ((100 * s.agree) / s.positions).toFixed(1);
    console.log(
      `# greedy drafts: ${s.agree} / ${s.positions} draft positions equal (${pct} %), mean equal prefix ` +
        `${(s.prefix / s.proposals).toFixed(2)}, ${s.identical} / ${s.proposals} proposals identical`,
    );
    assert.ok(s.agree >= 0.9 * s.positions, `draft agreement ${s.agree} / ${s.positions}`);
    for (const p of prompts) assert.deepEqual(teed.results.get(p.id), plain.get(p.id), `tee, prompt ${p.id}`);
    // each drafter alone
    const onGpu = runEngine(gpu.model, g, reqs, { draftPolicy: 'max' });
    const onCpu = runEngine(gpu.model, c, reqs, { draftPolicy: 'max' });
    for (const p of prompts) assert.deepEqual(onGpu.results.get(p.id), plain.get(p.id), `prompt ${p.id}`);
    const tg = onGpu.engine.metrics.tauPerStep;
    const tc = onCpu.engine.metrics.tauPerStep;
    console.log(
      `# τ per verify step: GPU drafter ${tg.toFixed(3)}, CPU drafter ${tc.toFixed(3)}; ` +
        `wall ${onGpu.ms.toFixed(0)} ms vs ${onCpu.ms.toFixed(0)} ms; graphs [${g.runnerInfo().graphs.join(', ')}]`,
    );
    assert.ok(Math.abs(tg - tc) <= 0.05 * tc, `τ ${tg} vs ${tc}`);
    assert.ok(onGpu.engine.metrics.drafted > 0);
    assert.equal(onGpu.engine.cache.pagesInUse + onGpu.engine.cache.slotsInUse + g.pagesInUse, 0);
    assert.equal(c.pagesInUse, 0);
  } finally {
    g.dispose();
    c.dispose();
  }
});

test('sampled requests draft on the GPU with q; 4 sequences at once; no page left in use', async (t) => {
  if (skip) return t.skip(skip);
  const g = await eagle3('cuda', 4);
  try {
    const reqs = prompts.slice(0, 4).map((p, i) => ({
      id: p.id,
      promptIds: p.ids,
      maxTokens: 32,
      sampling: { temperature: 0.8, topP: 0.95 },
      seed: i + 1,
      ignoreEos: true,
    }));
    const { results, engine } = runEngine(gpu.model, g, reqs, { maxSequences: 4, draftPolicy: 'max' });
    for (const r of reqs) assert.equal(results.get(r.id).length, 32, `prompt ${r.id}`);
    const m = engine.metrics;
    console.log(`# sampled, 4 sequences: τ per verify step ${m.tauPerStep.toFixed(3)}, drafted ${m.drafted}`);
    assert.ok(m.drafted > 0);
    // greedy at 4 sequences: the same tokens as each alone on plain GPU decoding
    const greedy = greedyRequests(prompts.slice(0, 4), 32);
    const plain = runEngine(gpu.model, undefined, greedy).results;
    const batched = runEngine(gpu.model, g, greedy, { maxSequences: 4, draftPolicy: 'max' });
    for (const r of greedy) assert.deepEqual(batched.results.get(r.id), plain.get(r.id), `batched, prompt ${r.id}`);
    assert.equal(g.pagesInUse, 0);
    assert.equal(batched.engine.cache.pagesInUse, 0);
  } finally {
    g.dispose();
  }
});

test('sampled speculation with q left on the device is lossless: (2nd, 3rd) tokens ~ the target (χ²)', async (t) => {
  if (skip) return t.skip(skip);
  const g = await eagle3('cuda');
  try {
    const r = await sampledChiSquare(gpu.model, g, prompts[0].ids, 'eagle3Probs');
    console.log(`# sampled EAGLE-3 on the GPU, ${r.line}`);
    assert.ok(r.stat < r.crit, `χ² ${r.stat} ≥ ${r.crit}`);
    assert.ok(r.drafted > 0 && r.accepted > 0 && r.accepted < r.drafted);
    assert.equal(r.copies, 0, 'q stayed on the device');
    assert.equal(g.pagesInUse, 0);
  } finally {
    g.dispose();
  }
});

test('refusals: a chain past the positions, a foreign sum; loadGpuDrafter picks the GPU drafter', async (t) => {
  if (skip) return t.skip(skip);
  const g = await loadGpuDrafter('eagle3', gpu);
  try {
    assert.equal(g.device, 'cuda');
    g.addSequence('r');
    const D = gpu.model.info.hiddenSize;
    // a projection from elsewhere ([n, D] f32) is written as g
    g.writeProjectedContextKV(new Float32Array(3 * D).fill(0.5), [
      { id: 'r', position: 0, numTokens: 3, nextTokens: Int32Array.of(1, 2, 3) },
    ]);
    assert.throws(
      () => g.writeProjectedContextKV(new Float32Array(5), [{ id: 'r', position: 3, numTokens: 1, nextTokens: [1] }]),
      /sum: expected \[1, 576\]/,
    );
    const seq = (position, maxDrafts) => ({
      id: 'r',
      position,
      lastToken: 4,
      maxDrafts,
      history: new Int32Array(position + 1),
      sampling: { temperature: 0 },
      rng: { next: () => 0.5 },
    });
    const [p] = g.propose({ sequences: [seq(3, g.maxDraftTokens)] });
    assert.equal(p.tokens.length, g.maxDraftTokens);
    assert.throws(() => g.propose({ sequences: [seq(4, 1)] }), /not the draft context length/);
    g.freeSequence('r');
    assert.equal(g.pagesInUse, 0);
  } finally {
    g.dispose();
  }
});
