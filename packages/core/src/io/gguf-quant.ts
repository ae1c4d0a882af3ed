/**
 * GGUF Q8_0 quantization at load time (ggml `quantize_row_q8_0_ref`, ggml-quants.c): the weights a drafter
 * may run in 8 bits (8.5 bits a weight with the block scale) through `@specd/native` `gemmQuant`.
 */

import { f32ToF16 } from './gguf-dequant.js';

/** Weights a Q8_0 block holds, and its bytes (f16 d, then 32 × int8). */
const Q8_0_BLOCK = 32;
const Q8_0_BYTES = 34;

/**
 * Quantizes `w` `[n, k]` f32 (row-major) to GGUF Q8_0: n rows of k/32 blocks, each `f16 d · int8 qs[32]` with
 * `amax` the block's largest |w|, `d = amax / 127`, `qs[j] = roundf(w[j] / d)` (half away from zero; 0 for an
 * all-zero block), d stored as f16 — ggml's `quantize_row_q8_0_ref` in f32 arithmetic, so its bytes match ggml's
 * for the same input. Dequantized (`d·qs`), each weight is within d/2 of w plus d's f16 rounding (≤ 2⁻¹¹·amax).
 * @returns `n · (k/32) · 34` bytes, the layout `@specd/native` `quantizedWeights(data, 'q8_0', n, k)` takes.
 * @throws {RangeError} if k is not a positive multiple of 32, n is not a positive integer, `w` is not `n·k` long,
 *   or a weight is not finite (its block scale would be Inf or NaN).
 */
export function quantizeQ8_0(w: Float32Array, n: number, k: number): Uint8Array {
  if (!(Number.isSafeInteger(n) && n >= 1))
    throw new RangeError(`quantizeQ8_0: n: expected a positive integer, got ${n}`);
  if (!(Number.isSafeInteger(k) && k >= Q8_0_BLOCK && k % Q8_0_BLOCK === 0))
    throw new RangeError(`quantizeQ8_0: k: expected a positive multiple of ${Q8_0_BLOCK}, got ${k}`);
  if (w.length !== n * k) throw new RangeError(`quantizeQ8_0: w has ${w.length} values, expected n·k = ${n * k}`);
  const blocks = (n * k) / Q8_0_BLOCK;
  const out = new Uint8Array(blocks * Q8_0_BYTES);
  const view = new DataView(out.buffer);
  const f = Math.fround;
  for (let b = 0; b < blocks; b++) {
    const x0 = b * Q8_0_BLOCK;
    let amax = 0;
    for (let j = 0; j < Q8_0_BLOCK; j++) {
      const v = w[x0 + j]!;
      if (!Number.isFinite(v))
        throw new RangeError(`quantizeQ8_0: w[${x0 + j}] (row ${Math.floor((x0 + j) / k)}) is ${v}, not finite`);
      amax = Math.max(amax, Math.abs(v));
    }
    const d = f(amax / 127);
    const id = d !== 0 ? f(1 / d) : 0;
    const o = b * Q8_0_BYTES;
    view.setUint16(o, f32ToF16(d), true);
    for (let j = 0; j < Q8_0_BLOCK; j++) {
      const x = f(w[x0 + j]! * id);
      // roundf: half away from zero (|x| ≤ 127 here, exact in double)
      const q = x < 0 ? -Math.floor(-x + 0.5) : Math.floor(x + 0.5);
      view.setInt8(o + 2 + j, q);
    }
  }
  return out;
}
