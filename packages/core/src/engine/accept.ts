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
 */

import { argmax } from '@specd/native';

import type { RandomSource } from '../plugin/drafter-plugin.js';
import { sampleFromProbs } from './probs.js';

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
 * Rejection-sampling verification.
 * @param drafts `[k]` i32.
 * @param q `[k, vocab]` f32 draft probabilities, or undefined for argmax drafts (point masses).
 * @param p `[k + 1, vocab]` f32 target probabilities (after the request's temperature / top-k / top-p).
 * @param rng uniform [0, 1) draws (one per examined draft, one for the recovered / bonus token).
 */
export function acceptSampled(
  drafts: Int32Array,
  q: Float32Array | undefined,
  p: Float32Array,
  vocab: number,
  rng: RandomSource,
): AcceptResult {
  const k = drafts.length;
  if (p.length !== (k + 1) * vocab)
    throw new RangeError(`acceptSampled: p: expected [${k + 1}, ${vocab}] f32, got length ${p.length}`);
  if (q !== undefined && q.length !== k * vocab)
    throw new RangeError(`acceptSampled: q: expected [${k}, ${vocab}] f32, got length ${q.length}`);
  for (let i = 0; i < k; i++) {
    const x = drafts[i]!;
    const px = p[i * vocab + x]!;
    const qx = q === undefined ? 1 : q[i * vocab + x]!;
    if (rng.next() * qx < px) continue;
    const resid = new Float32Array(vocab);
    let sum = 0;
    for (let v = 0; v < vocab; v++) {
      const r = Math.max(0, p[i * vocab + v]! - (q === undefined ? (v === x ? 1 : 0) : q[i * vocab + v]!));
      resid[v] = r;
      sum += r;
    }
    const row = sum > 0 ? resid : p.subarray(i * vocab, (i + 1) * vocab);
    return { accepted: i, bonus: sampleFromProbs(row, rng) };
  }
  return { accepted: k, bonus: sampleFromProbs(p.subarray(k * vocab, (k + 1) * vocab), rng) };
}
