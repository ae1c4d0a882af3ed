/**
 * Request limits checked before any work, shared by the OpenAI server (server.ts) and the prefill/decode router
 * (pd/router.ts):
 *
 * - Context length (vLLM's `max_model_len`): prompt + max_tokens ≤ the server's limit (`max_sequence_tokens`),
 *   which may not exceed the target's `max_position_embeddings` ({@link modelContextLength},
 *   {@link checkServerContextLength}: refused at start-up). An over-long request is a 400 whose message has
 *   vLLM's shape ({@link contextTooLong}); an absent max_tokens is the remaining context
 *   ({@link resolveMaxTokens}, vLLM's `get_max_tokens`). The draft block does not count: the engine drafts at most
 *   `max_tokens − generated` tokens, so a verify block never reaches past prompt + max_tokens.
 * - Prompt size before tokenizing ({@link promptCharLimit}): a token decodes to at most as many UTF-16 code units as
 *   the longest vocabulary entry, so a text longer than limit × that length cannot fit and is refused without
 *   encoding it.
 */

import * as fs from 'node:fs';
import * as nodePath from 'node:path';

import { GgufFile } from '../io/gguf.js';
import { HfConfig } from '../io/hf-config.js';
import type { Tokenizer } from '../io/tokenizer.js';
import { ggufPathOf } from '../runtime/target.js';
import { ApiError } from './errors.js';

/** A server limit the model cannot hold (thrown at start-up). */
export class ContextLengthError extends Error {
  override readonly name = 'ContextLengthError';
}

/** The positions a target checkpoint was trained for, and where that number was read. */
export interface ModelContextLength {
  /** `max_position_embeddings` (tokens). */
  readonly tokens: number;
  /** The file and field, for messages (e.g. `models/x/config.json max_position_embeddings`). */
  readonly source: string;
}

/**
 * The context length of the target at `modelPath`, read without loading weights: a Hugging Face folder's
 * config.json `max_position_embeddings` (or `text_config.max_position_embeddings`), or a GGUF file's
 * `<arch>.context_length` (a folder holding one `.gguf`, as `loadTarget` finds it). Undefined when the checkpoint
 * does not say.
 * @throws {HfConfigError} / {GgufError} / {PluginError} as reading the config or the GGUF header does.
 */
export function modelContextLength(modelPath: string): ModelContextLength | undefined {
  const ggufPath = ggufPathOf(modelPath);
  if (ggufPath !== undefined) {
    const gguf = GgufFile.open(ggufPath);
    const arch = gguf.has('general.architecture') ? gguf.getString('general.architecture') : undefined;
    const key = `${arch}.context_length`;
    return arch !== undefined && gguf.has(key) ? { tokens: gguf.getU32(key), source: `${ggufPath} ${key}` } : undefined;
  }
  if (!fs.existsSync(nodePath.join(modelPath, 'config.json'))) return undefined;
  const raw = HfConfig.read(modelPath).raw as Record<string, unknown>;
  const text = raw.text_config as Record<string, unknown> | undefined;
  for (const [v, field] of [
    [raw.max_position_embeddings, 'max_position_embeddings'],
    [text?.max_position_embeddings, 'text_config.max_position_embeddings'],
  ] as const)
    if (Number.isSafeInteger(v) && (v as number) > 0)
      return { tokens: v as number, source: `${nodePath.join(modelPath, 'config.json')} ${field}` };
  return undefined;
}

/**
 * Refuses a server limit larger than the model's context (vLLM refuses a `--max-model-len` above the model's the
 * same way).
 * @param limit the server's limit, tokens (`scheduler.max_sequence_tokens`).
 * @throws {ContextLengthError} naming both numbers and where the model's came from.
 */
export function checkServerContextLength(limit: number, model: ModelContextLength | undefined): void {
  if (model === undefined || limit <= model.tokens) return;
  throw new ContextLengthError(
    `scheduler.max_sequence_tokens ${limit} is larger than the model's context length ${model.tokens} ` +
      `(${model.source}): set it to at most ${model.tokens}`,
  );
}

/**
 * 400 for a request past the context length, with vLLM's messages (`vllm/entrypoints/openai/serving_engine.py`):
 * the prompt alone (no room for one output token) or prompt + max_tokens.
 * @param param the field named (`prompt` / `messages` for the prompt, `max_tokens` otherwise).
 */
export function contextTooLong(
  limit: number,
  promptTokens: number,
  maxTokens: number | undefined,
  promptParam: string,
): ApiError {
  const message =
    maxTokens === undefined || promptTokens >= limit
      ? `This model's maximum context length is ${limit} tokens. However, your request has ${promptTokens} input ` +
        'tokens. Please reduce the length of the input messages.'
      : `'max_tokens' or 'max_completion_tokens' is too large: ${maxTokens}. This model's maximum context length ` +
        `is ${limit} tokens and your request has ${promptTokens} input tokens ` +
        `(${maxTokens} > ${limit} - ${promptTokens}).`;
  const param = maxTokens === undefined || promptTokens >= limit ? promptParam : 'max_tokens';
  return new ApiError(400, message, 'invalid_request_error', param, 'context_length_exceeded');
}

/**
 * The max_tokens a request runs with (vLLM's `get_max_tokens`): the request's, else the config's default capped at
 * the remaining context, else the remaining context (limit − prompt).
 * @param requested the request's max_tokens (undefined: absent).
 * @param configured the config's `sampling.max_tokens` (undefined: none).
 * @throws {ApiError} 400 {@link contextTooLong} when prompt + max_tokens exceeds `limit`, or the prompt leaves no
 *   room for one token.
 */
export function resolveMaxTokens(
  limit: number,
  promptTokens: number,
  requested: number | undefined,
  configured: number | undefined,
  promptParam: string,
): number {
  const remaining = limit - promptTokens;
  if (remaining < 1 || (requested !== undefined && requested > remaining))
    throw contextTooLong(limit, promptTokens, requested, promptParam);
  return requested ?? Math.min(remaining, configured ?? remaining);
}

/** The longest vocabulary entry of `tokenizer` in UTF-16 code units (added tokens included), at least 1. */
export function longestTokenChars(tokenizer: Tokenizer): number {
  let longest = 1;
  for (let id = 0; id < tokenizer.vocabSize; id++) {
    const t = tokenizer.idToToken(id);
    if (t !== undefined && t.length > longest) longest = t.length;
  }
  return longest;
}

/**
 * The most characters (UTF-16 code units) a prompt text may have to fit `limit` tokens: `limit × longest`. Every
 * token of the encoding covers at most `longest` code units of the (normalised) text, whether a byte-level token
 * (one code unit per byte, and UTF-8 never takes fewer bytes than UTF-16 takes units) or a SentencePiece piece
 * (`▁` for a space); a longer text needs more than `limit` tokens. A normaliser that deletes characters can make a
 * text that would fit count as too long: such a prompt is refused by its size, as documented.
 * @param longest {@link longestTokenChars} of the tokenizer.
 */
export function promptCharLimit(limit: number, longest: number): number {
  return limit * longest;
}

/**
 * 400 for a prompt text refused by its size before tokenizing ({@link promptCharLimit}), in vLLM's words.
 * @param chars the prompt's length (UTF-16 code units).
 */
export function promptTooLarge(limit: number, chars: number, maxChars: number, promptParam: string): ApiError {
  return new ApiError(
    400,
    `This model's maximum context length is ${limit} tokens. However, your request has ${chars} characters of ` +
      `input, more than ${limit} tokens can hold (at most ${maxChars}). Please reduce the length of the input ` +
      'messages.',
    'invalid_request_error',
    promptParam,
    'context_length_exceeded',
  );
}
