/** Shared helpers for io tests: temp dirs and a deterministic PRNG. */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

/** Creates a fresh temporary directory (removed by the caller via `rmSync`). */
export function makeTempDir(prefix: string): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), `specd-${prefix}-`));
}

/** mulberry32: small deterministic PRNG returning floats in [0, 1). */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** `n` bytes drawn from `next` (a {@link prng}). */
export function randomBytes(n: number, next: () => number): Uint8Array {
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i++) out[i] = Math.floor(next() * 256);
  return out;
}
