/**
 * Speculative-decoding counters, per request and per run (counting only; printing and export live
 * with their callers). Definitions (REFERENCE.md §1, §6; glossary in docs/ARCHITECTURE.md):
 * - acceptance rate = accepted / drafted;
 * - per-position acceptance[i] = verify steps whose draft i was accepted / verify steps (every verify step, k = 0
 *   steps of the cost policy included);
 * - per-draft acceptance[i] = verify steps whose draft i was accepted / draft steps (steps that verified ≥ 1 draft:
 *   vLLM's denominator, `num_drafts` on /metrics);
 * - acceptance-length histogram[n] = verify steps that committed n tokens (accepted + 1; index 0 unused);
 * - `tauPerStep` = mean over verify steps of (accepted + 1) = committed / verify steps;
 * - `tauPerDraft` = 1 + accepted / draft steps (vLLM's "mean acceptance length"; equal to `tauPerStep` when every
 *   verify step drafts);
 * - `tauMeanOfRequests` = mean over requests of each request's `tauPerStep` (a different number; never mix them);
 * - verify budgets (adaptive verification, engine/draft-policy.ts): `budgetHistogram[n]` = steps whose
 *   proposal went through the policy's budget hook and kept n drafts for verification;
 *   `meanBudget` = mean n over those steps; `unverified` = drafts proposed but cut by a budget.
 *   `drafted` counts verified drafts only (what acceptance is measured against).
 */

/** Counters of one request. Mutable while the request runs. */
export class RequestMetrics {
  /** Draft tokens verified (proposed and kept by the verify budget). */
  drafted = 0;
  /** Draft tokens proposed but not verified (cut by a verify budget). */
  unverified = 0;
  /** Draft tokens accepted. */
  accepted = 0;
  /** Verify steps this request took part in. */
  verifySteps = 0;
  /** Verify steps that verified ≥ 1 draft token (plain k = 0 steps excluded; Prometheus' num_drafts). */
  draftSteps = 0;
  /**
   * Steps decoded plainly because a draft step would have reached the drafter's `maxPosition` (its trained
   * positions): drafting stopped for the rest of the request.
   */
  positionLimitedSteps = 0;
  /** Target forwards this request took part in (prefill chunks, verify, replays). */
  targetForwards = 0;
  /** Prefill forwards (chunks). */
  prefillForwards = 0;
  /** Accepted count by draft index: `acceptedAt[i]` = steps whose draft i was accepted. */
  readonly acceptedAt: number[] = [];
  /** `lengthHistogram[n]` = verify steps committing n tokens (n ≥ 1). */
  readonly lengthHistogram: number[] = [];
  /** `budgetHistogram[n]` = steps whose verify budget kept n drafts (only steps that went through a budget hook). */
  readonly budgetHistogram: number[] = [];

  /** Records a verify-budget decision: `proposed` drafts, the first `verified` kept. */
  recordBudget(proposed: number, verified: number): void {
    this.budgetHistogram[verified] = (this.budgetHistogram[verified] ?? 0) + 1;
    this.unverified += proposed - verified;
  }

  /** Steps that went through a verify budget. */
  get budgetSteps(): number {
    return sum(this.budgetHistogram);
  }

  /** Mean verified drafts over the budgeted steps (0 when none). */
  get meanBudget(): number {
    return meanOf(this.budgetHistogram);
  }

  /** Records one verify step: `drafted` drafts, `accepted` of them kept. */
  recordStep(drafted: number, accepted: number): void {
    this.drafted += drafted;
    this.accepted += accepted;
    this.verifySteps++;
    if (drafted > 0) this.draftSteps++;
    for (let i = 0; i < accepted; i++) this.acceptedAt[i] = (this.acceptedAt[i] ?? 0) + 1;
    this.lengthHistogram[accepted + 1] = (this.lengthHistogram[accepted + 1] ?? 0) + 1;
  }

  /** Mean over this request's verify steps of (accepted + 1); 0 before the first step. */
  get tauPerStep(): number {
    return this.verifySteps === 0 ? 0 : (this.accepted + this.verifySteps) / this.verifySteps;
  }

  /** accepted / drafted (0 when nothing was drafted). */
  get acceptanceRate(): number {
    return this.drafted === 0 ? 0 : this.accepted / this.drafted;
  }

  /** `[i]` = fraction of verify steps whose draft i was accepted. */
  get perPositionAcceptance(): number[] {
    return this.acceptedAt.map((c) => (this.verifySteps === 0 ? 0 : (c ?? 0) / this.verifySteps));
  }

  /** 1 + accepted / draft steps (vLLM's mean acceptance length; 0 before the first draft step). */
  get tauPerDraft(): number {
    return this.draftSteps === 0 ? 0 : 1 + this.accepted / this.draftSteps;
  }

  /** `[i]` = fraction of draft steps (≥ 1 draft verified) whose draft i was accepted: vLLM's per-position rate. */
  get perDraftAcceptance(): number[] {
    return dense(this.acceptedAt).map((c) => (this.draftSteps === 0 ? 0 : c / this.draftSteps));
  }

  /** Histogram as a dense array `[0 … max]` (index = tokens committed in a step). */
  get acceptanceLengthHistogram(): number[] {
    return Array.from({ length: this.lengthHistogram.length }, (_, i) => this.lengthHistogram[i] ?? 0);
  }

  /** A plain JSON object (snake_case, as the CLI prints it). */
  toJSON(): Record<string, unknown> {
    return {
      drafted: this.drafted,
      accepted: this.accepted,
      verify_steps: this.verifySteps,
      target_forwards: this.targetForwards,
      acceptance_length: this.tauPerStep,
      acceptance_rate: this.acceptanceRate,
      per_position_acceptance: this.perPositionAcceptance,
      acceptance_length_histogram: this.acceptanceLengthHistogram,
      unverified: this.unverified,
      verify_budget_histogram: dense(this.budgetHistogram),
      mean_verify_budget: this.meanBudget,
    };
  }
}

/** Counters of a whole run (all requests of an engine). */
export class RunMetrics {
  /** Engine steps that ran a verify forward (one target forward covers every running sequence). */
  verifyForwards = 0;
  /**
   * Target forwards outside prefill: verify forwards + replays (equal to verifyForwards when committing from
   * snapshots).
   */
  decodeForwards = 0;
  /** Prefill forwards. */
  prefillForwards = 0;
  /**
   * Prompt tokens run through the target's prefill forwards (a decode instance of a prefill/decode pair
   * receives its prompts' state and runs none: this stays 0 there).
   */
  prefillTokens = 0;
  /** Draft proposals (propose calls). */
  proposeCalls = 0;
  /**
   * Wall time in prefill chunks (each the target's forward, and after the last one the first token), ms: a run's wall
   * time less this is its decoding (TPOT's time; a drafter's catch-up on the prompt falls in the first decode step).
   */
  prefillMs = 0;
  /** Wall time in propose / verify forward / commit, ms. */
  draftMs = 0;
  verifyMs = 0;
  commitMs = 0;
  /** Wall time spent measuring step costs for the cost-based draft policy, ms (once per engine at most). */
  calibrationMs = 0;
  /** Metrics of every request that finished (any reason). */
  readonly requests: RequestMetrics[] = [];

  get drafted(): number {
    return this.requests.reduce((a, r) => a + r.drafted, 0);
  }

  get accepted(): number {
    return this.requests.reduce((a, r) => a + r.accepted, 0);
  }

  /** Verify steps summed over requests (a batched forward counts once per sequence in it). */
  get verifySteps(): number {
    return this.requests.reduce((a, r) => a + r.verifySteps, 0);
  }

  /** Verify steps that verified ≥ 1 draft, summed over requests (vLLM's `num_drafts`). */
  get draftSteps(): number {
    return this.requests.reduce((a, r) => a + r.draftSteps, 0);
  }

  /** τ per draft step: 1 + accepted / draft steps (vLLM's mean acceptance length; 0 when nothing was drafted). */
  get tauPerDraft(): number {
    const d = this.draftSteps;
    return d === 0 ? 0 : 1 + this.accepted / d;
  }

  /** τ, definition 1: mean over all verify steps (of all requests) of (accepted + 1). */
  get tauPerStep(): number {
    const s = this.verifySteps;
    return s === 0 ? 0 : (this.accepted + s) / s;
  }

  /** τ, definition 2: mean over requests (with ≥ 1 verify step) of each request's τ. */
  get tauMeanOfRequests(): number {
    const rs = this.requests.filter((r) => r.verifySteps > 0);
    return rs.length === 0 ? 0 : rs.reduce((a, r) => a + r.tauPerStep, 0) / rs.length;
  }

  /** Per-position acceptance over all verify steps. */
  get perPositionAcceptance(): number[] {
    const s = this.verifySteps;
    const counts: number[] = [];
    for (const r of this.requests)
      r.acceptedAt.forEach((c, i) => {
        counts[i] = (counts[i] ?? 0) + (c ?? 0);
      });
    return Array.from({ length: counts.length }, (_, i) => (s === 0 ? 0 : (counts[i] ?? 0) / s));
  }

  /** Drafts proposed but cut by a verify budget, over all requests. */
  get unverified(): number {
    return this.requests.reduce((a, r) => a + r.unverified, 0);
  }

  /** Verify-budget histogram over all requests (`[n]` = budgeted steps that verified n drafts). */
  get budgetHistogram(): number[] {
    const h: number[] = [];
    for (const r of this.requests)
      r.budgetHistogram.forEach((c, i) => {
        h[i] = (h[i] ?? 0) + (c ?? 0);
      });
    return dense(h);
  }

  /** Mean verified drafts over all budgeted steps (0 when none). */
  get meanBudget(): number {
    return meanOf(this.budgetHistogram);
  }

  /** Acceptance-length histogram over all verify steps. */
  get acceptanceLengthHistogram(): number[] {
    const h: number[] = [];
    for (const r of this.requests)
      r.lengthHistogram.forEach((c, i) => {
        h[i] = (h[i] ?? 0) + (c ?? 0);
      });
    return Array.from({ length: h.length }, (_, i) => h[i] ?? 0);
  }
}

function dense(h: readonly (number | undefined)[]): number[] {
  return Array.from({ length: h.length }, (_, i) => h[i] ?? 0);
}

function sum(h: readonly (number | undefined)[]): number {
  let n = 0;
  for (let i = 0; i < h.length; i++) n += h[i] ?? 0;
  return n;
}

/** Mean index of a histogram (0 when empty). */
function meanOf(h: readonly (number | undefined)[]): number {
  let n = 0;
  let s = 0;
  for (let i = 0; i < h.length; i++) {
    n += h[i] ?? 0;
    s += i * (h[i] ?? 0);
  }
  return n === 0 ? 0 : s / n;
}
