// The engine's sampler (probs.ts, random.ts; plain and speculative decoding): greedy path, seeded
// reproducibility, top-k / top-p support, and a distribution test.
import { describe, expect, it } from 'vitest';

import { greedyToken, nextToken, sampleToken, SeededRandom } from '../../src/engine/index.js';

const logits = Float32Array.from([1.0, 3.0, 2.0, 0.5, 2.5, -1]);

describe('sampling', () => {
  it('greedy = argmax; temperature 0 takes the greedy path', () => {
    expect(greedyToken(logits)).toBe(1);
    expect(nextToken(logits, { temperature: 0 }, new SeededRandom(1))).toBe(1);
  });
  it('same seed → same draws; top-k 1 is greedy; top-k / top-p keep only the allowed tokens', () => {
    const draw = (seed: number) => {
      const r = new SeededRandom(seed);
      return Array.from({ length: 50 }, () => sampleToken(logits, { temperature: 1 }, r));
    };
    expect(draw(3)).toEqual(draw(3));
    expect(draw(3)).not.toEqual(draw(4));
    const r = new SeededRandom(9);
    for (let i = 0; i < 200; i++) {
      expect(sampleToken(logits, { temperature: 1, topK: 1 }, r)).toBe(1);
      expect([1, 4]).toContain(sampleToken(logits, { temperature: 1, topK: 2 }, r));
      expect([1, 4, 2]).toContain(sampleToken(logits, { temperature: 1, topP: 0.8 }, r));
    }
    expect(() => sampleToken(logits, { temperature: 0 }, r)).toThrow(/temperature/);
  });
  it('draw frequencies follow softmax(logits / T) (chi-square, 6 categories)', () => {
    const T = 0.7;
    const p = Array.from(logits, (x) => Math.exp(x / T));
    const z = p.reduce((a, b) => a + b, 0);
    const n = 20000;
    const counts = new Array<number>(logits.length).fill(0);
    const r = new SeededRandom(12345);
    for (let i = 0; i < n; i++) counts[sampleToken(logits, { temperature: T }, r)]!++;
    let chi2 = 0;
    p.forEach((pi, i) => {
      const e = (n * pi) / z;
      chi2 += (counts[i]! - e) ** 2 / e;
    });
    expect(chi2).toBeLessThan(20.5); // 5 dof, p ≈ 0.001
  });
});
