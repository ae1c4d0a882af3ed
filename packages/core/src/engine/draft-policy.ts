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
 * total rows T, corrected online by every step's measured time, {@link CostDraftPolicy.costScale}; t_overhead
 * by the step's shape, {@link OverheadModel}) and the a_j estimated online ({@link AcceptanceEstimator}: the run's
 * rates by position and by whether the request's last drafting step was fully accepted, shifted by the request's
 * own logit offset, a hierarchical Bayesian estimate). The ks come from the batch goodput rule of
 * batch-draft-lengths.ts (SmartSpec, arXiv 2406.14066; TETRIS, arXiv 2502.15197): the batch's draft rows go to the
 * drafts of highest cumulative acceptance, as many as raise the goodput. With one sequence this is
 * argmax_k E[committed | k] / (t_draft(k) + t_verify(k) + t_overhead(k)) (REFERENCE.md §4 DSpark adaptive
 * verification, §11); under load the batch's verify cost grows with every drafted row, so it drafts less, down to
 * none. Ties go to fewer drafts.
 *
 * Exploration: the rule runs at the posterior means of the a_j, then once more with the a_j of ONE position beyond
 * each sequence's choice raised to its upper confidence bound (optimism in the face of uncertainty, as UCB1: Auer et
 * al. 2002; the run's counts fade by a factor per step, as discounted UCB for a changing reward: Garivier & Moulines,
 * "On Upper-Confidence Bound Policies for Switching Bandit Problems", ALT 2011). The estimate only learns from drafts
 * it verifies — a plain step observes nothing, and position j + 1 is only seen when j drafts were — so a greedy
 * choice on an estimate that a few early rejections pulled below the break-even never drafts again; with one
 * optimistic position it tries the next draft when that could pay, and stops once the position is known.
 * Measured (bench:load, SmolLM2 + a chain drafter, one sequence, 64-token requests): the previous per-request EMA
 * (weight 0.2) fell after two or three rejections, chose plain steps for 19 % of the steps where a draft still paid,
 * and never observed position 2 often enough (7 times in a run) to draft past 1.
 *
 * Realised-rate arms ({@link CostDraftPolicyOptions.realizedArms}, at 2 sequences or more): the rule's model is off by
 * ~10 % under load, the size of the margins there, so blocks of steps also run two arms that skip the rule — one draft
 * for every sequence, and plain decoding — and a discounted UCB over each arm's committed tokens per ms of wall time
 * (the engine's {@link DraftPolicy.observeRealized}) picks the arm of the next block.
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
 * overhead and the acceptance estimated from EARLIER steps; δ is the secant slope of t_verify(B, ·) as the
 * choice priced it (learned from earlier steps where measured, else calibrated) over the tokens the choice drafts.
 * So λ is fixed before the step's drafts exist.
 * Lossless: S is non-increasing, so the rule is a stopping rule that decides draft j from
 * c_1 … c_j only; c_j is computed before d_j is drawn (DSpark: from the token before draft j), so
 * whether d_j is verified never depends on d_j itself, and rejection sampling stays exact for any
 * stopping rule of that kind. A rule that looked at c_{j+1} (a function of d_j) would not be.
 */

import type { SequenceId } from '../kv/paged-kv-pool.js';
import { type BatchDraftChoice, type BatchShape, chooseBatchDraftLengths } from './batch-draft-lengths.js';
import { ConfidenceCalibration } from './confidence-model.js';
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
  /**
   * Tokens the request may still generate (its maxTokens less those generated). With it the cost policy shares a
   * catch-up's backlog over the steps the sequence has left; without it, over the mean drafting run.
   */
  readonly remainingTokens?: number;
}

/** A proposal offered to {@link DraftPolicy.budgets}: a sequence's per-draft confidences. */
export interface BudgetItem {
  readonly id: SequenceId;
  /** c_1 … c_k of the proposal (`DraftProposal.confidence`), `[k]` f32, k ≥ 1. */
  readonly confidence: Float32Array;
}

/** The shape of a step its overhead is learned by ({@link DraftPolicy.observeOverhead}). Immutable. */
export interface OverheadShape {
  /** Sequences in the verify forward (B). */
  readonly sequences: number;
  /** Sequences that drafted. */
  readonly drafting: number;
  /** Drafts verified in all. */
  readonly drafts: number;
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
   * forward's rows (default 1); `shape`: the step's sequences, drafting sequences and drafts (absent: a plain step
   * of `rows` sequences, or a drafting step of one sequence with `rows` − 1 drafts).
   */
  observeOverhead?(ms: number, drafted: boolean, rows?: number, shape?: OverheadShape): void;
  /**
   * The measured cost of the step just run: `sequences` in the verify forward holding `tokens` rows,
   * of which `drafting` sequences proposed `drafts` drafts in all; the verify forward took
   * `verifyMs` and the propose call `proposeMs` (0 when nobody drafted); `proposed`: the drafts the propose call
   * made, before verify budgets cut them (default `drafts`).
   */
  observeStep?(
    sequences: number,
    tokens: number,
    drafting: number,
    drafts: number,
    verifyMs: number,
    proposeMs: number,
    proposed?: number,
  ): void;
  /**
   * A lazy catch-up just ran: `rows` deferred draft-context rows written (projection and draft KV) in `ms` before
   * the propose call of the step.
   */
  observeContext?(rows: number, ms: number): void;
  /**
   * The step just run, end to end: `sequences` verified, `committed` tokens kept (accepted drafts and one more
   * each), `ms` its wall time from the draft-length choice to the commit (the draft context's catch-up, the propose
   * call, the verify forward, accept and commit).
   */
  observeRealized?(sequences: number, committed: number, ms: number): void;
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
  /** Acceptance assumed before anything is observed (default 0.7). */
  readonly prior?: number;
  /** Pseudo-observations of the prior in each of the run's rates (default 2). */
  readonly priorWeight?: number;
  /**
   * Prior variance of a request's offset from the run's rates on the logit scale, σ² (default 0.1; 0: every
   * request takes the run's rates).
   */
  readonly requestVariance?: number;
  /**
   * Optimism of the rates the policy chooses with: posterior standard deviations of the run's rate added to each a_j
   * (default 0.5; 0: posterior means). A rate observed n times gains z·√(a(1−a)/(n + priorWeight + 1)).
   */
  readonly optimism?: number;
  /**
   * Weight kept by the run's counts per batch step, (0, 1] (default 0.998: a window of about 500 steps; 1: the
   * whole run).
   */
  readonly forget?: number;
}

/** A request's evidence: its drafts offered and accepted per (state, 0-based position), and its state now. */
interface RequestEvidence {
  /** Whether its last drafting step had every draft accepted (state 1), else state 0. */
  hot: boolean;
  readonly offered: [number[], number[]];
  readonly accepted: [number[], number[]];
}

/** p clamped to [1e-3, 1 − 1e-3] (finite logits). */
const clampP = (p: number): number => Math.min(1 - 1e-3, Math.max(1e-3, p));
/** Logit of p, p clamped to [1e-3, 1 − 1e-3]. */
const logit = (p: number): number => {
  const q = clampP(p);
  return Math.log(q / (1 - q));
};
const sigmoid = (x: number): number => 1 / (1 + Math.exp(-x));
/** A log cost factor clamped to [−log 4, log 4]. */
const clampLog = (x: number): number => Math.min(Math.log(4), Math.max(-Math.log(4), x));

/**
 * Conditional acceptance a_j = P(draft j accepted | drafts < j accepted) (j = 1-based draft index) of each running
 * request, from the run's counts and the request's own, as a hierarchical model:
 *
 * - The run's rates by (state, j): drafts j offered (verify steps with k ≥ j whose drafts < j were all accepted) and
 *   accepted, Beta(prior·w, (1 − prior)·w) prior (w = priorWeight), posterior mean (accepted + prior·w) / (offered +
 *   w). State 1 ("hot"): the request's previous drafting step had all its drafts accepted; state 0: it had a
 *   rejection (or the request has not drafted yet). Acceptance runs in streaks — a draft that follows a
 *   fully accepted step is accepted more often (SmolLM2 + a chain drafter, 32 prompts: a_1 0.74–0.79 after a fully
 *   accepted step, 0.57 after a rejection) — so the state carries what the last step showed at no cost. A plain
 *   step (k = 0) decides nothing and leaves the state: a rejection's lower a_1 holds through 8 plain steps
 *   (bench/acceptance-states.mjs: DFlash and EAGLE-3 on SmolLM2, a_1 0.86–0.89 hot, 0.60–0.75 cold at every
 *   gap). A (state, j) the run never offered takes the other state's rate at j, else the rate of the deepest offered
 *   position below j, else the prior.
 * - A request's offset δ from the run on the logit scale, a_j = σ(logit(run a_j) + δ), with prior δ ~ N(0, σ²): the
 *   request's evidence enters as one Newton step of the posterior mode from δ = 0 (Laplace approximation),
 *   δ = Σ (x − p) / (Σ p(1 − p) + 1/σ²) over its decided drafts x ∈ {0, 1}, p their run rates now. One parameter
 *   pools all of a request's positions (a hard prompt is hard at every depth), and with few observations δ stays
 *   near 0: the run's rates, learned from every request, carry a new request instead of its first rejections.
 *   (Replaces a per-request EMA, which after two early rejections predicted the request lost for good.)
 * - Upper confidence bounds for exploration ({@link rates} with `optimism` > 0): a_j plus `optimism` posterior
 *   standard deviations of the run's rate at that cell, √(a(1 − a)/(n + w + 1)) (as UCB1: Auer et al., "Finite-time
 *   Analysis of the Multiarmed Bandit Problem", 2002). A position the run never offered counts as observed 0 times.
 *   The cost policy chooses at the means and reads the bound of one position beyond its choice (see the file
 *   comment): a plain step observes nothing, so without it an estimate that fell below the break-even could never
 *   recover. The run's counts fade by `forget` per batch step ({@link step}; discounted UCB, Garivier & Moulines
 *   2011): the means stay, the bound of a position no longer drafted grows back, and the run follows its workload.
 */
export class AcceptanceEstimator {
  private readonly prior: number;
  private readonly priorWeight: number;
  private readonly requestVariance: number;
  private readonly optimism: number;
  private readonly forget: number;
  /** The run's counts by [state][0-based position]. */
  private readonly offered: [number[], number[]] = [[], []];
  private readonly accepted: [number[], number[]] = [[], []];
  private readonly requests = new Map<SequenceId, RequestEvidence>();

  constructor(options: AcceptanceEstimatorOptions = {}) {
    this.prior = options.prior ?? 0.7;
    this.priorWeight = options.priorWeight ?? 2;
    this.requestVariance = options.requestVariance ?? 0.1;
    this.optimism = options.optimism ?? 0.5;
    this.forget = options.forget ?? 0.998;
    if (!(this.prior >= 0 && this.prior <= 1))
      throw new RangeError(`AcceptanceEstimator: prior: expected [0, 1], got ${this.prior}`);
    if (!(this.priorWeight > 0))
      throw new RangeError(`AcceptanceEstimator: priorWeight: expected > 0, got ${this.priorWeight}`);
    if (!(this.requestVariance >= 0))
      throw new RangeError(`AcceptanceEstimator: requestVariance: expected >= 0, got ${this.requestVariance}`);
    if (!(this.optimism >= 0))
      throw new RangeError(`AcceptanceEstimator: optimism: expected >= 0, got ${this.optimism}`);
    if (!(this.forget > 0 && this.forget <= 1))
      throw new RangeError(`AcceptanceEstimator: forget: expected (0, 1], got ${this.forget}`);
  }

  private request(id: SequenceId): RequestEvidence {
    let r = this.requests.get(id);
    if (r === undefined) {
      r = { hot: false, offered: [[], []], accepted: [[], []] };
      this.requests.set(id, r);
    }
    return r;
  }

  /** Records one verify step of `id`: `drafted` drafts, `accepted` kept (a plain step, drafted 0, records nothing). */
  observe(id: SequenceId, drafted: number, accepted: number): void {
    if (!(drafted > 0)) return;
    const r = this.request(id);
    const s = r.hot ? 1 : 0;
    const seen = Math.min(drafted, accepted + 1); // positions 0..seen-1 were decided
    for (let j = 0; j < seen; j++) {
      const x = j < accepted ? 1 : 0;
      this.offered[s][j] = (this.offered[s][j] ?? 0) + 1;
      this.accepted[s][j] = (this.accepted[s][j] ?? 0) + x;
      r.offered[s][j] = (r.offered[s][j] ?? 0) + 1;
      r.accepted[s][j] = (r.accepted[s][j] ?? 0) + x;
    }
    r.hot = accepted >= drafted;
  }

  /**
   * The run's rate at (state, 0-based position j) (see the class comment): posterior mean, and the observations
   * behind it (0 when the cell itself was never offered and the rate is borrowed).
   */
  private cell(state: number, j: number): { mean: number; n: number } {
    const w = this.priorWeight;
    for (let i = j; i >= 0; i--) {
      // this state's cell, then the other state's (no array per visit: the rule asks for thousands a second)
      for (let t = 0; t < 2; t++) {
        const st = t === 0 ? state : 1 - state;
        const off = this.offered[st]![i] ?? 0;
        if (off > 0)
          return {
            mean: ((this.accepted[st]![i] ?? 0) + this.prior * w) / (off + w),
            n: i === j && st === state ? off : 0,
          };
      }
    }
    return { mean: this.prior, n: 0 };
  }

  /**
   * One batch step passed: the run's counts are multiplied by `forget` (their means stay, their weight fades), so
   * the optimism of a position the run stopped drafting grows back (see the class comment).
   */
  step(): void {
    if (this.forget === 1) return;
    for (let s = 0; s < 2; s++) {
      const off = this.offered[s]!;
      const acc = this.accepted[s]!;
      for (let j = 0; j < off.length; j++) off[j]! *= this.forget;
      for (let j = 0; j < acc.length; j++) acc[j]! *= this.forget;
    }
  }

  /** The run's a at 0-based position j in state 0 (after a rejection), or 1 (after a fully accepted step). */
  runRate(j: number, hot = false): number {
    return this.cell(hot ? 1 : 0, j).mean;
  }

  /** δ: request `id`'s logit offset from the run's rates (0 for a request with no evidence; see the class comment). */
  offset(id: SequenceId): number {
    const r = this.requests.get(id);
    if (r === undefined || !(this.requestVariance > 0)) return 0;
    let score = 0;
    let info = 0;
    for (let s = 0; s < 2; s++) {
      const off = r.offered[s]!;
      for (let j = 0; j < off.length; j++) {
        const n = off[j] ?? 0;
        if (n === 0) continue;
        const p = clampP(this.cell(s, j).mean);
        score += (r.accepted[s]![j] ?? 0) - n * p;
        info += n * p * (1 - p);
      }
    }
    return score / (info + 1 / this.requestVariance);
  }

  /**
   * a_1..a_n of request `id` in its current state (0-based array): posterior means shifted by its offset, plus
   * `optimism` standard deviations (default: the estimator's; 0 for the means).
   */
  rates(id: SequenceId, n: number, optimism = this.optimism): number[] {
    const state = this.requests.get(id)?.hot === true ? 1 : 0;
    const delta = this.offset(id);
    const out = new Array<number>(n);
    for (let j = 0; j < n; j++) {
      const c = this.cell(state, j);
      const a = delta === 0 ? c.mean : sigmoid(logit(c.mean) + delta);
      out[j] = optimism > 0 ? Math.min(1, a + optimism * Math.sqrt((a * (1 - a)) / (c.n + this.priorWeight + 1))) : a;
    }
    return out;
  }

  /** E[committed | k] for k = 0..n: `[1, 1 + a_1, 1 + a_1 + a_1 a_2, …]` (from {@link rates}, same `optimism`). */
  expectedCommitted(id: SequenceId, n: number, optimism = this.optimism): number[] {
    return gainsOf(this.rates(id, n, optimism));
  }

  /** Whether request `id`'s last drafting step had every draft accepted (state 1). */
  hot(id: SequenceId): boolean {
    return this.requests.get(id)?.hot === true;
  }

  release(id: SequenceId): void {
    this.requests.delete(id);
  }
}

/** Options of {@link CostDraftPolicy}. */
export interface CostDraftPolicyOptions extends AcceptanceEstimatorOptions {
  /**
   * After this many consecutive plain steps (k = 0) a sequence drafts `exploreDrafts` once, so its
   * acceptance estimate keeps up with the text (default 64; 0 = never). Each exploration after
   * which the policy still chooses k = 0 doubles the sequence's interval, up to 16×. At most one
   * sequence of the batch explores per this many batch steps.
   */
  readonly exploreEvery?: number;
  /** Drafts of an exploration step (default 4). */
  readonly exploreDrafts?: number;
  /**
   * After this many consecutive steps in which some sequence drafted, one step decodes plainly
   * (k = 0 for all), so the plain-step cost at that batch keeps being measured (default 32; 0 = never).
   * Counting only steps where every sequence drafted (before 2026-12-06) left a batch that mixed drafting and
   * plain sequences without a plain measurement for good: bench:load --trace, SmolLM2 + EAGLE-3, 4 sequences, a slow
   * spell priced the plain step at 12.4 ms, and the policy then drafted for the ~1,000 steps left, its plain steps
   * costing 7–8 ms before and after.
   */
  readonly explorePlainEvery?: number;
  /**
   * Correct the calibrated costs from every step's measured times ({@link CostDraftPolicy.costScale}; default true).
   */
  readonly recalibrate?: boolean;
  /**
   * The least relative gain in modelled rate (committed tokens per ms) over a plain step for which the batch drafts
   * (default 0.03; 0: any gain; negative: drafting even at a modelled loss down to (1 + minGain) × the plain rate, as
   * tests do to exercise drafting whatever the machine's timing). Exploration steps are not held to it.
   */
  readonly minGain?: number;
  /**
   * Read each (batch size, rows) verify time measured {@link LEARNED_MIN} times in place of the calibrated curve
   * (default true; see {@link CostDraftPolicy}'s learned curve).
   */
  readonly learnVerify?: boolean;
  /**
   * Optimism in the verify price (default true; needs `learnVerify`): at each batch size, the shape one drafted row
   * beyond the largest measured {@link LEARNED_MIN} times is priced no dearer than that largest one, until it is
   * measured itself — the row is taken to be free until a forward says what it costs. Without it an unmeasured shape
   * is priced by the calibration's ratio to the plain step, and a calibration whose curve is off keeps the rule from
   * ever trying the shapes it overprices (SmolLM2 + DFlash, greedy, AMD VM: a calibration read during a slow spell
   * priced 4 verify rows at 1.68 × the plain step where they cost 1.12 ×, and the policy drafted 1.06 tokens a step
   * for ×1.216 of plain decoding against ×1.452 at a fixed 3). Each shape costs at most {@link LEARNED_MIN} steps to
   * learn, one row at a time, and only while the rule would draft more if the row were free.
   */
  readonly costOptimism?: boolean;
  /**
   * Check the rule against what its steps realise (default true): at each batch size of at least
   * {@link ARMS_MIN_SEQUENCES}, blocks of {@link ARM_BLOCK} steps take turns between three arms — the rule's choice;
   * one draft for every sequence that can draft (verified whatever its confidence); a plain step for all (these two
   * without working the rule out) — and the arm of highest upper confidence bound on its committed tokens per ms of
   * wall time runs the next block (discounted UCB). See {@link CostDraftPolicy}'s `arms`.
   */
  readonly realizedArms?: boolean;
  /**
   * Called with every decision and observation of the policy (off when absent): what each step's choice read (the
   * a_j, the costs along the batch rule's walk, the cost corrections) and what the step then measured. For
   * diagnosis (`bench/load.mjs --trace FILE`); nothing the policy does depends on it.
   */
  readonly trace?: (event: CostPolicyTraceEvent) => void;
}

/** One event of {@link CostDraftPolicyOptions.trace}. Immutable. */
export type CostPolicyTraceEvent =
  | {
      readonly kind: 'choose';
      /**
       * Per candidate: its id, maxDrafts, the posterior means a_1 … a_maxDrafts, the rates the rule chose with (the
       * means, one position optimistic), its logit offset δ, whether its last drafting step was fully accepted, and
       * the k the policy returned.
       */
      readonly candidates: readonly {
        readonly id: SequenceId;
        readonly maxDrafts: number;
        readonly means: readonly number[];
        readonly rates: readonly number[];
        readonly offset: number;
        readonly hot: boolean;
        readonly k: number;
      }[];
      /** The batch rule's ks (with the one optimistic position), before `exploreEvery` and `explorePlainEvery`. */
      readonly ruleKs: readonly number[];
      /** The batch rule's walk: expected committed tokens and modelled cost (ms) at each total draft count D. */
      readonly curve: BatchDraftChoice['curve'];
      /** R*: the rate of the rule's choice at the posterior means, committed tokens per ms. */
      readonly rate: number;
      /** {@link CostDraftPolicy.costScale} at the choice. */
      readonly costScale: readonly number[];
      /** The overhead model's coefficients, ms: per sequence, per drafting sequence, per draft. */
      readonly overhead: readonly number[];
      /** The measured ms per catch-up row (× each drafting candidate's charged rows, `catchUpRows`). */
      readonly catchUpMsPerRow: number;
      /** Per candidate, the deferred rows its drafting is charged for this step (see `chargedCatchUpRows`). */
      readonly catchUpRows: readonly number[];
      /** The realised-rate arm of the step (`realizedArms`): 0 the rule, 1 one draft for all, 2 plain, -1 none. */
      readonly arm: number;
    }
  | { readonly kind: 'realized'; readonly sequences: number; readonly committed: number; readonly ms: number }
  | { readonly kind: 'observe'; readonly id: SequenceId; readonly drafted: number; readonly accepted: number }
  | {
      readonly kind: 'step';
      readonly sequences: number;
      readonly tokens: number;
      readonly drafting: number;
      readonly drafts: number;
      readonly verifyMs: number;
      readonly proposeMs: number;
      /** Drafts proposed, before the verify budgets cut them to `drafts`. */
      readonly proposed: number;
      /** The calibrated times of the same shape (before {@link CostDraftPolicy.costScale}), ms. */
      readonly calibratedVerifyMs: number;
      readonly calibratedDraftMs: number;
    }
  | {
      readonly kind: 'overhead';
      readonly ms: number;
      readonly drafted: boolean;
      readonly rows: number;
      readonly shape: OverheadShape;
    }
  | { readonly kind: 'context'; readonly rows: number; readonly ms: number };

/** Steps a plain choice of the cost policy is reused for the same batch before the rule is worked out again. */
const PLAIN_REUSE = 7;

/** Verify forwards of a shape measured before the cost policy reads the learned time instead of the calibrated one. */
const LEARNED_MIN = 3;

/** Verify forwards kept per (batch size, drafted rows): their lower median prices that shape. */
export const PLAIN_WINDOW = 32;

/**
 * Verify samples (all shapes) after which a window's middle-aged sample makes it stale: only a stale window is capped
 * by the fresher drafted shapes ({@link CostDraftPolicy}'s learned curve).
 */
export const STALE_SAMPLES = 4 * PLAIN_WINDOW;

/**
 * The last {@link PLAIN_WINDOW} samples of one verify shape (a ring) and their lower median. The sorted copy follows
 * the ring (the replaced sample out, the new one in: O(window) a sample, no array a sample).
 */
class MedianWindow {
  private readonly ring = new Float64Array(PLAIN_WINDOW);
  /** The `seq` of each sample of {@link ring}. */
  private readonly seqs = new Float64Array(PLAIN_WINDOW);
  private readonly sorted = new Float64Array(PLAIN_WINDOW);
  /** Samples seen (all of them, not only those kept). */
  n = 0;
  /** The lower median of the samples kept (0 before the first). */
  median = 0;
  /** The policy's count of verify samples (all shapes) when this window's newest arrived (see {@link add}). */
  last = 0;

  /** One sample, `seq` the policy's running count of verify samples (0 when the caller keeps none). */
  add(ms: number, seq = 0): void {
    this.last = seq;
    const slot = this.n % PLAIN_WINDOW;
    let n = Math.min(this.n, PLAIN_WINDOW);
    if (this.n >= PLAIN_WINDOW) {
      const old = this.ring[slot]!;
      let i = 0;
      while (this.sorted[i] !== old) i++;
      for (n--; i < n; i++) this.sorted[i] = this.sorted[i + 1]!;
    }
    this.ring[slot] = ms;
    this.seqs[slot] = seq;
    this.n++;
    let j = n;
    for (; j > 0 && this.sorted[j - 1]! > ms; j--) this.sorted[j] = this.sorted[j - 1]!;
    this.sorted[j] = ms;
    this.median = this.sorted[n >> 1]!;
  }

  /** The `seq` of the kept sample of middle age (half the kept samples are newer; 0 before the first). */
  midSeq(): number {
    if (this.n === 0) return 0;
    const kept = Math.min(this.n, PLAIN_WINDOW);
    return this.seqs[(this.n - 1 - (kept >> 1)) % PLAIN_WINDOW]!;
  }
}

/** Least batch size at which {@link CostDraftPolicyOptions.realizedArms} compares its arms. */
export const ARMS_MIN_SEQUENCES = 2;
/** Steps an arm of {@link CostDraftPolicyOptions.realizedArms} runs at a time. */
export const ARM_BLOCK = 4;
/** Steps each arm must have run before the arms are compared (they take turns block by block till then). */
export const ARM_MIN_STEPS = 4;
/** Weight an arm's statistics keep per step of its batch size (0.995: a memory of about 200 steps). */
export const ARM_FORGET = 0.995;
/** Standard errors added to an arm's mean rate for its upper confidence bound. */
export const ARM_UCB = 1.5;
/** Least relative standard deviation of a step's rate assumed (machines never time steps alike). */
export const ARM_MIN_SPREAD = 0.05;
/** The arms of {@link CostDraftPolicyOptions.realizedArms}: the rule's choice, one draft for all, plain for all. */
const ARM_RULE = 0;
const ARM_ONE = 1;
const ARM_PLAIN = 2;

/**
 * One arm's realised rates (committed tokens per ms, a step each) at one batch size: discounted count, sum and sum of
 * squares (each × {@link ARM_FORGET} per step of the batch size, whichever arm ran it), and the steps it ran in all.
 */
interface ArmRates {
  n: number;
  sum: number;
  sumSq: number;
  steps: number;
}

/** Per-step overhead observations of each kind (plain, drafting) skipped before they are learned (JIT warm-up). */
export const OVERHEAD_WARMUP = 2;

/**
 * The per-step overhead (the engine's work outside the propose call and the verify forward: choosing, accept, commit,
 * the committed tokens' draft context) as a linear function of the step's shape,
 *   overhead ≈ c_seq·B + c_drafting·(drafting sequences) + c_draft·(drafts),
 * fitted online by least squares with exponential forgetting (each observation's weight × `forget` per later one)
 * and the coefficients held ≥ 0 (non-negative least squares, exact over the 2³ active sets). Plain steps (no draft)
 * identify c_seq; drafting steps the rest. Measured on SmolLM2 + a chain drafter at one sequence (2 vCPUs):
 * 0.21 ms for a plain step and 0.62 / 0.70 / 0.79 / 0.74 / 0.80 / 1.10 ms for 1 … 6 drafts (medians) — mostly per
 * drafting sequence (its draft-context write, the commit), little per draft. A cost per verify row (the previous
 * model) charged every further draft the first draft's whole overhead and so priced deeper drafts ~0.3 ms too high.
 *
 * Two guards keep a few bad samples from switching drafting off for good (bench:load on a shared 2-vCPU VM: a
 * drafting step preempted for 19 ms raised the drafting terms by milliseconds, the policy stopped drafting, and with
 * no drafting step to observe the estimate never moved again: 0.00 drafts a step at every concurrency):
 * - each sample is clipped to `clip` × the model's prediction for its shape + `clipFloorMs` (a preemption or GC pause
 *   is not the engine's overhead; a real rise still gets through, the cap growing with each step);
 * - a step that drafts nothing fades the drafting steps' weight (× `staleForget` on top of `forget`), so the ridge
 *   pulls stale drafting terms back towards 0 and drafting is tried, and measured, again.
 */
export class OverheadModel {
  /**
   * Σ weight · x xᵀ (3 × 3, row-major) and Σ weight · x · ms over the plain steps (`[0]`) and over the drafting steps
   * (`[1]`), kept apart so that a plain step can fade the drafting steps' weight alone; the fit is on their sum.
   */
  private readonly xx = [new Float64Array(9), new Float64Array(9)];
  private readonly xy = [new Float64Array(3), new Float64Array(3)];
  /** [c_seq, c_drafting, c_draft], ms. */
  readonly coefficients = [0, 0, 0];

  constructor(
    private readonly forget = 0.98,
    private readonly ridge = 0.5,
    private readonly clip = 3,
    private readonly clipFloorMs = 1,
    private readonly staleForget = 0.9,
  ) {}

  /** One step's overhead `ms` at its shape (clipped, see the class comment). */
  observe(ms: number, shape: OverheadShape): void {
    if (!(ms >= 0 && Number.isFinite(ms))) return;
    const x = [shape.sequences, shape.drafting, shape.drafts];
    const cap =
      this.clip === Number.POSITIVE_INFINITY
        ? ms
        : this.clip * this.predict(shape.sequences, shape.drafting, shape.drafts) + this.clipFloorMs;
    const y = Math.min(ms, cap);
    const into = shape.drafting === 0 ? 0 : 1;
    for (let s = 0; s < 2; s++) {
      // a step that drafts nothing fades the drafting steps' weight further: it cannot observe them
      const f = s === 1 && into === 0 ? this.forget * this.staleForget : this.forget;
      const xx = this.xx[s]!;
      const xy = this.xy[s]!;
      for (let i = 0; i < 3; i++) {
        xy[i] = f * xy[i]! + (s === into ? x[i]! * y : 0);
        for (let j = 0; j < 3; j++) xx[3 * i + j] = f * xx[3 * i + j]! + (s === into ? x[i]! * x[j]! : 0);
      }
    }
    this.solve();
  }

  /** The overhead of a step of this shape, ms. */
  predict(sequences: number, drafting: number, drafts: number): number {
    const [a, b, c] = this.coefficients as [number, number, number];
    return a * sequences + b * drafting + c * drafts;
  }

  /** Scratch of {@link solve}: XX and XY (the two halves' sums) and the augmented system, 3 × 4 row-major. */
  private readonly work = { XX: new Float64Array(9), XY: new Float64Array(3), m: new Float64Array(12) };
  /** A subset's terms, its solution and the best solution so far, of {@link solve}. */
  private readonly idx = new Int32Array(3);
  private readonly cand = new Float64Array(3);
  private readonly best = new Float64Array(3);

  /**
   * Non-negative least squares over the active sets: the feasible subset solution of least squared error. Runs at
   * every observed step, so without allocations (arrays of arrays for each subset cost ~25 µs a step in V8,
   * kimi-k3-tiny at 8 sequences); the Gaussian elimination's arithmetic, operation for operation, as before.
   */
  private solve(): void {
    const { XX, XY, m } = this.work;
    const [xx0, xx1] = this.xx as [Float64Array, Float64Array];
    const [xy0, xy1] = this.xy as [Float64Array, Float64Array];
    for (let i = 0; i < 9; i++) XX[i] = xx0[i]! + xx1[i]!;
    for (let i = 0; i < 3; i++) XY[i] = xy0[i]! + xy1[i]!;
    const c = this.cand;
    const best = this.best;
    best.fill(0);
    let bestObj = 0; // the empty set: c = 0
    const idx = this.idx;
    for (let mask = 1; mask < 8; mask++) {
      let n = 0;
      for (let i = 0; i < 3; i++) if ((mask >> i) & 1) idx[n++] = i;
      // (XX_SS + ridge I) c_S = xy_S by Gaussian elimination (n ≤ 3); row r of the system at m[4r …]
      for (let r = 0; r < n; r++) {
        const i = idx[r]!;
        for (let col = 0; col < n; col++) {
          const j = idx[col]!;
          m[4 * r + col] = XX[3 * i + j]! + (i === j ? this.ridge : 0);
        }
        m[4 * r + n] = XY[i]!;
      }
      let ok = true;
      for (let col = 0; col < n && ok; col++) {
        let piv = col;
        for (let r = col + 1; r < n; r++) if (Math.abs(m[4 * r + col]!) > Math.abs(m[4 * piv + col]!)) piv = r;
        if (!(Math.abs(m[4 * piv + col]!) > 1e-12)) ok = false;
        else {
          if (piv !== col)
            for (let k = 0; k <= n; k++) {
              const t = m[4 * col + k]!;
              m[4 * col + k] = m[4 * piv + k]!;
              m[4 * piv + k] = t;
            }
          for (let r = 0; r < n; r++) {
            if (r === col) continue;
            const f = m[4 * r + col]! / m[4 * col + col]!;
            for (let k = col; k <= n; k++) m[4 * r + k] = m[4 * r + k]! - f * m[4 * col + k]!;
          }
        }
      }
      if (!ok) continue;
      c.fill(0);
      for (let r = 0; r < n; r++) c[idx[r]!] = m[4 * r + n]! / m[4 * r + r]!;
      if (c[0]! < 0 || c[1]! < 0 || c[2]! < 0) continue;
      // squared error up to a constant: cᵀ(XX + ridge)c − 2 xyᵀc
      let obj = 0;
      for (let i = 0; i < 3; i++) {
        obj -= 2 * XY[i]! * c[i]!;
        for (let j = 0; j < 3; j++) obj += c[i]! * (XX[3 * i + j]! + (i === j ? this.ridge : 0)) * c[j]!;
      }
      if (obj < bestObj) {
        bestObj = obj;
        best.set(c);
      }
    }
    for (let i = 0; i < 3; i++) this.coefficients[i] = best[i]!;
  }
}

/** E[committed | k] for k = 0 … a.length from conditional acceptances a_j: `[1, 1 + a_1, 1 + a_1 + a_1 a_2, …]`. */
function gainsOf(a: readonly number[]): number[] {
  const out = [1];
  let p = 1;
  for (let j = 0; j < a.length; j++) {
    p *= a[j]!;
    out.push(out[j]! + p);
  }
  return out;
}

/** The cost-based policy (see the file comment). */
export class CostDraftPolicy implements DraftPolicy {
  readonly acceptance: AcceptanceEstimator;
  private readonly exploreEvery: number;
  private readonly exploreDrafts: number;
  /** Per sequence: consecutive plain steps, and the current exploration interval. */
  private readonly plainRun = new Map<SequenceId, { run: number; every: number }>();
  /** The last plain choice, reused for the same batch (see choose), its uses so far, its batch's ids and maxDrafts. */
  private plainChoice: BatchDraftChoice | undefined;
  private plainReuse = 0;
  private plainBatch: SequenceId[] = [];
  private plainMax: number[] = [];
  /** Batch steps since a sequence last explored (starts ready). */
  private sinceExplore = Number.MAX_SAFE_INTEGER;
  /** Calibrated [t_draft, t_verify] by (batch, drafts, drafting sequences); never changes. */
  private readonly memo = new Map<number, number[]>();
  /**
   * The per-step overhead by the step's shape (see {@link DraftPolicy.observeOverhead}, {@link OverheadModel}). A
   * drafting step also writes the committed tokens' draft context, restores the linear state from a snapshot and
   * accepts over k + 1 rows — on the tiny target that is more than a whole plain step, and the calibrated forward
   * times do not see it. By shape (per sequence, per drafting sequence, per draft), so what was learned at one batch
   * size holds at another. The first {@link OVERHEAD_WARMUP} observations of each kind (plain, drafting) are skipped
   * (JIT compilation: the first step's accept and commit measured 20 ms on the tiny target, several whole steps).
   */
  readonly overhead = new OverheadModel();
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
   * Online correction of the calibration: measured ÷ calibrated time for [plain verify forwards, verify forwards with
   * drafts, propose calls], each in [1/4, 4], applied multiplicatively to the calibrated curves. One calibration at
   * start-up is a few milliseconds of samples on a machine whose load changes (bench:spec saw a mis-calibrated
   * engine draft at ×0.6 of plain); every step measures the real cost, so the choice follows the machine.
   * Model: log(measured ÷ calibrated) = m + r_kind + noise — m the machine's state now, common to every kind, r_kind
   * a kind's own miscalibration — learned by a gradient step on the squared log error of each observation (step 0.1
   * each for m and the verify kinds' r; the propose calls' r alone, 0.2). A kind seldom observed (plain steps while
   * everyone drafts) thus follows the machine through m: with one EMA per kind (the previous model) a load spike seen
   * only by the drafting steps made drafting look dearer than a plain step whose estimate was stale.
   * Plus r_{B,kind}, a kind's miscalibration at batch size B (step 0.2; 0 at a size not seen yet): the start-up
   * curve's error depends on B (bench:load, SmolLM2 + EAGLE-3: plain steps 1.3× their calibrated time at 4 and 8
   * sequences, 1.0× at 16), and one factor per kind learned at 8 sequences priced a plain step at 16 a third too
   * dear, which made drafting look profitable there. Each observation's residual is clipped to ±0.25 (a Huber step:
   * one preempted step, 47 ms where 19 were due, moved every factor of its kind by a fifth). This array holds the
   * factors of the batch size last observed.
   */
  readonly costScale = [1, 1, 1];
  /** m, r_kind and r_{B,kind} of {@link costScale} (natural logs). */
  private logMachine = 0;
  private readonly logKind = [0, 0, 0];
  private readonly logBatch = new Map<number, number[]>();
  /**
   * The verify forward's measured times by batch size B and drafted rows r ≥ 0 ({@link learnVerify}): one
   * {@link MedianWindow} per shape, index r. Once a shape is measured {@link LEARNED_MIN} times the rule reads it in
   * place of the calibrated curve: the start-up calibration times each shape a few times in isolation, and its
   * curve's shape is off in the engine (SmolLM2 + EAGLE-3, one sequence: calibrated 4.58 ms for 4 rows and 5.36 for
   * 7, measured 4.19 and 6.02 — a factor per kind cannot bend it), which made the rule propose 6 drafts where 3 were
   * faster (bench/spec-steps.mjs).
   *
   * Lower medians, not EMAs: a shape's times on a shared VM are heavy-tailed (SmolLM2 + EAGLE-3 at one sequence,
   * bench:load --trace: 3 verify rows 4.89 / 5.34 / 7.23 ms at the 10th / 50th / 90th percentile, 4 rows 5.82 / 6.25 /
   * 8.10), and the EMA (weight 0.2) that learned the drafted shapes wandered over 5.03–6.85 and 6.10–7.65 ms: the two
   * estimates crossed, and the rule chose 3 drafts where 2 were faster in 461 of 1,718 drafting steps (×1.27 of plain
   * decoding in that run; ×1.44 in a run with 2 drafts fixed). The plain step (r = 0) moved to a lower median first
   * (8c52a76): with the EMA four slow steps in a row (4.1–9.5 ms where 2.5 was usual) raised kimi-k3-tiny's plain step
   * at 8 sequences from 0.87 to 1.28 × its calibrated time, and drafting then priced better. Once drafting, the engine
   * stayed there: the plain steps a drafting run leaves are slower than a run of plain steps (2.4–2.8 ms against
   * 1.7–1.8; they run between drafting steps, with the caches full of the drafter's work), and they kept the estimate
   * up — 267 drafting steps at ×0.83 of plain decoding (docs/BENCHMARKS.md, "the cost policy's trap"). In one process,
   * engines built alike: 4 of 5 fell into it with the EMA, 0 of 4 with the median; at one sequence the two drafted
   * alike (kimi-k3-tiny ×1.091 / ×1.111 of plain, SmolLM2 + EAGLE-3 ×1.476 / ×1.549, this VM's noise). A lower quartile
   * priced plain steps below a plain run's typical step and drafted less at one sequence (×0.983 against ×1.105).
   */
  private readonly learned = new Map<number, (MedianWindow | undefined)[]>();
  /** Verify samples learned so far, all shapes (each window's {@link MedianWindow.last} reads it). */
  private verifySamples = 0;
  /**
   * Per batch size, rebuilt when a drafted sample arrives ({@link learnedVerifyMs}): `mono`, the learned drafted
   * shapes' times (a stale one capped by fresher ones) made non-decreasing in r (each the least over r' ≥ r: a
   * forward of more rows does all the work of one of fewer; NaN where no shape of r or more rows has
   * {@link LEARNED_MIN} samples); `anchor`, the plain step's cap while its window is stale, from the drafted shapes
   * measured since its newest sample (+∞ otherwise); `plainCal`, the calibrated t(B, B); `frontier`, the most drafted
   * rows of a shape with {@link LEARNED_MIN} samples (0: none).
   */
  private readonly learnedMonotone = new Map<
    number,
    { mono: Float64Array; anchor: number; plainCal: number; frontier: number }
  >();
  /** Confidences → conditional acceptance, learned from the verified drafts (confidence-model.ts). */
  readonly calibration = new ConfidenceCalibration();
  /** Per sequence: the raw confidences of the drafts it verifies this step (budgets → observe). */
  private readonly verifiedConfidence = new Map<SequenceId, Float32Array>();
  private readonly explorePlainEvery: number;
  private readonly recalibrate: boolean;
  private readonly minGain: number;
  private readonly useLearned: boolean;
  private readonly costOptimism: boolean;
  /** Consecutive steps in which some sequence drafted (see {@link CostDraftPolicyOptions.explorePlainEvery}). */
  private draftingStepRun = 0;
  /** EMAs of the lazy catch-ups: ms spent and rows written per catch-up (their ratio: ms per row). */
  private catchUpMs = 0;
  private catchUpRows = 0;
  /**
   * EMA of the length of a drafting run (consecutive steps a sequence drafts once it starts), steps; prior 8. For a
   * candidate without remainingTokens a catch-up is shared over it ({@link chargedCatchUpRows}): charging it whole to
   * one step would keep a sequence with a long prompt (all deferred) from ever drafting.
   */
  private draftingRunSteps = 8;
  /** Per sequence: the current drafting run's steps so far (0: not drafting). */
  private readonly draftingRun = new Map<SequenceId, number>();
  /** Sequences whose current drafting run began with an exploration (see {@link endDraftingRun}). */
  private readonly exploredRun = new Set<SequenceId>();
  private readonly trace: ((event: CostPolicyTraceEvent) => void) | undefined;
  private readonly realizedArms: boolean;
  /**
   * The realised-rate arms by batch size ({@link CostDraftPolicyOptions.realizedArms}): per arm ({@link ARM_RULE},
   * {@link ARM_ONE}, {@link ARM_PLAIN}) its realised rates, and the arm running now and its steps left in the block.
   * The model the rule prices with is off by ~8–10 % on either side of its comparison, and the margins under load are
   * of that order (bench:load --trace, SmolLM2 + EAGLE-3 at 8 sequences on the AMD VM: a plain step priced 8.2–10.5
   * ms, measured 9.1; one draft for every sequence priced 15.6–17.7 ms once the batch had decoded plainly for a while,
   * measured ~14, by its charged catch-up rows and a verify curve read from the calibration's slope, 0.69 ms a row
   * where the forwards took 0.38), so it drafted in half the steps where one draft for every sequence ran ×1.12 of
   * plain decoding. The arms compare what the steps realise, every cost in it, the policy's own JavaScript too.
   */
  private readonly arms = new Map<number, { rates: ArmRates[]; arm: number; left: number }>();
  /** The arm of the step chosen last (−1: none, or a forced plain step), and whether any step was observed. */
  private stepArm = -1;
  private realizedSeen = false;
  /**
   * Per sequence: the draft-context rows its plain steps deferred since it last drafted (its prompt's rows not
   * counted), and, for the step being observed, the rows its plain steps deferred, the rows of those a catch-up
   * wrote, and the catch-up's rows and ms (see {@link observeRealized}).
   */
  private readonly plainDeferred = new Map<SequenceId, number>();
  private stepDeferred = 0;
  private stepCaughtUp = 0;
  private stepCatchUpRows = 0;
  private stepCatchUpMs = 0;

  constructor(
    readonly costs: StepCosts,
    options: CostDraftPolicyOptions = {},
  ) {
    this.acceptance = new AcceptanceEstimator(options);
    this.exploreEvery = options.exploreEvery ?? 64;
    this.exploreDrafts = options.exploreDrafts ?? 4;
    this.explorePlainEvery = options.explorePlainEvery ?? 32;
    this.recalibrate = options.recalibrate ?? true;
    this.minGain = options.minGain ?? 0.03;
    this.useLearned = options.learnVerify ?? true;
    this.costOptimism = options.costOptimism ?? true;
    this.trace = options.trace;
    this.realizedArms = options.realizedArms ?? true;
  }

  choose(candidates: readonly DraftCandidate[]): number[] {
    const B = candidates.length;
    if (B === 0) return [];
    // the realised-rate arms: once the engine reports what its steps realise
    const arm =
      this.realizedArms && this.realizedSeen && B >= ARMS_MIN_SEQUENCES && candidates.some((c) => c.maxDrafts > 0)
        ? this.nextArm(B)
        : -1;
    if (arm === ARM_PLAIN || arm === ARM_ONE) return this.fixedArm(candidates, arm);
    // The batch rule (batch-draft-lengths.ts): goodput over the measured cost of the batch's verify of T rows.
    const [plainScale, verifyScale, draftScale] = this.scalesFor(B);
    const catchUpMsPerRow = this.catchUpRows > 0 ? this.catchUpMs / this.catchUpRows : 0;
    // the verify prices of this step's shapes by (drafts, whether any sequence drafts), memoised for the step: the
    // learned prices change only when a step is observed, and the rule asks for each of them dozens of times
    const prices = new Map<number, number>();
    const cost = (shape: BatchShape): number => {
      const { drafts: d, drafting: dr } = shape;
      // memoised across steps: the calibrated curves never change, and the rule asks at every D
      const key = (B * 4096 + d) * 1024 + dr;
      let c = this.memo.get(key);
      if (c === undefined) {
        c = [this.costs.draftMs(dr, d), this.costs.verifyMs(B, shape.tokens)];
        this.memo.set(key, c);
      }
      const pk = 2 * d + (dr > 0 ? 1 : 0);
      let price = prices.get(pk);
      if (price === undefined) {
        price = this.verifyPrice(B, d, c[1]!, dr > 0 ? verifyScale : plainScale);
        prices.set(pk, price);
      }
      return Math.max(
        1e-6,
        c[0]! * draftScale + price + this.overhead.predict(B, dr, d) + catchUpMsPerRow * shape.catchUpRows,
      );
    };
    // the deferred rows each candidate's drafting is charged for: worked out once, when a drafting shape is priced
    let charged: number[] | undefined;
    const catchUpRows = (): number[] => (charged ??= this.chargedCatchUpRows(candidates));
    const rule = (rates: readonly (readonly number[])[]): BatchDraftChoice =>
      chooseBatchDraftLengths(
        candidates.map((_, s) => ({ gains: gainsOf(rates[s]!), catchUpRows: catchUpRows()[s]! })),
        cost,
      );
    // The rule at the posterior means, then again with ONE position beyond each sequence's choice optimistic (its
    // upper confidence bound; AcceptanceEstimator): a draft the estimate has not seen enough of is tried when it
    // could pay, and a plain step (which observes nothing) is not taken on an estimate that few drafts made.
    this.acceptance.step();
    // A plain choice is kept for up to PLAIN_REUSE more steps of the same batch: while nothing drafts nothing is
    // observed but the costs' slow drift, and working the rule out again every step cost 0.1–0.2 ms at 16 sequences
    // (bench:load: with the drafter attached and drafting nothing, ×0.973 of plain against ×1.004 for `--policy off`).
    const reuse =
      this.plainChoice !== undefined &&
      this.plainReuse < PLAIN_REUSE &&
      this.plainBatch.length === B &&
      candidates.every((c, s) => this.plainBatch[s] === c.id && this.plainMax[s] === c.maxDrafts);
    let means: number[][];
    let rates: number[][];
    let choice: BatchDraftChoice;
    if (reuse) {
      this.plainReuse++;
      choice = this.plainChoice!;
      means = candidates.map(() => []);
      rates = means;
    } else {
      means = candidates.map((c) => this.acceptance.rates(c.id, c.maxDrafts, 0));
      const atMeans = rule(means);
      const m = means;
      rates = means.map((a, s) => {
        const k = atMeans.ks[s]!;
        if (k >= a.length) return a;
        const optimistic = [...a];
        optimistic[k] = this.acceptance.rates(candidates[s]!.id, k + 1)[k]!;
        return optimistic;
      });
      choice = rates.some((a, s) => a !== m[s]) ? rule(rates) : atMeans;
    }
    // a drafting choice must beat the plain step's modelled rate by `minGain`: the model's error is of that order
    // (bench:load --trace, SmolLM2 + EAGLE-3, 4 sequences: steps of 2, 7 and 8 drafts predicted at 0.80, 0.80 and
    // 0.78 tokens/ms measured 0.80, 0.84 and 0.76, plain steps 0.80), so a choice inside it is a coin flip that pays a
    // drafting step's fixed costs either way
    const plain = choice.curve[0];
    if (
      plain !== undefined &&
      choice.ks.some((k) => k > 0) &&
      choice.rate < (plain.committed / plain.costMs) * (1 + this.minGain)
    )
      choice = {
        ks: choice.ks.map(() => 0),
        committed: plain.committed,
        costMs: plain.costMs,
        rate: plain.committed / plain.costMs,
        curve: choice.curve,
      };
    if (!reuse) {
      const allPlain = choice.ks.every((k) => k === 0);
      this.plainChoice = allPlain ? choice : undefined;
      this.plainReuse = 0;
      this.plainBatch = allPlain ? candidates.map((c) => c.id) : [];
      this.plainMax = allPlain ? candidates.map((c) => c.maxDrafts) : [];
    }
    // R* for the survival threshold: the choice's rate at the means (the estimate, not the exploration bonus)
    const best = choice.ks.reduce((a, k, s) => a + gainsOf(means[s]!.slice(0, k))[k]!, 0) / choice.costMs;
    const ks = [...choice.ks];
    this.sinceExplore++;
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
        // at most one exploration per `exploreEvery` batch steps: each adds rows to the whole batch's verify (at 16
        // sequences one per request, 4 rows past the 16-row GEMM tile, cost 4 % of bench:load's wall)
        if (++st.run > st.every && c.maxDrafts > 0 && this.sinceExplore >= this.exploreEvery) {
          st.run = 0;
          st.every = Math.min(16 * this.exploreEvery, 2 * st.every);
          // what it would learn is worth nothing when drafting could not pay even if every draft were accepted
          if (!this.couldPay(candidates, catchUpRows(), ks, s, choice, cost)) return;
          ks[s] = Math.min(c.maxDrafts, this.exploreDrafts);
          this.sinceExplore = 0;
        }
      });
    }
    let forcedPlain = false;
    if (this.explorePlainEvery > 0 && ks.some((k) => k > 0)) {
      if (++this.draftingStepRun > this.explorePlainEvery) {
        ks.fill(0);
        this.draftingStepRun = 0;
        forcedPlain = true;
      }
    } else {
      this.draftingStepRun = 0;
    }
    // a forced plain step interrupts no drafting run: the runs go on at the next step, with one row to catch up
    if (!forcedPlain)
      candidates.forEach((c, s) => {
        const run = this.draftingRun.get(c.id) ?? 0;
        if (ks[s]! > 0) {
          // drafting where the rule chose k = 0: an exploration
          if (run === 0 && choice.ks[s] === 0) this.exploredRun.add(c.id);
          this.draftingRun.set(c.id, run + 1);
        } else if (run > 0) this.endDraftingRun(c.id, run);
      });
    this.setThreshold(B, ks, best);
    this.stepArm = forcedPlain ? -1 : arm;
    this.trace?.({
      kind: 'choose',
      candidates: candidates.map((c, s) => ({
        id: c.id,
        maxDrafts: c.maxDrafts,
        means: means[s]!,
        rates: rates[s]!,
        offset: this.acceptance.offset(c.id),
        hot: this.acceptance.hot(c.id),
        k: ks[s]!,
      })),
      ruleKs: choice.ks,
      curve: choice.curve,
      rate: best,
      costScale: [...this.costScale],
      overhead: [...this.overhead.coefficients],
      catchUpMsPerRow,
      catchUpRows: catchUpRows(),
      arm: this.stepArm,
    });
    return ks;
  }

  /**
   * The arm for the next step at batch size B ({@link arms}): the block's arm while it lasts; then, until every arm
   * ran {@link ARM_MIN_STEPS} steps, the next in turn; after that the one of highest upper confidence bound, its
   * discounted mean rate + {@link ARM_UCB} standard errors (the steps' spread pooled over the arms ÷ √ its discounted
   * count; ties to the lower arm): discounted UCB (Garivier & Moulines 2011), so an arm that realised less is tried
   * again as its count fades, sooner the closer it was.
   */
  private nextArm(B: number): number {
    let st = this.arms.get(B);
    if (st === undefined) {
      const fresh = (): ArmRates => ({ n: 0, sum: 0, sumSq: 0, steps: 0 });
      st = { rates: [fresh(), fresh(), fresh()], arm: -1, left: 0 };
      this.arms.set(B, st);
    }
    if (st.left > 0) {
      st.left--;
      return st.arm;
    }
    const r = st.rates;
    st.left = ARM_BLOCK - 1;
    if (r.some((a) => a.steps < ARM_MIN_STEPS)) {
      st.arm = (st.arm + 1) % r.length;
      return st.arm;
    }
    // the steps' spread pooled over the arms (relative to the mean rate), at least ARM_MIN_SPREAD
    let n = 0;
    let sum = 0;
    let dev = 0;
    for (const a of r) {
      n += a.n;
      sum += a.sum;
      dev += Math.max(0, a.sumSq - (a.sum * a.sum) / a.n);
    }
    const mean = sum / n;
    const sd = Math.max(Math.sqrt(dev / n), ARM_MIN_SPREAD * mean);
    let best = 0;
    let bound = Number.NEGATIVE_INFINITY;
    r.forEach((a, i) => {
      const ucb = a.sum / a.n + (ARM_UCB * sd) / Math.sqrt(a.n);
      if (ucb > bound) {
        best = i;
        bound = ucb;
      }
    });
    st.arm = best;
    return best;
  }

  /**
   * The realised-rate arms' discounted mean rates at batch size B, committed tokens per ms: `[rule, one draft for
   * all, plain]` (NaN for an arm not run yet); undefined before any step of B was chosen by an arm.
   */
  realizedRates(B: number): number[] | undefined {
    return this.arms.get(B)?.rates.map((a) => (a.n > 0 ? a.sum / a.n : Number.NaN));
  }

  /**
   * A step of {@link ARM_ONE} (one draft for every candidate that can draft, all of them verified) or
   * {@link ARM_PLAIN} (k = 0 for all), the rule not worked out: its cost, ~0.2 ms a step at 8 and 16 sequences
   * (bench:batch-phases, SmolLM2 + EAGLE-3), is part of what these arms save. Drafting runs go on, or end, as the
   * rule's choices make them.
   */
  private fixedArm(candidates: readonly DraftCandidate[], arm: number): number[] {
    const ks = candidates.map((c) => (arm === ARM_ONE ? Math.min(1, c.maxDrafts) : 0));
    candidates.forEach((c, s) => {
      const run = this.draftingRun.get(c.id) ?? 0;
      if (ks[s]! > 0) this.draftingRun.set(c.id, run + 1);
      else if (run > 0) this.endDraftingRun(c.id, run);
    });
    this.draftingStepRun = 0;
    this.threshold = arm === ARM_ONE ? 0 : Number.POSITIVE_INFINITY;
    this.stepArm = arm;
    this.trace?.({
      kind: 'choose',
      candidates: candidates.map((c, s) => ({
        id: c.id,
        maxDrafts: c.maxDrafts,
        means: [],
        rates: [],
        offset: 0,
        hot: this.acceptance.hot(c.id),
        k: ks[s]!,
      })),
      ruleKs: ks,
      curve: [],
      rate: 0,
      costScale: [...this.costScale],
      overhead: [...this.overhead.coefficients],
      catchUpMsPerRow: 0,
      catchUpRows: candidates.map(() => 0),
      arm,
    });
    return ks;
  }

  /**
   * Whether sequence `s` (not drafting in `ks`) drafting k = 1 … maxDrafts drafts, every one of them accepted, would
   * beat the rate of `choice` by {@link CostDraftPolicyOptions.minGain} at the modelled cost (its propose, its
   * verify rows, its catch-up): an exploration only informs the acceptance estimate, and when even acceptance 1
   * cannot make drafting pay, no estimate it leads to changes a choice (kimi-k3-tiny at 8 sequences on a 2-vCPU AMD
   * VM: one verify row more costs ~0.1 ms against 0.17 ms a plain token, plus the propose and the catch-up).
   */
  private couldPay(
    candidates: readonly DraftCandidate[],
    charged: readonly number[],
    ks: readonly number[],
    s: number,
    choice: BatchDraftChoice,
    cost: (shape: BatchShape) => number,
  ): boolean {
    const B = candidates.length;
    let drafts = 0;
    let drafting = 1;
    let catchUpRows = charged[s]!;
    ks.forEach((k, i) => {
      if (k <= 0 || i === s) return;
      drafts += k;
      drafting++;
      catchUpRows += charged[i]!;
    });
    for (let k = 1; k <= candidates[s]!.maxDrafts; k++) {
      const shape = { sequences: B, tokens: B + drafts + k, drafting, drafts: drafts + k, catchUpRows };
      if ((choice.committed + k) / cost(shape) >= choice.rate * (1 + this.minGain)) return true;
    }
    return false;
  }

  /**
   * Per candidate, the deferred rows its drafting this step is charged for (× the measured ms per catch-up row): the
   * rows one drafting step commits (E[committed | k = 1] at the acceptance means) whole, the backlog beyond them shared
   * over the steps the sequence has left when it drafts on, remainingTokens ÷ E[committed | maxDrafts] (at least 1),
   * or all of it over the mean drafting run without remainingTokens. A candidate that cannot draft is charged it all.
   * (The rows of a step charged as 1 + maxDrafts put 7 rows a sequence on SmolLM2 + EAGLE-3, where one draft a
   * sequence commits 1.76.) The backlog is what its plain steps deferred: it costs the same whenever it is written,
   * and is saved only if the sequence never drafts again. Shared over the mean run it was charged as if drafting
   * lasted ~2 steps, because the runs were cut short by that very charge (bench:load, SmolLM2 + EAGLE-3 at 8 sequences
   * on the AMD VM: ~5–9 ms of the ~36–45 ms at which one draft for every sequence was priced, a plain step 16–19 ms).
   * A deferred row costs ~1 % of a plain token there (0.026 against 2.1 ms), so a run cut short after all loses
   * little. `[B]` rows; computed once a step, and only when the rule or an exploration prices a drafting shape.
   */
  private chargedCatchUpRows(candidates: readonly DraftCandidate[]): number[] {
    return candidates.map((c) => {
      const pending = c.pendingContextRows ?? 0;
      if (pending <= 0) return 0;
      if (c.remainingTokens === undefined) return pending / this.draftingRunSteps;
      if (c.maxDrafts <= 0) return pending;
      const e = this.acceptance.expectedCommitted(c.id, c.maxDrafts, 0);
      const step = Math.min(pending, e[1]!);
      return step + (pending - step) / Math.max(1, c.remainingTokens / e[c.maxDrafts]!);
    });
  }

  /**
   * A sequence's drafting run of `steps` ended (it decodes plainly, or finished): folded into the mean run, unless it
   * was one exploration step the rule did not follow. Explorations are forced single steps; folding them in pulled
   * the mean run towards 1 step, so every catch-up was charged whole to one step (bench:load, SmolLM2 at 8 sequences
   * on the AMD VM: ~20 ms of the 56 ms at which one draft for every sequence was priced, ×2.97 a plain step).
   */
  private endDraftingRun(id: SequenceId, steps: number): void {
    this.draftingRun.delete(id);
    const exploredOnly = this.exploredRun.delete(id) && steps === 1;
    if (!exploredOnly) this.draftingRunSteps = 0.8 * this.draftingRunSteps + 0.2 * steps;
  }

  observeStep(
    sequences: number,
    tokens: number,
    drafting: number,
    drafts: number,
    verifyMs: number,
    proposeMs: number,
    proposed?: number,
  ): void {
    this.trace?.({
      kind: 'step',
      sequences,
      tokens,
      drafting,
      drafts,
      verifyMs,
      proposeMs,
      proposed: proposed ?? drafts,
      calibratedVerifyMs: this.costs.verifyMs(sequences, tokens),
      calibratedDraftMs: this.costs.draftMs(drafting, proposed ?? drafts),
    });
    if (!this.recalibrate) return;
    this.learnVerify(sequences, tokens - sequences, verifyMs);
    let batch = this.logBatch.get(sequences);
    if (batch === undefined) {
      batch = [0, 0, 0];
      this.logBatch.set(sequences, batch);
    }
    const rb = batch;
    /** The residual of one observation of kind i: log(measured ÷ calibrated) − (m + r_i + r_{B,i}), clipped. */
    const residual = (i: number, measured: number, calibrated: number): number | undefined =>
      calibrated > 0 && measured > 0
        ? Math.min(
            0.25,
            Math.max(-0.25, clampLog(Math.log(measured / calibrated)) - this.logMachine - this.logKind[i]! - rb[i]!),
          )
        : undefined;
    // a step whose drafts the verify budgets all cut verified one row per sequence: a plain forward
    const v = drafts > 0 ? 1 : 0;
    const e = residual(v, verifyMs, this.costs.verifyMs(sequences, tokens));
    if (e !== undefined) {
      this.logMachine = clampLog(this.logMachine + 0.1 * e);
      this.logKind[v] = clampLog(this.logKind[v]! + 0.1 * e);
      rb[v] = clampLog(rb[v]! + 0.2 * e);
    }
    if (drafting > 0) {
      // the propose call made `proposed` drafts, whatever the budgets then kept
      const d = residual(2, proposeMs, this.costs.draftMs(drafting, proposed ?? drafts));
      if (d !== undefined) {
        this.logKind[2] = clampLog(this.logKind[2]! + 0.2 * d);
        rb[2] = clampLog(rb[2]! + 0.2 * d);
      }
    }
    const now = this.scalesFor(sequences);
    for (let i = 0; i < 3; i++) this.costScale[i] = now[i]!;
  }

  /**
   * One verify forward of B sequences and B + r rows took `ms`: into the (B, r) window ({@link learned}), whose lower
   * median is kept.
   */
  private learnVerify(B: number, r: number, ms: number): void {
    if (!(r >= 0 && Number.isInteger(r) && ms > 0 && Number.isFinite(ms))) return;
    let windows = this.learned.get(B);
    if (windows === undefined) {
      windows = [];
      this.learned.set(B, windows);
    }
    let w = windows[r];
    if (w === undefined) {
      w = new MedianWindow();
      windows[r] = w;
    }
    w.add(ms, ++this.verifySamples);
    if (r > 0)
      this.learnedMonotone.delete(B); // the suffix minima and the plain step's cap
    else {
      // a plain sample is the newest: no drafted shape caps the plain step until one is measured again (which
      // rebuilds); the suffix minima stand
      const cached = this.learnedMonotone.get(B);
      if (cached !== undefined) cached.anchor = Number.POSITIVE_INFINITY;
    }
  }

  /**
   * The learned t_verify(B, B + r), ms (undefined: the calibrated curve × its factor stands in); `calibrated` is
   * t_cal(B, B + r), which the caller has memoised.
   * - r = 0, once measured {@link LEARNED_MIN} times: the plain window's lower median; when that window is stale (its
   *   middle-aged sample more than {@link STALE_SAMPLES} verify samples old), no dearer than any learned drafted shape
   *   measured since its newest sample, scaled by the calibrated curve's ratio, t(B, B + r') · t_cal(B, B) /
   *   t_cal(B, B + r'). While the batch drafts its plain samples are few and can be stale: a slow spell left a plain
   *   price that the drafted shapes, measured at every step, had long left behind (see
   *   {@link CostDraftPolicyOptions.explorePlainEvery}). Only then, and only from newer shapes: the least of the
   *   scaled prices is biased low (one shape the calibration overprices is enough), and while the batch decodes
   *   plainly it is the drafted windows that are stale. SmolLM2 + DFlash at the default sampling, one sequence (a
   *   throwaway trace): with the cap always on, a 7-row shape measured at 13.5 ms against 12.9 calibrated held the
   *   plain step at 5.9 ms while plain steps ran at 6.3–7.9 ms; from a newer shape only, a 4-row one calibrated at
   *   13.2 ms (a start-up outlier; measured 8.9) priced it at 4.1 right after each drafting step. 72–74 % of the
   *   steps stayed plain at the break-even, where 3 drafts a step ran ×1.11–1.22 of plain decoding.
   * - r ≥ 1 measured {@link LEARNED_MIN} times: the least lower median over the learned shapes of r' ≥ r rows
   *   (non-decreasing in r; the plain step is left out of it: a plain step between drafting steps runs slower than one
   *   of a plain run, see {@link learned}). A stale drafted window is first capped as the plain one is, by the fresh
   *   drafted shapes of fewer rows measured since its newest sample, t(B, B + j) · t_cal(B, B + r) / t_cal(B, B + j),
   *   j < r (a fresh shape of more rows caps it unscaled, in the suffix minimum; scaled down by a calibration steeper
   *   than the machine, it priced a stale 1-draft shape at 1.2 ms where every shape ran at 3.1–3.5, and the rule
   *   then chose 1 draft where 7 paid, until that shape was measured again). Without the cap a
   *   shape priced during warm-up kept that price for good, since the rule never chose it again: SmolLM2 + EAGLE-3,
   *   one sequence, greedy (bench:load --trace, AMD VM): every step of 4–6 drafts came in the first 98 of 3,086,
   *   their verify forwards at 12.7–34.6 ms while k = 3 ran at 9.5 ms, and the rule drafted 3 at most from then on;
   *   in steady state a 5-row verify cost ~6 % more than a 4-row one, and fixed k = 4 ran 2–4 % faster than k = 3.
   * - r ≥ 1 not measured, once the plain step is: that price × t_cal(B, B + r) / t_cal(B, B), capped by the learned
   *   shapes of more rows. The calibrated time × the drafting steps' factor (their mean log ratio) read a 16-row
   *   verify of 8 sequences at 1.97 × its calibration where the plain step's lower median read 1.63 × (SmolLM2 +
   *   EAGLE-3 on the AMX host, bench:load --trace; the shapes all ran at 1.8–1.9 ×), and no draft was made where
   *   every sequence drafting one ran ×1.02 of plain decoding. The same statistic on both sides of the comparison.
   * The drafted shapes carry the machine's present speed, the calibrated curve the ratio between the shapes.
   */
  private learnedVerifyMs(B: number, r: number, calibrated: number): number | undefined {
    if (!this.useLearned) return undefined;
    const windows = this.learned.get(B);
    const cached = this.curveOf(B);
    if (windows === undefined || cached === undefined) return undefined;
    const { mono, plainCal } = cached;
    const plain = this.plainPrice(windows, cached.anchor);
    if (r === 0) return plain;
    const wr = r < windows.length ? windows[r] : undefined;
    if (wr !== undefined && wr.n >= LEARNED_MIN) return mono[r]!;
    // not measured (enough): the learned plain step × the calibrated ratio, under any learned shape of more rows
    if (plain === undefined || !(plainCal > 0 && calibrated > 0)) return undefined;
    const above = r < mono.length ? mono[r]! : Number.NaN;
    const est = (plain * calibrated) / plainCal;
    return Number.isNaN(above) ? est : Math.min(est, above);
  }

  /**
   * {@link CostDraftPolicyOptions.costOptimism}'s cap on the verify price at batch size B and r drafted rows, ms: the
   * price of the frontier (the most drafted rows of a shape measured {@link LEARNED_MIN} times; the plain step when
   * no drafted shape is) when r is one row beyond it, +∞ otherwise or when nothing is measured.
   */
  private optimisticCapMs(B: number, r: number): number {
    const windows = this.learned.get(B);
    const cached = this.useLearned ? this.curveOf(B) : undefined;
    if (windows === undefined || cached === undefined || r !== cached.frontier + 1) return Number.POSITIVE_INFINITY;
    if (cached.frontier > 0) return cached.mono[cached.frontier]!;
    return this.plainPrice(windows, cached.anchor) ?? Number.POSITIVE_INFINITY;
  }

  /** The learned plain step of one batch size's `windows`, at most `anchor`, ms; undefined: not measured enough. */
  private plainPrice(windows: readonly (MedianWindow | undefined)[], anchor: number): number | undefined {
    const w0 = windows[0];
    return w0 !== undefined && w0.n >= LEARNED_MIN ? Math.min(w0.median, anchor) : undefined;
  }

  /** The learned curve of batch size B ({@link learnedMonotone}), built when missing; undefined: nothing measured. */
  private curveOf(B: number): { mono: Float64Array; anchor: number; plainCal: number; frontier: number } | undefined {
    const windows = this.learned.get(B);
    if (windows === undefined) return undefined;
    let cached = this.learnedMonotone.get(B);
    if (cached === undefined) {
      const mono = new Float64Array(Math.max(1, windows.length));
      let least = Number.NaN;
      let anchor = Number.POSITIVE_INFINITY;
      let frontier = 0;
      const plainCal = this.costs.verifyMs(B, B);
      const w0 = windows[0];
      const stale = (w: MedianWindow): boolean => this.verifySamples - w.midSeq() > STALE_SAMPLES;
      // the cap is for a stale plain window only, and is read from the drafted shapes measured after it
      const plainStale = w0 === undefined || stale(w0);
      const plainLast = w0?.last ?? 0;
      // the learned drafted shapes' t_cal(B, B + i); the fresh ones' price per calibrated ms and newest sample
      const cal = new Float64Array(windows.length);
      const fresh: { perCal: number; last: number; rows: number }[] = [];
      for (let i = 1; i < windows.length; i++) {
        const w = windows[i];
        if (w === undefined || w.n < LEARNED_MIN) continue;
        cal[i] = this.costs.verifyMs(B, B + i);
        if (cal[i]! > 0 && !stale(w)) fresh.push({ perCal: w.median / cal[i]!, last: w.last, rows: i });
      }
      for (let i = windows.length - 1; i >= 1; i--) {
        const w = windows[i];
        if (w !== undefined && w.n >= LEARNED_MIN) {
          frontier = Math.max(frontier, i);
          let price = w.median;
          // a stale shape: no dearer than a fresh one measured after it, scaled by the calibrated ratio
          if (cal[i]! > 0 && stale(w))
            for (const f of fresh) if (f.last > w.last && f.rows < i) price = Math.min(price, f.perCal * cal[i]!);
          least = Number.isNaN(least) ? price : Math.min(least, price);
          if (plainStale && cal[i]! > 0 && plainCal > 0 && w.last > plainLast)
            anchor = Math.min(anchor, (w.median * plainCal) / cal[i]!);
        }
        mono[i] = least; // NaN until a learned shape of i rows or more
      }
      cached = { mono, anchor, plainCal, frontier };
      this.learnedMonotone.set(B, cached);
    }
    return cached;
  }

  /**
   * The verify price the rule reads at batch size B and r drafted rows ({@link learnedVerifyMs}, else the calibrated
   * curve × its factor; under {@link optimisticCapMs} with `costOptimism`), ms.
   */
  private verifyPriceMs(B: number, r: number): number {
    const [plainScale, verifyScale] = this.scalesFor(B);
    return this.verifyPrice(B, r, this.costs.verifyMs(B, B + r), r > 0 ? verifyScale : plainScale);
  }

  /** {@link verifyPriceMs} given t_cal(B, B + r) = `calibrated` and its factor `scale` (the rule memoises them). */
  private verifyPrice(B: number, r: number, calibrated: number, scale: number): number {
    return Math.min(
      this.learnedVerifyMs(B, r, calibrated) ?? calibrated * scale,
      this.costOptimism ? this.optimisticCapMs(B, r) : Number.POSITIVE_INFINITY,
    );
  }

  /** The cost factors [plain verify, verify with drafts, propose] at batch size B ({@link costScale}'s model). */
  private scalesFor(B: number): [number, number, number] {
    const rb = this.logBatch.get(B);
    const at = (i: number): number => Math.exp(clampLog(this.logMachine + this.logKind[i]! + (rb?.[i] ?? 0)));
    return [at(0), at(1), at(2)];
  }

  /**
   * λ for the step just chosen: R* = `rate` (committed tokens per ms, predicted before any draft
   * exists), δ = secant slope of t_verify(B, ·) from B rows (plain) to B + Σk rows (one more row
   * when nobody drafts), λ = R*·δ. t_verify as the rule priced it ({@link verifyPriceMs}: the learned shapes, else
   * the calibrated curve × its factor, the optimism included), not the bare calibration: a calibration read in a slow
   * spell had DFlash's 3-draft verify 2.4 ms dearer than its plain step where it cost 0.4 ms more, and λ six times
   * too high cut drafts the rule had chosen. The optimism too: a rule that drafts one row more because it takes the
   * row to be free must not have the budgets cut it as dear, or that shape is never verified, never measured, and
   * the rule asks for it again (SmolLM2 + DFlash under a calibration skewed 20 % a draft: the rule chose 4 drafts at
   * 85 % of the steps, 0 were verified at 92 %; ×0.69 of plain decoding where 3 drafts fixed ran ×1.35).
   */
  private setThreshold(B: number, ks: readonly number[], rate: number): void {
    const d = Math.max(
      1,
      ks.reduce((a, k) => a + k, 0),
    );
    const delta = Math.max(0, (this.verifyPriceMs(B, d) - this.verifyPriceMs(B, 0)) / d);
    this.predictedRate = rate;
    this.marginalVerifyMs = delta;
    this.threshold = rate * delta;
  }

  /**
   * The survival rule with the threshold of the last choose (see the file comment), on the calibrated confidences
   * a(c_j) ({@link ConfidenceCalibration}, learned from earlier steps only, so draft j's decision still reads
   * c_1 … c_j alone): draft j is verified iff Π_{l ≤ j} a(c_l) ≥ λ.
   */
  budgets(items: readonly BudgetItem[]): number[] {
    return items.map((it) => {
      const c = it.confidence;
      const a = new Float32Array(c.length);
      for (let j = 0; j < c.length; j++) a[j] = this.calibration.map(c[j]!);
      const k = survivalBudget(a, this.threshold);
      this.verifiedConfidence.set(it.id, c.slice(0, k));
      return k;
    });
  }

  observe(id: SequenceId, drafted: number, accepted: number): void {
    this.trace?.({ kind: 'observe', id, drafted, accepted });
    const c = this.verifiedConfidence.get(id);
    this.verifiedConfidence.delete(id);
    // the arms' catch-up accounting (observeRealized): nothing to keep without them
    if (this.realizedArms) {
      if (drafted === 0) {
        this.plainDeferred.set(id, (this.plainDeferred.get(id) ?? 0) + 1);
        this.stepDeferred++;
      } else {
        this.stepCaughtUp += this.plainDeferred.get(id) ?? 0;
        this.plainDeferred.delete(id);
      }
    }
    if (drafted > 0) {
      this.acceptance.observe(id, drafted, accepted);
      // drafts 1 … accepted + 1 were decided (the first rejected one included), each under its own confidence
      if (c !== undefined)
        for (let j = 0; j < Math.min(drafted, accepted + 1, c.length); j++)
          this.calibration.observe(c[j]!, j < accepted);
    }
  }

  observeRealized(sequences: number, committed: number, ms: number): void {
    this.trace?.({ kind: 'realized', sequences, committed, ms });
    this.realizedSeen = true;
    const arm = this.stepArm;
    const { stepDeferred, stepCaughtUp, stepCatchUpRows, stepCatchUpMs } = this;
    this.stepArm = -1;
    this.stepDeferred = 0;
    this.stepCaughtUp = 0;
    this.stepCatchUpRows = 0;
    this.stepCatchUpMs = 0;
    if (arm < 0 || !(committed > 0 && ms > 0 && Number.isFinite(ms))) return;
    // A row a plain step deferred costs its share of a catch-up whenever it is written: charged to that step, not to
    // the drafting step that writes it (a drafting arm run after plain blocks paid their backlog, and read 0.85
    // tokens/ms against the plain arm's 0.95: SmolLM2 + EAGLE-3 at 8 sequences, bench:load --trace). A prompt's rows
    // stay with the step that writes them: drafting for a request at all costs them (~2 % of its decode at 16
    // sequences on the AMD VM), which the drafting arms must earn.
    const perRow = this.catchUpRows > 0 ? this.catchUpMs / this.catchUpRows : 0;
    const st = this.arms.get(sequences);
    if (st === undefined) return;
    const plainShare = stepCatchUpRows > 0 ? Math.min(1, stepCaughtUp / stepCatchUpRows) : 0;
    const rate = committed / (Math.max(1e-6, ms - stepCatchUpMs * plainShare) + stepDeferred * perRow);
    for (const a of st.rates) {
      a.n *= ARM_FORGET;
      a.sum *= ARM_FORGET;
      a.sumSq *= ARM_FORGET;
    }
    const a = st.rates[arm]!;
    a.n++;
    a.sum += rate;
    a.sumSq += rate * rate;
    a.steps++;
  }

  observeContext(rows: number, ms: number): void {
    this.trace?.({ kind: 'context', rows, ms });
    if (!(rows > 0 && ms >= 0)) return;
    this.stepCatchUpMs += ms;
    this.stepCatchUpRows += rows;
    const first = this.catchUpRows === 0;
    this.catchUpMs = first ? ms : 0.8 * this.catchUpMs + 0.2 * ms;
    this.catchUpRows = first ? rows : 0.8 * this.catchUpRows + 0.2 * rows;
  }

  observeOverhead(ms: number, drafted: boolean, rows = 1, shape?: OverheadShape): void {
    const sh =
      shape ??
      (drafted ? { sequences: 1, drafting: 1, drafts: rows - 1 } : { sequences: rows, drafting: 0, drafts: 0 });
    this.trace?.({ kind: 'overhead', ms, drafted, rows, shape: sh });
    const i = drafted ? 1 : 0;
    const seen = ++this.overheadSeen[i]!;
    if (seen <= OVERHEAD_WARMUP || !(rows > 0)) return;
    this.overhead.observe(ms, sh);
  }

  release(id: SequenceId): void {
    this.acceptance.release(id);
    this.plainDeferred.delete(id);
    this.verifiedConfidence.delete(id);
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
