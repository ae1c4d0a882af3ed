/**
 * The server's Prometheus exporter (prom-client, one registry per server). Counting lives in the
 * engine (RequestMetrics) and the engine loop; this module only exports it.
 */

import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

import type { RequestMetrics } from '../engine/metrics.js';

const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
const TPOT_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1];
/** Verified drafts per budgeted step (integers; every draft count up to 8, then coarser). */
const BUDGET_BUCKETS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32];

/** Live values read at scrape time. */
export interface ServerGaugeSource {
  running(): number;
  waiting(): number;
  targetPagesInUse(): number;
  draftPagesInUse(): number;
  /** Linear-attention state slots in use (0 for targets without linear layers). */
  stateSlotsInUse(): number;
  /** Prompt tokens run through the target's prefill forwards so far (a decode instance runs none). */
  prefillTokens(): number;
  /** PD transfers in flight (prefill or decode role; 0 when serving aggregated). */
  transfersInFlight(): number;
}

/** The exported metrics (names prefixed `specd_`). */
export class ServerMetrics {
  readonly registry = new Registry();
  readonly requests: Counter<'endpoint' | 'finish_reason'>;
  readonly errors: Counter<'status'>;
  readonly promptTokens: Counter;
  readonly generationTokens: Counter;
  readonly ttft: Histogram;
  readonly tpot: Histogram;
  readonly e2e: Histogram;
  readonly numDrafts: Counter;
  readonly numDraftTokens: Counter;
  readonly numAcceptedTokens: Counter;
  readonly acceptedPerPos: Counter<'position'>;
  readonly verifyBudget: Histogram;
  readonly numUnverifiedTokens: Counter;
  /** Prefill/decode disaggregation: payload bytes per request by class (target_kv, linear_state, draft_context). */
  readonly pdPayloadBytes: Histogram<'kind'>;
  /** Prefill/decode disaggregation: time from reserving (D) or handing off (P) to the transfer's end, s. */
  readonly pdTransferWait: Histogram<'role'>;
  /** Prefill/decode disaggregation: transfers that failed, by PdError code. */
  readonly pdTransferFailures: Counter<'code'>;

  constructor(source: ServerGaugeSource, options: { defaultMetrics?: boolean } = {}) {
    const registers = [this.registry];
    if (options.defaultMetrics === true) collectDefaultMetrics({ register: this.registry, prefix: 'specd_process_' });
    this.requests = new Counter({
      name: 'specd_requests_total',
      help: 'finished generation requests',
      labelNames: ['endpoint', 'finish_reason'],
      registers,
    });
    this.errors = new Counter({
      name: 'specd_request_errors_total',
      help: 'requests answered with an error, by HTTP status',
      labelNames: ['status'],
      registers,
    });
    this.promptTokens = new Counter({
      name: 'specd_prompt_tokens_total',
      help: 'prompt tokens of finished requests',
      registers,
    });
    this.generationTokens = new Counter({
      name: 'specd_generation_tokens_total',
      help: 'generated tokens of finished requests',
      registers,
    });
    this.ttft = new Histogram({
      name: 'specd_time_to_first_token_seconds',
      help: 'request arrival to first token',
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.tpot = new Histogram({
      name: 'specd_time_per_output_token_seconds',
      help: '(e2e − ttft) / (tokens − 1), per request with ≥ 2 tokens',
      buckets: TPOT_BUCKETS,
      registers,
    });
    this.e2e = new Histogram({
      name: 'specd_e2e_request_latency_seconds',
      help: 'request arrival to last token',
      buckets: LATENCY_BUCKETS,
      registers,
    });
    new Gauge({
      name: 'specd_num_requests_running',
      help: 'requests being decoded',
      registers,
      collect() {
        this.set(source.running());
      },
    });
    new Gauge({
      name: 'specd_num_requests_waiting',
      help: 'requests queued, not yet prefilled',
      registers,
      collect() {
        this.set(source.waiting());
      },
    });
    new Gauge({
      name: 'specd_kv_pages_used',
      help: "KV pages in use (target: paged layers; draft: the drafter's pool)",
      labelNames: ['cache'],
      registers,
      collect() {
        this.set({ cache: 'target' }, source.targetPagesInUse());
        this.set({ cache: 'draft' }, source.draftPagesInUse());
      },
    });
    new Gauge({
      name: 'specd_state_slots_used',
      help: 'linear-attention state slots in use (target)',
      registers,
      collect() {
        this.set(source.stateSlotsInUse());
      },
    });
    new Gauge({
      name: 'specd_prompt_tokens_prefilled',
      help: "prompt tokens run through the target's prefill forwards (0 on a decode instance of a PD pair)",
      registers,
      collect() {
        this.set(source.prefillTokens());
      },
    });
    new Gauge({
      name: 'specd_pd_transfers_inflight',
      help: 'prefill/decode transfers in flight',
      registers,
      collect() {
        this.set(source.transfersInFlight());
      },
    });
    this.pdPayloadBytes = new Histogram({
      name: 'specd_pd_payload_bytes',
      help: 'prefill/decode payload bytes per request, by kind (target_kv, linear_state, draft_context)',
      labelNames: ['kind'],
      buckets: [1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 23, 1 << 26, 1 << 29],
      registers,
    });
    this.pdTransferWait = new Histogram({
      name: 'specd_pd_transfer_wait_seconds',
      help:
        'prefill/decode transfer wait per request (decode: reserved to state verified, the prefill included; ' +
        'prefill: handoff to acknowledged)',
      labelNames: ['role'],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.pdTransferFailures = new Counter({
      name: 'specd_pd_transfer_failures_total',
      help: 'prefill/decode transfers that failed, by cause',
      labelNames: ['code'],
      registers,
    });
    this.numDrafts = new Counter({
      name: 'specd_spec_decode_num_drafts_total',
      help:
        'draft proposals: verify steps, summed over requests, that verified at least one draft token ' +
        '(plain k = 0 steps excluded)',
      registers,
    });
    this.numDraftTokens = new Counter({
      name: 'specd_spec_decode_num_draft_tokens_total',
      help: 'draft tokens proposed',
      registers,
    });
    this.numAcceptedTokens = new Counter({
      name: 'specd_spec_decode_num_accepted_tokens_total',
      help: 'draft tokens accepted',
      registers,
    });
    this.acceptedPerPos = new Counter({
      name: 'specd_spec_decode_num_accepted_tokens_per_pos_total',
      help: 'draft tokens accepted, by draft position (0-based)',
      labelNames: ['position'],
      registers,
    });
    this.verifyBudget = new Histogram({
      name: 'specd_verify_budget_tokens',
      help: 'drafts verified per step whose proposal went through a verify budget (adaptive verification)',
      buckets: BUDGET_BUCKETS,
      registers,
    });
    this.numUnverifiedTokens = new Counter({
      name: 'specd_spec_decode_num_unverified_draft_tokens_total',
      help: 'draft tokens proposed but cut by a verify budget',
      registers,
    });
  }

  /** Records a finished request. Times in seconds; `ttft` undefined when no token came. */
  recordRequest(
    endpoint: string,
    finishReason: string,
    r: { promptTokens: number; outputTokens: number; ttft?: number; e2e: number; spec?: RequestMetrics },
  ): void {
    this.requests.inc({ endpoint, finish_reason: finishReason });
    this.promptTokens.inc(r.promptTokens);
    this.generationTokens.inc(r.outputTokens);
    if (r.ttft !== undefined) this.ttft.observe(r.ttft);
    this.e2e.observe(r.e2e);
    if (r.ttft !== undefined && r.outputTokens >= 2) this.tpot.observe((r.e2e - r.ttft) / (r.outputTokens - 1));
    const m = r.spec;
    if (m !== undefined && m.drafted > 0) {
      this.numDrafts.inc(m.draftSteps);
      this.numDraftTokens.inc(m.drafted);
      this.numAcceptedTokens.inc(m.accepted);
      m.acceptedAt.forEach((c, i) => {
        if ((c ?? 0) > 0) this.acceptedPerPos.inc({ position: String(i) }, c);
      });
    }
    if (m !== undefined && m.budgetSteps > 0) {
      m.budgetHistogram.forEach((c, n) => {
        for (let i = 0; i < (c ?? 0); i++) this.verifyBudget.observe(n);
      });
      this.numUnverifiedTokens.inc(m.unverified);
    }
  }
}
