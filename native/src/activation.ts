/** Elementwise activations in f32: SiLU (Hendrycks & Gimpel 2016, "swish") and SwiGLU (Shazeer 2020). */
import { addon } from './addon.js';
import { expectArray, expectInt, outArray, rowsOf } from './validate.js';

/**
 * `out = x · sigmoid(x)`.
 * @param x Float32Array [n]; @param out optional Float32Array [n], may be `x`.
 * @returns Float32Array [n].
 * @throws SpecdArgumentError on a wrong type or length.
 */
export function silu(x: Float32Array, out?: Float32Array): Float32Array {
  const s = expectArray('silu', 'x', x, Float32Array);
  const y = outArray('silu', out, Float32Array, s.length, 'x.length');
  addon.silu(s, y);
  return y;
}

/**
 * SwiGLU MLP activation `out = silu(gate) · up`.
 * @param gate Float32Array [n]; @param up Float32Array [n].
 * @param out optional Float32Array [n], may alias gate or up.
 * @returns Float32Array [n].
 * @throws SpecdArgumentError on a wrong type or length.
 */
export function swiglu(gate: Float32Array, up: Float32Array, out?: Float32Array): Float32Array {
  const g = expectArray('swiglu', 'gate', gate, Float32Array);
  const u = expectArray('swiglu', 'up', up, Float32Array, g.length, 'gate.length');
  const y = outArray('swiglu', out, Float32Array, g.length, 'gate.length');
  addon.swiglu(g, u, y);
  return y;
}

/**
 * SwiGLU on the output of a fused gate_up projection: each row of `gateUp` is
 * `[gate (inter) | up (inter)]`.
 * @param gateUp Float32Array [rows, 2*inter]; @param inter intermediate size (>= 1).
 * @param out optional Float32Array [rows, inter] (must not alias gateUp).
 * @returns Float32Array [rows, inter].
 * @throws SpecdArgumentError on a wrong type, length or inter.
 */
export function swigluFused(gateUp: Float32Array, inter: number, out?: Float32Array): Float32Array {
  const call = 'swigluFused';
  expectInt(call, 'inter', inter, 1);
  const rows = rowsOf(call, 'gateUp', expectArray(call, 'gateUp', gateUp, Float32Array), 2 * inter, '2*inter');
  const y = outArray(call, out, Float32Array, rows * inter, 'rows*inter');
  addon.swigluFused(gateUp, rows, inter, y);
  return y;
}

/**
 * Elementwise `out = a + b` in f32 (one rounding: the same bits as `a[i] + b[i]` stored to a
 * Float32Array in JavaScript), e.g. a residual add `h += x` as `addF32(h, x, h)`.
 * @param a Float32Array [n]; @param b Float32Array [n].
 * @param out optional Float32Array [n], may alias a or b.
 * @returns Float32Array [n].
 * @throws SpecdArgumentError on a wrong type or length.
 */
export function addF32(a: Float32Array, b: Float32Array, out?: Float32Array): Float32Array {
  const x = expectArray('addF32', 'a', a, Float32Array);
  const y = expectArray('addF32', 'b', b, Float32Array, x.length, 'a.length');
  const o = outArray('addF32', out, Float32Array, x.length, 'a.length');
  addon.add(x, y, o);
  return o;
}
