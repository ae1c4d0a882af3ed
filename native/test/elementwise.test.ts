// bf16 conversion, RMSNorm (plain, gated, per head), RoPE, SiLU/SwiGLU vs float64 references.
// These kernels have one (portable) implementation, except SiLU/SwiGLU (also AVX-512, the same bits);
// results must not depend on the ISA setting.
import { describe, expect, it } from 'vitest';
import {
  addF32,
  applyRope,
  bf16ToF32,
  f32ToBf16,
  gatedRmsNorm,
  rmsNorm,
  rmsNormPerHead,
  setIsa,
  silu,
  swiglu,
  swigluFused,
  type RmsNormGate,
  type RopeStyle,
} from '@specd/native';
import { bf16Bits, firstMismatches, freshSeed, poisoned, randomF32, relError, rng, TOL_F32 } from './reference.js';

const sigmoid = (g: number) => 1 / (1 + Math.exp(-g));

function refRmsNorm(
  x: Float32Array,
  w: Float32Array,
  eps: number,
  gate?: Float32Array,
  kind?: RmsNormGate,
): Float64Array {
  const dim = w.length;
  const y = new Float64Array(x.length);
  for (let r = 0; r < x.length / dim; r++) {
    let ss = 0;
    for (let i = 0; i < dim; i++) ss += x[r * dim + i]! ** 2;
    const inv = 1 / Math.sqrt(ss / dim + eps);
    for (let i = 0; i < dim; i++) {
      const j = r * dim + i;
      let v = x[j]! * inv * w[i]!;
      if (gate) v *= kind === 'silu' ? gate[j]! * sigmoid(gate[j]!) : sigmoid(gate[j]!);
      y[j] = v;
    }
  }
  return y;
}

describe('bf16 conversion', () => {
  it('rounds to nearest even and keeps specials', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const x = randomF32(4099, next, 1e3);
    x.set([0, -0, 1.00390625, 1.01171875, 3.4e38, Number.POSITIVE_INFINITY, Number.NaN, 1e-40], 0);
    const bits = f32ToBf16(x, new Uint16Array(x.length).fill(0xdead));
    for (let i = 0; i < x.length; i++) expect(bits[i], `seed ${seed}: index ${i} (${x[i]})`).toBe(bf16Bits(x[i]!));
    expect(bits[2]).toBe(0x3f80); // 1 + 2^-8: tie, rounds to even (1.0)
    expect(bits[3]).toBe(0x3f82); // 1 + 3*2^-8: tie, rounds to even (up)
    expect(bits[4]).toBe(0x7f80); // beyond bf16 max: +Inf
    const back = bf16ToF32(bits, poisoned(x.length));
    expect(relError(back.subarray(8), x.subarray(8))).toBeLessThan(2 ** -8); // bf16: 8 significant bits
    expect(Number.isNaN(back[6])).toBe(true);
  });
});

describe('rmsNorm', () => {
  it.each([
    [1, 64],
    [3, 576],
    [17, 127],
  ])('plain matches float64 at rows=%i dim=%i', (rows, dim) => {
    const seed = freshSeed();
    const next = rng(seed);
    const x = randomF32(rows * dim, next, 3);
    const w = randomF32(dim, next);
    const y = rmsNorm(x, w, 1e-5, poisoned(x.length));
    const ref = refRmsNorm(x, w, 1e-5);
    expect(relError(y, ref), `seed ${seed}: ${firstMismatches(y, ref, 1e-5)}`).toBeLessThan(TOL_F32);
  });

  it.each([
    ['sigmoid', 5, 96],
    ['silu', 3, 33],
  ] as const)('gated by %s matches float64 (rows=%i dim=%i)', (kind, rows, dim) => {
    const seed = freshSeed();
    const next = rng(seed);
    const x = randomF32(rows * dim, next, 2);
    const w = randomF32(dim, next);
    const gate = randomF32(rows * dim, next, 4);
    const y = gatedRmsNorm(x, w, gate, 1e-6, kind, poisoned(x.length));
    expect(relError(y, refRmsNorm(x, w, 1e-6, gate, kind)), `seed ${seed}`).toBeLessThan(TOL_F32);
  });

  it('per head normalises each head with the shared weight, optionally gated, and works in place', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const [tokens, heads, dim] = [3, 5, 24];
    const x = randomF32(tokens * heads * dim, next, 2);
    const w = randomF32(dim, next);
    const gate = randomF32(x.length, next);
    const ref = refRmsNorm(x, w, 1e-5);
    expect(
      relError(rmsNormPerHead(x, heads, w, 1e-5, undefined, poisoned(x.length)), ref),
      `seed ${seed}`,
    ).toBeLessThan(TOL_F32);
    const gated = refRmsNorm(x, w, 1e-5, gate, 'sigmoid');
    const inPlace = Float32Array.from(x);
    rmsNormPerHead(inPlace, heads, w, 1e-5, { values: gate, kind: 'sigmoid' }, inPlace);
    expect(relError(inPlace, gated), `seed ${seed}`).toBeLessThan(TOL_F32);
  });

  it('rejects shapes that do not fit, naming the parameter', () => {
    expect(() => rmsNorm(new Float32Array(10), new Float32Array(3), 1e-5)).toThrow(
      'rmsNorm: x: expected a length divisible by weight.length = 3, got Float32Array of length 10',
    );
    expect(() => rmsNorm(new Float32Array(3), new Float32Array(3), -1)).toThrow(
      'rmsNorm: eps: expected a number >= 0, got number -1',
    );
    expect(() => rmsNormPerHead(new Float32Array(12), 4, new Float32Array(4), 1e-5)).toThrow(
      /rmsNormPerHead: x: expected a length divisible by heads\*headDim = 16/,
    );
  });
});

function refRope(
  x: Float32Array,
  pos: Int32Array,
  heads: number,
  headDim: number,
  rot: number,
  theta: number,
  style: RopeStyle,
): Float64Array {
  const y = Float64Array.from(x);
  const half = rot / 2;
  for (let t = 0; t < pos.length; t++)
    for (let h = 0; h < heads; h++) {
      const base = (t * heads + h) * headDim;
      for (let i = 0; i < half; i++) {
        const angle = pos[t]! * theta ** ((-2 * i) / rot);
        const [ia, ib] = style === 'neox' ? [i, i + half] : [2 * i, 2 * i + 1];
        const a = x[base + ia]!;
        const b = x[base + ib]!;
        y[base + ia] = a * Math.cos(angle) - b * Math.sin(angle);
        y[base + ib] = b * Math.cos(angle) + a * Math.sin(angle);
      }
    }
  return y;
}

describe('applyRope', () => {
  const cases: Array<[RopeStyle, number, number, number, number]> = [
    ['neox', 3, 2, 64, 64],
    ['interleaved', 5, 3, 64, 64],
    ['neox', 4, 1, 128, 64],
    ['interleaved', 2, 2, 96, 32],
    ['neox', 1, 8, 10, 6],
  ];
  it.each(cases)(
    '%s matches float64 (tokens=%i heads=%i headDim=%i rotaryDim=%i)',
    (style, tokens, heads, headDim, rot) => {
      const seed = freshSeed();
      const next = rng(seed);
      const x = randomF32(tokens * heads * headDim, next);
      const pos = Int32Array.from({ length: tokens }, () => Math.floor(next() * 16384));
      const y = applyRope(x, pos, { heads, headDim, rotaryDim: rot, theta: 1e4, style }, poisoned(x.length));
      const ref = refRope(x, pos, heads, headDim, rot, 1e4, style);
      // cos/sin are rounded to f32 at angles up to ~1.6e4 rad: a few f32 ulp of the result.
      expect(relError(y, ref), `seed ${seed}: ${firstMismatches(y, ref, 1e-5)}`).toBeLessThan(4 * TOL_F32);
      const inPlace = Float32Array.from(x);
      applyRope(inPlace, pos, { heads, headDim, rotaryDim: rot, theta: 1e4, style }, inPlace);
      expect(Array.from(inPlace)).toEqual(Array.from(y));
    },
  );

  it('positions past the cached cos/sin table give the bits of the same positions inside it', () => {
    // rope.cc keeps (c, s) of positions < 2^15 in a table; a call with a larger position computes them
    // per token (same formula): the two must agree bit for bit.
    const x = randomF32(3 * 2 * 64, rng(5));
    const opts = { heads: 2, headDim: 64, theta: 1e5, style: 'neox' } as const;
    const mixed = applyRope(x, Int32Array.of(7, 1000, 40000), opts); // per token (40000 is past the table)
    const cached = applyRope(x.subarray(0, 2 * 2 * 64), Int32Array.of(7, 1000), opts);
    expect(Array.from(mixed.subarray(0, 2 * 2 * 64))).toEqual(Array.from(cached));
    const again = applyRope(x.subarray(2 * 2 * 64), Int32Array.of(40000), opts);
    expect(Array.from(mixed.subarray(2 * 2 * 64))).toEqual(Array.from(again));
  });

  it('position 0 is the identity', () => {
    const x = randomF32(2 * 16, rng(1));
    expect(Array.from(applyRope(x, new Int32Array(2), { heads: 1, headDim: 16, theta: 1e6, style: 'neox' }))).toEqual(
      Array.from(x),
    );
  });

  it('rejects negative positions and odd rotary dims', () => {
    const x = new Float32Array(8);
    expect(() => applyRope(x, new Int32Array([0, -3]), { heads: 1, headDim: 4, theta: 1e4, style: 'neox' })).toThrow(
      'rope: positions: expected values >= 0, got positions[1] = -3',
    );
    expect(() =>
      applyRope(x, new Int32Array(2), { heads: 1, headDim: 4, rotaryDim: 3, theta: 1e4, style: 'neox' }),
    ).toThrow('applyRope: options.rotaryDim: expected an even integer, got number 3');
  });
});

describe('SiLU and SwiGLU', () => {
  it('silu and swiglu match float64 at odd lengths', () => {
    const seed = freshSeed();
    const next = rng(seed);
    for (const n of [1, 7, 20001]) {
      const g = randomF32(n, next, 8);
      const u = randomF32(n, next, 2);
      const refSilu = Float64Array.from(g, (v) => v * sigmoid(v));
      expect(relError(silu(g, poisoned(n)), refSilu), `seed ${seed}`).toBeLessThan(TOL_F32);
      expect(
        relError(
          swiglu(g, u, poisoned(n)),
          refSilu.map((v, i) => v * u[i]!),
        ),
        `seed ${seed}`,
      ).toBeLessThan(TOL_F32);
    }
  });

  it('the portable and AVX-512 paths give the same bits, special values included', () => {
    const next = rng(11);
    const n = 4099;
    const g = randomF32(n, next, 30);
    const u = randomF32(n, next, 2);
    const special = [0, -0, Infinity, -Infinity, Number.NaN, 88.72, 88.73, -88.73, 103.9, 104, -104, 1e30, -1e30];
    g.set(special);
    const run = (path: 'portable' | 'auto') => {
      setIsa(path);
      try {
        return [
          silu(g),
          swiglu(g, u),
          swigluFused(Float32Array.of(...g.subarray(0, 2048), ...u.subarray(0, 2048)), 2048),
        ];
      } finally {
        setIsa('auto');
      }
    };
    const [a, b] = [run('portable'), run('auto')];
    for (let i = 0; i < 3; i++) expect(Array.from(b[i]!)).toEqual(Array.from(a[i]!));
    // g / (1 + exp(-g)) as before: silu(+inf) = inf, silu(-inf) = -inf / inf = NaN, silu(NaN) = NaN
    expect(a[0]![2]).toBe(Infinity);
    expect(a[0]![3]).toBeNaN();
    expect(a[0]![4]).toBeNaN();
  });

  it('swigluFused splits each row into [gate | up]', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const [rows, inter] = [3, 37];
    const gu = randomF32(rows * 2 * inter, next, 4);
    const ref = new Float64Array(rows * inter);
    for (let r = 0; r < rows; r++)
      for (let i = 0; i < inter; i++) {
        const g = gu[r * 2 * inter + i]!;
        ref[r * inter + i] = g * sigmoid(g) * gu[r * 2 * inter + inter + i]!;
      }
    expect(relError(swigluFused(gu, inter, poisoned(rows * inter)), ref), `seed ${seed}`).toBeLessThan(TOL_F32);
    expect(() => swigluFused(new Float32Array(10), 3)).toThrow(
      'swigluFused: gateUp: expected a length divisible by 2*inter = 6, got Float32Array of length 10',
    );
  });
});

describe('addF32', () => {
  it('gives the bits of the JavaScript sum stored to a Float32Array, in place too', () => {
    const next = rng(3);
    const a = randomF32(1001, next, 100);
    const b = randomF32(1001, next, 1e-3);
    const ref = new Float32Array(a.length);
    for (let i = 0; i < a.length; i++) ref[i] = a[i]! + b[i]!;
    expect(Array.from(addF32(a, b))).toEqual(Array.from(ref));
    addF32(a, b, a);
    expect(Array.from(a)).toEqual(Array.from(ref));
    expect(() => addF32(new Float32Array(3), new Float32Array(2))).toThrow(/addF32: b: expected/);
  });
});
