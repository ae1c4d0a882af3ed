// The cost-based draft-length policy (engine/draft-policy.ts) on synthetic step costs: the
// acceptance estimate, the choice of k at one sequence (cheap verify → long drafts, dear verify or
// poor acceptance → k = 0), and under load (the batch's verify cost → fewer drafts).
import { describe, expect, it } from 'vitest';

import {
  AcceptanceEstimator,
  CostDraftPolicy,
  fixedDraftPolicy,
  RequestMetrics,
  StepCosts,
  type BucketCosts,
} from '../../src/engine/index.js';

const KS = [0, 1, 2, 4, 8, 15];
/** Costs: t_verify = base + perRow·rows per sequence bucket, t_draft = draft (flat in k). */
function costs(base: number, perRow: number, draft: number, buckets = [1]): StepCosts {
  return new StepCosts(
    buckets.map(
      (B): BucketCosts => ({
        sequences: B,
        ks: KS,
        verifyMs: KS.map((k) => base + perRow * B * (k + 1)),
        draftMs: KS.map((k) => (k === 0 ? 0 : draft * B)),
      }),
    ),
  );
}
const cand = (id: string, maxDrafts = 15) => ({ id, maxDrafts, metrics: new RequestMetrics() });
const noExplore = { exploreEvery: 0 } as const;

describe('AcceptanceEstimator', () => {
  it('E[committed | k] = 1 + Σ Π a_j from per-position conditional rates; run rates back a new request', () => {
    const a = new AcceptanceEstimator({ alpha: 1, prior: 0.5, priorWeight: 0 });
    expect(a.expectedCommitted('x', 2)).toEqual([1, 1.5, 1.75]); // the prior
    a.observe('x', 4, 2); // drafts 1, 2 accepted, 3 rejected, 4 never decided
    expect(a.rates('x', 4)).toEqual([1, 1, 0, 0]); // position 4 takes the deepest decided one
    expect(a.expectedCommitted('x', 4)).toEqual([1, 2, 3, 3, 3]);
    expect(a.rates('y', 3)).toEqual([1, 1, 0]); // a new request: the run's rates
    a.observe('y', 3, 0);
    expect(a.rates('y', 1)).toEqual([0]);
    expect(a.runRate(0)).toBe(0.5);
    a.release('y');
    expect(a.rates('y', 1)).toEqual([0.5]);
  });
});

describe('CostDraftPolicy', () => {
  it('one sequence: drafts long when verify is cheap and acceptance high, nothing when verify is dear', () => {
    const cheap = new CostDraftPolicy(costs(2, 0.01, 0.2), { ...noExplore, prior: 0.9 });
    expect(cheap.choose([cand('a')])[0]).toBeGreaterThanOrEqual(8);
    const dear = new CostDraftPolicy(costs(1, 1, 5), { ...noExplore, prior: 0.9 });
    expect(dear.choose([cand('a')])).toEqual([0]);
    // Poor acceptance observed: back to plain steps even with cheap verify.
    const p = new CostDraftPolicy(costs(2, 0.05, 1), { ...noExplore, prior: 0.9, alpha: 1 });
    expect(p.choose([cand('a')])[0]).toBeGreaterThan(0);
    for (let i = 0; i < 5; i++) p.observe('a', 4, 0);
    expect(p.choose([cand('a')])).toEqual([0]);
  });

  it('maximises E[committed]/cost over k exactly at one sequence', () => {
    const c = costs(1, 0.2, 0.5);
    const p = new CostDraftPolicy(c, { ...noExplore, prior: 0.8, priorWeight: 1 });
    const e = p.acceptance.expectedCommitted('a', 15);
    const rate = (k: number) => e[k]! / (c.draftMs(k === 0 ? 0 : 1, k) + c.verifyMs(1, k + 1));
    const best = Array.from({ length: 16 }, (_, k) => k).reduce((a, k) => (rate(k) > rate(a) ? k : a), 0);
    expect(p.choose([cand('a')])).toEqual([best]);
  });

  it('under load the batch verify cost makes it draft less, down to none; respects maxDrafts', () => {
    const c = costs(2, 0.15, 0.3, [1, 8]);
    const p = new CostDraftPolicy(c, { ...noExplore, prior: 0.8 });
    const one = p.choose([cand('a')])[0]!;
    const eight = p.choose(Array.from({ length: 8 }, (_, i) => cand(`s${i}`)));
    expect(one).toBeGreaterThan(0);
    expect(eight.reduce((a, b) => a + b, 0) / 8).toBeLessThan(one);
    const dear = new CostDraftPolicy(costs(2, 0.6, 0.3, [1, 8]), { ...noExplore, prior: 0.8 });
    expect(dear.choose(Array.from({ length: 8 }, (_, i) => cand(`s${i}`)))).toEqual(new Array(8).fill(0));
    expect(new CostDraftPolicy(costs(2, 0.01, 0.2), { ...noExplore, prior: 0.9 }).choose([cand('a', 3)])).toEqual([3]);
  });

  it('corrects a miscalibration online: plain steps measured 5x cheaper than calibrated end the drafting', () => {
    // Calibrated: plain 5 ms, each verify row +0.5 ms, propose 0.5 ms → drafting 1 looks better than plain.
    const c = costs(4.5, 0.5, 0.5);
    const p = new CostDraftPolicy(c, { ...noExplore, prior: 0.7, alpha: 1, explorePlainEvery: 8 });
    const first = p.choose([cand('a')])[0]!;
    expect(first).toBeGreaterThan(0);
    // The machine: a plain step really costs 1 ms; a verify with k drafts 5 + 0.5·k ms; propose 0.5 ms.
    const chosen: number[] = [];
    for (let step = 0; step < 120; step++) {
      const [k] = step === 0 ? [first] : p.choose([cand('a')]);
      chosen.push(k!);
      p.observe('a', k!, Math.min(k!, 1)); // the first draft is always accepted, the second never
      p.observeStep(1, 1 + k!, k! > 0 ? 1 : 0, k!, k! > 0 ? 5 + 0.5 * k! : 1, k! > 0 ? 0.5 : 0);
    }
    console.log(`choices: ${chosen.join('')}; scales ${p.costScale.map((x) => x.toFixed(2)).join(' ')}`);
    expect(chosen.slice(0, 8).every((k) => k > 0)).toBe(true); // it drafted while it believed the calibration
    expect(chosen.slice(-30).every((k) => k === 0)).toBe(true); // then plain steps, measured, won
    expect(p.costScale[0]).toBeLessThan(0.3);
    expect(p.costScale[1]).toBeGreaterThan(0.9);
  });

  it('explores after a run of plain steps, with a growing interval', () => {
    const p = new CostDraftPolicy(costs(1, 1, 5), { prior: 0.9, exploreEvery: 4, exploreDrafts: 2 });
    const ks = Array.from({ length: 20 }, () => p.choose([cand('a')])[0]);
    expect(ks.map((k, i) => (k! > 0 ? i : -1)).filter((i) => i >= 0)).toEqual([4, 13]); // after 4, then 8 plain steps
    expect(fixedDraftPolicy(7).choose([cand('a', 3), cand('b')])).toEqual([3, 7]);
  });
});
