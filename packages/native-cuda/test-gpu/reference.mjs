// CPU references for the GPU tests and bench (plain JavaScript, fp64 sums): bf16 rounding as the device's
// __float2bfloat16_rn, and a seeded generator.

/** A seeded PRNG (mulberry32) in [0, 1). */
export function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The bf16 bits of `x` (round to nearest even; finite inputs). */
export function bf16Bits(x) {
  f32[0] = x;
  const u = u32[0];
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

/** The float value of bf16 bits. */
export function bf16Value(bits) {
  u32[0] = bits << 16;
  return f32[0];
}

/** `n` values uniform in [-scale, scale), as bf16 bits and their values. */
export function randomBf16(n, next, scale = 1) {
  const bits = new Uint16Array(n);
  const values = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    bits[i] = bf16Bits((next() * 2 - 1) * scale);
    values[i] = bf16Value(bits[i]);
  }
  return { bits, values };
}

/**
 * χ² of `counts` against probabilities `p` over `n` draws, bins with an expected count below 5 merged into one;
 * → {stat, df}.
 */
export function chiSquare(counts, p, n) {
  let stat = 0;
  let df = -1;
  let restO = 0;
  let restE = 0;
  for (let i = 0; i < p.length; i++) {
    const e = p[i] * n;
    if (e >= 5) {
      stat += (counts[i] - e) ** 2 / e;
      df++;
    } else {
      restO += counts[i];
      restE += e;
    }
  }
  if (restE > 0) {
    stat += (restO - restE) ** 2 / Math.max(restE, 1e-9);
    df++;
  }
  return { stat, df };
}

/** The χ² critical value at p = 1e-4 for `df` degrees of freedom (Wilson–Hilferty). */
export const chiCrit = (df) => df * (1 - 2 / (9 * df) + 3.719 * Math.sqrt(2 / (9 * df))) ** 3;
