// gemmQuant with int8 activations (act 'int8'; llama.cpp's q4_0/q4_1/q8_0 × q8 scheme, numerics in
// native/src/quant_kernels.h "int8 activations") and int16 activations (act 'int16': 16-bit quants as
// two int8 planes, "int16 activations"): against a float64 reference computed here from the same
// quantized activations (quantization re-implemented in fp32 steps), bit for bit against an fp32
// emulation of the documented combination order, close to the fp32-activation GEMM, bitwise batch
// and thread invariance (m >= 96 runs on AMX-INT8 tiles where present, int8 and int16: the same bits as the VNNI
// GEMV; amx-emulated.test.ts checks that kernel on CPUs without AMX), VNNI == portable, non-finite inputs, async ==
// sync, argument errors.
import { createRequire } from 'node:module';
import { afterAll, describe, expect, it } from 'vitest';
import {
  addonPath,
  gemmQuant,
  gemmQuantAsync,
  isa,
  quantizedWeights,
  setIsa,
  setNumThreads,
  type QuantizedWeights,
  type QuantType,
} from '@specd/native';
import {
  firstBitDifference,
  firstMismatches,
  freshSeed,
  isaPaths,
  poisoned,
  randomF32,
  relError,
  rng,
  withIsa,
} from './reference.js';

const TYPES: QuantType[] = ['q4_0', 'q4_1', 'q8_0'];
type IntAct = 'int8' | 'int16';
const ACTS: IntAct[] = ['int8', 'int16'];
/** Largest |quant|: 127 (int8), 127·256 + 127 (int16: q = 256·hi + lo with hi, lo int8). */
const QMAX: Record<IntAct, number> = { int8: 127, int16: 32639 };
const BLOCK_BYTES: Record<QuantType, number> = { q4_0: 18, q4_1: 20, q8_0: 34 };
const fr = Math.fround;

/** IEEE binary16 bits -> number (exact; finite inputs only here). */
function f16(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 31;
  const f = h & 1023;
  if (e === 0) return sign * f * 2 ** -24;
  return sign * (1 + f / 1024) * 2 ** (e - 15);
}

/** A random raw GGUF tensor [n, k] and, per row and block, its integer quants q_w and scales d, m. */
interface RawTensor {
  bytes: Uint8Array;
  /** q_w [n, k]: nibble − 8 (Q4_0), nibble (Q4_1), signed byte (Q8_0). */
  qw: Int32Array;
  /** d [n, k/32] and m [n, k/32] (m = 0 except Q4_1). */
  d: Float64Array;
  m: Float64Array;
}

function randomTensor(type: QuantType, n: number, k: number, next: () => number): RawTensor {
  const blocks = k / 32;
  const bb = BLOCK_BYTES[type];
  const bytes = new Uint8Array(n * blocks * bb);
  const view = new DataView(bytes.buffer);
  const qw = new Int32Array(n * k);
  const d = new Float64Array(n * blocks);
  const m = new Float64Array(n * blocks);
  // f16 with exponent field 5..14 and a random sign (d and m from ~2^-10 to ~1)
  const scale = () =>
    ((next() < 0.5 ? 0x8000 : 0) | ((5 + Math.floor(next() * 10)) << 10) | Math.floor(next() * 1024)) & 0xffff;
  for (let row = 0; row < n; row++)
    for (let b = 0; b < blocks; b++) {
      const off = (row * blocks + b) * bb;
      const at = row * blocks + b;
      const dBits = scale();
      view.setUint16(off, dBits, true);
      d[at] = f16(dBits);
      const out = row * k + b * 32;
      if (type === 'q8_0') {
        for (let j = 0; j < 32; j++) {
          const q = Math.floor(next() * 256) - 128;
          view.setInt8(off + 2 + j, q);
          qw[out + j] = q;
        }
        continue;
      }
      if (type === 'q4_1') {
        const mBits = scale();
        view.setUint16(off + 2, mBits, true);
        m[at] = f16(mBits);
      }
      const qs = off + (type === 'q4_1' ? 4 : 2);
      const bias = type === 'q4_0' ? 8 : 0;
      for (let j = 0; j < 16; j++) {
        const lo = Math.floor(next() * 16);
        const hi = Math.floor(next() * 16);
        bytes[qs + j] = lo | (hi << 4);
        qw[out + j] = lo - bias;
        qw[out + j + 16] = hi - bias;
      }
    }
  return { bytes, qw, d, m };
}

/** Round half to even of a number (the kernels' VCVTPS2DQ / RoundEven). */
function roundEven(v: number): number {
  const r = Math.round(v);
  return Math.abs(v - Math.trunc(v)) === 0.5 ? 2 * Math.round(v / 2) : r;
}

interface Acts {
  /** The quants (int16: the 16-bit value 256·hi + lo). */
  q: Int32Array;
  d: Float64Array;
  s: Float64Array;
}

/**
 * The documented activation quantization, each fp32 operation emulated with Math.fround (a single
 * +, −, ×, ÷ of fp32 values computed in double and rounded once is the correctly rounded fp32 result).
 */
function quantizeActs(x: Float32Array, m: number, k: number, act: IntAct): Acts {
  const qmax = QMAX[act];
  const blocks = k / 32;
  const q = new Int32Array(m * k);
  const d = new Float64Array(m * blocks);
  const s = new Float64Array(m * blocks);
  for (let r = 0; r < m; r++)
    for (let b = 0; b < blocks; b++) {
      const at = r * blocks + b;
      let amax = 0;
      for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(x[r * k + b * 32 + j]!));
      const dx = fr(amax / qmax);
      let sum = 0;
      for (let j = 0; j < 32; j++) {
        const v = dx === 0 ? 0 : Math.max(-qmax, Math.min(qmax, roundEven(fr(x[r * k + b * 32 + j]! / dx))));
        q[r * k + b * 32 + j] = v;
        sum += v;
      }
      d[at] = dx;
      s[at] = fr(dx * sum);
    }
  return { q, d, s };
}

/** Integer block sums isum[r, col, b] = Σ_j q_w·q_x. */
function blockSums(acts: Acts, w: RawTensor, m: number, n: number, k: number): Int32Array {
  const blocks = k / 32;
  const out = new Int32Array(m * n * blocks);
  for (let r = 0; r < m; r++)
    for (let c = 0; c < n; c++)
      for (let b = 0; b < blocks; b++) {
        let isum = 0;
        for (let j = 0; j < 32; j++) isum += w.qw[c * k + b * 32 + j]! * acts.q[r * k + b * 32 + j]!;
        out[(r * n + c) * blocks + b] = isum;
      }
  return out;
}

/**
 * Y in float64 from the same quantized activations: Σ_b d_w·d_x·isum + m_w·s_x, plus the magnitude
 * Σ_b |d_w·d_x·isum| + |m_w·s_x| for an fp32 error bound.
 */
function referenceInt8(acts: Acts, w: RawTensor, isums: Int32Array, m: number, n: number, k: number) {
  const blocks = k / 32;
  const y = new Float64Array(m * n);
  const mag = new Float64Array(m * n);
  for (let r = 0; r < m; r++)
    for (let c = 0; c < n; c++) {
      let acc = 0;
      let a = 0;
      for (let b = 0; b < blocks; b++) {
        const t1 = w.d[c * blocks + b]! * acts.d[r * blocks + b]! * isums[(r * n + c) * blocks + b]!;
        const t2 = w.m[c * blocks + b]! * acts.s[r * blocks + b]!;
        acc += t1 + t2;
        a += Math.abs(t1) + Math.abs(t2);
      }
      y[r * n + c] = acc;
      mag[r * n + c] = a;
    }
  return { y, mag };
}

/**
 * The documented fp32 order, emulated: t = (d_w·d_x)·float(isum) (+ m_w·s_x); acc = acc + t (float(isum)
 * exact for int8, rounded to nearest even for int16 sums past 2^24).
 */
function emulatedInt8(
  type: QuantType,
  acts: Acts,
  w: RawTensor,
  isums: Int32Array,
  m: number,
  n: number,
  k: number,
): Float32Array {
  const blocks = k / 32;
  const y = new Float32Array(m * n);
  for (let r = 0; r < m; r++)
    for (let c = 0; c < n; c++) {
      let acc = 0;
      for (let b = 0; b < blocks; b++) {
        let t = fr(fr(w.d[c * blocks + b]! * acts.d[r * blocks + b]!) * fr(isums[(r * n + c) * blocks + b]!));
        if (type === 'q4_1') t = fr(t + fr(w.m[c * blocks + b]! * acts.s[r * blocks + b]!));
        acc = fr(acc + t);
      }
      y[r * n + c] = acc;
    }
  return y;
}

/** float64 Y of the unquantized activations (what act 'f32' approximates). */
function referenceF32Acts(x: Float32Array, w: RawTensor, m: number, n: number, k: number): Float64Array {
  const blocks = k / 32;
  const y = new Float64Array(m * n);
  for (let r = 0; r < m; r++)
    for (let c = 0; c < n; c++) {
      let s = 0;
      for (let l = 0; l < k; l++) {
        const b = c * blocks + Math.floor(l / 32);
        s += x[r * k + l]! * (w.d[b]! * w.qw[c * k + l]! + w.m[b]!);
      }
      y[r * n + c] = s;
    }
  return y;
}

function gemmI8(x: Float32Array, m: number, w: QuantizedWeights, act: IntAct): Float32Array {
  return gemmQuant(x, m, w, poisoned(m * w.n), act);
}

// k a multiple of 32 (chunks of 8 blocks: 576 = 8 + 8 + 2), odd n, m across row tiles of 6 and the
// 4-panel GEMV tile.
const shapes: Array<[m: number, n: number, k: number]> = [
  [1, 16, 32],
  [1, 1, 32],
  [2, 193, 576],
  [3, 17, 64],
  [5, 45, 576],
  [16, 33, 576],
  [9, 20, 1536],
  [33, 7, 96],
  [100, 21, 320], // AMX-INT8 tiles where present (m >= 96): 7 row tiles of 14–15
  [64, 50, 576],
];

afterAll(() => {
  setIsa('auto');
  setNumThreads(isa().threads);
});

describe.each(ACTS.flatMap((act) => isaPaths().map((path) => [act, path] as const)))(
  'gemmQuant act %s on the %s path',
  (act, path) => {
    describe.each(TYPES)('%s', (type) => {
      it.each(shapes)('matches the reference from the same int8 activations at m=%i n=%i k=%i', (m, n, k) => {
        const seed = freshSeed();
        const next = rng(seed);
        const raw = randomTensor(type, n, k, next);
        const w = quantizedWeights(raw.bytes, type, n, k);
        const x = randomF32(m * k, next);
        const y = withIsa(path, () => gemmI8(x, m, w, act));
        const acts = quantizeActs(x, m, k, act);
        const isums = blockSums(acts, raw, m, n, k);
        const { y: ref, mag } = referenceInt8(acts, raw, isums, m, n, k);
        const blocks = k / 32;
        for (let i = 0; i < m * n; i++)
          expect(Math.abs(y[i]! - ref[i]!), `seed ${seed}: out ${i}: ${y[i]} vs ${ref[i]}`).toBeLessThanOrEqual(
            (blocks + 4) * 2 ** -24 * mag[i]! + 1e-30,
          );
        if (m * n >= 32) expect(relError(y, ref), `seed ${seed}: ${firstMismatches(y, ref, 1e-5)}`).toBeLessThan(1e-5);
        // The documented fp32 order, emulated step by step, gives the same bits.
        const emu = emulatedInt8(type, acts, raw, isums, m, n, k);
        expect(firstBitDifference(y, emu), `seed ${seed}: differs from the emulated fp32 order`).toBe(-1);
        // Against the unquantized activations: each x moved by at most d_x / 2 (round to nearest), so
        // |y − Σ x·w| ≤ Σ_l |w_l|·d_x/2 (+ the fp32 rounding above); ~1e-2 relative over many outputs
        // for int8, 256× less for int16.
        const yf = referenceF32Acts(x, raw, m, n, k);
        for (let i = 0; i < m * n; i++) {
          const [r, c] = [Math.floor(i / n), i % n];
          let bound = 0;
          for (let l = 0; l < k; l++) {
            const b = Math.floor(l / 32);
            bound +=
              Math.abs(raw.d[c * blocks + b]! * raw.qw[c * k + l]! + raw.m[c * blocks + b]!) * acts.d[r * blocks + b]!;
          }
          expect(Math.abs(y[i]! - yf[i]!), `seed ${seed}: out ${i} vs fp32 activations`).toBeLessThanOrEqual(
            0.5 * bound * (1 + 1e-6) + (blocks + 4) * 2 ** -24 * mag[i]! + 1e-30,
          );
        }
        if (m * n >= 32) expect(relError(y, yf), `seed ${seed}`).toBeLessThan(act === 'int8' ? 3e-2 : 3e-4);
      });

      it('row i of every GEMM (m = 1..33, 48, 64, 65, 100) equals the GEMV of row i bitwise, 1 and 2 threads', () => {
        const seed = freshSeed();
        const next = rng(seed);
        const n = 37;
        const k = 576;
        const w = quantizedWeights(randomTensor(type, n, k, next).bytes, type, n, k);
        const x = randomF32(100 * k, next, 3);
        const ms = [...Array.from({ length: 33 }, (_, i) => i + 1), 48, 64, 65, 100];
        const threads = isa().threads;
        withIsa(path, () => {
          try {
            setNumThreads(1);
            const gemv = Array.from({ length: 100 }, (_, i) => gemmI8(x.subarray(i * k, (i + 1) * k), 1, w, act));
            for (const t of [1, 2]) {
              setNumThreads(t);
              for (const m of ms) {
                const y = gemmI8(x.subarray(0, m * k), m, w, act);
                for (let i = 0; i < m; i++) {
                  const diff = firstBitDifference(y.subarray(i * n, (i + 1) * n), gemv[i]!);
                  expect(diff, `seed ${seed}: threads ${t} m=${m} row ${i}: first differing column ${diff}`).toBe(-1);
                }
              }
            }
          } finally {
            setNumThreads(threads);
          }
        });
      });

      it('a non-finite activation makes its row NaN and leaves the other rows alone', () => {
        const next = rng(freshSeed());
        const n = 20;
        const k = 96;
        const w = quantizedWeights(randomTensor(type, n, k, next).bytes, type, n, k);
        const x = randomF32(3 * k, next);
        const clean = withIsa(path, () => gemmI8(x, 3, w, act));
        for (const bad of [Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY]) {
          const xb = x.slice();
          xb[k + 40] = bad;
          const y = withIsa(path, () => gemmI8(xb, 3, w, act));
          for (let c = 0; c < n; c++) expect(Number.isNaN(y[n + c]!), `${bad} col ${c}`).toBe(true);
          expect(firstBitDifference(y.subarray(0, n), clean.subarray(0, n))).toBe(-1);
          expect(firstBitDifference(y.subarray(2 * n), clean.subarray(2 * n))).toBe(-1);
        }
      });

      it('async equals sync bit for bit; zero rows of x give zero', async () => {
        const next = rng(freshSeed());
        const [m, n, k] = [6, 50, 576];
        const w = quantizedWeights(randomTensor(type, n, k, next).bytes, type, n, k);
        const x = randomF32(m * k, next);
        x.fill(0, 2 * k, 3 * k);
        setIsa(path);
        try {
          const sync = gemmI8(x, m, w, act);
          const many = await Promise.all(
            Array.from({ length: 3 }, () => gemmQuantAsync(x, m, w, poisoned(m * n), act)),
          );
          for (const y of many) expect(firstBitDifference(sync, y)).toBe(-1);
          for (let c = 0; c < n; c++) expect(Object.is(sync[2 * n + c], 0)).toBe(true);
        } finally {
          setIsa('auto');
        }
      });
    });
  },
);

describe('gemmQuant act int8 / int16 across paths', () => {
  it.skipIf(isaPaths().length < 2).each(ACTS.flatMap((act) => TYPES.map((type) => [act, type] as const)))(
    '%s %s: the VNNI and portable paths agree bit for bit',
    (act, type) => {
      const seed = freshSeed();
      const next = rng(seed);
      for (const [m, n, k] of [
        [1, 61, 576],
        [3, 40, 576], // VPERMB operands made in registers (TileDirect), 1 or 2 row tiles
        [16, 49, 1536],
        [8, 64, 96], // one row tile of 8 (int16 Q8_0: two of 4)
        [5, 33, 576], // one row tile of 5, at int16 too
        [6, 40, 1536], // one row tile of 6
        [7, 17, 320], // one row tile of 7 (int16 Q8_0: 3 + 4)
        [13, 50, 576], // two row tiles, 6 + 7 (int16 Q8_0: three, 4 + 4 + 5)
        [17, 101, 576], // m >= 17: DirectPairs for every type and act; 7 panels: pairs and an odd last panel
        [24, 37, 1536],
        [40, 18, 320],
        [64, 80, 576],
        [120, 33, 576],
      ] as const) {
        const w = quantizedWeights(randomTensor(type, n, k, next).bytes, type, n, k);
        // mixed magnitudes per block, including tiny (subnormal d_x) and zero blocks
        const x = randomF32(m * k, next, 4);
        for (let i = 0; i < x.length; i += 97) x[i] = x[i]! * 1e-38;
        x.fill(0, 0, 32);
        x.fill(1e-44, 32, 64);
        const a = withIsa('avx512', () => gemmI8(x, m, w, act));
        const b = withIsa('portable', () => gemmI8(x, m, w, act));
        expect(firstBitDifference(a, b), `seed ${seed}: ${act} m=${m} n=${n} k=${k}`).toBe(-1);
      }
    },
  );

  it('rejects a bad act in the native layer too, with a code', () => {
    const raw = createRequire(import.meta.url)(addonPath) as {
      gemmQuant(...args: [Float32Array, number, number, Uint8Array, string, number, Float32Array, string]): void;
    };
    const w = quantizedWeights(randomTensor('q4_1', 3, 32, rng(2)).bytes, 'q4_1', 3, 32);
    let caught: { message: string; code?: string } | undefined;
    try {
      raw.gemmQuant(new Float32Array(32), 1, 32, w.data, 'q4_1', 3, new Float32Array(3), 'int4');
    } catch (e) {
      caught = e as { message: string; code?: string };
    }
    expect(caught?.message).toBe('gemmQuant: act: expected "f32", "int8" or "int16", got string "int4"');
    expect(caught?.code).toBe('ERR_SPECD_INVALID_ARG');
  });

  it('names the call and the parameter for a bad act', () => {
    const next = rng(1);
    const w = quantizedWeights(randomTensor('q4_0', 16, 32, next).bytes, 'q4_0', 16, 32);
    const x = new Float32Array(32);
    expect(() => gemmQuant(x, 1, w, undefined, 'int4' as 'int8')).toThrow(/gemmQuant: act: expected one of/);
    expect(() => gemmQuantAsync(x, 1, w, undefined, 'bf16' as 'int8')).toThrow(/gemmQuantAsync: act/);
  });
});
