#!/usr/bin/env node
// A/B of two builds of the quantized GEMM in ONE process, on SmolLM2-135M-Instruct Q4_1 plain decode: the
// addon this checkout built (`new`) and another build of it (`--base FILE.node`, e.g. one built from main),
// whose `gemmQuant` replaces this addon's for the `base` variants (same packed layout, same arguments).
// Variants, alternated step by step so load changes hit them all alike:
//   base-f32, new-f32 (activations fp32, the default), base-int8, new-int8 (act 'int8', SPECD_GGUF_ACT=int8),
//   new-int16 (act 'int16', SPECD_GGUF_ACT=int16; the base build is not asked for it).
//
//   node bench/quant-ab.mjs --base /path/to/specd_native.node [--threads 2] [--steps 64] [--context 64]
//   node bench/quant-ab.mjs            (no --base: only the new-* variants)
//
// Per variant: the median decode step (one token, logits of the last; wall ms and the process CPU ms),
// tok/s, and the ratio to new-f32. The prompt is `--context` synthetic tokens; each round decodes one token
// per variant at the same position (the KV cache of each variant rolled back), `--steps` rounds; with
// `--verify N` (default 16, 0: off) each round also runs an N-token forward (a verify block, logits of all N).
// `--kernels` first times the raw gemmQuant calls of the decode/verify shapes (q/k/v fused 960×576, o 576×576,
// gate/up fused 3072×576, down 576×1536 Q4_1; lm_head 49152×576 Q8_0) at m = `--ms` (default 1, 2, 4, 8, 16),
// each over enough distinct random copies to exceed 96 MiB (so the weights stream from DRAM, as in a decode step),
// variants alternated per repetition, minimum of `--reps` (default 5): µs per call, weight GB/s, base ÷ new per
// act, each act ÷ f32; then per m a forward's GEMMs (30 layers of the four Q4_1 shapes + the lm_head), and whether
// the base build's outputs equal the new one's bit for bit. `--kernels-only`: that table alone (no GGUF needed);
// `--acts LIST` (default f32,int8,int16) picks the kernel table's activations (with --base, base-int16 too).
// The addon's SPECD_QUANT_AMX* switches (native/src/quant.cc) apply to both builds alike.
import * as fs from 'node:fs';
import { createRequire } from 'node:module';
import { cpus, loadavg } from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { addonPath, argmax, isa, quantizedWeights, quantRawBytes, setNumThreads } from '@specd/native';
import { median } from './stats.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const THREADS = Number(arg('threads', '2'));
const STEPS = Number(arg('steps', '64'));
const CONTEXT = Number(arg('context', '64'));
const basePath = arg('base', undefined);
const VERIFY = Number(arg('verify', '16'));
const actOf = (v) => v.slice(v.indexOf('-') + 1);
const VARIANTS = [
  ...(basePath ? ['base-f32'] : []),
  'new-f32',
  ...(basePath ? ['base-int8'] : []),
  'new-int8',
  'new-int16',
];
const KERNELS_ONLY = argv.includes('--kernels-only');
const GGUF = path.join(ROOT, 'models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf');
if (!KERNELS_ONLY && !fs.existsSync(GGUF))
  throw new Error(`quant-ab: ${GGUF} is missing: run \`npm run models:fetch\``);

const require = createRequire(import.meta.url);
const raw = require(addonPath); // the same module object @specd/native calls
const newGemm = raw.gemmQuant;
const base = basePath === undefined ? undefined : require(path.resolve(basePath));
setNumThreads(THREADS);
base?.setNumThreads(THREADS);

const header = () =>
  `${cpus().length} vCPUs (${cpus()[0]?.model.trim()}); isa ${isa().isa}; threads ${THREADS}; load ${loadavg()
    .slice(0, 2)
    .map((l) => l.toFixed(2))
    .join(' / ')}${basePath ? `; base ${basePath}` : ''}`;

if (argv.includes('--kernels') || KERNELS_ONLY) {
  const REPS = Number(arg('reps', '5'));
  const MS = arg('ms', '1,2,4,8,16').split(',').map(Number);
  const KACTS = arg('acts', 'f32,int8,int16').split(',');
  /** Random raw GGUF blocks (as native/bench/quant.mjs): random quants, d ~ 2^-8, Q4_1 m < 0. */
  const randomRaw = (type, n, k, seed) => {
    const bytes = new Uint8Array(quantRawBytes(type, n, k));
    let st = seed >>> 0;
    for (let i = 0; i < bytes.length; i++) {
      st = (Math.imul(st, 1664525) + 1013904223) >>> 0;
      bytes[i] = st >>> 24;
    }
    const bb = type === 'q4_1' ? 20 : 34;
    const view = new DataView(bytes.buffer);
    for (let off = 0; off < bytes.length; off += bb) {
      view.setUint16(off, 0x1c00 | (bytes[off] & 0x3ff), true);
      if (type === 'q4_1') view.setUint16(off + 2, 0xa000 | (bytes[off + 2] & 0x3ff), true);
    }
    return bytes;
  };
  // [name, type, n, k, calls in a forward]
  const shapes = [
    ['q/k/v 960×576', 'q4_1', 960, 576, 30],
    ['o 576×576', 'q4_1', 576, 576, 30],
    ['gate/up 3072×576', 'q4_1', 3072, 576, 30],
    ['down 576×1536', 'q4_1', 576, 1536, 30],
    ['lm_head 49152×576', 'q8_0', 49152, 576, 1],
  ];
  const kv = KACTS.flatMap((a) => [...(base ? [`base-${a}`] : []), `new-${a}`]);
  const ratios = [
    ...(base ? KACTS.map((a) => [`base-${a}`, `new-${a}`, `base÷new ${a}`]) : []),
    ...(KACTS.includes('f32') ? KACTS.filter((a) => a !== 'f32').map((a) => ['new-f32', `new-${a}`, `f32÷${a}`]) : []),
  ];
  console.log(`quant-ab --kernels — gemmQuant per call, weights streamed from DRAM; ${header()}`);
  console.log(
    `| shape | m | ${kv.map((v) => `${v} µs (GB/s)`).join(' | ')} |${ratios.map((r) => ` ${r[2]} |`).join('')}`,
  );
  console.log(`|---|---:|${kv.map(() => '---:|').join('')}${ratios.map(() => '---:|').join('')}`);
  const forward = Object.fromEntries(MS.map((m) => [m, Object.fromEntries(kv.map((v) => [v, 0]))]));
  let differ = 0;
  for (const [name, type, n, k, calls] of shapes) {
    const one = quantizedWeights(randomRaw(type, n, k, 17), type, n, k);
    const copies = Math.ceil((96 << 20) / one.data.length);
    const ws = [one];
    for (let c = 1; c < copies; c++) ws.push(quantizedWeights(randomRaw(type, n, k, 17 + c), type, n, k));
    const mMax = Math.max(...MS);
    const x = new Float32Array(mMax * k).map((_, i) => ((i * 7919) % 1000) / 1000 - 0.5);
    const ys = Object.fromEntries(kv.map((v) => [v, new Float32Array(mMax * n)]));
    for (const m of MS) {
      const xs = x.subarray(0, m * k);
      const best = Object.fromEntries(kv.map((v) => [v, Infinity]));
      for (let r = 0; r <= REPS; r++)
        for (const v of r % 2 === 0 ? kv : [...kv].reverse()) {
          const g = v.startsWith('base') ? base.gemmQuant : newGemm;
          const act = actOf(v);
          const y = ys[v].subarray(0, m * n);
          const t0 = process.hrtime.bigint();
          for (const w of ws) g(xs, m, k, w.data, type, n, y, act);
          const t = Number(process.hrtime.bigint() - t0) / 1e3 / ws.length;
          if (r > 0) best[v] = Math.min(best[v], t); // r = 0: warm-up
        }
      for (const v of kv) forward[m][v] += best[v] * calls;
      if (base)
        for (const a of KACTS) {
          const b = new Uint32Array(ys[`base-${a}`].buffer, 0, m * n);
          const c = new Uint32Array(ys[`new-${a}`].buffer, 0, m * n);
          if (b.some((bits, i) => bits !== c[i])) differ++;
        }
      const cell = (v) => `${best[v].toFixed(1)} (${(one.data.length / best[v] / 1e3).toFixed(1)})`;
      console.log(
        `| ${name} ${type.toUpperCase()} | ${m} | ${kv.map(cell).join(' | ')} |` +
          ratios.map(([a, b]) => ` ×${(best[a] / best[b]).toFixed(2)} |`).join(''),
      );
    }
  }
  for (const m of MS)
    console.log(
      `| a forward's GEMMs | ${m} | ${kv.map((v) => `${(forward[m][v] / 1e3).toFixed(2)} ms`).join(' | ')} |` +
        ratios.map(([a, b]) => ` ×${(forward[m][a] / forward[m][b]).toFixed(2)} |`).join(''),
    );
  if (base) console.log(`base and new outputs: ${differ === 0 ? 'equal bit for bit' : `${differ} calls differ`}`);
  console.log('');
  if (KERNELS_ONLY) process.exit(0);
}

const { GgufFile, SequenceCache } = await import('@specd/core');
const { ggufSource, loadLlamaStage, parseGgufLlamaConfig } = await import('@specd/model-llama');
const ACTS = ['f32', 'int8', 'int16'];
const models = {};
for (const act of ACTS) {
  const file = GgufFile.open(GGUF);
  models[act] = loadLlamaStage(parseGgufLlamaConfig(file), ggufSource(file, 'quant', undefined, undefined, act));
}
const variants = VARIANTS;
const V = models.f32.info.vocabSize;
const prompt = Int32Array.from({ length: CONTEXT }, (_, i) => 1 + ((i * 7919) % (V - 1)));
const caches = {};
const next = {};
for (const act of ACTS) {
  const cache = new SequenceCache(models[act].cacheGeometry, {
    pageSize: 16,
    numPages: Math.ceil((CONTEXT + Math.max(2, VERIFY)) / 16) + 1,
    numSlots: 1,
  });
  cache.add('s');
  const logits = models[act].forward(
    { sequences: [{ id: 's', position: 0, tokens: prompt, logits: 'last' }] },
    cache,
  ).logits;
  caches[act] = cache;
  next[act] = argmax(logits, V)[0];
}
const res = Object.fromEntries(variants.map((v) => [v, { wall: [], cpu: [], verify: [] }]));
const block = Int32Array.from({ length: VERIFY }, (_, i) => 1 + ((i * 104729) % (V - 1)));
for (let s = 0; s < STEPS + 2; s++) {
  const order = s % 2 === 0 ? variants : [...variants].reverse();
  for (const v of order) {
    const act = actOf(v);
    raw.gemmQuant = v.startsWith('base') ? base.gemmQuant : newGemm;
    const cache = caches[act];
    const cp = cache.checkpoint('s');
    const c0 = process.cpuUsage();
    const t0 = process.hrtime.bigint();
    models[act].forward(
      { sequences: [{ id: 's', position: CONTEXT, tokens: Int32Array.of(next[act]), logits: 'last' }] },
      cache,
    );
    const wall = Number(process.hrtime.bigint() - t0) / 1e6;
    const c = process.cpuUsage(c0);
    cache.rollback('s', cp);
    if (s >= 2) {
      res[v].wall.push(wall);
      res[v].cpu.push((c.user + c.system) / 1000);
    }
    if (VERIFY > 0) {
      const t1 = process.hrtime.bigint();
      models[act].forward({ sequences: [{ id: 's', position: CONTEXT, tokens: block, logits: 'all' }] }, cache);
      const verify = Number(process.hrtime.bigint() - t1) / 1e6;
      cache.rollback('s', cp);
      if (s >= 2) res[v].verify.push(verify);
    }
  }
}
raw.gemmQuant = newGemm;
console.log(
  `quant-ab — SmolLM2-135M-Instruct Q4_1 plain decode, context ${CONTEXT}, ${STEPS} steps per variant ` +
    `(alternated); ${header()}`,
);
const vh = VERIFY > 0 ? ` verify ${VERIFY} (ms, median) | verify ÷ new-f32 | verify ÷ step |` : '';
console.log(
  `| variant | step (ms, median) | tok/s | CPU ms per step | step ÷ new-f32 |${vh}\n` +
    `|---|---:|---:|---:|---:|${VERIFY > 0 ? '---:|---:|---:|' : ''}`,
);
const ref = median(res['new-f32'].wall);
const vref = VERIFY > 0 ? median(res['new-f32'].verify) : 0;
for (const v of variants) {
  const w = median(res[v].wall);
  const cpu = median(res[v].cpu);
  const vt = VERIFY > 0 ? median(res[v].verify) : 0;
  const vc = VERIFY > 0 ? ` ${vt.toFixed(2)} | ${(vt / vref).toFixed(2)} | ${(vt / w).toFixed(2)} |` : '';
  console.log(
    `| ${v} | ${w.toFixed(2)} | ${(1000 / w).toFixed(1)} | ${cpu.toFixed(2)} | ${(w / ref).toFixed(2)} |${vc}`,
  );
}
for (const m of Object.values(models)) m.dispose();
