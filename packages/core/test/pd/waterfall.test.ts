// The TTFT waterfall's parts as they cross processes (pd/waterfall.ts): P's from its /pd/prefill answer, D's from
// its header; anything malformed (a negative or non-finite duration, a fractional byte count, bad JSON) is refused
// rather than exported, and the assembled waterfall keeps the phases in order, rounded to µs.
import { describe, expect, it } from 'vitest';

import {
  assembleWaterfall,
  parseDecodeTimings,
  parsePrefillTimings,
  WATERFALL_PHASES,
} from '../../dist/pd/waterfall.js';

const P = {
  prefill_queue_ms: 0.25,
  prefill_forward_ms: 61.5,
  bootstrap_ms: 0.1,
  payload_bytes: { target_kv: 122880, linear_state: 448512, draft_context: 294912 },
  descriptors: 20,
};
const D = { transfer_wait_ms: 1.93, decode_queue_ms: 0.4, decode_first_step_ms: 0.05, reserve_ms: 4.4 };

describe('waterfall parts', () => {
  it("parses P's part, filling absent payload classes and overlapped bytes with 0", () => {
    expect(parsePrefillTimings(P)).toEqual({ ...P, overlapped_bytes: 0 });
    expect(parsePrefillTimings({ ...P, overlapped_bytes: 4096 })?.overlapped_bytes).toBe(4096);
    const none = parsePrefillTimings({ ...P, payload_bytes: {}, descriptors: 0 });
    expect(none?.payload_bytes).toEqual({ target_kv: 0, linear_state: 0, draft_context: 0 });
  });

  it('refuses a malformed P part', () => {
    for (const bad of [
      undefined,
      null,
      'x',
      { ...P, prefill_queue_ms: -1 },
      { ...P, prefill_forward_ms: Number.NaN },
      { ...P, bootstrap_ms: '1' },
      { ...P, descriptors: 1.5 },
      { ...P, overlapped_bytes: -1 },
      { ...P, payload_bytes: { target_kv: -4 } },
      { ...P, payload_bytes: null },
    ])
      expect(parsePrefillTimings(bad), JSON.stringify(bad)).toBeUndefined();
  });

  it("parses D's header and refuses a malformed one", () => {
    expect(parseDecodeTimings(JSON.stringify(D))).toEqual(D);
    expect(parseDecodeTimings(JSON.stringify({ ...D, reserve_ms: undefined }))?.reserve_ms).toBe(0);
    for (const bad of [null, '', '{', 'null', JSON.stringify({ ...D, transfer_wait_ms: -0.5 })])
      expect(parseDecodeTimings(bad), String(bad)).toBeUndefined();
  });

  it('assembles the phases in order, rounded to µs', () => {
    const w = assembleWaterfall('r-1', 2.5461234, 102.8889, P, D);
    expect(Object.keys(w.phases_ms)).toEqual([...WATERFALL_PHASES]);
    expect(w.phases_ms.router).toBe(2.546);
    expect(w.ttft_ms).toBe(102.889);
    expect(w.phases_ms.transfer_wait).toBe(1.93);
    expect(w.payload_bytes).toEqual(P.payload_bytes);
    expect(w.descriptors).toBe(20);
    expect(w.decode_reserve_ms).toBe(4.4);
  });
});
