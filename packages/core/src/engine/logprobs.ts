/**
 * Log-probabilities of tokens under the target's raw distribution, for the API's `logprobs` (and `echo`'s prompt
 * logprobs). As vLLM's default (`logprobs_mode = raw_logprobs`, vllm/v1/sample/sampler.py): log_softmax of the
 * target's logits row BEFORE temperature, top-k / top-p and any other logits processing — so a token's logprob
 * does not depend on the request's sampling, and not on speculation: the engine takes it from the row of the
 * forward that decided the token (the prefill's last row for the first token; for a verify block, the row before
 * each committed token, whether an accepted draft, the recovered token or the bonus; spec-step.ts). Verify
 * kernels are bitwise independent of how tokens are grouped into forwards (model-plugin.ts ForwardSequence.phase),
 * so greedy logprobs are bit-identical with and without speculation.
 * Computed only for requests that ask ({@link SpecRequest.logprobs}, {@link SpecRequest.promptLogprobs}).
 */

/** One alternative of a position: a token id and its logprob. */
export interface TopLogprob {
  readonly token: number;
  /** Natural log of its probability; −Infinity for a masked (−Infinity) logit. */
  readonly logprob: number;
}

/** The logprob of one emitted (or prompt) token and the position's most likely alternatives. */
export interface TokenLogprob {
  readonly token: number;
  readonly logprob: number;
  /** The `n` most likely tokens of the position (n asked for), logprob descending, ties by token id ascending. */
  readonly top: readonly TopLogprob[];
  /** Rank of `token` in the position's distribution (1: most likely), as vLLM's `rank`. */
  readonly rank: number;
}

/** The largest number of alternatives a request may ask for (vLLM's default `max_logprobs`, OpenAI's chat bound). */
export const MAX_TOP_LOGPROBS = 20;

/**
 * The logprob of `token` and the `topN` most likely tokens of `row [vocab]` f32 (not modified), from
 * log_softmax(row) computed in f64: logprob(v) = row[v] − (max + log Σ exp(row[u] − max)). −Infinity logits give
 * −Infinity. Deterministic: the same row always gives the same numbers.
 * @throws {RangeError} for a token outside the row or a topN that is not an integer in [0, {@link MAX_TOP_LOGPROBS}].
 */
export function tokenLogprob(row: Float32Array, token: number, topN: number): TokenLogprob {
  const V = row.length;
  if (!(Number.isInteger(token) && token >= 0 && token < V))
    throw new RangeError(`tokenLogprob: token: expected an id in [0, ${V}), got ${token}`);
  if (!(Number.isInteger(topN) && topN >= 0 && topN <= MAX_TOP_LOGPROBS))
    throw new RangeError(`tokenLogprob: topN: expected an integer in [0, ${MAX_TOP_LOGPROBS}], got ${topN}`);
  let max = Number.NEGATIVE_INFINITY;
  for (let v = 0; v < V; v++) if (row[v]! > max) max = row[v]!;
  let sum = 0;
  for (let v = 0; v < V; v++) sum += Math.exp(row[v]! - max);
  const lse = max + Math.log(sum);
  const x = row[token]!;
  // rank: tokens strictly more likely, or as likely with a smaller id, come first
  let rank = 1;
  for (let v = 0; v < V; v++) {
    const y = row[v]!;
    if (y > x || (y === x && v < token)) rank++;
  }
  // the topN best by (logit descending, id ascending): insertion into a short sorted list
  const best: number[] = [];
  for (let v = 0; v < V && topN > 0; v++) {
    const y = row[v]!;
    if (best.length === topN && !(y > row[best[topN - 1]!]!)) continue;
    let at = best.length;
    while (at > 0 && y > row[best[at - 1]!]!) at--;
    best.splice(at, 0, v);
    if (best.length > topN) best.pop();
  }
  return { token, logprob: x - lse, top: best.map((v) => ({ token: v, logprob: row[v]! - lse })), rank };
}
