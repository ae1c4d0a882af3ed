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
 * Where {@link samplingProbs} lists each row's support: `ids` `[rows, vocab]` i32 (row r's positive entries' token
 * ids, ascending, in `ids[r * vocab, r * vocab + counts[r])`), `counts` `[rows]` i32 (−1 for a row holding a NaN,
 * whose probabilities are NaN).
 */
export interface ProbsSupport {
  readonly ids: Int32Array;
  readonly counts: Int32Array;
}

/**
 * `logits [rows, vocab]` f32 (not modified) → probabilities `[rows, vocab]` f32 after temperature,
 * top-k and top-p; masked entries are exactly 0. A row holding a NaN comes out NaN.
 * @param out optional `[rows, vocab]` f32 to write into (e.g. a proposal's q rows), else a new array.
 * @param support optional {@link ProbsSupport} to fill: with it, {@link sampleFromSupport} and rejection sampling
 *   read a row's few kept tokens instead of the whole vocabulary.
 * @throws {RangeError} if temperature ≤ 0 (greedy has no distribution) or not finite, topK < 0 or topP outside
 *   (0, 1]; SpecdArgumentError for a mis-sized `out` or `support`; Error (ERR_SPECD_KERNEL) for a row without a
 *   finite value.
 */
export function samplingProbs(
  logits: Float32Array,
  vocab: number,
  params: DraftSampling,
  out?: Float32Array,
  support?: ProbsSupport,
): Float32Array {
  const { temperature, topK, topP } = params;
  if (!(temperature > 0 && temperature < Number.POSITIVE_INFINITY))
    throw new RangeError(`samplingProbs: temperature: expected a finite number > 0 (0 is greedy), got ${temperature}`);
  if (topK !== undefined && !(Number.isSafeInteger(topK) && topK >= 0))
    throw new RangeError(`samplingProbs: topK: expected an integer >= 0, got ${topK}`);
  if (topP !== undefined && !(topP > 0 && topP <= 1))
    throw new RangeError(`samplingProbs: topP: expected a number in (0, 1], got ${topP}`);
  // one native call: x / T, topKMask, topPMask, softmax with the bits of those steps made one by one
  const k = topK !== undefined && topK < vocab ? topK : 0;
  return nativeSamplingProbs(logits, vocab, temperature, k, topP ?? 1, out, support);
}

/**
 * Draws an index from `probs [vocab]` f32 (non-negative, summing to ~1 — or any positive total:
 * the draw is scaled by the row's sum) with one `rng.next()`.
 * @throws {NonFiniteLogitsError} when the row's total is not a positive finite number (a NaN or an
 *   Infinity in the row, or no mass: the logits it came from were not finite).
 */
export function sampleFromProbs(probs: Float32Array, rng: RandomSource): number {
  return drawCompact(probs, undefined, probs.length, rng);
}

/** The values of a support, gathered for {@link drawCompact} (reused call after call). */
let gathered = new Float32Array(0);

/**
 * Row r's support in a filled {@link ProbsSupport} (rows of `vocab`): its ids `[counts[r]]` i32, or undefined for a
 * NaN row (count −1).
 */
export function supportOf(support: ProbsSupport, r: number, vocab: number): Int32Array | undefined {
  const n = support.counts[r]!;
  return n < 0 ? undefined : support.ids.subarray(r * vocab, r * vocab + n);
}

/**
 * {@link sampleFromProbs} over a row's support: `probs [vocab]` f32 read only at `support` (token ids ascending,
 * listing every positive entry of the row: {@link supportOf}). The same draw, the same `rng.next()` and the same
 * throws as over the whole row (its other entries are 0, which neither the total nor the running sum sees), in time
 * linear in the support. Undefined `support` (a NaN row): the whole row, {@link sampleFromProbs}.
 * @throws {NonFiniteLogitsError} as {@link sampleFromProbs}.
 */
export function sampleFromSupport(probs: Float32Array, support: Int32Array | undefined, rng: RandomSource): number {
  if (support === undefined) return sampleFromProbs(probs, rng);
  const n = support.length;
  if (gathered.length < n) gathered = new Float32Array(Math.max(n, 2 * gathered.length));
  for (let e = 0; e < n; e++) gathered[e] = probs[support[e]!]!;
  return drawCompact(gathered, support, n, rng);
}

/**
 * The draw of {@link sampleFromProbs} from `values[0, n)` f32, non-negative, standing for the token ids `ids[0, n)`
 * ascending (undefined: ids 0 … n − 1): the total and the running sum in double, in order, over the positive values;
 * returns the id of the first value whose running sum passes u = rng.next() · total (the last positive one should
 * rounding leave u past them all).
 * @throws {NonFiniteLogitsError} when the total is not a positive finite number.
 */
export function drawCompact(values: Float32Array, ids: Int32Array | undefined, n: number, rng: RandomSource): number {
  let total = 0;
  for (let e = 0; e < n; e++) total += values[e]!;
  if (!(total > 0 && total < Number.POSITIVE_INFINITY))
    throw new NonFiniteLogitsError(`sampleFromProbs: probs: expected a positive finite total, got ${total}`);
  const u = rng.next() * total;
  let acc = 0;
  let last = -1;
  for (let e = 0; e < n; e++) {
    const p = values[e]!;
    if (p <= 0) continue;
    acc += p;
    last = e;
    if (u < acc) break;
  }
  return ids === undefined || last < 0 ? last : ids[last]!;
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
  const V = logits.length;
  if (tokenSupport.length < V) tokenSupport = new Int32Array(V);
  const support = { ids: tokenSupport.subarray(0, V), counts: tokenCount };
  return sampleFromSupport(samplingProbs(logits, V, params, undefined, support), supportOf(support, 0, V), rng);
}

/** {@link sampleToken}'s support (reused call after call). */
let tokenSupport = new Int32Array(0);
const tokenCount = new Int32Array(1);

/** Picks the next token of `logits [vocab]` f32: greedy when temperature is 0, else sampled. */
export function nextToken(logits: Float32Array, params: DraftSampling, rng: RandomSource): number {
  return params.temperature === 0 ? greedyToken(logits) : sampleToken(logits, params, rng);
}
