// The CUDA kernels of @specd/native-cuda against CPU references, on the GPU machine only (`npm run test:gpu`, which
// builds the addon first; `node --test`, never vitest): device info; bf16 conversion; the bf16 GEMM (cuBLASLt, fp32
// accumulation) within fp32-sum tolerance of an fp64 reference over the same bf16 inputs, and row-invariant — every
// row of an m ≤ 16 GEMM equals, bit for bit, the GEMM of that row alone (the plan is made for 16 rows, the padding
// zeros); RMSNorm, SwiGLU (tolerance), embedding and argmax (exact, ties to the lowest index); refusals of a buffer
// too small or freed. Without a GPU or the addon every case is skipped with loadCuda()'s message.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { loadCuda } from '../index.js';
import { bf16Bits, bf16Value, prng, randomBf16 } from './reference.mjs';

let cuda;
let why;
try {
  cuda = loadCuda();
  console.log(
    `device: ${cuda.info.name}, sm ${cuda.info.computeCapability}, ${(cuda.info.totalBytes / 2 ** 30).toFixed(1)} GiB`,
  );
} catch (err) {
  why = err.message;
  console.log(`GPU tests skipped: ${why}`);
}
const gpu = { skip: why };

const f32Buf = (a) => {
  const b = cuda.alloc(a.byteLength);
  cuda.upload(b, a);
  return b;
};
const readF32 = (b, n) => {
  const out = new Float32Array(n);
  cuda.download(b, out);
  return out;
};

test('toBf16 rounds to nearest even like the CPU', gpu, () => {
  const next = prng(1);
  const x = Float32Array.from({ length: 4097 }, () => (next() * 2 - 1) * 100);
  x[0] = 1.00390625; // a tie: 1 + 2^-8 → 1 (even)
  x[1] = 1.01171875; // 1 + 3 · 2^-8 → 1 + 2^-6 (even)
  const out = cuda.alloc(x.length * 2);
  cuda.toBf16(out, f32Buf(x), x.length);
  const got = new Uint16Array(x.length);
  cuda.download(out, got);
  for (let i = 0; i < x.length; i++) assert.equal(got[i], bf16Bits(x[i]), `element ${i}`);
});

/** The GEMM of `m` rows of x (bf16) against w on the device, planned for `mPad` rows. */
function gemm(xRows, m, mPad, wBuf, n, k) {
  const x = new Float32Array(mPad * k);
  x.set(xRows.subarray(0, m * k));
  const xb = cuda.alloc(mPad * k * 2);
  cuda.toBf16(xb, f32Buf(x), mPad * k);
  const out = cuda.alloc(mPad * n * 4);
  cuda.gemmBf16(out, xb, wBuf, m, mPad, n, k);
  return readF32(out, mPad * n).subarray(0, m * n);
}

test('gemmBf16: fp32-accumulated bf16 GEMM within tolerance of fp64, and row-invariant for m ≤ 16', gpu, () => {
  const next = prng(7);
  const [n, k] = [768, 1024];
  const w = randomBf16(n * k, next, 0.05);
  const wBuf = cuda.alloc(n * k * 2);
  cuda.upload(wBuf, w.bits);
  const x = Float32Array.from({ length: 16 * k }, () => next() * 2 - 1);
  const y16 = gemm(x, 16, 16, wBuf, n, k);
  let worst = 0;
  for (let r = 0; r < 16; r++)
    for (let j = 0; j < n; j++) {
      let s = 0;
      let mag = 0;
      for (let c = 0; c < k; c++) {
        const t = bf16Value(bf16Bits(x[r * k + c])) * w.values[j * k + c];
        s += t;
        mag += Math.abs(t);
      }
      const err = Math.abs(y16[r * n + j] - s) / mag;
      worst = Math.max(worst, err);
    }
  console.log(`gemmBf16 ${n}×${k}: worst |error| / Σ|terms| = ${worst.toExponential(2)}`);
  assert.ok(worst < 1e-5, `worst relative error ${worst}`);
  // row invariance: every m ≤ 16 gives the same rows; each row alone gives the same bits
  for (const m of [1, 2, 3, 7, 8, 15]) {
    const ym = gemm(x, m, 16, wBuf, n, k);
    assert.deepEqual(ym, y16.subarray(0, m * n), `m = ${m}`);
  }
  for (let r = 0; r < 16; r++) {
    const alone = gemm(x.subarray(r * k, (r + 1) * k), 1, 16, wBuf, n, k);
    assert.deepEqual(alone, y16.subarray(r * n, (r + 1) * n), `row ${r} alone`);
  }
});

test('rmsNorm, swiglu and embed against the CPU', gpu, () => {
  const next = prng(3);
  const [rows, cols] = [5, 2048];
  const x = Float32Array.from({ length: rows * cols }, () => (next() * 2 - 1) * 3);
  const w = randomBf16(cols, next, 2);
  const wBuf = cuda.alloc(cols * 2);
  cuda.upload(wBuf, w.bits);
  const out = cuda.alloc(rows * cols * 4);
  cuda.rmsNorm(out, f32Buf(x), wBuf, rows, cols, 1e-5);
  const y = readF32(out, rows * cols);
  for (let r = 0; r < rows; r++) {
    let ss = 0;
    for (let c = 0; c < cols; c++) ss += x[r * cols + c] ** 2;
    const inv = 1 / Math.sqrt(ss / cols + 1e-5);
    for (let c = 0; c < cols; c++) {
      const want = x[r * cols + c] * inv * w.values[c];
      assert.ok(Math.abs(y[r * cols + c] - want) <= 1e-5 * (1 + Math.abs(want)), `rmsNorm [${r}, ${c}]`);
    }
  }
  const inter = 1536;
  const gu = Float32Array.from({ length: rows * 2 * inter }, () => (next() * 2 - 1) * 6);
  const s = cuda.alloc(rows * inter * 4);
  cuda.swiglu(s, f32Buf(gu), rows, inter);
  const sy = readF32(s, rows * inter);
  for (let r = 0; r < rows; r++)
    for (let j = 0; j < inter; j++) {
      const g = gu[r * 2 * inter + j];
      const want = (g / (1 + Math.exp(-g))) * gu[r * 2 * inter + inter + j];
      assert.ok(Math.abs(sy[r * inter + j] - want) <= 1e-5 * (1 + Math.abs(want)), `swiglu [${r}, ${j}]`);
    }
  const [vocab, hidden] = [1000, 576];
  const table = randomBf16(vocab * hidden, next);
  const tBuf = cuda.alloc(vocab * hidden * 2);
  cuda.upload(tBuf, table.bits);
  const ids = Int32Array.from([0, 999, 17, 17, 500]);
  const e = cuda.alloc(ids.length * hidden * 4);
  cuda.embed(e, tBuf, f32Buf(ids), ids.length, hidden, vocab);
  const ey = readF32(e, ids.length * hidden);
  for (const [r, id] of ids.entries())
    for (let c = 0; c < hidden; c++) assert.equal(ey[r * hidden + c], table.values[id * hidden + c]);
});

test('argmax: exact, ties to the lowest index', gpu, () => {
  const next = prng(11);
  const [rows, cols] = [4, 49152];
  const x = Float32Array.from({ length: rows * cols }, () => next());
  x[1 * cols + 40000] = 5;
  x[1 * cols + 30000] = 5; // tie: 30000 wins
  x[2 * cols + cols - 1] = 7;
  x.fill(-1, 3 * cols, 4 * cols); // all equal: 0
  const out = cuda.alloc(rows * 4);
  cuda.argmax(out, f32Buf(x), rows, cols);
  const got = new Int32Array(rows);
  cuda.download(out, got);
  const want = [];
  for (let r = 0; r < rows; r++) {
    let b = 0;
    for (let c = 1; c < cols; c++) if (x[r * cols + c] > x[r * cols + b]) b = c;
    want.push(b);
  }
  assert.deepEqual([...got], want);
  assert.equal(got[1], 30000);
});

test('refuses a buffer too small or freed, naming it', gpu, () => {
  const small = cuda.alloc(16);
  const x = cuda.alloc(64);
  assert.throws(() => cuda.rmsNorm(small, x, x, 1, 16, 1e-5), {
    name: 'RangeError',
    message: /out: 16 bytes, needs 64/,
  });
  cuda.free(small);
  assert.throws(() => cuda.download(small, new Float32Array(1)), /buffer: the device buffer was freed/);
  assert.throws(() => cuda.alloc(0), { name: 'RangeError', message: /bytes/ });
});
