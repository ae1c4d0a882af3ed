/**
 * Linear layers with bf16 weights: `Y[m, n] = X[m, k] · W[n, k]ᵀ`, X and Y f32, accumulation f32.
 *
 * Weights are packed once at load (`packBf16Weights`) into 16-column panels of K-pairs (layout in
 * native/src/gemm_kernels.h), so one 64-byte line feeds 16 output columns and a GEMV streams the
 * weights sequentially. Batch invariance: row i of a GEMM is bit-identical to the GEMV of row i,
 * for every m, every thread count, on a given ISA path (each output is one fp32 accumulator over
 * k = 0..k-1 in order; threads split N, never K).
 *
 * Activations: `'f32'` (default; the project rule "bf16 weights, fp32 activations and
 * accumulation") keeps X in fp32 and runs fp32 FMA on weights widened from bf16. `'bf16'` (opt-in)
 * rounds X to bf16 first and, on the avx512 path of a CPU with AMX, runs AMX tiles: several times
 * the FLOP rate, so a 16-token verify costs about one GEMV (docs/BENCHMARKS.md). It loses X
 * precision (8 significant bits): use it only where that was validated (e.g. acceptance unchanged).
 * `'bf16x2'` (split bf16, opt-in) writes X = hi + lo, both bf16 (hi = bf16(X), lo = bf16(X − hi):
 * 16 significant bits, relative error ≤ 2⁻¹⁷ per element), hi and lo as two rows of one AMX tile
 * (two fp32 accumulators per output, hi·W and lo·W, summed once): the instruction count of `'bf16'`
 * up to 8 rows and the same weight traffic, so a GEMV or a verify block of ≤ 16 rows costs about
 * what `'bf16'` costs, with near-fp32 results; without AMX it runs the fp32 kernels on hi + lo.
 * Each variant is batch invariant on its own (the m = 1 GEMV runs the GEMM's kernel as a one-row
 * tile; threads split N, never K); they differ from each other.
 *
 * Sync vs async: `gemmBf16` blocks the calling thread (use it inside a model forward that runs on
 * a worker thread, or for small shapes: no Promise overhead); `gemmBf16Async` runs on a libuv
 * thread and resolves when done (use it on the main/server thread for long calls such as prefill
 * or a big lm_head). Both share one compute pool, so concurrent calls queue rather than compete.
 */
import { addon, type PackedBf16Data } from './addon.js';
import { expectArray, expectInt, expectOneOf, outArray } from './validate.js';

declare const packedBrand: unique symbol;

/** bf16 weights `[n, k]` packed for `gemmBf16`; immutable once packed. */
export interface PackedBf16Weights {
  /** Output features (rows of W). */
  readonly n: number;
  /** Input features (columns of W). */
  readonly k: number;
  /** Packed bf16 bits, `packedBf16Length(n, k)` elements (layout: native/src/gemm_kernels.h). */
  readonly data: PackedBf16Data;
  readonly [packedBrand]: true;
}

/** Activation precision of `gemmBf16` (see the module comment). */
export type GemmActivations = 'f32' | 'bf16' | 'bf16x2';

/** Elements of the packed layout: `roundUp(n, 16) * roundUp(k, 32)`. */
export function packedBf16Length(n: number, k: number): number {
  expectInt('packedBf16Length', 'n', n, 1);
  expectInt('packedBf16Length', 'k', k, 1);
  return Math.ceil(n / 16) * 16 * Math.ceil(k / 32) * 32;
}

/**
 * Packs row-major bf16 weights W `[n, k]` (HF `nn.Linear.weight` layout) for `gemmBf16`.
 * @param w Uint16Array [n*k] of bf16 bits.
 * @param n output features; @param k input features.
 * @throws SpecdArgumentError on a wrong type, size or length.
 */
export function packBf16Weights(w: Uint16Array, n: number, k: number): PackedBf16Weights {
  const out = new Uint16Array(packedBf16Length(n, k)) as PackedBf16Data;
  addon.packBf16(expectArray('packBf16Weights', 'w', w, Uint16Array, n * k, 'n*k'), n, k, out);
  return Object.freeze({ n, k, data: out }) as PackedBf16Weights;
}

function checkGemm(
  call: string,
  x: Float32Array,
  m: number,
  w: PackedBf16Weights,
  out: Float32Array | undefined,
  activations: unknown,
) {
  expectOneOf(call, 'activations', activations, ['f32', 'bf16', 'bf16x2'] as const);
  expectInt(call, 'm', m, 0);
  if (typeof w !== 'object' || w === null || !(w.data instanceof Uint16Array)) {
    expectArray(call, 'w.data', (w as { data?: unknown } | null)?.data, Uint16Array);
  }
  expectArray(call, 'w.data', w.data, Uint16Array, packedBf16Length(w.n, w.k), 'packedBf16Length(w.n, w.k)');
  expectArray(call, 'x', x, Float32Array, m * w.k, 'm*w.k');
  return outArray(call, out, Float32Array, m * w.n, 'm*w.n');
}

/**
 * `Y = X · Wᵀ` synchronously (GEMV when m = 1).
 * @param x Float32Array [m, k] (k = w.k), row-major.
 * @param m rows (tokens), >= 0.
 * @param w packed weights [n, k].
 * @param out optional Float32Array [m, n] to write into (must not alias x).
 * @param activations "f32" (default), "bf16" or "bf16x2" (opt-in, see the module comment).
 * @returns Float32Array [m, n].
 * @throws SpecdArgumentError on a wrong type, shape, length or activations.
 */
export function gemmBf16(
  x: Float32Array,
  m: number,
  w: PackedBf16Weights,
  out?: Float32Array,
  activations: GemmActivations = 'f32',
): Float32Array {
  const y = checkGemm('gemmBf16', x, m, w, out, activations);
  addon.gemmBf16(x, m, w.k, w.data, w.n, y, activations);
  return y;
}

/**
 * `Y ← Y + X · Wᵀ` synchronously (fused accumulate, like a BLAS GEMM with β = 1): each output's dot
 * product is reduced exactly as by {@link gemmBf16} (one fp32 accumulator from +0 over k in order)
 * and then added once to the old `Y[i][j]` — bit for bit `acc[e] + gemmBf16(x, m, w)[e]`, without
 * the temporary or the second pass. Used by drafters' context projections (accumulate by tap).
 * @param x Float32Array [m, k] (k = w.k), row-major.
 * @param m rows (tokens), >= 0.
 * @param w packed weights [n, k].
 * @param acc Float32Array [m, n], updated in place (must not alias x).
 * @param activations "f32" (default), "bf16" or "bf16x2".
 * @returns acc.
 * @throws SpecdArgumentError on a wrong type, shape, length or activations.
 */
export function gemmBf16Accumulate(
  x: Float32Array,
  m: number,
  w: PackedBf16Weights,
  acc: Float32Array,
  activations: GemmActivations = 'f32',
): Float32Array {
  if (!(acc instanceof Float32Array)) expectArray('gemmBf16Accumulate', 'acc', acc, Float32Array, m * w.n, 'm*w.n');
  const y = checkGemm('gemmBf16Accumulate', x, m, w, acc, activations);
  addon.gemmBf16(x, m, w.k, w.data, w.n, y, activations, true);
  return y;
}

/**
 * `Y = X · Wᵀ` on a libuv thread. Do not write x or w.data, nor read out, until the Promise
 * settles (their memory is used in place, not copied); do not transfer their buffers.
 * Arguments and result as `gemmBf16`.
 * @throws SpecdArgumentError synchronously on bad arguments; the Promise rejects (code
 *   ERR_SPECD_KERNEL) on a kernel failure.
 */
export function gemmBf16Async(
  x: Float32Array,
  m: number,
  w: PackedBf16Weights,
  out?: Float32Array,
  activations: GemmActivations = 'f32',
): Promise<Float32Array> {
  const y = checkGemm('gemmBf16Async', x, m, w, out, activations);
  return addon.gemmBf16Async(x, m, w.k, w.data, w.n, y, activations).then(() => y);
}
