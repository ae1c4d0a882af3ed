/**
 * Probabilities after temperature / top-k / top-p (in that order, as vLLM and plain generation),
 * the one transform applied to the target's p and the drafter's q before rejection sampling
 * (REFERENCE.md §6), and sampling from a probability row with a seeded PRNG.
 * Token selection for one logits row (the first token after a prefill, plain decoding): greedy
 * (argmax) and sampling are separate functions; temperature 0 means greedy ({@link nextToken}).
 * Drawn with a seeded PRNG (random.ts) so runs are reproducible.
 */

import { argmax, samplingProbs as nativeSamplingProbs } from '@specd/native';

import type { DraftSampling, RandomSource } from '../plugin/drafter-plugin.js';

/**
 * Thrown when a row of logits (or the probabilities made from it) holds a NaN or +Infinity or no finite value:
 * the model's output for that sequence is broken (e.g. a NaN weight row). The engine fails only the sequence whose
 * row it is (engine.ts).
 */
export class NonFiniteLogitsError extends RangeError {
  override readonly name = 'NonFiniteLogitsError';
}

/**
 * `logits [rows, vocab]` f32 (not modified) → probabilities `[rows, vocab]` f32 after temperature,
 * top-k and top-p; masked entries are exactly 0.
 * @param out optional `[rows, vocab]` f32 to write into (e.g. a proposal's q rows), else a new array.
 * @throws {RangeError} if temperature ≤ 0 (greedy has no distribution) or not finite, topK < 0 or topP outside
 *   (0, 1]; SpecdArgumentError for a mis-sized `out`.
 */
export function samplingProbs(
  logits: Float32Array,
  vocab: number,
  params: DraftSampling,
  out?: Float32Array,
): Float32Array {
  const { temperature, topK, topP } = params;
  if (!(temperature > 0 && temperature < Number.POSITIVE_INFINITY))
    throw new RangeError(`samplingProbs: temperature: expected a finite number > 0 (0 is greedy), got ${temperature}`);
  if (topK !== undefined && !(Number.isSafeInteger(topK) && topK >= 0))
    throw new RangeError(`samplingProbs: topK: expected an integer >= 0, got ${topK}`);
  if (topP !== undefined && !(topP > 0 && topP <= 1))
    throw new RangeError(`samplingProbs: topP: expected a number in (0, 1], got ${topP}`);
  // one native call: x / T, topKMask, topPMask, softmax with the bits of those steps made one by one
  return nativeSamplingProbs(logits, vocab, temperature, topK !== undefined && topK < vocab ? topK : 0, topP ?? 1, out);
}

/**
 * Draws an index from `probs [vocab]` f32 (non-negative, summing to ~1 — or any positive total:
 * the draw is scaled by the row's sum) with one `rng.next()`.
 * @throws {NonFiniteLogitsError} when the row's total is not a positive finite number (a NaN or an
 *   Infinity in the row, or no mass: the logits it came from were not finite).
 */
export function sampleFromProbs(probs: Float32Array, rng: RandomSource): number {
  let total = 0;
  for (let i = 0; i < probs.length; i++) total += probs[i]!;
  if (!(total > 0 && total < Number.POSITIVE_INFINITY))
    throw new NonFiniteLogitsError(`sampleFromProbs: probs: expected a positive finite total, got ${total}`);
  const u = rng.next() * total;
  let acc = 0;
  let last = -1;
  for (let i = 0; i < probs.length; i++) {
    const p = probs[i]!;
    if (p <= 0) continue;
    acc += p;
    last = i;
    if (u < acc) return i;
  }
  return last;
}

/**
 * Checks one logits row `[vocab]` f32 before a token is chosen from it: every entry finite or −Infinity, and
 * at least one finite. `what` names the row in the message (e.g. `verify row 2`).
 * @throws {NonFiniteLogitsError} naming the first bad token id and its value.
 */
export function checkLogitsRow(row: Float32Array, what: string): void {
  // fast path: v · 0 is ±0 for every finite v and NaN for NaN and ±Infinity, so a zero sum means every entry is
  // finite (the common row: one pass of multiply-adds, twice as fast as the comparisons below)
  let zero = 0;
  for (let i = 0; i < row.length; i++) zero += row[i]! * 0;
  if (zero === 0 && row.length > 0) return;
  let finite = false;
  for (let i = 0; i < row.length; i++) {
    const v = row[i]!;
    // NaN fails both comparisons; +Infinity fails the first
    if (!(v < Number.POSITIVE_INFINITY))
      throw new NonFiniteLogitsError(`${what}: the logit of token ${i} is ${v} (the model's output is not finite)`);
    if (v > Number.NEGATIVE_INFINITY) finite = true;
  }
  if (!finite) throw new NonFiniteLogitsError(`${what}: no finite logit (every entry is -Infinity)`);
}

/** Greedy: the first most likely token of `logits [vocab]` f32. */
export function greedyToken(logits: Float32Array): number {
  return argmax(logits, logits.length)[0]!;
}

/**
 * Samples one token from `logits [vocab]` f32 (not modified): {@link samplingProbs}, then
 * {@link sampleFromProbs} (one `rng.next()`).
 * @throws {RangeError} if temperature ≤ 0 (use {@link greedyToken}), topK < 0 or topP outside (0, 1].
 */
export function sampleToken(logits: Float32Array, params: DraftSampling, rng: RandomSource): number {
  return sampleFromProbs(samplingProbs(logits, logits.length, params), rng);
}

/** Picks the next token of `logits [vocab]` f32: greedy when temperature is 0, else sampled. */
export function nextToken(logits: Float32Array, params: DraftSampling, rng: RandomSource): number {
  return params.temperature === 0 ? greedyToken(logits) : sampleToken(logits, params, rng);
}
