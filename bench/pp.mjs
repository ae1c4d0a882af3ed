#!/usr/bin/env node
// Pipeline parallelism on this machine: prefill and decode tokens/s for pp = 1 and pp = 2
// (stages as processes, packages/core/src/pipeline) on the large synthetic Kimi-K3 config, and the
// drafter's partial projection (Σ_i h_i·W_iᵀ over the taps, fp32) as a fraction of prefill time.
//
//   npm run bench:pp                         (root; run `npm run build` first; ~3 min + writing 3.5 GB)
//   node bench/pp.mjs --keep-synthetic DIR   (write the synthetic checkpoint once and reuse it)
//   node bench/pp.mjs --quick                (shorter prompt and decode)
//
// Target: bench/synthetic-kimi.mjs (hidden 2048, 8 layers KDA×3 + MLA repeated, 64 experts top-8,
// random bf16 weights), pp = 2 with vLLM's default split ([4, 4]). Drafter for the projection: a
// DFlash checkpoint of the same width with random weights (taps 1, 3, 5, 7 → fc [2048, 4·2048]),
// written next to it. Measured, medians of `--reps` (default 3), one run:
//   prefill: one request of P tokens (default 512), time to its first token, P / time;
//   decode: 32 greedy tokens after a 64-token prompt, batch 1, tokens after the first / time;
//   projection: `projectTargetHiddenPartial` over the P tokens' four taps, against a prefill of P tokens
//   with those taps captured (the same forward the engine runs), pp = 1.
// tp = 2: ranks as worker threads in this process (packages/core/src/tensor-parallel), kernel pool sized
// ⌊CPUs / tp⌋ per rank as the TP loader does; the ranks' kernels share the process-wide pool.
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';

import {
  BUILTIN_PLUGIN_PACKAGES,
  HfConfig,
  SafetensorsCheckpoint,
  SequenceCache,
  SpecEngine,
  startPipeline,
  startTensorParallel,
  writeSafetensors,
} from '@specd/core';
import { loadKimiFromDir } from '@specd/model-kimi-k3';
import { f32ToBf16, isa, setNumThreads } from '@specd/native';
import { dflashPlugin } from '@specd/plugin-dflash';

import { largeSyntheticConfig, writeSyntheticKimi } from './synthetic-kimi.mjs';
import { median } from './stats.mjs';

const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const quick = argv.includes('--quick');
const P = Number(arg('prompt', quick ? '256' : '512'));
const NEW = quick ? 16 : 32;
const REPS = Number(arg('reps', quick ? '1' : '3'));
const keep = arg('keep-synthetic', undefined);
const dir = keep ?? mkdtempSync(join(tmpdir(), 'specd-bench-pp-'));

const config = largeSyntheticConfig();
if (!existsSync(join(dir, 'config.json'))) {
  const t0 = performance.now();
  writeSyntheticKimi(dir, config);
  console.log(`synthetic checkpoint written to ${dir} in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}
const D = config.hidden_size;
const taps = [1, 3, 5, 7];
const draftDir = join(dir, 'dflash');
if (!existsSync(join(draftDir, 'config.json'))) {
  mkdirSync(draftDir, { recursive: true });
  writeFileSync(
    join(draftDir, 'config.json'),
    JSON.stringify({
      architectures: ['DFlashDraftModel'],
      model_type: 'qwen3',
      hidden_size: D,
      num_hidden_layers: 1,
      num_attention_heads: 16,
      num_key_value_heads: 4,
      head_dim: 128,
      intermediate_size: 2048,
      vocab_size: config.vocab_size,
      block_size: 8,
      layer_types: ['full_attention'],
      rope_theta: 10000,
      rms_norm_eps: 1e-6,
      hidden_act: 'silu',
      attention_bias: false,
      dflash_config: { mask_token_id: 1, target_layer_ids: taps.map((t) => t - 1) },
    }),
  );
  let seed = 7;
  const rnd = () => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return (seed / 2147483648 - 0.5) * 0.04;
  };
  const bf = (shape, fill) => ({
    dtype: 'BF16',
    shape,
    data: f32ToBf16(Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, () => fill ?? rnd())),
  });
  const p = 'layers.0.';
  writeSafetensors(join(draftDir, 'model.safetensors'), {
    'fc.weight': bf([D, taps.length * D]),
    'hidden_norm.weight': bf([D], 1),
    'norm.weight': bf([D], 1),
    [`${p}input_layernorm.weight`]: bf([D], 1),
    [`${p}post_attention_layernorm.weight`]: bf([D], 1),
    [`${p}self_attn.q_proj.weight`]: bf([2048, D]),
    [`${p}self_attn.k_proj.weight`]: bf([512, D]),
    [`${p}self_attn.v_proj.weight`]: bf([512, D]),
    [`${p}self_attn.o_proj.weight`]: bf([D, 2048]),
    [`${p}self_attn.q_norm.weight`]: bf([128], 1),
    [`${p}self_attn.k_norm.weight`]: bf([128], 1),
    [`${p}mlp.gate_proj.weight`]: bf([2048, D]),
    [`${p}mlp.up_proj.weight`]: bf([2048, D]),
    [`${p}mlp.down_proj.weight`]: bf([D, 2048]),
  });
}

const prompt = (n, s) =>
  Int32Array.from({ length: n }, (_, i) => 2 + ((i * 7919 + s * 104729) % (config.vocab_size - 4)));
const info = isa();
console.log(
  `bench:pp — synthetic Kimi-K3 (hidden ${D}, ${config.num_hidden_layers} layers, ` +
    `${config.num_experts} experts), prompt ${P}, decode ${NEW}; threads ${info.threads}` +
    `, isa ${info.isa}, ${cpus().length} vCPUs; load ${loadavg()[0].toFixed(2)}`,
);

/** prefill tok/s and decode tok/s of a model (StageModel), median of REPS. */
function measure(model) {
  const pre = [];
  const dec = [];
  for (let r = 0; r < REPS; r++) {
    const e = new SpecEngine(model, undefined, { maxSequences: 1, maxTokensPerSequence: P + 64, prefillChunk: 64 });
    let first = 0;
    const t0 = performance.now();
    e.run([
      {
        id: `p${r}`,
        promptIds: prompt(P, r),
        maxTokens: 1,
        sampling: { temperature: 0 },
        seed: 0,
        ignoreEos: true,
        onToken: () => {
          first = performance.now();
        },
      },
    ]);
    pre.push(P / ((first - t0) / 1000));
    const d = new SpecEngine(model, undefined, { maxSequences: 1, maxTokensPerSequence: 64 + NEW + 1 });
    const times = [];
    d.run([
      {
        id: `d${r}`,
        promptIds: prompt(64, r + 11),
        maxTokens: NEW,
        sampling: { temperature: 0 },
        seed: 0,
        ignoreEos: true,
        onToken: () => times.push(performance.now()),
      },
    ]);
    dec.push((times.length - 1) / ((times[times.length - 1] - times[0]) / 1000));
  }
  return { prefill: median(pre), decode: median(dec) };
}

const rows = [];
const t1 = loadKimiFromDir(dir);
rows.push({ pp: 1, tp: 1, ...measure(t1) });
console.log(`pp=1: prefill ${rows[0].prefill.toFixed(1)} tok/s, decode ${rows[0].decode.toFixed(2)} tok/s`);

// The partial projection against the prefill forward that produces its taps (pp = 1).
const dw = SafetensorsCheckpoint.open(draftDir);
const drafter = await dflashPlugin.load(
  { dir: draftDir, config: HfConfig.read(draftDir), weights: dw },
  { target: t1, maxSequences: 1, maxTokensPerSequence: P + 64 },
);
dw.close();
const projMs = [];
const fwdMs = [];
for (let r = 0; r < REPS; r++) {
  const cache = new SequenceCache(t1.cacheGeometry, { pageSize: 16, numPages: Math.ceil(P / 16) + 2, numSlots: 1 });
  cache.add('x');
  let t0 = performance.now();
  for (let p = 0; p < P; p += 64) {
    t1.forward(
      {
        sequences: [
          {
            id: 'x',
            position: p,
            tokens: prompt(P, r).subarray(p, p + 64),
            logits: p + 64 >= P ? 'last' : 'none',
            phase: 'prefill',
          },
        ],
      },
      cache,
      { taps },
    );
  }
  fwdMs.push(performance.now() - t0);
  cache.finish('x');
  const tapMap = new Map(taps.map((t) => [t, Float32Array.from({ length: P * D }, (_, i) => Math.sin(i * 0.001 + t))]));
  t0 = performance.now();
  drafter.projectTargetHiddenPartial(tapMap, P);
  projMs.push(performance.now() - t0);
}
const proj = median(projMs);
const fwd = median(fwdMs);
console.log(
  `projection over ${taps.length} taps × ${P} tokens: ${proj.toFixed(1)} ms; prefill forward ` +
    `(taps captured): ${fwd.toFixed(1)} ms; share ${((100 * proj) / (fwd + proj)).toFixed(2)} %`,
);
drafter.dispose();
t1.dispose();

const t2 = await startPipeline({ modelDir: dir, plugins: BUILTIN_PLUGIN_PACKAGES, pp: 2, lastStageEmbedding: false });
try {
  rows.push({ pp: 2, tp: 1, ...measure(t2) });
  console.log(`pp=2: prefill ${rows[1].prefill.toFixed(1)} tok/s, decode ${rows[1].decode.toFixed(2)} tok/s`);
} finally {
  t2.dispose();
}

const threads = info.threads;
const tp2 = await startTensorParallel({ modelDir: dir, plugins: BUILTIN_PLUGIN_PACKAGES, tp: 2 });
try {
  rows.push({ pp: 1, tp: 2, ...measure(tp2) });
  console.log(`tp=2: prefill ${rows[2].prefill.toFixed(1)} tok/s, decode ${rows[2].decode.toFixed(2)} tok/s`);
} finally {
  tp2.dispose();
  setNumThreads(threads);
}

console.log(`\n| pp | tp | prefill tok/s (P = ${P}) | decode tok/s (batch 1) |`);
console.log('|---:|---:|---:|---:|');
for (const r of rows) console.log(`| ${r.pp} | ${r.tp} | ${r.prefill.toFixed(1)} | ${r.decode.toFixed(2)} |`);
console.log(
  `\npartial projection: ${proj.toFixed(1)} ms of ${(fwd + proj).toFixed(1)}` +
    ` ms = ${((100 * proj) / (fwd + proj)).toFixed(2)} % of prefill (goal ≤ 2 ` +
    `%); load at the end ${loadavg()[0].toFixed(2)}`,
);
if (keep === undefined) rmSync(dir, { recursive: true, force: true });
