/**
 * The TTFT waterfall of a disaggregated request (issue 17 "Measure"; the production report's breakdown):
 *
 *   TTFT = router + prefill queue + prefill forward + bootstrap + transfer wait + decode queue + decode first step
 *
 * Each phase is an interval measured with `performance.now()` (monotonic, ms) on the host where it happens, and the
 * phases are disjoint in time, so their sum is at most the TTFT the router measures (the gaps are network hops and
 * HTTP plumbing). Only durations cross processes, never timestamps (P, D and the router may be separate hosts with
 * unrelated clocks):
 * - router (router): the request's arrival to the P and D requests sent (parse, checks, tokenization, pick);
 * - prefill queue (P): `/pd/prefill` reached the prefill role to the forward of its first prefill chunk;
 * - prefill forward (P): that forward's start to the handoff (the first token sampled, the draft context written);
 * - bootstrap (P): the handoff to P starting its write (waiting for D's layout, pairing the entries); P then tells D
 *   on the control plane (`sending`);
 * - transfer wait (D): P's `sending` arrived to the state arrived (every write and the notification applied);
 * - decode queue (D): the state arrived to its resume (manifest and checksums checked, response headers readied);
 * - decode first step (D): the resume to the first token handed to the response (P sampled it; D emits it on resume).
 * The router measures the TTFT itself: arrival to the first byte of D's answer (a non-streamed answer's first byte
 * is its whole body). D's wait for a free sequence (`reserve_ms`) runs while P prefills and shows in P's bootstrap
 * when it delays the layout: it is reported, not summed.
 *
 * Where each side returns its part: P in its `/pd/prefill` answer (`waterfall`), D in the header
 * {@link DECODE_TIMINGS_HEADER} of its `/pd/decode` answer; the router assembles the request's {@link Waterfall},
 * exports it (`specd_router_waterfall_seconds{phase}`, docs/METRICS.md), logs it at debug level and serves it at
 * `GET /pd/waterfall/<request id>` (the OpenAI answer is unchanged).
 */

import type { PdPayloadClass } from './types.js';

/** The waterfall's phases, in order. */
export const WATERFALL_PHASES = [
  'router',
  'prefill_queue',
  'prefill_forward',
  'bootstrap',
  'transfer_wait',
  'decode_queue',
  'decode_first_step',
] as const;

export type WaterfallPhase = (typeof WATERFALL_PHASES)[number];

/** The payload classes, in report order. */
export const PAYLOAD_CLASSES: readonly PdPayloadClass[] = ['target_kv', 'linear_state', 'draft_context'];

/** Histogram buckets of the phases, seconds (100 µs to 30 s: a decode first step is sub-millisecond). */
export const PHASE_BUCKETS_S = [
  0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
];

/** P's part of a request's waterfall (the `waterfall` field of its `/pd/prefill` answer). All ms. */
export interface PrefillTimings {
  readonly prefill_queue_ms: number;
  readonly prefill_forward_ms: number;
  readonly bootstrap_ms: number;
  /** Bytes sent by payload class (the manifest rows' lengths; 0 for a class not sent). */
  readonly payload_bytes: Readonly<Record<PdPayloadClass, number>>;
  /** Descriptors of P's write after coalescing (TransferStats.descriptors; pipeline stages' own writes excluded). */
  readonly descriptors: number;
  /** Bytes of the payload sent while the prompt prefilled (pd/overlap.ts; 0 without overlap). */
  readonly overlapped_bytes?: number;
}

/** D's part of a request's waterfall (the {@link DECODE_TIMINGS_HEADER} header of its answer). All ms. */
export interface DecodeTimings {
  readonly transfer_wait_ms: number;
  readonly decode_queue_ms: number;
  readonly decode_first_step_ms: number;
  /** Waiting for a free sequence before the layout was sent (overlaps P's forward: not a waterfall phase). */
  readonly reserve_ms: number;
}

/** The header of D's `/pd/decode` answer carrying its {@link DecodeTimings} (JSON). */
export const DECODE_TIMINGS_HEADER = 'x-specd-pd-timings';

/** A request's whole waterfall, as the router assembles it. */
export interface Waterfall {
  readonly request_id: string;
  /** Arrival at the router to the first byte of D's answer, on the router's clock (ms). */
  readonly ttft_ms: number;
  readonly phases_ms: Readonly<Record<WaterfallPhase, number>>;
  readonly payload_bytes: Readonly<Record<PdPayloadClass, number>>;
  readonly descriptors: number;
  /** Bytes of the payload P sent while it prefilled (pd/overlap.ts); the transfer wait covers the rest. */
  readonly overlapped_bytes: number;
  /** D's wait for a free sequence (ms; see {@link DecodeTimings.reserve_ms}). */
  readonly decode_reserve_ms: number;
}

const isMs = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v) && v >= 0;

/** P's timings from its `/pd/prefill` answer; undefined when absent or malformed (an older P). */
export function parsePrefillTimings(v: unknown): PrefillTimings | undefined {
  const o = v as Partial<PrefillTimings> | null | undefined;
  if (o === null || typeof o !== 'object') return undefined;
  if (!isMs(o.prefill_queue_ms) || !isMs(o.prefill_forward_ms) || !isMs(o.bootstrap_ms)) return undefined;
  if (!Number.isSafeInteger(o.descriptors) || (o.descriptors as number) < 0) return undefined;
  const overlapped = o.overlapped_bytes ?? 0;
  if (!Number.isSafeInteger(overlapped) || overlapped < 0) return undefined;
  const b = o.payload_bytes as Record<string, unknown> | undefined;
  if (b === null || typeof b !== 'object') return undefined;
  const payload = {} as Record<PdPayloadClass, number>;
  for (const c of PAYLOAD_CLASSES) {
    const n = b[c] ?? 0;
    if (!Number.isSafeInteger(n) || (n as number) < 0) return undefined;
    payload[c] = n as number;
  }
  return { ...(o as PrefillTimings), payload_bytes: payload, overlapped_bytes: overlapped };
}

/** D's timings from its answer's header; undefined when absent or malformed. */
export function parseDecodeTimings(header: string | null): DecodeTimings | undefined {
  if (header === null) return undefined;
  let o: Partial<DecodeTimings>;
  try {
    o = JSON.parse(header) as Partial<DecodeTimings>;
  } catch {
    return undefined;
  }
  if (o === null || typeof o !== 'object') return undefined;
  if (!isMs(o.transfer_wait_ms) || !isMs(o.decode_queue_ms) || !isMs(o.decode_first_step_ms)) return undefined;
  return { ...(o as DecodeTimings), reserve_ms: isMs(o.reserve_ms) ? o.reserve_ms : 0 };
}

/** Rounds ms to µs (what is logged and served). */
export const roundMs = (ms: number): number => Math.round(ms * 1000) / 1000;

/**
 * The waterfall of one request from the three parts. @param routerMs the router's phase; @param ttftMs the TTFT the
 * router measured.
 */
export function assembleWaterfall(
  requestId: string,
  routerMs: number,
  ttftMs: number,
  p: PrefillTimings,
  d: DecodeTimings,
): Waterfall {
  return {
    request_id: requestId,
    ttft_ms: roundMs(ttftMs),
    phases_ms: {
      router: roundMs(routerMs),
      prefill_queue: roundMs(p.prefill_queue_ms),
      prefill_forward: roundMs(p.prefill_forward_ms),
      bootstrap: roundMs(p.bootstrap_ms),
      transfer_wait: roundMs(d.transfer_wait_ms),
      decode_queue: roundMs(d.decode_queue_ms),
      decode_first_step: roundMs(d.decode_first_step_ms),
    },
    payload_bytes: p.payload_bytes,
    descriptors: p.descriptors,
    overlapped_bytes: p.overlapped_bytes ?? 0,
    decode_reserve_ms: roundMs(d.reserve_ms),
  };
}
