/**
 * Prompt building, shared by the OpenAI server (server.ts) and the prefill/decode router (pd/router.ts) so
 * that both turn one request into the same prompt token ids: a completion's `prompt` text is encoded without
 * special tokens (token ids are taken as they are, each checked against the vocabulary), a chat request is
 * rendered with the checkpoint's chat template (generation prompt added) and encoded the same way.
 * {@link loadPromptBuilder} loads only the tokenizer of a model (no weights) for a process that routes.
 */

import * as fs from 'node:fs';
import * as nodePath from 'node:path';

import { GgufFile } from '../io/gguf.js';
import { tokenizerFromGguf } from '../io/gguf-tokenizer.js';
import { HfConfig } from '../io/hf-config.js';
import { Tokenizer } from '../io/tokenizer.js';
import { ggufPathOf } from '../runtime/target.js';
import { ChatTemplate, ChatTemplateError } from './chat-template.js';
import { chatTemplateFailed, invalidParam } from './errors.js';
import { contextTooLong, longestTokenChars, promptCharLimit, promptTooLarge } from './limits.js';
import { PromptEncoder } from './prompt-encoder.js';
import type { ChatRequest, CompletionRequest } from './protocol.js';

/** The endpoint a prompt came from. */
export type PromptKind = 'completion' | 'chat';

/** A built prompt. */
export interface BuiltPrompt {
  /** `[numPromptTokens]` token ids, at least one. */
  readonly ids: Int32Array;
  /** The request field errors about the prompt name (`prompt` or `messages`). */
  readonly param: 'prompt' | 'messages';
}

/** The chat template of `tokenizer` with its BOS / EOS strings, or undefined when it has none. */
function chatTemplateOf(tokenizer: Tokenizer): ChatTemplate | undefined {
  if (tokenizer.chatTemplate === undefined) return undefined;
  const cfg = tokenizer.config as Record<string, unknown>;
  const special = (k: string): string | undefined => {
    const v = cfg[k];
    return typeof v === 'string'
      ? v
      : v !== null && typeof v === 'object' && typeof (v as { content?: unknown }).content === 'string'
        ? (v as { content: string }).content
        : undefined;
  };
  const bos = special('bos_token');
  const eos = special('eos_token');
  return new ChatTemplate(tokenizer.chatTemplate, {
    ...(bos === undefined ? {} : { bos_token: bos }),
    ...(eos === undefined ? {} : { eos_token: eos }),
  });
}

/** Prompt limits checked before tokenizing (limits.ts). */
export interface PromptLimits {
  /** The server's context length, tokens (`scheduler.max_sequence_tokens`): a prompt must leave room for one token. */
  readonly maxContextTokens: number;
  /** Texts up to this many UTF-16 code units are encoded on the calling thread (PromptEncoder, default 16384). */
  readonly inlineChars?: number;
}

/**
 * Turns checked requests (protocol.ts) into prompt token ids. A prompt whose text is longer than
 * {@link maxPromptChars} (or with more token ids than the context holds) is refused before it is rendered or
 * encoded; a long text is encoded in a worker thread ({@link PromptEncoder}). {@link close} stops that thread.
 */
export class PromptBuilder {
  private readonly template: ChatTemplate | undefined;
  private readonly encoder: PromptEncoder;
  /** The server's context length, tokens. */
  readonly maxContextTokens: number;
  /** The longest prompt text accepted, UTF-16 code units (limits.ts promptCharLimit). */
  readonly maxPromptChars: number;

  /**
   * @param tokenizer the target's tokenizer.
   * @param vocabSize the target's vocabulary size: token ids in a completion's `prompt` must be below it.
   * @param limits the context length (default: no limit, 2^31 − 1 tokens) and the inline encoding bound.
   * @throws {ChatTemplateError} if the tokenizer's chat template does not parse.
   */
  constructor(
    readonly tokenizer: Tokenizer,
    readonly vocabSize: number,
    limits: PromptLimits = { maxContextTokens: 2 ** 31 - 1 },
  ) {
    this.template = chatTemplateOf(tokenizer);
    this.encoder = new PromptEncoder(tokenizer, limits.inlineChars);
    this.maxContextTokens = limits.maxContextTokens;
    this.maxPromptChars = promptCharLimit(limits.maxContextTokens, longestTokenChars(tokenizer));
  }

  /** Texts encoded in the worker thread so far. */
  get encodedInWorker(): number {
    return this.encoder.encodedInWorker;
  }

  /** Texts waiting for or being encoded by the worker thread now. */
  get encodingInWorker(): number {
    return this.encoder.inWorker;
  }

  /**
   * A completion's prompt: its text encoded without special tokens, or its token ids.
   * @throws {ApiError} 400 naming `prompt` for an id outside the vocabulary, a prompt of no tokens, or one the
   *   context cannot hold (`context_length_exceeded`: more characters than {@link maxPromptChars}, or as many ids as
   *   the context length), before encoding it.
   */
  async completion(p: CompletionRequest): Promise<BuiltPrompt> {
    let ids: Int32Array;
    if (typeof p.prompt === 'string') {
      this.checkChars(p.prompt.length, 'prompt');
      ids = await this.encoder.encode(p.prompt);
    } else {
      if (p.prompt.length >= this.maxContextTokens)
        throw contextTooLong(this.maxContextTokens, p.prompt.length, undefined, 'prompt');
      const V = this.vocabSize;
      const bad = p.prompt.find((t) => t >= V);
      if (bad !== undefined) throw invalidParam('prompt', `token id ${bad} is outside the vocabulary (size ${V})`);
      ids = Int32Array.from(p.prompt);
    }
    return nonEmpty(ids, 'prompt');
  }

  /**
   * A chat prompt: the messages rendered by the chat template (with the generation prompt), encoded without
   * special tokens (the template writes them).
   * @throws {ApiError} 400 naming `messages` when the model has no chat template, the template rejects the
   *   messages, they encode to no tokens, or their text is longer than {@link maxPromptChars} (checked on the
   *   contents before rendering and on the rendered text before encoding).
   */
  async chat(p: ChatRequest): Promise<BuiltPrompt> {
    return nonEmpty(await this.encoder.encode(this.renderChat(p)), 'messages');
  }

  /**
   * The text {@link chat} encodes: the messages rendered by the chat template with the generation prompt.
   * @throws {ApiError} 400 naming `messages` as {@link chat} (no template, rejected, longer than
   *   {@link maxPromptChars}).
   */
  renderChat(p: Pick<ChatRequest, 'messages'>): string {
    if (this.template === undefined)
      throw invalidParam('messages', 'this model has no chat template (use /v1/completions)');
    this.checkChars(
      p.messages.reduce((n, m) => n + m.content.length, 0),
      'messages',
    );
    let text: string;
    try {
      text = this.template.render(p.messages, true);
    } catch (err) {
      if (err instanceof ChatTemplateError) throw chatTemplateFailed(err);
      throw err;
    }
    this.checkChars(text.length, 'messages');
    return text;
  }

  /** Stops the encoding worker thread, if one started. */
  close(): Promise<void> {
    return this.encoder.close();
  }

  private checkChars(chars: number, param: 'prompt' | 'messages'): void {
    if (chars > this.maxPromptChars) throw promptTooLarge(this.maxContextTokens, chars, this.maxPromptChars, param);
  }
}

function nonEmpty(ids: Int32Array, param: 'prompt' | 'messages'): BuiltPrompt {
  if (ids.length === 0) throw invalidParam(param, 'the prompt encodes to no tokens');
  return { ids, param };
}

/**
 * A {@link PromptBuilder} for the model at `modelPath`, loading its tokenizer only (no weights), from the same
 * places `loadTarget` (runtime/target.ts) reads it: a Hugging Face folder's tokenizer.json (vocabulary size from
 * config.json `vocab_size`, else the tokenizer's), or a GGUF file or a folder holding one (tokenizer.json beside
 * it when present, else the GGUF's tokenizer metadata; vocabulary size from `<arch>.vocab_size`, else the
 * tokenizer's). `limits` as {@link PromptBuilder}'s constructor.
 * @throws {TokenizerError} / {GgufError} / {HfConfigError} / {PluginError} (several GGUF files) naming the file.
 */
export function loadPromptBuilder(modelPath: string, limits?: PromptLimits): PromptBuilder {
  const ggufPath = ggufPathOf(modelPath);
  if (ggufPath !== undefined) {
    const dir = nodePath.dirname(ggufPath);
    const gguf = GgufFile.open(ggufPath);
    const tokenizer = fs.existsSync(nodePath.join(dir, 'tokenizer.json'))
      ? Tokenizer.load(dir)
      : tokenizerFromGguf(gguf);
    const arch = gguf.has('general.architecture') ? gguf.getString('general.architecture') : undefined;
    const key = `${arch}.vocab_size`;
    const vocab = arch !== undefined && gguf.has(key) ? gguf.getU32(key) : tokenizer.vocabSize;
    return new PromptBuilder(tokenizer, vocab, limits);
  }
  const tokenizer = Tokenizer.load(modelPath);
  const raw = HfConfig.read(modelPath).raw as Record<string, unknown>;
  const text = raw.text_config as Record<string, unknown> | undefined;
  const declared = raw.vocab_size ?? text?.vocab_size;
  const vocab = Number.isSafeInteger(declared) ? (declared as number) : tokenizer.vocabSize;
  return new PromptBuilder(tokenizer, vocab, limits);
}
