/**
 * Batch-level draft-length policies ({@link SpecEngineOptions.draftPolicy}): how many drafts each
 * running sequence gets this step, k ∈ [0, maxDrafts]; k = 0 is a plain decode step for that
 * sequence. Any choice is lossless (the verifier decides what is committed); a policy only trades
 * verify cost against expected committed tokens.
 *
 * {@link CostDraftPolicy} (the engine's default) maximises expected committed tokens per second:
 *   E[committed | k] = 1 + Σ_{i ≤ k} Π_{j ≤ i} a_j      (a_j: P(draft j accepted | drafts < j accepted))
 *   rate(k_1..k_B)   = Σ_s E_s[committed | k_s] /
 *                      (t_draft(drafting sequences, Σ k_s) + t_verify(B, T = Σ (k_s + 1)) + t_overhead
 *                       + t_catch-up(deferred context rows of the sequences that start drafting) ÷ run length)
 * with the costs measured on this machine ({@link StepCosts}: the batch's ONE verify forward costed by its
 * total rows T, corrected online by every step's measured time) and the a_j estimated online per
 * request (EMA) with the run's rates as the fallback ({@link AcceptanceEstimator}). The ks come from the
 * batch goodput rule of batch-draft-lengths.ts (SmartSpec, arXiv 2406.14066; TETRIS, arXiv 2502.15197): the
 * batch's draft rows go to the drafts of highest cumulative acceptance, as many as raise the goodput. With one
 * sequence this is argmax_k E[committed | k] / (t_draft(k) + t_verify(k)) (REFERENCE.md §4 DSpark
 * adaptive verification, §11); under load the batch's verify cost grows with every drafted row, so
 * it drafts less, down to none. Ties go to fewer drafts.
 *
 * Verify budgets ({@link DraftPolicy.budgets}; adaptive verification, REFERENCE.md §4): when a
 * proposal carries per-draft `confidence` c_j ≈ P(draft j accepted | drafts < j accepted), the
 * cost policy verifies only a prefix of it — draft j iff its survival S_j = Π_{l ≤ j} c_l ≥ λ.
 * Derivation: the step maximises rate = E[committed] / cost with
 *   E[committed] = Σ_s (1 + Σ_{j ≤ k_s} S_sj),  cost = t_draft + t_verify(B, Σ_s (k_s + 1)) + t_overhead.
 * After propose the draft cost is spent; verifying one more draft adds S_sj to the numerator and
 * ∂t_verify/∂tokens = δ to the cost, which raises the rate C/T iff (C + S)/(T + δ) > C/T ⇔ S > (C/T)·δ.
 * At the optimum C/T = R* (the best achievable rate), so the marginal rule is S_sj ≥ λ = R*·δ
 * (Dinkelbach's condition for a ratio objective). R* is taken from {@link CostDraftPolicy.choose}
 * of the same step: the rate it predicted for its choice from the calibrated costs, the measured
 * overhead and the acceptance estimated from EARLIER steps; δ is the secant slope of the calibrated
 * t_verify(B, ·) over the tokens the choice drafts. So λ is fixed before the step's drafts exist.
 * Lossless: S is non-increasing, so the rule is a stopping rule that decides draft j from
 * c_1 … c_j only; c_j is computed before d_j is drawn (DSpark: from the token before draft j), so
 * whether d_j is verified never depends on d_j itself, and rejection sampling stays exact for any
 * stopping rule of that kind. A rule that looked at c_{j+1} (a function of d_j) would not be.
 */

import type { SequenceId } from '../kv/paged-kv-pool.js';
import { type BatchShape, chooseBatchDraftLengths } from './batch-draft-lengths.js';
import type { RequestMetrics } from './metrics.js';
import type { StepCosts } from './step-costs.js';

/** One running sequence offered to a policy. Immutable. */
export interface DraftCandidate {
  readonly id: SequenceId;
  /** Most drafts allowed this step (drafter maximum, capped by the tokens still needed). */
  readonly maxDrafts: number;
  readonly metrics: RequestMetrics;
  /**
   * Rows of deferred draft context (committed tokens of its plain steps) the sequence must write before it drafts
   * again: its lazy catch-up, charged to the step that makes it draft (default 0).
   */
  readonly pendingContextRows?: number;
}

/** A proposal offered to {@link DraftPolicy.budgets}: a sequence's per-draft confidences. */
export interface BudgetItem {
  readonly id: SequenceId;
  /** c_1 … c_k of the proposal (`DraftProposal.confidence`), `[k]` f32, k ≥ 1. */
  readonly confidence: Float32Array;
}

/** A draft-length policy: choose → propose → (budgets) → verify → observe per sequence, release at finish. */
export interface DraftPolicy {
  /** Drafts per candidate, each an integer in [0, candidates[i].maxDrafts]. */
  choose(candidates: readonly DraftCandidate[]): number[];
  /**
   * Verify budgets, called by the engine right after propose (same step as the last `choose`) for
   * the proposals that carry `confidence`: how many leading drafts of each to verify, in
   * [0, confidence.length]; the engine drops the rest (0: a plain decode step for that sequence).
   * Must be lossless: the decision for draft j may use c_1 … c_j and anything known before the
   * step, never c_{j+1} … (they depend on draft j). Absent: every draft is verified.
   */
  budgets?(items: readonly BudgetItem[]): number[];
  /** After verification: `drafted` drafts of sequence `id`, the first `accepted` kept. */
  observe(id: SequenceId, drafted: number, accepted: number): void;
  /**
   * Wall time of a step's work outside the propose call and the verify forward (choosing, accept,
   * commit, writing draft context), ms; `drafted`: whether any sequence drafted in that step; `rows`: the verify
   * forward's rows (default 1).
   */
  observeOverhead?(ms: number, drafted: boolean, rows?: number): void;
  /**
   * The measured cost of the step just run: `sequences` in the verify forward holding `tokens` rows,
   * of which `drafting` sequences proposed `drafts` drafts in all; the verify forward took
   * `verifyMs` and the propose call `proposeMs` (0 when nobody drafted).
   */
  observeStep?(
    sequences: number,
    tokens: number,
    drafting: number,
    drafts: number,
    verifyMs: number,
    proposeMs: number,
  ): void;
  /**
   * A lazy catch-up just ran: `rows` deferred draft-context rows written (projection and draft KV) in `ms` before
   * the propose call of the step.
   */
  observeContext?(rows: number, ms: number): void;
  /** The sequence finished or was aborted. */
  release(id: SequenceId): void;
}

/**
 * The survival stopping rule: the number of leading drafts whose survival S_j = Π_{l ≤ j} c_l is
 * ≥ `threshold`. Reads c_j only after S_1 … S_{j−1} passed, so the decision for draft j depends on
 * c_1 … c_j alone.
 */
export function survivalBudget(confidence: ArrayLike<number>, threshold: number): number {
  let s = 1;
  let k = 0;
  for (; k < confidence.length; k++) {
    s *= confidence[k]!;
    if (!(s >= threshold)) break;
  }
  return k;
}

/** Options of {@link AcceptanceEstimator}. */
export interface AcceptanceEstimatorOptions {
  /** Weight of the newest observation in a request's per-position EMA, (0, 1] (default 0.2). */
  readonly alpha?: number;
  /** Acceptance assumed before anything is observed (default 0.7). */
  readonly prior?: number;
  /** Pseudo-observations of the prior in the run's rates (default 2). */
  readonly priorWeight?: number;
}

/**
 * Per-position conditional acceptance a_j (j = 1-based draft index): the run's counts (drafts j
 * offered = verify steps with k ≥ j whose drafts < j were all accepted; of them, accepted) and a per
 * request EMA. A request's a_j is its EMA once it has seen position j, else the run's rate; a
 * position the run never offered takes the rate of the deepest offered one (or the prior).
 */
export class AcceptanceEstimator {
  private readonly alpha: number;
  private readonly prior: number;
  private readonly priorWeight: number;
  private readonly offered: number[] = [];
  private readonly accepted: number[] = [];
  private readonly ema = new Map<SequenceId, number[]>();

  constructor(options: AcceptanceEstimatorOptions = {}) {
    this.alpha = options.alpha ?? 0.2;
    this.prior = options.prior ?? 0.7;
    this.priorWeight = options.priorWeight ?? 2;
    if (!(this.alpha > 0 && this.alpha <= 1))
      throw new RangeError(`AcceptanceEstimator: alpha: expected (0, 1], got ${this.alpha}`);
    if (!(this.prior >= 0 && this.prior <= 1))
      throw new RangeError(`AcceptanceEstimator: prior: expected [0, 1], got ${this.prior}`);
  }

  /** Records one verify step of `id`: `drafted` drafts, `accepted` kept. */
  observe(id: SequenceId, drafted: number, accepted: number): void {
    let e = this.ema.get(id);
    if (e === undefined) {
      e = [];
      this.ema.set(id, e);
    }
    const seen = Math.min(drafted, accepted + 1); // positions 0..seen-1 were decided
    for (let j = 0; j < seen; j++) {
      const x = j < accepted ? 1 : 0;
      const before = e[j] ?? this.runRate(j);
      this.offered[j] = (this.offered[j] ?? 0) + 1;
      this.accepted[j] = (this.accepted[j] ?? 0) + x;
      e[j] = (1 - this.alpha) * before + this.alpha * x;
    }
  }

  /** The run's a at 0-based position j (see the class comment). */
  runRate(j: number): number {
    let i = Math.min(j, this.offered.length - 1);
    while (i >= 0 && (this.offered[i] ?? 0) === 0) i--;
    if (i < 0) return this.prior;
    return ((this.accepted[i] ?? 0) + this.prior * this.priorWeight) / (this.offered[i]! + this.priorWeight);
  }

  /** a_1..a_n of request `id` (0-based array). */
  rates(id: SequenceId, n: number): number[] {
    const e = this.ema.get(id);
    return Array.from({ length: n }, (_, j) => e?.[j] ?? this.runRate(j));
  }

  /** E[committed | k] for k = 0..n: `[1, 1 + a_1, 1 + a_1 + a_1 a_2, …]`. */
  expectedCommitted(id: SequenceId, n: number): number[] {
    const a = this.rates(id, n);
    const out = [1];
    let p = 1;
    for (let j = 0; j < n; j++) {
      p *= a[j]!;
      out.push(out[j]! + p);
    }
    return out;
  }

  release(id: SequenceId): void {
    this.ema.delete(id);
  }
}

/** Options of {@link CostDraftPolicy}. */
export interface CostDraftPolicyOptions extends AcceptanceEstimatorOptions {
  /**
   * After this many consecutive plain steps (k = 0) a sequence drafts `exploreDrafts` once, so its
   * acceptance estimate keeps up with the text (default 64; 0 = never). Each exploration after
   * which the policy still chooses k = 0 doubles the sequence's interval, up to 16×.
   */
  readonly exploreEvery?: number;
  /** Drafts of an exploration step (default 4). */
  readonly exploreDrafts?: number;
  /**
   * After this many consecutive steps in which every sequence drafted, one step decodes plainly
   * (k = 0 for all), so the plain-step cost keeps being measured (default 32; 0 = never).
   */
  readonly explorePlainEvery?: number;
  /**
   * Correct the calibrated costs from every step's measured times ({@link CostDraftPolicy.costScale}; default true).
   */
  readonly recalibrate?: boolean;
}

/** Per-step overhead observations of each kind skipped before the EMA starts (JIT warm-up). */
export const OVERHEAD_WARMUP = 2;

/** The cost-based policy (see the file comment). */
export class CostDraftPolicy implements DraftPolicy {
  readonly acceptance: AcceptanceEstimator;
  private readonly exploreEvery: number;
  private readonly exploreDrafts: number;
  /** Per sequence: consecutive plain steps, and the current exploration interval. */
  private readonly plainRun = new Map<SequenceId, { run: number; every: number }>();
  /** Calibrated [t_draft, t_verify] by (batch, drafts, drafting sequences); never changes. */
  private readonly memo = new Map<number, number[]>();
  /**
   * EMA of the per-step overhead per verify row (see {@link DraftPolicy.observeOverhead}), ms: [plain steps, steps
   * that drafted]. A drafting step also writes the committed tokens' draft context, restores the
   * linear state from a snapshot and accepts over k + 1 rows — on the tiny target that is more than
   * a whole plain step, and the calibrated forward times do not see it. Per row, because accept and commit work
   * row by row: an overhead learned at one batch size then holds at another (a step's estimate is this × its T).
   * The first {@link OVERHEAD_WARMUP} observations of each kind are skipped (JIT compilation: the first step's
   * accept and commit measured 20 ms on the tiny target, several whole steps).
   */
  private readonly overheadMsPerRow = [0, 0];
  private readonly overheadSeen = [0, 0];
  /**
   * The survival threshold λ = R*·δ of the step last chosen (see the file comment); Infinity
   * before the first choose (nothing is verified without a choice).
   */
  threshold = Number.POSITIVE_INFINITY;
  /** R*: the rate (expected committed tokens per ms) predicted by the last choose. */
  predictedRate = 0;
  /** δ: marginal verify cost per token of the last choose's batch, ms. */
  marginalVerifyMs = 0;
  /**
   * Online correction of the calibration: EMA of measured / calibrated time for [plain verify
   * forwards, verify forwards with drafts, propose calls], clamped to [1/4, 4]. One calibration at
   * start-up is a few milliseconds of samples on a machine whose load changes (bench:spec saw a
   * mis-calibrated engine draft at ×0.6 of plain); every step measures the real cost, so the
   * choice follows the machine. Applied multiplicatively to the calibrated curves.
   */
  readonly costScale = [1, 1, 1];
  private readonly explorePlainEvery: number;
  private readonly recalibrate: boolean;
  /** Consecutive steps in which every sequence drafted. */
  private allDraftingRun = 0;
  /** EMAs of the lazy catch-ups: ms spent and rows written per catch-up (their ratio: ms per row). */
  private catchUpMs = 0;
  private catchUpRows = 0;
  /**
   * EMA of the length of a drafting run (consecutive steps a sequence drafts once it starts), steps; prior 8. A
   * catch-up is paid once per run, so each step of the run is charged its share: rows × ms per row ÷ this. Charging
   * it whole to one step would keep a sequence with a long prompt (all deferred) from ever drafting.
   */
  private draftingRunSteps = 8;
  /** Per sequence: the current drafting run's steps so far (0: not drafting). */
  private readonly draftingRun = new Map<SequenceId, number>();

  constructor(
    readonly costs: StepCosts,
    options: CostDraftPolicyOptions = {},
  ) {
    this.acceptance = new AcceptanceEstimator(options);
    this.exploreEvery = options.exploreEvery ?? 64;
    this.exploreDrafts = options.exploreDrafts ?? 4;
    this.explorePlainEvery = options.explorePlainEvery ?? 32;
    this.recalibrate = options.recalibrate ?? true;
  }

  choose(candidates: readonly DraftCandidate[]): number[] {
    const B = candidates.length;
    if (B === 0) return [];
    // The batch rule (batch-draft-lengths.ts): goodput over the measured cost of the batch's verify of T rows.
    // Before a drafting step was seen, its overhead is assumed equal to a plain step's.
    const plainOverhead = this.overheadMsPerRow[0]!;
    const specOverhead = (this.overheadSeen[1] ?? 0) > OVERHEAD_WARMUP ? this.overheadMsPerRow[1]! : plainOverhead;
    const [plainScale, verifyScale, draftScale] = this.costScale as [number, number, number];
    const catchUpMsPerRow = this.catchUpRows > 0 ? this.catchUpMs / this.catchUpRows / this.draftingRunSteps : 0;
    const cost = (shape: BatchShape): number => {
      const { drafts: d, drafting: dr } = shape;
      // memoised across steps: the calibrated curves never change, and the rule asks at every D
      const key = (B * 4096 + d) * 1024 + dr;
      let c = this.memo.get(key);
      if (c === undefined) {
        c = [this.costs.draftMs(dr, d), this.costs.verifyMs(B, shape.tokens)];
        this.memo.set(key, c);
      }
      return Math.max(
        1e-6,
        c[0]! * draftScale +
          c[1]! * (dr > 0 ? verifyScale : plainScale) +
          (dr > 0 ? specOverhead : plainOverhead) * shape.tokens +
          catchUpMsPerRow * shape.catchUpRows,
      );
    };
    const choice = chooseBatchDraftLengths(
      candidates.map((c) => ({
        gains: this.acceptance.expectedCommitted(c.id, c.maxDrafts),
        catchUpRows: c.pendingContextRows ?? 0,
      })),
      cost,
    );
    const ks = [...choice.ks];
    const best = choice.rate;
    if (this.exploreEvery > 0) {
      candidates.forEach((c, s) => {
        let st = this.plainRun.get(c.id);
        if (st === undefined) {
          st = { run: 0, every: this.exploreEvery };
          this.plainRun.set(c.id, st);
        }
        if (ks[s]! > 0) {
          st.run = 0;
          st.every = this.exploreEvery;
          return;
        }
        if (++st.run > st.every && c.maxDrafts > 0) {
          ks[s] = Math.min(c.maxDrafts, this.exploreDrafts);
          st.run = 0;
          st.every = Math.min(16 * this.exploreEvery, 2 * st.every);
        }
      });
    }
    if (this.explorePlainEvery > 0 && ks.every((k, i) => k > 0 || candidates[i]!.maxDrafts === 0)) {
      if (++this.allDraftingRun > this.explorePlainEvery) {
        ks.fill(0);
        this.allDraftingRun = 0;
      }
    } else {
      this.allDraftingRun = 0;
    }
    candidates.forEach((c, s) => {
      const run = this.draftingRun.get(c.id) ?? 0;
      if (ks[s]! > 0) this.draftingRun.set(c.id, run + 1);
      else if (run > 0) this.endDraftingRun(c.id, run);
    });
    this.setThreshold(B, ks, best);
    return ks;
  }

  /** A sequence's drafting run of `steps` ended (it decodes plainly, or finished): folded into the mean run. */
  private endDraftingRun(id: SequenceId, steps: number): void {
    this.draftingRun.delete(id);
    this.draftingRunSteps = 0.8 * this.draftingRunSteps + 0.2 * steps;
  }

  observeStep(
    sequences: number,
    tokens: number,
    drafting: number,
    drafts: number,
    verifyMs: number,
    proposeMs: number,
  ): void {
    if (!this.recalibrate) return;
    const ema = (i: number, measured: number, calibrated: number): void => {
      if (!(calibrated > 0 && measured > 0)) return;
      const r = Math.min(4, Math.max(0.25, measured / calibrated));
      this.costScale[i] = 0.8 * this.costScale[i]! + 0.2 * r;
    };
    ema(drafting > 0 ? 1 : 0, verifyMs, this.costs.verifyMs(sequences, tokens));
    if (drafting > 0) ema(2, proposeMs, this.costs.draftMs(drafting, drafts));
  }

  /**
   * λ for the step just chosen: R* = `rate` (committed tokens per ms, predicted before any draft
   * exists), δ = secant slope of t_verify(B, ·) from B rows (plain) to B + Σk rows (one more row
   * when nobody drafts), λ = R*·δ.
   */
  private setThreshold(B: number, ks: readonly number[], rate: number): void {
    const d = Math.max(
      1,
      ks.reduce((a, k) => a + k, 0),
    );
    const delta = Math.max(0, (this.costs.verifyMs(B, B + d) - this.costs.verifyMs(B, B)) / d);
    this.predictedRate = rate;
    this.marginalVerifyMs = delta;
    this.threshold = rate * delta;
  }

  /** The survival rule with the threshold of the last choose (see the file comment). */
  budgets(items: readonly BudgetItem[]): number[] {
    return items.map((it) => survivalBudget(it.confidence, this.threshold));
  }

  observe(id: SequenceId, drafted: number, accepted: number): void {
    if (drafted > 0) this.acceptance.observe(id, drafted, accepted);
  }

  observeContext(rows: number, ms: number): void {
    if (!(rows > 0 && ms >= 0)) return;
    const first = this.catchUpRows === 0;
    this.catchUpMs = first ? ms : 0.8 * this.catchUpMs + 0.2 * ms;
    this.catchUpRows = first ? rows : 0.8 * this.catchUpRows + 0.2 * rows;
  }

  observeOverhead(ms: number, drafted: boolean, rows = 1): void {
    const i = drafted ? 1 : 0;
    const seen = ++this.overheadSeen[i]!;
    if (seen <= OVERHEAD_WARMUP || !(rows > 0)) return;
    const perRow = ms / rows;
    this.overheadMsPerRow[i] = seen === OVERHEAD_WARMUP + 1 ? perRow : 0.8 * this.overheadMsPerRow[i]! + 0.2 * perRow;
  }

  release(id: SequenceId): void {
    this.acceptance.release(id);
    this.plainRun.delete(id);
    const run = this.draftingRun.get(id) ?? 0;
    if (run > 0) this.endDraftingRun(id, run);
  }
}

/** A fixed draft length for every sequence (capped by each sequence's maxDrafts). */
export function fixedDraftPolicy(k: number): DraftPolicy {
  if (!(Number.isInteger(k) && k >= 0)) throw new RangeError(`fixedDraftPolicy: k: expected an integer >= 0, got ${k}`);
  return { choose: (cs) => cs.map((c) => Math.min(k, c.maxDrafts)), observe: () => {}, release: () => {} };
}
