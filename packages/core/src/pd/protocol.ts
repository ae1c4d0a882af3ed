/**
 * The router's requests to a prefill (`POST /pd/prefill`) and a decode (`POST /pd/decode`) instance: the same
 * JSON body for both, `{request_id, room, kind, prompt_ids, bootstrap, body}` — the prompt tokenized once by
 * the router (chat template applied), the room naming the transfer, P's bootstrap address for D, and the
 * client's OpenAI request, which both parse with the aggregated server's validators (docs/ARCHITECTURE.md
 * "Prefill/decode disaggregation").
 */

import { createHash } from 'node:crypto';

import { invalidParam } from '../serve/errors.js';
import type { GenerationParams } from '../serve/protocol.js';

/** A parsed `/pd/prefill` or `/pd/decode` body. */
export interface PdRequest {
  /** The request id logged by router, P and D. */
  readonly requestId: string;
  /** The transfer's name on the control plane (unique per request). */
  readonly room: string;
  readonly kind: 'completion' | 'chat';
  /** The prompt, tokenized by the router, `[P]` token ids (P ≥ 1). */
  readonly promptIds: readonly number[];
  /** P's bootstrap address (`tcp://host:port`); required by the decode instance. */
  readonly bootstrap: string | undefined;
  /** The client's OpenAI request body. */
  readonly body: unknown;
}

/** Longest request id / room accepted (characters). */
const MAX_NAME = 200;

/** What a room must be, for the 400 that refuses one. */
export const ROOM_EXPECTED =
  `expected a non-negative integer or a non-empty string of at most ${MAX_NAME} characters without "/" ` +
  "(a pipelined prefill instance names its stages' transfers <room>/stage<k>)";

/**
 * A room's name: the router's rooms are safe integers (named by their decimal digits); any non-empty string of at
 * most 200 characters without `/` is accepted too (a stage's transfer id is `<room>/stage<k>`, pd/stages.ts, so a
 * room with a slash could collide with another room's stage). @returns undefined for anything else.
 */
export function roomName(v: unknown): string | undefined {
  if (typeof v === 'number') return Number.isSafeInteger(v) && v >= 0 ? String(v) : undefined;
  return typeof v === 'string' && v.length > 0 && v.length <= MAX_NAME && !v.includes('/') ? v : undefined;
}

/**
 * Parses a `/pd/*` body. @param role which instance parses it (`decode` needs `bootstrap`).
 * @throws {ApiError} 400 naming the bad field.
 */
export function parsePdRequest(raw: unknown, role: 'prefill' | 'decode'): PdRequest {
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw invalidParam('body', 'expected an object');
  const o = raw as Record<string, unknown>;
  const name = (field: string): string => {
    const v = o[field];
    if (typeof v !== 'string' || v.length === 0 || v.length > MAX_NAME)
      throw invalidParam(field, `expected a non-empty string of at most ${MAX_NAME} characters`);
    return v;
  };
  const requestId = name('request_id');
  const room = roomName(o.room);
  if (room === undefined) throw invalidParam('room', ROOM_EXPECTED);
  const kind = o.kind;
  if (kind !== 'completion' && kind !== 'chat') throw invalidParam('kind', "expected 'completion' or 'chat'");
  const ids = o.prompt_ids;
  if (!Array.isArray(ids) || ids.length === 0)
    throw invalidParam('prompt_ids', 'expected a non-empty array of token ids');
  for (const t of ids)
    if (!(Number.isSafeInteger(t) && (t as number) >= 0 && (t as number) < 2 ** 31))
      throw invalidParam('prompt_ids', `expected token ids (integers >= 0), got ${JSON.stringify(t)}`);
  let bootstrap: string | undefined;
  if (role === 'decode') {
    const b = o.bootstrap;
    const m = typeof b === 'string' ? /^tcp:\/\/([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5})$/.exec(b) : null;
    if (typeof b !== 'string' || m === null || !(Number(m[2]) >= 1 && Number(m[2]) <= 65535))
      throw invalidParam(
        'bootstrap',
        "expected the prefill instance's bootstrap address tcp://HOST:PORT (port 1-65535)",
      );
    bootstrap = b;
  }
  if (o.body === null || typeof o.body !== 'object' || Array.isArray(o.body))
    throw invalidParam('body', "expected the client's request object");
  return { requestId, room, kind, promptIds: ids as number[], bootstrap, body: o.body };
}

/**
 * A digest of what a request computes: its prompt ids and the parameters that decide its tokens (max_tokens,
 * sampling, the seed when the client fixed it, stop strings, ignore_eos, penalties, min_tokens, stop_token_ids,
 * logit_bias). P and D each compute it from the body
 * they received; P refuses to hand a request's state to a D whose digest differs (a router bug, or a hostile
 * client of the `/pd/*` routes, would otherwise make D continue another prompt's state). An unfixed seed is left
 * out: each side draws its own, and D continues P's stream (HandoffState).
 */
export function requestDigest(promptIds: ArrayLike<number>, p: GenerationParams): string {
  const fields = {
    prompt: Array.from(promptIds),
    maxTokens: p.maxTokens,
    temperature: p.temperature,
    topK: p.topK ?? null,
    topP: p.topP ?? null,
    seed: p.seeded ? p.seed : null,
    stop: p.stop ?? [],
    ignoreEos: p.ignoreEos ?? false,
    penalties: [p.presencePenalty ?? 0, p.frequencyPenalty ?? 0, p.repetitionPenalty ?? 1],
    minTokens: p.minTokens ?? 0,
    stopTokenIds: p.stopTokenIds ?? [],
    logitBias: [...(p.logitBias ?? [])].sort((a, b) => a[0] - b[0]),
  };
  return createHash('sha256').update(JSON.stringify(fields)).digest('hex');
}
