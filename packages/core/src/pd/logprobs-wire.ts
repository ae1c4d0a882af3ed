/**
 * Logprobs across the prefill/decode handoff. The prefill instance samples the first token, so it alone has the
 * first token's logprob (engine/logprobs.ts: the raw target distribution of the prompt's last row) and, for
 * completions' `echo` with `logprobs`, the prompt's; it sends them with the handoff state (or the `finished`
 * message of a request that ended on its first token), and the decode instance emits them as if it had computed
 * them. JSON has no infinity: a −Infinity logprob (a masked logit) travels as null.
 */

import type { TokenLogprob } from '../engine/logprobs.js';
import { PdError } from './types.js';

/** The logprobs a prefill instance sends (each present only when the request asked for it). */
export interface HandoffLogprobs {
  /** The first generated token's. */
  readonly firstLogprob?: TokenLogprob;
  /** The prompt's, `[numPromptTokens]`, null for the first prompt token. */
  readonly promptLogprobs?: readonly (TokenLogprob | null)[];
}

const wireNumber = (x: number): number | null => (Number.isFinite(x) ? x : null);

/** One token's logprob as JSON carries it (−Infinity → null). */
function toWire(lp: TokenLogprob): unknown {
  return {
    token: lp.token,
    logprob: wireNumber(lp.logprob),
    rank: lp.rank,
    top: lp.top.map((t) => ({ token: t.token, logprob: wireNumber(t.logprob) })),
  };
}

/** `lps` as JSON carries it: the fields present in `lps` only. */
export function handoffLogprobsToWire(lps: HandoffLogprobs): Record<string, unknown> {
  return {
    ...(lps.firstLogprob === undefined ? {} : { firstLogprob: toWire(lps.firstLogprob) }),
    ...(lps.promptLogprobs === undefined
      ? {}
      : { promptLogprobs: lps.promptLogprobs.map((lp) => (lp === null ? null : toWire(lp))) }),
  };
}

/**
 * One token's logprob from the peer. @param what names it in errors.
 * @throws {PdError} `'peer'` for a token outside the vocabulary, a logprob that is not ≤ 0 (or null), a bad rank
 *   or alternatives that are not such pairs.
 */
function fromWire(x: unknown, vocab: number, what: string): TokenLogprob {
  const bad = (why: string): never => {
    throw new PdError('peer', `${what}: ${why}`);
  };
  const token = (t: unknown, w: string): number =>
    Number.isSafeInteger(t) && (t as number) >= 0 && (t as number) < vocab
      ? (t as number)
      : bad(`${w}: ${JSON.stringify(t)} is not a token id (vocabulary ${vocab})`);
  const logprob = (v: unknown, w: string): number =>
    v === null ? -Infinity : typeof v === 'number' && v <= 0 ? v : bad(`${w}: expected a logprob ≤ 0 or null`);
  if (x === null || typeof x !== 'object') return bad('expected {token, logprob, rank, top}');
  const o = x as { token?: unknown; logprob?: unknown; rank?: unknown; top?: unknown };
  if (!Number.isSafeInteger(o.rank) || (o.rank as number) < 1) bad('rank: expected an integer ≥ 1');
  if (!Array.isArray(o.top) || o.top.length > vocab) return bad('top: expected a list of alternatives');
  return {
    token: token(o.token, 'token'),
    logprob: logprob(o.logprob, 'logprob'),
    rank: o.rank as number,
    top: o.top.map((t: { token?: unknown; logprob?: unknown } | null, i) => ({
      token: token(t?.token, `top[${i}].token`),
      logprob: logprob(t?.logprob, `top[${i}].logprob`),
    })),
  };
}

/**
 * The logprobs a request needs from its prefill instance's message `o` (the handoff state or a `finished` message).
 * @param want what the request asked for: the first token's logprob and / or the prompt's (`promptLength` of them).
 * @throws {PdError} `'peer'` naming the field when one the request needs is missing or malformed.
 */
export function handoffLogprobsFromWire(
  o: { firstLogprob?: unknown; promptLogprobs?: unknown },
  want: { readonly first: boolean; readonly prompt: boolean },
  vocab: number,
  promptLength: number,
  what: string,
): HandoffLogprobs {
  let firstLogprob: TokenLogprob | undefined;
  let promptLogprobs: (TokenLogprob | null)[] | undefined;
  if (want.first) {
    if (o.firstLogprob === undefined)
      throw new PdError('peer', `${what}.firstLogprob: missing (the request asks for logprobs)`);
    firstLogprob = fromWire(o.firstLogprob, vocab, `${what}.firstLogprob`);
  }
  if (want.prompt) {
    const p = o.promptLogprobs;
    if (!Array.isArray(p) || p.length !== promptLength)
      throw new PdError(
        'peer',
        `${what}.promptLogprobs: expected ${promptLength} entries (the request echoes its prompt with logprobs)`,
      );
    promptLogprobs = p.map((x, i) =>
      i === 0 && x === null ? null : fromWire(x, vocab, `${what}.promptLogprobs[${i}]`),
    );
  }
  return {
    ...(firstLogprob === undefined ? {} : { firstLogprob }),
    ...(promptLogprobs === undefined ? {} : { promptLogprobs }),
  };
}
