/** bf16 <-> f32 conversion. bf16 values travel as their raw 16 bits in a Uint16Array. */
import { addon } from './addon.js';
import { expectArray, outArray } from './validate.js';

/**
 * Rounds f32 to bf16, round to nearest, ties to even (NaN stays NaN, overflow gives +-Inf).
 * @param src Float32Array [n].
 * @param out optional Uint16Array [n] to write into.
 * @returns Uint16Array [n] of bf16 bits.
 * @throws SpecdArgumentError on a wrong type or length.
 */
export function f32ToBf16(src: Float32Array, out?: Uint16Array): Uint16Array {
  const s = expectArray('f32ToBf16', 'src', src, Float32Array);
  const dst = outArray('f32ToBf16', out, Uint16Array, s.length, 'src.length');
  addon.f32ToBf16(s, dst);
  return dst;
}

/**
 * Widens bf16 to f32 (exact).
 * @param src Uint16Array [n] of bf16 bits.
 * @param out optional Float32Array [n].
 * @returns Float32Array [n].
 * @throws SpecdArgumentError on a wrong type or length.
 */
export function bf16ToF32(src: Uint16Array, out?: Float32Array): Float32Array {
  const s = expectArray('bf16ToF32', 'src', src, Uint16Array);
  const dst = outArray('bf16ToF32', out, Float32Array, s.length, 'src.length');
  addon.bf16ToF32(s, dst);
  return dst;
}
