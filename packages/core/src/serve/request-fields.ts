/**
 * The request fields around the sampling parameters (protocol.ts parses those), for /v1/completions and
 * /v1/chat/completions, checked before any work:
 * - fields that would change the output and are not implemented are refused with a 400 naming the field:
 *   `response_format` other than `{"type": "text"}`, `tools` (a non-empty list), `tool_choice` other than "none" /
 *   "auto", `functions` (a non-empty list), `function_call` other than "none" / "auto", `best_of` other than n (vLLM
 *   returns the n best of best_of samples), `suffix`, `min_p` other than 0, vLLM's `prompt_logprobs` (completions'
 *   `echo` with `logprobs` returns the prompt's logprobs), and vLLM's `guided_*` and `structured_outputs`;
 * - metadata-only fields are accepted as no-ops ({@link METADATA_FIELDS}: `user`, `metadata`, `store`,
 *   `service_tier`, `parallel_tool_calls` without tools);
 * - any other field no endpoint knows is logged once per name and server ({@link UnknownFieldLog}), then ignored;
 * - `n` (choices per prompt, 1 to {@link MAX_CHOICES}) and, for completions, a list of prompts
 *   ({@link completionPrompts}) are read here: the server runs each (prompt, choice) as its own sequence
 *   (choices.ts), choice index = prompt index × n + j, as OpenAI.
 */

import { invalidParam } from './errors.js';

/** The most choices per prompt (`n`); a request runs prompts × n sequences, each also bounded by admission. */
export const MAX_CHOICES = 128;

/** Fields that carry metadata only: accepted and ignored (documented no-ops). */
export const METADATA_FIELDS: readonly string[] = ['user', 'metadata', 'store', 'service_tier', 'parallel_tool_calls'];

/** Fields both endpoints parse (protocol.ts and the other helpers' fields: logprobs, penalties, …). */
const SHARED_FIELDS = [
  'model',
  'max_tokens',
  'temperature',
  'top_p',
  'top_k',
  'min_p',
  'n',
  'best_of',
  'seed',
  'stop',
  'stream',
  'stream_options',
  'logprobs',
  'prompt_logprobs',
  'presence_penalty',
  'frequency_penalty',
  'repetition_penalty',
  'logit_bias',
  'min_tokens',
  'stop_token_ids',
  'ignore_eos',
  'return_token_ids',
  'response_format',
  'structured_outputs',
  ...METADATA_FIELDS,
];

/** The fields each endpoint knows (besides `guided_*`, refused by prefix). */
const KNOWN_FIELDS: Readonly<Record<RequestEndpoint, ReadonlySet<string>>> = {
  completion: new Set([...SHARED_FIELDS, 'prompt', 'echo', 'suffix']),
  chat: new Set([
    ...SHARED_FIELDS,
    'messages',
    'max_completion_tokens',
    'top_logprobs',
    'tools',
    'tool_choice',
    'functions',
    'function_call',
  ]),
};

/** The endpoint a body was sent to. */
export type RequestEndpoint = 'completion' | 'chat';

type Body = Record<string, unknown>;

const present = (v: unknown): boolean => v !== undefined && v !== null;

/** Logs each unknown request field once per name (pino's `warn`), then stays quiet about it. */
export class UnknownFieldLog {
  private readonly seen = new Set<string>();
  /** @param warn where a first sighting goes (e.g. `(o, msg) => logger.warn(o, msg)`); absent: nowhere. */
  constructor(private readonly warn?: (fields: { field: string; endpoint: string }, message: string) => void) {}

  /** Field names logged so far. */
  get logged(): readonly string[] {
    return [...this.seen];
  }

  /** Logs `field` unless it was logged before. */
  note(field: string, endpoint: RequestEndpoint): void {
    if (this.seen.has(field)) return;
    this.seen.add(field);
    this.warn?.({ field, endpoint }, `unknown request field "${field}" ignored (logged once)`);
  }
}

/** The `n` of a body: an integer in [1, {@link MAX_CHOICES}], 1 when absent. @throws {ApiError} 400 naming `n`. */
export function choiceCount(b: Body): number {
  const n = b.n;
  if (!present(n)) return 1;
  if (typeof n !== 'number' || !Number.isSafeInteger(n) || n < 1 || n > MAX_CHOICES)
    throw invalidParam('n', `expected an integer in [1, ${MAX_CHOICES}], got ${JSON.stringify(n)}`);
  return n;
}

/**
 * Checks the fields of a /v1/completions or /v1/chat/completions body other than the sampling parameters:
 * refuses what is not implemented and would change the output, notes unknown fields in `unknown`.
 * A body that is not an object is left to protocol.ts (its 400 names `body`).
 * @returns the body's `n` ({@link choiceCount}).
 * @throws {ApiError} 400 naming the first refused field.
 */
export function checkRequestFields(body: unknown, endpoint: RequestEndpoint, unknown?: UnknownFieldLog): number {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return 1;
  const b = body as Body;
  const n = choiceCount(b);
  const rf = b.response_format;
  if (present(rf) && (typeof rf !== 'object' || (rf as Body).type !== 'text'))
    throw invalidParam(
      'response_format',
      `only {"type": "text"} is supported (structured output is not implemented), got ${JSON.stringify(rf)}`,
    );
  for (const key of ['tools', 'functions']) {
    const v = b[key];
    if (present(v) && !(Array.isArray(v) && v.length === 0))
      throw invalidParam(key, 'tool and function calling are not implemented');
  }
  for (const key of ['tool_choice', 'function_call']) {
    const v = b[key];
    if (present(v) && v !== 'none' && v !== 'auto')
      throw invalidParam(key, `only "none" or "auto" (no tools) is supported, got ${JSON.stringify(v)}`);
  }
  const bestOf = b.best_of;
  if (present(bestOf) && bestOf !== n)
    throw invalidParam(
      'best_of',
      `only best_of = n (${n}) is supported (returning the best n of more samples is not implemented), got ` +
        JSON.stringify(bestOf),
    );
  if (present(b.suffix)) throw invalidParam('suffix', 'not supported (no insertion / fill-in-the-middle)');
  if (present(b.min_p) && b.min_p !== 0) throw invalidParam('min_p', 'only 0 (off) is supported');
  if (present(b.structured_outputs)) throw invalidParam('structured_outputs', 'guided decoding is not implemented');
  if (present(b.prompt_logprobs))
    throw invalidParam(
      'prompt_logprobs',
      "not supported (completions' echo with logprobs returns the prompt's logprobs)",
    );
  const known = KNOWN_FIELDS[endpoint];
  for (const [key, v] of Object.entries(b)) {
    if (key.startsWith('guided_')) {
      if (present(v)) throw invalidParam(key, 'guided decoding is not implemented');
    } else if (!known.has(key)) unknown?.note(key, endpoint);
  }
  return n;
}

/**
 * The prompts of a /v1/completions body, one per choice group: a string, a list of strings, a list of token ids
 * (one prompt) or a list of lists of token ids, as OpenAI. Anything else is returned as a one-element list, for
 * protocol.ts to refuse naming `prompt`.
 * @throws {ApiError} 400 naming `prompt` for an empty list or a list that mixes strings and token-id lists.
 */
export function completionPrompts(b: Body): readonly unknown[] {
  const p = b.prompt;
  if (!Array.isArray(p) || p.length === 0 || typeof p[0] === 'number') return [p];
  if (p.every((x) => typeof x === 'string') || p.every((x) => Array.isArray(x))) return p;
  throw invalidParam('prompt', 'expected a list of strings or a list of token-id lists, not a mix');
}
