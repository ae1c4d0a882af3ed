/**
 * The PD router's Prometheus exporter (prom-client, its own registry, names prefixed `specd_router_`); the
 * router (router.ts) counts into it.
 */

import { Counter, Gauge, Histogram, Registry } from 'prom-client';

import { PHASE_BUCKETS_S, type Waterfall } from './waterfall.js';

/** The router's Prometheus metrics (names prefixed `specd_router_`). */
export class PdRouterMetrics {
  readonly registry = new Registry();
  /** Answered requests by route and HTTP status (499: the client went away first). */
  readonly requests: Counter<'route' | 'status'>;
  /** Failed requests by the side that failed: prefill, decode or router (refused before any upstream). */
  readonly errors: Counter<'side'>;
  /** /pd/abort calls sent, by role. */
  readonly aborts: Counter<'role'>;
  /** POST /pd/prefill or /pd/decode sent a second time after the connection dropped before an answer, by role. */
  readonly retries: Counter<'role'>;
  readonly inFlight: Gauge;
  /** 1 healthy, 0 not, per upstream. */
  readonly upstreamHealthy: Gauge<'url' | 'role'>;
  /** TTFT per P/D pair, measured at the router (arrival to D's first byte), seconds. */
  readonly ttft: Histogram;
  /** The TTFT waterfall per P/D pair by phase (pd/waterfall.ts), seconds. */
  readonly waterfall: Histogram<'phase'>;
  /** Payload per P/D pair by class, bytes. */
  readonly payloadBytes: Histogram<'kind'>;
  /** Descriptors of P's write per P/D pair (after coalescing). */
  readonly descriptors: Histogram;

  constructor() {
    const registers = [this.registry];
    this.requests = new Counter({
      name: 'specd_router_requests_total',
      help: 'requests answered, by route and HTTP status (499: the client disconnected)',
      labelNames: ['route', 'status'],
      registers,
    });
    this.errors = new Counter({
      name: 'specd_router_errors_total',
      help: 'generation requests that failed, by the side that failed (prefill, decode, router)',
      labelNames: ['side'],
      registers,
    });
    this.aborts = new Counter({
      name: 'specd_router_aborts_sent_total',
      help: 'POST /pd/abort calls sent, by role',
      labelNames: ['role'],
      registers,
    });
    this.retries = new Counter({
      name: 'specd_router_upstream_retries_total',
      help: 'POST /pd/prefill or /pd/decode sent again after its connection dropped before an answer, by role',
      labelNames: ['role'],
      registers,
    });
    this.inFlight = new Gauge({
      name: 'specd_router_requests_in_flight',
      help: 'generation requests being answered',
      registers,
    });
    this.upstreamHealthy = new Gauge({
      name: 'specd_router_upstream_healthy',
      help: '1 when the upstream passed its last health check, else 0',
      labelNames: ['url', 'role'],
      registers,
    });
    this.ttft = new Histogram({
      name: 'specd_router_ttft_seconds',
      help: "time to first token per P/D pair at the router: the request's arrival to the first byte of D's answer",
      buckets: PHASE_BUCKETS_S,
      registers,
    });
    this.waterfall = new Histogram({
      name: 'specd_router_waterfall_seconds',
      help:
        'TTFT waterfall per P/D pair by phase (router, prefill_queue, prefill_forward, bootstrap, transfer_wait, ' +
        'decode_queue, decode_first_step), each measured where it happens',
      labelNames: ['phase'],
      buckets: PHASE_BUCKETS_S,
      registers,
    });
    this.payloadBytes = new Histogram({
      name: 'specd_router_payload_bytes',
      help: 'P → D payload per P/D pair by class (target_kv, linear_state, draft_context), bytes',
      labelNames: ['kind'],
      buckets: [1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 23, 1 << 26, 1 << 29],
      registers,
    });
    this.descriptors = new Histogram({
      name: 'specd_router_transfer_descriptors',
      help: "descriptors of P's write per P/D pair, after coalescing contiguous pages",
      buckets: [1, 4, 16, 64, 256, 1024, 4096, 16384],
      registers,
    });
  }

  /** Records one pair's waterfall. */
  observe(w: Waterfall): void {
    this.ttft.observe(w.ttft_ms / 1000);
    for (const [phase, ms] of Object.entries(w.phases_ms)) this.waterfall.observe({ phase }, ms / 1000);
    for (const [kind, bytes] of Object.entries(w.payload_bytes)) this.payloadBytes.observe({ kind }, bytes);
    this.descriptors.observe(w.descriptors);
  }
}
