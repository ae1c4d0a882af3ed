// The online calibration of drafters' per-draft confidences (engine/confidence-model.ts): a prior that takes a
// confidence at its word, learning what a bin's drafts are accepted at, isotonic in the confidence, and fading.
import { describe, expect, it } from 'vitest';

import { ConfidenceCalibration, SeededRandom } from '../../src/engine/index.js';

describe('ConfidenceCalibration', () => {
  it('before any observation a confidence is taken at its word (its bin middle)', () => {
    const cal = new ConfidenceCalibration();
    expect(cal.map(0.55)).toBeCloseTo(0.55, 10);
    expect(cal.map(0.05)).toBeCloseTo(0.05, 10);
    expect(cal.map(0.97)).toBeCloseTo(0.97, 10);
    // out of range and NaN clamp to the end bins
    expect(cal.map(Number.NaN)).toBe(cal.map(0));
    expect(cal.map(1.5)).toBe(cal.map(0.999));
  });

  it('learns an under-confident drafter: its drafts accepted at min(1, c + 0.25)', () => {
    const cal = new ConfidenceCalibration(4, 1); // no fading
    const g = new SeededRandom(3);
    const rnd = () => g.next();
    for (let i = 0; i < 40_000; i++) {
      const c = rnd();
      cal.observe(c, rnd() < Math.min(1, c + 0.25));
    }
    // the bins' means: c + 0.25 at the bin middle, within sampling error (n ≈ 4,000 per 0.1-wide bin)
    for (const c of [0.15, 0.35, 0.55]) expect(cal.map(c)).toBeCloseTo(c + 0.25, 1);
    expect(cal.map(0.85)).toBeGreaterThan(0.97);
    // non-decreasing in c
    const curve = cal.curve();
    for (let b = 1; b < curve.length; b++) expect(curve[b]!).toBeGreaterThanOrEqual(curve[b - 1]!);
  });

  it('pools adjacent bins that contradict the order (pool-adjacent-violators)', () => {
    const cal = new ConfidenceCalibration(1e-6, 1);
    // bin [0.6, 0.7): 90 of 100 accepted; bin [0.7, 0.8): 70 of 100 — pooled: 160 of 200
    for (let i = 0; i < 100; i++) cal.observe(0.65, i < 90);
    for (let i = 0; i < 100; i++) cal.observe(0.75, i < 70);
    expect(cal.map(0.65)).toBeCloseTo(0.8, 4);
    expect(cal.map(0.75)).toBeCloseTo(0.8, 4);
  });

  it('fades old evidence back toward the prior', () => {
    const cal = new ConfidenceCalibration(4, 0.99);
    for (let i = 0; i < 200; i++) cal.observe(0.35, true);
    expect(cal.map(0.35)).toBeGreaterThan(0.9);
    // 1,000 observations elsewhere: the weight of the 200 fell by 0.99^1000 (~4e-5)
    for (let i = 0; i < 1000; i++) cal.observe(0.05, false);
    expect(cal.map(0.35)).toBeCloseTo(0.35, 2);
  });
});
