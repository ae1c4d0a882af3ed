/**
 * RMSNorm over the last dimension (Zhang & Sennrich 2019; HF LlamaRMSNorm):
 * `y = x / sqrt(mean(x²) + eps) · weight`, optionally gated by `sigmoid(gate)` (Kimi-Linear KDA
 * output norm, REFERENCE.md §7) or `silu(gate)` (Mamba2/Qwen3-Next style gated norm).
 * Sum of squares in double; everything else f32.
 */
import { addon } from './addon.js';
import { expectArray, expectInt, expectNumber, expectOneOf, outArray, rowsOf } from './validate.js';

/** Gate activation for gated RMSNorm. */
export type RmsNormGate = 'sigmoid' | 'silu';

const nonNegative = (v: number) => v >= 0;

/**
 * Plain RMSNorm over rows of `weight.length`.
 * @param x Float32Array [rows, dim] (dim = weight.length).
 * @param weight Float32Array [dim] (convert bf16 checkpoints once with `bf16ToF32`).
 * @param eps >= 0, e.g. 1e-5 (`rms_norm_eps`).
 * @param out optional Float32Array [rows, dim]; may be `x` (in place).
 * @returns Float32Array [rows, dim].
 * @throws SpecdArgumentError on a wrong type, length or eps.
 */
export function rmsNorm(x: Float32Array, weight: Float32Array, eps: number, out?: Float32Array): Float32Array {
  const call = 'rmsNorm';
  const w = expectArray(call, 'weight', weight, Float32Array);
  expectInt(call, 'weight.length', w.length, 1);
  const rows = rowsOf(call, 'x', expectArray(call, 'x', x, Float32Array), w.length, 'weight.length');
  const y = outArray(call, out, Float32Array, x.length, 'x.length');
  addon.rmsNorm(x, w, rows, w.length, expectNumber(call, 'eps', eps, nonNegative, 'a number >= 0'), y, null, 'none');
  return y;
}

/**
 * Gated RMSNorm: `rmsNorm(x)·weight · act(gate)`, act = sigmoid or silu, elementwise.
 * @param x Float32Array [rows, dim]; @param gate Float32Array [rows, dim].
 * @param weight Float32Array [dim]; @param eps >= 0; @param gateKind "sigmoid" | "silu".
 * @param out optional Float32Array [rows, dim]; may be `x`.
 * @returns Float32Array [rows, dim].
 * @throws SpecdArgumentError on a wrong type, length, eps or gateKind.
 */
export function gatedRmsNorm(
  x: Float32Array,
  weight: Float32Array,
  gate: Float32Array,
  eps: number,
  gateKind: RmsNormGate,
  out?: Float32Array,
): Float32Array {
  const call = 'gatedRmsNorm';
  const w = expectArray(call, 'weight', weight, Float32Array);
  expectInt(call, 'weight.length', w.length, 1);
  const rows = rowsOf(call, 'x', expectArray(call, 'x', x, Float32Array), w.length, 'weight.length');
  const g = expectArray(call, 'gate', gate, Float32Array, x.length, 'x.length');
  const kind = expectOneOf(call, 'gateKind', gateKind, ['sigmoid', 'silu'] as const);
  const y = outArray(call, out, Float32Array, x.length, 'x.length');
  addon.rmsNorm(x, w, rows, w.length, expectNumber(call, 'eps', eps, nonNegative, 'a number >= 0'), y, g, kind);
  return y;
}

/**
 * Per-head RMSNorm (q_norm / k_norm, KDA o_norm): normalises each head of x
 * `[tokens, heads, headDim]` over headDim with one shared weight `[headDim]`, optionally gated.
 * @param x Float32Array [tokens, heads, headDim]; @param heads heads per token (>= 1).
 * @param weight Float32Array [headDim]; @param eps >= 0.
 * @param gate optional { values: Float32Array [tokens, heads, headDim], kind: "sigmoid" | "silu" }.
 * @param out optional Float32Array like x; may be `x`.
 * @returns Float32Array [tokens, heads, headDim].
 * @throws SpecdArgumentError on a wrong type, length, heads, eps or gate.
 */
export function rmsNormPerHead(
  x: Float32Array,
  heads: number,
  weight: Float32Array,
  eps: number,
  gate?: { values: Float32Array; kind: RmsNormGate },
  out?: Float32Array,
): Float32Array {
  const call = 'rmsNormPerHead';
  expectInt(call, 'heads', heads, 1);
  const w = expectArray(call, 'weight', weight, Float32Array);
  expectInt(call, 'weight.length', w.length, 1);
  rowsOf(call, 'x', expectArray(call, 'x', x, Float32Array), heads * w.length, 'heads*headDim');
  const rows = x.length / w.length;
  const y = outArray(call, out, Float32Array, x.length, 'x.length');
  const e = expectNumber(call, 'eps', eps, nonNegative, 'a number >= 0');
  if (gate === undefined) {
    addon.rmsNorm(x, w, rows, w.length, e, y, null, 'none');
  } else {
    const g = expectArray(call, 'gate.values', gate.values, Float32Array, x.length, 'x.length');
    addon.rmsNorm(
      x,
      w,
      rows,
      w.length,
      e,
      y,
      g,
      expectOneOf(call, 'gate.kind', gate.kind, ['sigmoid', 'silu'] as const),
    );
  }
  return y;
}
