/**
 * The opening of a stage model's forward, the same for every model plugin: check the batch, lay its
 * sequences out as rows of one `[numTokens, hiddenSize]` batch, check the taps, take the residual
 * stream in (the token embeddings on the first stage, the previous stage's hidden otherwise),
 * extend the cache by the new tokens (all sequences or none) and capture tap `layerStart`.
 * The model keeps its own error class and span record (`ForwardPrologueSpec`).
 */
import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { SequenceCache } from '../kv/sequence-cache.js';
import type { ForwardBatch, ForwardOptions, ForwardSequence, StageInfo } from '../plugin/model-plugin.js';

/** What every span record holds: the sequence, its new tokens and the position of the first. */
export interface ForwardSpanBase {
  readonly id: SequenceId;
  readonly position: number;
  readonly numNew: number;
}

/** What the prologue needs of the model. */
export interface ForwardPrologueSpec<S extends ForwardSpanBase> {
  /** The stage: layer range, whether it embeds, hiddenSize, vocabSize. */
  readonly info: StageInfo;
  /** The model's error for a malformed call, from a message (`forward: <argument>: …`). */
  readonly error: (message: string) => Error;
  /**
   * The model's record of sequence `i` (`batch.sequences[i]`), whose rows are [row, row + numNew);
   * called in batch order once that sequence passed the checks (it may throw `error(…)` itself).
   */
  readonly span: (sequence: ForwardSequence, i: number, row: number) => S;
  /**
   * Writes the embedding of token `id` (in [0, vocabSize)) into `out`, `[hiddenSize]` f32. Absent: the stage
   * embeds elsewhere (a GPU stage, on its device) — a first stage then builds no residual stream here (`hidden`
   * is empty and `capture` keeps nothing; the token ids are still checked).
   */
  readonly embedRow?: (id: number, out: Float32Array) => void;
  /**
   * A first stage given `batch.hidden`: `'use'` it (as a later stage would) or `'ignore'` it and
   * embed the tokens.
   */
  readonly hiddenOnFirstStage: 'use' | 'ignore';
}

/** The forward's state after the prologue. */
export interface ForwardPrologue<S> {
  /** One record per sequence, in batch order. */
  readonly spans: S[];
  /** Rows of the batch: Σ numNew. */
  readonly numTokens: number;
  /** The taps asked for (checked to lie in [layerStart, layerEnd]). */
  readonly taps: readonly number[];
  /**
   * Residual stream `[numTokens, hiddenSize]` f32, owned by the forward (updated in place by the layers); empty
   * (`[0]`) on a first stage without `embedRow`.
   */
  readonly hidden: Float32Array;
  /** Captured taps: tap id → `[numTokens, hiddenSize]` f32 (tap `layerStart` already in when asked for). */
  readonly captured: Map<number, Float32Array>;
  /** Stores a copy of `hidden` as tap `tap` if it was asked for. */
  capture(tap: number): void;
}

/**
 * Runs the prologue. Every sequence must be registered in `cache` with `cache.length(id) === position`.
 * @throws the model's error (`spec.error`) on an empty batch, a sequence listed twice, a sequence
 *   without tokens, a position that disagrees with the cache, a tap outside [layerStart, layerEnd],
 *   a token id outside [0, vocabSize), or a missing / mis-sized `batch.hidden` — all before the
 *   cache is touched; and whatever `spec.span` throws.
 * @throws {CacheError} `full` when the KV pool has no room (nothing was extended).
 */
export function forwardPrologue<S extends ForwardSpanBase>(
  batch: ForwardBatch,
  cache: SequenceCache,
  options: ForwardOptions,
  spec: ForwardPrologueSpec<S>,
): ForwardPrologue<S> {
  const { layerStart, layerEnd, isFirst, hiddenSize: D, vocabSize } = spec.info;
  const fail = spec.error;
  if (batch.sequences.length === 0) throw fail('forward: batch.sequences: expected at least one sequence');
  const seqs = batch.sequences;
  const spans: S[] = [];
  let N = 0;
  // a sequence listed twice: a set for large batches, a scan for small ones (one verify step's batch)
  const ids = seqs.length > 8 ? new Set<unknown>() : undefined;
  for (let i = 0; i < seqs.length; i++) {
    const s = seqs[i]!;
    let twice = false;
    if (ids === undefined) for (let j = 0; j < i && !twice; j++) twice = seqs[j]!.id === s.id;
    else twice = ids.has(s.id);
    if (twice) throw fail(`forward: sequences[${i}].id: sequence ${String(s.id)} appears twice in the batch`);
    ids?.add(s.id);
    if (s.tokens.length < 1) throw fail(`forward: sequences[${i}].tokens: expected at least one token`);
    const have = cache.length(s.id);
    if (have !== s.position)
      throw fail(`forward: sequences[${i}].position: expected ${have} (cached tokens), got ${s.position}`);
    spans.push(spec.span(s, i, N));
    N += s.tokens.length;
  }
  const taps = options.taps ?? [];
  for (const t of taps) {
    if (!Number.isInteger(t) || t < layerStart || t > layerEnd)
      throw fail(`forward: taps: tap ${t} is outside this stage's [${layerStart}, ${layerEnd}]`);
  }
  let h: Float32Array;
  if (isFirst && (spec.hiddenOnFirstStage === 'ignore' || batch.hidden === undefined)) {
    const embedRow = spec.embedRow;
    h = new Float32Array(embedRow === undefined ? 0 : N * D);
    let row = 0;
    for (let i = 0; i < seqs.length; i++) {
      const tokens = seqs[i]!.tokens;
      for (let j = 0; j < tokens.length; j++) {
        const id = tokens[j]!;
        if (!(id >= 0 && id < vocabSize))
          throw fail(`forward: sequences[${i}].tokens: id ${id} outside [0, ${vocabSize})`);
        embedRow?.(id, h.subarray(row * D, (row + 1) * D));
        row++;
      }
    }
  } else {
    if (batch.hidden === undefined || batch.hidden.length !== N * D) {
      const got = batch.hidden === undefined ? 'none' : `length ${batch.hidden.length}`;
      throw fail(`forward: batch.hidden: expected Float32Array [${N}, ${D}] from the previous stage, got ${got}`);
    }
    h = batch.hidden.slice();
  }
  cache.extendAll(spans); // all or nothing
  const captured = new Map<number, Float32Array>();
  const capture = (tap: number) => {
    if (h.length > 0 && taps.includes(tap)) captured.set(tap, h.slice());
  };
  capture(layerStart);
  return { spans, numTokens: N, taps, hidden: h, captured, capture };
}
