/**
 * The PD router's Prometheus exporter (prom-client, its own registry, names prefixed `specd_router_`); the
 * router (router.ts) counts into it.
 */

import { Counter, Gauge, Registry } from 'prom-client';

/** The router's Prometheus metrics (names prefixed `specd_router_`). */
export class PdRouterMetrics {
  readonly registry = new Registry();
  /** Answered requests by route and HTTP status (499: the client went away first). */
  readonly requests: Counter<'route' | 'status'>;
  /** Failed requests by the side that failed: prefill, decode or router (refused before any upstream). */
  readonly errors: Counter<'side'>;
  /** /pd/abort calls sent, by role. */
  readonly aborts: Counter<'role'>;
  readonly inFlight: Gauge;
  /** 1 healthy, 0 not, per upstream. */
  readonly upstreamHealthy: Gauge<'url' | 'role'>;

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
  }
}
