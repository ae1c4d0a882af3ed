/**
 * Test support: seeded random inputs, NaN poisoning, float64 references and error metrics.
 * Plain loops on purpose (llm.c style): the reference must be obviously right, not fast.
 */
import { isa, setIsa, type IsaName } from '@specd/native';

/** Mulberry32: small seeded PRNG; seeds are printed by failing tests. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A fresh seed per run (printed in messages so a failure can be replayed). */
export function freshSeed(): number {
  return (Math.random() * 2 ** 31) >>> 0;
}

/** Float32Array [n] uniform in [-scale, scale). */
export function randomF32(n: number, next: () => number, scale = 1): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = (next() * 2 - 1) * scale;
  return a;
}

/** NaN-filled Float32Array [n]: an output the kernel must overwrite completely. */
export function poisoned(n: number): Float32Array {
  return new Float32Array(n).fill(Number.NaN);
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** Reference f32 -> bf16 bits, round to nearest even (NaN -> quiet NaN). */
export function bf16Bits(x: number): number {
  f32[0] = x;
  const u = u32[0]!;
  if ((u & 0x7fffffff) > 0x7f800000) return ((u >>> 16) | 0x40) & 0xffff;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

/** Exact bf16 bits -> number. */
export function bf16Value(bits: number): number {
  u32[0] = (bits & 0xffff) << 16;
  return f32[0]!;
}

/** ‖out − ref‖₂ / ‖ref‖₂ (Infinity when out has a NaN where ref has none). */
export function relError(out: ArrayLike<number>, ref: ArrayLike<number>): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < ref.length; i++) {
    const d = out[i]! - ref[i]!;
    if (Number.isNaN(d)) return Number.POSITIVE_INFINITY;
    num += d * d;
    den += ref[i]! * ref[i]!;
  }
  return Math.sqrt(num) / Math.sqrt(den || 1);
}

/** First mismatching indices of two arrays as text, for failure messages. */
export function firstMismatches(out: ArrayLike<number>, ref: ArrayLike<number>, tol = 0, max = 5): string {
  const lines: string[] = [];
  for (let i = 0; i < ref.length && lines.length < max; i++) {
    const a = out[i]!;
    const b = ref[i]!;
    if (!(Math.abs(a - b) <= tol * Math.max(1, Math.abs(b))) && !Object.is(a, b))
      lines.push(`[${i}] got ${a} want ${b}`);
  }
  return lines.join('; ');
}

/** Index of the first element where a and b differ bitwise, or -1. */
export function firstBitDifference(a: Float32Array, b: Float32Array): number {
  const ua = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const ub = new Uint32Array(b.buffer, b.byteOffset, b.length);
  if (ua.length !== ub.length) return 0;
  for (let i = 0; i < ua.length; i++) if (ua[i] !== ub[i]) return i;
  return -1;
}

/** ISA paths this machine can run: always "portable", plus "avx512" when available. */
export function isaPaths(): IsaName[] {
  return isa().avx512Available ? ['avx512', 'portable'] : ['portable'];
}

/** Runs fn with the given ISA path selected, restoring auto detection afterwards. */
export function withIsa<T>(path: IsaName, fn: () => T): T {
  setIsa(path);
  try {
    return fn();
  } finally {
    setIsa('auto');
  }
}

// Tolerances, scaled to the arithmetic under test (relative L2 error).
/** f32 elementwise math (exp, products): a few ulp of f32. */
export const TOL_F32 = 2e-6;
/** f32 dot products of length k: accumulation error grows ~ sqrt(k) ulp. */
export const tolDot = (k: number): number => 4 * 2 ** -24 * Math.sqrt(k) + 1e-7;
