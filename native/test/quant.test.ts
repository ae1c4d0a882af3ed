// GEMM over GGUF-quantized weights (Q4_0, Q4_1, Q8_0): accuracy vs a float64 reference written
// from the ggml block spec (independent of the C++), extreme scales, bitwise batch and thread
// invariance, async == sync, dequantizeToBf16, guard pages, argument errors. Both ISA paths.
import { createRequire } from 'node:module';
import { afterAll, describe, expect, it } from 'vitest';
import {
  addonPath,
  dequantizeToBf16,
  gemmBf16,
  gemmQuant,
  gemmQuantAsync,
  guardedFloat32Array,
  isa,
  packBf16Weights,
  quantPackedBytes,
  quantRawBytes,
  quantizedWeights,
  setIsa,
  setNumThreads,
  type QuantizedWeights,
  type QuantType,
} from '@specd/native';
import {
  bf16Bits,
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

const TYPES: QuantType[] = ['q4_0', 'q4_1', 'q8_0'];
const BLOCK_BYTES: Record<QuantType, number> = { q4_0: 18, q4_1: 20, q8_0: 34 };

/** IEEE binary16 bits -> number (exact). */
function f16(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 31;
  const f = h & 1023;
  if (e === 0) return sign * f * 2 ** -24;
  if (e === 31) return f ? Number.NaN : sign * Number.POSITIVE_INFINITY;
  return sign * (1 + f / 1024) * 2 ** (e - 15);
}

/** Random finite f16 bits with exponent field in [eLo, eHi] and a random sign. */
function randomF16(next: () => number, eLo = 5, eHi = 12): number {
  const e = eLo + Math.floor(next() * (eHi - eLo + 1));
  return ((next() < 0.5 ? 0x8000 : 0) | (e << 10) | Math.floor(next() * 1024)) & 0xffff;
}

/** Scales chosen from the extremes: max, subnormal min/max, min normal, zero, negatives. */
const EXTREME_F16 = [0x7bff, 0xfbff, 0x0001, 0x8001, 0x03ff, 0x0400, 0x0000, 0x8000, 0x3c00, 0xd800];

interface RawTensor {
  bytes: Uint8Array;
  /** Exact dequantized weights W [n, k] (float64, from the block spec). */
  values: Float64Array;
}

/**
 * Random raw GGUF tensor [n, k] of `type` and its float64 dequantization, written from the ggml
 * block formats: Q4_0 {f16 d; u8 qs[16]}: w[j] = d·(lo−8), w[j+16] = d·(hi−8); Q4_1 {f16 d, m;
 * u8 qs[16]}: w = d·nibble + m (same nibble order); Q8_0 {f16 d; i8 qs[32]}: w[j] = d·qs[j].
 */
function randomTensor(type: QuantType, n: number, k: number, next: () => number, extreme = false): RawTensor {
  const blocks = k / 32;
  const bb = BLOCK_BYTES[type];
  const bytes = new Uint8Array(n * blocks * bb);
  const view = new DataView(bytes.buffer);
  const values = new Float64Array(n * k);
  const scale = () => (extreme ? EXTREME_F16[Math.floor(next() * EXTREME_F16.length)]! : randomF16(next));
  for (let row = 0; row < n; row++)
    for (let b = 0; b < blocks; b++) {
      const off = (row * blocks + b) * bb;
      const dBits = scale();
      view.setUint16(off, dBits, true);
      const d = f16(dBits);
      const out = row * k + b * 32;
      if (type === 'q8_0') {
        for (let j = 0; j < 32; j++) {
          const q = Math.floor(next() * 256) - 128;
          view.setInt8(off + 2 + j, q);
          values[out + j] = d * q;
        }
        continue;
      }
      let m = 0;
      if (type === 'q4_1') {
        const mBits = extreme ? scale() : randomF16(next) | (next() < 0.7 ? 0x8000 : 0); // mostly negative mins
        view.setUint16(off + 2, mBits, true);
        m = f16(mBits);
      }
      const qs = off + (type === 'q4_1' ? 4 : 2);
      for (let j = 0; j < 16; j++) {
        const lo = Math.floor(next() * 16);
        const hi = Math.floor(next() * 16);
        bytes[qs + j] = lo | (hi << 4);
        values[out + j] = type === 'q4_1' ? d * lo + m : d * (lo - 8);
        values[out + j + 16] = type === 'q4_1' ? d * hi + m : d * (hi - 8);
      }
    }
  return { bytes, values };
}

/** float64 reference Y[m, n] = X[m, k] · W[n, k]ᵀ. */
function referenceGemm(x: Float32Array, w: Float64Array, m: number, n: number, k: number): Float64Array {
  const y = new Float64Array(m * n);
  for (let i = 0; i < m; i++)
    for (let j = 0; j < n; j++) {
      let s = 0;
      for (let l = 0; l < k; l++) s += x[i * k + l]! * w[j * k + l]!;
      y[i * n + j] = s;
    }
  return y;
}

/**
 * Checks Y against the float64 reference: every output within the fp32 dot-product bound
 * (k+2)·2⁻²⁴·Σ|x·w| (this also holds with cancellation, and with rows mixing scales 65504 and
 * 2⁻²⁴), and, over 32 outputs or more, the relative L2 error below tolDot(k).
 */
function expectClose(
  y: Float32Array,
  x: Float32Array,
  values: Float64Array,
  m: number,
  n: number,
  k: number,
  what: string,
): void {
  const ref = referenceGemm(x, values, m, n, k);
  for (let i = 0; i < m * n; i++) {
    const row = Math.floor(i / n) * k;
    const col = (i % n) * k;
    let mag = 0;
    for (let l = 0; l < k; l++) mag += Math.abs(x[row + l]! * values[col + l]!);
    expect(
      Math.abs(y[i]! - ref[i]!),
      `${what} m=${m} n=${n} k=${k} out ${i}: ${y[i]} vs ${ref[i]}`,
    ).toBeLessThanOrEqual((k + 2) * 2 ** -24 * mag + 1e-30);
  }
  if (m * n >= 32) {
    const err = relError(y, ref);
    expect(err, `${what} m=${m} n=${n} k=${k}: rel err ${err}; ${firstMismatches(y, ref, 1e-4)}`).toBeLessThan(
      tolDot(k),
    );
  }
}

function gemm(x: Float32Array, m: number, w: QuantizedWeights): Float32Array {
  return gemmQuant(x, m, w, poisoned(m * w.n));
}

const shapes: Array<[m: number, n: number, k: number]> = [
  [1, 16, 32],
  [1, 1, 32],
  [3, 17, 64],
  [5, 45, 576],
  [1, 130, 1536],
  [16, 33, 576],
  [9, 20, 1536],
  [33, 7, 96],
];

afterAll(() => {
  setIsa('auto');
  setNumThreads(isa().threads);
});

describe.each(isaPaths())('gemmQuant on the %s path', (path) => {
  describe.each(TYPES)('%s', (type) => {
    it.each(shapes)('matches float64 at m=%i n=%i k=%i', (m, n, k) => {
      const seed = freshSeed();
      const next = rng(seed);
      const { bytes, values } = randomTensor(type, n, k, next);
      const w = quantizedWeights(bytes, type, n, k);
      const x = randomF32(m * k, next);
      const y = withIsa(path, () => gemm(x, m, w));
      expectClose(y, x, values, m, n, k, `seed ${seed}:`);
    });

    it('matches float64 with extreme scales (f16 max, subnormals, zero, negative d and m)', () => {
      const seed = freshSeed();
      const next = rng(seed);
      for (const [m, n, k] of [
        [1, 19, 64],
        [4, 33, 576],
      ] as const) {
        const { bytes, values } = randomTensor(type, n, k, next, true);
        const w = quantizedWeights(bytes, type, n, k);
        const x = randomF32(m * k, next);
        const y = withIsa(path, () => gemm(x, m, w));
        expectClose(y, x, values, m, n, k, `seed ${seed}:`);
      }
    });

    it(
      'is batch and thread invariant: row i of every GEMM (m = ' +
        '1..33, 1..3 threads) equals the GEMV of row i, bit for bit',
      () => {
        const seed = freshSeed();
        const next = rng(seed);
        const [n, k] = [150, 576]; // 10 panels (n not a multiple of 16); large m splits over threads
        const w = quantizedWeights(randomTensor(type, n, k, next).bytes, type, n, k);
        const x = randomF32(33 * k, next);
        const threads = isa().threads;
        withIsa(path, () => {
          try {
            setNumThreads(1);
            const gemv = Array.from({ length: 33 }, (_, i) => gemm(x.subarray(i * k, (i + 1) * k), 1, w));
            for (const t of [1, 2, 3]) {
              setNumThreads(t);
              for (let m = 1; m <= 33; m++) {
                const offset = (m * 7) % (34 - m); // a row's position in the batch changes with m
                const y = gemm(x.subarray(offset * k, (offset + m) * k), m, w);
                for (let i = 0; i < m; i++) {
                  const diff = firstBitDifference(y.subarray(i * n, (i + 1) * n), gemv[offset + i]!);
                  expect(
                    diff,
                    `seed ${seed}: threads=${t} m=${m} row ${i} (x row ${offset + i}) differs at column ${diff}`,
                  ).toBe(-1);
                }
              }
            }
          } finally {
            setNumThreads(threads);
          }
        });
      },
    );

    it('async equals sync bit for bit', async () => {
      const next = rng(freshSeed());
      const [m, n, k] = [5, 48, 128];
      const w = quantizedWeights(randomTensor(type, n, k, next).bytes, type, n, k);
      const x = randomF32(m * k, next);
      setIsa(path);
      try {
        const sync = gemm(x, m, w);
        const many = await Promise.all(Array.from({ length: 4 }, () => gemmQuantAsync(x, m, w, poisoned(m * n))));
        for (const y of many) expect(firstBitDifference(sync, y)).toBe(-1);
      } finally {
        setIsa('auto');
      }
    });

    it('reads no float past X and writes none past Y (both end at a PROT_NONE page)', () => {
      const seed = freshSeed();
      const next = rng(seed);
      withIsa(path, () => {
        for (const k of [32, 64])
          for (const n of [1, 17, 40])
            for (let m = 1; m <= 9; m++) {
              const { bytes, values } = randomTensor(type, n, k, next);
              const w = quantizedWeights(bytes, type, n, k);
              const x = guardedFloat32Array(m * k);
              x.set(randomF32(m * k, next));
              const y = guardedFloat32Array(m * n);
              y.fill(Number.NaN);
              gemmQuant(x, m, w, y);
              expectClose(y, x, values, m, n, k, `seed ${seed}:`);
            }
      });
    });
  });
});

describe('dequantizeToBf16', () => {
  it.each(TYPES)('%s: gives bf16(fp32(d·q + m)) row-major [n, k], also with extreme scales', (type) => {
    const seed = freshSeed();
    const next = rng(seed);
    for (const extreme of [false, true]) {
      const [n, k] = [21, 96];
      const { bytes, values } = randomTensor(type, n, k, next, extreme);
      const bits = dequantizeToBf16(quantizedWeights(bytes, type, n, k));
      expect(bits.length).toBe(n * k);
      for (let i = 0; i < n * k; i++) {
        // values[i] is exact in float64; the kernel rounds it to fp32 once, then to bf16 (RNE).
        expect(bits[i], `seed ${seed}: weight ${i} = ${values[i]}`).toBe(bf16Bits(Math.fround(values[i]!)));
      }
    }
  });

  it('feeds the bf16 GEMM: gemmBf16 on the packed bf16 copy is close to gemmQuant', () => {
    const next = rng(freshSeed());
    const [m, n, k] = [3, 40, 576];
    const w = quantizedWeights(randomTensor('q4_1', n, k, next).bytes, 'q4_1', n, k);
    const x = randomF32(m * k, next);
    const yq = gemm(x, m, w);
    const yb = gemmBf16(x, m, packBf16Weights(dequantizeToBf16(w), n, k));
    expect(relError(yb, Float64Array.from(yq))).toBeLessThan(1e-2); // bf16 keeps 8 significant bits
  });
});

describe('quantized weights: sizes and argument errors', () => {
  it('computes raw and packed sizes (packed = raw with n padded to 16)', () => {
    expect(quantRawBytes('q4_1', 576, 576)).toBe(576 * 18 * 20);
    expect(quantPackedBytes('q4_1', 576, 576)).toBe(576 * 18 * 20);
    expect(quantRawBytes('q8_0', 49152, 576)).toBe(49152 * 18 * 34);
    expect(quantPackedBytes('q4_0', 17, 32)).toBe(32 * 18);
  });

  it('names the call, the parameter, the expectation and what came', () => {
    const w = quantizedWeights(new Uint8Array(3 * 20), 'q4_1', 3, 32);
    expect(() => quantizedWeights(new Uint8Array(40), 'q4_1', 2, 48)).toThrow(
      'quantizedWeights: k: expected a positive multiple of 32 (the GGUF block size), got number 48',
    );
    expect(() => quantizedWeights(new Uint8Array(39), 'q4_1', 2, 32)).toThrow(
      'quantizedWeights: data: expected Uint8Array of length 40 (n*(k/32)*blockBytes), got Uint8Array of length 39',
    );
    expect(() => quantizedWeights(new Uint8Array(40), 'q5_0' as QuantType, 2, 32)).toThrow(
      'quantizedWeights: type: expected one of "q4_0", "q4_1", "q8_0", got string "q5_0"',
    );
    expect(() => quantizedWeights(new Uint16Array(20) as unknown as Uint8Array, 'q4_1', 2, 32)).toThrow(
      /quantizedWeights: data: expected Uint8Array of length 40 .*got Uint16Array of length 20/,
    );
    expect(() => gemmQuant(new Float32Array(31), 1, w)).toThrow(
      'gemmQuant: x: expected Float32Array of length 32 (m*w.k), got Float32Array of length 31',
    );
    expect(() => gemmQuant(new Float32Array(32), 1.5, w)).toThrow(/gemmQuant: m: expected an integer/);
    expect(() => gemmQuant(new Float32Array(32), 1, w, new Float32Array(2))).toThrow(
      /gemmQuant: out: expected Float32Array of length 3/,
    );
    expect(() => gemmQuant(new Float32Array(32), 1, { ...w, data: new Uint8Array(5) } as typeof w)).toThrow(
      /gemmQuant: w.data: expected Uint8Array of length 320/,
    );
    expect(() => gemmQuantAsync(new Float32Array(3), 1, w)).toThrow(
      /gemmQuantAsync: x: expected Float32Array of length 32/,
    );
    expect(() => dequantizeToBf16(w, new Uint16Array(5))).toThrow(
      /dequantizeToBf16: out: expected Uint16Array of length 96/,
    );
  });

  it('rejects bad arguments in the native layer too (no crash), with a code', () => {
    const raw = createRequire(import.meta.url)(addonPath) as {
      gemmQuant(x: Float32Array, m: number, k: number, p: Uint8Array, type: string, n: number, y: Float32Array): void;
      quantPack(src: Uint8Array, type: string, n: number, k: number, out: Uint8Array): void;
    };
    const call = (fn: () => void): { message: string; code?: string } => {
      try {
        fn();
      } catch (e) {
        return e as { message: string; code?: string };
      }
      throw new Error('no error');
    };
    let e = call(() => raw.gemmQuant(new Float32Array(32), 1, 32, new Uint8Array(4), 'q4_1', 3, new Float32Array(3)));
    expect(e.message).toBe(
      'gemmQuant: packed: expected Uint8Array of length 320 (quantPackedBytes(type, n, k)), got Uint8Array of length 4',
    );
    expect(e.code).toBe('ERR_SPECD_INVALID_ARG');
    e = call(() => raw.gemmQuant(new Float32Array(33), 1, 33, new Uint8Array(320), 'q4_1', 3, new Float32Array(3)));
    expect(e.message).toBe('gemmQuant: k: expected a positive multiple of 32 (the GGUF block size), got 33');
    e = call(() => raw.quantPack(new Uint8Array(20), 'f16', 1, 32, new Uint8Array(320)));
    expect(e.message).toBe('quantPack: type: expected one of "q4_0", "q4_1", "q8_0", got string "f16"');
    e = call(() => raw.quantPack(new Float32Array(5) as unknown as Uint8Array, 'q4_1', 1, 32, new Uint8Array(320)));
    expect(e.message).toBe(
      'quantPack: src: expected Uint8Array of length 20 (n*(k/32)*blockBytes), got Float32Array of length 5',
    );
    expect(e.code).toBe('ERR_SPECD_INVALID_ARG');
  });
});
