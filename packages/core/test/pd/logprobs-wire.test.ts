// Logprobs across the handoff (pd/logprobs-wire.ts): what P sends survives JSON exactly (−Infinity included), and a
// decode instance refuses a missing or malformed field the request needs, naming it.
import { describe, expect, it } from 'vitest';

import { type TokenLogprob, tokenLogprob } from '../../src/engine/logprobs.js';
import { handoffLogprobsFromWire, handoffLogprobsToWire } from '../../src/pd/logprobs-wire.js';
import { PdError } from '../../src/pd/types.js';

const V = 50;
const row = Float32Array.from({ length: V }, (_, i) => Math.sin(i * 1.7) * 4);
row[7] = -Infinity; // a masked logit
const lp = (t: number, n = 3): TokenLogprob => tokenLogprob(row, t, n);
const roundTrip = (x: unknown): { firstLogprob?: unknown; promptLogprobs?: unknown } => JSON.parse(JSON.stringify(x));

/** The PdError message of `f`. @throws {Error} when f does not throw a PdError. */
function refusal(f: () => unknown): string {
  try {
    f();
  } catch (err) {
    if (err instanceof PdError) return err.message;
    throw err;
  }
  throw new Error('expected a PdError');
}

describe('handoff logprobs on the wire', () => {
  it('round-trips through JSON exactly, a −Infinity logprob included', () => {
    const sent = { firstLogprob: lp(7, 5), promptLogprobs: [null, lp(3), lp(7, 0)] };
    expect(sent.firstLogprob.logprob).toBe(-Infinity);
    const wire = roundTrip(handoffLogprobsToWire(sent));
    const got = handoffLogprobsFromWire(wire, { first: true, prompt: true }, V, 3, 'state');
    expect(got).toEqual(sent);
    // only what the request asked for
    expect(handoffLogprobsFromWire(wire, { first: false, prompt: false }, V, 3, 'state')).toEqual({});
    expect(handoffLogprobsToWire({})).toEqual({});
  });

  it('refuses what the request needs when missing or malformed, naming the field', () => {
    const want = { first: true, prompt: true };
    const good = roundTrip(handoffLogprobsToWire({ firstLogprob: lp(1), promptLogprobs: [null, lp(2)] })) as {
      firstLogprob: Record<string, unknown>;
      promptLogprobs: unknown[];
    };
    const cases: [unknown, string][] = [
      [{ promptLogprobs: good.promptLogprobs }, 'state.firstLogprob: missing'],
      [{ ...good, promptLogprobs: [null] }, 'state.promptLogprobs: expected 2 entries'],
      [
        { ...good, firstLogprob: { ...good.firstLogprob, token: V } },
        'state.firstLogprob: token: 50 is not a token id',
      ],
      [{ ...good, firstLogprob: { ...good.firstLogprob, logprob: 0.5 } }, 'state.firstLogprob: logprob: expected'],
      [{ ...good, firstLogprob: { ...good.firstLogprob, rank: 0 } }, 'state.firstLogprob: rank'],
      [{ ...good, firstLogprob: { ...good.firstLogprob, top: [{ token: -1, logprob: 0 }] } }, 'top[0].token'],
      [{ ...good, promptLogprobs: [null, 'x'] }, 'state.promptLogprobs[1]: expected {token'],
    ];
    for (const [wire, message] of cases)
      expect(refusal(() => handoffLogprobsFromWire(wire as never, want, V, 2, 'state'))).toContain(message);
  });
});
