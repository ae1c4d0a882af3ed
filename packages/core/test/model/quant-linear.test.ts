// q8_0Linear: a drafter's projection quantized to Q8_0 at load, run by gemmQuant with int16 or int8 activations —
// close to the bf16 product, and batch invariant (row i of a GEMM is the GEMV of row i, bit for bit).
import { gemmQuant, isa, quantizedWeights } from '@specd/native';
import { describe, expect, it } from 'vitest';

import {
  DrafterError,
  blockDrafterWeightsDefault,
  draftWeightFormat,
  isQ8_0Format,
  q8_0Blocker,
  q8_0Linear,
  quantizeQ8_0,
} from '../../src/index.js';

/** bf16 bit pattern of f32 `v` (truncation: any bf16 will do as a weight). */
const bf16 = (v: number) => new Uint32Array(Float32Array.of(v).buffer)[0]! >>> 16;
const toF32 = (b: number) => new Float32Array(Uint32Array.of(b << 16).buffer)[0]!;

describe('q8_0Linear', () => {
  const n = 40;
  const k = 96;
  let s = 7;
  const rnd = () => {
    s = (s * 16807) % 2147483647;
    return s / 2147483647 - 0.5;
  };
  const w = Uint16Array.from({ length: n * k }, () => bf16(rnd() * 0.1));
  const m = 5;
  const x = Float32Array.from({ length: m * k }, rnd);
  const lin = q8_0Linear(w, n, k);
  const lin8 = q8_0Linear(w, n, k, 'int8');

  it.each([
    ['int16', lin, 1e-2],
    ['int8', lin8, 3e-2],
  ] as const)(
    '%s activations: within %f of the fp32 product over the bf16 weights (per row, relative to its largest output)',
    (_act, lin, tol) => {
      expect(lin.n).toBe(n);
      expect(lin.k).toBe(k);
      const y = lin.apply(x, m);
      expect(y.length).toBe(m * n);
      for (let r = 0; r < m; r++) {
        let err = 0;
        let big = 0;
        for (let c = 0; c < n; c++) {
          let ref = 0;
          for (let i = 0; i < k; i++) ref += x[r * k + i]! * toF32(w[c * k + i]!);
          err = Math.max(err, Math.abs(y[r * n + c]! - ref));
          big = Math.max(big, Math.abs(ref));
        }
        expect(err / big).toBeLessThan(tol);
      }
    },
  );

  it.each([
    ['int16', lin],
    ['int8', lin8],
  ] as const)('%s activations: row i of a GEMM equals the GEMV of row i bit for bit; `out` is written', (_act, lin) => {
    const out = new Float32Array(m * n);
    const y = lin.apply(x, m, out);
    expect(y).toBe(out);
    for (let r = 0; r < m; r++)
      expect(Array.from(lin.apply(x.subarray(r * k, (r + 1) * k), 1))).toEqual(
        Array.from(y.subarray(r * n, (r + 1) * n)),
      );
  });

  it("each activation is gemmQuant's over the same Q8_0 weights, bit for bit (the two differ)", () => {
    const packed = quantizedWeights(
      quantizeQ8_0(
        Float32Array.from(w, (b) => toF32(b)),
        n,
        k,
      ),
      'q8_0',
      n,
      k,
    );
    const y16 = lin.apply(x, m);
    const y8 = lin8.apply(x, m);
    expect(Array.from(y16)).toEqual(Array.from(gemmQuant(x, m, packed, undefined, 'int16')));
    expect(Array.from(y8)).toEqual(Array.from(gemmQuant(x, m, packed, undefined, 'int8')));
    expect(Array.from(y8)).not.toEqual(Array.from(y16));
  });

  it('refuses a wrong length and k not a multiple of 32', () => {
    expect(() => q8_0Linear(new Uint16Array(10), 2, 32)).toThrow(/w has 10 values, expected n·k = 64/);
    expect(() => q8_0Linear(new Uint16Array(2 * 48), 2, 48)).toThrow(/k: expected a positive multiple of 32, got 48/);
  });
});

describe("a drafter's weights setting", () => {
  it('draftWeightFormat: "bf16", "q8_0", "q8_0_int8" pass, undefined stays undefined, anything else is named', () => {
    expect(draftWeightFormat('m', 'q8_0')).toBe('q8_0');
    expect(draftWeightFormat('m', 'q8_0_int8')).toBe('q8_0_int8');
    expect(draftWeightFormat('m', 'bf16')).toBe('bf16');
    expect(draftWeightFormat('m', undefined)).toBeUndefined();
    expect(() => draftWeightFormat('m', 'fp8')).toThrow(DrafterError);
    expect(() => draftWeightFormat('m', 8)).toThrow(
      /^m: settings\.weights: expected "bf16" or "q8_0" or "q8_0_int8", got 8$/,
    );
    expect([isQ8_0Format('q8_0'), isQ8_0Format('q8_0_int8'), isQ8_0Format('bf16'), isQ8_0Format(undefined)]).toEqual([
      true,
      true,
      false,
      false,
    ]);
  });

  it("blockDrafterWeightsDefault: int8-activation Q8_0 on AVX-512 without AMX, else bf16; bf16 where it can't", () => {
    const i = isa();
    expect(blockDrafterWeightsDefault(undefined)).toBe(i.isa === 'avx512' && !i.amxAvailable ? 'q8_0_int8' : 'bf16');
    expect(blockDrafterWeightsDefault('is not supported under tensor parallelism (tp = 2)')).toBe('bf16');
  });

  it('q8_0Blocker: none for one rank and widths of 32s; else tensor parallelism or the odd widths, named', () => {
    expect(q8_0Blocker([256, 512, 768], 1)).toBeUndefined();
    expect(q8_0Blocker([256, 512], 2)).toBe('is not supported under tensor parallelism (tp = 2)');
    expect(q8_0Blocker([576, 100, 100, 60], 1)).toBe(
      "needs every projection's input width to be a multiple of 32 (Q8_0 blocks); this draft model has 100, 60",
    );
  });
});
