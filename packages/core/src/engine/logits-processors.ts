/**
 * The request's logits processors: what a request's settings do to the TARGET's logits before a token is chosen
 * from them or a draft is judged against them, as vLLM's sampler (vllm/v1/sample/sampler.py
 * `apply_logits_processors`, vllm/v1/sample/logits_processor/builtin.py, vllm/model_executor/layers/utils.py
 * `apply_penalties`), in its order:
 * 1. `logitBias` (OpenAI `logit_bias`): `bias` added to the logit of its token id;
 * 2. `minTokens` (vLLM `min_tokens`): while fewer than `minTokens` tokens are generated, the stop ids (the EOS ids
 *    unless `ignoreEos`, and `stopTokenIds`) get −Infinity;
 * 3. `repetitionPenalty` r over the prompt and the generated tokens: a logit > 0 becomes logit / r, any other
 *    logit · r;
 * 4. `frequencyPenalty` f and `presencePenalty` e over the generated tokens: logit − f · count, then − e once for a
 *    token generated at least once.
 * Then temperature, top-k and top-p (probs.ts). The f32 arithmetic is vLLM's: each step rounds to f32.
 *
 * Speculation stays lossless: verify row j of a block (the target's logits after draft j − 1) counts the drafts
 * before j as generated — the tokens plain decoding would have generated before that row had those drafts been
 * accepted — so every row is the row plain decoding would process, and greedy and rejection-sampled outputs keep
 * the target's (processed) distribution. A tree's row counts the drafts on its root path.
 *
 * A request with every setting neutral (no bias, penalties 0 / 0 / 1, `minTokens` 0) has no processor: its rows
 * are never copied or scanned.
 */

import type { SamplingParams, SpecRequest } from './types.js';

/** True when `s` changes the logits at all (see the module header); false: skip the work. */
export function hasLogitsProcessing(s: SamplingParams): boolean {
  return (
    (s.presencePenalty ?? 0) !== 0 ||
    (s.frequencyPenalty ?? 0) !== 0 ||
    (s.repetitionPenalty ?? 1) !== 1 ||
    (s.logitBias?.size ?? 0) > 0 ||
    (s.minTokens ?? 0) > 0
  );
}

/**
 * The first setting of `s` outside its range, as `{field, message}`, or undefined. Ranges (vLLM's
 * `SamplingParams._verify_args`, OpenAI's logit_bias): presencePenalty and frequencyPenalty in [−2, 2];
 * repetitionPenalty finite > 0; minTokens an integer ≥ 0; logitBias keys integers in [0, vocab), values in
 * [−100, 100].
 */
export function logitsProcessingProblem(
  s: SamplingParams,
  vocab: number,
): { field: string; message: string } | undefined {
  for (const field of ['presencePenalty', 'frequencyPenalty'] as const) {
    const v = s[field];
    if (v !== undefined && !(v >= -2 && v <= 2))
      return { field, message: `expected a number in [-2, 2] (0: off), got ${v}` };
  }
  const rep = s.repetitionPenalty;
  if (rep !== undefined && !(rep > 0 && Number.isFinite(rep)))
    return { field: 'repetitionPenalty', message: `expected a finite number > 0 (1: off), got ${rep}` };
  const min = s.minTokens;
  if (min !== undefined && !(Number.isSafeInteger(min) && min >= 0))
    return { field: 'minTokens', message: `expected an integer >= 0, got ${min}` };
  for (const [id, bias] of s.logitBias ?? []) {
    if (!(Number.isSafeInteger(id) && id >= 0 && id < vocab))
      return { field: 'logitBias', message: `token id ${id} is outside the vocabulary (size ${vocab})` };
    if (!(bias >= -100 && bias <= 100))
      return { field: 'logitBias', message: `the bias of token ${id}: expected a number in [-100, 100], got ${bias}` };
  }
  return undefined;
}

/**
 * One request's logits processors and the counts they read: the prompt's token ids and the generated tokens'
 * counts, updated with each committed token ({@link push}).
 */
export class LogitsProcessor {
  private readonly presence: number;
  private readonly frequency: number;
  private readonly repetition: number;
  private readonly minTokens: number;
  private readonly bias: readonly (readonly [number, number])[];
  /** EOS (unless ignoreEos) and stop token ids: masked below minTokens. */
  private readonly stopIds: readonly number[];
  /** Distinct prompt token ids (repetition penalty). */
  private readonly prompt: ReadonlySet<number>;
  /** Generated token id → count. */
  private readonly counts = new Map<number, number>();
  private generated = 0;

  private constructor(req: SpecRequest) {
    const s = req.sampling;
    // f32, as vLLM's penalty tensors
    this.presence = Math.fround(s.presencePenalty ?? 0);
    this.frequency = Math.fround(s.frequencyPenalty ?? 0);
    this.repetition = Math.fround(s.repetitionPenalty ?? 1);
    this.minTokens = s.minTokens ?? 0;
    this.bias = [...(s.logitBias ?? [])];
    this.stopIds = [...(req.ignoreEos === true ? [] : (req.eosTokenIds ?? [])), ...(req.stopTokenIds ?? [])];
    this.prompt = this.repetition === 1 ? new Set() : new Set(req.promptIds);
  }

  /** The processor of `req`, or undefined when its settings are all neutral ({@link hasLogitsProcessing}). */
  static of(req: SpecRequest): LogitsProcessor | undefined {
    return hasLogitsProcessing(req.sampling) ? new LogitsProcessor(req) : undefined;
  }

  /** Counts a committed (generated) token. */
  push(token: number): void {
    this.generated++;
    this.counts.set(token, (this.counts.get(token) ?? 0) + 1);
  }

  /**
   * Processes one logits row `[V]` f32 in place: the row after the committed tokens followed by `drafts` (the
   * drafts before this verify row, counted as generated; empty for the next token of plain decoding).
   */
  apply(row: Float32Array, drafts: ArrayLike<number> = []): void {
    for (const [id, b] of this.bias) row[id] = row[id]! + b;
    if (this.generated + drafts.length < this.minTokens) for (const id of this.stopIds) row[id] = -Infinity;
    let counts: ReadonlyMap<number, number> = this.counts;
    if (drafts.length > 0) {
      const withDrafts = new Map(this.counts);
      for (let j = 0; j < drafts.length; j++) withDrafts.set(drafts[j]!, (withDrafts.get(drafts[j]!) ?? 0) + 1);
      counts = withDrafts;
    }
    const rep = this.repetition;
    if (rep !== 1) {
      const penalise = (id: number): void => {
        const x = row[id]!;
        row[id] = x > 0 ? x / rep : x * rep;
      };
      for (const id of this.prompt) penalise(id);
      for (const id of counts.keys()) if (!this.prompt.has(id)) penalise(id);
    }
    const f = this.frequency;
    const e = this.presence;
    if (f !== 0 || e !== 0) {
      for (const [id, n] of counts) {
        // vLLM: logits -= f * counts; logits -= e * mask (each in f32)
        if (f !== 0) row[id] = row[id]! - Math.fround(f * n);
        if (e !== 0) row[id] = row[id]! - e;
      }
    }
  }

  /**
   * The processed copy of a verify block's logits `[n, V]` f32 (not modified): row x processed after the drafts
   * before it — `tokens[1 … x]` for a chain, the tokens of its root path for a `tree` (`[n]`, parent row of each
   * row, row 0: −1). `tokens [n]` i32: the block, row 0 the last verified token.
   */
  block(logits: Float32Array, V: number, tokens: Int32Array, tree?: Int32Array): Float32Array {
    const out = Float32Array.from(logits);
    const n = logits.length / V;
    for (let x = 0; x < n; x++) {
      let drafts: ArrayLike<number>;
      if (tree === undefined) drafts = tokens.subarray(1, x + 1);
      else {
        const path: number[] = [];
        for (let c = x; c > 0; c = tree[c]!) path.push(tokens[c]!);
        drafts = path.reverse();
      }
      this.apply(out.subarray(x * V, (x + 1) * V), drafts);
    }
    return out;
  }
}
