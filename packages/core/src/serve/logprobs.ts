/**
 * The API's `logprobs` field from the engine's token logprobs (engine/logprobs.ts: the target's raw distribution),
 * in OpenAI's two shapes, as vLLM fills them (vllm/entrypoints/openai/serving_completion.py `_create_completion_
 * logprobs`, serving_chat.py `_create_chat_logprobs`):
 * - completions: `{tokens, token_logprobs, top_logprobs, text_offset}` — parallel arrays; `top_logprobs[i]` maps the
 *   position's n most likely token texts, and the emitted token's, to their logprobs (so up to n + 1 entries);
 *   `text_offset[i]` is the character offset of token i in the returned text (the echoed prompt's tokens first);
 *   an echoed prompt's first token has a null logprob and null alternatives (it has no context);
 * - chat: `{content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}` — exactly n alternatives.
 * A token's text is its own decode (special tokens kept), `bytes` its UTF-8 bytes; a −Infinity logprob is sent as
 * −9999 (vLLM's clamp: JSON has no infinity).
 */

import type { TokenLogprob } from '../engine/logprobs.js';

/** A logprob as sent: −Infinity (a masked logit) becomes −9999, as vLLM. */
const clamp = (x: number): number => Math.max(x, -9999);

/** One alternative of a chat position. */
export interface ChatTopLogprob {
  readonly token: string;
  readonly logprob: number;
  readonly bytes: number[];
}

/** One chat position. */
export interface ChatLogprob extends ChatTopLogprob {
  readonly top_logprobs: ChatTopLogprob[];
}

/** The completions shape. */
export interface CompletionLogprobs {
  readonly tokens: string[];
  readonly token_logprobs: (number | null)[];
  readonly top_logprobs: (Record<string, number> | null)[];
  readonly text_offset: number[];
}

/**
 * Collects the logprobs of a choice's tokens and hands them out as the `logprobs` field, whole (a non-streamed
 * choice) or in pieces (each stream chunk carries the tokens added since the previous {@link take}).
 */
export class LogprobsWriter {
  private completion: CompletionLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  private chat: ChatLogprob[] = [];
  /** Characters of the returned text covered so far (the next token's text_offset). */
  private offset = 0;

  /**
   * @param kind the endpoint's shape. @param topN alternatives per position (completions `logprobs`, chat
   *   `top_logprobs`). @param tokenText the text of one token id.
   */
  constructor(
    private readonly kind: 'completion' | 'chat',
    private readonly topN: number,
    private readonly tokenText: (id: number) => string,
  ) {}

  /** Adds one position: `token` and its logprob (`null`: an echoed prompt's first token, which has none). */
  add(token: number, lp: TokenLogprob | null): void {
    const text = this.tokenText(token);
    if (this.kind === 'chat') {
      // (the chat endpoint has no echo: every position has a logprob)
      if (lp === null) return;
      this.chat.push({
        ...this.alt(token, lp.logprob),
        top_logprobs: lp.top.slice(0, this.topN).map((t) => this.alt(t.token, t.logprob)),
      });
      return;
    }
    const c = this.completion;
    c.tokens.push(text);
    c.text_offset.push(this.offset);
    this.offset += text.length;
    if (lp === null) {
      c.token_logprobs.push(null);
      c.top_logprobs.push(null);
      return;
    }
    c.token_logprobs.push(clamp(lp.logprob));
    const top: Record<string, number> = {};
    for (const t of lp.top.slice(0, this.topN)) top[this.tokenText(t.token)] = clamp(t.logprob);
    top[text] = clamp(lp.logprob);
    c.top_logprobs.push(top);
  }

  /** The positions added since the last call, as the choice's `logprobs` field; the writer starts afresh. */
  take(): CompletionLogprobs | { content: ChatLogprob[] } {
    if (this.kind === 'chat') {
      const content = this.chat;
      this.chat = [];
      return { content };
    }
    const c = this.completion;
    this.completion = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
    return c;
  }

  /** True when positions were added since the last {@link take}. */
  get pending(): boolean {
    return this.kind === 'chat' ? this.chat.length > 0 : this.completion.tokens.length > 0;
  }

  private alt(token: number, logprob: number): ChatTopLogprob {
    const text = this.tokenText(token);
    return { token: text, logprob: clamp(logprob), bytes: [...Buffer.from(text, 'utf8')] };
  }
}
