// The cost-based draft-length policy (engine/draft-policy.ts) on synthetic step costs: the
// acceptance estimate, the choice of k at one sequence (cheap verify → long drafts, dear verify or
// poor acceptance → k = 0), and under load (the batch's verify cost → fewer drafts).
import { describe, expect, it } from 'vitest';

import {
  AcceptanceEstimator,
  CostDraftPolicy,
  type CostPolicyTraceEvent,
  fixedDraftPolicy,
  OverheadModel,
  RequestMetrics,
  StepCosts,
  type BucketCosts,
} from '../../src/engine/index.js';
import { ARM_BLOCK, ARM_MIN_STEPS, STALE_SAMPLES } from '../../src/engine/draft-policy.js';

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
/**
 * The plain step's cost the rule of `p` reads for a batch of B sequences (each call a batch of fresh ids: a kept
 * plain choice would not be re-priced), from the trace events `p` pushes into `events`.
 */
function plainPriceReader(p: CostDraftPolicy, events: readonly CostPolicyTraceEvent[], B: number): () => number {
  let call = 0;
  return () => {
    call++;
    p.choose(Array.from({ length: B }, (_, i) => cand(`c${call}s${i}`, 4)));
    const ch = events.filter((e) => e.kind === 'choose').at(-1);
    if (ch?.kind !== 'choose') throw new Error('expected a choose event');
    return ch.curve[0]?.costMs ?? Number.NaN;
  };
}

/**
 * The verify time the rule of `p` reads at D drafts for one sequence (allowed `maxDrafts`): the curve's cost at D less
 * the other terms of the same D (the propose × its factor, the overhead), from the trace events `p` pushes into
 * `events`; each call a fresh id.
 */
function verifyPriceReader(
  p: CostDraftPolicy,
  events: readonly CostPolicyTraceEvent[],
  c: StepCosts,
  maxDrafts: number,
): (d: number) => number {
  let call = 0;
  return (d) => {
    call++;
    p.choose([cand(`v${call}`, maxDrafts)]);
    const ch = events.filter((e) => e.kind === 'choose').at(-1);
    if (ch?.kind !== 'choose') throw new Error('expected a choose event');
    return ch.curve[d]!.costMs - c.draftMs(1, d) * ch.costScale[2]! - p.overhead.predict(1, 1, d);
  };
}

describe('AcceptanceEstimator', () => {
  const plain = { optimism: 0, forget: 1 } as const;

  it('run rates by position and state (an unoffered one borrows from below); E[committed | k] = 1 + Σ Π a_j', () => {
    const a = new AcceptanceEstimator({ ...plain, prior: 0.5, priorWeight: 2, requestVariance: 0 });
    expect(a.expectedCommitted('x', 2)).toEqual([1, 1.5, 1.75]); // the prior
    a.observe('x', 4, 2); // drafts 1, 2 accepted, 3 rejected, 4 never decided (state 0: no step before)
    // (accepted + prior·w) / (offered + w): positions 1, 2 → 2/3, position 3 → 1/3, position 4 borrows position 3's
    expect(a.rates('x', 4)).toEqual([2 / 3, 2 / 3, 1 / 3, 1 / 3]);
    expect(a.expectedCommitted('x', 3)).toEqual([1, 1 + 2 / 3, 1 + 2 / 3 + 4 / 9, 1 + 2 / 3 + 4 / 9 + 4 / 27]);
    expect(a.hot('x')).toBe(false);
    a.observe('x', 2, 2); // every draft accepted: the next step is in state 1
    expect(a.hot('x')).toBe(true);
    expect(a.runRate(0)).toBe(3 / 4); // state 0, position 1: 2 of 2 + prior
    expect(a.rates('x', 3)).toEqual([3 / 4, 3 / 4, 1 / 3]); // state 1 never offered: state 0's rates
    a.observe('x', 1, 0); // state 1, position 1 rejected
    expect(a.runRate(0, true)).toBe(1 / 3);
    expect(a.rates('x', 2)).toEqual([3 / 4, 3 / 4]); // back in state 0
    a.observe('y', 0, 0); // a plain step decides nothing
    expect(a.runRate(0)).toBe(3 / 4);
    a.release('x');
    expect(a.hot('x')).toBe(false);
  });

  it("a request's evidence moves it by one logit offset, shrunk by its prior variance", () => {
    const a = new AcceptanceEstimator({ ...plain, prior: 0.5, priorWeight: 2, requestVariance: 1 });
    for (let i = 0; i < 10; i++) a.observe('a', 2, 1); // position 1 always accepted, position 2 always rejected
    a.observe('b', 2, 0); // b: position 1 rejected once
    // run (state 0): position 1 10 of 11 → 11/13, position 2 0 of 10 → 1/12
    const p1 = 11 / 13;
    const p2 = 1 / 12;
    expect(a.runRate(0)).toBeCloseTo(p1, 12);
    expect(a.runRate(1)).toBeCloseTo(p2, 12);
    // δ = Σ (x − p) / (Σ p(1 − p) + 1/σ²) against the run's rates now
    const deltaB = (0 - p1) / (p1 * (1 - p1) + 1);
    expect(a.offset('b')).toBeCloseTo(deltaB, 12);
    expect(deltaB).toBeCloseTo(-0.74869, 4);
    const deltaA = (10 - 10 * p1 + (0 - 10 * p2)) / (10 * p1 * (1 - p1) + 10 * p2 * (1 - p2) + 1);
    expect(a.offset('a')).toBeCloseTo(deltaA, 12);
    expect(deltaA).toBeCloseTo(0.23, 2);
    const sig = (x: number) => 1 / (1 + Math.exp(-x));
    expect(a.rates('b', 1)[0]).toBeCloseTo(sig(Math.log(p1 / (1 - p1)) + deltaB), 12); // 0.722
    expect(a.rates('b', 1)[0]).toBeCloseTo(0.7223, 4);
    expect(a.offset('new')).toBe(0);
    expect(a.rates('new', 2)).toEqual([a.runRate(0), a.runRate(1)]);
  });

  it('optimism: posterior standard deviations of the run rate, growing back as the counts fade', () => {
    const a = new AcceptanceEstimator({ prior: 0.5, priorWeight: 2, requestVariance: 0, optimism: 0.5, forget: 0.5 });
    for (let i = 0; i < 10; i++) a.observe('a', 1, 1);
    a.release('a');
    // state 0, position 1 offered once (the first step; then state 1): mean (1 + 1) / 3, n = 1
    const m = 2 / 3;
    expect(a.rates('n', 1, 0)).toEqual([m]);
    expect(a.rates('n', 1)[0]).toBeCloseTo(m + 0.5 * Math.sqrt((m * (1 - m)) / (1 + 2 + 1)), 12);
    // position 2 never offered: its mean is borrowed and it counts as observed 0 times
    expect(a.rates('n', 2)[1]).toBeCloseTo(m + 0.5 * Math.sqrt((m * (1 - m)) / (0 + 2 + 1)), 12);
    a.step(); // counts × 0.5: the mean (1 + 1)/(1 + 2) becomes (0.5 + 1)/(0.5 + 2) = 0.6, n = 0.5
    expect(a.rates('n', 1, 0)[0]).toBeCloseTo(0.6, 12);
    expect(a.rates('n', 1)[0]).toBeCloseTo(0.6 + 0.5 * Math.sqrt((0.6 * 0.4) / (0.5 + 2 + 1)), 12);
    expect(() => new AcceptanceEstimator({ forget: 0 })).toThrow(RangeError);
    expect(() => new AcceptanceEstimator({ requestVariance: -1 })).toThrow(RangeError);
  });
});

describe('OverheadModel', () => {
  it('recovers per-sequence, per-drafting-sequence and per-draft costs by least squares, never below 0', () => {
    const m = new OverheadModel(1, 1e-9, Infinity, 0, 1); // no forgetting, ridge, clipping or fading: the fit alone
    const shapes = [
      { sequences: 1, drafting: 0, drafts: 0 },
      { sequences: 1, drafting: 1, drafts: 1 },
      { sequences: 1, drafting: 1, drafts: 3 },
      { sequences: 8, drafting: 0, drafts: 0 },
      { sequences: 8, drafting: 4, drafts: 6 },
      { sequences: 16, drafting: 2, drafts: 2 },
    ];
    for (const sh of shapes) m.observe(0.2 * sh.sequences + 0.4 * sh.drafting + 0.05 * sh.drafts, sh);
    expect(m.coefficients[0]).toBeCloseTo(0.2, 6);
    expect(m.coefficients[1]).toBeCloseTo(0.4, 6);
    expect(m.coefficients[2]).toBeCloseTo(0.05, 6);
    expect(m.predict(4, 2, 5)).toBeCloseTo(0.8 + 0.8 + 0.25, 6);
    // a step that costs less the more it drafts: the per-draft coefficient stays at 0
    const n = new OverheadModel(1, 1e-9, Infinity, 0, 1);
    for (const d of [1, 2, 3, 4]) n.observe(1 - 0.1 * d, { sequences: 1, drafting: 1, drafts: d });
    expect(n.coefficients[2]).toBe(0);
    expect(n.predict(1, 1, 2)).toBeCloseTo(0.75, 6); // the mean of the four
  });

  it('clips a preempted step, and fades what drafting steps taught while nothing is drafted', () => {
    const m = new OverheadModel(); // the engine's defaults
    const plainStep = { sequences: 1, drafting: 0, drafts: 0 };
    const draftStep = { sequences: 1, drafting: 1, drafts: 2 };
    for (let i = 0; i < 20; i++) m.observe(0.3, plainStep);
    for (let i = 0; i < 10; i++) m.observe(0.8, draftStep);
    const learned = m.predict(1, 1, 2);
    expect(learned).toBeGreaterThan(0.7);
    expect(learned).toBeLessThan(0.85);
    m.observe(19, draftStep); // a 19 ms preemption: taken as 3 × the prediction + 1 ms
    expect(m.predict(1, 1, 2)).toBeLessThan(learned + 0.3);
    // 60 plain steps: the drafting premium fades (the ridge pulls it to 0) and drafting gets tried again; c_seq stays
    for (let i = 0; i < 60; i++) m.observe(0.3, plainStep);
    expect(m.predict(1, 0, 0)).toBeCloseTo(0.3, 2);
    expect(m.predict(1, 1, 2) - m.predict(1, 0, 0)).toBeLessThan(0.1);
  });
});

describe('CostDraftPolicy', () => {
  it('one sequence: drafts long when verify is cheap and acceptance high, nothing when verify is dear', () => {
    const cheap = new CostDraftPolicy(costs(2, 0.01, 0.2), { ...noExplore, prior: 0.9 });
    expect(cheap.choose([cand('a')])[0]).toBeGreaterThanOrEqual(8);
    const dear = new CostDraftPolicy(costs(1, 1, 5), { ...noExplore, prior: 0.9 });
    expect(dear.choose([cand('a')])).toEqual([0]);
    // Poor acceptance observed: back to plain steps even with cheap verify.
    const p = new CostDraftPolicy(costs(2, 0.05, 1), { ...noExplore, prior: 0.9 });
    expect(p.choose([cand('a')])[0]).toBeGreaterThan(0);
    for (let i = 0; i < 5; i++) p.observe('a', 4, 0);
    expect(p.choose([cand('a')])).toEqual([0]);
  });

  it('one sequence: the argmax of E[committed]/cost at the means, one draft more when its upper bound pays', () => {
    const c = costs(1, 0.2, 0.5); // t_verify = 1 + 0.2·(k + 1), t_draft = 0.5
    const p = new CostDraftPolicy(c, { ...noExplore, prior: 0.8, priorWeight: 1, explorePlainEvery: 0 });
    const rate = (e: readonly number[], k: number) => e[k]! / (c.draftMs(k === 0 ? 0 : 1, k) + c.verifyMs(1, k + 1));
    const argmax = (e: readonly number[]) => e.reduce((a, _, k) => (rate(e, k) > rate(e, a) ? k : a), 0);
    // by hand: every a_j = 0.8 (the prior) → rate(k) = (1 − 0.8^(k+1))/0.2 / (1.7 + 0.2·k): best k = 5 (1.3664)
    const means = p.acceptance.expectedCommitted('a', 15, 0);
    expect(argmax(means)).toBe(5);
    expect(rate(means, 5)).toBeCloseTo(1.3664, 4);
    // draft 6 never observed: its upper bound 0.8 + 0.5·√(0.16/2) = 0.9414 gives rate(6) = 1.3784 > 1.3664
    expect(p.choose([cand('a')])).toEqual([6]);
    expect(p.predictedRate).toBeCloseTo(rate(means, 6), 12); // R* at the means, not the bonus
    // the run learns that draft 5 is accepted half the time and draft 6 never: the argmax at the means, 5, and the
    // bonus of draft 6 (observed 20 times) is too small to try it
    for (let i = 0; i < 40; i++) p.observe('a', 6, i % 2 === 0 ? 5 : 4);
    const e = p.acceptance.expectedCommitted('a', 15, 0);
    const k = p.choose([cand('a')])[0]!;
    expect(k).toBe(argmax(e));
    // a_1 … a_4 = 40.8/41, a_5 = 20.8/41, a_6 = 0.8/21: rate(4) = 1.980, rate(5) = 2.017, rate(6) = 1.884
    expect([4, 5, 6].map((j) => Number(rate(e, j).toFixed(3)))).toEqual([1.98, 2.017, 1.884]);
    expect(k).toBe(5);
  });

  it('converges to the optimum computed by hand from the true acceptance; drafts less under a steeper curve', () => {
    // true a_j = 0.9, 0.9, 0.9, 0.3, 0.3, 0.3; t_verify = 2 + 0.5·(k + 1), t_draft = 0.3:
    // rate(k) = E[k] / cost(k): 0.400, 0.576, 0.713, 0.800, 0.762, 0.703, 0.645 → k = 3 by hand
    const truth = [0.9, 0.9, 0.9, 0.3, 0.3, 0.3];
    // 8 sequences: a plain step 6 ms (0.75 ms a token), each verify row 0.6 ms more — dearer than at one sequence
    const c = new StepCosts([
      ...costs(2, 0.5, 0.3).buckets,
      { sequences: 8, ks: KS, verifyMs: KS.map((k) => 6 + 0.6 * 8 * k), draftMs: KS.map((k) => (k === 0 ? 0 : 0.3)) },
    ]);
    const e = [1];
    for (let j = 0; j < truth.length; j++) e.push(e[j]! + truth.slice(0, j + 1).reduce((x, y) => x * y, 1));
    const byHand = e.map((x, k) => x / (c.verifyMs(1, k + 1) + c.draftMs(k === 0 ? 0 : 1, k)));
    expect(byHand.map((r) => Number(r.toFixed(3)))).toEqual([0.4, 0.576, 0.713, 0.8, 0.762, 0.703, 0.645]);
    const p = new CostDraftPolicy(c, { ...noExplore, explorePlainEvery: 0 });
    let seed = 12345;
    const uniform = () => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed / 2147483648;
    };
    /** 400 steps of one sequence whose drafts are accepted at `truth`: the ks chosen. */
    const drive = (policy: CostDraftPolicy): number[] =>
      Array.from({ length: 400 }, () => {
        const [k] = policy.choose([cand('a', 6)]);
        let accepted = 0;
        while (accepted < k! && uniform() < truth[accepted]!) accepted++;
        policy.observe('a', k!, accepted);
        return k!;
      });
    const chosen = drive(p);
    // the last 200 steps: the optimum, but for a few re-explorations of draft 4 as its counts fade (forget)
    const last = chosen.slice(-200);
    expect(last.filter((k) => k === 3).length).toBeGreaterThanOrEqual(180);
    expect(last.every((k) => k === 3 || k === 4)).toBe(true);
    // 8 sequences of the same acceptance: uniform k = 1, 2, 3 reach 1.355, 1.358, 1.343 tokens per ms (plain 1.333):
    // a gain of 1.9 %, inside the default minGain (3 %), so plain; with minGain 0 it drafts, less than at one sequence
    const eight = Array.from({ length: 8 }, (_, i) => cand(`b${i}`, 6));
    expect(p.choose(eight)).toEqual(new Array(8).fill(0));
    const q = new CostDraftPolicy(c, { ...noExplore, explorePlainEvery: 0, minGain: 0 });
    drive(q);
    const perSeq = q.choose(eight).reduce((a, b) => a + b, 0) / 8;
    expect(perSeq).toBeGreaterThan(0);
    expect(perSeq).toBeLessThan(3);
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
    const p = new CostDraftPolicy(c, { ...noExplore, prior: 0.7, explorePlainEvery: 8 });
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
    expect(chosen.slice(0, 8).every((k) => k > 0)).toBe(true); // it drafted while it believed the calibration
    expect(chosen.slice(-30).every((k) => k === 0)).toBe(true); // then plain steps, measured, won
    // plain: measured ÷ calibrated 0.2, clamped to 1/4; the plain steps' surprise is split between the machine factor
    // and the plain kind's own, so the drafting scale (not observed any more) moved by part of it: 0.25 ÷ 0.62
    expect(p.costScale[0]).toBeCloseTo(0.25, 3);
    expect(p.costScale[0]! / p.costScale[1]!).toBeLessThan(0.45);
  });

  it('a slowdown measured by the drafting steps alone moves the plain estimate by a quarter (machine factor)', () => {
    const c = costs(4.5, 0.5, 0.5);
    const p = new CostDraftPolicy(c, noExplore);
    for (let i = 0; i < 200; i++) p.observeStep(1, 2, 1, 1, 1.5 * c.verifyMs(1, 2), c.draftMs(1, 1));
    // log(1.5) split by the learning rates: the machine (m, 0.1), the drafting kind (r, 0.1) and the drafting kind at
    // this batch size (r_B, 0.2): plain = e^m = 1.5^(1/4)
    expect(p.costScale[1]).toBeCloseTo(1.5, 6);
    expect(p.costScale[0]).toBeCloseTo(1.5 ** 0.25, 6);
    // the propose calls ran at their calibrated time: their own factor cancels the machine's
    expect(p.costScale[2]).toBeCloseTo(1, 3);
  });

  it('keeps a cost factor per batch size: a plain step 1.3x its calibration at 8 sequences, 1.0x at 16', () => {
    const c = costs(2, 0.5, 0.5, [8, 16]);
    const p = new CostDraftPolicy(c, noExplore);
    for (let i = 0; i < 300; i++) p.observeStep(8, 8, 0, 0, 1.3 * c.verifyMs(8, 8), 0);
    expect(p.costScale[0]).toBeCloseTo(1.3, 2);
    for (let i = 0; i < 300; i++) p.observeStep(16, 16, 0, 0, c.verifyMs(16, 16), 0);
    expect(p.costScale[0]).toBeCloseTo(1.0, 2);
    // back at 8 sequences, one step: its own factor was kept
    p.observeStep(8, 8, 0, 0, 1.3 * c.verifyMs(8, 8), 0);
    expect(p.costScale[0]).toBeGreaterThan(1.2);
    // a preempted step moves a factor by at most e^(0.4 · 0.25) (the residual is clipped to ±0.25)
    const before = p.costScale[0]!;
    p.observeStep(8, 8, 0, 0, 100 * c.verifyMs(8, 8), 0);
    expect(p.costScale[0]! / before).toBeLessThan(Math.exp(0.4 * 0.25) + 1e-9);
  });

  it('prices a plain step by the lower median of its last 32 forwards: a few slow ones do not move it', () => {
    const c = costs(2, 0.1, 0.3, [8]); // calibrated: a plain step of 8 sequences 2.8 ms
    const events: CostPolicyTraceEvent[] = [];
    const p = new CostDraftPolicy(c, { ...noExplore, trace: (e) => events.push(e) });
    const plainMs = plainPriceReader(p, events, 8);
    for (let i = 0; i < 20; i++) p.observeStep(8, 8, 0, 0, 2, 0);
    expect(plainMs()).toBeCloseTo(2, 9);
    // four slow steps in a row (the machine): the EMA this replaced read 4.15 ms after them
    for (let i = 0; i < 4; i++) p.observeStep(8, 8, 0, 0, 9, 0);
    expect(plainMs()).toBeCloseTo(2, 9);
    // a lasting change moves it once it holds half of the last 32: 12 × 2, 4 × 9, 16 × 3 → 3
    for (let i = 0; i < 16; i++) p.observeStep(8, 8, 0, 0, 3, 0);
    expect(plainMs()).toBeCloseTo(3, 9);
    // learnVerify: false reads the calibrated time × the plain factor instead
    const q = new CostDraftPolicy(c, { ...noExplore, learnVerify: false, trace: (e) => events.push(e) });
    q.choose(Array.from({ length: 8 }, (_, i) => cand(`q${i}`, 4)));
    const qc = events.filter((e) => e.kind === 'choose').at(-1);
    if (qc?.kind !== 'choose') throw new Error('expected a choose event');
    expect(qc.curve[0]?.costMs).toBeCloseTo(c.verifyMs(8, 8), 9);
  });

  it('prices the propose call by the drafts it proposed, not by those the verify budgets kept', () => {
    const ks = [0, 1, 2, 4, 8];
    const c = new StepCosts([
      { sequences: 1, ks, verifyMs: ks.map((k) => 2 + 0.2 * k), draftMs: ks.map((k) => 0.5 * k) } satisfies BucketCosts,
    ]);
    const p = new CostDraftPolicy(c, noExplore);
    // 4 drafts proposed at their calibrated time, 1 kept
    for (let i = 0; i < 200; i++) p.observeStep(1, 2, 1, 1, c.verifyMs(1, 2), c.draftMs(1, 4), 4);
    expect(p.costScale[2]).toBeCloseTo(1, 3);
  });

  it('reads a verify shape measured three times in place of the calibrated curve', () => {
    const c = costs(2, 0.1, 0.3);
    /** A policy after one draft (2 rows) measured at 40 ms three times, nothing else: it and its choice's trace. */
    const measured = (learnVerify: boolean) => {
      const events: CostPolicyTraceEvent[] = [];
      const p = new CostDraftPolicy(c, { ...noExplore, learnVerify, trace: (e) => events.push(e) });
      for (let i = 0; i < 3; i++) p.observeStep(1, 2, 1, 1, 40, c.draftMs(1, 1), 1);
      p.choose([cand('a', 4)]);
      const ch = events.filter((e) => e.kind === 'choose').at(-1);
      if (ch?.kind !== 'choose') throw new Error('expected a choose event');
      return { p, ch };
    };
    const { p, ch } = measured(true);
    const [, d1, d2] = ch.curve;
    const draftScale = ch.costScale[2]!;
    const over = (d: number) => p.overhead.predict(1, 1, d);
    // D = 1: the learned 40 ms; D = 2: the calibrated time × the drafting factor (one point cannot bend it)
    expect(d1!.costMs).toBeCloseTo(c.draftMs(1, 1) * draftScale + 40 + over(1), 6);
    expect(d2!.costMs).toBeCloseTo(c.draftMs(1, 2) * draftScale + c.verifyMs(1, 3) * ch.costScale[1]! + over(2), 6);
    expect(d2!.costMs).toBeLessThan(d1!.costMs);
    // learnVerify: false reads the calibrated curve × its factor throughout
    const { p: q, ch: och } = measured(false);
    const o1 = och.curve[1]!;
    const want =
      c.draftMs(1, 1) * och.costScale[2]! + c.verifyMs(1, 2) * och.costScale[1]! + q.overhead.predict(1, 1, 1);
    expect(o1.costMs).toBeCloseTo(want, 6);
  });

  it('prices a drafted shape by the lower median of its forwards, never above a shape of more rows', () => {
    const c = costs(2, 0.1, 0.3);
    const events: CostPolicyTraceEvent[] = [];
    const p = new CostDraftPolicy(c, { ...noExplore, costOptimism: false, trace: (e) => events.push(e) });
    const verifyRead = verifyPriceReader(p, events, c, 4);
    // 3 rows (2 drafts): 20 forwards of 5 ms, then 4 slow ones (the EMA this replaced read 8.3 ms after them)
    for (let i = 0; i < 20; i++) p.observeStep(1, 3, 1, 2, 5, c.draftMs(1, 2), 2);
    for (let i = 0; i < 4; i++) p.observeStep(1, 3, 1, 2, 12, c.draftMs(1, 2), 2);
    expect(verifyRead(2)).toBeCloseTo(5, 9);
    // 2 rows measured dearer than 3 (its few samples from a slow spell): read at 3 rows' 5 ms; 4 rows at its own 6
    for (let i = 0; i < 3; i++) p.observeStep(1, 2, 1, 1, 7, c.draftMs(1, 1), 1);
    for (let i = 0; i < 3; i++) p.observeStep(1, 4, 1, 3, 6, c.draftMs(1, 3), 3);
    expect(verifyRead(1)).toBeCloseTo(5, 9);
    expect(verifyRead(3)).toBeCloseTo(6, 9);
    // 4 rows falls to 4.5 (a lasting change, half the window): 1, 2 and 3 drafts are all read at 4.5
    for (let i = 0; i < 30; i++) p.observeStep(1, 4, 1, 3, 4.5, c.draftMs(1, 3), 3);
    for (const d of [1, 2, 3]) expect(verifyRead(d)).toBeCloseTo(4.5, 9);
    // 4 drafts (5 rows) never measured: the calibrated time × the drafting factor
    const ch = events.filter((e) => e.kind === 'choose').at(-1);
    if (ch?.kind !== 'choose') throw new Error('expected a choose event');
    expect(verifyRead(4)).toBeCloseTo(c.verifyMs(1, 5) * ch.costScale[1]!, 6);
  });

  it('prices a plain step no dearer than a learned drafted shape × the calibrated ratio (a stale slow spell)', () => {
    const c = costs(2, 1.5, 0.3, [4]); // calibrated at 4 sequences: plain 8 ms, 9 rows (5 drafts) 15.5 ms
    const events: CostPolicyTraceEvent[] = [];
    const p = new CostDraftPolicy(c, { ...noExplore, trace: (e) => events.push(e) });
    const plainMs = plainPriceReader(p, events, 4);
    const over = p.overhead.predict(4, 0, 0);
    // a slow spell: the plain window holds 12 ms steps, and no drafted shape is learned yet: 12 ms it is
    for (let i = 0; i < 40; i++) p.observeStep(4, 4, 0, 0, 12, 0);
    expect(plainMs() - over).toBeCloseTo(12, 9);
    // the batch drafts; its 9-row forwards run at their calibrated 15.5 ms (the spell is over), no plain step comes:
    // once the plain window is stale, the plain step is read at 15.5 × 8 / 15.5 = 8 ms, not at the stale 12
    for (let i = 0; i < 10; i++) p.observeStep(4, 9, 3, 5, 15.5, c.draftMs(3, 5), 5);
    expect(plainMs() - over).toBeCloseTo(12, 9); // 10 drafting steps: the plain window is not stale yet
    for (let i = 0; i < STALE_SAMPLES; i++) p.observeStep(4, 9, 3, 5, 15.5, c.draftMs(3, 5), 5);
    expect(c.verifyMs(4, 9)).toBeCloseTo(15.5, 9);
    expect(plainMs() - p.overhead.predict(4, 0, 0)).toBeCloseTo(8, 9);
    // the anchor only caps: plain steps measured cheaper than it are read as measured
    for (let i = 0; i < 40; i++) p.observeStep(4, 4, 0, 0, 6, 0);
    expect(plainMs() - p.overhead.predict(4, 0, 0)).toBeCloseTo(6, 9);
    // a drafted shape never measured: the plain step's 6 ms × the calibrated ratio (not the drafting steps' factor),
    // under the learned shapes of more rows: 1 draft 6 × 9.5 / 8; 8 drafts (12 rows) 6 × 20 / 8
    const ch = events.filter((e) => e.kind === 'choose').at(-1);
    if (ch?.kind !== 'choose') throw new Error('expected a choose event');
    const verifyRead = (d: number, drafting: number) =>
      ch.curve[d]!.costMs - c.draftMs(drafting, d) * ch.costScale[2]! - p.overhead.predict(4, drafting, d);
    expect(c.verifyMs(4, 5)).toBeCloseTo(9.5, 9);
    expect(verifyRead(1, 1)).toBeCloseTo((6 * 9.5) / 8, 9);
    expect(verifyRead(8, 4)).toBeCloseTo((6 * 20) / 8, 9);
    expect(ch.costScale[1]! * c.verifyMs(4, 12)).not.toBeCloseTo((6 * 20) / 8, 1);
  });

  it('caps the plain step only when its window is stale, and only by drafted shapes measured after it', () => {
    const c = costs(2, 1.5, 0.3, [1]); // one sequence: calibrated plain 3.5 ms, 7 rows (6 drafts) 12.5 ms
    const events: CostPolicyTraceEvent[] = [];
    const p = new CostDraftPolicy(c, { ...noExplore, trace: (e) => events.push(e) });
    const read = plainPriceReader(p, events, 1);
    const plainMs = () => read() - p.overhead.predict(1, 0, 0);
    const cal7 = c.verifyMs(1, 7);
    expect([c.verifyMs(1, 1), cal7]).toEqual([3.5, 12.5]);
    // 7 rows measured 1.2 × their calibrated time: as an anchor they cap the plain step at 1.2 × 3.5 = 4.2 ms
    for (let i = 0; i < 5; i++) p.observeStep(1, 7, 1, 6, 1.2 * cal7, c.draftMs(1, 6), 6);
    for (let i = 0; i < 40; i++) p.observeStep(1, 1, 0, 0, 4.6, 0);
    // the plain samples came after them: the plain step is read as measured, not at the stale 4.2
    expect(plainMs()).toBeCloseTo(4.6, 9);
    // a drafting step now: a fresh plain window is not capped by it
    p.observeStep(1, 7, 1, 6, 1.2 * cal7, c.draftMs(1, 6), 6);
    expect(plainMs()).toBeCloseTo(4.6, 9);
    // drafting steps until the plain window's middle-aged sample (the 29th of all samples: the window keeps the 14th
    // to the 45th) is more than STALE_SAMPLES samples old: then capped (a plain price gone stale while drafting)
    for (let i = 0; i < STALE_SAMPLES - 18; i++) p.observeStep(1, 7, 1, 6, 1.2 * cal7, c.draftMs(1, 6), 6);
    expect(plainMs()).toBeCloseTo(4.6, 9); // 156 samples: 127 after it
    for (let i = 0; i < 2; i++) p.observeStep(1, 7, 1, 6, 1.2 * cal7, c.draftMs(1, 6), 6);
    expect(plainMs()).toBeCloseTo(1.2 * c.verifyMs(1, 1), 9);
  });

  it('caps a stale drafted shape by a fresher drafted shape × the calibrated ratio (warm-up prices)', () => {
    const c = costs(2, 1.5, 0.3); // one sequence: calibrated 4 rows (3 drafts) 8 ms, 6 rows (5 drafts) 11 ms
    const events: CostPolicyTraceEvent[] = [];
    const p = new CostDraftPolicy(c, { ...noExplore, trace: (e) => events.push(e) });
    const verifyRead = verifyPriceReader(p, events, c, 8);
    expect([c.verifyMs(1, 4), c.verifyMs(1, 6)]).toEqual([8, 11]);
    // warm-up: 5 drafts measured at 30 ms (cold caches), then the rule drafts 3 at 8.8 ms (1.1 × calibrated)
    for (let i = 0; i < 5; i++) p.observeStep(1, 6, 1, 5, 30, c.draftMs(1, 5), 5);
    for (let i = 0; i < 40; i++) p.observeStep(1, 4, 1, 3, 8.8, c.draftMs(1, 3), 3);
    // not stale yet: 5 drafts read as measured (3 drafts read at their own 8.8)
    expect(verifyRead(5)).toBeCloseTo(30, 9);
    expect(verifyRead(3)).toBeCloseTo(8.8, 9);
    // once its middle-aged sample (the 3rd of all) is more than STALE_SAMPLES samples old: 8.8 × 11 / 8 = 12.1 ms
    for (let i = 0; i < STALE_SAMPLES - 42; i++) p.observeStep(1, 4, 1, 3, 8.8, c.draftMs(1, 3), 3);
    expect(verifyRead(5)).toBeCloseTo(30, 9); // 128 samples after it
    p.observeStep(1, 4, 1, 3, 8.8, c.draftMs(1, 3), 3);
    expect(verifyRead(5)).toBeCloseTo(12.1, 9);
    // the cap only lowers: a stale shape measured cheaper than the scaled price is read as measured
    for (let i = 0; i < 3; i++) p.observeStep(1, 5, 1, 4, 9, c.draftMs(1, 4), 4); // 4 drafts: 9.5 calibrated
    for (let i = 0; i < STALE_SAMPLES + 10; i++) p.observeStep(1, 4, 1, 3, 8.8, c.draftMs(1, 3), 3);
    expect(verifyRead(4)).toBeCloseTo(9, 9);
    // only by shapes measured after its newest sample: one more 30 ms forward of 5 drafts (still stale, its median
    // 30) is read as measured until a fresh shape is measured again
    p.observeStep(1, 6, 1, 5, 30, c.draftMs(1, 5), 5);
    expect(verifyRead(5)).toBeCloseTo(30, 9);
    p.observeStep(1, 4, 1, 3, 8.8, c.draftMs(1, 3), 3);
    expect(verifyRead(5)).toBeCloseTo(12.1, 9);
  });

  it("prices the shape one row beyond the most measured at that shape's price until measured (costOptimism)", () => {
    const c = costs(2, 1, 0.3); // one sequence, calibrated steeply: plain 3 ms, 1 draft 4, 2 drafts 5, 3 drafts 6
    const reader = (costOptimism: boolean) => {
      const events: CostPolicyTraceEvent[] = [];
      const p = new CostDraftPolicy(c, { ...noExplore, costOptimism, trace: (e) => events.push(e) });
      return { p, read: verifyPriceReader(p, events, c, 8) };
    };
    const { p, read } = reader(true);
    const { p: q, read: readCal } = reader(false);
    for (const x of [p, q]) {
      // the machine runs every shape at ~3 ms: plain and 1 draft measured three times
      for (let i = 0; i < 3; i++) x.observeStep(1, 1, 0, 0, 3, 0);
      for (let i = 0; i < 3; i++) x.observeStep(1, 2, 1, 1, 3.1, c.draftMs(1, 1), 1);
    }
    expect(read(1)).toBeCloseTo(3.1, 9);
    // 2 drafts: at 1 draft's 3.1 ms, where the calibrated ratio reads 3 × 5 / 3; 3 drafts by the ratio either way
    expect(read(2)).toBeCloseTo(3.1, 9);
    expect(readCal(2)).toBeCloseTo(5, 9);
    expect(read(3)).toBeCloseTo(6, 9);
    // twice measured is not measured: still the frontier's price; three times, its own, and 3 drafts the frontier's
    for (let i = 0; i < 2; i++) p.observeStep(1, 3, 1, 2, 3.3, c.draftMs(1, 2), 2);
    expect(read(2)).toBeCloseTo(3.1, 9);
    p.observeStep(1, 3, 1, 2, 3.3, c.draftMs(1, 2), 2);
    expect(read(2)).toBeCloseTo(3.3, 9);
    expect(read(3)).toBeCloseTo(3.3, 9);
    expect(read(4)).toBeCloseTo((3 * c.verifyMs(1, 5)) / 3, 9);
    // the optimism is only a cap: a frontier dearer than the ratio's price leaves that price
    for (let i = 0; i < 3; i++) p.observeStep(1, 4, 1, 3, 50, c.draftMs(1, 3), 3);
    expect(read(4)).toBeCloseTo(c.verifyMs(1, 5), 9);
  });

  it('walks up to the draft length the machine pays for under a calibration whose curve is too steep', () => {
    // calibrated 1.5 ms a verify row more (a slow spell); the machine now: 0.05 ms a row more. Each draft accepted
    // with probability 0.6 (a seeded draw): at the calibration one draft pays 5 % over a plain step, two do not
    const c = costs(2, 1.5, 0.3);
    const trueVerify = (rows: number) => 3 + 0.05 * rows;
    const run = (costOptimism: boolean) => {
      const p = new CostDraftPolicy(c, { ...noExplore, costOptimism, prior: 0.6 });
      let seed = 12345;
      const uniform = () => {
        seed = (seed * 1103515245 + 12345) % 2147483648;
        return seed / 2147483648;
      };
      const ks: number[] = [];
      for (let step = 0; step < 150; step++) {
        const k = p.choose([cand('a', 8)])[0]!;
        ks.push(k);
        p.observeStep(1, 1 + k, k > 0 ? 1 : 0, k, trueVerify(1 + k), k > 0 ? c.draftMs(1, k) : 0, k);
        let accepted = 0;
        while (accepted < k && uniform() < 0.6) accepted++;
        if (k > 0) p.observe('a', k, accepted);
      }
      return ks;
    };
    const withOptimism = run(true);
    const without = run(false);
    // the rate at k drafts: (1 − 0.6^(k+1)) / 0.4 / (t_verify(k + 1) + 0.3): 0.47 tokens/ms at k = 1, 0.55 at 2,
    // 0.62 at 3, 0.66 at 5–8. Without the optimism the rule prices 3 drafts at the plain step × 8 / 3.5 once the plain
    // step is measured (a forced plain step every 33), and stays at 2 (the drafting factor moved it there from 1)
    expect(Math.max(...without.slice(50))).toBe(2);
    // with it each shape is tried LEARNED_MIN = 3 times, one row more at a time: 1, 1, 1, 2, 2, 2, 3, …
    expect(withOptimism.slice(0, 12)).toEqual([1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]);
    // and it stays at 5–8 but for the forced plain steps; the stale 1-draft shape is not priced below what it costs
    // (a cap from the fresh shapes of more rows scaled by the steep calibration read it at 1.2 ms)
    const late = withOptimism.slice(50).filter((k) => k > 0);
    expect(Math.min(...late)).toBeGreaterThanOrEqual(5);
    expect(withOptimism.slice(50).filter((k) => k === 0).length).toBeLessThanOrEqual(4);
  });

  it('decodes one step plainly after explorePlainEvery steps in which some sequence drafted', () => {
    const c = costs(2, 0.1, 0.3, [2]);
    const p = new CostDraftPolicy(c, { ...noExplore, explorePlainEvery: 4, prior: 0.8 });
    const chosen: number[][] = [];
    for (let step = 0; step < 80; step++) {
      const ks = p.choose([cand('a', 4), cand('b', 4)]);
      chosen.push(ks);
      // a's drafts are all accepted, b's never: the rule soon drafts for a alone
      p.observe('a', ks[0]!, ks[0]!);
      p.observe('b', ks[1]!, 0);
      const drafts = ks[0]! + ks[1]!;
      p.observeStep(2, 2 + drafts, ks.filter((k) => k > 0).length, drafts, c.verifyMs(2, 2 + drafts), 0.3);
    }
    const late = chosen.slice(-40);
    expect(late.some(([a, b]) => a! > 0 && b === 0)).toBe(true); // mixed steps: a drafts, b does not
    let run = 0;
    let longest = 0;
    for (const ks of late) {
      run = ks.some((k) => k > 0) ? run + 1 : 0;
      longest = Math.max(longest, run);
    }
    expect(longest).toBe(4); // never more than 4 in a row: then one plain step, whose cost is measured
  });

  it('traces what each choice read and what the step measured (off by default)', () => {
    const events: CostPolicyTraceEvent[] = [];
    const c = costs(1, 0.2, 0.5);
    const p = new CostDraftPolicy(c, { ...noExplore, trace: (e) => events.push(e) });
    const [k] = p.choose([cand('a', 6)]);
    p.observe('a', k!, 1);
    p.observeStep(1, k! + 1, 1, k!, 2, 0.5);
    p.observeOverhead(0.3, true, k! + 1, { sequences: 1, drafting: 1, drafts: k! });
    expect(events.map((e) => e.kind)).toEqual(['choose', 'observe', 'step', 'overhead']);
    const ch = events[0]!;
    if (ch.kind !== 'choose') throw new Error('expected a choose event');
    expect(ch.candidates[0]!.k).toBe(k);
    expect(ch.candidates[0]!.means).toEqual(new Array(6).fill(0.7));
    expect(ch.curve.length).toBe(7); // D = 0 … 6
    const st = events[2]!;
    if (st.kind !== 'step') throw new Error('expected a step event');
    expect(st.calibratedVerifyMs).toBeCloseTo(c.verifyMs(1, k! + 1), 12);
  });

  it('keeps a plain choice for 7 more steps of the same batch; a new batch or a drafting choice recomputes', () => {
    const events: CostPolicyTraceEvent[] = [];
    // verify rows far too dear: plain is the choice
    const p = new CostDraftPolicy(costs(1, 5, 5), { ...noExplore, trace: (e) => events.push(e) });
    const batch = [cand('a', 4), cand('b', 4)];
    for (let i = 0; i < 10; i++) expect(p.choose(batch)).toEqual([0, 0]);
    // worked out (the a_j read) at steps 0 and 8 only
    const worked = events.flatMap((e, i) => (e.kind === 'choose' && e.candidates[0]!.means.length > 0 ? [i] : []));
    expect(worked).toEqual([0, 8]);
    p.choose([cand('a', 4), cand('c', 4)]);
    const last = events.at(-1);
    if (last?.kind !== 'choose') throw new Error('expected a choose event');
    expect(last.candidates[0]!.means.length).toBe(4);
  });

  it('lets at most one sequence of the batch explore per exploreEvery batch steps', () => {
    // drafting at the prior's acceptance does not pay; at acceptance 1 it would: worth exploring
    const p = new CostDraftPolicy(costs(20, 1, 1, [1, 8]), { prior: 0.3, exploreEvery: 4, exploreDrafts: 2 });
    const batch = Array.from({ length: 8 }, (_, i) => cand(`s${i}`));
    const explored = Array.from({ length: 40 }, () => p.choose(batch).filter((k) => k > 0).length);
    expect(Math.max(...explored)).toBe(1);
    // every sequence is due after 4 plain steps; one goes every 4 batch steps
    expect(explored.map((n, i) => (n > 0 ? i : -1)).filter((i) => i >= 0)).toEqual([4, 8, 12, 16, 20, 24, 28, 32, 36]);
  });

  it('does not explore where drafting could not pay even if every draft were accepted', () => {
    // t_verify = 1 + 5·rows, a propose 5 ms: at one sequence 15 drafts all accepted would beat plain (16 tokens in
    // 86 ms against 1 in 6), at 8 sequences nothing does (8 tokens in 41 ms against 23 in 121): explored at one only
    const explorations = (B: number) => {
      const p = new CostDraftPolicy(costs(1, 5, 5, [1, 8]), { prior: 0.9, exploreEvery: 4, exploreDrafts: 2 });
      const batch = Array.from({ length: B }, (_, i) => cand(`s${i}`));
      return Array.from({ length: 40 }, () => p.choose(batch).filter((k) => k > 0).length).reduce((a, n) => a + n);
    };
    expect(explorations(1)).toBeGreaterThan(0);
    expect(explorations(8)).toBe(0);
  });

  it('charges a catch-up over the mean drafting run that explorations do not shorten', () => {
    // drafting at the prior does not pay, so every drafting step is an exploration of one step; catch-ups cost
    // 0.02 ms a row, each sequence's 40 deferred rows shared by the steps of a drafting run (the prior run: 8 steps)
    const events: CostPolicyTraceEvent[] = [];
    const p = new CostDraftPolicy(costs(20, 1, 1, [1, 8]), {
      prior: 0.3,
      exploreEvery: 4,
      exploreDrafts: 2,
      trace: (e) => events.push(e),
    });
    p.observeContext(100, 2);
    const batch = Array.from({ length: 8 }, (_, i) => ({ ...cand(`s${i}`), pendingContextRows: 40 }));
    const explored = Array.from({ length: 41 }, () => p.choose(batch).filter((k) => k > 0).length);
    expect(explored.reduce((a, n) => a + n)).toBe(10);
    const last = events.filter((e) => e.kind === 'choose').at(-1);
    if (last?.kind !== 'choose') throw new Error('expected a choose event');
    expect(last.catchUpMsPerRow).toBeCloseTo(0.02, 12);
    // the nine one-step explorations that ended, folded in, would have read 40 / (8·0.8⁹ + 1 − 0.8⁹) = 20.6
    for (const rows of last.catchUpRows) expect(rows).toBeCloseTo(40 / 8, 12);
  });

  it('charges the rows of one drafting step whole and shares the backlog over the steps a sequence has left', () => {
    const events: CostPolicyTraceEvent[] = [];
    const p = new CostDraftPolicy(costs(20, 1, 1, [1, 4, 8]), { ...noExplore, trace: (e) => events.push(e) });
    p.observeContext(100, 2);
    const charged = (cs: readonly Parameters<CostDraftPolicy['choose']>[0][number][]) => {
      p.choose(cs);
      const e = events.filter((x) => x.kind === 'choose').at(-1);
      if (e?.kind !== 'choose') throw new Error('expected a choose event');
      return e.catchUpRows;
    };
    // from the prior means: the rows a step with one draft commits, and the tokens a step brings at maxDrafts 3
    const e = p.acceptance.expectedCommitted('a', 3, 0);
    const [one, perStep] = [e[1]!, e[3]!];
    expect(one).toBeGreaterThan(1);
    expect(perStep).toBeGreaterThan(one);
    const rows = charged([
      { ...cand('a', 3), pendingContextRows: 1, remainingTokens: 200 }, // under one step's rows: whole
      { ...cand('b', 3), pendingContextRows: 101, remainingTokens: 200 }, // the backlog over 200 / perStep steps
      { ...cand('c', 3), pendingContextRows: 101, remainingTokens: 1 }, // at least one step: whole
      { ...cand('d', 3), pendingContextRows: 101 }, // no remainingTokens: over the mean drafting run (prior 8)
      { ...cand('e', 0), pendingContextRows: 101, remainingTokens: 200 }, // cannot draft: whole
    ]);
    expect(rows[0]).toBe(1);
    expect(rows[1]).toBeCloseTo(one + (101 - one) / (200 / perStep), 12);
    expect(rows[2]).toBeCloseTo(101, 12);
    expect(rows[3]).toBeCloseTo(101 / 8, 12);
    expect(rows[4]).toBe(101);
  });

  it('drafts with a long backlog when the sequence has many tokens left', () => {
    // drafting pays by far at acceptance 0.9 but for a catch-up of 2 ms a row: 1,000 deferred rows cost 2 s, which
    // the mean drafting run (8 steps) prices out and 10,000 tokens left do not
    const ks = (remainingTokens?: number) => {
      const p = new CostDraftPolicy(costs(10, 0.1, 0.5), { ...noExplore, prior: 0.9 });
      p.observeContext(100, 200);
      return p.choose([{ ...cand('a', 8), pendingContextRows: 1000, remainingTokens }])[0];
    };
    expect(ks()).toBe(0);
    expect(ks(10_000)).toBeGreaterThan(0);
  });

  it('lets drafting runs go on through the forced plain steps', () => {
    // drafting pays from the start; every fifth step is a forced plain step (explorePlainEvery 4)
    const events: CostPolicyTraceEvent[] = [];
    const p = new CostDraftPolicy(costs(1, 1, 0.1), {
      ...noExplore,
      prior: 0.9,
      explorePlainEvery: 4,
      trace: (e) => events.push(e),
    });
    p.observeContext(100, 2);
    const ks = Array.from({ length: 25 }, () => p.choose([cand('a')])[0]!);
    expect(ks.map((k, i) => (k === 0 ? i : -1)).filter((i) => i >= 0)).toEqual([4, 9, 14, 19, 24]);
    /** The rows charged to 'b' with 100 deferred rows and no remainingTokens: 100 ÷ the mean drafting run. */
    const charged = () => {
      p.choose([{ ...cand('b'), pendingContextRows: 100 }]);
      const e = events.filter((x) => x.kind === 'choose').at(-1);
      if (e?.kind !== 'choose') throw new Error('expected a choose event');
      return e.catchUpRows[0]!;
    };
    // the run of 'a' has not ended: still the prior 8 (runs ended at each forced step would read 100 / 4.8)
    expect(charged()).toBeCloseTo(100 / 8, 12);
    p.release('a'); // 20 drafting steps: 0.8·8 + 0.2·20 = 10.4
    expect(charged()).toBeCloseTo(100 / 10.4, 12);
  });

  it('explores after a run of plain steps, with a growing interval', () => {
    const p = new CostDraftPolicy(costs(1, 1, 5), { prior: 0.9, exploreEvery: 4, exploreDrafts: 2 });
    const ks = Array.from({ length: 20 }, () => p.choose([cand('a')])[0]);
    expect(ks.map((k, i) => (k! > 0 ? i : -1)).filter((i) => i >= 0)).toEqual([4, 13]); // after 4, then 8 plain steps
    expect(fixedDraftPolicy(7).choose([cand('a', 3), cand('b')])).toEqual([3, 7]);
  });

  /**
   * Runs `steps` steps of 4 sequences under a rule that believes verify rows dear (it decodes plainly), on a machine
   * where a plain step takes 4 ms and a drafting step `draftMs`, every first draft accepted; the realised rates
   * reported as the engine does. Returns each step's ks.
   */
  function armsRun(draftMs: number, steps: number, options: { realizedArms?: boolean; report?: boolean } = {}) {
    // recalibrate off: the rule's model stays wrong whatever the steps measure, so only the arms can tell
    const p = new CostDraftPolicy(costs(2, 1.5, 2, [4]), {
      ...noExplore,
      explorePlainEvery: 0,
      recalibrate: false,
      prior: 0.8,
      ...(options.realizedArms === undefined ? {} : { realizedArms: options.realizedArms }),
    });
    const ids = ['a', 'b', 'c', 'd'];
    const out: number[][] = [];
    for (let step = 0; step < steps; step++) {
      const ks = p.choose(ids.map((id) => cand(id, 4)));
      out.push(ks);
      // the rule drafts nothing here: a drafting step is the arm of one draft for all, verified whatever its confidence
      if (ks.some((k) => k > 0)) {
        expect(ks).toEqual([1, 1, 1, 1]);
        expect(p.threshold).toBe(0);
      }
      let committed = 0;
      ids.forEach((id, s) => {
        p.observe(id, ks[s]!, Math.min(ks[s]!, 1));
        committed += 1 + Math.min(ks[s]!, 1);
      });
      if (options.report !== false) p.observeRealized(4, committed, ks.some((k) => k > 0) ? draftMs : 4);
    }
    return out;
  }
  const drafting = (steps: readonly number[][]): number => steps.filter((ks) => ks.some((k) => k > 0)).length;

  it('realised-rate arms: one draft for all overrules a plain rule when its steps commit more per ms', () => {
    const steps = armsRun(5, 1001); // drafting: 8 tokens in 5 ms against 4 tokens in 4 ms
    // the first step has no report to go by; then the arms take turns a block each (the rule, one draft for all,
    // plain) until each ran ARM_MIN_STEPS steps
    const rounds = ARM_MIN_STEPS / ARM_BLOCK;
    const turns = Array.from({ length: 3 * rounds }, (_, i) => i % 3 === 1).flatMap((d) =>
      new Array<boolean>(ARM_BLOCK).fill(d),
    );
    expect(steps.slice(0, 1 + turns.length).map((ks) => ks.some((k) => k > 0))).toEqual([false, ...turns]);
    // then the arm that realises more: the others' bounds stay below it for ~900 steps (a gap of 60 %), then each is
    // tried again for a block
    expect(drafting(steps.slice(-800))).toBeGreaterThanOrEqual(800 - 2 * ARM_BLOCK);
  });

  it("realised-rate arms: rows plain steps deferred are charged to them, a prompt's rows to the drafts", () => {
    /**
     * 4 sequences, a plain step 4 ms, a drafting step 5 ms plus its catch-up: 1 ms a row of the rows the sequence's
     * plain steps deferred since it last drafted, and `promptRows` more (1 ms each) at each drafting step.
     */
    let rates: number[] | undefined;
    const run = (promptRows: number): number[][] => {
      const p = new CostDraftPolicy(costs(2, 1.5, 2, [4]), {
        ...noExplore,
        explorePlainEvery: 0,
        recalibrate: false,
        prior: 0.8,
      });
      const ids = ['a', 'b', 'c', 'd'];
      const behind = new Map(ids.map((id) => [id, 0]));
      const out: number[][] = [];
      for (let step = 0; step < 601; step++) {
        const ks = p.choose(ids.map((id) => cand(id, 4)));
        out.push(ks);
        const draftingStep = ks.some((k) => k > 0);
        let rows = 0;
        if (draftingStep) {
          for (const id of ids) rows += behind.get(id)!;
          rows += promptRows;
          if (rows > 0) p.observeContext(rows, rows);
        }
        ids.forEach((id, s) => {
          p.observe(id, ks[s]!, Math.min(ks[s]!, 1));
          behind.set(id, ks[s]! > 0 ? 0 : behind.get(id)! + 1);
        });
        p.observeRealized(4, draftingStep ? 8 : 4, draftingStep ? 5 + rows : 4);
      }
      rates = p.realizedRates(4);
      return out;
    };
    // the arms' blocks take turns: a drafting block's first step writes what the plain blocks deferred (16 ms and
    // more), which would make drafting read 8 tokens in 9 ms a step over its block; charged to the plain steps (1 ms a
    // row each), plain reads 4 tokens in 8 ms, and drafting, 8 in 5, runs
    expect(drafting(run(0).slice(-400))).toBe(400);
    expect(rates![1]).toBeCloseTo(8 / 5, 12);
    expect(rates![2]).toBeCloseTo(4 / (4 + 4), 12); // the catch-ups' 1 ms a row (every one of them)
    // 16 prompt rows written at every drafting step (21 ms for 8 tokens): they stay with the drafts, which lose
    expect(drafting(run(16).slice(-400))).toBe(0);
  });

  it('realised-rate arms: the rule stands where drafts realise less; a close arm is retried as its count fades', () => {
    // drafting, 8 tokens in 12 ms, 33 % below: one block at most as its count fades
    expect(drafting(armsRun(12, 1001).slice(-800))).toBeLessThanOrEqual(ARM_BLOCK);
    // 8 tokens in 8.2 ms, 2.4 % below the others: explored, a block at a time, as its bound overtakes theirs
    const close = armsRun(8.2, 1001).slice(-800);
    expect(drafting(close)).toBeGreaterThanOrEqual(2 * ARM_BLOCK);
    expect(drafting(close)).toBeLessThan(800 * 0.15);
    expect(drafting(close) % ARM_BLOCK).toBe(0);
    expect(drafting(armsRun(5, 100, { realizedArms: false }))).toBe(0);
    expect(drafting(armsRun(5, 100, { report: false }))).toBe(0);
    // one sequence: the rule alone (a plain choice under dear rows), however the steps realise
    const p = new CostDraftPolicy(costs(2, 5, 5, [1]), { ...noExplore, recalibrate: false });
    for (let step = 0; step < 100; step++) {
      expect(p.choose([cand('a', 4)])).toEqual([0]);
      p.observe('a', 0, 0);
      p.observeRealized(1, 1, 4);
    }
  });
});
