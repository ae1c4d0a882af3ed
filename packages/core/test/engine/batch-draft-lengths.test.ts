// The batch draft-length rule (engine/batch-draft-lengths.ts) on synthetic cost curves of a batched verify of T rows:
// exact against an exhaustive search when the cost depends on T alone, drafts that fill the free rows of a flat
// curve and go to the sequences that accept most (TETRIS), nothing on a compute-bound curve, the catch-up rows
// charged, and its argument checks.
import { describe, expect, it } from 'vitest';

import {
  type BatchDraftItem,
  type BatchShape,
  CostDraftPolicy,
  chooseBatchDraftLengths,
  isotonic,
  lowerMedian,
  partialDrafts,
  pointMs,
  RequestMetrics,
  recheckJumps,
  StepCosts,
  type VerifyPoint,
} from '../../src/engine/index.js';

/** E[committed | k] for k = 0 … a.length from conditional acceptances a_j (as the acceptance estimator). */
function gainsOf(a: readonly number[]): number[] {
  const out = [1];
  let p = 1;
  for (const x of a) {
    p *= x;
    out.push(out[out.length - 1]! + p);
  }
  return out;
}
const item = (a: readonly number[], catchUpRows = 0): BatchDraftItem => ({ gains: gainsOf(a), catchUpRows });

/** A mulberry32 PRNG (the test's inputs are reproducible). */
function rng(seed: number): () => number {
  let t = seed >>> 0;
  return () => {
    t = (t + 0x6d2b79f5) >>> 0;
    let x = Math.imul(t ^ (t >>> 15), 1 | t);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

/** The best goodput over every (k_1 … k_B) by exhaustive search. */
function bruteForce(items: readonly BatchDraftItem[], cost: (s: BatchShape) => number): number {
  let best = 0;
  const ks = items.map(() => 0);
  const visit = (s: number): void => {
    if (s === items.length) {
      const drafts = ks.reduce((a, k) => a + k, 0);
      const drafting = ks.filter((k) => k > 0).length;
      const catchUpRows = ks.reduce((a, k, i) => a + (k > 0 ? items[i]!.catchUpRows : 0), 0);
      const committed = ks.reduce((a, k, i) => a + items[i]!.gains[k]!, 0);
      const shape = { sequences: items.length, tokens: items.length + drafts, drafting, drafts, catchUpRows };
      best = Math.max(best, committed / cost(shape));
      return;
    }
    for (let k = 0; k < items[s]!.gains.length; k++) {
      ks[s] = k;
      visit(s + 1);
    }
    ks[s] = 0;
  };
  visit(0);
  return best;
}

describe('chooseBatchDraftLengths', () => {
  it('is exact against an exhaustive search when the verify cost depends on T alone (200 random batches)', () => {
    const next = rng(16);
    let drafted = 0;
    for (let trial = 0; trial < 200; trial++) {
      const B = 1 + Math.floor(next() * 4);
      const items = Array.from({ length: B }, () => item(Array.from({ length: Math.floor(next() * 5) }, () => next())));
      // flat up to `free` rows (a GEMM tile still memory-bound), then linear (compute-bound)
      const base = 5 + 10 * next();
      const free = B + Math.floor(next() * 6);
      const slope = 0.5 + 4 * next();
      const cost = (s: BatchShape): number => base + slope * Math.max(0, s.tokens - free);
      const choice = chooseBatchDraftLengths(items, cost);
      const best = bruteForce(items, cost);
      expect(choice.rate).toBeCloseTo(best, 10);
      // the reported rate is the rate of the reported ks
      const d = choice.ks.reduce((a, k) => a + k, 0);
      const committed = choice.ks.reduce((a, k, i) => a + items[i]!.gains[k]!, 0);
      expect(choice.committed).toBeCloseTo(committed, 10);
      expect(choice.costMs).toBeCloseTo(base + slope * Math.max(0, B + d - free), 10);
      choice.ks.forEach((k, i) => {
        expect(k).toBeGreaterThanOrEqual(0);
        expect(k).toBeLessThan(items[i]!.gains.length);
      });
      drafted += d;
    }
    expect(drafted).toBeGreaterThan(0); // the search space held drafting choices, not only plain steps
  });

  it('fills the free rows of a flat curve with the drafts most likely accepted (TETRIS order)', () => {
    // 8 sequences, 4 of them accept well; the verify costs 10 ms up to 12 rows, then 3 ms per row
    const good = [0.9, 0.9, 0.9, 0.9, 0.9];
    const poor = [0.2, 0.2, 0.2, 0.2, 0.2];
    const items = [good, poor, good, poor, good, poor, good, poor].map((a) => item(a));
    const choice = chooseBatchDraftLengths(items, (s) => 10 + 3 * Math.max(0, s.tokens - 12));
    expect(choice.ks).toEqual([1, 0, 1, 0, 1, 0, 1, 0]);
    // 16 free rows: the good ones take a second draft (0.81) before any poor one its first (0.2)
    const wide = chooseBatchDraftLengths(items, (s) => 10 + 3 * Math.max(0, s.tokens - 16));
    expect(wide.ks).toEqual([2, 0, 2, 0, 2, 0, 2, 0]);
  });

  it('drafts nothing on a compute-bound curve (a row costs what a plain token costs) at any acceptance < 1', () => {
    const items = Array.from({ length: 16 }, () => item([0.95, 0.95, 0.95]));
    const choice = chooseBatchDraftLengths(items, (s) => 7 * s.tokens + (s.drafting > 0 ? 1 : 0));
    expect(choice.ks).toEqual(new Array(16).fill(0));
    expect(choice.rate).toBeCloseTo(16 / (7 * 16), 12);
  });

  it('charges the catch-up rows: of two equal sequences the one whose draft context is current drafts', () => {
    const cost = (s: BatchShape): number => 10 + 0.5 * Math.max(0, s.tokens - 3) + 0.05 * s.catchUpRows;
    const behindFirst = chooseBatchDraftLengths([item([0.8], 400), item([0.8], 0)], cost);
    expect(behindFirst.ks).toEqual([0, 1]);
    // 400 rows of catch-up (20 ms) outweigh the gain of one draft: the behind sequence alone decodes plainly
    expect(chooseBatchDraftLengths([item([0.8], 400)], cost).ks).toEqual([0]);
    expect(chooseBatchDraftLengths([item([0.8], 0)], cost).ks).toEqual([1]);
  });

  it('refuses gains that do not start at 1 or decrease, and a cost that is not positive, naming them', () => {
    expect(() => chooseBatchDraftLengths([{ gains: [2, 3], catchUpRows: 0 }], () => 1)).toThrow(/items\[0\]\.gains/);
    expect(() => chooseBatchDraftLengths([item([0.5]), { gains: [1, 0.5], catchUpRows: 0 }], () => 1)).toThrow(
      /items\[1\]\.gains\[1\] = 0.5 < gains\[0\]/,
    );
    expect(() => chooseBatchDraftLengths([item([0.5])], () => 0)).toThrow(/cost of .*"tokens":1.*expected > 0 ms/);
    expect(chooseBatchDraftLengths([], () => 1)).toEqual({ ks: [], committed: 0, costMs: 0, rate: 0, curve: [] });
  });
});

describe('the calibrated curve', () => {
  it('partial blocks at 1, 2, 4, … drafting sequences; a noise spike is pooled, not carried forward', () => {
    expect(partialDrafts(16)).toEqual([1, 2, 4, 8]);
    expect(partialDrafts(5)).toEqual([1, 2, 4]);
    expect(partialDrafts(1)).toEqual([]);
    // T = 16, 18, 20, 24 rows: the spike at 18 (a preempted forward) would lift 20 and 24 to 48 ms under a running max
    const fit = isotonic([19, 48, 20, 21, 40]);
    expect(fit[0]).toBe(19);
    for (const x of fit.slice(1, 4)) expect(x).toBeCloseTo((48 + 20 + 21) / 3, 12);
    expect(fit[4]).toBe(40);
    expect(isotonic([1, 2, 2, 5])).toEqual([1, 2, 2, 5]); // already non-decreasing: unchanged
    expect(isotonic([3, 1])).toEqual([2, 2]);
  });

  /** Points at `rows` with the start-up samples `samples[i]` (ms). */
  const pointsOf = (rows: number[], samples: number[][]): VerifyPoint[] =>
    rows.map((r, i) => ({ rows: r, samples: [...samples[i]!], fresh: [] }));

  it('a verify point that jumped under load is timed again beside the one before it, and the jump goes', () => {
    // EAGLE-3 at one sequence as bench:load calibrated it: 9.8 ms for 5 rows, 17.3 for 6 (the host busy meanwhile)
    const pts = pointsOf([1, 5, 6, 7], [[4.8], [9.8, 9.9, 10.0], [17.3, 17.0, 17.6], [11.9, 12.2]]);
    const quiet = (p: VerifyPoint): number => 4.6 + 1.1 * (p.rows - 1);
    const timed = recheckJumps(pts, quiet);
    expect(timed).toBe(6); // one round: 3 × (the 5-row point, the 6-row point); the second round finds no jump
    expect(pts.map((p) => p.fresh.length)).toEqual([0, 3, 3, 0]);
    expect(pointMs(pts[2]!)).toBeCloseTo(quiet(pts[2]!), 12); // the fresh lower median, below the start-up one
    expect(pointMs(pts[1]!)).toBeCloseTo(quiet(pts[1]!), 12); // 9.9 (start-up) vs 9.0 (fresh): the lower of the two
    expect(pointMs(pts[3]!)).toBe(11.9); // not re-timed
    // a point whose fresh samples are dearer keeps its start-up median
    const up: VerifyPoint = { rows: 2, samples: [5], fresh: [6, 7] };
    expect(pointMs(up)).toBe(5);
  });

  it('a jump that persists (a kernel tile boundary) stays, after a bounded number of re-timings', () => {
    // SmolLM2 at 16 sequences: 16 → 17 rows costs 17.1 → 24 ms in every sample here
    const pts = pointsOf([16, 17, 18], [[17.1], [24], [24.5]]);
    const timed = recheckJumps(pts, (p) => (p.rows === 16 ? 17.1 : 24), { rounds: 2, perRound: 2 });
    expect(timed).toBe(8); // 2 rounds × 2 × (16, 17)
    expect(pointMs(pts[1]!)).toBe(24);
    // within 20 % of proportional growth is no jump: nothing is re-timed
    const flat = pointsOf([16, 17], [[17.1], [19.8]]);
    expect(recheckJumps(flat, () => Number.NaN)).toBe(0);
  });

  it('stops at its time budget', () => {
    let clock = 0;
    const pts = pointsOf([1, 2], [[1], [10]]);
    const timed = recheckJumps(
      pts,
      () => {
        clock += 30;
        return 10;
      },
      { budgetMs: 100, now: () => clock },
    );
    expect(timed).toBe(4); // 2 pairs × 60 ms: the third pair starts after 120 ms > 100
    expect(() => lowerMedian([])).toThrow(RangeError);
    expect(lowerMedian([3, 1, 2, 4])).toBe(2);
  });
});

describe('CostDraftPolicy with the batch rule', () => {
  const KS = [0, 1, 2, 4];
  /** Calibrated: a verify of T rows is flat up to 12 rows, then 3 ms per row; propose 0.2 ms. */
  const verify = (rows: number): number => 10 + 3 * Math.max(0, rows - 12);
  const bucket = (B: number, partial: readonly number[]) => {
    const verifyRows = [...KS.map((k) => B * (k + 1)), ...partial.map((d) => B + d)].sort((a, b) => a - b);
    return {
      sequences: B,
      ks: KS,
      verifyMs: KS.map((k) => verify(B * (k + 1))),
      draftMs: KS.map((k) => (k === 0 ? 0 : 0.2)),
      verifyRows,
      verifyRowsMs: verifyRows.map(verify),
    };
  };
  const costs = new StepCosts([bucket(1, []), bucket(8, [1, 2, 4])]);
  const cand = (id: string, pendingContextRows = 0) => ({
    id,
    maxDrafts: 4,
    metrics: new RequestMetrics(),
    pendingContextRows,
  });

  it('reads the verify cost by total rows: partial blocks between the uniform ones', () => {
    expect(costs.verifyMs(8, 12)).toBe(10); // 4 of 8 sequences with one draft: still flat
    expect(costs.verifyMs(8, 16)).toBe(22);
    expect(costs.verifyMs(8, 14)).toBe(16); // between the partial point 12 and the uniform 16
    // without the rows curve the same bucket is linear in k between its uniform points
    const { verifyRows: _rows, verifyRowsMs: _rowsMs, ...kOnly } = bucket(8, []);
    const uniform = new StepCosts([kOnly]);
    expect(uniform.verifyMs(8, 12)).toBe(16);
  });

  it('at 8 sequences spends the free verify rows, and a measured costly catch-up keeps the behind one plain', () => {
    const p = new CostDraftPolicy(costs, { exploreEvery: 0, prior: 0.8 });
    const ks = p.choose(Array.from({ length: 8 }, (_, i) => cand(`s${i}`)));
    expect(ks.reduce((a, k) => a + k, 0)).toBeGreaterThan(0);
    expect(ks.reduce((a, k) => a + k, 0)).toBeLessThanOrEqual(4 + 1); // about the 4 free rows (12 − 8)
    // a catch-up measured at 1 ms per row (its share per step of a drafting run: ÷ 8 steps) keeps a sequence 50
    // rows behind plain; the current ones draft
    p.observeContext(50, 50);
    const behind = p.choose([cand('late', 50), ...Array.from({ length: 7 }, (_, i) => cand(`t${i}`))]);
    expect(behind[0]).toBe(0);
    expect(behind.slice(1).some((k) => k > 0)).toBe(true);
  });

  it('learns the step overhead by shape after a warm-up: JIT-slow first steps do not count', () => {
    const p = new CostDraftPolicy(costs, { exploreEvery: 0, prior: 0.8 });
    const batch = Array.from({ length: 8 }, (_, i) => cand(`s${i}`));
    const first = p.choose(batch);
    expect(first.some((k) => k > 0)).toBe(true);
    const shape = { sequences: 8, drafting: 4, drafts: 4 };
    p.observeOverhead(1000, true, 12, shape); // warm-up observations (JIT): skipped
    p.observeOverhead(1000, true, 12, shape);
    p.observeOverhead(1000, false, 8, { sequences: 8, drafting: 0, drafts: 0 });
    p.observeOverhead(1000, false, 8, { sequences: 8, drafting: 0, drafts: 0 });
    expect(p.overhead.coefficients).toEqual([0, 0, 0]);
    expect(p.choose(batch)).toEqual(first);
    // then plain steps at 0.1 ms a sequence, and drafting steps 40 ms more: 10 ms per drafting sequence or draft. A
    // sample is clipped to 3 × the prediction + 1 ms, so a real rise takes a few steps to be believed (the cap
    // triples each step), then is learned (the first, clipped samples still weigh a little)
    for (let i = 0; i < 8; i++) {
      p.observeOverhead(0.8, false, 8, { sequences: 8, drafting: 0, drafts: 0 });
      p.observeOverhead(0.8 + 40, true, 12, shape);
    }
    expect(Math.abs(p.overhead.predict(8, 0, 0) - 0.8)).toBeLessThan(0.1);
    expect(p.overhead.predict(8, 4, 4)).toBeGreaterThan(30);
    expect(p.choose(batch)).toEqual(new Array(8).fill(0)); // drafting stops
  });

  it('a sequence whose whole prompt is deferred still drafts: its drafting run shares the catch-up', () => {
    const p = new CostDraftPolicy(costs, { exploreEvery: 0, prior: 0.8 });
    p.observeContext(400, 20); // 0.05 ms per row: 1000 prompt rows cost 50 ms, five 10 ms steps
    expect(p.choose([cand('prompt', 1000)])[0]).toBeGreaterThan(0);
    // charged whole to the one step the rule would never start drafting
    const whole = (s: BatchShape) => verify(s.tokens) + (s.drafting > 0 ? 0.2 : 0) + 0.05 * s.catchUpRows;
    expect(chooseBatchDraftLengths([item([0.8, 0.8, 0.8, 0.8], 1000)], whole).ks).toEqual([0]);
  });
});
