/**
 * The prompt-lookup (n-gram) drafter, as vLLM's "ngram" proposer: for n from `maxNgram` down to
 * `minNgram`, find the most recent earlier occurrence of the history's last n tokens and propose
 * the (up to) k tokens that followed it. No taps, no draft KV, no weights; drafts are argmax
 * drafts (no `probs`: a point mass), so sampled requests are verified by plain rejection.
 *
 * Built on core's `DrafterBase`: no taps and nothing projected (its defaults); the draft context is a
 * `DraftKvCache` without KV, which only counts each sequence's committed rows (add / free / context
 * length come with the base class).
 *
 * Prefill/decode disaggregation: it declares `DraftContextTransfer` with an empty context — no regions, no
 * entries — since it drafts from the token ids alone, which travel with the request; the decode side only
 * counts the prompt's rows (`pdReserveContext`).
 */
import {
  DrafterBase,
  DraftKvCache,
  type DraftBatch,
  type DraftContextTransfer,
  type DraftProposal,
  type LocalEntry,
  type MemoryRegion,
  type SequenceId,
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

/** The drafter: n-gram lookup over each sequence's history. */
export class PromptLookupDrafter extends DrafterBase implements DraftContextTransfer {
  readonly method = PROMPT_LOOKUP_METHOD;
  readonly maxDraftTokens: number;

  constructor(readonly settings: PromptLookupSettings) {
    super(new DraftKvCache()); // context lengths only: no KV
    this.maxDraftTokens = settings.numDraftTokens;
  }

  /** PD: no regions (the context is the token ids). */
  pdRegions(): readonly MemoryRegion[] {
    return [];
  }

  /** PD: no entries (the context is the token ids). @throws `CacheError` `unknown-sequence`. */
  pdContextEntries(id: SequenceId): readonly LocalEntry[] {
    this.contextLength(id);
    return [];
  }

  /** PD (decode side): counts `length` context rows for `id` (nothing to allocate). */
  pdReserveContext(id: SequenceId, length: number): void {
    this.reserveDraftContext(id, length);
  }

  propose(batch: DraftBatch): DraftProposal[] {
    const { minNgram, maxNgram } = this.settings;
    return batch.sequences.map((s) => ({
      id: s.id,
      tokens: lookupDrafts(s.history, Math.min(s.maxDrafts, this.maxDraftTokens), minNgram, maxNgram),
    }));
  }
}
