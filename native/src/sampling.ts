/**
 * Row-wise helpers for sampling and verification over logits `[rows, vocab]` f32: softmax with
 * temperature, argmax (greedy), and top-k / top-p filters (applied, like temperature, to both the
 * target p and the draft q before rejection sampling, REFERENCE.md §6).
 */
import { addon } from './addon.js';
import { expectArray, expectInt, expectNumber, outArray, rowsOf } from './validate.js';

function rows(call: string, param: string, x: Float32Array, vocab: number): number {
  expectInt(call, 'vocab', vocab, 1);
  return rowsOf(call, param, expectArray(call, param, x, Float32Array), vocab, 'vocab');
}

/**
 * `softmax(x / temperature)` per row (max-subtracted; exp f32, sum double).
 * @param x Float32Array [rows, vocab]; @param vocab row length; @param temperature > 0 (default 1).
 * @param out optional Float32Array [rows, vocab]; may be `x`.
 * @returns probabilities, Float32Array [rows, vocab].
 * @throws SpecdArgumentError on bad arguments; Error (code ERR_SPECD_KERNEL) when a row has no
 *   finite value (all -Infinity/NaN).
 */
export function softmax(x: Float32Array, vocab: number, temperature = 1, out?: Float32Array): Float32Array {
  const n = rows('softmax', 'x', x, vocab);
  const t = expectNumber('softmax', 'temperature', temperature, (v) => v > 0, 'a number > 0');
  const y = outArray('softmax', out, Float32Array, x.length, 'x.length');
  addon.softmax(x, n, vocab, t, y);
  return y;
}

/**
 * Index of the largest value per row (first one on ties; NaN never wins; all-NaN row gives 0).
 * @param x Float32Array [rows, vocab]; @param vocab row length (<= 2^31-1).
 * @returns Int32Array [rows] of token ids.
 * @throws SpecdArgumentError on bad arguments.
 */
export function argmax(x: Float32Array, vocab: number): Int32Array {
  const n = rows('argmax', 'x', x, vocab);
  const out = new Int32Array(n);
  addon.argmax(x, n, vocab, out);
  return out;
}

/**
 * {@link argmax} and, per row, softmax(x)'s largest probability `1 / Σ exp(x − max)` (the value {@link softmax}
 * gives the argmax, without writing the row): a drafter's confidence in its greedy draft, in one native call.
 * @param x Float32Array [rows, vocab]; @param vocab row length (<= 2^31-1).
 * @param prob optional Float32Array [rows] to write the probabilities into (NaN for a row without a finite value).
 * @returns `ids` Int32Array [rows] (argmax's) and `prob` Float32Array [rows].
 * @throws SpecdArgumentError on bad arguments.
 */
export function argmaxProb(
  x: Float32Array,
  vocab: number,
  prob?: Float32Array,
): { readonly ids: Int32Array; readonly prob: Float32Array } {
  const n = rows('argmaxProb', 'x', x, vocab);
  const ids = new Int32Array(n);
  const p = outArray('argmaxProb', prob, Float32Array, n, 'rows');
  addon.argmax(x, n, vocab, ids, false, p);
  return { ids, prob: p };
}

/**
 * {@link argmax} of rows that a token may be chosen from: −1 for a row that holds a NaN or +Infinity or has no
 * finite value (−Infinity entries, masked tokens, are allowed) — core's checkLogitsRow rule, in the same native call.
 * @param x Float32Array [rows, vocab]; @param vocab row length (<= 2^31-1).
 * @returns Int32Array [rows]: token ids, −1 where the row is not decidable.
 * @throws SpecdArgumentError on bad arguments.
 */
export function argmaxChecked(x: Float32Array, vocab: number): Int32Array {
  const n = rows('argmaxChecked', 'x', x, vocab);
  const out = new Int32Array(n);
  addon.argmax(x, n, vocab, out, true);
  return out;
}

/**
 * Top-k filter: keeps logits >= the k-th largest of the row (all ties at the boundary survive),
 * sets the rest to -Infinity.
 * @param logits Float32Array [rows, vocab]; @param vocab row length; @param k in [1, vocab].
 * @param out optional Float32Array [rows, vocab]; may be `logits`.
 * @returns filtered logits, Float32Array [rows, vocab].
 * @throws SpecdArgumentError on bad arguments.
 */
export function topKMask(logits: Float32Array, vocab: number, k: number, out?: Float32Array): Float32Array {
  const n = rows('topKMask', 'logits', logits, vocab);
  expectInt('topKMask', 'k', k, 1, vocab);
  const y = outArray('topKMask', out, Float32Array, logits.length, 'logits.length');
  addon.topKMask(logits, n, vocab, k, y);
  return y;
}

/**
 * Top-p (nucleus, Holtzman et al. 2019) filter on `softmax(logits)`: keeps the smallest set of
 * tokens, taken by (probability desc, index asc), whose mass reaches p (at least one token), sets
 * the rest to -Infinity. Apply the temperature to the logits first.
 * @param logits Float32Array [rows, vocab]; @param vocab row length; @param p in (0, 1] (1 keeps all).
 * @param out optional Float32Array [rows, vocab]; may be `logits`.
 * @returns filtered logits, Float32Array [rows, vocab].
 * @throws SpecdArgumentError on bad arguments; Error (code ERR_SPECD_KERNEL) when a row has no
 *   finite value.
 */
export function topPMask(logits: Float32Array, vocab: number, p: number, out?: Float32Array): Float32Array {
  const n = rows('topPMask', 'logits', logits, vocab);
  const pp = expectNumber('topPMask', 'p', p, (v) => v > 0 && v <= 1, 'a number in (0, 1]');
  const y = outArray('topPMask', out, Float32Array, logits.length, 'logits.length');
  addon.topPMask(logits, n, vocab, pp, y);
  return y;
}

/**
 * The sampling distribution of each row in one native call: `softmax(topPMask(topKMask(logits / temperature)))`
 * with the bits of those calls made one after the other (the division by the temperature in double rounded to
 * f32, as `logits[i] / temperature` written into a Float32Array), without the intermediate arrays.
 * @param logits Float32Array [rows, vocab] (not modified unless `out` is it); @param vocab row length.
 * @param temperature > 0; @param topK 0 (off) … vocab (vocab keeps all); @param topP in (0, 1] (1 keeps all).
 * A row holding a NaN beside finite values comes out all NaN.
 * @param out optional Float32Array [rows, vocab]; may be `logits`.
 * @param support optional: where each row's support goes, `ids` Int32Array [rows, vocab] (row r's positive
 *   entries' token ids, ascending, in `ids[r * vocab, r * vocab + counts[r])`) and `counts` Int32Array [rows] (−1 for
 *   a row holding a NaN). Below top-p 1 the kernel finds the support anyway (it makes only the kept tokens'
 *   probabilities), so it costs nothing there; at top-p 1, one more pass.
 * @returns probabilities, Float32Array [rows, vocab] (0 for the filtered tokens).
 * @throws SpecdArgumentError on bad arguments; Error (code ERR_SPECD_KERNEL) when a row has no
 *   finite value (+Infinity, or only −Infinity and NaN).
 */
export function samplingProbs(
  logits: Float32Array,
  vocab: number,
  temperature: number,
  topK: number,
  topP: number,
  out?: Float32Array,
  support?: { readonly ids: Int32Array; readonly counts: Int32Array },
): Float32Array {
  const n = rows('samplingProbs', 'logits', logits, vocab);
  const t = expectNumber('samplingProbs', 'temperature', temperature, (v) => v > 0, 'a number > 0');
  const k = expectInt('samplingProbs', 'topK', topK, 0, vocab);
  const pp = expectNumber('samplingProbs', 'topP', topP, (v) => v > 0 && v <= 1, 'a number in (0, 1]');
  const y = outArray('samplingProbs', out, Float32Array, logits.length, 'logits.length');
  if (support === undefined) {
    addon.samplingProbs(logits, n, vocab, t, k, pp, y);
    return y;
  }
  const ids = expectArray('samplingProbs', 'support.ids', support.ids, Int32Array, logits.length, 'logits.length');
  const counts = expectArray('samplingProbs', 'support.counts', support.counts, Int32Array, n, 'rows');
  addon.samplingProbs(logits, n, vocab, t, k, pp, y, ids, counts);
  return y;
}
