// GEMM over packed bf16 weights: accuracy vs float64, batch invariance (bitwise), thread
// invariance, async == sync, argument errors. Both ISA paths.
import { createRequire } from 'node:module';
import { afterAll, describe, expect, it } from 'vitest';
import {
  addonPath,
  bf16ToF32,
  gemmBf16,
  gemmBf16Accumulate,
  gemmBf16Async,
  guardedFloat32Array,
  isa,
  packBf16Weights,
  packedBf16Length,
  setIsa,
  setNumThreads,
  type GemmActivations,
  type PackedBf16Weights,
} from '@specd/native';
import {
  bf16Bits,
  bf16Value,
  firstBitDifference,
  firstMismatches,
  freshSeed,
  isaPaths,
  poisoned,
  randomF32,
  relError,
  rng,
  tolDot,
  withIsa,
} from './reference.js';

/** Random bf16 weights W [n, k] (bits) and their exact values. */
function randomWeights(n: number, k: number, next: () => number): { bits: Uint16Array; values: Float64Array } {
  const bits = new Uint16Array(n * k);
  const values = new Float64Array(n * k);
  for (let i = 0; i < n * k; i++) {
    bits[i] = bf16Bits((next() * 2 - 1) * 0.5);
    values[i] = bf16Value(bits[i]!);
  }
  return { bits, values };
}

/** float64 reference Y[m, n] = X[m, k] · W[n, k]ᵀ. */
function referenceGemm(x: ArrayLike<number>, w: Float64Array, m: number, n: number, k: number): Float64Array {
  const y = new Float64Array(m * n);
  for (let i = 0; i < m; i++)
    for (let j = 0; j < n; j++) {
      let s = 0;
      for (let l = 0; l < k; l++) s += x[i * k + l]! * w[j * k + l]!;
      y[i * n + j] = s;
    }
  return y;
}

function gemm(x: Float32Array, m: number, w: PackedBf16Weights, activations: GemmActivations = 'f32'): Float32Array {
  return gemmBf16(x, m, w, poisoned(m * w.n), activations);
}

/** X rounded to bf16, as the 'bf16' activation variant sees it. */
function roundedToBf16(x: Float32Array): Float32Array {
  return x.map((v) => bf16Value(bf16Bits(v)));
}

/** X as the 'bf16x2' variant sees it: hi + lo with hi = bf16(x), lo = bf16(x - hi) (exact in f64). */
function splitBf16(x: Float32Array): Float64Array {
  return Float64Array.from(x, (v) => {
    const hi = bf16Value(bf16Bits(v));
    return hi + bf16Value(bf16Bits(Math.fround(v - hi)));
  });
}

/** Every activation variant: each has its own batch and thread invariance contract. */
const ACTIVATIONS = ['f32', 'bf16', 'bf16x2'] as const;

const shapes: Array<[m: number, n: number, k: number]> = [
  [1, 16, 32],
  [1, 1, 1],
  [3, 17, 33],
  [17, 45, 301],
  [1, 130, 257],
  [5, 64, 1024],
  [16, 96, 1000],
  [33, 31, 77],
];

afterAll(() => {
  setIsa('auto');
  setNumThreads(isa().threads);
});

describe.each(isaPaths())('gemmBf16 on the %s path', (path) => {
  it.each(shapes)('matches float64 at m=%i n=%i k=%i', (m, n, k) => {
    const seed = freshSeed();
    const next = rng(seed);
    const { bits, values } = randomWeights(n, k, next);
    const x = randomF32(m * k, next);
    const w = packBf16Weights(bits, n, k);
    const y = withIsa(path, () => gemm(x, m, w));
    const ref = referenceGemm(x, values, m, n, k);
    const err = relError(y, ref);
    expect(err, `seed ${seed}: rel err ${err}; ${firstMismatches(y, ref, 1e-4)}`).toBeLessThan(tolDot(k));
  });

  it('is batch invariant: row i of every GEMM (m = 1..33) equals the GEMV of row i, bit for bit', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const [n, k] = [67, 301];
    const w = packBf16Weights(randomWeights(n, k, next).bits, n, k);
    const x = randomF32(33 * k, next);
    withIsa(path, () => {
      const gemv = Array.from({ length: 33 }, (_, i) => gemm(x.subarray(i * k, (i + 1) * k), 1, w));
      for (let m = 1; m <= 33; m++) {
        // Rows taken from different offsets so a row's position in the batch changes with m.
        const offset = (m * 7) % (34 - m);
        const y = gemm(x.subarray(offset * k, (offset + m) * k), m, w);
        for (let i = 0; i < m; i++) {
          const diff = firstBitDifference(y.subarray(i * n, (i + 1) * n), gemv[offset + i]!);
          expect(diff, `seed ${seed}: m=${m} row ${i} (x row ${offset + i}) differs at column ${diff}`).toBe(-1);
        }
      }
    });
  });

  it.each(shapes.slice(0, 6))(
    'with bf16 activations (opt-in) matches float64 on bf16-rounded x at m=%i n=%i k=%i',
    (m, n, k) => {
      const seed = freshSeed();
      const next = rng(seed);
      const { bits, values } = randomWeights(n, k, next);
      const x = randomF32(m * k, next);
      const w = packBf16Weights(bits, n, k);
      const y = withIsa(path, () => gemm(x, m, w, 'bf16'));
      const ref = referenceGemm(roundedToBf16(x), values, m, n, k);
      const err = relError(y, ref);
      expect(err, `seed ${seed}: rel err ${err}; ${firstMismatches(y, ref, 1e-4)}`).toBeLessThan(2 * tolDot(k));
    },
  );

  it.each(shapes.slice(0, 6))(
    'with split bf16 activations (bf16x2) matches float64 on hi + lo, and fp32 x within 2^-16, at m=%i n=%i k=%i',
    (m, n, k) => {
      const seed = freshSeed();
      const next = rng(seed);
      const { bits, values } = randomWeights(n, k, next);
      const x = randomF32(m * k, next);
      const w = packBf16Weights(bits, n, k);
      const y = withIsa(path, () => gemm(x, m, w, 'bf16x2'));
      const ref = referenceGemm(splitBf16(x), values, m, n, k);
      const err = relError(y, ref);
      expect(err, `seed ${seed}: rel err ${err}; ${firstMismatches(y, ref, 1e-4)}`).toBeLessThan(2 * tolDot(k));
      // against the unrounded x: the split keeps 16 significant bits (|x - hi - lo| <= 2^-17 |x|)
      const exact = relError(y, referenceGemm(x, values, m, n, k));
      expect(exact, `seed ${seed}`).toBeLessThan(2 ** -16 * Math.sqrt(k) + 2 * tolDot(k));
    },
  );

  it.each(['bf16', 'bf16x2'] as const)(
    'with %s activations rounds X as the scalar F32ToBf16 does (ties to even, ties at both parities), bit for bit',
    (act) => {
      // W = the identity, so Y = X as the kernel rounded it: hi, or hi + lo for the split (exact in fp32).
      // k = 37 leaves a 5-lane tail for the 16-lane conversion; no denormals (AMX flushes them).
      const seed = freshSeed();
      const next = rng(seed);
      const [m, k] = [3, 37];
      const eye = new Uint16Array(k * k);
      for (let j = 0; j < k; j++) eye[j * k + j] = bf16Bits(1);
      const w = packBf16Weights(eye, k, k);
      const bits = new Uint32Array(m * k);
      for (let i = 0; i < m * k; i++) {
        const exponent = 100 + Math.floor(next() * 60); // 2^-27 .. 2^33
        const low = i % 4 === 0 ? 0x8000 : i % 4 === 1 ? 0x7fff : Math.floor(next() * 0x10000);
        const mantissaHigh = Math.floor(next() * 0x80); // even and odd bf16 mantissas
        bits[i] = ((i % 3 === 0 ? 1 : 0) << 31) | (exponent << 23) | (mantissaHigh << 16) | low;
      }
      const x = new Float32Array(bits.buffer);
      const want = Float32Array.from(x, (v) => {
        const hi = bf16Value(bf16Bits(v));
        return act === 'bf16' ? hi : hi + bf16Value(bf16Bits(Math.fround(v - hi)));
      });
      withIsa(path, () => {
        const y = gemm(x, m, w, act);
        const diff = firstBitDifference(y, want);
        expect(diff, `seed ${seed}: element ${diff}: x ${x[diff]} gave ${y[diff]}, want ${want[diff]}`).toBe(-1);
      });
    },
  );

  it.each(['bf16', 'bf16x2'] as const)(
    'with %s activations row i of every GEMM (m = 1..33) is the GEMV of row i bit for bit, on 1 and 2 threads',
    (act) => {
      const seed = freshSeed();
      const next = rng(seed);
      // 5 panels: one group of 4 + a single panel on 1 thread; other groupings on 2 threads
      const [n, k] = [75, 333];
      const w = packBf16Weights(randomWeights(n, k, next).bits, n, k);
      const x = randomF32(33 * k, next);
      const threads = isa().threads;
      try {
        withIsa(path, () => {
          setNumThreads(1);
          const gemv = Array.from({ length: 33 }, (_, i) => gemm(x.subarray(i * k, (i + 1) * k), 1, w, act));
          for (const t of [1, 2]) {
            setNumThreads(t);
            for (let m = 1; m <= 33; m++) {
              const offset = (m * 5) % (34 - m);
              const y = gemm(x.subarray(offset * k, (offset + m) * k), m, w, act);
              for (let i = 0; i < m; i++) {
                const diff = firstBitDifference(y.subarray(i * n, (i + 1) * n), gemv[offset + i]!);
                expect(diff, `seed ${seed}: ${t} threads m=${m} row ${i} differs at column ${diff}`).toBe(-1);
              }
            }
          }
        });
      } finally {
        setNumThreads(threads);
      }
    },
  );

  it('reads no float past X and writes none past Y (both end at a PROT_NONE page)', () => {
    // GCC 12 -O3 once vectorised the portable tile into a group load that over-read X by a pair
    // (a SIGSEGV that took down the test worker when X ended at a page boundary).
    const seed = freshSeed();
    const next = rng(seed);
    withIsa(path, () => {
      for (const k of [1, 2, 3, 5, 33, 64])
        for (const n of [1, 17])
          for (let m = 1; m <= 9; m++) {
            const { bits, values } = randomWeights(n, k, next);
            const w = packBf16Weights(bits, n, k);
            const x = guardedFloat32Array(m * k);
            x.set(randomF32(m * k, next));
            for (const act of ACTIVATIONS) {
              const y = guardedFloat32Array(m * n);
              y.fill(Number.NaN);
              gemmBf16(x, m, w, y, act);
              const xs = act === 'bf16' ? roundedToBf16(x) : act === 'bf16x2' ? splitBf16(x) : x;
              const ref = referenceGemm(xs, values, m, n, k);
              // Every output written and right: within the fp32 dot-product bound (k + 2)·u·Σ|x·w| of
              // its own reference (a per-element bound: with n = 1 a relative L2 error of one
              // cancelling dot product says nothing).
              for (let i = 0; i < m; i++)
                for (let j = 0; j < n; j++) {
                  let mag = 0;
                  for (let l = 0; l < k; l++) mag += Math.abs(xs[i * k + l]! * values[j * k + l]!);
                  const err = Math.abs(y[i * n + j]! - ref[i * n + j]!);
                  expect(err, `seed ${seed}: m=${m} n=${n} k=${k} ${act} y[${i}, ${j}]`).toBeLessThanOrEqual(
                    (k + 2) * 2 ** -24 * mag,
                  );
                }
            }
          }
    });
  });

  it('gives bit-identical results with 1, 2 and 3 threads', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const [m, n, k] = [9, 200, 515];
    const w = packBf16Weights(randomWeights(n, k, next).bits, n, k);
    const x = randomF32(m * k, next);
    const threads = isa().threads;
    withIsa(path, () => {
      for (const act of ACTIVATIONS) {
        setNumThreads(1);
        const one = gemm(x, m, w, act);
        setNumThreads(2);
        const two = gemm(x, m, w, act);
        setNumThreads(3);
        const three = gemm(x, m, w, act);
        setNumThreads(threads);
        expect(firstBitDifference(one, two), `seed ${seed} ${act}: 1 vs 2 threads`).toBe(-1);
        expect(firstBitDifference(one, three), `seed ${seed} ${act}: 1 vs 3 threads`).toBe(-1);
      }
    });
  });

  it('is batch invariant past the 64-row blocks: rows of m = 130 and 200 GEMMs equal GEMVs bit for bit', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const [n, k] = [45, 97];
    const w = packBf16Weights(randomWeights(n, k, next).bits, n, k);
    const x = randomF32(200 * k, next);
    withIsa(path, () => {
      for (const m of [130, 200]) {
        const y = gemm(x.subarray(0, m * k), m, w);
        for (let i = 0; i < m; i++) {
          const row = gemm(x.subarray(i * k, (i + 1) * k), 1, w);
          expect(firstBitDifference(y.subarray(i * n, (i + 1) * n), row), `seed ${seed} m ${m} row ${i}`).toBe(-1);
        }
      }
    });
  });

  it.each(shapes)(
    'gemmBf16Accumulate at m=%i n=%i k=%i is bitwise acc + gemmBf16 (f32 and bf16 activations)',
    (m, n, k) => {
      const seed = freshSeed();
      const next = rng(seed);
      const w = packBf16Weights(randomWeights(n, k, next).bits, n, k);
      const x = randomF32(m * k, next);
      const acc0 = randomF32(m * n, next);
      withIsa(path, () => {
        for (const act of ACTIVATIONS) {
          const y = gemm(x, m, w, act);
          const want = acc0.map((v, e) => v + y[e]!);
          const acc = Float32Array.from(acc0);
          const out = gemmBf16Accumulate(x, m, w, acc, act);
          expect(out).toBe(acc);
          expect(firstBitDifference(acc, want), `seed ${seed} ${act}`).toBe(-1);
        }
      });
    },
  );

  it('async equals sync bit for bit', async () => {
    const next = rng(freshSeed());
    const [m, n, k] = [4, 48, 130];
    const w = packBf16Weights(randomWeights(n, k, next).bits, n, k);
    const x = randomF32(m * k, next);
    setIsa(path);
    try {
      for (const act of ACTIVATIONS) {
        const sync = gemm(x, m, w, act);
        const async = await gemmBf16Async(x, m, w, poisoned(m * n), act);
        expect(firstBitDifference(sync, async)).toBe(-1);
      }
      // Concurrent calls share the pool (serialised natively) and still give the same bits.
      const many = await Promise.all(Array.from({ length: 6 }, () => gemmBf16Async(x, m, w, poisoned(m * n))));
      for (const y of many) expect(firstBitDifference(y, gemm(x, m, w))).toBe(-1);
    } finally {
      setIsa('auto');
    }
  });
});

describe('packBf16Weights', () => {
  it('keeps every weight (unpacking the panel layout gives W back) and pads with zeros', () => {
    const [n, k] = [19, 7];
    const bits = new Uint16Array(n * k).map((_, i) => (i * 37 + 1) & 0xffff);
    const packed = packBf16Weights(bits, n, k).data;
    expect(packed.length).toBe(packedBf16Length(n, k));
    const kp = Math.ceil(k / 32) * 16; // pairs stored per panel: K padded to 32
    for (let row = 0; row < 32; row++)
      for (let col = 0; col < 2 * kp; col++) {
        const v = packed[Math.floor(row / 16) * kp * 32 + Math.floor(col / 2) * 32 + (row % 16) * 2 + (col % 2)];
        expect(v).toBe(row < n && col < k ? bits[row * k + col] : 0);
      }
  });

  it('round-trips through bf16ToF32 unchanged', () => {
    const bits = new Uint16Array([0x3f80, 0xc000, 0x0001, 0x7f80]);
    expect(Array.from(bf16ToF32(bits))).toEqual([1, -2, bf16Value(1), Number.POSITIVE_INFINITY]);
  });
});

describe('gemmBf16 argument errors', () => {
  const w = packBf16Weights(new Uint16Array(6), 3, 2);
  it('names the call, the parameter, the expectation and what came', () => {
    expect(() => gemmBf16(new Float32Array(3), 1, w)).toThrow(
      'gemmBf16: x: expected Float32Array of length 2 (m*w.k), got Float32Array of length 3',
    );
    expect(() => gemmBf16(new Float64Array(2) as unknown as Float32Array, 1, w)).toThrow(
      /gemmBf16: x: expected Float32Array of length 2 \(m\*w\.k\), got Float64Array/,
    );
    expect(() => gemmBf16(new Float32Array(2), 1.5, w)).toThrow(/gemmBf16: m: expected an integer/);
    expect(() => gemmBf16(new Float32Array(2), 1, w, new Float32Array(2))).toThrow(
      /gemmBf16: out: expected Float32Array of length 3/,
    );
    expect(() => packBf16Weights(new Uint16Array(5), 3, 2)).toThrow(
      /packBf16Weights: w: expected Uint16Array of length 6/,
    );
    expect(() => gemmBf16(new Float32Array(2), 1, w, undefined, 'fp8' as 'f32')).toThrow(
      'gemmBf16: activations: expected one of "f32", "bf16", "bf16x2", got string "fp8"',
    );
    expect(() => gemmBf16Async(new Float32Array(3), 1, w)).toThrow(
      /gemmBf16Async: x: expected Float32Array of length 2/,
    );
  });

  it('rejects bad arguments in the native layer too (no crash), with a code', () => {
    // Test-only: reach the raw binding (same cached instance as addon.ts) to bypass the TS checks.
    const raw = createRequire(import.meta.url)(addonPath) as {
      gemmBf16(x: Float32Array, m: number, k: number, p: Uint16Array, n: number, y: Float32Array): void;
    };
    try {
      raw.gemmBf16(new Float32Array(2), 1, 2, new Uint16Array(4), 3, new Float32Array(3));
      expect.unreachable();
    } catch (e) {
      expect((e as Error).message).toBe(
        'gemmBf16: packed: expected Uint16Array of length 512 (packedBf16Length(n, k)), got Uint16Array of length 4',
      );
      expect((e as { code?: string }).code).toBe('ERR_SPECD_INVALID_ARG');
    }
    expect(() => raw.gemmBf16(new Float32Array(2), -1, 2, new Uint16Array(512), 3, new Float32Array(3))).toThrow(
      'gemmBf16: m: expected an integer in [0, 1099511627776], got -1',
    );
  });
});
