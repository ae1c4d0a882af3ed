// Shared by the GPU tests and benches of the whole-model CUDA path (llama.test.mjs, bench-gpu/llama.mjs): where the
// SmolLM2 GGUF and its drafters are, the held-out prompts, and loaders for the GPU and CPU targets. Runs from the
// built code (packages/*/dist) with `node`, never vitest (the GPU machine has no dev dependencies).
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { BUILTIN_PLUGIN_PACKAGES, SpecEngine, loadDrafter, loadTarget } from '@specd/core';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
/** The SmolLM2 GGUF folder (SPECD_GGUF_DIR overrides: the GPU machine's staged copy). */
export const GGUF_DIR = process.env.SPECD_GGUF_DIR ?? path.join(ROOT, 'models/smollm2-135m-instruct');
/** Drafter folders (SPECD_DRAFTERS_DIR overrides the parent folder). */
const DRAFTERS_DIR = process.env.SPECD_DRAFTERS_DIR ?? path.join(ROOT, 'models');
export const DRAFTERS = Object.fromEntries(
  ['eagle3', 'dflash', 'dspark'].map((m) => [m, path.join(DRAFTERS_DIR, `smollm2-135m-instruct-${m}`)]),
);

/** Whether a drafter's checkpoint is here. */
export const haveDrafter = (method) => fs.existsSync(path.join(DRAFTERS[method], 'config.json'));

/**
 * The first `n` prompts of each held-out set (tools/reference/smollm2/prompts/{chat,plain}.jsonl, chat template
 * already applied) as {id, ids: Int32Array}.
 */
export function heldOutPrompts(n) {
  const out = [];
  for (const domain of ['chat', 'plain']) {
    const lines = fs
      .readFileSync(path.join(ROOT, 'tools/reference/smollm2/prompts', `${domain}.jsonl`), 'utf8')
      .trim()
      .split('\n')
      .slice(0, n);
    for (const l of lines) {
      const row = JSON.parse(l);
      out.push({ id: row.id, ids: Int32Array.from(row.prompt_token_ids) });
    }
  }
  return out;
}

/** The SmolLM2 target on the GPU (`maxTokens` rows per forward at most). */
export const loadGpuTarget = (maxTokens = 2048) =>
  loadTarget(GGUF_DIR, BUILTIN_PLUGIN_PACKAGES, undefined, { device: 'cuda', maxTokens });

/**
 * The SmolLM2 target on the CPU with the GPU's weights (the GGUF dequantized to bf16) and fp32 activations: the
 * reference the GPU's logits are compared with.
 */
export async function loadCpuReference() {
  const saved = [process.env.SPECD_GGUF_WEIGHTS, process.env.SPECD_GGUF_ACT];
  process.env.SPECD_GGUF_WEIGHTS = 'bf16';
  process.env.SPECD_GGUF_ACT = 'f32';
  try {
    return await loadTarget(GGUF_DIR, BUILTIN_PLUGIN_PACKAGES);
  } finally {
    if (saved[0] === undefined) delete process.env.SPECD_GGUF_WEIGHTS;
    else process.env.SPECD_GGUF_WEIGHTS = saved[0];
    if (saved[1] === undefined) delete process.env.SPECD_GGUF_ACT;
    else process.env.SPECD_GGUF_ACT = saved[1];
  }
}

/** Loads a drafter for `target` (sequences of up to 1,024 tokens, `maxSeqs` at once). */
export const loadGpuDrafter = (method, target, maxSeqs = 1) =>
  loadDrafter(DRAFTERS[method], BUILTIN_PLUGIN_PACKAGES, target, 1024, maxSeqs).then((d) => d.drafter);

/** Greedy requests over `prompts`, EOS ignored. */
export const greedyRequests = (prompts, maxTokens) =>
  prompts.map((p) => ({
    id: p.id,
    promptIds: p.ids,
    maxTokens,
    sampling: { temperature: 0 },
    seed: 0,
    ignoreEos: true,
  }));

/** Runs `requests` through a fresh engine; returns {results: Map id → tokenIds, engine, ms}. */
export function runEngine(model, drafter, requests, options = {}) {
  const engine = new SpecEngine(model, drafter, { maxSequences: 1, maxTokensPerSequence: 1024, ...options });
  const t0 = performance.now();
  const out = engine.run(requests);
  const ms = performance.now() - t0;
  return { results: new Map(out.map((r) => [r.id, Array.from(r.tokenIds)])), engine, ms };
}

/**
 * A drafter that feeds the same calls to the GPU and the CPU drafter and returns the GPU drafter's proposals,
 * counting draft positions where the two agree (every position; and up to the first difference).
 */
export function tee(g, c) {
  const sums = new WeakMap();
  const stats = { positions: 0, agree: 0, prefix: 0, proposals: 0, identical: 0 };
  return {
    stats,
    method: g.method,
    maxDraftTokens: g.maxDraftTokens,
    captureSetter: (info) => g.captureSetter(info),
    projectTargetHiddenPartial(taps, n, acc) {
      const out = g.projectTargetHiddenPartial(taps, n, acc);
      sums.set(out, c.projectTargetHiddenPartial(taps, n, acc));
      return out;
    },
    writeProjectedContextKV(sum, spans) {
      c.writeProjectedContextKV(sums.get(sum), spans);
      g.writeProjectedContextKV(sum, spans);
    },
    propose(batch) {
      const a = g.propose(batch);
      const b = c.propose(batch);
      a.forEach((p, i) => {
        const q = b[i].tokens;
        let first = p.tokens.findIndex((t, j) => t !== q[j]);
        if (first < 0) first = p.tokens.length;
        stats.positions += p.tokens.length;
        stats.agree += p.tokens.filter((t, j) => t === q[j]).length;
        stats.prefix += first;
        stats.proposals++;
        stats.identical += first === p.tokens.length ? 1 : 0;
      });
      return a;
    },
    addSequence(id) {
      g.addSequence(id);
      c.addSequence(id);
    },
    contextLength: (id) => g.contextLength(id),
    freeSequence(id) {
      g.freeSequence(id);
      c.freeSequence(id);
    },
    get pagesInUse() {
      return g.pagesInUse + c.pagesInUse;
    },
    dispose() {},
  };
}

/**
 * Sampled speculation through `drafter` on the GPU target `model` against the target's own distribution: 3,000
 * requests of `prompt` (T 1, top-k 4, 3 new tokens, one sequence at a time, draft policy 'max'); the (2nd, 3rd) tokens'
 * counts against Σ_a p(a) p(b | a) p(c | a, b), with p computed as the engine computes it (the prompt in chunks of 64,
 * then single rows of the row-invariant small GEMM), so the top-k sets are the same bits, not cut differently at a
 * near-tie. Counts the calls of the addon's `copyFn` (a drafter's q copied back to the host).
 * @returns {stat, df, crit, drafted, accepted, copies, line}; throws when a pair outside the target's support comes up.
 */
export async function sampledChiSquare(model, drafter, prompt, copyFn) {
  const { samplingProbs } = await import('@specd/native');
  const { chiCrit, chiSquare } = await import('./reference.mjs');
  const V = model.info.vocabSize;
  const topK = 4;
  const CHUNK = 64;
  const cache = model.createCache({ pageSize: 16, numPages: 64, numSlots: 1, maxSequenceLength: 1000 });
  cache.add(1);
  const forward = (position, tokens) => {
    cache.rollback(1, { length: position, state: undefined });
    const res = model.forward({ sequences: [{ id: 1, position, tokens, logits: 'last' }] }, cache);
    return samplingProbs(res.logits, V, 1, topK, 1);
  };
  const n = prompt.length;
  let p1;
  for (let c = 0; c < n; c += CHUNK) p1 = forward(c, prompt.subarray(c, Math.min(n, c + CHUNK)));
  const support = (p) => Array.from(p.keys()).filter((i) => p[i] > 0);
  const want = new Map();
  for (const a of support(p1)) {
    const p2 = forward(n, Int32Array.of(a));
    for (const b of support(p2)) {
      const p3 = forward(n + 1, Int32Array.of(b));
      for (const c of support(p3)) want.set(b * V + c, (want.get(b * V + c) ?? 0) + p1[a] * p2[b] * p3[c]);
    }
  }
  cache.finish(1);
  const addon = model.cuda;
  const copyBack = addon[copyFn];
  let copies = 0;
  addon[copyFn] = (...a) => {
    copies++;
    return copyBack.apply(addon, a);
  };
  try {
    const N = 3000;
    const reqs = Array.from({ length: N }, (_, i) => ({
      id: `q${i}`,
      promptIds: prompt,
      maxTokens: 3,
      sampling: { temperature: 1, topK },
      seed: i + 1,
      ignoreEos: true,
    }));
    // one sequence at a time: a batched prefill would be another GEMM shape (other bits) than the reference's
    const { results, engine } = runEngine(model, drafter, reqs, { prefillChunk: CHUNK, draftPolicy: 'max' });
    const keys = [...want.keys()];
    const index = new Map(keys.map((k, i) => [k, i]));
    const counts = new Float64Array(keys.length);
    for (const r of reqs) {
      const [, b, c] = results.get(r.id);
      const i = index.get(b * V + c);
      if (i === undefined) throw new Error(`(${b}, ${c}) has probability 0 under the target`);
      counts[i]++;
    }
    const { stat, df } = chiSquare(
      counts,
      Float64Array.from(keys, (k) => want.get(k)),
      N,
    );
    const m = engine.metrics;
    const crit = chiCrit(df);
    const line =
      `T 1, top-k ${topK}, ${N} requests: (2nd, 3rd) χ² ${stat.toFixed(1)} (df ${df}, critical ${crit.toFixed(1)}); ` +
      `drafted ${m.drafted}, accepted ${m.accepted}; q copied back ${copies} times`;
    if (engine.cache.pagesInUse !== 0) throw new Error('the engine left KV pages in use');
    return { stat, df, crit, drafted: m.drafted, accepted: m.accepted, copies, line };
  } finally {
    addon[copyFn] = copyBack;
  }
}
