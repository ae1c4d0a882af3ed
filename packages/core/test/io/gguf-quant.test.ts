// quantizeQ8_0 (GGUF Q8_0 at load, ggml quantize_row_q8_0_ref): the bytes of hand-worked blocks, the round trip
// through the Q8_0 dequantizer, and its errors.
import { describe, expect, it } from 'vitest';

import { GgmlType, dequantizeRow, f16ToF32, f32ToF16, quantizeQ8_0 } from '../../src/index.js';

const block = (f: (j: number) => number) => Float32Array.from({ length: 32 }, (_, j) => f(j));

describe('quantizeQ8_0', () => {
  it('amax 127: d = 1, the weights themselves, halves rounded away from zero', () => {
    const w = block((j) => [127, -127, 2.5, -2.5, 0.5, -0.5, 1.49, -1.51][j % 8]!);
    const q = quantizeQ8_0(w, 1, 32);
    expect(q.length).toBe(34);
    const view = new DataView(q.buffer);
    expect(view.getUint16(0, true)).toBe(f32ToF16(1)); // d = 127 / 127
    const qs = Array.from(new Int8Array(q.buffer, 2, 32));
    expect(qs.slice(0, 8)).toEqual([127, -127, 3, -3, 1, -1, 1, -2]);
  });

  it('a scaled block: d = amax/127 as f16, qs = roundf(w·(1/d)) in f32; all-zero blocks are zeros', () => {
    const w = new Float32Array(2 * 64);
    for (let j = 0; j < 32; j++) w[j] = (j - 16) * 0.37; // amax 5.92 at j = 0
    for (let j = 64; j < 96; j++) w[j] = Math.sin(j) * 1e-3;
    const q = quantizeQ8_0(w, 2, 64);
    expect(q.length).toBe(4 * 34);
    const view = new DataView(q.buffer);
    for (const b of [0, 2]) {
      const x = w.subarray(b * 32, b * 32 + 32);
      const amax = Math.max(...Array.from(x, Math.abs));
      const d = Math.fround(amax / 127);
      const id = Math.fround(1 / d);
      expect(view.getUint16(b * 34, true)).toBe(f32ToF16(d));
      for (let j = 0; j < 32; j++) {
        const v = Math.fround(x[j]! * id);
        expect(view.getInt8(b * 34 + 2 + j)).toBe(Math.sign(v) * Math.floor(Math.abs(v) + 0.5));
      }
    }
    for (const b of [1, 3]) {
      expect(view.getUint16(b * 34, true)).toBe(0);
      expect(Array.from(new Int8Array(q.buffer, b * 34 + 2, 32)).every((v) => v === 0)).toBe(true);
    }
  });

  it('round trip: each weight within d/2 (plus the f16 rounding of d) of its dequantized value', () => {
    const n = 3;
    const k = 96;
    let s = 1;
    const w = Float32Array.from({ length: n * k }, () => {
      s = (s * 16807) % 2147483647;
      return (s / 2147483647 - 0.5) * 0.2;
    });
    const q = quantizeQ8_0(w, n, k);
    const back = new Float32Array(n * k);
    dequantizeRow(GgmlType.Q8_0, q, n * k, back);
    for (let b = 0; b < (n * k) / 32; b++) {
      const d = f16ToF32(new DataView(q.buffer).getUint16(b * 34, true));
      for (let j = 0; j < 32; j++) {
        const i = b * 32 + j;
        expect(Math.abs(back[i]! - w[i]!)).toBeLessThanOrEqual(d / 2 + 127 * d * 2 ** -11);
      }
    }
  });

  it('refuses k not a multiple of 32, a wrong length and a weight that is not finite', () => {
    expect(() => quantizeQ8_0(new Float32Array(48), 1, 48)).toThrow(/k: expected a positive multiple of 32, got 48/);
    expect(() => quantizeQ8_0(new Float32Array(64), 1, 32)).toThrow(/w has 64 values, expected n·k = 32/);
    const w = new Float32Array(64);
    w[40] = Number.NaN;
    expect(() => quantizeQ8_0(w, 2, 32)).toThrow(/w\[40\] \(row 1\) is NaN, not finite/);
  });
});
