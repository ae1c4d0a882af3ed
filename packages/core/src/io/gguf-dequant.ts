/**
 * Reference dequantizers for the ggml types the GGUF reader supports: F32, F16, BF16, Q8_0, Q4_0,
 * Q4_1 → f32. Plain loops, for tests and load-time conversion (not a decode-time kernel).
 *
 * Block layouts (ggml `ggml-common.h`, `dequantize_row_*` in `ggml-quants.c`), 32 weights a block:
 *   Q8_0 (34 B): f16 d · int8 qs[32];                w[j] = d · qs[j]
 *   Q4_0 (18 B): f16 d · u8 qs[16];                  w[j] = d · ((qs[j] & 0xF) − 8), w[j+16] = d · ((qs[j] >> 4) − 8)
 *   Q4_1 (20 B): f16 d · f16 m · u8 qs[16];          w[j] = d · (qs[j] & 0xF) + m,   w[j+16] = d · (qs[j] >> 4) + m
 * for j in [0, 16). Scales are IEEE half (f16) bit patterns, little-endian. The products are
 * computed in f32 exactly as ggml does (d converted to f32 first), so results match ggml bit for bit.
 */

import { GgmlType, ggmlBlockSize, ggmlTypeName, GgufError, type GgufTensorInfo } from './gguf-types.js';

let F16_TABLE: Float32Array | undefined;

/** f32 value of an IEEE binary16 bit pattern (subnormals, ±inf and NaN included). */
export function f16ToF32(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >> 10) & 0x1f;
  const frac = bits & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 0x1f) return frac === 0 ? sign * Infinity : NaN;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/** IEEE binary16 bits of `v` (round to nearest even, subnormals, overflow to ±Inf, NaN kept): f16ToF32's inverse. */
export function f32ToF16(v: number): number {
  F32[0] = v;
  const x = U32[0]!;
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant !== 0 ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign; // below half the smallest subnormal
    mant |= 0x800000;
    const shift = 14 - e;
    let half = mant >>> shift;
    const rest = mant & ((1 << shift) - 1);
    const halfway = 1 << (shift - 1);
    if (rest > halfway || (rest === halfway && (half & 1) === 1)) half++;
    return sign | half;
  }
  let half = (e << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && (half & 1) === 1)) half++; // a carry rounds into the exponent
  return sign | half;
}
const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/** A 65 536-entry f16 → f32 table (256 KiB), built on first use. */
function f16Table(): Float32Array {
  if (F16_TABLE === undefined) {
    F16_TABLE = new Float32Array(65536);
    for (let i = 0; i < 65536; i++) F16_TABLE[i] = f16ToF32(i);
  }
  return F16_TABLE;
}

/** The little-endian u16 at byte `i` of `src` (a block's f16 scale or min). */
const u16le = (src: Uint8Array, i: number): number => src[i]! | (src[i + 1]! << 8);

const BF16_SCRATCH = new Uint32Array(1);
const BF16_VIEW = new Float32Array(BF16_SCRATCH.buffer);

/** f32 value of a bfloat16 bit pattern (the top 16 bits of an f32). */
export function bf16ToF32(bits: number): number {
  BF16_SCRATCH[0] = (bits & 0xffff) << 16;
  return BF16_VIEW[0]!;
}

/**
 * Dequantizes `numElements` consecutive weights of ggml type `type` to f32.
 * @param type one of F32, F16, BF16, Q8_0, Q4_0, Q4_1.
 * @param src the encoded bytes: `numElements / blockElems × blockBytes` bytes (little-endian), at any byte offset.
 * @param numElements how many weights; a multiple of the type's block size (32 for the Q types).
 * @param out receives `[numElements]` f32 at `outOffset`.
 * @throws {GgufError} `unsupported-type` for any other type; a RangeError if `src` or `out` is too short.
 */
export function dequantizeRow(
  type: GgmlType,
  src: Uint8Array,
  numElements: number,
  out: Float32Array,
  outOffset = 0,
): void {
  const block = ggmlBlockSize(type);
  if (block === undefined || !isDecodable(type)) {
    throw new GgufError(
      '<dequantizeRow>',
      'unsupported-type',
      `unsupported tensor type ${ggmlTypeName(type)} (id ${type}); supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1`,
    );
  }
  const [blockElems, blockBytes] = block;
  if (numElements % blockElems !== 0)
    throw new RangeError(
      `dequantizeRow: numElements ${numElements} is not a multiple of the ${ggmlTypeName(type)} ` +
        `block size ${blockElems}`,
    );
  const needBytes = (numElements / blockElems) * blockBytes;
  if (src.length < needBytes)
    throw new RangeError(
      `dequantizeRow: src has ${src.length} bytes, ${ggmlTypeName(type)} × ${numElements} needs ${needBytes}`,
    );
  if (out.length - outOffset < numElements)
    throw new RangeError(`dequantizeRow: out has room for ${out.length - outOffset} values, needs ${numElements}`);
  const h = f16Table();
  // The Q types read bytes directly (a DataView a call cost more than the row: the engine looks rows up one by one)
  switch (type) {
    case GgmlType.F32: {
      const view = new DataView(src.buffer, src.byteOffset, needBytes);
      for (let i = 0; i < numElements; i++) out[outOffset + i] = view.getFloat32(4 * i, true);
      return;
    }
    case GgmlType.F16: {
      const view = new DataView(src.buffer, src.byteOffset, needBytes);
      for (let i = 0; i < numElements; i++) out[outOffset + i] = h[view.getUint16(2 * i, true)]!;
      return;
    }
    case GgmlType.BF16: {
      const view = new DataView(src.buffer, src.byteOffset, needBytes);
      for (let i = 0; i < numElements; i++) out[outOffset + i] = bf16ToF32(view.getUint16(2 * i, true));
      return;
    }
    case GgmlType.Q8_0:
      for (let b = 0, o = outOffset; b < needBytes; b += 34, o += 32) {
        const d = h[u16le(src, b)]!;
        // (x << 24) >> 24: the byte as a signed int8
        for (let j = 0; j < 32; j++) out[o + j] = d * ((src[b + 2 + j]! << 24) >> 24);
      }
      return;
    case GgmlType.Q4_0:
      for (let b = 0, o = outOffset; b < needBytes; b += 18, o += 32) {
        const d = h[u16le(src, b)]!;
        for (let j = 0; j < 16; j++) {
          const q = src[b + 2 + j]!;
          out[o + j] = d * ((q & 0xf) - 8);
          out[o + j + 16] = d * ((q >> 4) - 8);
        }
      }
      return;
    case GgmlType.Q4_1:
      for (let b = 0, o = outOffset; b < needBytes; b += 20, o += 32) {
        const d = h[u16le(src, b)]!;
        const m = h[u16le(src, b + 2)]!;
        for (let j = 0; j < 16; j++) {
          const q = src[b + 4 + j]!;
          // Math.fround: ggml computes x*d + m in f32 (two roundings), not in f64.
          out[o + j] = Math.fround(d * (q & 0xf)) + m;
          out[o + j + 16] = Math.fround(d * (q >> 4)) + m;
        }
      }
      return;
  }
}

function isDecodable(type: GgmlType): boolean {
  return (
    type === GgmlType.F32 ||
    type === GgmlType.F16 ||
    type === GgmlType.BF16 ||
    type === GgmlType.Q8_0 ||
    type === GgmlType.Q4_0 ||
    type === GgmlType.Q4_1
  );
}

/** A tensor's info plus its encoded bytes (what {@link GgufFile.tensor} returns). */
export interface GgufTensorView {
  readonly info: GgufTensorInfo;
  /** The tensor's `info.byteLength` encoded bytes (zero-copy view into the file buffer). */
  readonly bytes: Uint8Array;
}

/**
 * Dequantizes a whole tensor to f32.
 * @returns `[numElements]` f32 in row-major order of `info.shape` (= ggml order with ne[0] fastest).
 * @throws {GgufError} `unsupported-type` if the tensor's type is not F32/F16/BF16/Q8_0/Q4_0/Q4_1.
 */
export function dequantize(tensor: GgufTensorView): Float32Array {
  const out = new Float32Array(tensor.info.numElements);
  dequantizeRow(tensor.info.type, tensor.bytes, tensor.info.numElements, out);
  return out;
}
