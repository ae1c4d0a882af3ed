/**
 * Verification: which drafts the target keeps (REFERENCE.md §6).
 *
 * Terms: of `k` drafts, the *accepted* ones are the longest prefix the verifier keeps; the *bonus*
 * is one token from the target after them — the *recovered* token at the first rejection, or a
 * fresh token after the last draft when all are accepted. A step commits `accepted + 1` tokens.
 * - Greedy ({@link acceptGreedy}): accept while draft == argmax(target); bonus = target argmax at
 *   the first mismatch (or after the last draft). Lossless: the output is plain greedy decoding's.
 * - Sampling ({@link acceptSampled}; Leviathan et al. 2023, arXiv 2211.17192, Alg. 1; Chen et al.
 *   2023, arXiv 2302.01318): accept draft x with probability min(1, p(x)/q(x)); at the first
 *   rejection draw the recovered token from norm(max(0, p − q)) and stop; if all are accepted draw
 *   the bonus from p. p and q are probabilities after the same temperature / top-k / top-p
 *   ({@link samplingProbs}). A drafter without q (argmax drafts) is a point mass: accept with p(x).
 *   Lossless: every committed token is distributed as p.
 * - Trees ({@link acceptTreeGreedy}; REFERENCE.md §5): greedy along the target's argmax path.
 */

import { argmax } from '@specd/native';

import type { DraftProposal, RandomSource } from '../plugin/drafter-plugin.js';
import { drawCompact, NonFiniteLogitsError, sampleFromProbs, sampleFromSupport } from './probs.js';

/** Outcome of verifying one sequence's drafts. */
export interface AcceptResult {
  /** Drafts accepted, in [0, k]. */
  readonly accepted: number;
  /** The bonus token (recovered or fresh). Committed tokens = drafts[0, accepted) + bonus. */
  readonly bonus: number;
}

/**
 * Greedy verification.
 * @param drafts `[k]` i32. @param targetLogits `[k + 1, vocab]` f32: the target's logits at the
 *   last verified token and at each draft (verify rows in order).
 */
export function acceptGreedy(drafts: Int32Array, targetLogits: Float32Array, vocab: number): AcceptResult {
  const k = drafts.length;
  if (targetLogits.length !== (k + 1) * vocab)
    throw new RangeError(
      `acceptGreedy: targetLogits: expected [${k + 1}, ${vocab}] f32, got length ${targetLogits.length}`,
    );
  const top = argmax(targetLogits, vocab);
  let n = 0;
  while (n < k && drafts[n] === top[n]) n++;
  return { accepted: n, bonus: top[n]! };
}

/**
 * Greedy verification from the target's argmax of each verify row (a stage that computes it where its logits live,
 * `ForwardResult.argmax`): the same decision as {@link acceptGreedy}.
 * @param drafts `[k]` i32. @param top i32, its entries [start, end) `[k + 1]` (`top` may be longer, e.g. a whole
 *   batch's argmax): the argmax at the last verified token and at each draft, −1 for a row that is not finite.
 * @param what names the rows in messages.
 * @throws {NonFiniteLogitsError} when a row the decision reads (rows 0 … accepted) is not finite; RangeError when
 *   [start, end) is not k + 1 entries of `top`.
 */
export function acceptGreedyArgmax(
  drafts: Int32Array,
  top: Int32Array,
  what: string,
  start = 0,
  end = top.length,
): AcceptResult {
  const k = drafts.length;
  if (end - start !== k + 1 || start < 0 || end > top.length)
    throw new RangeError(`acceptGreedyArgmax: top: expected [${k + 1}] i32, got ${end - start}`);
  let n = 0;
  while (n < k && top[start + n]! >= 0 && drafts[n] === top[start + n]) n++;
  const bonus = top[start + n]!;
  if (bonus < 0) throw new NonFiniteLogitsError(`${what} ${n}: the model's output is not finite`);
  return { accepted: n, bonus };
}

/**
 * Rejection-sampling verification.
 * @param drafts `[k]` i32.
 * @param q `[k, vocab]` f32 draft probabilities — or `[k, qIds.length]` over the token ids `qIds` (a drafter with a
 *   reduced vocabulary; q is 0 for every other token) —, or undefined for argmax drafts (point masses).
 * @param p `[k + 1, vocab]` f32 target probabilities (after the request's temperature / top-k / top-p).
 * @param rng uniform [0, 1) draws (one per examined draft, one for the recovered / bonus token).
 * @param qIds distinct token ids in [0, vocab), `[W]` i32, that q's columns stand for (absent: the whole vocabulary).
 */
export function acceptSampled(
  drafts: Int32Array,
  q: Float32Array | undefined,
  p: Float32Array,
  vocab: number,
  rng: RandomSource,
  qIds?: Int32Array,
): AcceptResult {
  const k = drafts.length;
  if (p.length !== (k + 1) * vocab)
    throw new RangeError(`acceptSampled: p: expected [${k + 1}, ${vocab}] f32, got length ${p.length}`);
  return acceptSampledRows(drafts, q, (j) => p.subarray(j * vocab, (j + 1) * vocab), vocab, rng, qIds);
}

/** Inverse of each reduced vocabulary seen (token id → q column, −1 off the list), by the ids array's identity. */
const inverses = new WeakMap<Int32Array, Int32Array>();

/**
 * Token id → column of q over `ids` (−1: not listed), built once per ids array (a drafter passes the same one with
 * every proposal).
 * @throws {RangeError} when an id is outside [0, vocab) or listed twice.
 */
function inverseOf(ids: Int32Array, vocab: number): Int32Array {
  const known = inverses.get(ids);
  if (known !== undefined && known.length === vocab) return known;
  const inv = new Int32Array(vocab).fill(-1);
  for (let e = 0; e < ids.length; e++) {
    const v = ids[e]!;
    if (!(v >= 0 && v < vocab)) throw new RangeError(`acceptSampled: qIds[${e}]: ${v} is outside [0, ${vocab})`);
    if (inv[v] !== -1) throw new RangeError(`acceptSampled: qIds: token ${v} is listed twice`);
    inv[v] = e;
  }
  inverses.set(ids, inv);
  return inv;
}

/** The residual's row, reused by every rejection (read only by the draw that follows it). */
let residScratch = new Float32Array(0);

/**
 * One row of the target's p for {@link acceptSampledRows}: `[vocab]` f32, or with its support (`support`: the ids of
 * its positive entries ascending, {@link samplingProbs}'s `support`), which lets the decision read only those.
 */
export type TargetProbsRow = Float32Array | { readonly probs: Float32Array; readonly support: Int32Array };

/**
 * {@link acceptSampled} with the target's probabilities computed as they are reached: `pRow(j)` → row j `[vocab]`
 * f32 (or that row with its support, {@link TargetProbsRow}), called at most once per row, in order, for the rows the
 * decision reads (the drafts examined, then the row drawn from) — on average τ of the k + 1 rows. The same draws and
 * the same result as the eager form, and with a reduced q (`qIds`) the same as with that q written out over the
 * whole vocabulary (zeros off the list). With a row's support, the recovered token's residual max(0, p − q) is made
 * over that support only (p is 0 elsewhere, so is the residual for a finite q ≥ 0): the same f32 values, summed and
 * drawn from in the same order, in time linear in the support instead of the vocabulary.
 * @throws {RangeError} for a mis-sized q or bad qIds; {@link NonFiniteLogitsError} (sampleFromProbs) when a row drawn
 *   from has no positive finite mass.
 */
export function acceptSampledRows(
  drafts: Int32Array,
  q: Float32Array | undefined,
  pRow: (j: number) => TargetProbsRow,
  vocab: number,
  rng: RandomSource,
  qIds?: Int32Array,
): AcceptResult {
  const k = drafts.length;
  const W = qIds === undefined ? vocab : qIds.length;
  if (q !== undefined && q.length !== k * W)
    throw new RangeError(`acceptSampled: q: expected [${k}, ${W}] f32, got length ${q.length}`);
  const inv = q !== undefined && qIds !== undefined ? inverseOf(qIds, vocab) : undefined;
  for (let i = 0; i < k; i++) {
    const x = drafts[i]!;
    const row = pRow(i);
    const pi = row instanceof Float32Array ? row : row.probs;
    const px = pi[x]!;
    const col = inv === undefined ? x : inv[x]!;
    const qx = q === undefined ? 1 : col < 0 ? 0 : q[i * W + col]!;
    if (rng.next() * qx < px) continue;
    // the recovered token: norm(max(0, p − q)), q written out over the vocabulary (0 off a reduced list)
    if (!(row instanceof Float32Array)) return { accepted: i, bonus: recoveredOnSupport(row, i, x, q, W, inv, rng) };
    if (residScratch.length < vocab) residScratch = new Float32Array(vocab);
    const resid = residScratch.subarray(0, vocab);
    if (q === undefined) {
      resid.set(pi);
      resid[x] = Math.max(0, pi[x]! - 1);
    } else if (qIds === undefined) {
      for (let v = 0; v < vocab; v++) resid[v] = Math.max(0, pi[v]! - q[i * vocab + v]!);
    } else {
      resid.set(pi);
      for (let e = 0; e < W; e++) {
        const v = qIds[e]!;
        resid[v] = Math.max(0, pi[v]! - q[i * W + e]!);
      }
    }
    let sum = 0;
    for (let v = 0; v < vocab; v++) sum += resid[v]!;
    return { accepted: i, bonus: sampleFromProbs(sum > 0 ? resid : pi, rng) };
  }
  const last = pRow(k);
  return {
    accepted: k,
    bonus: last instanceof Float32Array ? sampleFromProbs(last, rng) : sampleFromSupport(last.probs, last.support, rng),
  };
}

/**
 * The recovered token of {@link acceptSampledRows} at draft i (token x) from a row with its support: the residual's
 * f32 values max(0, p − q) at the support's ids (q of the draft: `[k, W]` over `inv`'s columns, or a point mass at
 * x when undefined), then the dense form's draw — from the residual when its total is positive, else from p.
 */
function recoveredOnSupport(
  row: { readonly probs: Float32Array; readonly support: Int32Array },
  i: number,
  x: number,
  q: Float32Array | undefined,
  W: number,
  inv: Int32Array | undefined,
  rng: RandomSource,
): number {
  const { probs: pi, support } = row;
  const n = support.length;
  if (residScratch.length < n) residScratch = new Float32Array(Math.max(n, 2 * residScratch.length));
  const resid = residScratch;
  let sum = 0;
  for (let e = 0; e < n; e++) {
    const v = support[e]!;
    const col = inv === undefined ? v : inv[v]!;
    const qv = q === undefined ? (v === x ? 1 : 0) : col < 0 ? 0 : q[i * W + col]!;
    resid[e] = Math.max(0, pi[v]! - qv);
    sum += resid[e]!;
  }
  return sum > 0 ? drawCompact(resid, support, n, rng) : sampleFromSupport(pi, support, rng);
}

/** A proposal with `parents`. */
export type TreeProposal = DraftProposal & { readonly parents: Int32Array };

/** True for a proposal whose drafts form a tree (some parent is not the previous draft). */
export function isTree(p: DraftProposal): p is TreeProposal {
  return p.parents?.some((v, j) => v !== j - 1) ?? false;
}

/**
 * Greedy acceptance of a token tree (REFERENCE.md §5, EAGLE tree verification at temperature 0):
 * from the root row, follow the child whose token is the target's argmax at the current row; stop
 * where no child matches — the argmax there is the bonus.
 * @param tokens block `[n]` (row 0 = the last verified token); @param tree parent row of each row
 *   (`[n]`, row 0: −1); @param logits `[n, V]` f32, the verify forward's rows.
 * @returns the kept rows (a root path, `rows[0] = 0`) and the accept result (accepted = rows − 1).
 */
export function acceptTreeGreedy(
  tokens: Int32Array,
  tree: Int32Array,
  logits: Float32Array,
  V: number,
): { rows: number[]; acc: AcceptResult } {
  const rows = [0];
  for (;;) {
    const cur = rows[rows.length - 1]!;
    const t = argmax(logits.subarray(cur * V, (cur + 1) * V), V)[0]!;
    let next = -1;
    for (let c = cur + 1; c < tokens.length; c++) {
      if (tree[c] === cur && tokens[c] === t) {
        next = c;
        break;
      }
    }
    if (next < 0) return { rows, acc: { accepted: rows.length - 1, bonus: t } };
    rows.push(next);
  }
}
