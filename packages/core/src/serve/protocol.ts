/**
 * OpenAI request parsing for /v1/completions and /v1/chat/completions: each field checked, the
 * first bad one answered as a 400 naming it. Fields specd does not use (user, …) are
 * ignored; `n` > 1 and `best_of` > 1 are refused. `logprobs` (completions: 0–5 alternatives; chat: `logprobs: true`
 * and `top_logprobs` 0–20) and completions' `echo` are served (serve/logprobs.ts); chat's `echo` is refused.
 * Sampling fields, checked as vLLM's `SamplingParams` (engine/sampling-params.ts): `temperature` a finite number
 * in [0, 2], below 1e-5 greedy (then top_p and top_k are off); `top_p` in (0, 1]; `top_k` an integer, −1 or 0 off,
 * else ≥ 1; `seed` an integer in [−(2^53 − 1), 2^53 − 1], −1 meaning none (the PRNG takes it mod 2^32);
 * `presence_penalty` and `frequency_penalty` in [−2, 2] and `repetition_penalty` finite > 0; `min_tokens` an integer
 * ≥ 0 and ≤ max_tokens; `stop_token_ids` token ids; `logit_bias` an object of token id → number in [−100, 100] (ids
 * against the vocabulary: the server, {@link logitsProblem}). Applied by the engine (engine/logits-processors.ts).
 */

import { MAX_TEMPERATURE, normalizeSampling, SAMPLING_EPS } from '../engine/sampling-params.js';
import type { SamplingParams } from '../engine/types.js';
import type { ChatMessage } from './chat-template.js';
import { invalidParam } from './errors.js';

/** The largest seed magnitude accepted (2^53 − 1: JSON numbers are exact up to it); the PRNG uses seed mod 2^32. */
export const MAX_SEED = Number.MAX_SAFE_INTEGER;

/** Sampling defaults (the config's `sampling`). */
export interface SamplingDefaults {
  readonly temperature: number;
  readonly top_p: number;
  readonly top_k: number;
  /** For requests without max_tokens, capped at the remaining context; absent: the remaining context (limits.ts). */
  readonly max_tokens?: number;
  readonly seed?: number;
}

/** The request fields both endpoints share, checked. */
export interface GenerationParams {
  readonly model: string;
  /** The request's max_tokens (chat: max_completion_tokens first); undefined when absent (limits.ts resolves it). */
  readonly maxTokens: number | undefined;
  readonly temperature: number;
  readonly topP: number;
  readonly topK: number;
  readonly seed: number;
  /**
   * The seed was fixed (the body's `seed`, or the config's default): reproducible sampling (SpecRequest.seeded,
   * engine/engine.ts).
   */
  readonly seeded: boolean;
  readonly stop: readonly string[];
  readonly stream: boolean;
  readonly includeUsage: boolean;
  readonly ignoreEos: boolean;
  /** vLLM's `return_token_ids`: a non-streamed choice carries `token_ids` (the generated ids). */
  readonly returnTokenIds: boolean;
  /**
   * Logprobs asked for, as alternatives per token (completions: `logprobs`, 0–5; chat: `top_logprobs`, 0–20, with
   * `logprobs: true`); absent: no logprobs (the choice's `logprobs` is null).
   */
  readonly logprobs?: number;
  /** Completions' `echo`: the prompt text comes before the completion (with `logprobs`, the prompt's logprobs). */
  readonly echo?: boolean;
  /** vLLM `presence_penalty`, `frequency_penalty` (undefined: 0) and `repetition_penalty` (undefined: 1). */
  readonly presencePenalty?: number;
  readonly frequencyPenalty?: number;
  readonly repetitionPenalty?: number;
  /** vLLM `min_tokens` (undefined: 0). */
  readonly minTokens?: number;
  /** vLLM `stop_token_ids`: ids that end the request with finish reason `stop` (the id's text is not returned). */
  readonly stopTokenIds?: readonly number[];
  /** OpenAI `logit_bias`: token id → bias in [−100, 100]. */
  readonly logitBias?: ReadonlyMap<number, number>;
}

/** The most alternatives /v1/completions' `logprobs` may ask for (OpenAI's bound). */
export const MAX_COMPLETION_LOGPROBS = 5;

/** The most alternatives /v1/chat/completions' `top_logprobs` may ask for (OpenAI's bound). */
export const MAX_CHAT_TOP_LOGPROBS = 20;

/** Completions' `logprobs` (an integer 0–5; null or false: none) and `echo`. @throws {ApiError} 400 naming it. */
function completionLogprobs(b: Body): { logprobs?: number; echo: boolean } {
  const echo = bool(b, 'echo') ?? false;
  if (b.logprobs === false) return { echo };
  const n = num(
    b,
    'logprobs',
    (v) => v >= 0 && v <= MAX_COMPLETION_LOGPROBS,
    `an integer in [0, ${MAX_COMPLETION_LOGPROBS}] (alternatives per token) or null`,
    true,
  );
  return n === undefined ? { echo } : { logprobs: n, echo };
}

/** Chat's `logprobs` (true / false / null) and `top_logprobs` (0–20, needs `logprobs: true`); `echo` is refused. */
function chatLogprobs(b: Body): { logprobs?: number } {
  if (b.echo !== undefined && b.echo !== null && b.echo !== false)
    throw invalidParam('echo', 'not supported on /v1/chat/completions');
  const on = bool(b, 'logprobs') ?? false;
  const top = num(
    b,
    'top_logprobs',
    (v) => v >= 0 && v <= MAX_CHAT_TOP_LOGPROBS,
    `an integer in [0, ${MAX_CHAT_TOP_LOGPROBS}]`,
    true,
  );
  if (top !== undefined && !on) throw invalidParam('top_logprobs', 'needs logprobs: true');
  return on ? { logprobs: top ?? 0 } : {};
}

/** A checked completion request. */
export interface CompletionRequest extends GenerationParams {
  /** Text, or token ids. */
  readonly prompt: string | readonly number[];
}

/** A checked chat request. */
export interface ChatRequest extends GenerationParams {
  readonly messages: readonly ChatMessage[];
}

type Body = Record<string, unknown>;

function asBody(body: unknown): Body {
  if (body === null || typeof body !== 'object' || Array.isArray(body))
    throw invalidParam('body', 'expected a JSON object');
  return body as Body;
}

function num(
  b: Body,
  key: string,
  check: (v: number) => boolean,
  expected: string,
  integer = false,
): number | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isFinite(v) || (integer && !Number.isSafeInteger(v)) || !check(v)) {
    throw invalidParam(key, `expected ${expected}, got ${JSON.stringify(v)}`);
  }
  return v;
}

function bool(b: Body, key: string): boolean | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw invalidParam(key, `expected true or false, got ${JSON.stringify(v)}`);
  return v;
}

function common(b: Body, defaults: SamplingDefaults, maxTokensKeys: readonly string[]): GenerationParams {
  const model = b.model;
  if (model === undefined || model === null)
    throw invalidParam('model', 'missing (the served model id, as GET /v1/models lists it)');
  if (typeof model !== 'string' || model === '')
    throw invalidParam('model', `expected a model id, got ${JSON.stringify(model)}`);
  let maxTokens: number | undefined;
  for (const k of maxTokensKeys) maxTokens ??= num(b, k, (v) => v >= 1, 'an integer >= 1', true);
  const temperature = num(
    b,
    'temperature',
    (v) => v >= 0 && v <= MAX_TEMPERATURE,
    `a number in [0, ${MAX_TEMPERATURE}] (below ${SAMPLING_EPS}: greedy)`,
  );
  const topP = num(b, 'top_p', (v) => v > 0 && v <= 1, 'a number in (0, 1]');
  const topK = num(b, 'top_k', (v) => v >= -1, 'an integer, -1 or 0 (off) or >= 1', true);
  const seed = num(
    b,
    'seed',
    (v) => Math.abs(v) <= MAX_SEED,
    `an integer in [-${MAX_SEED}, ${MAX_SEED}] (-1: none)`,
    true,
  );
  const [presencePenalty, frequencyPenalty] = ['presence_penalty', 'frequency_penalty'].map((key) =>
    num(b, key, (v) => v >= -2 && v <= 2, 'a number in [-2, 2]'),
  );
  const repetitionPenalty = num(b, 'repetition_penalty', (v) => v > 0, 'a finite number > 0');
  const minTokens = num(b, 'min_tokens', (v) => v >= 0, 'an integer >= 0', true);
  if (minTokens !== undefined && maxTokens !== undefined && minTokens > maxTokens)
    throw invalidParam('min_tokens', `expected at most max_tokens (${maxTokens}), got ${minTokens}`);
  const stopTokenIds = tokenIds(b, 'stop_token_ids');
  const logitBias = biasMap(b);
  num(b, 'n', (v) => v === 1, '1 (one choice per request)', true);
  if (b.best_of !== undefined && b.best_of !== null && b.best_of !== 1)
    throw invalidParam('best_of', 'only 1 is supported');
  let stop: string[] = [];
  const s = b.stop;
  if (typeof s === 'string') stop = s === '' ? [] : [s];
  else if (Array.isArray(s)) {
    if (s.length > 4 || s.some((x) => typeof x !== 'string' || x === ''))
      throw invalidParam('stop', 'expected a string or up to 4 non-empty strings');
    stop = s as string[];
  } else if (s !== undefined && s !== null)
    throw invalidParam('stop', `expected a string or an array of strings, got ${JSON.stringify(s)}`);
  const stream = bool(b, 'stream') ?? false;
  const so = b.stream_options;
  if (so !== undefined && so !== null && (typeof so !== 'object' || Array.isArray(so)))
    throw invalidParam('stream_options', 'expected an object');
  const includeUsage = so !== undefined && so !== null && (so as Body).include_usage === true;
  const defaultSeed = defaults.seed ?? (Math.random() * 2 ** 32) >>> 0;
  const seedOf = seed === -1 ? undefined : seed; // vLLM: -1 is no seed
  const sampling = normalizeSampling({
    temperature: temperature ?? defaults.temperature,
    topP: topP ?? defaults.top_p,
    topK: topK === undefined ? defaults.top_k : Math.max(0, topK),
  });
  return {
    model,
    maxTokens,
    temperature: sampling.temperature,
    topP: sampling.topP ?? 1,
    topK: sampling.topK ?? 0,
    seed: seedOf === undefined ? defaultSeed : seedOf >>> 0,
    seeded: seedOf !== undefined || defaults.seed !== undefined,
    stop,
    stream,
    includeUsage,
    ignoreEos: bool(b, 'ignore_eos') ?? false,
    returnTokenIds: bool(b, 'return_token_ids') ?? false,
    ...(presencePenalty === undefined ? {} : { presencePenalty }),
    ...(frequencyPenalty === undefined ? {} : { frequencyPenalty }),
    ...(repetitionPenalty === undefined ? {} : { repetitionPenalty }),
    ...(minTokens === undefined ? {} : { minTokens }),
    ...(stopTokenIds === undefined ? {} : { stopTokenIds }),
    ...(logitBias === undefined ? {} : { logitBias }),
  };
}

/** `b[key]` as an array of token ids (integers ≥ 0), or undefined when absent. @throws {ApiError} 400 naming key. */
function tokenIds(b: Body, key: string): number[] | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || v.some((x) => !(Number.isSafeInteger(x) && (x as number) >= 0)))
    throw invalidParam(key, `expected an array of token ids (integers >= 0), got ${JSON.stringify(v).slice(0, 80)}`);
  return v as number[];
}

/**
 * `logit_bias` (OpenAI: an object of token id → bias in [−100, 100]) as a map, or undefined when absent or empty.
 * @throws {ApiError} 400 naming `logit_bias` for a key that is not a token id or a bias out of range.
 */
function biasMap(b: Body): ReadonlyMap<number, number> | undefined {
  const v = b.logit_bias;
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'object' || Array.isArray(v))
    throw invalidParam('logit_bias', 'expected an object of token id -> bias in [-100, 100]');
  const out = new Map<number, number>();
  for (const [key, bias] of Object.entries(v as Body)) {
    const id = Number(key);
    if (!(/^\d+$/.test(key) && Number.isSafeInteger(id)))
      throw invalidParam('logit_bias', `expected token ids as keys, got ${JSON.stringify(key).slice(0, 40)}`);
    if (typeof bias !== 'number' || !(bias >= -100 && bias <= 100))
      throw invalidParam('logit_bias', `the bias of token ${id}: expected a number in [-100, 100], got ${bias}`);
    out.set(id, bias);
  }
  return out.size === 0 ? undefined : out;
}

/**
 * The engine's sampling of checked parameters: temperature, top-k, top-p and the logits processors
 * (engine/logits-processors.ts), the neutral ones left out.
 */
export function samplingOf(p: GenerationParams): SamplingParams {
  return {
    temperature: p.temperature,
    topK: p.topK,
    topP: p.topP,
    ...(p.presencePenalty === undefined ? {} : { presencePenalty: p.presencePenalty }),
    ...(p.frequencyPenalty === undefined ? {} : { frequencyPenalty: p.frequencyPenalty }),
    ...(p.repetitionPenalty === undefined ? {} : { repetitionPenalty: p.repetitionPenalty }),
    ...(p.minTokens === undefined ? {} : { minTokens: p.minTokens }),
    ...(p.logitBias === undefined ? {} : { logitBias: p.logitBias }),
  };
}

/**
 * The first token id of `p` (logit_bias, stop_token_ids) outside a vocabulary of `vocab` tokens, as the field and a
 * message naming the id, or undefined.
 */
export function logitsProblem(p: GenerationParams, vocab: number): { field: string; message: string } | undefined {
  const outside = (id: number): string => `token id ${id} is outside the vocabulary (size ${vocab})`;
  for (const id of p.logitBias?.keys() ?? []) if (id >= vocab) return { field: 'logit_bias', message: outside(id) };
  for (const id of p.stopTokenIds ?? []) if (id >= vocab) return { field: 'stop_token_ids', message: outside(id) };
  return undefined;
}

/** Checks a /v1/completions body. @throws {ApiError} 400 naming the field. */
export function parseCompletionRequest(body: unknown, defaults: SamplingDefaults): CompletionRequest {
  const b = asBody(body);
  const p = b.prompt;
  let prompt: string | readonly number[];
  if (typeof p === 'string') prompt = p;
  else if (Array.isArray(p) && p.length === 1 && typeof p[0] === 'string') prompt = p[0] as string;
  else if (Array.isArray(p) && p.length > 0 && p.every((x) => Number.isSafeInteger(x) && (x as number) >= 0))
    prompt = p as number[];
  else if (
    Array.isArray(p) &&
    p.length === 1 &&
    Array.isArray(p[0]) &&
    (p[0] as unknown[]).every((x) => Number.isSafeInteger(x) && (x as number) >= 0)
  )
    prompt = p[0] as number[];
  else throw invalidParam('prompt', 'expected a string, or an array of token ids (one prompt per request)');
  if (b.suffix !== undefined && b.suffix !== null) throw invalidParam('suffix', 'not supported');
  return { ...common(b, defaults, ['max_tokens']), ...completionLogprobs(b), prompt };
}

/** Checks a /v1/chat/completions body. @throws {ApiError} 400 naming the field. */
export function parseChatRequest(body: unknown, defaults: SamplingDefaults): ChatRequest {
  const b = asBody(body);
  const msgs = b.messages;
  if (!Array.isArray(msgs) || msgs.length === 0)
    throw invalidParam('messages', 'expected a non-empty array of messages');
  const messages: ChatMessage[] = msgs.map((m: unknown, i) => {
    if (m === null || typeof m !== 'object') throw invalidParam(`messages[${i}]`, 'expected an object {role, content}');
    const { role, content } = m as Body;
    if (role !== 'system' && role !== 'user' && role !== 'assistant' && role !== 'developer') {
      throw invalidParam(
        `messages[${i}].role`,
        `expected "system", "developer", "user" or "assistant", got ${JSON.stringify(role)}`,
      );
    }
    let text: string;
    if (typeof content === 'string') text = content;
    else if (
      Array.isArray(content) &&
      content.every(
        (c) =>
          c !== null && typeof c === 'object' && (c as Body).type === 'text' && typeof (c as Body).text === 'string',
      )
    ) {
      text = content.map((c) => (c as Body).text as string).join('');
    } else throw invalidParam(`messages[${i}].content`, 'expected a string or an array of {type: "text", text} parts');
    return { role: role === 'developer' ? 'system' : role, content: text };
  });
  return { ...common(b, defaults, ['max_completion_tokens', 'max_tokens']), ...chatLogprobs(b), messages };
}
