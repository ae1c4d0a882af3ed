// A draft's confidence (draftsFromLogits with withConfidence; DFlash's setting `confidence`): the largest probability
// of its row's draft distribution — greedy, softmax(logits)'s entry at the argmax; sampled, the largest entry of q
// (temperature / top-k / top-p over the draft vocabulary) — with the tokens and q exactly those of a call without it
// (the same PRNG draws), over the whole vocabulary and a reduced one.
import { describe, expect, it } from 'vitest';

import { SeededRandom } from '@specd/core';

import { draftsFromLogits } from '../src/index.js';

const V = 512;
const K = 5;
/** Logits `[K, V]` with a spread like a draft head's (a few large entries per row). */
function logitsOf(seed: number): Float32Array {
  const rng = new SeededRandom(seed);
  const x = Float32Array.from({ length: K * V }, () => 4 * (rng.next() - 0.5));
  for (let j = 0; j < K; j++) x[j * V + ((37 * j + 11) % V)]! += 3 + j;
  return x;
}

/** softmax(row)'s largest entry, in float64. */
function topProb(row: Float32Array): number {
  let max = -Infinity;
  for (const v of row) max = Math.max(max, v);
  let sum = 0;
  for (const v of row) sum += Math.exp(v - max);
  return 1 / sum;
}

describe('draftsFromLogits: confidences', () => {
  // a reduced draft vocabulary of 256 ids (every second one)
  const IDS = Int32Array.from({ length: V / 2 }, (_, i) => 2 * i);
  for (const ids of [undefined, IDS]) {
    const Vd = ids?.length ?? V;
    const what = ids === undefined ? 'whole vocabulary' : 'reduced vocabulary';

    it(`greedy (${what}): softmax's largest probability of each row, the same tokens`, () => {
      const logits = logitsOf(1).subarray(0, K * Vd);
      const plain = draftsFromLogits(logits, K, ids, V, { temperature: 0 }, new SeededRandom(0));
      const withC = draftsFromLogits(logits, K, ids, V, { temperature: 0 }, new SeededRandom(0), true);
      expect(plain.confidence).toBeUndefined();
      expect(withC.tokens).toEqual(plain.tokens);
      expect(withC.confidence!.length).toBe(K);
      for (let j = 0; j < K; j++) {
        const want = topProb(logits.subarray(j * Vd, (j + 1) * Vd));
        expect(Math.abs(withC.confidence![j]! - want) / want).toBeLessThan(1e-5);
      }
    });

    it(`sampled (${what}): q's largest entry of each row, the same draws and q`, () => {
      const logits = logitsOf(2).subarray(0, K * Vd);
      const sampling = { temperature: 0.8, topK: 50, topP: 0.9 };
      const plain = draftsFromLogits(logits, K, ids, V, sampling, new SeededRandom(5));
      const withC = draftsFromLogits(logits, K, ids, V, sampling, new SeededRandom(5), true);
      expect(plain.confidence).toBeUndefined();
      expect(withC.tokens).toEqual(plain.tokens);
      expect(withC.probs).toEqual(plain.probs);
      // q over the draft vocabulary: [K, Vd], its columns named by probsIds (the head's ids) when reduced
      expect(withC.probsIds).toBe(ids);
      const W = ids?.length ?? V;
      expect(withC.probs!.length).toBe(K * W);
      for (let j = 0; j < K; j++) {
        const q = withC.probs!.subarray(j * W, (j + 1) * W);
        let max = 0;
        for (const v of q) max = Math.max(max, v);
        expect(withC.confidence![j]).toBe(max);
        // top-p over a peaked row keeps few tokens: the largest is a real probability, not 1 / Vd
        expect(max).toBeGreaterThan(2 / Vd);
      }
    });
  }
});
