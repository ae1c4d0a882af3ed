/**
 * The prompt-lookup (n-gram) drafter, as vLLM's "ngram" proposer: for n from `maxNgram` down to
 * `minNgram`, find the most recent earlier occurrence of the history's last n tokens and propose
 * the (up to) k tokens that followed it. No taps, no draft KV, no weights; drafts are argmax
 * drafts (no `probs`: a point mass), so sampled requests are verified by plain rejection.
 */
import {
  DrafterError,
  type ContextSpan,
  type DraftBatch,
  type Drafter,
  type DraftProposal,
  type SequenceId,
  type StageInfo,
} from '@specd/core';

import { PROMPT_LOOKUP_METHOD, type PromptLookupSettings } from './config.js';

/**
 * Drafts for one history: the ≤ k tokens after the most recent earlier match of its longest
 * matching suffix n-gram (n ∈ [minNgram, maxNgram]); empty when nothing matches.
 */
export function lookupDrafts(history: Int32Array, k: number, minNgram: number, maxNgram: number): Int32Array {
  const len = history.length;
  for (let n = Math.min(maxNgram, len - 1); n >= minNgram; n--) {
    // candidate starts i < len − n (an earlier occurrence), scanned from the most recent
    for (let i = len - n - 1; i >= 0; i--) {
      let j = 0;
      while (j < n && history[i + j] === history[len - n + j]) j++;
      if (j === n) {
        const from = i + n;
        return history.slice(from, Math.min(from + k, len));
      }
    }
  }
  return new Int32Array(0);
}

export class PromptLookupDrafter implements Drafter {
  readonly method = PROMPT_LOOKUP_METHOD;
  readonly maxDraftTokens: number;
  /** Draft context length per sequence (only counted: the engine checks spans against it). */
  private readonly context = new Map<SequenceId, number>();

  constructor(readonly settings: PromptLookupSettings) {
    this.maxDraftTokens = settings.numDraftTokens;
  }

  captureSetter(_target: StageInfo): readonly number[] {
    return [];
  }

  projectTargetHiddenPartial(
    _stageTaps: ReadonlyMap<number, Float32Array>,
    _numTokens: number,
    accumulator?: Float32Array,
  ): Float32Array {
    return accumulator ?? new Float32Array(0);
  }

  writeProjectedContextKV(_sum: Float32Array, spans: readonly ContextSpan[]): void {
    for (const s of spans) {
      const have = this.context.get(s.id);
      if (have === undefined) throw new DrafterError(`prompt-lookup: unknown sequence ${String(s.id)}`);
      if (s.position !== have)
        throw new DrafterError(`prompt-lookup: sequence ${String(s.id)}: span at ${s.position}, context has ${have}`);
      this.context.set(s.id, have + s.numTokens);
    }
  }

  propose(batch: DraftBatch): DraftProposal[] {
    const { minNgram, maxNgram } = this.settings;
    return batch.sequences.map((s) => ({
      id: s.id,
      tokens: lookupDrafts(s.history, Math.min(s.maxDrafts, this.maxDraftTokens), minNgram, maxNgram),
    }));
  }

  buildPDInput(_id: SequenceId): unknown {
    throw new DrafterError('prompt-lookup: PD transfer is not supported yet');
  }

  acceptPDInput(_payload: unknown): void {
    throw new DrafterError('prompt-lookup: PD transfer is not supported yet');
  }

  addSequence(id: SequenceId): void {
    if (this.context.has(id)) throw new DrafterError(`prompt-lookup: sequence ${String(id)} already added`);
    this.context.set(id, 0);
  }

  contextLength(id: SequenceId): number {
    const n = this.context.get(id);
    if (n === undefined) throw new DrafterError(`prompt-lookup: unknown sequence ${String(id)}`);
    return n;
  }

  freeSequence(id: SequenceId): void {
    this.context.delete(id);
  }

  get pagesInUse(): number {
    return 0;
  }

  dispose(): void {
    this.context.clear();
  }
}
