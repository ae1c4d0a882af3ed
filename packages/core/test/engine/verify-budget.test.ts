// Adaptive verification (verify budgets, engine/draft-policy.ts): the survival stopping rule of the
// cost policy and the engine's budget hook, against toy models (no method name anywhere):
// - budgets are the prefixes whose survival Π c_l ≥ λ, and the decision for draft j never depends
//   on c_{j+1} …; λ = R*·δ grows with the marginal verify cost;
// - greedy output with the rule equals plain decoding (budgets of 0 included), budgets recorded;
// - sampled decoding stays exact (χ² of the engine-sampling toy, with confidences that depend on the
//   token before each draft), and a rule that peeks at c_{j+1} is caught by the same χ².
import { describe, expect, it } from 'vitest';

import {
  CostDraftPolicy,
  RequestMetrics,
  samplingProbs,
  sampleFromProbs,
  SpecEngine,
  StepCosts,
  survivalBudget,
  type BucketCosts,
  type BudgetItem,
  type DraftPolicy,
} from '../../src/engine/index.js';
import type { SequenceCache } from '../../src/kv/index.js';
import type {
  CacheGeometry,
  DraftBatch,
  Drafter,
  DraftProposal,
  ForwardBatch,
  ForwardResult,
  PrefixCommit,
  StageInfo,
  StageModel,
} from '../../src/plugin/index.js';

const KS = [0, 1, 2, 4, 8];
/**
 * Synthetic costs (ms, large so the measured overhead of the toy step is negligible): t_verify = base + perRow·rows,
 * t_draft flat.
 */
function costs(base: number, perRow: number, draft: number): StepCosts {
  return new StepCosts([
    {
      sequences: 1,
      ks: KS,
      verifyMs: KS.map((k) => base + perRow * (k + 1)),
      draftMs: KS.map((k) => (k === 0 ? 0 : draft)),
    } satisfies BucketCosts,
  ]);
}
const cand = (id: string, maxDrafts = 7) => ({ id, maxDrafts, metrics: new RequestMetrics() });
const noExplore = { exploreEvery: 0 } as const;

/** Reference: the longest prefix whose every survival is ≥ λ. */
function prefixBudget(c: readonly number[], lambda: number): number {
  let s = 1;
  for (let j = 0; j < c.length; j++) {
    s *= c[j]!;
    if (s < lambda) return j;
  }
  return c.length;
}

/** A small deterministic PRNG for the property checks. */
function lcg(seed: number): () => number {
  let x = seed >>> 0;
  return () => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    return x / 2 ** 32;
  };
}

describe('survival rule', () => {
  it('budget = the prefix with S_j = Π_{l ≤ j} c_l ≥ λ; the decision for draft j ignores c_{j+1} …', () => {
    const rnd = lcg(7);
    for (let t = 0; t < 2000; t++) {
      const k = 1 + Math.floor(rnd() * 7);
      const c = Float32Array.from({ length: k }, () => rnd());
      const lambda = rnd() * 0.5;
      const b = survivalBudget(c, lambda);
      expect(b).toBe(prefixBudget([...c], lambda));
      // same c_1..c_j, anything after: the same decision for every draft ≤ j
      const j = Math.floor(rnd() * k);
      const c2 = Float32Array.from(c, (v, i) => (i <= j ? v : rnd()));
      const b2 = survivalBudget(c2, lambda);
      expect(Math.min(b2, j + 1)).toBe(Math.min(b, j + 1));
    }
    expect(survivalBudget(Float32Array.of(0.9, 0.9, 0.1, 0.99), 0.5)).toBe(2);
    expect(survivalBudget(Float32Array.of(0.3, 1, 1), 0.5)).toBe(0);
    expect(survivalBudget(new Float32Array(0), 0.5)).toBe(0);
  });

  it('reads c_j only after drafts < j passed (a poisoned later confidence is never touched)', () => {
    const seen: number[] = [];
    const c = new Proxy([0.9, 0.2, 0.9, 0.9], {
      get: (a, p) => {
        if (typeof p === 'string' && /^\d+$/.test(p)) seen.push(Number(p));
        return Reflect.get(a, p) as unknown;
      },
    });
    expect(survivalBudget(c, 0.5)).toBe(1);
    expect(Math.max(...seen)).toBe(1); // c_3, c_4 were not read
  });

  it("CostDraftPolicy: λ = R*·δ from the same step's choice; dearer verify → larger λ → shorter budgets", () => {
    const cheap = new CostDraftPolicy(costs(100, 2, 10), { ...noExplore, prior: 0.8 });
    const dear = new CostDraftPolicy(costs(100, 40, 10), { ...noExplore, prior: 0.8 });
    const ks = [cheap, dear].map((p) => p.choose([cand('a'), cand('b')]));
    expect(ks[0]!.every((k) => k > 0)).toBe(true);
    for (const p of [cheap, dear]) {
      expect(p.threshold).toBeCloseTo(p.predictedRate * p.marginalVerifyMs, 12);
      expect(p.threshold).toBeGreaterThan(0);
    }
    expect(dear.threshold).toBeGreaterThan(cheap.threshold * 5);
    const items: BudgetItem[] = [
      { id: 'a', confidence: Float32Array.of(0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5) },
      { id: 'b', confidence: Float32Array.of(0.6, 0.5, 0.9, 0.9, 0.9, 0.9, 0.9) },
    ];
    const bc = cheap.budgets(items);
    const bd = dear.budgets(items);
    items.forEach((it, i) => {
      // on the calibrated confidences (before any observation: each bin's middle)
      const a = (p: CostDraftPolicy) => [...it.confidence].map((c) => p.calibration.map(c));
      expect(bc[i]).toBe(prefixBudget(a(cheap), cheap.threshold));
      expect(bd[i]).toBe(prefixBudget(a(dear), dear.threshold));
      expect(bd[i]!).toBeLessThanOrEqual(bc[i]!);
    });
    expect(bd.reduce((a, b) => a + b, 0)).toBeLessThan(bc.reduce((a, b) => a + b, 0));
    console.log(
      `λ cheap verify ${cheap.threshold.toFixed(4)} (R* ${cheap.predictedRate.toFixed(4)}/ms, δ ` +
        `${cheap.marginalVerifyMs} ms), dear ${dear.threshold.toFixed(4)}; budgets ${bc} vs ${bd}`,
    );
  });

  it('δ reads the verify shapes the policy measured, not the bare calibration (a slow spell calibrated it)', () => {
    // calibrated 40 ms a verify row; measured: plain 101 ms, 1–4 drafts 102–105 ms (1 ms a row)
    const p = new CostDraftPolicy(costs(100, 40, 10), { ...noExplore, prior: 0.9, costOptimism: false });
    for (let r = 0; r <= 4; r++) for (let i = 0; i < 3; i++) p.observeStep(1, 1 + r, r > 0 ? 1 : 0, r, 101 + r, 10, r);
    const ks = p.choose([cand('a', 4)]);
    expect(ks[0]).toBe(4);
    expect(p.marginalVerifyMs).toBeCloseTo(1, 9); // (105 − 101) / 4, where the calibration reads 40
    expect(p.threshold).toBeCloseTo(p.predictedRate * 1, 9);
  });

  it('δ reads the optimistic price of the shape the rule chose as free: the budgets let it be verified', () => {
    // as above, 4 drafts never measured: the rule drafts 4 taking the fourth row as free (at 3 drafts' 104 ms)
    const p = new CostDraftPolicy(costs(100, 40, 10), { ...noExplore, prior: 0.9 });
    for (let r = 0; r <= 3; r++) for (let i = 0; i < 3; i++) p.observeStep(1, 1 + r, r > 0 ? 1 : 0, r, 101 + r, 10, r);
    expect(p.choose([cand('a', 4)])).toEqual([4]);
    expect(p.marginalVerifyMs).toBeCloseTo(3 / 4, 9); // (104 − 101) / 4; without the optimism in δ: (216 − 101) / 4
    // so a draft of confidence 0.9 is verified (λ = R*·δ ≈ 0.5 tokens/ms · 0.75 ms)
    expect(p.threshold).toBeLessThan(0.5);
  });

  it('budgets read the calibrated confidences: drafts learned to be accepted pass where the raw product stops', () => {
    const p = new CostDraftPolicy(costs(100, 10, 10), { ...noExplore, prior: 0.8 });
    p.choose([cand('a')]);
    p.threshold = 0.5;
    const two = [{ id: 'a', confidence: Float32Array.of(0.35, 0.35) }];
    expect(p.budgets(two)).toEqual([0]); // prior: 0.35 → 0.35 < λ
    // 300 drafts of confidence 0.35, every one accepted
    for (let i = 0; i < 300; i++) {
      p.threshold = 0;
      expect(p.budgets([{ id: 'a', confidence: Float32Array.of(0.35) }])).toEqual([1]);
      p.observe('a', 1, 1);
    }
    expect(p.calibration.map(0.35)).toBeGreaterThan(0.95);
    p.threshold = 0.5;
    expect(p.budgets(two)).toEqual([2]);
    // only decided drafts teach it: a draft after the first rejection is not observed
    const q = new CostDraftPolicy(costs(100, 10, 10), { ...noExplore, prior: 0.8 });
    q.choose([cand('a')]);
    q.threshold = 0;
    for (let i = 0; i < 300; i++) {
      q.budgets([{ id: 'a', confidence: Float32Array.of(0.15, 0.95) }]);
      q.observe('a', 2, 0); // the first draft rejected: the second was never decided
    }
    expect(q.calibration.map(0.15)).toBeLessThan(0.01);
    expect(q.calibration.map(0.95)).toBeCloseTo(0.97, 6);
  });

  it('λ is fixed at choose (before the drafts): budgets of one step do not change λ', () => {
    const p = new CostDraftPolicy(costs(100, 10, 10), { ...noExplore, prior: 0.8 });
    p.choose([cand('a')]);
    const lambda = p.threshold;
    p.budgets([{ id: 'a', confidence: Float32Array.of(0.1, 0.1) }]);
    p.budgets([{ id: 'a', confidence: Float32Array.of(0.99, 0.99) }]);
    expect(p.threshold).toBe(lambda);
  });
});

// --- greedy through the engine ------------------------------------------------------------------

const GV = 32;
const gnext = (t: number) => (t * 7 + 3) % GV;

class ToyTarget implements StageModel {
  readonly info: StageInfo = {
    numLayers: 1,
    layerStart: 0,
    layerEnd: 1,
    hiddenSize: 4,
    vocabSize: GV,
    isFirst: true,
    isLast: true,
    layerKinds: ['attn'],
  };
  readonly cacheGeometry: CacheGeometry = {
    pagedKv: { layers: [0], floatsPerToken: 1 },
    linearState: { layers: [], heads: 1, keyDim: 1, valueDim: 1, convStates: 0, convChannels: 0, convWidth: 0 },
  };
  forward(batch: ForwardBatch, cache: SequenceCache): ForwardResult {
    const rows: number[] = [];
    const start = new Int32Array(batch.sequences.length + 1);
    batch.sequences.forEach((s, i) => {
      expect(cache.length(s.id)).toBe(s.position);
      cache.extend(s.id, s.position + s.tokens.length);
      if (s.logits === 'all') rows.push(...s.tokens);
      else if (s.logits === 'last') rows.push(s.tokens[s.tokens.length - 1]!);
      start[i + 1] = rows.length;
    });
    const logits = new Float32Array(rows.length * GV);
    rows.forEach((t, r) => {
      logits[r * GV + gnext(t)] = 10;
    });
    const n = batch.sequences.reduce((a, s) => a + s.tokens.length, 0);
    return { logits, logitRowStart: start, hidden: new Float32Array(n * 4), taps: new Map() };
  }
  dispose(): void {}
}

/**
 * Drafts right while (position + j) % 5 ≠ 0, with a confidence from the token before each draft
 * (low before a wrong draft, sometimes low at the first draft → budget 0); checks the draft context
 * positions (the engine's draft-context bookkeeping after a cut: DraftContextWriter defer / write).
 */
class ConfidentDrafter implements Drafter {
  readonly method = 'toy-confident';
  readonly maxDraftTokens = 6;
  readonly pagesInUse = 0;
  private readonly ctx = new Map<unknown, number>();
  captureSetter(): readonly number[] {
    return [];
  }
  projectTargetHiddenPartial(_t: ReadonlyMap<number, Float32Array>, n: number, acc?: Float32Array): Float32Array {
    return acc ?? new Float32Array(n * 4);
  }
  writeProjectedContextKV(
    _sum: Float32Array,
    spans: readonly { id: unknown; position: number; numTokens: number }[],
  ): void {
    for (const s of spans) {
      expect(this.ctx.get(s.id)).toBe(s.position);
      this.ctx.set(s.id, s.position + s.numTokens);
    }
  }
  propose(batch: DraftBatch): DraftProposal[] {
    return batch.sequences.map((s) => {
      expect(this.ctx.get(s.id)).toBe(s.position);
      const d = new Int32Array(s.maxDrafts);
      const c = new Float32Array(s.maxDrafts);
      let t = s.lastToken;
      for (let j = 0; j < d.length; j++) {
        const wrong = (s.position + j + 1) % 5 === 0;
        c[j] = wrong ? 0.2 : t % 3 === 0 ? 0.5 : 0.97; // from the token before draft j
        t = gnext(t);
        d[j] = wrong ? (t + 1) % GV : t;
        t = d[j]!;
      }
      return { id: s.id, tokens: d, confidence: c };
    });
  }
  addSequence(id: unknown): void {
    this.ctx.set(id, 0);
  }
  contextLength(id: unknown): number {
    return this.ctx.get(id)!;
  }
  freeSequence(id: unknown): void {
    this.ctx.delete(id);
  }
  dispose(): void {}
}

describe('engine with verify budgets (greedy)', () => {
  const reqs = () =>
    [3, 8, 11, 20].map((x, i) => ({
      id: `r${i}`,
      promptIds: Int32Array.of(1, x),
      maxTokens: 40,
      sampling: { temperature: 0 },
      seed: 0,
    }));
  it('output equals plain decoding; budgets < max (and 0) recorded; nothing leaks', () => {
    const plain = new SpecEngine(new ToyTarget(), undefined, {
      maxSequences: 4,
      maxTokensPerSequence: 64,
      pageSize: 4,
    }).run(reqs());
    const policy = new CostDraftPolicy(costs(100, 20, 10), noExplore);
    const drafter = new ConfidentDrafter();
    const e = new SpecEngine(new ToyTarget(), drafter, {
      maxSequences: 4,
      maxTokensPerSequence: 64,
      pageSize: 4,
      draftPolicy: policy,
    });
    const rs = e.run(reqs());
    const byId = new Map(rs.map((r) => [r.id, r.tokenIds]));
    for (const p of plain) expect(byId.get(p.id)).toEqual(p.tokenIds);
    const m = e.metrics;
    const h = m.budgetHistogram;
    console.log(
      `toy greedy: λ ${policy.threshold.toFixed(3)}, budget histogram ${JSON.stringify(h)}, mean ` +
        `${m.meanBudget.toFixed(2)}, unverified ${m.unverified}, τ ${m.tauPerStep.toFixed(2)}`,
    );
    expect(h.reduce((a, b) => a + b, 0)).toBeGreaterThan(0);
    expect(h[0]).toBeGreaterThan(0); // some steps cut to a plain decode step after propose
    expect(h.slice(1, 6).some((c) => c > 0)).toBe(true); // some cut short of the maximum
    expect(m.unverified).toBeGreaterThan(0);
    expect(m.accepted).toBeGreaterThan(0);
    expect(m.meanBudget).toBeGreaterThan(0);
    expect(m.meanBudget).toBeLessThan(6);
    expect(m.requests.every((r) => r.toJSON().verify_budget_histogram !== undefined)).toBe(true);
    expect(e.cache.pagesInUse + e.cache.slotsInUse).toBe(0);
  });

  it('verifyBudget "all" and fixed policies never cut (no budgets recorded)', () => {
    for (const opts of [
      { draftPolicy: new CostDraftPolicy(costs(100, 20, 10), noExplore), verifyBudget: 'all' as const },
      { draftPolicy: 'max' as const },
    ]) {
      const e = new SpecEngine(new ToyTarget(), new ConfidentDrafter(), {
        maxSequences: 4,
        maxTokensPerSequence: 64,
        pageSize: 4,
        ...opts,
      });
      e.run(reqs());
      expect(e.metrics.budgetHistogram).toEqual([]);
      expect(e.metrics.unverified).toBe(0);
    }
  });
});

// --- sampled: χ² through the engine (the engine-sampling toy with confidences) ---------------------

const V = 4;
const P = [
  [0.1, 0.4, 0.3, 0.2],
  [0.5, 0.1, 0.1, 0.3],
  [0.25, 0.25, 0.25, 0.25],
  [0.05, 0.15, 0.6, 0.2],
];
const Q = [
  [0.4, 0.1, 0.1, 0.4],
  [0.1, 0.6, 0.2, 0.1],
  [0.7, 0.1, 0.1, 0.1],
  [0.25, 0.25, 0.25, 0.25],
];
/** Confidence of a draft from the token before it (so c_{j+1} is a function of d_j). */
const CONF = [0.9, 0.15, 0.6, 0.35];
const logRow = (m: number[][], t: number) => Float32Array.from(m[t]!, Math.log);

class ChainTarget implements StageModel, PrefixCommit {
  readonly info: StageInfo = {
    numLayers: 1,
    layerStart: 0,
    layerEnd: 1,
    hiddenSize: 2,
    vocabSize: V,
    isFirst: true,
    isLast: true,
    layerKinds: ['x'],
  };
  readonly cacheGeometry: CacheGeometry = {
    pagedKv: { layers: [0], floatsPerToken: 1 },
    linearState: { layers: [], heads: 1, keyDim: 1, valueDim: 1, convStates: 0, convChannels: 0, convWidth: 0 },
  };
  readonly starts = new Map<string | number, number>();
  forward(batch: ForwardBatch, cache: SequenceCache): ForwardResult {
    const rows: number[] = [];
    const start = new Int32Array(batch.sequences.length + 1);
    batch.sequences.forEach((s, i) => {
      this.starts.set(s.id, s.position);
      cache.extend(s.id, s.position + s.tokens.length);
      if (s.logits === 'all') rows.push(...s.tokens);
      else if (s.logits === 'last') rows.push(s.tokens[s.tokens.length - 1]!);
      start[i + 1] = rows.length;
    });
    const logits = new Float32Array(rows.length * V);
    rows.forEach((t, r) => {
      logits.set(logRow(P, t), r * V);
    });
    const n = batch.sequences.reduce((a, s) => a + s.tokens.length, 0);
    return { logits, logitRowStart: start, hidden: new Float32Array(n * 2), taps: new Map() };
  }
  commitPrefix(cache: SequenceCache, _r: ForwardResult, id: string | number, committed: number): void {
    cache.rollback(id, { length: this.starts.get(id)! + committed, state: undefined });
  }
  dispose(): void {}
}

/** Samples from the chain Q (q returned), with confidence c_j = CONF[token before draft j]. */
class ChainDrafter implements Drafter {
  readonly method = 'chain';
  readonly maxDraftTokens = 3;
  readonly pagesInUse = 0;
  captureSetter(): readonly number[] {
    return [];
  }
  projectTargetHiddenPartial(_t: ReadonlyMap<number, Float32Array>, n: number): Float32Array {
    return new Float32Array(n * 2);
  }
  writeProjectedContextKV(): void {}
  propose(batch: DraftBatch): DraftProposal[] {
    return batch.sequences.map((s) => {
      const tokens = new Int32Array(s.maxDrafts);
      const probs = new Float32Array(s.maxDrafts * V);
      const confidence = new Float32Array(s.maxDrafts);
      let t = s.lastToken;
      for (let j = 0; j < tokens.length; j++) {
        confidence[j] = CONF[t]!;
        const q = samplingProbs(logRow(Q, t), V, s.sampling);
        probs.set(q, j * V);
        t = sampleFromProbs(q, s.rng);
        tokens[j] = t;
      }
      return { id: s.id, tokens, probs, confidence };
    });
  }
  addSequence(): void {}
  contextLength(): number {
    return 0;
  }
  freeSequence(): void {}
  dispose(): void {}
}

/** NOT lossless (the negative control): verifies draft j only when c_{j+1} — a function of d_j — is high. */
class PeekingPolicy implements DraftPolicy {
  choose(cs: readonly { maxDrafts: number }[]): number[] {
    return cs.map((c) => Math.min(2, c.maxDrafts));
  }
  budgets(items: readonly BudgetItem[]): number[] {
    return items.map((it) => {
      let b = 0;
      while (b < it.confidence.length - 1 && it.confidence[b + 1]! >= 0.5) b++;
      return b;
    });
  }
  observe(): void {}
  release(): void {}
}

const CHI2_CRIT_15 = 37.697; // p = 0.001, 15 degrees of freedom
const N = 10_000;

function chiSquare(policy: DraftPolicy, temperature: number): { chi: number; e: SpecEngine } {
  const e = new SpecEngine(new ChainTarget(), new ChainDrafter(), {
    maxSequences: 256,
    maxTokensPerSequence: 16,
    pageSize: 4,
    draftPolicy: policy,
  });
  const x = 2;
  const rs = e.run(
    Array.from({ length: N }, (_, i) => ({
      id: i,
      promptIds: Int32Array.of(x),
      maxTokens: 3,
      sampling: { temperature },
      seed: Math.imul(i + 1, 2654435761) >>> 0,
    })),
  );
  const counts = new Array<number>(V * V).fill(0);
  for (const r of rs) counts[r.tokenIds[1]! * V + r.tokenIds[2]!]!++;
  const p = (t: number) => samplingProbs(logRow(P, t), V, { temperature });
  const expected = new Array<number>(V * V).fill(0);
  const p0 = p(x);
  for (let a = 0; a < V; a++)
    for (let b = 0; b < V; b++) for (let c = 0; c < V; c++) expected[b * V + c]! += p0[a]! * p(a)[b]! * p(b)[c]!;
  let chi = 0;
  for (let i = 0; i < V * V; i++) chi += (counts[i]! - expected[i]! * N) ** 2 / (expected[i]! * N);
  return { chi, e };
}

describe('engine with verify budgets (sampled, lossless)', () => {
  it.each([1, 0.6])(
    'the survival rule keeps (2nd, 3rd) generated tokens ~ the target chain at temperature %s (χ², 10⁴ requests)',
    (temperature) => {
      // a dear plain step (drafting pays, every step drafts), λ ≈ 0.15: cuts after token 1 (c = 0.15)
      // and where the product falls below λ (e.g. 0.35 · 0.35), so budgets vary with the drafts
      const policy = new CostDraftPolicy(costs(400, 60, 1), { exploreEvery: 0, prior: 0.9 });
      const { chi, e } = chiSquare(policy, temperature);
      const h = e.metrics.budgetHistogram;
      console.log(
        `χ² ${chi.toFixed(1)} (crit ${CHI2_CRIT_15}), λ ` +
          `${policy.threshold.toFixed(3)}, budget histogram ${JSON.stringify(h)}`,
      );
      expect(chi).toBeLessThan(CHI2_CRIT_15);
      expect(h[0]).toBeGreaterThan(0);
      expect(h.slice(1).some((c) => c > 0)).toBe(true);
      expect(e.metrics.unverified).toBeGreaterThan(0);
      expect(e.metrics.accepted).toBeGreaterThan(0);
      expect(e.cache.pagesInUse + e.cache.slotsInUse).toBe(0);
    },
  );

  it('negative control: a budget that peeks at c_{j+1} (a function of d_j) fails the same χ²', () => {
    const { chi, e } = chiSquare(new PeekingPolicy(), 1);
    console.log(`peeking rule: χ² ${chi.toFixed(1)}, budget histogram ${JSON.stringify(e.metrics.budgetHistogram)}`);
    expect(chi).toBeGreaterThan(CHI2_CRIT_15);
  });
});
