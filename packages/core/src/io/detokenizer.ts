/**
 * Incremental (streaming) detokenization: given a growing list of token ids, emit only the text
 * that became stable since the last call.
 *
 * Method (as in HF text-generation-inference and vLLM's `detokenize_incrementally`): keep two
 * offsets into the ids, `prefixOffset ≤ readOffset`. On each push decode the window
 * `ids[prefixOffset:readOffset]` (already emitted) and `ids[prefixOffset:]`; if the second is longer
 * and does not end in U+FFFD, the extra suffix is new text: emit it and move both offsets forward.
 * If it ends in U+FFFD, a UTF-8 character is split across tokens (byte-level BPE, byte fallback) and
 * we wait for more tokens. Decoding a window that starts a few tokens back (never at 0 for a
 * continuation) keeps decoders that strip a leading space (SentencePiece `▁`) from eating real
 * spaces: seed it with the prompt ids.
 */

import type { Tokenizer } from './tokenizer.js';

/** How many prompt tokens the first window reaches back (vLLM uses 5 as well). */
const INITIAL_PREFIX_TOKENS = 5;

/** Options of {@link IncrementalDetokenizer}. */
export interface IncrementalDetokenizerOptions {
  /** Drop special tokens from the emitted text. */
  readonly skipSpecialTokens: boolean;
  /**
   * Prompt ids that precede the generated ones (their text is not emitted; the last few give the
   * decoder left context, e.g. so a leading `▁` decodes as a space). Optional: without them the
   * first token decodes as at the start of a text.
   */
  readonly promptIds?: ArrayLike<number>;
}

/** Streams text from a growing sequence of generated token ids. Not thread-safe; one per request. */
export class IncrementalDetokenizer {
  private readonly ids: number[] = [];
  private prefixOffset: number;
  private readOffset: number;
  private emitted = '';

  constructor(
    private readonly tokenizer: Tokenizer,
    private readonly options: IncrementalDetokenizerOptions,
  ) {
    const prompt = options.promptIds ?? [];
    for (let i = 0; i < prompt.length; i++) this.ids.push(prompt[i]!);
    this.readOffset = this.ids.length;
    this.prefixOffset = Math.max(0, this.ids.length - INITIAL_PREFIX_TOKENS);
  }

  /** All text emitted so far (concatenation of every returned delta). */
  get text(): string {
    return this.emitted;
  }

  /** Generated ids pushed so far, prompt excluded, count. */
  get numGenerated(): number {
    return this.ids.length - (this.options.promptIds?.length ?? 0);
  }

  /**
   * Appends newly generated ids (one or several, e.g. all accepted tokens of a verify step).
   * @returns the newly stable text ('' if a character is still incomplete).
   * @throws {TokenizerError} if an id is not a token id.
   */
  push(newIds: ArrayLike<number> | number): string {
    if (typeof newIds === 'number') this.ids.push(newIds);
    else for (let i = 0; i < newIds.length; i++) this.ids.push(newIds[i]!);
    return this.step(false);
  }

  /**
   * Ends the stream: emits whatever is pending, including U+FFFD for bytes that never completed a
   * character. Later pushes continue normally.
   */
  flush(): string {
    return this.step(true);
  }

  private step(force: boolean): string {
    if (this.ids.length === this.readOffset) return '';
    const decodeOpts = { skipSpecialTokens: this.options.skipSpecialTokens };
    const prefixText = this.tokenizer.decode(this.ids.slice(this.prefixOffset, this.readOffset), decodeOpts);
    const fullText = this.tokenizer.decode(this.ids.slice(this.prefixOffset), decodeOpts);
    if (!force && (fullText.length <= prefixText.length || fullText.endsWith('\uFFFD'))) return '';
    // Windows are decoded from the same start, so fullText extends prefixText (decoders are
    // prefix-stable on token boundaries that are character boundaries).
    const delta = fullText.length > prefixText.length ? fullText.slice(prefixText.length) : '';
    this.prefixOffset = this.readOffset;
    this.readOffset = this.ids.length;
    this.emitted += delta;
    return delta;
  }
}
