#!/usr/bin/env node
// Quantized GEMM bench: GGUF Q4_1 / Q8_0 weights dequantized on the fly (gemmQuant) vs the same
// weights dequantized once at load to bf16 and run through gemmBf16 (packBf16Weights of
// dequantizeToBf16), fp32 activations both.
//
//   npm run bench:quant                 (root; builds nothing: run `npm run build` first)
//   node native/bench/quant.mjs --quick (fewer repetitions, no 8192 x 8192 shape)
//
// Shapes: the SmolLM2-135M linear layers (hidden 576, intermediate 1536, q/o 576x576, k/v
// 192x576, gate/up 1536x576, down 576x1536; Q4_1) and its tied lm_head 49152x576 (Q8_0), plus a
// large synthetic 8192x8192 Q4_1. Per-layer shapes are timed as a pass over 30 distinct copies (the
// 30 layers of the model), so weights come from memory/L3 as in a real decode, not from L2.
// Reported per m in {1, 2, 4, 8, 16}: time per call (µs, minimum of the repetitions), GB/s of
// weight bytes moved (packed Q bytes or bf16 bytes / time) and GFLOP/s (2·m·n·k / time).
import {
  dequantizeToBf16,
  gemmBf16,
  gemmQuant,
  isa,
  packBf16Weights,
  parallelCopy,
  quantizedWeights,
  quantRawBytes,
} from '@specd/native';

const quick = process.argv.includes('--quick');
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
for (const { name, type, n, k, copies } of shapes) {
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
console.log(lines.join('\n'));
