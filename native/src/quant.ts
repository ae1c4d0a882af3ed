/**
 * Linear layers with GGUF-quantized weights (ggml block formats, `ggml-quants.c`):
 * `Y[m, n] = X[m, k] · W[n, k]ᵀ`, X and Y f32, W dequantized on the fly, accumulation f32.
 *
 * Block formats (32 weights along K per block, f16 = IEEE binary16, little-endian):
 * - `'q4_0'` (18 B): f16 d, 16 B qs — `w[j] = d·((qs[j] & 0xF) − 8)`, `w[j+16] = d·((qs[j] >> 4) − 8)`;
 * - `'q4_1'` (20 B): f16 d, f16 m, 16 B qs — `w[j] = d·(qs[j] & 0xF) + m`, `w[j+16] = d·(qs[j] >> 4) + m`;
 * - `'q8_0'` (34 B): f16 d, 32 × int8 qs — `w[j] = d·qs[j]`.
 * A GGUF tensor `[n, k]` (ggml `ne = {k, n}`) is n rows of k/32 consecutive blocks.
 *
 * `quantizedWeights` repacks the raw tensor once at load into 16-row panels (per panel and block:
 * the 16 rows' f16 scales, then the quants interleaved so one 16-byte line holds one K position of
 * 16 rows; layout in native/src/quant_kernels.h). The packed size equals the GGUF size except for
 * the padding of n to a multiple of 16, so a GEMV moves 4.5 (Q4_0), 5 (Q4_1) or 8.5 (Q8_0) bits
 * per weight.
 *
 * Numerics (project rule: fp32 activations, fp32 accumulation): each weight is dequantized in fp32
 * (`d·q + m`, `d·q` exact) and multiplied by the fp32 activation. Batch invariance: row i of a
 * GEMM equals the GEMV of row i bit for bit, for every m and thread count, on a given ISA path (one
 * fp32 accumulator per output, blocks in order, a fixed order within a block; threads split N,
 * never K). Portable and AVX-512 paths differ by rounding only (FMA vs mul + add).
 *
 * int8 activations (`act = 'int8'`; llama.cpp's q4_0/q4_1/q8_0 × q8_0/q8_1 dot products): each row
 * of X is quantized once per call per block of 32 along K, `d_x = max|x| / 127` (fp32),
 * `q = clamp(roundEven(x / d_x), ±127)`, `s_x = d_x·Σq`; then per output and weight block
 * `t = (d_w·d_x)·Σ q_w·q_x` (+ `m_w·s_x` for Q4_1; q_w = nibble − 8 for Q4_0, nibble for Q4_1), the
 * integer sum exact, and `acc = acc + t` block by block, no FMA. Integer dot products by AVX512-VNNI
 * (with AVX512-VBMI; portable otherwise, the same bits). Batch and thread invariant like the fp32
 * path, and the two ISA paths agree bit for bit (native/src/quant_kernels.h, "int8 activations").
 * Relative error against the fp32-activation result: ~1e-2 per GEMM (the int8 rounding of x).
 *
 * int16 activations (`act = 'int16'`): as int8 with `d_x = max|x| / 32639` and 16-bit quants
 * `q = clamp(roundEven(x / d_x), ±32639)`, each split into two int8 planes `q = 256·hi + lo`
 * (hi ∈ [−127, 127], lo ∈ [−128, 127]); the block sum `Σ q_w·q = 256·Σ q_w·hi + Σ q_w·lo` is two
 * VNNI dot products against the same weight operand, the combination the int8 one (`float(isum)`
 * rounded to nearest even, as it can pass 2^24). Same invariances; ~4e-5 relative per GEMM; AMX is
 * not used. On SmolLM2-135M every layer stays within ~2e-4 of the fp32 reference, where int8
 * drifts 2–5 % (docs/BENCHMARKS.md, "int16 activations").
 *
 * `dequantizeToBf16` gives the weights as bf16 `[n, k]` (round to nearest even of the fp32
 * dequantized value) to pack for `gemmBf16` instead (faster for compute-bound batches: see
 * docs/BENCHMARKS.md, "Quantized GEMM (GGUF Q4_1 / Q8_0)").
 *
 * Sync vs async: as `gemmBf16` / `gemmBf16Async` (one shared compute pool).
 */
import { addon, type PackedQuantData } from './addon.js';
import { expectArray, expectInt, expectOneOf, fail, outArray } from './validate.js';

declare const quantBrand: unique symbol;

/** GGUF block type. */
export type QuantType = 'q4_0' | 'q4_1' | 'q8_0';

/**
 * Activations of `gemmQuant`: `'f32'` (weights dequantized on the fly, fp32 products), `'int8'`
 * (activations quantized per 32-block once per call, integer block dot products) or `'int16'` (as
 * int8 with 16-bit quants: two int8 dot products per block, ~256× less activation rounding).
 */
export type QuantActivation = 'f32' | 'int8' | 'int16';

const QUANT_ACTIVATIONS = ['f32', 'int8', 'int16'] as const;

const QUANT_TYPES = ['q4_0', 'q4_1', 'q8_0'] as const;
const RAW_BLOCK_BYTES: Record<QuantType, number> = { q4_0: 18, q4_1: 20, q8_0: 34 };
const PANEL_BLOCK_BYTES: Record<QuantType, number> = { q4_0: 288, q4_1: 320, q8_0: 544 };

/** Quantized weights `[n, k]` packed for `gemmQuant`; immutable once packed. */
export interface QuantizedWeights {
  readonly type: QuantType;
  /** Output features (rows of W). */
  readonly n: number;
  /** Input features (columns of W), a multiple of 32. */
  readonly k: number;
  /** Packed bytes, `quantPackedBytes(type, n, k)` (layout: native/src/quant_kernels.h). */
  readonly data: PackedQuantData;
  readonly [quantBrand]: true;
}

function checkShape(call: string, type: unknown, n: unknown, k: unknown): void {
  expectOneOf(call, 'type', type, QUANT_TYPES);
  expectInt(call, 'n', n, 1);
  expectInt(call, 'k', k, 1);
  if ((k as number) % 32 !== 0) fail(call, 'k', 'a positive multiple of 32 (the GGUF block size)', k);
}

function expectBytes(call: string, param: string, value: unknown, length: number, what: string): Uint8Array {
  const expected = `Uint8Array of length ${length} (${what})`;
  if (!(value instanceof Uint8Array) || value.length !== length) fail(call, param, expected, value);
  return value;
}

/** Bytes of a raw GGUF tensor `[n, k]` of `type`: `n · (k/32) · blockBytes` (18, 20 or 34). */
export function quantRawBytes(type: QuantType, n: number, k: number): number {
  checkShape('quantRawBytes', type, n, k);
  return n * (k / 32) * RAW_BLOCK_BYTES[type];
}

/** Bytes of the packed layout: `roundUp(n, 16) · (k/32) · blockBytes` (n padded with zero rows). */
export function quantPackedBytes(type: QuantType, n: number, k: number): number {
  checkShape('quantPackedBytes', type, n, k);
  return Math.ceil(n / 16) * (k / 32) * PANEL_BLOCK_BYTES[type];
}

/**
 * Repacks a raw GGUF tensor (the bytes at the tensor's offset in the file's data section) for
 * `gemmQuant`. Call once at load.
 * @param data Uint8Array of `quantRawBytes(type, n, k)` bytes.
 * @param type `'q4_0'`, `'q4_1'` or `'q8_0'`.
 * @param n output features (rows); @param k input features, a multiple of 32.
 * @throws SpecdArgumentError on a bad type, shape (k not a multiple of 32) or byte length.
 */
export function quantizedWeights(data: Uint8Array, type: QuantType, n: number, k: number): QuantizedWeights {
  checkShape('quantizedWeights', type, n, k);
  expectBytes('quantizedWeights', 'data', data, quantRawBytes(type, n, k), 'n*(k/32)*blockBytes');
  const out = new Uint8Array(quantPackedBytes(type, n, k)) as PackedQuantData;
  addon.quantPack(data, type, n, k, out);
  return Object.freeze({ type, n, k, data: out }) as QuantizedWeights;
}

function checkWeights(call: string, w: QuantizedWeights): void {
  if (typeof w !== 'object' || w === null) fail(call, 'w', 'QuantizedWeights (from quantizedWeights)', w);
  checkShape(call, w.type, w.n, w.k);
  expectBytes(call, 'w.data', w.data, quantPackedBytes(w.type, w.n, w.k), 'quantPackedBytes(w.type, w.n, w.k)');
}

function checkGemm(
  call: string,
  x: Float32Array,
  m: number,
  w: QuantizedWeights,
  out: Float32Array | undefined,
  act: QuantActivation,
) {
  expectOneOf(call, 'act', act, QUANT_ACTIVATIONS);
  expectInt(call, 'm', m, 0);
  checkWeights(call, w);
  expectArray(call, 'x', x, Float32Array, m * w.k, 'm*w.k');
  return outArray(call, out, Float32Array, m * w.n, 'm*w.n');
}

/**
 * `Y = X · Wᵀ` synchronously (GEMV when m = 1), weights dequantized on the fly (`act = 'f32'`) or
 * int8 / int16 activations against the integer quants (`act = 'int8'`, `'int16'`; numerics in the
 * module comment).
 * @param x Float32Array [m, k] (k = w.k), row-major.
 * @param m rows (tokens), >= 0.
 * @param w packed quantized weights [n, k].
 * @param out optional Float32Array [m, n] to write into (must not alias x).
 * @param act `'f32'` (default), `'int8'` or `'int16'`.
 * @returns Float32Array [m, n].
 * @throws SpecdArgumentError on a wrong type, shape, length or act.
 */
export function gemmQuant(
  x: Float32Array,
  m: number,
  w: QuantizedWeights,
  out?: Float32Array,
  act: QuantActivation = 'f32',
): Float32Array {
  const y = checkGemm('gemmQuant', x, m, w, out, act);
  addon.gemmQuant(x, m, w.k, w.data, w.type, w.n, y, act);
  return y;
}

/**
 * `Y = X · Wᵀ` on a libuv thread. Do not write x or w.data, nor read out, until the Promise
 * settles (used in place, not copied). Arguments and result as `gemmQuant`.
 * @throws SpecdArgumentError synchronously on bad arguments; the Promise rejects (code
 *   ERR_SPECD_KERNEL) on a kernel failure.
 */
export function gemmQuantAsync(
  x: Float32Array,
  m: number,
  w: QuantizedWeights,
  out?: Float32Array,
  act: QuantActivation = 'f32',
): Promise<Float32Array> {
  const y = checkGemm('gemmQuantAsync', x, m, w, out, act);
  return addon.gemmQuantAsync(x, m, w.k, w.data, w.type, w.n, y, act).then(() => y);
}

/**
 * The weights as bf16 bits `[n, k]` row-major: round-to-nearest-even of the fp32 dequantized value
 * (the value `gemmQuant` multiplies by), e.g. for `packBf16Weights(dequantizeToBf16(w), w.n, w.k)`.
 * @param out optional Uint16Array [n*k].
 * @throws SpecdArgumentError on bad weights or a wrong out length.
 */
export function dequantizeToBf16(w: QuantizedWeights, out?: Uint16Array): Uint16Array {
  checkWeights('dequantizeToBf16', w);
  const o = outArray('dequantizeToBf16', out, Uint16Array, w.n * w.k, 'w.n*w.k');
  addon.quantDequantBf16(w.data, w.type, w.n, w.k, o);
  return o;
}
