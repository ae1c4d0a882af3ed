#!/usr/bin/env node
// Issue 16's verify-cost goal on a dense model of ≥ 1 GB of weights: t_verify(16) / t_step ≤ 1.3, where t_step is
// a plain 1-token decode forward and t_verify(16) one forward of a 16-token verify block (logits of all 16 rows),
// both at a context of 64 tokens; with the machine's physical floors of both times and of their ratio.
//
//   npm run bench:verify-dense              (root; run `npm run build` and `npm run models:fetch` first; ~1 min,
//                                            the first run also writes the 1.1 GB GGUF, ~5–20 s)
//   node bench/verify-dense.mjs [--model llama|kimi] [--threads N] [--reps N] [--context N] [--layers N] [--hidden D]
//                               [--json FILE] [--quick] [--profile]
//
// `--profile`: after the timed reps, one more pass with every native call timed (bench/native-timing.mjs; the bench
// re-runs itself under bench/native-timing-register.mjs): ms per forward of the 1-token step and the 16-token verify
// by kernel and GEMM shape (n × k, with its weight GB/s), and the JavaScript left over; then each forward's GEMMs
// replayed back to back with the same arguments (the kernels alone against the same calls inside the forward).
//
// `--model kimi`: a dense Kimi-K3 checkpoint instead (bench/synthetic-kimi.mjs denseSyntheticConfig: bench:decode's
// large synthetic config with the dense SwiGLU MLP in every layer, random bf16 weights, 1,218 MB read per token),
// written once into .cache/synthetic-dense/kimi-dense-h2048-l8/ and loaded with the stage's default activations
// (defaultKimiActivations: split bf16 on AMX, fp32 elsewhere; SPECD_KIMI_ACTIVATIONS overrides). Its floors: t_mem
// from the weight bytes a forward reads (kimiWeightBytes), t_compute16 at the activations path's rate (fp32 FMA;
// AMX-BF16 for bf16; AMX-BF16 ÷ 2 for split bf16); `--hidden` does not apply, `--layers` re-lays the KDA/MLA pattern.
// What follows describes the default GGUF model.
//
// The model: a synthetic llama GGUF with random weights, written once into the git-ignored .cache/synthetic-dense/
// (bench/gguf-write.mjs; reused while the JSON beside it records the same parameters). SmolLM2-135M-Instruct's layout
// (models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf: every KV copied, its tokenizer included, the
// llama.* dimension keys replaced; the same tensor names, order and types: Q4_1 q, k, v, o, gate, up, down, F32
// norms, Q8_0 token_embd tied as the lm_head) at hidden 2048, 16 heads × 128, 4 KV heads, intermediate 8192, vocab
// 49152 and the fewest layers whose tensors reach 1 GiB (26: 1,095.7 MB). `--hidden D` scales it (D / 128 heads, a
// quarter of them KV heads, intermediate 4·D), `--layers N` sets the depth; `--quick`: 2 layers, 3 reps.
// Weights: random quant nibbles / bytes (Q8_0's −128 made −127), each block's f16 scale d uniform over the f16
// values in [0.01, 0.02] and Q4_1's minimum m = −7.5·d (zero-mean weights); norm weights uniform in [0.95, 1.05].
// Every block is finite (the load's checkpoint sanity scan passes) and the activations stay finite through the
// layers (the bench checks the verify logits).
//
// Loaded as the SmolLM2 target is (core's loadTarget on the .gguf: the llama plugin, quantized projections kept as
// blocks, default activations int16 unless SPECD_GGUF_ACT says otherwise, default kernels); `--threads N` (default
// 2) sizes the compute pool (setNumThreads). Timed as bench/verify-profile.mjs times a block: one sequence with
// `--context` (64) random tokens of prefill, then per repetition a 1-token forward (logits 'last') and a 16-token
// forward (logits 'all', what the engine's verify step runs for k = 15 drafts), each undone by a cache
// checkpoint/rollback outside the timer, their order alternated per repetition, after 2 warm-up rounds; `--reps`
// (default 9) repetitions, medians and minimums.
//
// Bounds, measured in the same run at the same thread count (helpers compiled with `cc -O2 -march=native -pthread`
// into .cache/synthetic-dense/ when missing or older than their source, as bench/peer.mjs compiles dot-rate.c):
//   t_mem = GGUF tensor bytes (the tied token_embd read in full as the lm_head) ÷ the read bandwidth of
//           bench/read-bw.c (256 MiB, best of 3 runs): the floor of t_step, and of t_verify(16), which reads the same
//           weights once;
//   t_compute16 = 16 × 2 × (linear parameters: the layers' q, k, v, o, gate, up, down and the lm_head) ÷ the int8
//           dot-product rate of bench/dot-rate.c (best of 3 runs; AVX512-VNNI, or AMX-INT8 where faster). The int16
//           activations (the default) run two VPDPBUSD chains per block (native/src/quant_kernels.h, "int16
//           activations") and never AMX, so their rate is half the VNNI int8 rate; attention (fp32, context 64)
//           is left out.
//   The lowest ratio reachable on this machine is then max(t_mem, t_compute16) / t_mem. Both rates are peaks: on a
//   loaded (shared) machine they read low, the floors high, and the measured ratio can fall below the printed floor
//   (the bench says so); run it on a quiet machine.
// `--json FILE` writes the configuration, bounds, every timed repetition and the goal.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import { cpus, loadavg } from 'node:os';
import * as path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import {
  BUILTIN_PLUGIN_PACKAGES,
  GgmlType,
  GgufFile,
  GgufValueType,
  HfConfig,
  SafetensorsCheckpoint,
  SequenceCache,
  f16ToF32,
  f32ToF16,
  loadTarget,
} from '@specd/core';
import { loadKimiStage } from '@specd/model-kimi-k3';
import { gemmBf16, isa, setNumThreads } from '@specd/native';

import { ggufTensorBytes, writeGguf } from './gguf-write.mjs';
import { denseSyntheticConfig, kimiWeightBytes, writeSyntheticKimi } from './synthetic-kimi.mjs';
import { cpuHasAmx, dotRates as probeDotRates, readBandwidthGBs } from './probes.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
if (argv.includes('--profile') && !globalThis.specdNativeTimingHook) {
  // the timing shim must resolve '@specd/native' before this file's static imports: run again under it
  const hook = path.join(ROOT, 'bench/native-timing-register.mjs');
  const child = spawnSync(process.execPath, ['--import', pathToFileURL(hook).href, ...process.argv.slice(1)], {
    stdio: 'inherit',
  });
  process.exit(child.status ?? 1);
}
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const quick = argv.includes('--quick');
const THREADS = Number(arg('threads', '2'));
const REPS = Number(arg('reps', quick ? '3' : '9'));
const CONTEXT = Number(arg('context', '64'));
const ROWS = 16;
const HIDDEN = Number(arg('hidden', '2048'));
const jsonOut = arg('json', undefined);
/** `llama`: the synthetic Q4_1 GGUF (default); `kimi`: the dense synthetic Kimi-K3 safetensors checkpoint (bf16). */
const MODEL = arg('model', 'llama');
if (MODEL !== 'llama' && MODEL !== 'kimi')
  throw new Error(`bench:verify-dense: --model ${MODEL}: expected llama or kimi`);
const SOURCE = path.join(ROOT, 'models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf');
const CACHE = path.join(ROOT, '.cache/synthetic-dense');
const GOAL = 1.3;
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const load = () => loadavg().slice(0, 2);
const fmtLoad = ([a, b]) => `${a.toFixed(2)} / ${b.toFixed(2)}`;

if (!(Number.isInteger(HIDDEN) && HIDDEN > 0 && HIDDEN % 512 === 0))
  throw new Error(`bench:verify-dense: --hidden ${HIDDEN}: expected a positive multiple of 512`);
if (MODEL === 'llama' && !fs.existsSync(SOURCE))
  throw new Error(`bench:verify-dense: ${SOURCE} is missing (npm run models:fetch)`);

// --- the synthetic configuration ------------------------------------------------------------------------------
const HEAD_DIM = 128;
const VOCAB = 49152;
const heads = HIDDEN / HEAD_DIM;
const kvHeads = heads / 4;
const inter = 4 * HIDDEN;
const Q4_1_BYTES = 20 / 32;
const Q8_0_BYTES = 34 / 32;
/** The layers' linear shapes [n, k] (q, k, v, o, gate, up, down). */
const layerLinears = [
  [HIDDEN, HIDDEN],
  [kvHeads * HEAD_DIM, HIDDEN],
  [kvHeads * HEAD_DIM, HIDDEN],
  [HIDDEN, HIDDEN],
  [inter, HIDDEN],
  [inter, HIDDEN],
  [HIDDEN, inter],
];
const layerParams = layerLinears.reduce((a, [n, k]) => a + n * k, 0);
const layerBytes = layerParams * Q4_1_BYTES + 2 * HIDDEN * 4;
const fixedBytes = VOCAB * HIDDEN * Q8_0_BYTES + HIDDEN * 4;
const KIMI = MODEL === 'kimi' ? denseSyntheticConfig() : undefined;
const LAYERS = Number(
  arg('layers', quick ? '2' : String(KIMI?.num_hidden_layers ?? Math.ceil((2 ** 30 - fixedBytes) / layerBytes))),
);
if (!(Number.isInteger(LAYERS) && LAYERS > 0)) throw new Error(`bench:verify-dense: --layers ${LAYERS}: expected ≥ 1`);
/** Linear parameters of one forward row: every layer's projections and the tied lm_head. */
const KIMI_CONFIG = KIMI && kimiLayers(KIMI, LAYERS);
const linearParams = KIMI_CONFIG ? kimiLinearParams(KIMI_CONFIG) : LAYERS * layerParams + VOCAB * HIDDEN;

/**
 * `c` (a Kimi HF config) at `layers` layers, every one dense: 1-based layers 4, 8, … MLA (the last one too when there
 * are fewer than 4), the others KDA, as largeSyntheticConfig's 8.
 */
function kimiLayers(c, layers) {
  const ids = Array.from({ length: layers }, (_, i) => i + 1);
  const mla = (l) => l % 4 === 0 || (layers < 4 && l === layers);
  return {
    ...c,
    num_hidden_layers: layers,
    first_k_dense_replace: layers,
    linear_attn_config: {
      ...c.linear_attn_config,
      kda_layers: ids.filter((l) => !mla(l)),
      full_attn_layers: ids.filter(mla),
    },
  };
}

/** The Kimi stage of the checkpoint in `dir` (native kernels, the default activations). */
function loadKimiDir(dir) {
  const weights = SafetensorsCheckpoint.open(dir);
  try {
    return loadKimiStage({ dir, config: HfConfig.read(dir), weights });
  } finally {
    weights.close();
  }
}

/** Multiply-adds per row of a dense Kimi config: KDA and MLA projections (MLA's absorbed kv_b too), MLP, lm_head. */
function kimiLinearParams(c) {
  const D = c.hidden_size;
  const la = c.linear_attn_config;
  const HD = la.num_heads * la.head_dim;
  const kda = D * (3 * HD + 2 * la.head_dim + la.num_heads) + 2 * HD * la.head_dim + D * HD;
  const H = c.num_attention_heads;
  const mla =
    D * (H * (c.qk_nope_head_dim + c.qk_rope_head_dim) + c.kv_lora_rank + c.qk_rope_head_dim) +
    D * H * c.v_head_dim +
    H * (c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank;
  return (
    la.kda_layers.length * kda +
    la.full_attn_layers.length * mla +
    c.num_hidden_layers * 3 * D * c.intermediate_size +
    c.vocab_size * D
  );
}

const params = {
  version: 1,
  source: { file: path.relative(ROOT, SOURCE), bytes: MODEL === 'llama' ? fs.statSync(SOURCE).size : 0 },
  seed: 1,
  hidden: HIDDEN,
  heads,
  kvHeads,
  headDim: HEAD_DIM,
  intermediate: inter,
  vocab: VOCAB,
  layers: LAYERS,
  scaleRange: [0.01, 0.02],
  minOverScale: -7.5,
  normRange: [0.95, 1.05],
};
const stem = path.join(CACHE, `llama-h${HIDDEN}-l${LAYERS}`);
const KIMI_DIR = path.join(CACHE, `kimi-dense-h${KIMI?.hidden_size}-l${LAYERS}`);
const KIMI_PARAMS = `${KIMI_DIR}.json`;
const GGUF_PATH = `${stem}.gguf`;
const PARAMS_PATH = `${stem}.json`;

// --- writing the GGUF -----------------------------------------------------------------------------------------
/** xorshift32 stream (deterministic per seed); fills a byte array with random bits, 4 bytes per step. */
function randomFill(bytes, seed) {
  let x = seed >>> 0 || 0x9e3779b9;
  const words = new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 2);
  for (let i = 0; i < words.length; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    words[i] = x;
  }
  for (let i = words.length * 4; i < bytes.length; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    bytes[i] = x & 0xff;
  }
}

const D_LO = f32ToF16(params.scaleRange[0]);
const D_SPAN = f32ToF16(params.scaleRange[1]) - D_LO + 1;
/** Q4_1 minimum bits per scale bits (index: d bits − D_LO). */
const M_OF_D = Uint16Array.from({ length: D_SPAN }, (_, i) => f32ToF16(params.minOverScale * f16ToF32(D_LO + i)));

/** Random bytes of a `[n, k]` tensor of `type` (Q4_1 or Q8_0) with finite, sensible scales; F32: norm weights. */
function tensorData(type, ne, seed) {
  const out = new Uint8Array(ggufTensorBytes(type, ne));
  randomFill(out, seed);
  if (type === GgmlType.F32) {
    const f = new Float32Array(out.buffer);
    const [lo, hi] = params.normRange;
    for (let i = 0; i < f.length; i++) f[i] = lo + ((hi - lo) * ((seed + i * 2654435761) >>> 0)) / 2 ** 32;
    return out;
  }
  const u16 = new Uint16Array(out.buffer);
  if (type === GgmlType.Q4_1) {
    // block: f16 d, f16 m, 16 bytes of nibbles (any value is a valid nibble pair)
    for (let w = 0; w < u16.length; w += 10) {
      const d = D_LO + (u16[w] % D_SPAN);
      u16[w] = d;
      u16[w + 1] = M_OF_D[d - D_LO];
    }
    return out;
  }
  if (type === GgmlType.Q8_0) {
    // block: f16 d, 32 int8 quants (|q| ≤ 127, as ggml's quantizer writes them)
    for (let b = 0; b < out.length; b += 34) {
      u16[b >>> 1] = D_LO + (u16[b >>> 1] % D_SPAN);
      for (let j = b + 2; j < b + 34; j++) if (out[j] === 0x80) out[j] = 0x81;
    }
    return out;
  }
  throw new Error(`bench:verify-dense: no random data for ggml type ${type}`);
}

/** Writes the synthetic GGUF (metadata from SmolLM2's, dimension keys replaced; tensors streamed). */
function writeSynthetic() {
  const src = GgufFile.open(SOURCE);
  const replace = new Map([
    ['llama.block_count', LAYERS],
    ['llama.embedding_length', HIDDEN],
    ['llama.feed_forward_length', inter],
    ['llama.attention.head_count', heads],
    ['llama.attention.head_count_kv', kvHeads],
    ['llama.rope.dimension_count', HEAD_DIM],
    ['llama.vocab_size', VOCAB],
  ]);
  const metadata = [...src.metadata.values()].map((e) => {
    if (!replace.has(e.key)) return { key: e.key, type: e.type, value: e.value };
    if (e.type !== GgufValueType.UINT32) throw new Error(`bench:verify-dense: ${SOURCE}: ${e.key} is not a UINT32`);
    const value = replace.get(e.key);
    replace.delete(e.key);
    return { key: e.key, type: e.type, value };
  });
  if (replace.size > 0) throw new Error(`bench:verify-dense: ${SOURCE} lacks ${[...replace.keys()].join(', ')}`);
  const tokens = src.getStringArray('tokenizer.ggml.tokens').length;
  if (tokens !== VOCAB) throw new Error(`bench:verify-dense: ${SOURCE}: ${tokens} tokens, expected ${VOCAB}`);
  const tensors = [];
  const add = (name, type, ne) => {
    const seed = (params.seed * 0x01000193 + tensors.length * 0x9e3779b1) >>> 0;
    tensors.push({ name, type, ne, data: () => tensorData(type, ne, seed) });
  };
  const kvw = kvHeads * HEAD_DIM;
  // SmolLM2's tensor order (llama.cpp's converter): the embedding, per layer the norms and projections, the norm
  add('token_embd.weight', GgmlType.Q8_0, [HIDDEN, VOCAB]);
  for (let l = 0; l < LAYERS; l++) {
    add(`blk.${l}.attn_norm.weight`, GgmlType.F32, [HIDDEN]);
    add(`blk.${l}.ffn_down.weight`, GgmlType.Q4_1, [inter, HIDDEN]);
    add(`blk.${l}.ffn_gate.weight`, GgmlType.Q4_1, [HIDDEN, inter]);
    add(`blk.${l}.ffn_up.weight`, GgmlType.Q4_1, [HIDDEN, inter]);
    add(`blk.${l}.ffn_norm.weight`, GgmlType.F32, [HIDDEN]);
    add(`blk.${l}.attn_k.weight`, GgmlType.Q4_1, [HIDDEN, kvw]);
    add(`blk.${l}.attn_output.weight`, GgmlType.Q4_1, [HIDDEN, HIDDEN]);
    add(`blk.${l}.attn_q.weight`, GgmlType.Q4_1, [HIDDEN, HIDDEN]);
    add(`blk.${l}.attn_v.weight`, GgmlType.Q4_1, [HIDDEN, kvw]);
  }
  add('output_norm.weight', GgmlType.F32, [HIDDEN]);
  fs.mkdirSync(CACHE, { recursive: true });
  return writeGguf(GGUF_PATH, metadata, tensors);
}

const sameParams = (a, b) => JSON.stringify(a) === JSON.stringify(b);
let written = false;
let recorded;
try {
  recorded = JSON.parse(fs.readFileSync(MODEL === 'kimi' ? KIMI_PARAMS : PARAMS_PATH, 'utf8'));
} catch {
  recorded = undefined;
}
if (MODEL === 'kimi') {
  // the checkpoint is reused while the recorded config matches and its index is there
  if (
    recorded === undefined ||
    !sameParams(recorded.config, KIMI_CONFIG) ||
    !fs.existsSync(path.join(KIMI_DIR, 'model.safetensors.index.json'))
  ) {
    const t0 = performance.now();
    console.log(`bench:verify-dense: writing ${path.relative(ROOT, KIMI_DIR)} (once; reused while the config holds)…`);
    fs.rmSync(KIMI_DIR, { recursive: true, force: true });
    const { bytes } = writeSyntheticKimi(KIMI_DIR, KIMI_CONFIG);
    recorded = { config: KIMI_CONFIG, checkpointBytes: bytes, tensorBytes: kimiWeightBytes(KIMI_CONFIG).fixed };
    fs.writeFileSync(KIMI_PARAMS, `${JSON.stringify(recorded, null, 2)}\n`);
    written = true;
    console.log(`bench:verify-dense: written in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  }
} else if (
  recorded === undefined ||
  !sameParams(recorded.params, params) ||
  !fs.existsSync(GGUF_PATH) ||
  fs.statSync(GGUF_PATH).size !== recorded.fileBytes
) {
  const t0 = performance.now();
  console.log(
    `bench:verify-dense: writing ${path.relative(ROOT, GGUF_PATH)} (once; reused while the parameters hold)…`,
  );
  fs.rmSync(PARAMS_PATH, { force: true });
  const r = writeSynthetic();
  recorded = { params, tensorBytes: r.tensorBytes, fileBytes: r.fileBytes };
  fs.writeFileSync(PARAMS_PATH, `${JSON.stringify(recorded, null, 2)}\n`);
  written = true;
  console.log(`bench:verify-dense: written in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}
const WEIGHT_BYTES = recorded.tensorBytes;

// --- bounds helpers (bench/read-bw.c, bench/dot-rate.c) ----------------------------------------------------------
/** Read bandwidth of THREADS threads over 256 MiB (bench/read-bw.c), GB/s, per run. */
function readBandwidth(runs) {
  return Array.from({ length: runs }, () => readBandwidthGBs(THREADS, 256, CACHE));
}
/** Peak dot-product rates from registers (bench/dot-rate.c), G ops/s (a multiply-add = 2 ops), best of `runs`. */
function dotRates(runs) {
  return probeDotRates(THREADS, CACHE, { runs, seconds: quick ? 0.2 : 0.5 });
}

// --- load ------------------------------------------------------------------------------------------------------
/** The activations path: the GGUF's (SPECD_GGUF_ACT, default int16), or the Kimi stage's (read after the load). */
let ACT = process.env.SPECD_GGUF_ACT || 'int16';
const loadStart = load();
const startedAt = new Date().toISOString();
const cpu = cpus()[0]?.model ?? '?';
const amx = cpuHasAmx();
const mb = (b) => (b / 1e6).toLocaleString('en-US', { minimumFractionDigits: 1, maximumFractionDigits: 1 });
if (MODEL === 'llama') {
  console.log(
    `bench:verify-dense — synthetic llama GGUF (SmolLM2's layout, random weights): hidden ${HIDDEN}, ${heads} heads ` +
      `× ${HEAD_DIM}, ${kvHeads} KV heads, intermediate ${inter}, vocab ${VOCAB}, ${LAYERS} layers; ` +
      `Q4_1 q/k/v/o/gate/up/down, Q8_0 tied token_embd, F32 norms; ${path.relative(ROOT, GGUF_PATH)} ` +
      `(${written ? 'written now' : 'reused'})`,
  );
  console.log(
    `tensor bytes ${WEIGHT_BYTES.toLocaleString('en-US')} (${mb(WEIGHT_BYTES)} MB, ` +
      `${(WEIGHT_BYTES / 2 ** 30).toFixed(3)} GiB; file ${recorded.fileBytes.toLocaleString('en-US')} bytes); ` +
      'linear parameters ' +
      `${(linearParams / 1e9).toFixed(3)} G (${LAYERS} × ${(layerParams / 1e6).toFixed(2)} M + lm_head ` +
      `${((VOCAB * HIDDEN) / 1e6).toFixed(2)} M)`,
  );
} else {
  const c = KIMI_CONFIG;
  const la = c.linear_attn_config;
  console.log(
    'bench:verify-dense — synthetic Kimi-K3 checkpoint, dense (bench/synthetic-kimi.mjs, random bf16 weights): ' +
      `hidden ${c.hidden_size}, ${LAYERS} layers (KDA ${la.kda_layers.join(',')}: ${la.num_heads} heads × ` +
      `${la.head_dim}; MLA ${la.full_attn_layers.join(',')}: ${c.num_attention_heads} heads, kv rank ` +
      `${c.kv_lora_rank}), dense SwiGLU ` +
      `MLP ${c.intermediate_size} in every layer, vocab ${c.vocab_size}; ${path.relative(ROOT, KIMI_DIR)} ` +
      `(${written ? 'written now' : 'reused'})`,
  );
  console.log(
    `weight bytes a forward reads ${WEIGHT_BYTES.toLocaleString('en-US')} (${mb(WEIGHT_BYTES)} MB, ` +
      `${(WEIGHT_BYTES / 2 ** 30).toFixed(3)} GiB: every matrix, norms and the lm_head; the embedding row left out; ` +
      `bench/synthetic-kimi.mjs kimiWeightBytes); linear parameters ${(linearParams / 1e9).toFixed(3)} G per row ` +
      "(the projections, the MLP, the lm_head and MLA's absorbed kv_b)",
  );
}
setNumThreads(THREADS);
const tLoad0 = performance.now();
// the Kimi checkpoint has no tokenizer: its stage is loaded directly (as bench:decode loads it), the GGUF as a target
const target = MODEL === 'kimi' ? undefined : await loadTarget(GGUF_PATH, BUILTIN_PLUGIN_PACKAGES);
if (target !== undefined && target.pluginName !== 'llama')
  throw new Error(`bench:verify-dense: loaded by plugin ${target.pluginName}`);
const model = target?.model ?? loadKimiDir(KIMI_DIR);
const loadS = (performance.now() - tLoad0) / 1000;
if (MODEL === 'kimi') ACT = model.gemmActivations;
console.log(
  `activations ${ACT}${
    MODEL === 'kimi'
      ? process.env.SPECD_KIMI_ACTIVATIONS
        ? ' (SPECD_KIMI_ACTIVATIONS)'
        : ' (default: defaultKimiActivations)'
      : process.env.SPECD_GGUF_ACT
        ? ' (SPECD_GGUF_ACT)'
        : ' (default)'
  }, specd isa ${isa().isa}, threads ${THREADS}, context ${CONTEXT}, ${REPS} reps; ${cpus().length} vCPUs (${cpu}; ` +
    `AMX ${amx ? 'yes' : 'no'} in /proc/cpuinfo); node ${process.version}; ${startedAt}; load ${fmtLoad(loadStart)} ` +
    '(1/5 min)',
);
console.log(`loaded ${target ? `by the ${target.pluginName} plugin` : 'by loadKimiStage'} in ${loadS.toFixed(1)} s`);

// --- bounds ----------------------------------------------------------------------------------------------------
const bw = readBandwidth(quick ? 1 : 3);
const bwBest = Math.max(...bw);
const rates = dotRates(quick ? 1 : 3);
const vnni = rates.vnni_int8 ?? 0;
const amxInt8 = rates.amx_int8 ?? 0;
if (!(vnni > 0)) throw new Error('bench:verify-dense: bench/dot-rate.c measured no AVX512-VNNI int8 rate');
const int8Rate = Math.max(vnni, amxInt8);
const int16Rate = vnni / 2;
/**
 * The activations path's dot-product rate, G ops/s, and where it comes from. Kimi (gemmBf16's variants,
 * native/src/gemm.cc): f32 is fp32 FMA on widened weights; bf16 runs AMX-BF16 tiles; bf16x2 (split bf16) stacks each
 * row's hi and lo as two tile rows, so twice the work at the AMX-BF16 rate; without AMX both bf16 variants run the
 * fp32 kernels on the rounded rows.
 */
const [actRate, actRateText] = (() => {
  if (MODEL === 'llama')
    return ACT === 'int16'
      ? [int16Rate, `VNNI int8 ÷ 2 = ${int16Rate.toFixed(0)} (two VPDPBUSD chains per block, no AMX: quant_kernels.h)`]
      : ACT === 'int8'
        ? [int8Rate, `${int8Rate.toFixed(0)} (the int8 peak)`]
        : [rates.avx512_f32, `${rates.avx512_f32.toFixed(0)} (fp32 FMA)`];
  const amxBf16 = rates.amx_bf16 ?? 0;
  if (ACT === 'f32' || !(amxBf16 > 0)) return [rates.avx512_f32, `${rates.avx512_f32.toFixed(0)} (fp32 FMA)`];
  if (ACT === 'bf16') return [amxBf16, `${amxBf16.toFixed(0)} (AMX-BF16)`];
  return [amxBf16 / 2, `AMX-BF16 ÷ 2 = ${(amxBf16 / 2).toFixed(0)} (split bf16: a hi and a lo tile row per row)`];
})();
const tMem = (WEIGHT_BYTES / (bwBest * 1e9)) * 1000;
const verifyOps = ROWS * 2 * linearParams;
const tCompute = (verifyOps / (actRate * 1e9)) * 1000;
const tCompute8 = (verifyOps / (int8Rate * 1e9)) * 1000;
const floorRatio = Math.max(tMem, tCompute) / tMem;
const floorRatio8 = Math.max(tMem, tCompute8) / tMem;
const g0 = (x) => (x === null || x === undefined ? 'n/a' : x.toFixed(0));
console.log(
  `read bandwidth (bench/read-bw.c, ${THREADS} threads, 256 MiB): ${bw.map((x) => x.toFixed(1)).join(', ')} GB/s → ` +
    `t_mem = ${mb(WEIGHT_BYTES)} MB ÷ ${bwBest.toFixed(1)} GB/s = ${tMem.toFixed(2)} ms (the floor of t_step and of ` +
    't_verify(16))',
);
console.log(
  `dot-product peaks (bench/dot-rate.c, ${THREADS} threads, best of ${quick ? 1 : 3}, G ops/s): VNNI int8 ` +
    `${g0(rates.vnni_int8)}, AMX-INT8 ${g0(rates.amx_int8)}, AVX512-BF16 ${g0(rates.avx512_bf16)}, ` +
    `AMX-BF16 ${g0(rates.amx_bf16)}, fp32 FMA ${g0(rates.avx512_f32)}; the ${ACT} path's rate: ${actRateText}`,
);
console.log(
  `t_compute16 = 16 × 2 × ${(linearParams / 1e9).toFixed(3)} G params ÷ ${actRate.toFixed(0)} G ops/s = ` +
    `${tCompute.toFixed(2)} ms${
      MODEL === 'llama' ? ` (int8 activations at the int8 peak: ${tCompute8.toFixed(2)} ms)` : ''
    }; lowest reachable t_verify(16)/t_step here = max(t_mem, t_compute16) / t_mem = ${floorRatio.toFixed(2)}` +
    `${MODEL === 'llama' ? ` (int8: ${floorRatio8.toFixed(2)})` : ''}` +
    `${MODEL === 'kimi' ? '; attention, the KDA recurrence and the norms are left out' : ''}`,
);

// --- timing ----------------------------------------------------------------------------------------------------
const V = model.info.vocabSize;
const cache = new SequenceCache(model.cacheGeometry, {
  pageSize: 16,
  numPages: Math.ceil((CONTEXT + ROWS) / 16) + 1,
  numSlots: 1,
});
cache.add('s');
const prompt = Int32Array.from({ length: CONTEXT }, (_, i) => 1 + ((i * 7919) % (V - 1)));
model.forward({ sequences: [{ id: 's', position: 0, tokens: prompt, logits: 'last' }] }, cache);
/** One timed forward of `m` rows at the context's end (undone afterwards), ms; `check` counts non-finite logits. */
function timed(m, r, check) {
  const block = Int32Array.from({ length: m }, (_, i) => 1 + (((i + r) * 104729) % (V - 1)));
  const cp = cache.checkpoint('s');
  const t0 = performance.now();
  const res = model.forward(
    { sequences: [{ id: 's', position: CONTEXT, tokens: block, logits: m === 1 ? 'last' : 'all' }] },
    cache,
  );
  const ms = performance.now() - t0;
  cache.rollback('s', cp);
  if (check) {
    let bad = 0;
    let sq = 0;
    for (const x of res.logits) {
      if (!Number.isFinite(x)) bad++;
      else sq += x * x;
    }
    check.bad = bad;
    check.rms = Math.sqrt(sq / res.logits.length);
    check.rows = res.logits.length / V;
  }
  return ms;
}
const WARMUP = 2;
const step = [];
const verify = [];
const check = {};
for (let r = 0; r < REPS + WARMUP; r++) {
  const order = r % 2 === 0 ? [1, ROWS] : [ROWS, 1];
  for (const m of order) {
    const ms = timed(m, r, r === 0 && m === ROWS ? check : undefined);
    if (r >= WARMUP) (m === 1 ? step : verify).push(ms);
  }
  if (r >= WARMUP)
    console.log(
      `rep ${r - WARMUP + 1}/${REPS}: t_step ${step.at(-1).toFixed(2)} ms, ` +
        `t_verify(16) ${verify.at(-1).toFixed(2)} ms, ratio ${(verify.at(-1) / step.at(-1)).toFixed(3)}; ` +
        `load ${load()[0].toFixed(2)}`,
    );
}
if (check.bad !== 0 || check.rows !== ROWS)
  throw new Error(`bench:verify-dense: the verify logits hold ${check.bad} non-finite values (${check.rows} rows)`);

// --- results ---------------------------------------------------------------------------------------------------
const tStep = median(step);
const tVerify = median(verify);
const ratio = tVerify / tStep;
const ratioMin = Math.min(...verify) / Math.min(...step);
const perRep = step.map((s, i) => verify[i] / s);
const met = ratio <= GOAL;
const loadEnd = load();
console.log(
  `\nverify logits: ${check.rows} rows × ${V}, all finite (rms ${check.rms.toFixed(1)}); context ${CONTEXT}, ` +
    `${THREADS} threads, activations ${ACT}`,
);
console.log(`| ${LAYERS} layers, ${mb(WEIGHT_BYTES)} MB | median ms | min ms | floor ms | median ÷ floor |`);
console.log('|---|---:|---:|---:|---:|');
console.log(
  `| t_step (1 token) | ${tStep.toFixed(2)} | ${Math.min(...step).toFixed(2)} | ${tMem.toFixed(2)} (t_mem) | ` +
    `${(tStep / tMem).toFixed(2)} |`,
);
const vFloor = Math.max(tMem, tCompute);
console.log(
  `| t_verify(16) (16 tokens, logits of all) | ${tVerify.toFixed(2)} | ${Math.min(...verify).toFixed(2)} | ` +
    `${vFloor.toFixed(2)} (${tCompute >= tMem ? 't_compute16' : 't_mem'}) | ${(tVerify / vFloor).toFixed(2)} |`,
);
console.log(
  `| t_verify(16) / t_step | ${ratio.toFixed(3)} (of the medians) | ${ratioMin.toFixed(3)} (of the minimums) | ` +
    `${floorRatio.toFixed(2)} | – |`,
);
console.log(`per-rep ratios: ${perRep.map((x) => x.toFixed(3)).join(', ')} (median ${median(perRep).toFixed(3)})`);
console.log(
  `\nt_verify(16)/t_step ≤ ${GOAL}: ${met ? 'met' : 'not met'} (measured ${ratio.toFixed(3)}; physical floor of ` +
    `the ratio here: ${floorRatio.toFixed(2)}` +
    `${MODEL === 'llama' && ACT === 'int16' ? `, ${floorRatio8.toFixed(2)} with int8 activations` : ''})`,
);
if (ratio < floorRatio || tStep < tMem || tVerify < vFloor)
  console.log(
    'note: a measured time or ratio is below its floor: the peak rates were measured low (the machine was loaded); ' +
      'the floors are not reliable in this run',
  );
console.log(`load at the end ${fmtLoad(loadEnd)} (1/5 min); ${new Date().toISOString()}`);

// --- profile (--profile) -----------------------------------------------------------------------------------------
const profile = globalThis.specdNativeTimingHook ? await profilePass(3) : undefined;
/**
 * Every native call of `reps` step and verify forwards (alternated) timed by bench/native-timing.mjs; a GEMM is
 * attributed to its weight shape. Returns { step, verify } as Map(family → { ms, calls }) per forward, wall ms
 * included, and prints the table.
 */
async function profilePass(reps) {
  const { nativeTiming } = await import('./native-timing.mjs');
  nativeTiming.classify = (name, args) =>
    name === 'gemmBf16' || name === 'gemmQuant' ? `${name} ${args[2].n} × ${args[2].k}` : name;
  const out = {};
  for (const m of [1, ROWS]) {
    const walls = [];
    const perForward = new Map();
    for (let r = 0; r < reps; r++) {
      nativeTiming.reset();
      nativeTiming.enabled = true;
      walls.push(timed(m, r));
      nativeTiming.enabled = false;
      for (const [family, { ms, calls }] of nativeTiming.totals) {
        const e = perForward.get(family) ?? { ms: 0, calls: 0 };
        e.ms += ms / reps;
        e.calls += calls / reps;
        perForward.set(family, e);
      }
    }
    out[m === 1 ? 'step' : 'verify'] = { wall: walls.reduce((a, b) => a + b, 0) / reps, families: perForward };
  }
  const families = [...new Set([...out.step.families.keys(), ...out.verify.families.keys()])].sort(
    (a, b) => (out.verify.families.get(b)?.ms ?? 0) - (out.verify.families.get(a)?.ms ?? 0),
  );
  const gemmBytes = (family) => {
    const hit = /^gemmBf16 (\d+) × (\d+)$/.exec(family);
    return hit ? Number(hit[1]) * Number(hit[2]) * 2 : 0;
  };
  console.log(
    `\nprofile (--profile): every native call timed, mean of ${reps} forwards each; GEMMs by weight shape n × k ` +
      '(bf16), GB/s = weight bytes ÷ time',
  );
  console.log('| family | step ms (calls) | verify(16) ms (calls) | verify ÷ step | GB/s step / verify |');
  console.log('|---|---:|---:|---:|---:|');
  let nativeStep = 0;
  let nativeVerify = 0;
  for (const f of families) {
    const a = out.step.families.get(f) ?? { ms: 0, calls: 0 };
    const b = out.verify.families.get(f) ?? { ms: 0, calls: 0 };
    nativeStep += a.ms;
    nativeVerify += b.ms;
    const bytes = gemmBytes(f);
    const gbs =
      bytes > 0
        ? `${((bytes * a.calls) / (a.ms * 1e6)).toFixed(1)} / ${((bytes * b.calls) / (b.ms * 1e6)).toFixed(1)}`
        : '';
    console.log(
      `| ${f} | ${a.ms.toFixed(2)} (${a.calls.toFixed(0)}) | ${b.ms.toFixed(2)} (${b.calls.toFixed(0)}) | ` +
        `${a.ms > 0 ? (b.ms / a.ms).toFixed(2) : '–'} | ${gbs} |`,
    );
  }
  const jsStep = out.step.wall - nativeStep;
  const jsVerify = out.verify.wall - nativeVerify;
  console.log(
    `| JavaScript (the rest) | ${jsStep.toFixed(2)} | ${jsVerify.toFixed(2)} | ${(jsVerify / jsStep).toFixed(2)} | |`,
  );
  console.log(
    `| **whole forward (profiled)** | ${out.step.wall.toFixed(2)} | ${out.verify.wall.toFixed(2)} | ` +
      `${(out.verify.wall / out.step.wall).toFixed(2)} | |`,
  );
  // The GEMMs of one forward of each kind again, back to back with the same arguments (the weights streamed from
  // DRAM either way: the forward's matrices are ~1.2 GB): a kernel alone against the same kernel inside the forward.
  const captured = { 1: [], [ROWS]: [] };
  nativeTiming.classify = (name, args) => {
    if (name === 'gemmBf16') captured[args[1]]?.push(args);
    return name;
  };
  for (const m of [1, ROWS]) {
    nativeTiming.enabled = true;
    timed(m, 0);
    nativeTiming.enabled = false;
  }
  const inForward = (m) => [...out[m === 1 ? 'step' : 'verify'].families].filter(([f]) => f.startsWith('gemmBf16'));
  for (const m of [1, ROWS]) {
    const calls = captured[m].filter((a) => a[1] === m);
    const alone = [];
    for (let r = 0; r < 3; r++) {
      const t0 = performance.now();
      for (const a of calls) gemmBf16(...a);
      alone.push(performance.now() - t0);
    }
    const fwd = inForward(m).reduce((acc, [, v]) => acc + v.ms, 0);
    console.log(
      `the ${calls.length} GEMMs of a ${m}-row forward: ${fwd.toFixed(2)} ms inside the forward, ` +
        `${median(alone).toFixed(2)} ms replayed back to back (median of 3)`,
    );
  }
  return out;
}

if (jsonOut)
  fs.writeFileSync(
    jsonOut,
    `${JSON.stringify(
      {
        startedAt,
        cpu,
        vcpus: cpus().length,
        amx,
        isa: isa().isa,
        node: process.version,
        threads: THREADS,
        activations: ACT,
        context: CONTEXT,
        rows: ROWS,
        reps: REPS,
        model:
          MODEL === 'kimi'
            ? { kimi: path.relative(ROOT, KIMI_DIR), config: KIMI_CONFIG, tensorBytes: WEIGHT_BYTES, linearParams }
            : { gguf: path.relative(ROOT, GGUF_PATH), ...params, tensorBytes: WEIGHT_BYTES, linearParams },
        loadSeconds: loadS,
        bounds: {
          readGBs: bw,
          dotRates: rates,
          rateGops: actRate,
          tMemMs: tMem,
          tCompute16Ms: tCompute,
          tCompute16Int8Ms: tCompute8,
          floorRatio,
          floorRatioInt8: floorRatio8,
        },
        stepMs: step,
        verifyMs: verify,
        median: { stepMs: tStep, verifyMs: tVerify },
        ratio,
        ratioMin,
        goal: { text: `t_verify(16)/t_step ≤ ${GOAL}`, met },
        verifyLogits: check,
        ...(profile === undefined
          ? {}
          : {
              profile: Object.fromEntries(
                Object.entries(profile).map(([k, v]) => [
                  k,
                  { wall: v.wall, families: Object.fromEntries(v.families) },
                ]),
              ),
            }),
        loadStart,
        loadEnd,
      },
      null,
      2,
    )}\n`,
  );
model.dispose();
