/**
 * What a drafter's per-draft confidence c_j (`DraftProposal.confidence`) says about acceptance, learned online for the
 * cost policy's verify budgets (draft-policy.ts, {@link CostDraftPolicy.budgets}: draft j is verified iff its
 * survival Π_{l ≤ j} a(c_l) clears the step's threshold λ).
 *
 * {@link ConfidenceCalibration}: a(c) = P(draft j accepted | drafts < j accepted, c_j = c), binned by c, each bin a
 * Beta posterior whose prior mean is the bin's middle c (a drafter that reports its probabilities truthfully needs no
 * data), made non-decreasing in c by pool-adjacent-violators (isotonic regression: Zadrozny & Elkan, "Transforming
 * classifier scores into accurate multiclass probability estimates", KDD 2002). A raw score is not a probability:
 * EAGLE-3's draft-vocabulary probability on SmolLM2 under-states acceptance (greedy chains of 6 over the 64 SmolLM2
 * prompts, 128 tokens, 2,413 chains: c ∈ [0, 0.2) accepted 0.20, [0.2, 0.4) 0.43, [0.5, 0.6) 0.73, [0.7, 0.8) 0.90,
 * [0.8, 0.9) 0.96, ≥ 0.95 0.99), while DSpark's confidence head is trained to be one.
 */

/** Bin edges of {@link ConfidenceCalibration} over c ∈ [0, 1]: finer near 1, where confident drafts live. */
const EDGES = [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0000001];
/** Each bin's prior mean: its middle c. */
const MIDDLES = EDGES.slice(1).map((hi, b) => (EDGES[b]! + Math.min(1, hi)) / 2);

/** Online calibration of confidences to conditional acceptance (see the file comment). */
export class ConfidenceCalibration {
  /** Per bin: pseudo-observations offered and accepted (the prior included, faded by `forget`). */
  private readonly offered: Float64Array;
  private readonly accepted: Float64Array;
  /** The isotonic fit per bin, recomputed when an observation arrived since. */
  private readonly fit: Float64Array;
  private dirty = true;

  /**
   * @param priorWeight pseudo-observations of each bin's prior mean (its middle c), > 0 (default 4).
   * @param forget weight kept by every count per observation, (0, 1] (default 0.9995: about 2,000 drafts).
   */
  constructor(
    private readonly priorWeight = 4,
    private readonly forget = 0.9995,
  ) {
    const n = EDGES.length - 1;
    this.offered = new Float64Array(n);
    this.accepted = new Float64Array(n);
    this.fit = new Float64Array(n);
    for (let b = 0; b < n; b++) {
      this.offered[b] = priorWeight;
      this.accepted[b] = priorWeight * MIDDLES[b]!;
    }
  }

  /** The bin of c (NaN and values outside [0, 1] clamp to the ends). */
  private static bin(c: number): number {
    if (!(c > 0)) return 0;
    let b = 0;
    while (b < EDGES.length - 2 && c >= EDGES[b + 1]!) b++;
    return b;
  }

  /** One decided draft of confidence c: accepted or rejected. */
  observe(c: number, accepted: boolean): void {
    const f = this.forget;
    const n = this.offered.length;
    for (let b = 0; b < n; b++) {
      // fade toward the prior, never below it
      const mean = MIDDLES[b]! * this.priorWeight;
      this.offered[b] = this.priorWeight + f * (this.offered[b]! - this.priorWeight);
      this.accepted[b] = mean + f * (this.accepted[b]! - mean);
    }
    const b = ConfidenceCalibration.bin(c);
    this.offered[b]! += 1;
    if (accepted) this.accepted[b]! += 1;
    this.dirty = true;
  }

  /** a(c): the calibrated conditional acceptance of a draft of confidence c, in (0, 1). */
  map(c: number): number {
    if (this.dirty) this.refit();
    return this.fit[ConfidenceCalibration.bin(c)]!;
  }

  /** The calibrated value of every bin, ascending c (for traces and tests). */
  curve(): number[] {
    if (this.dirty) this.refit();
    return Array.from(this.fit);
  }

  /** Pool-adjacent-violators over the bins' posterior means, weighted by their counts. */
  private refit(): void {
    const n = this.offered.length;
    const val: number[] = [];
    const wt: number[] = [];
    const len: number[] = [];
    for (let b = 0; b < n; b++) {
      val.push(this.accepted[b]! / this.offered[b]!);
      wt.push(this.offered[b]!);
      len.push(1);
      while (val.length > 1 && val[val.length - 2]! > val[val.length - 1]!) {
        const w = wt[wt.length - 2]! + wt[wt.length - 1]!;
        const v = (val[val.length - 2]! * wt[wt.length - 2]! + val[val.length - 1]! * wt[wt.length - 1]!) / w;
        const l = len[len.length - 2]! + len[len.length - 1]!;
        val.length -= 2;
        wt.length -= 2;
        len.length -= 2;
        val.push(v);
        wt.push(w);
        len.push(l);
      }
    }
    let b = 0;
    val.forEach((v, i) => {
      for (let r = 0; r < len[i]!; r++) this.fit[b++] = Math.min(1 - 1e-4, Math.max(1e-4, v));
    });
    this.dirty = false;
  }
}
