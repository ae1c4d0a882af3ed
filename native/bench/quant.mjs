#!/usr/bin/env node
// Quantized GEMM bench: GGUF Q4_1 / Q8_0 weights dequantized on the fly (gemmQuant) vs the same
// weights dequantized once at load to bf16 and run through gemmBf16 (packBf16Weights of
// dequantizeToBf16), fp32 activations both.
//
//   npm run bench:quant                 (root; builds nothing: run `npm run build` first)
//   node native/bench/quant.mjs --quick (fewer repetitions, no 8192 x 8192 shape)
//   node native/bench/quant.mjs --act   (only the int8- vs fp32-activation table and the model section)
//   node native/bench/quant.mjs --no-model (without the SmolLM2 end-to-end section)
//   node native/bench/quant.mjs --model-only (only the SmolLM2 end-to-end section)
//
// Shapes: the SmolLM2-135M linear layers (hidden 576, intermediate 1536, q/o 576x576, k/v
// 192x576, gate/up 1536x576, down 576x1536; Q4_1) and its tied lm_head 49152x576 (Q8_0), plus a
// large synthetic 8192x8192 Q4_1. Per-layer shapes are timed as a pass over 30 distinct copies (the
// 30 layers of the model), so weights come from memory/L3 as in a real decode, not from L2.
// Reported per m in {1, 2, 4, 8, 16}: time per call (µs, minimum of the repetitions), GB/s of
// weight bytes moved (packed Q bytes or bf16 bytes / time) and GFLOP/s (2·m·n·k / time).
// Then gemmQuant with fp32 vs int8 activations (act 'f32' / 'int8') at m = 1, 8, 16, 512 with
// t(16)/t(1), and SmolLM2-135M-Instruct Q4_1 end to end both ways (prefill 512, decode, verify 16).
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import {
  argmax,
  dequantizeToBf16,
  gemmBf16,
  gemmQuant,
  isa,
  packBf16Weights,
  parallelCopy,
  quantizedWeights,
  quantRawBytes,
} from '@specd/native';
import { median } from '../../bench/stats.mjs';

const quick = process.argv.includes('--quick');
const actOnly = process.argv.includes('--act'); // only the int8-vs-f32 activation table (and the model)
const noModel = process.argv.includes('--no-model'); // skip the SmolLM2 end-to-end comparison
const modelOnly = process.argv.includes('--model-only'); // only the SmolLM2 end-to-end comparison
const reps = quick ? 3 : 7;
const MS = [1, 2, 4, 8, 16];

function minTimeMs(fn) {
  fn(); // warm-up
  let best = Infinity;
  for (let r = 0; r < reps; r++) {
    const t0 = process.hrtime.bigint();
    fn();
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e6);
  }
  return best;
}

/** Random raw GGUF tensor: random quants, d ~ 2^-8 (f16 0x1c00..0x1fff), m = -8·d-ish (negative). */
function randomRaw(type, n, k, seed) {
  const bytes = new Uint8Array(quantRawBytes(type, n, k));
  const words = new Uint32Array(bytes.buffer, 0, bytes.length >> 2);
  let s = seed >>> 0;
  for (let i = 0; i < words.length; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    words[i] = s;
  }
  const bb = type === 'q4_0' ? 18 : type === 'q4_1' ? 20 : 34;
  const view = new DataView(bytes.buffer);
  for (let off = 0; off < bytes.length; off += bb) {
    view.setUint16(off, 0x1c00 | (bytes[off] & 0x3ff), true);
    if (type === 'q4_1') view.setUint16(off + 2, 0xa000 | (bytes[off + 2] & 0x3ff), true);
  }
  return bytes;
}

const info = isa();
const src = new Float32Array(16 << 20).fill(1);
const dst = new Float32Array(16 << 20);
const copyMs = minTimeMs(() => parallelCopy(dst, src));
const copyGBs = (2 * src.length * 4) / copyMs / 1e6;
console.log(
  `# specd quant bench — isa ${info.isa}, threads ${info.threads}, ` +
    `node ${process.version}, copy bandwidth ${copyGBs.toFixed(1)} GB/s`,
);

const shapes = [
  { name: 'q/o 576×576', type: 'q4_1', n: 576, k: 576, copies: 30 },
  { name: 'k/v 192×576', type: 'q4_1', n: 192, k: 576, copies: 30 },
  { name: 'gate/up 1536×576', type: 'q4_1', n: 1536, k: 576, copies: 30 },
  { name: 'down 576×1536', type: 'q4_1', n: 576, k: 1536, copies: 30 },
  { name: 'lm_head 49152×576', type: 'q8_0', n: 49152, k: 576, copies: 1 },
  ...(quick ? [] : [{ name: 'synthetic 8192×8192', type: 'q4_1', n: 8192, k: 8192, copies: 1 }]),
];

const lines = [
  '| shape | type | m | Q t (µs) | Q GB/s | Q GFLOP/s | bf16 t (µs) | bf16 GB/s | bf16 GFLOP/s | faster |',
  '|---|---|---:|---:|---:|---:|---:|---:|---:|---|',
];
for (const { name, type, n, k, copies } of actOnly || modelOnly ? [] : shapes) {
  const qs = [];
  const bs = [];
  for (let c = 0; c < copies; c++) {
    const w = quantizedWeights(randomRaw(type, n, k, 17 + c), type, n, k);
    qs.push(w);
    bs.push(packBf16Weights(dequantizeToBf16(w), n, k));
  }
  const qBytes = qs[0].data.length;
  const bBytes = n * k * 2;
  const x = new Float32Array(16 * k).map((_, i) => ((i * 7919) % 1000) / 1000 - 0.5);
  const y = new Float32Array(16 * n);
  for (const m of MS) {
    const xs = x.subarray(0, m * k);
    const ys = y.subarray(0, m * n);
    const tq =
      minTimeMs(() => {
        for (const w of qs) gemmQuant(xs, m, w, ys);
      }) / copies;
    const tb =
      minTimeMs(() => {
        for (const w of bs) gemmBf16(xs, m, w, ys);
      }) / copies;
    const flop = 2 * m * n * k;
    lines.push(
      `| ${name} | ${type.toUpperCase()} | ${m} | ${(tq * 1000).toFixed(1)} | ${(qBytes / tq / 1e6).toFixed(1)} | ` +
        `${(flop / tq / 1e6).toFixed(0)} | ${(tb * 1000).toFixed(1)} | ${(bBytes / tb / 1e6).toFixed(1)} | ` +
        `${(flop / tb / 1e6).toFixed(0)} | ` +
        `${tq < tb ? `${type.toUpperCase()} ×${(tb / tq).toFixed(2)}` : `bf16 ×${(tq / tb).toFixed(2)}`} |`,
    );
    console.error(lines[lines.length - 1]);
  }
}
if (!actOnly && !modelOnly) console.log(lines.join('\n'));

// ---- int8 vs fp32 activations (gemmQuant act 'int8' / 'f32'), same weights ----
// Per shape and m in {1, 8, 16, 512}: time per call, GB/s of packed weight bytes, GFLOP/s
// (2·m·n·k / time, int8 MACs counted as FLOPs), and the verify-cost ratio t(16)/t(1) per mode,
// alternating the two modes inside each repetition. Goal (issue 16): t(16)/t(1) of int8 close to 1
// (a 16-token verify costs about one decode step) and prefill (m = 512) much faster than fp32.
const ACT_MS = [1, 8, 16, 512];
const actLines = [
  '| shape | type | m | f32 t (µs) | f32 GB/s | f32 GFLOP/s | int8 t (µs) | int8 GB/s | int8 GFLOP/s ' +
    '| int8 speed-up |',
  '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|',
];
const ratios = [];
for (const { name, type, n, k, copies } of modelOnly ? [] : shapes) {
  const qs = [];
  for (let c = 0; c < copies; c++) qs.push(quantizedWeights(randomRaw(type, n, k, 17 + c), type, n, k));
  const qBytes = qs[0].data.length;
  const x = new Float32Array(512 * k).map((_, i) => ((i * 7919) % 1000) / 1000 - 0.5);
  const y = new Float32Array(512 * n);
  const t = {};
  for (const m of ACT_MS) {
    const xs = x.subarray(0, m * k);
    const ys = y.subarray(0, m * n);
    // m = 512 is compute-bound: a few copies are enough (and keep the bench short).
    const ws = m >= 64 ? qs.slice(0, Math.min(qs.length, 3)) : qs;
    const run = (act) => () => {
      for (const w of ws) gemmQuant(xs, m, w, ys, act);
    };
    const best = { f32: Infinity, int8: Infinity };
    run('f32')();
    run('int8')();
    for (let r = 0; r < (m >= 64 ? Math.min(reps, 3) : reps); r++)
      for (const act of r % 2 === 0 ? ['f32', 'int8'] : ['int8', 'f32']) {
        const t0 = process.hrtime.bigint();
        run(act)();
        best[act] = Math.min(best[act], Number(process.hrtime.bigint() - t0) / 1e6 / ws.length);
      }
    t[m] = best;
    const flop = 2 * m * n * k;
    const f = (ms) => `${(ms * 1000).toFixed(1)} | ${(qBytes / ms / 1e6).toFixed(1)} | ${(flop / ms / 1e6).toFixed(0)}`;
    actLines.push(
      `| ${name} | ${type.toUpperCase()} | ${m} | ${f(best.f32)} | ${f(best.int8)} | ` +
        `×${(best.f32 / best.int8).toFixed(2)} |`,
    );
    console.error(actLines[actLines.length - 1]);
  }
  ratios.push({ name, f32: t[16].f32 / t[1].f32, int8: t[16].int8 / t[1].int8 });
}
if (!modelOnly) {
  console.log(`\n${actLines.join('\n')}\n`);
  console.log('| shape | t(16)/t(1) f32 | t(16)/t(1) int8 |\n|---|---:|---:|');
  for (const r of ratios) console.log(`| ${r.name} | ${r.f32.toFixed(2)} | ${r.int8.toFixed(2)} |`);
  const worst = Math.max(...ratios.map((r) => r.int8));
  console.log(
    `\ngoal (issue 16): int8 t(16)/t(1) close to 1 on every shape — worst ${worst.toFixed(2)} ` +
      `(${worst <= 1.5 ? 'met at ≤ 1.5' : 'not met at ≤ 1.5'})`,
  );
}

// ---- SmolLM2-135M-Instruct Q4_1 end to end, f32 vs int8 activations (SPECD_GGUF_ACT) ----
// Two copies of the model (ggufSource act 'f32' / 'int8'), timed alternately: prefill of 512 tokens
// (one forward, logits of the last), a decode step at that context (median of the steps), and a
// 16-token verify forward (logits of all 16) against that step: t_verify(16)/t_step.
const GGUF = path.resolve(
  path.dirname(fileURLToPath(import.meta.url)),
  '../../models/smollm2-135m-instruct',
  'SmolLM2-135M-Instruct.Q4_1.gguf',
);
if (!noModel && fs.existsSync(GGUF)) {
  const { GgufFile, SequenceCache } = await import('@specd/core');
  const { ggufSource, loadLlamaStage, parseGgufLlamaConfig } = await import('@specd/model-llama');
  const models = {};
  for (const act of ['f32', 'int8']) {
    const file = GgufFile.open(GGUF);
    models[act] = loadLlamaStage(parseGgufLlamaConfig(file), ggufSource(file, 'quant', undefined, undefined, act));
  }
  const V = models.f32.info.vocabSize;
  const prompt = Int32Array.from({ length: 512 }, (_, i) => 1 + ((i * 7919) % (V - 1)));
  const steps = quick ? 8 : 24;
  const res = { f32: { prefill: [], step: [], verify: [] }, int8: { prefill: [], step: [], verify: [] } };
  const now = () => Number(process.hrtime.bigint()) / 1e6;
  for (let rep = 0; rep < (quick ? 2 : 4); rep++)
    for (const act of rep % 2 === 0 ? ['f32', 'int8'] : ['int8', 'f32']) {
      const model = models[act];
      const cache = new SequenceCache(model.cacheGeometry, { pageSize: 16, numPages: 80, numSlots: 1 });
      cache.add('s');
      let t0 = now();
      let logits = model.forward(
        { sequences: [{ id: 's', position: 0, tokens: prompt, logits: 'last' }] },
        cache,
      ).logits;
      res[act].prefill.push(now() - t0);
      let pos = prompt.length;
      for (let i = 0; i < steps; i++) {
        const tok = argmax(logits, V)[0];
        t0 = now();
        logits = model.forward(
          { sequences: [{ id: 's', position: pos, tokens: Int32Array.of(tok), logits: 'last' }] },
          cache,
        ).logits;
        res[act].step.push(now() - t0);
        pos += 1;
        const cp = cache.checkpoint('s');
        t0 = now();
        model.forward(
          { sequences: [{ id: 's', position: pos, tokens: prompt.subarray(0, 16), logits: 'all' }] },
          cache,
        );
        res[act].verify.push(now() - t0);
        cache.rollback('s', cp);
      }
      cache.finish('s');
    }
  console.log(
    '\n| SmolLM2-135M Q4_1 | prefill 512 (ms) | prefill tok/s | decode step (ms) | decode tok/s | ' +
      't_verify(16)/t_step |\n|---|---:|---:|---:|---:|---:|',
  );
  const row = {};
  for (const act of ['f32', 'int8']) {
    const p = Math.min(...res[act].prefill);
    const st = median(res[act].step);
    const v = median(res[act].verify);
    row[act] = { p, st };
    console.log(
      `| act ${act} | ${p.toFixed(1)} | ${((512 / p) * 1000).toFixed(0)} | ${st.toFixed(2)} | ` +
        `${(1000 / st).toFixed(1)} | ${(v / st).toFixed(2)} |`,
    );
  }
  console.log(
    `\nint8 vs f32: prefill ×${(row.f32.p / row.int8.p).toFixed(2)}, decode ×${(row.f32.st / row.int8.st).toFixed(2)}`,
  );
  for (const m of Object.values(models)) m.dispose();
}
