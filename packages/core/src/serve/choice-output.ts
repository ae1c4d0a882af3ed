/**
 * The output of one choice as its tokens arrive: the text (incremental detokenizing, stop strings held back and cut,
 * `min_tokens` before stop strings count, a stop token id's text dropped — vLLM's rules), completions' echoed prompt,
 * and the `logprobs` field (serve/logprobs.ts). One request of one choice (server.ts) and each choice of a request of
 * several (choices.ts) use it, so both paths answer the same fields the same way.
 */

import type { TokenLogprob } from '../engine/logprobs.js';
import type { Tokenizer } from '../io/tokenizer.js';
import { type CompletionLogprobs, type ChatLogprob, LogprobsWriter } from './logprobs.js';
import type { GenerationParams } from './protocol.js';
import { StopTextBuffer } from './stop-text.js';

/** What the engine must compute for a choice's logprobs (the LoopRequest's `logprobs` and `promptLogprobs`). */
export interface LogprobsRequest {
  /** Alternatives per generated token. */
  readonly logprobs?: number;
  /** Alternatives per prompt token (completions' echo with logprobs). */
  readonly promptLogprobs?: number;
}

/** The `logprobs` field of a choice (null when the request asked for none). */
export type ChoiceLogprobs = CompletionLogprobs | { content: ChatLogprob[] } | null;

/** One choice's text, echo and logprobs. */
export class ChoiceOutput {
  /** The echoed prompt (completions with `echo`), else ''. */
  readonly echoText: string;
  private echoPending: boolean;
  private readonly detok: ReturnType<Tokenizer['createDetokenizer']>;
  private readonly stops: StopTextBuffer;
  private readonly lps: LogprobsWriter | undefined;
  private readonly minTokens: number;
  /** Tokens pushed: stop strings count after min_tokens (vLLM). */
  private pushed = 0;

  /**
   * @param kind the endpoint. @param p the request's parameters. @param promptIds `[numPromptTokens]` i32, the
   *   prompt the choice continues (the detokenizer's context; the echoed text when the request has no prompt text).
   */
  constructor(
    kind: 'completion' | 'chat',
    private readonly p: GenerationParams,
    private readonly promptIds: Int32Array,
    tok: Tokenizer,
  ) {
    this.detok = tok.createDetokenizer({ skipSpecialTokens: true, promptIds });
    this.minTokens = p.minTokens ?? 0;
    this.stops = new StopTextBuffer(p.stop, this.minTokens === 0);
    this.lps =
      p.logprobs === undefined
        ? undefined
        : new LogprobsWriter(kind, p.logprobs, (t) => tok.decode([t], { skipSpecialTokens: false }));
    const echo = kind === 'completion' && p.echo === true;
    const promptText = (p as { prompt?: unknown }).prompt;
    this.echoText = !echo
      ? ''
      : typeof promptText === 'string'
        ? promptText
        : tok.decode(promptIds, { skipSpecialTokens: false });
    this.echoPending = echo;
  }

  /** The engine's logprobs fields for this choice (logprobs raw from the target, as vLLM's default). */
  static request(kind: 'completion' | 'chat', p: GenerationParams): LogprobsRequest {
    if (p.logprobs === undefined) return {};
    const echo = kind === 'completion' && p.echo === true;
    return echo ? { logprobs: p.logprobs, promptLogprobs: p.logprobs } : { logprobs: p.logprobs };
  }

  /** The prompt's logprobs (`[numPromptTokens]`, null for the first token), before any generated token. */
  promptLogprobs(prompt: readonly (TokenLogprob | null)[]): void {
    for (const [i, lp] of prompt.entries()) this.lps?.add(this.promptIds[i] as number, lp);
  }

  /** The echoed prompt once, before the first token's text (a stream's first chunk); undefined afterwards. */
  takeEcho(): string | undefined {
    if (!this.echoPending) return undefined;
    this.echoPending = false;
    return this.echoText;
  }

  /** Adds a generated token (and its logprob, when asked for). @returns the text that may be sent now. */
  token(t: number, lp: TokenLogprob | undefined): string {
    if (this.pushed++ === this.minTokens) this.stops.arm();
    if (lp !== undefined) this.lps?.add(t, lp);
    // a stop token id ends the request; its text is not returned (vLLM)
    if (this.p.stopTokenIds?.includes(t) === true) return '';
    return this.stops.push(this.detok.push(t));
  }

  /** The text held back until the end (an incomplete character, a partial stop string). */
  finish(): string {
    return this.stops.push(this.detok.flush()) + this.stops.finish();
  }

  /** The logprobs added since the last take (a stream chunk's field), or null when none were. */
  takeLogprobs(): ChoiceLogprobs {
    return this.lps?.pending === true ? this.lps.take() : null;
  }

  /** The whole `logprobs` field of a non-streamed choice (null when none were asked for). */
  allLogprobs(): ChoiceLogprobs {
    return this.lps === undefined ? null : this.lps.take();
  }

  /** The non-streamed choice's text: the echo, then the completion (call after {@link finish}). */
  get fullText(): string {
    return this.echoText + this.stops.fullText;
  }
}
