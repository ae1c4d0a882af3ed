#!/usr/bin/env node
// The race: specd against llama.cpp on the same GGUF, SmolLM2-135M-Instruct Q4_1, same thread count, greedy, the
// same prompt token ids; the machine's physical bounds; issue 16's goals printed as met / not met.
//
//   npm run bench:peer                      (root; run `npm run build` and `npm run models:fetch` first; 10–20 min)
//   node bench/peer.mjs [--threads N] [--prompts N] [--tokens N] [--reps N] [--prefill 512,2048] [--json FILE]
//                       [--quick] [--no-native]
//
// Two llama.cpp builds, both installed on demand into the git-ignored .cache/peer/ (never by `npm test`):
//   - node-llama-cpp 3.21.1's prebuilt CPU binary (`npm install --prefix .cache/peer node-llama-cpp@3.21.1
//     --ignore-scripts`, ~730 MB; loaded with `getLlama({ gpu: false, build: 'never' })`);
//   - llama.cpp compiled for this machine: llama-cpp-python (version pinned in
//     scripts/install-llama-cpp-python.mjs) built from source in a venv under .cache/peer/llama-cpp-python/
//     with GGML_NATIVE=ON (-march=native: AVX512-VNNI/BF16 and AMX where the CPU has them; the first run
//     builds it, minutes), driven through bench/peer-llama-cpp.py (a JSON-lines worker, greedy generate()).
//     `--no-native` skips it.
// The goals compare specd with the faster of the two ("llama.cpp best") per measure.
//
// Prompts: the first N of tools/reference/smollm2/prompts/chat.jsonl and of plain.jsonl (N = 8 by
// default), their `prompt_token_ids` fed to every engine as ids (no re-tokenisation), `--tokens` new
// tokens each (default 128), EOS ignored (node-llama-cpp: `yieldEogToken: true` keeps it generating past
// an end-of-generation token; llama-cpp-python's generate() never stops by itself). Threads: `--threads N`
// for all (default 2): specd's compute pool (setNumThreads) and each llama.cpp context's threads.
// Measured in one run, alternating per prompt, `--reps` times (per prompt the median time over reps):
//   1. decode tok/s = (new tokens − 1) / (time of the last token − time of the first token), summed
//      over the prompts of a rep, one request at a time: specd = SpecEngine without a drafter,
//      llama.cpp = LlamaContextSequence.evaluate at temperature 0 / Llama.generate at temp 0;
//   2. llama.cpp's speculative modes: node-llama-cpp's prompt-lookup predictor (InputLookupTokenPredictor,
//      default options: patterns ≥ 1 token, up to 3 predicted tokens) and llama-cpp-python's
//      LlamaPromptLookupDecoding (prompt-lookup decoding: the last 2 tokens looked up in prompt + output,
//      up to 10 following tokens drafted and verified in one batch; the only speculative mode that build
//      offers without a second model), and specd with the SmolLM2 drafters (DFlash, EAGLE-3, DSpark) whose
//      models/smollm2-135m-instruct-<method>/config.json exists (draftPolicy 'max' and the default cost
//      policy; the ceiling max_k τ(k)·t_step/(t_draft(k)+t_verify(k)) from the cost engine's calibrated costs
//      and the max-k per-position acceptance, as in bench/spec.mjs); an absent drafter prints "not trained yet";
//   3. prefill tok/s = P / time to first token of a request with one new token, P = 512 and 2048
//      (the corpus prompts' ids concatenated: all of chat.jsonl, then plain.jsonl): specd's engine
//      (prefill chunk 64, its default, and 512) vs llama.cpp (batch 512);
//   4. the share of outputs that end in a repeated 8-gram loop: the last 8 generated tokens occur earlier
//      in the generated tokens (the output has started cycling), per engine;
//   5. the physical bounds (section "bounds" below): decode = GGUF tensor bytes (the tied embedding is
//      read in full as the lm_head every step) ÷ the weight-read bandwidth, probed after every prompt of the race
//      (median; the VM's cores are ~2× faster in the first seconds of a burst than under sustained load, so the
//      rate measured once before the race is printed beside it, not used); prefill = matmul
//      FLOPs of P tokens ÷ the measured dot-product rate of specd's bf16 GEMM (AMX where present);
//   6. per-step native calls and thread-pool costs of specd's plain decode (bench/decode-calls.mjs, in a
//      child process so its call counters never touch the race).
// Greedy agreement (informational: llama.cpp quantises activations to 8 bits for its Q4_1 dot
// products, specd keeps them in fp32, so near-ties can flip): the first position where specd's and
// llama.cpp's outputs differ, per prompt. llama.cpp with prompt lookup should equal llama.cpp plain and
// each specd drafter run specd plain (greedy speculative decoding is lossless); differences are
// printed (llama.cpp's can differ: a multi-token verify batch goes through other kernels than a
// one-token decode, so near-ties can flip; at each specd/llama.cpp divergence the bench prints
// llama.cpp's probability of its token and of specd's, to show whether it is a near-tie).
import { execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import { createRequire } from 'node:module';
import { cpus, loadavg, tmpdir } from 'node:os';
import * as path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { BUILTIN_PLUGIN_PACKAGES, GgufFile, SpecEngine, loadDrafter, loadTarget } from '@specd/core';
import {
  gemmBf16,
  gemmQuant,
  isa,
  packBf16Weights,
  parallelCopy,
  quantizedWeights,
  setNumThreads,
} from '@specd/native';

import { ensureLlamaCppPython } from '../scripts/install-llama-cpp-python.mjs';
import { cpuHasAmx, dotRates } from './probes.mjs';
import { median } from './stats.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const quick = argv.includes('--quick');
const withNative = !argv.includes('--no-native');
const THREADS = Number(arg('threads', '2'));
const NPROMPTS = Number(arg('prompts', quick ? '4' : '8')); // per file
const NEW = Number(arg('tokens', quick ? '64' : '128'));
const REPS = Number(arg('reps', quick ? '1' : '3'));
const PREFILL = arg('prefill', quick ? '512' : '512,2048')
  .split(',')
  .map(Number);
const jsonOut = arg('json', undefined);
const NLC_VERSION = '3.21.1';
const MODEL_DIR = path.join(ROOT, 'models/smollm2-135m-instruct');
const GGUF = path.join(MODEL_DIR, 'SmolLM2-135M-Instruct.Q4_1.gguf');
const load = () => loadavg().slice(0, 2);

if (!fs.existsSync(GGUF)) throw new Error(`bench:peer: ${GGUF} is missing: run \`npm run models:fetch\``);

// --- node-llama-cpp, installed on demand ------------------------------------------------------------
const PEER = path.join(ROOT, '.cache/peer');
const nlcPkg = path.join(PEER, 'node_modules/node-llama-cpp/package.json');
const installed = () => fs.existsSync(nlcPkg) && JSON.parse(fs.readFileSync(nlcPkg, 'utf8')).version === NLC_VERSION;
if (!installed()) {
  console.log(
    `bench:peer: installing node-llama-cpp@${NLC_VERSION} into ${path.relative(ROOT, PEER)}/ (once; ~730 MB)…`,
  );
  fs.mkdirSync(PEER, { recursive: true });
  if (!fs.existsSync(path.join(PEER, 'package.json')))
    fs.writeFileSync(path.join(PEER, 'package.json'), '{ "private": true }\n');
  execFileSync(
    'npm',
    [
      'install',
      '--prefix',
      PEER,
      `node-llama-cpp@${NLC_VERSION}`,
      '--ignore-scripts',
      '--no-audit',
      '--no-fund',
      '--no-save',
    ],
    { stdio: 'inherit' },
  );
  if (!installed()) throw new Error(`bench:peer: node-llama-cpp@${NLC_VERSION} did not install into ${PEER}`);
}
const nlcEntry = createRequire(path.join(PEER, 'package.json')).resolve('node-llama-cpp');
const { getLlama, InputLookupTokenPredictor } = await import(pathToFileURL(nlcEntry).href);

// --- llama.cpp built for this machine (llama-cpp-python), installed on demand ---------------------------
/**
 * The worker bench/peer-llama-cpp.py over JSON lines: `request(obj)` resolves with its one-line answer
 * (requests are sequential). @throws Error naming the op when the worker answers {error} or exits.
 */
function startNativeWorker(python, args) {
  const child = spawn(python, [path.join(ROOT, 'bench/peer-llama-cpp.py'), ...args], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const lines = createInterface({ input: child.stdout });
  const waiting = [];
  let exited;
  lines.on('line', (line) => waiting.shift()?.resolve(JSON.parse(line)));
  child.on('exit', (code) => {
    exited = `the llama-cpp-python worker exited (code ${code})`;
    for (const w of waiting.splice(0)) w.reject(new Error(`bench:peer: ${w.op}: ${exited}`));
  });
  return {
    request(req) {
      if (exited) return Promise.reject(new Error(`bench:peer: ${req.op}: ${exited}`));
      return new Promise((resolve, reject) => {
        waiting.push({
          op: req.op,
          resolve: (res) =>
            res.error ? reject(new Error(`bench:peer: llama-cpp-python ${req.op}: ${res.error}`)) : resolve(res),
          reject,
        });
        child.stdin.write(`${JSON.stringify(req)}\n`);
      });
    },
    close() {
      child.stdin.end(`${JSON.stringify({ op: 'quit' })}\n`);
    },
  };
}
let native;
if (withNative) {
  const { python } = ensureLlamaCppPython((line) => console.log(`bench:peer: ${line}`));
  native = { python };
}

// --- prompts ----------------------------------------------------------------------------------------
const read = (name) =>
  fs
    .readFileSync(path.join(ROOT, 'tools/reference/smollm2/prompts', `${name}.jsonl`), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
const chat = read('chat');
const plain = read('plain');
const prompts = [...chat.slice(0, NPROMPTS), ...plain.slice(0, NPROMPTS)].map((p) => ({
  id: p.id,
  kind: p.kind,
  ids: p.prompt_token_ids,
}));
const corpus = [...chat, ...plain].flatMap((p) => p.prompt_token_ids);
for (const P of PREFILL)
  if (corpus.length < P) throw new Error(`bench:peer: the corpus has ${corpus.length} prompt tokens, fewer than ${P}`);

// --- engines ----------------------------------------------------------------------------------------
setNumThreads(THREADS);
const target = await loadTarget(MODEL_DIR, BUILTIN_PLUGIN_PACKAGES);
const MAX_SEQ_TOKENS = 4096;

const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' });
const lmodel = await llama.loadModel({ modelPath: GGUF });
const lctx = await lmodel.createContext({
  contextSize: MAX_SEQ_TOKENS,
  sequences: 2,
  threads: THREADS,
  batchSize: 512,
});
const lplain = lctx.getSequence();
const llookup = lctx.getSequence({ tokenPredictor: new InputLookupTokenPredictor() });
if (native) {
  const maxPrompt = Math.max(...prompts.map((p) => p.ids.length));
  native.worker = startNativeWorker(native.python, [
    '--model',
    GGUF,
    '--threads',
    String(THREADS),
    '--ctx',
    String(MAX_SEQ_TOKENS),
    '--lookup-ctx',
    String(maxPrompt + NEW + 64),
  ]);
  native.info = await native.worker.request({ op: 'info' });
}

const METHODS = ['dflash', 'eagle3', 'dspark'];
const drafters = [];
for (const m of METHODS) {
  const dir = path.join(ROOT, 'models', `smollm2-135m-instruct-${m}`);
  if (!fs.existsSync(path.join(dir, 'config.json'))) {
    drafters.push({ method: m, absent: true });
    continue;
  }
  const { drafter } = await loadDrafter(dir, BUILTIN_PLUGIN_PACKAGES, target, MAX_SEQ_TOKENS, 1);
  const cost = new SpecEngine(target.model, drafter, {
    maxSequences: 1,
    maxTokensPerSequence: MAX_SEQ_TOKENS,
    draftPolicy: 'cost',
  });
  cost.calibrate(); // before any timer, as a server calibrates once
  const max = new SpecEngine(target.model, drafter, {
    maxSequences: 1,
    maxTokensPerSequence: MAX_SEQ_TOKENS,
    draftPolicy: 'max',
  });
  drafters.push({ method: m, drafter, max, cost });
}
const specdPlain = new SpecEngine(target.model, undefined, { maxSequences: 1, maxTokensPerSequence: MAX_SEQ_TOKENS });
const specdChunk = new Map([
  [64, specdPlain],
  [
    512,
    new SpecEngine(target.model, undefined, {
      maxSequences: 1,
      maxTokensPerSequence: MAX_SEQ_TOKENS,
      prefillChunk: 512,
    }),
  ],
]);

let nextId = 0;
/** One specd request on engine `e`: token times from onToken. */
function specd(e, ids, maxTokens) {
  const times = [];
  const t0 = performance.now();
  const [r] = e.run([
    {
      id: `r${nextId++}`,
      promptIds: Int32Array.from(ids),
      maxTokens,
      sampling: { temperature: 0 },
      seed: 1,
      ignoreEos: true,
      onToken: () => times.push(performance.now()),
    },
  ]);
  return { tokens: r.tokenIds, t0, times };
}
/** One llama.cpp request on sequence `seq` (history cleared first, outside the timer). */
async function llamacpp(seq, ids, maxTokens) {
  await seq.clearHistory();
  seq.tokenPredictor?.updateInputTokens(ids); // what LlamaChat does: the lookup predictor searches these
  const before = { ...seq.tokenPredictions };
  const tokens = [];
  const times = [];
  const t0 = performance.now();
  for await (const t of seq.evaluate(ids, { temperature: 0, yieldEogToken: true })) {
    times.push(performance.now());
    tokens.push(t);
    if (tokens.length >= maxTokens) break;
  }
  const after = seq.tokenPredictions;
  return { tokens, t0, times, validated: after.validated - before.validated, refuted: after.refuted - before.refuted };
}

/** One request to llama.cpp's native build (`mode` 'plain' or 'lookup'); times in ms like the others. */
async function llamaNative(mode, ids, maxTokens) {
  const r = await native.worker.request({ op: 'generate', mode, ids, n: maxTokens });
  return { tokens: r.tokens, t0: r.t0 * 1000, times: r.times.map((t) => t * 1000) };
}

// --- bounds -----------------------------------------------------------------------------------------
/** Best of `reps` timed calls of `fn` (after one untimed), in ms. */
function bestMs(fn, reps = 7) {
  fn();
  let best = Number.POSITIVE_INFINITY;
  for (let r = 0; r < reps; r++) {
    const t0 = performance.now();
    fn();
    best = Math.min(best, performance.now() - t0);
  }
  return best;
}
/**
 * The machine's rates, measured with specd's kernels at THREADS threads: copy bandwidth (parallelCopy,
 * 2 × 256 MiB f32, read + write counted, GB/s); weight-read bandwidth (gemmBf16 GEMV m = 1 over 256 MiB of
 * bf16 weights, n = 16384, k = 8192: reads only, GB/s of weights); GEMM rates (GFLOP/s = 2·m·n·k / time) at
 * m = 512, n = k = 1024 (2 MiB of bf16 weights, cache-resident: the compute peak, not memory) with fp32
 * activations and with bf16 activations (AMX-BF16 where present, else AVX512-BF16: the dot-product rate the
 * prefill bound uses), and specd's Q4_1 GEMM (gemmQuant, fp32 activations; today's prefill path) on
 * SmolLM2's own gate projection (1536 × 576) at m = 512.
 */
function measureRates(gguf) {
  const copyN = 64 << 20;
  let src = new Float32Array(copyN).fill(1);
  let dst = new Float32Array(copyN);
  const copyGBs = (2 * copyN * 4) / bestMs(() => parallelCopy(dst, src)) / 1e6;
  src = dst = undefined;
  const [gn, gk] = [16384, 8192];
  let w = new Uint16Array(gn * gk);
  for (let i = 0; i < w.length; i++) w[i] = 0x3c00 | (i & 0x807f);
  let packed = packBf16Weights(w, gn, gk);
  w = undefined;
  const xg = new Float32Array(gk).fill(0.5);
  const gemv = () => gemmBf16(xg, 1, packed);
  const gemvGBs = (gn * gk * 2) / bestMs(gemv) / 1e6;
  /** The same GEMV's weight-read rate now (best of 3), GB/s: the race probes it between prompts. */
  const probeGemvGBs = () => (gn * gk * 2) / bestMs(gemv, 3) / 1e6;
  const [m, n, k] = [512, 1024, 1024];
  const wq = new Uint16Array(n * k);
  for (let i = 0; i < wq.length; i++) wq[i] = 0x3c00 | (i & 0x807f);
  const small = packBf16Weights(wq, n, k);
  const x = new Float32Array(m * k).fill(0.25);
  const y = new Float32Array(m * n);
  const gflops = (ms, mm, nn, kk) => (2 * mm * nn * kk) / ms / 1e6;
  const f32 = gflops(
    bestMs(() => gemmBf16(x, m, small, y, 'f32'), 3),
    m,
    n,
    k,
  );
  const bf16 = gflops(
    bestMs(() => gemmBf16(x, m, small, y, 'bf16'), 3),
    m,
    n,
    k,
  );
  const gate = gguf.tensor('blk.0.ffn_gate.weight');
  const [qn, qk] = gate.info.shape;
  const q = quantizedWeights(gate.bytes, 'q4_1', qn, qk);
  const xq = new Float32Array(m * qk).fill(0.25);
  const q41 = gflops(
    bestMs(() => gemmQuant(xq, m, q), 3),
    m,
    qn,
    qk,
  );
  return { copyGBs, gemvGBs, gemmGflops: { f32, bf16, q41 }, probeGemvGBs };
}

/**
 * Peak dot-product rates from registers (bench/dot-rate.c: VNNI int8, AVX512-BF16, AMX-INT8, AMX-BF16 on
 * THREADS threads at once, G ops/s, a multiply-add = 2 ops), compiled with `cc -O2 -march=native` into
 * .cache/peer/ when its source is newer than the binary. @returns the rates, or undefined (with the reason
 * printed) when no compiler is there or the probe fails: the bench then bounds prefill by the GEMM rate.
 */
function peakDotRates() {
  try {
    return dotRates(THREADS, PEER, { runs: 1, seconds: 0.5 });
  } catch (e) {
    console.log(`bench:peer: the dot-product rate probe (bench/dot-rate.c) failed: ${e.message}`);
    return undefined;
  }
}

/**
 * Decode bytes and prefill FLOPs of the GGUF. Bytes per decoded token: every tensor's bytes (the tied
 * token_embd is read in full as the lm_head each step; the one embedding row is not counted twice); KV reads
 * are left out (small at these contexts). FLOPs of a P-token prefill: 2·P·(matmul parameters of the layers)
 * + attention 4·heads·headDim·P(P+1)/2 per layer (QKᵀ and PV, causal) + one lm_head row (2·vocab·hidden).
 */
function modelCosts(gguf) {
  const get = (key) => gguf.metadata.get(key)?.value;
  const layers = get('llama.block_count');
  const hidden = get('llama.embedding_length');
  const heads = get('llama.attention.head_count');
  const vocab = get('llama.vocab_size') ?? gguf.info('token_embd.weight').shape[0];
  const tensors = gguf.tensors();
  const bytes = tensors.reduce((a, t) => a + t.byteLength, 0);
  const matmulParams = tensors
    .filter((t) => t.name.startsWith('blk.') && t.shape.length === 2)
    .reduce((a, t) => a + t.numElements, 0);
  const headDim = hidden / heads;
  const prefillFlops = (P) =>
    2 * P * matmulParams + (layers * 4 * heads * headDim * P * (P + 1)) / 2 + 2 * vocab * hidden;
  return { layers, bytes, matmulParams, prefillFlops };
}

/** Whether the last 8 generated tokens occur earlier in the generated tokens (the output has started cycling). */
function endsInLoop(tokens, n = 8) {
  if (tokens.length < n + 1) return false;
  const end = tokens.length - n;
  for (let i = 0; i < end; i++) {
    let same = true;
    for (let j = 0; j < n && same; j++) same = tokens[i + j] === tokens[end + j];
    if (same) return true;
  }
  return false;
}

// --- runs -------------------------------------------------------------------------------------------
const info = isa();
const [l1, l5] = load();
const amx = cpuHasAmx();
console.log(
  'bench:peer — SmolLM2-135M-Instruct Q4_1; specd vs llama.cpp (node-llama-cpp ' +
    `${NLC_VERSION}, ${llama.buildType ?? ''} CPU build` +
    `${native ? `; llama-cpp-python ${native.info.version} built with GGML_NATIVE` : '; native build skipped'})` +
    `; ${prompts.length} prompts × ${NEW} tokens, ${REPS} reps; threads ${THREADS} each; specd isa ${info.isa}, ` +
    `${cpus().length} vCPUs (${cpus()[0]?.model ?? '?'}; AMX ${amx ? 'yes' : 'no'} in /proc/cpuinfo); ` +
    `load ${l1.toFixed(2)} / ${l5.toFixed(2)} (1/5 min)`,
);
if (native) console.log(`llama.cpp native build system info: ${native.info.system_info.trim()}`);
const ggufFile = GgufFile.open(GGUF);
const costs = modelCosts(ggufFile);
const rates = measureRates(ggufFile);
rates.peak = peakDotRates();
const fmtPeak = (g) => (g === null || g === undefined ? 'n/a' : g.toFixed(0));
if (rates.peak)
  console.log(
    `peak dot-product rates from registers (bench/dot-rate.c, ${THREADS} threads, G ops/s): VNNI int8 ` +
      `${fmtPeak(rates.peak.vnni_int8)}, AVX512-BF16 ${fmtPeak(rates.peak.avx512_bf16)}, AMX-INT8 ` +
      `${fmtPeak(rates.peak.amx_int8)}, AMX-BF16 ${fmtPeak(rates.peak.amx_bf16)}`,
  );
console.log(
  `rates (specd kernels, ${THREADS} threads): copy ${rates.copyGBs.toFixed(1)} GB/s, weight read (bf16 GEMV, ` +
    `256 MiB) ${rates.gemvGBs.toFixed(1)} GB/s; GEMM m=512: fp32 activations ` +
    `${rates.gemmGflops.f32.toFixed(0)}, bf16 activations ${rates.gemmGflops.bf16.toFixed(0)}, Q4_1 (gemmQuant) ` +
    `${rates.gemmGflops.q41.toFixed(0)} GFLOP/s`,
);
// Warm-up (JIT, page faults, every engine).
specd(specdPlain, prompts[0].ids, 16);
await llamacpp(lplain, prompts[0].ids, 16);
await llamacpp(llookup, prompts[0].ids, 16);
if (native) {
  await llamaNative('plain', prompts[0].ids, 16);
  await llamaNative('lookup', prompts[0].ids, 16);
}

/** Engines of the decode race, in alternation order. */
const racers = [
  { key: 'specd', label: 'specd, plain decoding', run: (ids) => specd(specdPlain, ids, NEW) },
  {
    key: 'llama',
    label: 'llama.cpp prebuilt (node-llama-cpp), plain decoding',
    run: (ids) => llamacpp(lplain, ids, NEW),
  },
  {
    key: 'llama-lookup',
    label: 'llama.cpp prebuilt + prompt lookup (InputLookupTokenPredictor)',
    run: (ids) => llamacpp(llookup, ids, NEW),
    reference: 'llama',
    llamaSpec: true,
  },
];
if (native)
  racers.push(
    {
      key: 'native',
      label: `llama.cpp native build (llama-cpp-python ${native.info.version}), plain decoding`,
      run: (ids) => llamaNative('plain', ids, NEW),
    },
    {
      key: 'native-lookup',
      label: 'llama.cpp native build + prompt-lookup decoding (LlamaPromptLookupDecoding, 2-gram, ≤ 10 tokens)',
      run: (ids) => llamaNative('lookup', ids, NEW),
      reference: 'native',
      llamaSpec: true,
    },
  );
for (const d of drafters) {
  if (d.absent) continue;
  racers.push({
    key: `${d.method}-max`,
    label: `specd + ${d.method} (draftPolicy 'max', k=${d.drafter.maxDraftTokens})`,
    run: (ids) => specd(d.max, ids, NEW),
    engine: d.max,
    reference: 'specd',
    method: d.method,
  });
  racers.push({
    key: `${d.method}-cost`,
    label: `specd + ${d.method} (cost policy, default)`,
    run: (ids) => specd(d.cost, ids, NEW),
    engine: d.cost,
    reference: 'specd',
    method: d.method,
  });
}

// Per (engine, prompt): the decode time of every rep; reported: Σ (tokens − 1) / Σ median time, so a
// stall of the shared machine during one rep of one prompt does not count (per-rep totals go to --json).
/**
 * The weight-read rate probed after every prompt of the race (GB/s): this VM's cores run ~2× faster for the first
 * seconds of a burst than under sustained load, so a bound measured once before the race (a burst) is not the one the
 * race's decoding ran under. The decode bound uses the race's median.
 */
const raceGemvGBs = [];
const acc = new Map(
  racers.map((r) => [
    r.key,
    { dt: new Map(prompts.map((p) => [p.id, []])), repTotals: [], outputs: new Map(), validated: 0, refuted: 0 },
  ]),
);
for (let rep = 0; rep < REPS; rep++) {
  for (let i = 0; i < prompts.length; i++) {
    const p = prompts[i];
    // Alternate the order per prompt and rep so no engine always runs right after the same other one.
    const order = (i + rep) % 2 === 0 ? racers : [...racers].reverse();
    for (const r of order) {
      const res = await r.run(p.ids);
      const n = res.tokens.length;
      if (n !== NEW) throw new Error(`bench:peer: ${r.key}: ${p.id}: ${n} tokens, expected ${NEW}`);
      const a = acc.get(r.key);
      a.dt.get(p.id).push((res.times[n - 1] - res.times[0]) / 1000);
      if (rep === 0) a.outputs.set(p.id, res.tokens);
      if (res.validated !== undefined) {
        a.validated += res.validated;
        a.refuted += res.refuted;
      }
    }
    raceGemvGBs.push(rates.probeGemvGBs());
  }
  for (const r of racers) {
    const a = acc.get(r.key);
    a.repTotals.push((prompts.length * (NEW - 1)) / prompts.reduce((t, p) => t + a.dt.get(p.id)[rep], 0));
  }
  console.log(
    `rep ${rep + 1}/${REPS}: ` +
      `${racers.map((r) => `${r.key} ${acc.get(r.key).repTotals.at(-1).toFixed(1)}`).join(', ')}` +
      ` tok/s; load ${load()[0].toFixed(2)}`,
  );
}
/** Decode tok/s of `key` over the prompts of `kind` (undefined: all), from the per-prompt median times. */
const decodeTokPerS = (key, kind) => {
  const ps = prompts.filter((p) => kind === undefined || p.kind === kind);
  return (ps.length * (NEW - 1)) / ps.reduce((t, p) => t + median(acc.get(key).dt.get(p.id)), 0);
};

// Prefill: time to first token of a one-token request.
const prefillRows = [];
for (const P of PREFILL) {
  const ids = corpus.slice(0, P);
  const runs = { 'specd-64': [], 'specd-512': [], llama: [], ...(native ? { native: [] } : {}) };
  const keys = Object.keys(runs);
  for (let rep = 0; rep < REPS; rep++) {
    for (const k of rep % 2 === 0 ? keys : [...keys].reverse()) {
      const res =
        k === 'llama'
          ? await llamacpp(lplain, ids, 1)
          : k === 'native'
            ? await llamaNative('plain', ids, 1)
            : specd(specdChunk.get(Number(k.slice(6))), ids, 1);
      runs[k].push((res.times[0] - res.t0) / 1000);
    }
  }
  const ttft = Object.fromEntries(Object.entries(runs).map(([k, v]) => [k, median(v)]));
  prefillRows.push({ P, ttft, tokPerS: Object.fromEntries(Object.entries(ttft).map(([k, v]) => [k, P / v])) });
  console.log(
    `prefill ${P}: ${Object.entries(ttft)
      .map(([k, v]) => `${k} ${(P / v).toFixed(0)} tok/s (ttft ${(v * 1000).toFixed(0)} ms)`)
      .join(', ')}; load ${load()[0].toFixed(2)}`,
  );
}

// --- results ----------------------------------------------------------------------------------------
const firstDiff = (a, b) => {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : Math.min(a.length, b.length);
};
const specdOut = acc.get('specd').outputs;
const llamaOut = acc.get('llama').outputs;
const divergence = prompts.map((p) => ({ id: p.id, at: firstDiff(specdOut.get(p.id), llamaOut.get(p.id)) }));
const mismatches = []; // a specd drafter run that is not its plain greedy output: a bug
const lookupDiffs = []; // llama.cpp with lookup vs without: numerics of multi-token batches, not a bug of ours
for (const r of racers) {
  if (r.reference === undefined) continue;
  const ref = acc.get(r.reference).outputs;
  for (const p of prompts) {
    const at = firstDiff(ref.get(p.id), acc.get(r.key).outputs.get(p.id));
    if (at >= 0) (r.llamaSpec ? lookupDiffs : mismatches).push(`${r.key}: ${p.id} @${at}`);
  }
}
/** Prompts on which the native build's greedy output equals node-llama-cpp's / specd's (same llama.cpp?). */
const nativeAgree = native
  ? {
      llama: prompts.filter((p) => firstDiff(llamaOut.get(p.id), acc.get('native').outputs.get(p.id)) < 0).length,
      specd: prompts.filter((p) => firstDiff(specdOut.get(p.id), acc.get('native').outputs.get(p.id)) < 0).length,
    }
  : undefined;
// At each divergence: llama.cpp's probabilities of its own token and of specd's token there (near-ties?).
for (const d of divergence) {
  if (d.at < 0) continue;
  const p = prompts.find((q) => q.id === d.id);
  const ctx = [...p.ids, ...specdOut.get(d.id).slice(0, d.at)];
  await lplain.clearHistory();
  for await (const x of lplain.evaluateWithMetadata(
    ctx,
    { probabilities: true },
    { temperature: 0, yieldEogToken: true },
  )) {
    d.llamaP = x.probabilities.get(llamaOut.get(d.id)[d.at]) ?? 0;
    d.specdTokenLlamaP = x.probabilities.get(specdOut.get(d.id)[d.at]) ?? 0;
    break;
  }
}

/** The faster llama.cpp build's plain decode (node-llama-cpp's prebuilt or the native one). */
const llamaBest = native && decodeTokPerS('native') > decodeTokPerS('llama') ? 'native' : 'llama';
const llamaTok = decodeTokPerS(llamaBest);
const specdTok = decodeTokPerS('specd');
const rows = racers.map((r) => {
  const a = acc.get(r.key);
  const row = {
    key: r.key,
    label: r.label,
    tokPerS: decodeTokPerS(r.key),
    chat: decodeTokPerS(r.key, 'chat'),
    plain: decodeTokPerS(r.key, 'plain'),
    repTotals: a.repTotals,
    loops: prompts.filter((p) => endsInLoop(a.outputs.get(p.id))).length,
  };
  row.vsLlama = row.tokPerS / llamaTok;
  row.vsSpecd = row.tokPerS / specdTok;
  if (r.key === 'llama-lookup')
    row.note =
      `predicted tokens validated ${a.validated}, refuted ${a.refuted} (` +
      `${((100 * a.validated) / Math.max(1, a.validated + a.refuted)).toFixed(0)}% accepted)`;
  if (r.engine !== undefined) {
    const m = r.engine.metrics;
    row.tauPerStep = m.tauPerStep;
    row.perPosition = m.perPositionAcceptance;
    row.note =
      `τ per step ${m.tauPerStep.toFixed(3)}, drafts/step ` + `${(m.drafted / Math.max(1, m.verifySteps)).toFixed(2)}`;
  }
  return row;
});
// Ceiling of each drafter (C = 1, greedy): max-k acceptance × calibrated costs.
for (const d of drafters) {
  if (d.absent) continue;
  const c = d.cost.stepCosts;
  const perPos = d.max.metrics.perPositionAcceptance;
  const tStep = c.stepMs(1);
  let best = { k: 0, value: 1 };
  let tau = 1;
  for (let k = 1; k <= d.drafter.maxDraftTokens; k++) {
    tau += perPos[k - 1] ?? 0;
    const value = (tau * tStep) / (c.draftMs(1, k) + c.verifyMs(1, k + 1));
    if (value > best.value) best = { k, value };
  }
  d.ceiling = best;
  const row = rows.find((r) => r.key === `${d.method}-cost`);
  row.note += `; ceiling ×${best.value.toFixed(3)} at k=${best.k} (vs specd plain)`;
}

console.log('\nGreedy agreement, specd vs llama.cpp (first differing output token; -1 = all equal):');
console.log(divergence.map((d) => `${d.id} ${d.at}`).join(', '));
console.log(
  `llama.cpp's own probabilities there, p(its token) / p(specd's token): ${divergence
    .filter((d) => d.at >= 0)
    .map((d) => `${d.id} ${d.llamaP.toFixed(3)}/${d.specdTokenLlamaP.toFixed(3)}`)
    .join(', ')}`,
);
const agreeAll = divergence.filter((d) => d.at < 0).length;
const firstDivs = divergence.filter((d) => d.at >= 0).map((d) => d.at);
const firstDivergence = firstDivs.length
  ? `; first divergence at token ${Math.min(...firstDivs)} at the earliest, median ${median(firstDivs)}`
  : '';
console.log(`${agreeAll}/${prompts.length} prompts identical over ${NEW} tokens${firstDivergence}`);
if (lookupDiffs.length)
  console.log(
    'llama.cpp + prompt lookup differs from llama.cpp plain (greedy; its ' +
      `multi-token verify batches round differently): ${lookupDiffs.join(', ')}`,
  );
else console.log('llama.cpp + prompt lookup equals llama.cpp plain on every prompt');
if (mismatches.length) console.log(`SPECD LOSSLESSNESS MISMATCHES (a bug): ${mismatches.join(', ')}`);
else if (drafters.some((d) => !d.absent))
  console.log('specd drafter runs equal specd plain greedy output on every prompt');

const f1 = (x) => x.toFixed(1);
console.log(
  `\n| engine (threads ${THREADS}, greedy, ${NEW} new tokens, EOS ignored) | decode tok/s (all ` +
    `${prompts.length}) | chat ${NPROMPTS} | plain ${NPROMPTS} | ÷ llama.cpp best plain (${llamaBest}) | ` +
    '÷ specd plain | outputs ending in an 8-gram loop | notes |',
);
console.log('|---|---:|---:|---:|---:|---:|---:|---|');
for (const r of rows)
  console.log(
    `| ${r.label} | ${f1(r.tokPerS)} | ${f1(r.chat)} | ${f1(r.plain)} | ` +
      `${r.vsLlama.toFixed(3)} | ${r.vsSpecd.toFixed(3)} | ${r.loops}/${prompts.length} | ${r.note ?? ''} |`,
  );
for (const d of drafters)
  if (d.absent)
    console.log(
      `| specd + ${d.method} (max k / cost policy) | not trained yet ` +
        `| | | | | | models/smollm2-135m-instruct-${d.method} absent |`,
    );
if (nativeAgree)
  console.log(
    `\nllama.cpp native build vs prebuilt: identical greedy output on ${nativeAgree.llama}/${prompts.length} ` +
      `prompts; native vs specd: ${nativeAgree.specd}/${prompts.length}`,
  );
/** Per prefill length: the faster llama.cpp and specd's faster chunk. */
for (const p of prefillRows) {
  const t = p.tokPerS;
  p.llamaBest = t.native !== undefined && t.native > t.llama ? 'native' : 'llama';
  p.specdBest = t['specd-512'] > t['specd-64'] ? 'specd-512' : 'specd-64';
  p.ratio = t[p.specdBest] / t[p.llamaBest];
}
console.log(
  '\n| prefill (time to first token, one new token) | specd chunk 64 (default) tok/s | specd ' +
    'chunk 512 tok/s | llama.cpp prebuilt (batch 512) tok/s | llama.cpp native (batch 512) tok/s | ' +
    'specd best ÷ llama.cpp best |',
);
console.log('|---|---:|---:|---:|---:|---:|');
const ttftCell = (p, k) =>
  p.tokPerS[k] === undefined ? '–' : `${p.tokPerS[k].toFixed(0)} (${(p.ttft[k] * 1000).toFixed(0)} ms)`;
for (const p of prefillRows)
  console.log(
    `| ${p.P}-token prompt | ${ttftCell(p, 'specd-64')} | ${ttftCell(p, 'specd-512')} | ${ttftCell(p, 'llama')} | ` +
      `${ttftCell(p, 'native')} | ${p.ratio.toFixed(3)} (${p.specdBest} ÷ ${p.llamaBest}) |`,
  );

// --- bounds, native calls, goals ----------------------------------------------------------------------
const raceGemv = [...raceGemvGBs].sort((a, b) => a - b);
const raceMedianGBs = median(raceGemv);
/** The decode bound's bandwidth: the race's median weight-read rate (the start's burst figure is printed beside). */
const readGBs = raceMedianGBs;
const decodeBound = (readGBs * 1e9) / costs.bytes;
// Prefill bound: the best int8 rate the CPU issued (AMX-INT8 where present, else VNNI); without the probe,
// specd's bf16-activation GEMM rate (what a kernel reached, not the instructions' peak).
const int8Peak = rates.peak ? Math.max(rates.peak.amx_int8 ?? 0, rates.peak.vnni_int8 ?? 0) : 0;
const computeSource =
  int8Peak > 0
    ? `${(rates.peak.amx_int8 ?? 0) >= (rates.peak.vnni_int8 ?? 0) ? 'AMX-INT8' : 'AVX512-VNNI'} peak from ` +
      'registers (bench/dot-rate.c)'
    : `specd's bf16-activation GEMM at m=512 (${amx ? 'AMX-BF16' : 'AVX512-BF16'}; no int8 probe)`;
const computeGops = int8Peak > 0 ? int8Peak : rates.gemmGflops.bf16;
const computeRate = computeGops * 1e9;
const prefillBound = (P) => (P * computeRate) / costs.prefillFlops(P);
console.log(
  `\nBounds (${cpus()[0]?.model ?? '?'}, ${THREADS} threads): decode ≤ ${(costs.bytes / 1e6).toFixed(1)} MB per ` +
    `token (GGUF tensors, tied lm_head read in full) at ${readGBs.toFixed(1)} GB/s (the bf16 GEMV's weight-read ` +
    `rate probed after each prompt of the race: median of ${raceGemv.length}, range ${raceGemv[0].toFixed(1)}–` +
    `${raceGemv.at(-1).toFixed(1)}; before the race ${rates.gemvGBs.toFixed(1)}, copy ${rates.copyGBs.toFixed(1)}) = ` +
    `${decodeBound.toFixed(0)} tok/s (at the start's rate ${((rates.gemvGBs * 1e9) / costs.bytes).toFixed(0)}); ` +
    `prefill ≤ FLOPs ÷ ` +
    `${computeGops.toFixed(0)} G ops/s (${computeSource}): ` +
    PREFILL.map((P) => {
      const f = costs.prefillFlops(P);
      return (
        `${P} tokens ${(f / 1e9).toFixed(1)} GFLOP → ${prefillBound(P).toFixed(0)} tok/s (at specd's bf16 GEMM ` +
        `rate ${((P * rates.gemmGflops.bf16 * 1e9) / f).toFixed(0)})`
      );
    }).join(', '),
);

// Per-step native calls and pool costs (a child process: its counters never touch the race).
const callsJson = path.join(tmpdir(), `specd-peer-calls-${process.pid}.json`);
console.log('');
execFileSync(
  process.execPath,
  [
    path.join(ROOT, 'bench/decode-calls.mjs'),
    '--threads',
    String(THREADS),
    '--tokens',
    String(NEW),
    '--reps',
    quick ? '1' : '3',
    '--json',
    callsJson,
  ],
  { stdio: 'inherit' },
);
const calls = JSON.parse(fs.readFileSync(callsJson, 'utf8'));
fs.rmSync(callsJson, { force: true });

/** Goals of issue 16 (bench:peer's list): [goal, value text, met]. */
const goals = [];
const goal = (text, value, met) => goals.push({ text, value, met });
const lname = (k) => (k === 'native' ? 'llama.cpp native' : 'llama.cpp prebuilt');
goal(
  'plain decode ≥ 1.3× llama.cpp (the faster build)',
  `${specdTok.toFixed(1)} vs ${llamaTok.toFixed(1)} tok/s (${lname(llamaBest)}) = ×${(specdTok / llamaTok).toFixed(3)}`,
  specdTok >= 1.3 * llamaTok,
);
goal(
  'plain decode ≥ 60 % of the bandwidth bound',
  `${specdTok.toFixed(1)} of ${decodeBound.toFixed(0)} tok/s = ${((100 * specdTok) / decodeBound).toFixed(0)} %`,
  specdTok >= 0.6 * decodeBound,
);
const prefillNeed = amx ? 1 : 2;
for (const p of prefillRows)
  goal(
    `prefill ${p.P} ≥ ${prefillNeed}× llama.cpp (${amx ? 'AMX present: ≥ 1×' : 'no AMX: ≥ 2×'})`,
    `${p.tokPerS[p.specdBest].toFixed(0)} (${p.specdBest}) vs ${p.tokPerS[p.llamaBest].toFixed(0)} tok/s ` +
      `(${lname(p.llamaBest)}) = ×${p.ratio.toFixed(3)}; bound ${prefillBound(p.P).toFixed(0)} tok/s`,
    p.ratio >= prefillNeed,
  );
const specRows = rows.filter((r) => r.key.endsWith('-max') || r.key.endsWith('-cost'));
const bestSpec = specRows.reduce((b, r) => (b === undefined || r.tokPerS > b.tokPerS ? r : b), undefined);
const llamaSpecRows = rows.filter((r) => racers.find((x) => x.key === r.key)?.llamaSpec);
const bestLlamaSpec = llamaSpecRows.reduce((b, r) => (b === undefined || r.tokPerS > b.tokPerS ? r : b), undefined);
if (bestSpec === undefined) {
  goal('specd with the best drafter ≥ 2.0× llama.cpp plain decode', 'no trained SmolLM2 drafter', false);
  goal("specd with the best drafter ahead of llama.cpp's best speculative mode", 'no trained SmolLM2 drafter', false);
} else {
  goal(
    'specd with the best drafter ≥ 2.0× llama.cpp plain decode',
    `${bestSpec.label}: ${bestSpec.tokPerS.toFixed(1)} tok/s = ×${bestSpec.vsLlama.toFixed(3)}`,
    bestSpec.tokPerS >= 2 * llamaTok,
  );
  goal(
    "specd with the best drafter ahead of llama.cpp's best speculative mode",
    `${bestSpec.tokPerS.toFixed(1)} vs ${bestLlamaSpec.tokPerS.toFixed(1)} tok/s (${bestLlamaSpec.label})`,
    bestSpec.tokPerS > bestLlamaSpec.tokPerS,
  );
}
for (const d of drafters) {
  if (d.absent) {
    goal(`${d.method} ≥ 1.3× specd plain`, 'not trained yet (no SmolLM2 checkpoint)', false);
    continue;
  }
  const best = specRows
    .filter((r) => racers.find((x) => x.key === r.key)?.method === d.method)
    .reduce((b, r) => (b === undefined || r.tokPerS > b.tokPerS ? r : b), undefined);
  goal(
    `${d.method} ≥ 1.3× specd plain`,
    `${best.label}: ×${best.vsSpecd.toFixed(3)} (${best.tokPerS.toFixed(1)} tok/s)`,
    best.vsSpecd >= 1.3,
  );
}
console.log(`\n| goal (issue 16, bench:peer; ${cpus()[0]?.model ?? '?'}, ${THREADS} threads) | measured | met |`);
console.log('|---|---|---|');
for (const g of goals) console.log(`| ${g.text} | ${g.value} | ${g.met ? 'met' : 'not met'} |`);
console.log(
  `| (reported) outputs ending in a repeated 8-gram loop | ${rows.map((r) => `${r.key} ${r.loops}`).join(', ')} ` +
    `of ${prompts.length} | – |`,
);
console.log(
  `| (reported) native calls per decode step | ${calls.callsPerStep.toFixed(0)} = ` +
    `${calls.callsPerLayerPerStep.toFixed(2)} per layer; no-op call ${calls.noopUs.toFixed(2)} µs → ` +
    `${(100 * calls.noopShare).toFixed(1)} % of a ${calls.stepMs.toFixed(2)} ms step; ` +
    (THREADS > 1
      ? `pool hand-off ${calls.handoffUs.toFixed(1)} µs per split call; step at ${THREADS} vs 1 thread ` +
        `${calls.stepMs.toFixed(2)} / ${calls.step1Ms.toFixed(2)} ms; `
      : 'no pool at 1 thread; ') +
    `JavaScript ${calls.javascriptMsPerStep.toFixed(2)} ms of a profiled ` +
    `${calls.profiledWallMs.toFixed(2)} ms step | – |`,
);
const [e1, e5] = load();
console.log(`\nload at the end ${e1.toFixed(2)} / ${e5.toFixed(2)} (1/5 min)`);
if (jsonOut) {
  fs.writeFileSync(
    jsonOut,
    `${JSON.stringify({
      threads: THREADS,
      isa: info.isa,
      prompts: prompts.map((p) => p.id),
      newTokens: NEW,
      reps: REPS,
      nodeLlamaCpp: NLC_VERSION,
      llamaCppPython: native ? { version: native.info.version, systemInfo: native.info.system_info } : undefined,
      cpu: cpus()[0]?.model,
      amx,
      rates,
      bounds: {
        decodeBytes: costs.bytes,
        readGBs,
        raceGemvGBs,
        decodeTokPerS: decodeBound,
        computeGops,
        computeSource,
        prefillTokPerS: Object.fromEntries(PREFILL.map((P) => [P, prefillBound(P)])),
      },
      llamaBest,
      nativeAgree,
      goals,
      calls,
      loadStart: [l1, l5],
      loadEnd: [e1, e5],
      decode: rows,
      prefill: prefillRows,
      divergence,
      mismatches,
      lookupDiffs,
      drafters: drafters.map((d) =>
        d.absent
          ? { method: d.method, absent: true }
          : { method: d.method, maxK: d.drafter.maxDraftTokens, ceiling: d.ceiling },
      ),
    })}\n`,
  );
}

for (const d of drafters) d.drafter?.dispose();
await lctx.dispose();
await lmodel.dispose();
await llama.dispose();
native?.worker.close();
target.model.dispose();
