// bench:gpu, the whole model (issue 18): SmolLM2-135M-Instruct on one GPU through the CUDA stage.
//   node packages/native-cuda/bench-gpu/llama.mjs [--json FILE] [--new 128] [--batches 1,8,64] [--prefill 512,2048]
// Measures, in one process:
// - plain greedy decode: tokens/s and ms per step at 1, 8 and 64 sequences (32-token prompts, 128 new tokens), the
//   stage's forward called directly with argmaxOnly (the token ids fed back; what a serving loop costs without the
//   engine), CUDA graphs on, and at 1 sequence off (the launch gaps the graphs remove);
// - prefill: tokens/s of one forward over 512 and 2,048 prompt tokens (last row's argmax only);
// - the engine (SpecEngine, what `specd generate` runs): plain greedy decoding and each shipped drafter at its full
//   draft length (draft policy 'max') on the held-out prompts, 1 sequence, 128 new tokens: tok/s, ×plain, τ; EAGLE-3
//   twice: its drafter on the GPU (the plugin's choice for the CUDA stage: "EAGLE-3 (GPU drafter)", with the GPU
//   time of one chain's CUDA graph; also at fixed chains of 5 and 4) and on the CPU (drafter.device "cpu"); DFlash
//   likewise ("DFlash (GPU drafter)" with the GPU time of one block's graph, also at 7 and 4 drafts; and on the CPU);
//   every configuration runs twice and the second run is reported (the first, which captures the CUDA graphs of the
//   shapes it meets first, is printed beside it);
// - the bounds: weight bytes ÷ HBM bandwidth (4.8 TB/s, the H200's nominal) per decode step.
import * as fs from 'node:fs';
import * as path from 'node:path';

import {
  ROOT,
  greedyRequests,
  haveDrafter,
  heldOutPrompts,
  loadGpuDrafter,
  loadGpuTarget,
  runEngine,
} from '../test-gpu/common.mjs';

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(`--${name}`);
  return i < 0 ? dflt : args[i + 1];
};
const NEW = Number(opt('new', '128'));
const BATCHES = opt('batches', '1,8,64').split(',').map(Number);
const PREFILL = opt('prefill', '512,2048').split(',').map(Number);
const PROMPT = 32;
const HBM = 4.8e12;

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const gpu = await loadGpuTarget(2048);
const model = gpu.model;
const V = model.info.vocabSize;
const out = { device: undefined, decode: [], variants: [], profile: [], prefill: [], engine: [], bounds: {} };

/**
 * Greedy decode of `batch` sequences: prefill each 32-token prompt, then `NEW` steps of one token per sequence,
 * every step one forward of `batch` rows with argmaxOnly. @returns ms per step (median of 3 runs).
 */
function decode(batch, graphs, reps = 3, steps = NEW) {
  const saved = model.graphs;
  model.graphs = graphs;
  const times = [];
  let gpuMs = -1;
  for (let rep = 0; rep < reps; rep++) {
    const cache = model.createCache({
      pageSize: 16,
      numPages: batch * (Math.ceil((PROMPT + NEW + 1) / 16) + 1),
      numSlots: batch,
      maxSequenceLength: PROMPT + NEW + 1,
    });
    let last = new Int32Array(batch);
    for (let s = 0; s < batch; s++) {
      cache.add(s);
      const ids = Int32Array.from({ length: PROMPT }, (_, i) => (7 * s + 13 * i + 100) % V);
      const r = model.forward({ sequences: [{ id: s, position: 0, tokens: ids, logits: 'last' }] }, cache, {
        argmaxOnly: true,
      });
      last[s] = r.argmax[0];
    }
    const t0 = performance.now();
    for (let step = 0; step < steps; step++) {
      const seqs = [];
      for (let s = 0; s < batch; s++)
        seqs.push({ id: s, position: PROMPT + step, tokens: Int32Array.of(last[s]), logits: 'last' });
      const r = model.forward({ sequences: seqs }, cache, { argmaxOnly: true });
      last = r.argmax;
    }
    times.push((performance.now() - t0) / steps);
    if (rep === 0) gpuMs = model.replayMs(50);
    for (let s = 0; s < batch; s++) cache.finish(s);
  }
  model.graphs = saved;
  return { ms: median(times), gpuMs };
}

function prefill(tokens) {
  const times = [];
  for (let rep = 0; rep < 5; rep++) {
    const cache = model.createCache({ pageSize: 16, numPages: Math.ceil(tokens / 16) + 1, numSlots: 1 });
    cache.add(0);
    const ids = Int32Array.from({ length: tokens }, (_, i) => (31 * i + 7) % V);
    const t0 = performance.now();
    model.forward({ sequences: [{ id: 0, position: 0, tokens: ids, logits: 'last' }] }, cache, { argmaxOnly: true });
    times.push(performance.now() - t0);
    cache.finish(0);
  }
  return median(times.slice(1));
}

for (const b of BATCHES) {
  const { ms, gpuMs } = decode(b, true);
  out.decode.push({ batch: b, graphs: true, msPerStep: ms, gpuMsPerStep: gpuMs, tokPerS: (b * 1000) / ms });
}
{
  const { ms } = decode(1, false);
  out.decode.push({ batch: 1, graphs: false, msPerStep: ms, gpuMsPerStep: -1, tokPerS: 1000 / ms });
}
// launch variants at 1 sequence, in one run: the small GEMM (RMSNorm / SwiGLU fused, row-invariant) with and without
// programmatic dependent launch, and cuBLASLt with separate RMSNorm / SwiGLU launches (the previous path)
for (const v of [
  { name: 'small GEMM + PDL', smallGemm: true, pdl: true },
  { name: 'small GEMM, no PDL', smallGemm: true, pdl: false },
  { name: 'cuBLASLt + separate norm/SwiGLU', smallGemm: false, pdl: false },
]) {
  model.setLaunchOptions(v);
  for (const b of [1, 16]) {
    const { ms, gpuMs } = decode(b, true);
    out.variants.push({ variant: v.name, batch: b, msPerStep: ms, gpuMsPerStep: gpuMs, tokPerS: (b * 1000) / ms });
  }
}
model.setLaunchOptions({ smallGemm: true, pdl: true });
// where a step goes: each launch of one layer and of the head, at 1 and 16 rows (a verify block's shape)
for (const b of [1, 16]) {
  decode(b, true, 1, 4);
  for (const p of model.profile(50)) out.profile.push({ rows: b, ...p });
}
for (const t of PREFILL) {
  const ms = prefill(t);
  out.prefill.push({ tokens: t, ms, tokPerS: (t * 1000) / ms });
}
// where the longest prefill goes: each launch of layer 0 and of the head at its shape
if (PREFILL.length > 0) for (const p of model.profile(5)) out.profile.push({ rows: Math.max(...PREFILL), ...p });
out.device = model.describe();
const weightBytes = model.runnerInfo().weightBytes;
out.bounds = { weightBytes, hbmBytesPerS: HBM, stepFloorMs: (weightBytes / HBM) * 1000 };

// the engine: plain and each drafter, one sequence, the held-out prompts
const prompts = heldOutPrompts(8);
const reqs = greedyRequests(prompts, NEW);
runEngine(model, undefined, reqs); // captures the plain steps' graphs (key spans) first, as for the drafters below
const plain = runEngine(model, undefined, reqs);
const plainTok = (prompts.length * NEW * 1000) / plain.ms;
/** The engine's wall time per verify forward, ms: propose, verify forward, commit (RunMetrics). */
const stepSplit = (m) => {
  const n = Math.max(1, m.verifyForwards);
  return { draftMs: m.draftMs / n, verifyMs: m.verifyMs / n, commitMs: m.commitMs / n };
};
out.engine.push({ drafter: 'none', tokPerS: plainTok, xPlain: 1, tau: 1, ...stepSplit(plain.engine.metrics) });
/** The drafter `method` ('eagle3' or 'dflash') with its device setting `device` for the GPU target. */
async function drafterOn(method, device) {
  const { BUILTIN_PLUGIN_PACKAGES, loadDrafter } = await import('@specd/core');
  const dir = path.join(process.env.SPECD_DRAFTERS_DIR ?? path.join(ROOT, 'models'), `smollm2-135m-instruct-${method}`);
  return (await loadDrafter({ dir, settings: { device } }, BUILTIN_PLUGIN_PACKAGES, gpu, 1024, 1)).drafter;
}
/**
 * Where a speculative step's wall time goes (EAGLE-3's GPU drafter, full chain): the engine run again with every
 * function of the addon timed on the host (wall ms per verify step and calls per step, each call including its
 * waits for the GPU), the rest of the step being JavaScript; and the GPU time of the last verify forward's graph.
 */
function traceStep(drafter) {
  const addon = model.cuda;
  const names = Object.keys(addon).filter((k) => typeof addon[k] === 'function');
  const saved = new Map(names.map((k) => [k, addon[k]]));
  const acc = new Map();
  const timed = (k, fn, a) => {
    const t0 = performance.now();
    try {
      return fn.apply(addon, a);
    } finally {
      const e = acc.get(k) ?? { ms: 0, calls: 0 };
      e.ms += performance.now() - t0;
      e.calls++;
      acc.set(k, e);
    }
  };
  for (const k of names)
    addon[k] = (...a) => {
      // the chain first waits for what the drafter's stream still runs (the context write), timed apart
      if (k === 'eagle3Chain') timed('eagle3Synchronize before the chain', saved.get('eagle3Synchronize'), [a[0]]);
      return timed(k, saved.get(k), a);
    };
  const host0 = model.runnerInfo().hostUs;
  let r;
  try {
    r = runEngine(model, drafter, reqs, { draftPolicy: 'max' });
  } finally {
    for (const [k, fn] of saved) addon[k] = fn;
  }
  const host1 = model.runnerInfo().hostUs;
  const m = r.engine.metrics;
  const n = Math.max(1, m.verifyForwards);
  const verifyGraphMs = model.replayMs(20);
  const chainGraphMs = drafter.replayMs(20, drafter.maxDraftTokens); // the full chain's graph
  return {
    steps: n,
    stepMs: (m.draftMs + m.verifyMs + m.commitMs) / n,
    wallMsPerStep: r.ms / n,
    verifyGraphMs,
    chainGraphMs,
    calls: [...acc].map(([name, e]) => ({ name, msPerStep: e.ms / n, callsPerStep: e.calls / n })),
    // inside llamaForward (LlamaRunner::HostTimes), ms per verify step
    forwardSplit: Object.fromEntries(
      ['checkUs', 'launchUs', 'waitUs', 'copyUs'].map((k) => [k, (host1[k] - host0[k]) / 1000 / n]),
    ),
  };
}
const LABELS = {
  'eagle3-gpu': 'EAGLE-3 (GPU drafter)',
  eagle3: 'EAGLE-3 (CPU drafter)',
  'dflash-gpu': 'DFlash (GPU drafter)',
  dflash: 'DFlash (CPU drafter)',
  dspark: 'dspark',
};
for (const method of ['eagle3-gpu', 'eagle3', 'dflash-gpu', 'dflash', 'dspark']) {
  const base = method.replace('-gpu', '');
  const gpuDrafter = method.endsWith('-gpu');
  if (!haveDrafter(base)) continue;
  const drafter =
    base === 'dspark' ? await loadGpuDrafter(base, gpu) : await drafterOn(base, gpuDrafter ? 'cuda' : 'cpu');
  try {
    // EAGLE-3's GPU drafter also at fixed shorter chains, DFlash's at shorter blocks: whether the last drafts pay for
    // their draft step and verify row
    const policies = gpuDrafter
      ? ['max', 'cost', ...(base === 'eagle3' ? ['k = 5', 'k = 4'] : ['k = 7', 'k = 4'])]
      : [];
    for (const policy of gpuDrafter ? policies : ['max', 'cost']) {
      const k = policy.startsWith('k = ') ? Number(policy.slice(4)) : 0;
      const options = k > 0 ? { draftLength: () => k } : { draftPolicy: policy };
      // twice: the first run captures the CUDA graphs of shapes not seen yet (verify rows, chain lengths, key spans);
      // the second is the steady state the table reports (a server captures its shapes once)
      const first = runEngine(model, drafter, reqs, options);
      const r = runEngine(model, drafter, reqs, options);
      const tok = (prompts.length * NEW * 1000) / r.ms;
      let same = 0;
      for (const p of prompts) same += JSON.stringify(r.results.get(p.id)) === JSON.stringify(plain.results.get(p.id));
      out.engine.push({
        drafter: LABELS[method],
        ...(gpuDrafter && policy === 'max'
          ? { chainGpuMs: base === 'eagle3' ? drafter.replayMs(50, drafter.maxDraftTokens) : drafter.replayMs(50) }
          : {}),
        policy,
        firstTokPerS: (prompts.length * NEW * 1000) / first.ms,
        tokPerS: tok,
        xPlain: tok / plainTok,
        tau: r.engine.metrics.tauPerStep,
        drafted: r.engine.metrics.drafted,
        equalToPlain: `${same}/${prompts.length}`,
        ...stepSplit(r.engine.metrics),
      });
    }
    if (method === 'eagle3-gpu') out.trace = traceStep(drafter);
  } finally {
    drafter.dispose();
  }
}

const f = (x, d = 1) => x.toFixed(d);
console.log(`# ${out.device}`);
console.log(
  `# bounds: weights ${(weightBytes / 1e6).toFixed(1)} MB bf16 ÷ ${HBM / 1e12} TB/s = ` +
    `${f(out.bounds.stepFloorMs * 1000, 1)} µs per decode step`,
);
console.log(
  '\n| decode | sequences | CUDA graphs | ms per step | of which the graph on the GPU | tok/s |\n' +
    '|---|---:|---|---:|---:|---:|',
);
for (const d of out.decode)
  console.log(
    `| plain greedy | ${d.batch} | ${d.graphs ? 'on' : 'off'} | ${f(d.msPerStep, 3)} | ` +
      `${d.gpuMsPerStep < 0 ? '' : f(d.gpuMsPerStep, 3)} | ${f(d.tokPerS, 0)} |`,
  );
console.log(
  '\n| launch variant (graphs on) | sequences | ms per step | of which the graph on the GPU | tok/s |\n' +
    '|---|---:|---:|---:|---:|',
);
for (const v of out.variants)
  console.log(`| ${v.variant} | ${v.batch} | ${f(v.msPerStep, 3)} | ${f(v.gpuMsPerStep, 3)} | ${f(v.tokPerS, 0)} |`);
console.log('\n| launch (layer 0 and the head) | µs at 1 row | µs at 16 rows |\n|---|---:|---:|');
for (const p of out.profile.filter((q) => q.rows === 1)) {
  const p16 = out.profile.find((q) => q.rows === 16 && q.name === p.name);
  console.log(`| ${p.name} | ${f(p.us, 2)} | ${p16 === undefined ? '' : f(p16.us, 2)} |`);
}
const longest = Math.max(...PREFILL);
console.log(`\n| launch (layer 0 and the head), prefill of ${longest} tokens | µs |\n|---|---:|`);
for (const p of out.profile.filter((q) => q.rows === longest)) console.log(`| ${p.name} | ${f(p.us, 1)} |`);
// sampled requests at the model's default sampling (SmolLM2: temperature 0.2, top-p 0.9): drawn on the device
// (DeviceSampling: only token ids come back) against the host path (every verify row's logits copied back)
out.sampled = [];
{
  const sreqs = reqs.map((r, i) => ({ ...r, sampling: { temperature: 0.2, topP: 0.9 }, seed: i + 1 }));
  const drafters = [];
  if (haveDrafter('eagle3')) drafters.push(['EAGLE-3 (GPU drafter), full chain', await drafterOn('eagle3', 'cuda')]);
  if (haveDrafter('dflash')) drafters.push(['DFlash (GPU drafter), full block', await drafterOn('dflash', 'cuda')]);
  try {
    for (const [label, d] of [['none', undefined], ...drafters])
      for (const where of ['device', 'host', 'device']) {
        if (where === 'host') model.sampleOnDevice = undefined; // hides the capability (hasDeviceSampling)
        let r;
        try {
          r = runEngine(model, d, sreqs, { draftPolicy: 'max' });
        } finally {
          delete model.sampleOnDevice;
        }
        out.sampled.push({
          drafter: label,
          where,
          tokPerS: (prompts.length * NEW * 1000) / r.ms,
          tau: r.engine.metrics.tauPerStep,
        });
      }
  } finally {
    for (const [, d] of drafters) d.dispose();
  }
}

console.log('\n| prefill tokens | ms | tok/s |\n|---:|---:|---:|');
for (const p of out.prefill) console.log(`| ${p.tokens} | ${f(p.ms, 2)} | ${f(p.tokPerS, 0)} |`);
console.log(
  `\n| engine, 1 sequence, ${prompts.length} held-out prompts × ${NEW} tokens | policy | tok/s | ×plain | τ | ` +
    'greedy equal to plain | full chain or block graph, GPU ms | ms per step: propose / verify / commit | ' +
    'first run (graph captures), tok/s |\n|---|---|---:|---:|---:|---|---:|---|---:|',
);
for (const e of out.engine)
  console.log(
    `| ${e.drafter} | ${e.policy ?? ''} | ${f(e.tokPerS, 0)} | ${f(e.xPlain, 3)} | ${f(e.tau, 3)} | ` +
      `${e.equalToPlain ?? ''} | ${e.chainGpuMs === undefined || e.chainGpuMs < 0 ? '' : f(e.chainGpuMs, 3)} | ` +
      `${f(e.draftMs, 3)} / ${f(e.verifyMs, 3)} / ${f(e.commitMs, 3)} | ` +
      `${e.firstTokPerS === undefined ? '' : f(e.firstTokPerS, 0)} |`,
  );
console.log(
  `\n| sampled (T 0.2, top-p 0.9), 1 sequence, ${prompts.length} prompts × ${NEW} tokens | sampled on | tok/s | τ |\n` +
    '|---|---|---:|---:|',
);
for (const e of out.sampled) console.log(`| ${e.drafter} | ${e.where} | ${f(e.tokPerS, 0)} | ${f(e.tau, 3)} |`);
if (out.trace !== undefined) {
  const t = out.trace;
  const native = t.calls.reduce((a, c) => a + c.msPerStep, 0);
  console.log(
    `\n| EAGLE-3 (GPU drafter, max): a verify step's wall time, ${t.steps} steps | ms per step | calls per step |\n` +
      '|---|---:|---:|',
  );
  for (const c of [...t.calls].sort((a, b) => b.msPerStep - a.msPerStep))
    console.log(`| addon.${c.name} (host wall, GPU waits included) | ${f(c.msPerStep, 3)} | ${f(c.callsPerStep, 2)} |`);
  const fs_ = t.forwardSplit;
  console.log(
    `| in llamaForward: checks + result arrays / metadata + graph launch / copies + wait / staged copy-out | ` +
      `${f(fs_.checkUs, 3)} / ${f(fs_.launchUs, 3)} / ${f(fs_.waitUs, 3)} / ${f(fs_.copyUs, 3)} | |`,
  );
  console.log(`| JavaScript (the step minus the addon calls) | ${f(t.wallMsPerStep - native, 3)} | |`);
  console.log(`| the whole step (run wall ÷ steps; prefill included) | ${f(t.wallMsPerStep, 3)} | |`);
  const gpuMs = `${f(t.verifyGraphMs, 3)} / ${f(t.chainGraphMs, 3)}`;
  console.log(`| GPU: the last verify forward's graph / the chain's graph | ${gpuMs} | |`);
}
const json = opt('json', undefined);
if (json !== undefined) fs.writeFileSync(json, JSON.stringify(out, null, 2));
model.dispose();
