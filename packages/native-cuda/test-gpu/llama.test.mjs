// SmolLM2-135M-Instruct on the GPU (issue 18), through the same contracts as the CPU: the CUDA stage's logits
// against the CPU path with the same bf16 weights, greedy continuations compared, greedy speculation with each
// shipped drafter equal to plain GPU decoding token for token, sampled requests drawn on the device (the first
// token's χ² against p, seeded runs repeating), a batch equal to each sequence alone, malformed
// input refused without touching the cache, and `specd serve --device cuda` answering chat requests (plain, and
// with DFlash drafting on the GPU: the same text). Run on a GPU
// machine with `node --test packages/native-cuda/test-gpu/` (npm run test:gpu).
import * as assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import * as path from 'node:path';
import { after, before, test } from 'node:test';

import {
  DRAFTERS,
  GGUF_DIR,
  ROOT,
  greedyRequests,
  haveDrafter,
  heldOutPrompts,
  loadCpuReference,
  loadGpuDrafter,
  loadGpuTarget,
  runEngine,
} from './common.mjs';
import { chiCrit, chiSquare } from './reference.mjs';

let gpu;
let prompts;
before(async () => {
  gpu = await loadGpuTarget(1024);
  prompts = heldOutPrompts(4);
  console.log(`# ${gpu.model.describe()}`);
});
after(() => gpu?.model.dispose());

/**
 * One prefill of `ids` with every row's logits, in a fresh cache of the GPU stage; checks that the device's argmax of
 * each row (the one-launch two-pass kernel) is the first maximum of the row's logits as they came back.
 */
function prefillLogits(model, ids) {
  const cache = model.createCache({ pageSize: 16, numPages: 64, numSlots: 1, maxSequenceLength: 1000 });
  cache.add(1);
  const res = model.forward({ sequences: [{ id: 1, position: 0, tokens: ids, logits: 'all' }] }, cache);
  cache.finish(1);
  const V = model.info.vocabSize;
  for (let r = 0; r < ids.length; r++) {
    let b = 0;
    for (let j = 1; j < V; j++) if (res.logits[r * V + j] > res.logits[r * V + b]) b = j;
    assert.equal(res.argmax[r], b, `row ${r}: the device argmax`);
  }
  return res.logits;
}

test('logits within bf16 tolerance of the CPU path with the same bf16 weights (fp32 activations)', async () => {
  const cpu = await loadCpuReference();
  try {
    const { SequenceCache } = await import('@specd/core');
    const V = gpu.model.info.vocabSize;
    let worst = 0;
    let agree = 0;
    let rows = 0;
    for (const p of prompts) {
      const cpuCache = new SequenceCache(cpu.model.cacheGeometry, { pageSize: 16, numPages: 64, numSlots: 1 });
      cpuCache.add(1);
      const ref = cpu.model.forward(
        { sequences: [{ id: 1, position: 0, tokens: p.ids, logits: 'all' }] },
        cpuCache,
      ).logits;
      const got = prefillLogits(gpu.model, p.ids);
      let maxRef = 0;
      let maxDiff = 0;
      let sumDiff = 0;
      let sumRef = 0;
      for (let i = 0; i < ref.length; i++) {
        maxRef = Math.max(maxRef, Math.abs(ref[i]));
        maxDiff = Math.max(maxDiff, Math.abs(ref[i] - got[i]));
        sumDiff += Math.abs(ref[i] - got[i]);
        sumRef += Math.abs(ref[i]);
      }
      for (let r = 0; r < p.ids.length; r++) {
        let a = 0;
        let b = 0;
        for (let j = 1; j < V; j++) {
          if (ref[r * V + j] > ref[r * V + a]) a = j;
          if (got[r * V + j] > got[r * V + b]) b = j;
        }
        agree += a === b ? 1 : 0;
        rows++;
      }
      const rel = maxDiff / maxRef;
      worst = Math.max(worst, rel);
      console.log(
        `# ${p.id}: ${p.ids.length} rows, max |Δ| ${maxDiff.toFixed(4)} of max |logit| ${maxRef.toFixed(2)} ` +
          `(${rel.toExponential(2)}), mean |Δ| / mean |logit| ${(sumDiff / sumRef).toExponential(2)}`,
      );
    }
    console.log(`# argmax agreement ${agree} / ${rows} rows; worst max |Δ| / max |logit| ${worst.toExponential(2)}`);
    // bf16 inputs to every GEMM (2^-9 relative rounding each) over 30 layers: 3e-2 of the logit range, and the
    // argmax equal on at least 95 % of the rows (the rest are near-ties)
    assert.ok(worst <= 3e-2, `worst relative logit difference ${worst}`);
    assert.ok(agree >= 0.95 * rows, `argmax agreement ${agree} / ${rows}`);
  } finally {
    cpu.model.dispose();
  }
});

/**
 * Logits of a 5-row block after a prefill of the rest of `ids` (the block takes the small-GEMM path of ≤ 16 rows,
 * the prefill cuBLASLt), under launch options `opts` and graphs on or off.
 */
function blockLogits(model, ids, opts, graphs, tail = 5) {
  model.setLaunchOptions(opts);
  const saved = model.graphs;
  model.graphs = graphs;
  try {
    const cache = model.createCache({ pageSize: 16, numPages: 64, numSlots: 1, maxSequenceLength: 1000 });
    cache.add(1);
    const n = ids.length - tail;
    model.forward({ sequences: [{ id: 1, position: 0, tokens: ids.subarray(0, n), logits: 'last' }] }, cache);
    const res = model.forward({ sequences: [{ id: 1, position: n, tokens: ids.subarray(n), logits: 'all' }] }, cache);
    cache.finish(1);
    return res.logits;
  } finally {
    model.graphs = saved;
    model.setLaunchOptions({ smallGemm: true, pdl: true });
  }
}

test('blocks of ≤ 16 rows (small GEMM): near the CPU and cuBLASLt; graphs, PDL, padding change no bit', async () => {
  const cpu = await loadCpuReference();
  try {
    const { SequenceCache } = await import('@specd/core');
    const V = gpu.model.info.vocabSize;
    const tail = 5;
    for (const p of prompts.slice(0, 3)) {
      const cpuCache = new SequenceCache(cpu.model.cacheGeometry, { pageSize: 16, numPages: 64, numSlots: 1 });
      cpuCache.add(1);
      const all = cpu.model.forward(
        { sequences: [{ id: 1, position: 0, tokens: p.ids, logits: 'all' }] },
        cpuCache,
      ).logits;
      const ref = all.subarray((p.ids.length - tail) * V);
      const small = blockLogits(gpu.model, p.ids, { smallGemm: true, pdl: true }, true);
      // 5 rows pad to 8 under graphs (padded rows are real rows of token 0); without graphs the kernel zero-pads
      const bits = (a) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);
      assert.ok(
        bits(blockLogits(gpu.model, p.ids, { smallGemm: true, pdl: true }, false)).equals(bits(small)),
        'graphs off',
      );
      assert.ok(
        bits(blockLogits(gpu.model, p.ids, { smallGemm: true, pdl: false }, true)).equals(bits(small)),
        'PDL off',
      );
      const cublas = blockLogits(gpu.model, p.ids, { smallGemm: false, pdl: false }, true);
      const rel = (a, b) => {
        let maxRef = 0;
        let maxDiff = 0;
        for (let i = 0; i < a.length; i++) {
          maxRef = Math.max(maxRef, Math.abs(b[i]));
          maxDiff = Math.max(maxDiff, Math.abs(a[i] - b[i]));
        }
        return maxDiff / maxRef;
      };
      let agree = 0;
      for (let r = 0; r < tail; r++) {
        let a = 0;
        let b = 0;
        for (let j = 1; j < V; j++) {
          if (ref[r * V + j] > ref[r * V + a]) a = j;
          if (small[r * V + j] > small[r * V + b]) b = j;
        }
        agree += a === b ? 1 : 0;
      }
      const vsCpu = rel(small, ref);
      const vsCublas = rel(small, cublas);
      console.log(
        `# ${p.id}: ${tail}-row block, small GEMM vs CPU ${vsCpu.toExponential(2)}, vs cuBLASLt ` +
          `${vsCublas.toExponential(2)} (max |Δ| / max |logit|), argmax equal to the CPU's on ${agree} / ${tail}`,
      );
      assert.ok(vsCpu <= 3e-2, `small GEMM vs CPU ${vsCpu}`);
      assert.ok(vsCublas <= 3e-2, `small GEMM vs cuBLASLt ${vsCublas}`);
    }
  } finally {
    cpu.model.dispose();
  }
});

test('greedy continuations: GPU runs repeat bit for bit; GPU vs CPU differences reported', async () => {
  const reqs = greedyRequests(prompts, 64);
  const a = runEngine(gpu.model, undefined, reqs).results;
  const b = runEngine(gpu.model, undefined, reqs).results;
  for (const p of prompts) assert.deepEqual(b.get(p.id), a.get(p.id), `run-to-run, prompt ${p.id}`);
  const cpu = await loadCpuReference();
  try {
    const c = runEngine(cpu.model, undefined, reqs).results;
    let same = 0;
    for (const p of prompts) {
      const g = a.get(p.id);
      const r = c.get(p.id);
      const first = g.findIndex((t, i) => t !== r[i]);
      if (first < 0) same++;
      console.log(`# ${p.id}: ${first < 0 ? 'equal (64 tokens)' : `first difference at token ${first}`}`);
    }
    console.log(`# GPU vs CPU (bf16 weights, fp32 activations): ${same} / ${prompts.length} continuations equal`);
  } finally {
    cpu.model.dispose();
  }
});

for (const method of ['eagle3', 'dflash', 'dspark']) {
  test(`greedy speculation with ${method} equals plain GPU decoding token for token`, async (t) => {
    if (!haveDrafter(method)) return t.skip(`no ${method} checkpoint here`);
    const reqs = greedyRequests(prompts, 64);
    const plain = runEngine(gpu.model, undefined, reqs).results;
    const drafter = await loadGpuDrafter(method, gpu);
    try {
      const { results, engine } = runEngine(gpu.model, drafter, reqs, { draftPolicy: 'max' });
      for (const p of prompts) assert.deepEqual(results.get(p.id), plain.get(p.id), `prompt ${p.id}`);
      const m = engine.metrics;
      console.log(`# ${method}: τ per verify step ${m.tauPerStep.toFixed(3)}, drafted ${m.drafted}`);
      assert.ok(m.drafted > 0);
      assert.equal(m.decodeForwards, m.verifyForwards);
      assert.equal(engine.cache.pagesInUse + engine.cache.slotsInUse + drafter.pagesInUse, 0);
    } finally {
      drafter.dispose();
    }
  });
}

/** Counts the stage's sampleOnDevice calls and the forwards that returned logits while `body` runs. */
async function countDeviceSampling(model, body) {
  const [sample, forward] = [model.sampleOnDevice, model.forward];
  const n = { sampled: 0, logits: 0 };
  model.sampleOnDevice = (...a) => {
    n.sampled++;
    return sample.apply(model, a);
  };
  model.forward = (...a) => {
    const r = forward.apply(model, a);
    if (r.logits !== undefined && r.logits.length > 0) n.logits++;
    return r;
  };
  try {
    return { ...(await body()), ...n };
  } finally {
    model.sampleOnDevice = sample;
    model.forward = forward;
  }
}

test('sampled requests draw on the device (no logits come back); the first token is distributed as p', async () => {
  const { samplingProbs } = await import('@specd/native');
  const p = prompts[0];
  const V = gpu.model.info.vocabSize;
  const logits = prefillLogits(gpu.model, p.ids);
  const sampling = { temperature: 1, topK: 40 };
  const probs = samplingProbs(logits.subarray((p.ids.length - 1) * V, p.ids.length * V), V, 1, 40, 1);
  const N = 2000;
  const reqs = Array.from({ length: N }, (_, i) => ({
    id: `s${i}`,
    promptIds: p.ids,
    maxTokens: 1,
    sampling,
    seed: i + 1,
    ignoreEos: true,
  }));
  const run = await countDeviceSampling(gpu.model, async () => runEngine(gpu.model, undefined, reqs));
  assert.equal(run.logits, 0, 'no forward returned logits');
  assert.equal(run.sampled, N);
  const counts = new Float64Array(V);
  for (const r of reqs) counts[run.results.get(r.id)[0]]++;
  const { stat, df } = chiSquare(counts, probs, N);
  const crit = chiCrit(df);
  console.log(
    `# first token, T 1, top-k 40, ${N} seeds: χ² ${stat.toFixed(1)} (df ${df}, critical ${crit.toFixed(1)})`,
  );
  assert.ok(stat < crit, `χ² ${stat} ≥ ${crit}`);
});

test('seeded sampling repeats on the device, plain and with EAGLE-3 (drafts verified on the device)', async (t) => {
  const reqs = prompts.map((p, i) => ({
    id: p.id,
    promptIds: p.ids,
    maxTokens: 48,
    sampling: { temperature: 0.8, topP: 0.95, topK: 200 },
    seed: 100 + i,
    ignoreEos: true,
  }));
  const a = await countDeviceSampling(gpu.model, async () => runEngine(gpu.model, undefined, reqs));
  const b = runEngine(gpu.model, undefined, reqs, { maxSequences: 4 });
  for (const r of reqs) {
    assert.equal(a.results.get(r.id).length, 48);
    assert.deepEqual(b.results.get(r.id), a.results.get(r.id), `plain, prompt ${r.id}: 4 at once as alone`);
  }
  assert.equal(a.logits, 0, 'no forward returned logits');
  if (!haveDrafter('eagle3')) return t.skip('no eagle3 checkpoint here');
  const drafter = await loadGpuDrafter('eagle3', gpu, 4);
  try {
    const runs = [];
    for (let i = 0; i < 2; i++)
      runs.push(
        await countDeviceSampling(gpu.model, async () =>
          runEngine(gpu.model, drafter, reqs, { maxSequences: 4, draftPolicy: 'max' }),
        ),
      );
    for (const r of reqs) assert.deepEqual(runs[1].results.get(r.id), runs[0].results.get(r.id), `prompt ${r.id}`);
    const m = runs[0].engine.metrics;
    console.log(`# sampled EAGLE-3 on the device: τ per verify step ${m.tauPerStep.toFixed(3)}, drafted ${m.drafted}`);
    assert.ok(m.drafted > 0);
    assert.equal(runs[0].logits, 0, 'no forward returned logits');
    assert.ok(runs[0].sampled > 0);
    assert.equal(runs[0].engine.cache.pagesInUse + drafter.pagesInUse, 0);
  } finally {
    drafter.dispose();
  }
});

test('a batch of 4 sequences decodes as each sequence alone', () => {
  const reqs = greedyRequests(prompts.slice(0, 4), 48);
  const alone = runEngine(gpu.model, undefined, reqs).results;
  const { results, engine } = runEngine(gpu.model, undefined, reqs, { maxSequences: 4 });
  for (const r of reqs) assert.deepEqual(results.get(r.id), alone.get(r.id), `prompt ${r.id}`);
  assert.equal(engine.cache.pagesInUse, 0);
});

test('malformed input is refused before the cache is touched; a foreign cache is refused', async () => {
  const { SequenceCache } = await import('@specd/core');
  const cache = gpu.model.createCache({ pageSize: 16, numPages: 8, numSlots: 1, maxSequenceLength: 64 });
  cache.add(7);
  const fwd = (tokens, extra = {}) =>
    gpu.model.forward({ sequences: [{ id: 7, position: 0, tokens, logits: 'last', ...extra }] }, cache);
  assert.throws(() => fwd(Int32Array.of(1, 49152)), /outside \[0, 49152\)/);
  // 64 tokens per sequence + one page: 80 at most
  assert.throws(() => fwd(new Int32Array(100)), /100 tokens, more than the CUDA KV pool's 80 per sequence/);
  assert.throws(() => fwd(Int32Array.of(1, 2), { tree: Int32Array.of(-1, 0) }), /token trees/);
  assert.equal(cache.length(7), 0);
  const r = fwd(Int32Array.of(1, 2, 3), {});
  assert.equal(r.logits.length, gpu.model.info.vocabSize);
  assert.equal(cache.length(7), 3);
  const foreign = new SequenceCache(gpu.model.cacheGeometry, { pageSize: 16, numPages: 8, numSlots: 1 });
  foreign.add(7);
  assert.throws(
    () => gpu.model.forward({ sequences: [{ id: 7, position: 0, tokens: Int32Array.of(1), logits: 'last' }] }, foreign),
    /expected the cache from this stage's createCache/,
  );
  cache.finish(7);
});

/** The answers of `specd serve --device cuda` with `spec` (`--no-spec`, or a drafter) to the prompts, greedy. */
async function serveAnswers(spec, questions) {
  const child = spawn(
    process.execPath,
    [
      path.join(ROOT, 'packages/core/src/cli/bin.js'),
      'serve',
      '--model',
      GGUF_DIR,
      ...spec,
      '--device',
      'cuda',
      '--port',
      '0',
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let err = '';
  child.stdout.resume();
  try {
    const url = await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no listening line in 120 s:\n${err}`)), 120_000);
      child.stderr.on('data', (d) => {
        err += d;
        const m = /listening on (\S+)/.exec(err);
        if (m !== null) {
          clearTimeout(timer);
          resolve(m[1]);
        }
      });
      child.on('exit', (code) => reject(new Error(`serve exited with ${code}:\n${err}`)));
    });
    console.log(
      `# ${spec.join(' ')}: ${err
        .split('\n')
        .filter((l) => /cuda|drafter/i.test(l))
        .join('\n# ')}`,
    );
    const models = await (await fetch(`${url}/v1/models`)).json();
    // one at a time: a prefill batched with another request's would be a different GEMM shape above 32 rows
    const answers = [];
    for (const q of questions) {
      const res = await fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: models.data[0].id,
          messages: [{ role: 'user', content: q }],
          max_tokens: 24,
          temperature: 0,
        }),
      });
      const body = await res.json();
      console.log(`# ${res.status} ${JSON.stringify(body).slice(0, 300)}`);
      assert.equal(res.status, 200);
      assert.ok(body.choices[0].message.content.length > 0);
      // EOS ends the answer early (finish_reason stop) or max_tokens does (length)
      const { finish_reason: finish } = body.choices[0];
      assert.ok(finish === 'stop' ? body.usage.completion_tokens <= 24 : body.usage.completion_tokens === 24, finish);
      answers.push(body.choices[0].message.content);
    }
    return answers;
  } finally {
    child.kill('SIGINT');
  }
}

test('specd serve --device cuda answers chat requests end to end, with DFlash on the GPU the same text', async () => {
  const questions = ['Name three colors.', 'What is the capital of France?', 'Write a haiku about rain.'];
  const plain = await serveAnswers(['--no-spec'], questions);
  if (!haveDrafter('dflash')) return;
  const spec = await serveAnswers(['--drafter', DRAFTERS.dflash], questions);
  assert.deepEqual(spec, plain);
});
