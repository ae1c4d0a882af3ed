/** The engine's PRNG: one seeded stream per request, shared by its drafts and its verification. */

import type { RandomSource } from '../plugin/drafter-plugin.js';

/** The increment of mulberry32's state per draw. */
const STEP = 0x6d2b79f5;

/**
 * mulberry32: a small, fast, seeded PRNG; `next()` returns a float in [0, 1). Its state after n draws
 * is `seed + n · 0x6d2b79f5 (mod 2³²)`, so a stream can continue elsewhere from (seed, draws) alone
 * ({@link SeededRandom.resume}: a decode instance continues a request its prefill instance sampled from).
 */
export class SeededRandom implements RandomSource {
  private state: number;
  /** Draws taken so far. */
  draws = 0;
  constructor(readonly seed: number) {
    this.state = seed >>> 0;
  }

  /** The stream of `seed` after `draws` draws (O(1)). @throws {RangeError} for draws not a non-negative integer. */
  static resume(seed: number, draws: number): SeededRandom {
    if (!(Number.isSafeInteger(draws) && draws >= 0))
      throw new RangeError(`SeededRandom.resume: draws: expected an integer >= 0, got ${draws}`);
    const r = new SeededRandom(seed);
    r.state = (r.state + Number((BigInt(draws) * BigInt(STEP)) % 4294967296n)) >>> 0;
    r.draws = draws;
    return r;
  }

  /**
   * Sets the stream back to where it stood after `draws` draws (a batched call that threw consumed draws the
   * retry takes again). @throws {RangeError} for draws not an integer in [0, this.draws].
   */
  rewind(draws: number): void {
    if (!(Number.isSafeInteger(draws) && draws >= 0 && draws <= this.draws))
      throw new RangeError(`SeededRandom.rewind: draws: expected an integer in [0, ${this.draws}], got ${draws}`);
    this.state = SeededRandom.resume(this.seed, draws).state;
    this.draws = draws;
  }

  next(): number {
    this.draws++;
    this.state = (this.state + STEP) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
}
