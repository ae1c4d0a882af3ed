/** The engine's PRNG: one seeded stream per request, shared by its drafts and its verification. */

import type { RandomSource } from '../plugin/drafter-plugin.js';

/** mulberry32: a small, fast, seeded PRNG; `next()` returns a float in [0, 1). */
export class SeededRandom implements RandomSource {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0;
  }
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
}
