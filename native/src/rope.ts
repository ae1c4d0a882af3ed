/**
 * Rotary position embeddings (Su et al. 2021, RoFormer) on `[tokens, heads, headDim]` f32, with
 * cos/sin computed from `theta` and absolute positions (angles in double, then f32).
 * - "neox": rotate halves (HF `rotate_half`, GPT-NeoX, Llama/Qwen checkpoints).
 * - "interleaved": rotate adjacent pairs (GPT-J, DeepSeek MLA rope slice in some exports).
 * Partial rotary: only the first `rotaryDim` dims of each head rotate; the rest are copied.
 */
import { addon } from './addon.js';
import { expectArray, expectInt, expectNumber, expectOneOf, outArray, rowsOf, fail } from './validate.js';

/** RoPE pairing convention. */
export type RopeStyle = 'neox' | 'interleaved';

/** Static RoPE geometry of one tensor. */
export interface RopeOptions {
  /** Heads per token (>= 1). */
  readonly heads: number;
  /** Dimensions per head (>= 1). */
  readonly headDim: number;
  /** Rotated dimensions per head: even, <= headDim; default headDim. */
  readonly rotaryDim?: number;
  /** Base of the inverse frequencies, `rope_theta` (> 0), e.g. 10000 or 1e6. */
  readonly theta: number;
  /** Pairing convention. */
  readonly style: RopeStyle;
}

/**
 * Applies RoPE: pair (a, b) -> (a·cos − b·sin, b·cos + a·sin), angle = pos · theta^(−2i/rotaryDim).
 * @param x Float32Array [tokens, heads, headDim].
 * @param positions Int32Array [tokens], absolute positions >= 0.
 * @param options heads, headDim, rotaryDim, theta, style.
 * @param out optional Float32Array like x; may be `x` (in place).
 * @returns Float32Array [tokens, heads, headDim].
 * @throws SpecdArgumentError on a wrong type, length, geometry or a negative position.
 */
export function applyRope(
  x: Float32Array,
  positions: Int32Array,
  options: RopeOptions,
  out?: Float32Array,
): Float32Array {
  const call = 'applyRope';
  const pos = expectArray(call, 'positions', positions, Int32Array);
  const heads = expectInt(call, 'options.heads', options.heads, 1);
  const headDim = expectInt(call, 'options.headDim', options.headDim, 1);
  const rotaryDim = expectInt(call, 'options.rotaryDim', options.rotaryDim ?? headDim, 0, headDim);
  if (rotaryDim % 2 !== 0) fail(call, 'options.rotaryDim', 'an even integer', rotaryDim);
  const theta = expectNumber(call, 'options.theta', options.theta, (v) => v > 0, 'a number > 0');
  const style = expectOneOf(call, 'options.style', options.style, ['neox', 'interleaved'] as const);
  expectArray(call, 'x', x, Float32Array, pos.length * heads * headDim, 'positions.length*heads*headDim');
  rowsOf(call, 'x', x, heads * headDim, 'heads*headDim');
  const y = outArray(call, out, Float32Array, x.length, 'x.length');
  addon.rope(x, pos, pos.length, heads, headDim, rotaryDim, theta, style, y);
  return y;
}
