/**
 * The batch draft-length rule: how many drafts each running sequence verifies this step, chosen for the whole
 * batch by the measured cost of the batch's ONE verify forward (its total rows), not per sequence.
 *
 * Objective (goodput, SmartSpec: Liu et al., "Optimizing Speculative Decoding for Serving Large Language Models
 * Using Goodput", arXiv 2406.14066, §3–4: expected generated tokens per unit of batch execution time, the batch
 * time modelled from the batch's total tokens):
 *   goodput(k_1..k_B) = Σ_s E_s[committed | k_s] / cost(T = B + Σ_s k_s, drafting sequences, drafts, catch-up rows)
 * with E_s[committed | k] = 1 + Σ_{j ≤ k} Π_{l ≤ j} a_sl (a_sl: P(draft l accepted | drafts < l accepted)).
 * SmartSpec picks one k for the whole batch; per-sequence lengths follow TETRIS (Wu et al., "Optimal Draft Token
 * Selection for Batch Speculative Decoding", ACL 2025, arXiv 2502.15197): the batch's draft rows go to the drafts
 * with the highest cumulative acceptance Π_{l ≤ j} a_sl, whichever sequence they belong to.
 *
 * Algorithm (exact when the cost depends on T alone): E_s is concave in k (its increment at j is Π_{l ≤ j} a_sl,
 * non-increasing in j), so for every total budget D = Σ_s k_s the largest Σ_s E_s is reached by taking the D largest
 * increments over all sequences, in order within each sequence (a merge of B non-increasing lists). The rule walks
 * D = 0, 1, …, Σ_s maxDrafts_s along that merge, evaluates the batch cost at each D (T = B + D, the drafting
 * sequences and catch-up rows of that prefix) and keeps the D of highest goodput (ties to fewer drafts). The draft
 * cost's dependence on the number of drafting sequences and a sequence's catch-up rows (its deferred draft context,
 * written before it drafts) are charged at each prefix, so with them the rule is the best over the merge order — a
 * heuristic there, exact for the verify curve. Work: O(D·B) comparisons and D + 1 cost evaluations per step.
 */

/** The shape of one batch step, what its cost depends on. Immutable. */
export interface BatchShape {
  /** Sequences in the verify forward (B). */
  readonly sequences: number;
  /** Rows of the verify forward, T = B + Σ k_s. */
  readonly tokens: number;
  /** Sequences that draft this step (k_s > 0): the size of the propose call. */
  readonly drafting: number;
  /** Drafts in all, Σ k_s. */
  readonly drafts: number;
  /** Deferred draft-context rows the drafting sequences write before they propose (their lazy catch-up). */
  readonly catchUpRows: number;
}

/** One sequence offered to the rule. Immutable. */
export interface BatchDraftItem {
  /**
   * E[committed | k] for k = 0 … maxDrafts, `gains[0] = 1` (a plain step commits one token); non-decreasing, and
   * concave for the rule to be exact (the acceptance estimator's are).
   */
  readonly gains: readonly number[];
  /** Deferred draft-context rows this sequence must write before it drafts (0 when its context is current). */
  readonly catchUpRows: number;
}

/** The rule's choice. Immutable. */
export interface BatchDraftChoice {
  /** Drafts per item, in [0, gains.length − 1]. */
  readonly ks: readonly number[];
  /** Expected committed tokens of the step, Σ_s E_s[committed | k_s]. */
  readonly committed: number;
  /** The cost of the chosen shape, ms. */
  readonly costMs: number;
  /** Goodput of the choice, expected committed tokens per ms. */
  readonly rate: number;
  /**
   * The walk the choice was taken from: for D = 0 … Σ maxDrafts drafts along the merge order, the expected committed
   * tokens and the cost of that shape (`rate` = committed ÷ costMs at `ks`' D). For tracing (the policy's `trace`).
   */
  readonly curve: readonly { readonly drafts: number; readonly committed: number; readonly costMs: number }[];
}

/**
 * Chooses the batch's draft lengths by goodput (see the file comment).
 * @param items one per sequence of the verify forward, in batch order.
 * @param costMs the cost of a batch step of that shape, ms (> 0; measured: t_draft + t_verify(T) + overheads).
 * @returns the draft lengths and the goodput they reach; all zeros for an empty batch.
 * @throws {RangeError} naming the item when its gains are empty, do not start at 1 or decrease, and naming the shape
 *   when the cost is not a positive finite number.
 */
export function chooseBatchDraftLengths(
  items: readonly BatchDraftItem[],
  costMs: (shape: BatchShape) => number,
): BatchDraftChoice {
  const B = items.length;
  items.forEach((it, s) => {
    const g = it.gains;
    if (g.length === 0 || g[0] !== 1)
      throw new RangeError(`chooseBatchDraftLengths: items[${s}].gains: expected gains[0] = 1, got ${g[0]}`);
    for (let j = 1; j < g.length; j++)
      if (!(g[j]! >= g[j - 1]!))
        throw new RangeError(`chooseBatchDraftLengths: items[${s}].gains[${j}] = ${g[j]} < gains[${j - 1}]`);
  });
  const ks = new Array<number>(B).fill(0);
  if (B === 0) return { ks, committed: 0, costMs: 0, rate: 0, curve: [] };
  const cost = (shape: BatchShape): number => {
    const c = costMs(shape);
    if (!(c > 0 && Number.isFinite(c)))
      throw new RangeError(`chooseBatchDraftLengths: cost of ${JSON.stringify(shape)}: expected > 0 ms, got ${c}`);
    return c;
  };
  // the merge order: each step takes the sequence whose next increment is largest (ties: one already drafting,
  // whose propose call and catch-up are paid, then the fewer catch-up rows, then the lower index)
  const order: number[] = [];
  const next = new Array<number>(B).fill(0);
  /** Tie order: s before t when s drafts already and t not, or both alike and s has fewer catch-up rows. */
  const before = (s: number, t: number): boolean => {
    const sNew = next[s] === 0;
    const tNew = next[t] === 0;
    if (sNew !== tNew) return !sNew;
    return sNew && items[s]!.catchUpRows < items[t]!.catchUpRows;
  };
  for (;;) {
    let pick = -1;
    let pickGain = -1;
    for (let s = 0; s < B; s++) {
      const g = items[s]!.gains;
      const k = next[s]!;
      if (k + 1 >= g.length) continue;
      const gain = g[k + 1]! - g[k]!;
      if (gain > pickGain || (gain === pickGain && before(s, pick))) {
        pick = s;
        pickGain = gain;
      }
    }
    if (pick < 0) break;
    order.push(pick);
    next[pick]!++;
  }
  let committed = B;
  let drafting = 0;
  let catchUpRows = 0;
  const walk = new Array<number>(B).fill(0);
  const shape = (d: number): BatchShape => ({ sequences: B, tokens: B + d, drafting, drafts: d, catchUpRows });
  let best = { d: 0, committed, costMs: cost(shape(0)) };
  let bestRate = committed / best.costMs;
  const curve = [{ drafts: 0, committed, costMs: best.costMs }];
  order.forEach((s, i) => {
    const item = items[s]!;
    const k = walk[s]!;
    if (k === 0) {
      drafting++;
      catchUpRows += item.catchUpRows;
    }
    committed += item.gains[k + 1]! - item.gains[k]!;
    walk[s] = k + 1;
    const c = cost(shape(i + 1));
    const rate = committed / c;
    curve.push({ drafts: i + 1, committed, costMs: c });
    if (rate > bestRate * (1 + 1e-9)) {
      best = { d: i + 1, committed, costMs: c };
      bestRate = rate;
    }
  });
  for (const s of order.slice(0, best.d)) ks[s]!++;
  return { ks, committed: best.committed, costMs: best.costMs, rate: bestRate, curve };
}
