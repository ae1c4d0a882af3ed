// bench:gpu-host — the host side of a GPU speculative step, on any machine (issue 18): the CUDA Llama stage and the
// EAGLE-3 GPU drafter driven by the engine exactly as on the GPU, with @specd/native-cuda replaced by stand-ins that
// return at once (no device work, no copies). What is measured is the JavaScript and bookkeeping a step costs on the
// host — the part of the GPU run's "ms per step: propose / verify / commit" that a faster GPU cannot remove.
//
//   node packages/native-cuda/bench-gpu/host.mjs [--steps 2000] [--accept 0.8] [--only none|max|cost] [--json FILE]
//   (after `npm run build` and `npm run models:fetch`; node --cpu-prof for where it goes)
//
// The stand-in target's greedy token after position p is a fixed function of p (a token of the draft vocabulary),
// and the stand-in chain drafts that token with probability --accept per step (else a wrong one), so τ is known.
// Reports per verify step: propose / verify / commit ms (the engine's split) and tok/s of the host alone, for plain
// decoding and for EAGLE-3 at its full chain (policy max) and with the cost policy.
import * as fs from 'node:fs';
import { cpus } from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { BUILTIN_PLUGIN_PACKAGES, SpecEngine, loadDrafter, loadTarget } from '@specd/core';
import { CudaLlamaStageModel } from '@specd/model-llama';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(`--${name}`);
  return i < 0 ? dflt : args[i + 1];
};
const STEPS = Number(opt('steps', '2000'));
const ACCEPT = Number(opt('accept', '0.8'));
const jsonOut = opt('json', undefined);
/** One row only (`none`: plain decoding, `max` / `cost`: EAGLE-3 with that policy), for profiles of one path. */
const only = opt('only', undefined);

const cpu = await loadTarget(path.join(ROOT, 'models/smollm2-135m-instruct'), BUILTIN_PLUGIN_PACKAGES);
const config = cpu.model.config;
const V = config.vocabSize;
const D = config.hiddenSize;
const eagleDir = path.join(ROOT, 'models/smollm2-135m-instruct-eagle3');

/** Target id of draft id i (filled by eagle3SetWeight('d2t')). */
let draftToTarget = new Int32Array(0);
const targetToDraft = new Map();
/** The stand-in target's greedy token after position p. */
const nextAt = (p) => draftToTarget[((p * 2654435761) % draftToTarget.length) >>> 0] ?? (p * 7919) % V;
let rngState = 12345;
const rand = () => {
  rngState = (Math.imul(rngState, 1103515245) + 12345) >>> 0;
  return rngState / 2 ** 32;
};

const counts = new Map();
const count = (name) => counts.set(name, (counts.get(name) ?? 0) + 1);

/** The stand-in addon: every function @specd/native-cuda's llama and EAGLE-3 runners have, returning at once. */
const addon = {
  info: { name: 'stand-in', computeCapability: '0.0', totalBytes: 0 },
  llamaAllocKv: () => {},
  llamaInfo: () => ({
    weightBytes: 0,
    kvBytes: 0,
    activationBytes: 0,
    maxBlocks: 1024 / 16 + 2,
    graphs: [],
    hostUs: { forwards: 0, checkUs: 0, launchUs: 0, waitUs: 0, copyUs: 0 },
  }),
  llamaForward: (_r, ids, positions, _slots, _cu, _kvLens, _tables, logitRows, taps) => {
    count('llamaForward');
    const T = ids.length;
    return {
      tokens: Int32Array.from(logitRows, (row) => nextAt(positions[row])),
      hidden: new Float32Array(T * D),
      taps: Array.from(taps, () => new Float32Array(T * D)),
      logits: undefined,
    };
  },
  llamaReplayMs: () => -1,
  llamaDispose: () => {},
  eagle3Create: () => ({}),
  eagle3AllocKv: () => {},
  eagle3SetWeight: (_r, name, data) => {
    if (name !== 'd2t') return;
    draftToTarget = Int32Array.from(data);
    for (const [i, t] of draftToTarget.entries()) targetToDraft.set(t, i);
  },
  eagle3ContextWrite: () => {
    count('eagle3ContextWrite');
  },
  eagle3Chain: (_r, gSlots, _tokens, positions, _tables, _stepSlots, lengths, k) => {
    count('eagle3Chain');
    const S = gSlots.length;
    const out = new Int32Array(S * k);
    for (let s = 0; s < S; s++) {
      let right = true;
      for (let j = 0; j < lengths[s]; j++) {
        right &&= rand() < ACCEPT;
        const t = nextAt(positions[s] + j);
        out[s * k + j] = right ? targetToDraft.get(t) : (targetToDraft.get(t) + 1) % draftToTarget.length;
      }
    }
    return out;
  },
  eagle3Step: () => {
    throw new Error('stand-in: sampled chains are not benched here');
  },
  eagle3Synchronize: () => {},
  eagle3ReplayMs: () => -1,
  eagle3Info: () => ({ weightBytes: 0, kvBytes: 0, activationBytes: 0, maxBlocks: 1024 / 16 + 2, graphs: [] }),
  eagle3Dispose: () => {},
};

const embedBits = new Uint16Array(V * D);
const model = new CudaLlamaStageModel(config, addon, {}, embedBits, 2048, true);
const target = { ...cpu, model };
const drafter = (
  await loadDrafter({ dir: eagleDir, settings: { device: 'cuda' } }, BUILTIN_PLUGIN_PACKAGES, target, 4096, 1)
).drafter;
if (drafter.device !== 'cuda') throw new Error('bench:gpu-host: the plugin did not pick the GPU drafter');

const prompt = Int32Array.from({ length: 32 }, (_, i) => (i * 31 + 7) % V);
const NEW = 128;
const requests = (n) =>
  Array.from({ length: n }, (_, i) => ({
    id: `r${i}`,
    promptIds: prompt,
    maxTokens: NEW,
    sampling: { temperature: 0 },
    seed: 0,
    ignoreEos: true,
  }));

function run(withDrafter, policy) {
  const engine = new SpecEngine(model, withDrafter ? drafter : undefined, {
    maxSequences: 1,
    maxTokensPerSequence: 1024,
    ...(policy === undefined ? {} : { draftPolicy: policy }),
  });
  const n = Math.max(1, Math.round(STEPS / (withDrafter ? NEW / 3 : NEW)));
  engine.run(requests(Math.min(4, n))); // warm-up (JIT)
  engine.metrics.draftMs = engine.metrics.verifyMs = engine.metrics.commitMs = 0;
  const before = { ...engine.metrics };
  counts.clear();
  const t0 = performance.now();
  const out = engine.run(requests(n));
  const ms = performance.now() - t0;
  const m = engine.metrics;
  const steps = m.verifyForwards - before.verifyForwards;
  const tokens = out.reduce((a, r) => a + r.tokenIds.length, 0);
  return {
    drafter: withDrafter ? 'EAGLE-3 (GPU drafter, stand-in)' : 'none',
    policy: policy ?? '',
    requests: n,
    steps,
    tokensPerStep: tokens / steps,
    msPerStep: ms / steps,
    proposeMs: m.draftMs / steps,
    verifyMs: m.verifyMs / steps,
    commitMs: m.commitMs / steps,
    hostTokPerS: (tokens * 1000) / ms,
    calls: Object.fromEntries(counts),
  };
}

const rows = [
  ...(only === undefined || only === 'none' ? [run(false)] : []),
  ...(only === undefined || only === 'max' ? [run(true, 'max')] : []),
  ...(only === undefined || only === 'cost' ? [run(true, 'cost')] : []),
];
console.log(`# bench:gpu-host — ${new Date().toISOString()}; ${cpus()[0]?.model}, node ${process.version}`);
console.log(`# stand-in device (no GPU work); acceptance per draft ${ACCEPT}, chain ${drafter.maxDraftTokens}`);
console.log(
  '| drafter | policy | steps | tokens / step | host ms / step | propose / verify / commit ms | host tok/s |',
);
console.log('|---|---|---:|---:|---:|---|---:|');
const f = (x, d = 3) => x.toFixed(d);
for (const r of rows)
  console.log(
    `| ${r.drafter} | ${r.policy} | ${r.steps} | ${f(r.tokensPerStep, 2)} | ${f(r.msPerStep)} | ` +
      `${f(r.proposeMs)} / ${f(r.verifyMs)} / ${f(r.commitMs)} | ${f(r.hostTokPerS, 0)} |`,
  );
if (jsonOut !== undefined) fs.writeFileSync(jsonOut, JSON.stringify(rows, null, 2));
drafter.dispose();
cpu.model.dispose?.();
