/**
 * vLLM's `/tokenize` and `/detokenize` (vllm/entrypoints/openai/protocol.py TokenizeRequest, DetokenizeRequest):
 * - `POST /tokenize {model?, prompt, add_special_tokens = true}` or `{model?, messages, add_generation_prompt = true,
 *   add_special_tokens = false}` → `{count, max_model_len, tokens}`. A prompt is encoded as it is; messages are
 *   rendered by the chat template (with the generation prompt: `add_generation_prompt: false` is refused, the
 *   template is only rendered that way here), then encoded. /v1/completions encodes its prompt text without special
 *   tokens, so `add_special_tokens: false` gives the ids a completion runs on; the messages' default gives the ids a
 *   chat request runs on. The text's length is checked before encoding as for a completion (400
 *   `context_length_exceeded` past max_sequence_tokens × the longest vocabulary entry).
 * - `POST /detokenize {model?, tokens}` → `{prompt}`: the ids decoded with their special tokens (as vLLM).
 * `max_model_len` is the server's context length (`scheduler.max_sequence_tokens`). A `model` other than the served
 * one is a 404 `model_not_found`; a bad field a 400 naming it.
 */

import type { FastifyInstance } from 'fastify';

import type { Tokenizer } from '../io/tokenizer.js';
import { invalidParam, unknownModel } from './errors.js';
import { promptTooLarge } from './limits.js';
import type { PromptBuilder } from './prompt.js';
import { parseChatRequest, type SamplingDefaults } from './protocol.js';

/** What the routes need from the server. */
export interface TokenizeHost {
  readonly tokenizer: Tokenizer;
  readonly prompts: PromptBuilder;
  readonly modelName: string;
  /** The target's vocabulary size: `/detokenize` ids must be below it. */
  readonly vocabSize: number;
  /** The server's context length, tokens. */
  readonly maxModelLen: number;
  readonly sampling: SamplingDefaults;
}

type Body = Record<string, unknown>;

function bodyOf(body: unknown, modelName: string): Body {
  if (body === null || typeof body !== 'object' || Array.isArray(body))
    throw invalidParam('body', 'expected a JSON object');
  const b = body as Body;
  if (b.model !== undefined && b.model !== null) {
    if (typeof b.model !== 'string') throw invalidParam('model', `expected a model id, got ${JSON.stringify(b.model)}`);
    if (b.model !== modelName) throw unknownModel(b.model, modelName);
  }
  return b;
}

function flag(b: Body, key: string, fallback: boolean): boolean {
  const v = b[key];
  if (v === undefined || v === null) return fallback;
  if (typeof v !== 'boolean') throw invalidParam(key, `expected true or false, got ${JSON.stringify(v)}`);
  return v;
}

/**
 * The token ids `/tokenize` answers for a body, `[count]`.
 * @throws {ApiError} 400 naming the field (neither or both of prompt and messages, a bad message, a text too long).
 */
export function tokenizeBody(host: TokenizeHost, body: unknown): number[] {
  const b = bodyOf(body, host.modelName);
  const hasPrompt = b.prompt !== undefined && b.prompt !== null;
  const hasMessages = b.messages !== undefined && b.messages !== null;
  if (hasPrompt === hasMessages) throw invalidParam('prompt', 'expected either prompt (a string) or messages');
  let text: string;
  let addSpecial: boolean;
  if (hasPrompt) {
    if (typeof b.prompt !== 'string') throw invalidParam('prompt', `expected a string, got ${typeof b.prompt}`);
    text = b.prompt;
    const max = host.prompts.maxPromptChars;
    if (text.length > max) throw promptTooLarge(host.prompts.maxContextTokens, text.length, max, 'prompt');
    addSpecial = flag(b, 'add_special_tokens', true);
  } else {
    if (!flag(b, 'add_generation_prompt', true))
      throw invalidParam('add_generation_prompt', 'only true is supported (as chat requests are rendered)');
    const { messages } = parseChatRequest({ model: host.modelName, messages: b.messages }, host.sampling);
    text = host.prompts.renderChat({ messages });
    addSpecial = flag(b, 'add_special_tokens', false);
  }
  return Array.from(host.tokenizer.encode(text, { addSpecialTokens: addSpecial }));
}

/**
 * The text `/detokenize` answers for a body.
 * @throws {ApiError} 400 naming `tokens` for a value that is not a list of ids below the vocabulary size.
 */
export function detokenizeBody(host: TokenizeHost, body: unknown): string {
  const b = bodyOf(body, host.modelName);
  const t = b.tokens;
  if (!Array.isArray(t)) throw invalidParam('tokens', `expected an array of token ids, got ${JSON.stringify(t)}`);
  const V = host.vocabSize;
  const bad = t.findIndex((x) => !Number.isSafeInteger(x) || (x as number) < 0 || (x as number) >= V);
  if (bad >= 0) throw invalidParam(`tokens[${bad}]`, `expected a token id in [0, ${V}), got ${JSON.stringify(t[bad])}`);
  return host.tokenizer.decode(t as number[], { skipSpecialTokens: false });
}

/** Installs `POST /tokenize` and `POST /detokenize` on `app`. */
export function installTokenizeRoutes(app: FastifyInstance, host: TokenizeHost): void {
  app.post('/tokenize', async (req) => {
    const tokens = tokenizeBody(host, req.body);
    return { count: tokens.length, max_model_len: host.maxModelLen, tokens };
  });
  app.post('/detokenize', async (req) => ({ prompt: detokenizeBody(host, req.body) }));
}
