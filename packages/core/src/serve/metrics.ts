/**
 * The server's Prometheus exporter (prom-client, one registry per server). Counting lives in the
 * engine (RequestMetrics) and the engine loop; this module only exports it, and keeps the speculative-decoding
 * totals as plain numbers ({@link SpecDecodeTotals}) for the gauges and the periodic stats line (stats-log.ts).
 *
 * Speculative-decoding counters map one to one onto vLLM's (docs/METRICS.md has the table and a relabelling rule):
 * `specd_spec_decode_num_drafts_total` = `vllm:spec_decode_num_drafts_total` (verify steps that verified ≥ 1 draft),
 * `…_num_draft_tokens_total`, `…_num_accepted_tokens_total` and `…_num_accepted_tokens_per_pos_total{position}`
 * likewise. specd adds `specd_spec_decode_num_verify_steps_total` (every verify step, k = 0 included) so that τ per
 * verify step = (accepted + verify steps) / verify steps can be computed, and gauges of both τ (per verify step,
 * per draft step), of the acceptance rate and of the per-position rate. Counted when a request finishes (any reason
 * but an abort).
 */

import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

import type { RequestMetrics } from '../engine/metrics.js';
import { PHASE_BUCKETS_S } from '../pd/waterfall.js';

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

/** Speculative-decoding totals over the requests finished so far (plain numbers; the counters' values). */
export interface SpecDecodeTotals {
  /** Verify steps that verified ≥ 1 draft token (vLLM's `num_drafts`). */
  readonly draftSteps: number;
  /** Every verify step, plain k = 0 steps included (τ's denominator). */
  readonly verifySteps: number;
  /** Draft tokens verified. */
  readonly draftTokens: number;
  /** Draft tokens accepted. */
  readonly acceptedTokens: number;
  /** `[i]` = draft steps whose draft i was accepted. */
  readonly acceptedPerPos: readonly number[];
}

/** τ per verify step, bonus included: (accepted + verify steps) / verify steps; 0 before the first step. */
export function tauPerVerifyStep(t: SpecDecodeTotals): number {
  return t.verifySteps === 0 ? 0 : (t.acceptedTokens + t.verifySteps) / t.verifySteps;
}

/** τ per draft step (vLLM's mean acceptance length): 1 + accepted / draft steps; 0 before the first draft. */
export function tauPerDraftStep(t: SpecDecodeTotals): number {
  return t.draftSteps === 0 ? 0 : 1 + t.acceptedTokens / t.draftSteps;
}

/** accepted / drafted tokens; 0 before the first draft. */
export function acceptanceRate(t: SpecDecodeTotals): number {
  return t.draftTokens === 0 ? 0 : t.acceptedTokens / t.draftTokens;
}

/** `[i]` = accepted at position i / draft steps (vLLM's per-position acceptance rate); empty before the first draft. */
export function perPositionRate(t: SpecDecodeTotals): number[] {
  return t.draftSteps === 0 ? [] : t.acceptedPerPos.map((c) => c / t.draftSteps);
}

const FINISH: Record<string, string> = { eos: 'stop', stop: 'stop', length: 'length', abort: 'abort' };
/**
 * The OpenAI API's finish_reason for an engine finish reason: "eos" and a stop string are "stop"; "length" and
 * "abort" stay; anything else is "stop".
 */
export function apiFinishReason(engineReason: string): string {
  return FINISH[engineReason] ?? 'stop';
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
  /** Every verify step (k = 0 included), summed over requests: τ's denominator. */
  readonly numVerifySteps: Counter;
  /** Steps decoded plainly because drafting had reached the drafter's trained positions. */
  readonly positionLimitedSteps: Counter;
  readonly verifyBudget: Histogram;
  readonly numUnverifiedTokens: Counter;
  /** Prefill/decode disaggregation: payload bytes per request by class (target_kv, linear_state, draft_context). */
  readonly pdPayloadBytes: Histogram<'kind'>;
  /** Prefill/decode disaggregation (decode instance): requests by the form their draft context came in. */
  readonly pdDraftContextForm: Counter<'form'>;
  /** Prefill/decode disaggregation: time from reserving (D) or handing off (P) to the transfer's end, s. */
  readonly pdTransferWait: Histogram<'role'>;
  /** Prefill/decode disaggregation: transfers that failed, by PdError code. */
  readonly pdTransferFailures: Counter<'code'>;
  /** The TTFT waterfall's phases measured on this instance (pd/waterfall.ts), seconds. */
  readonly pdPhase: Histogram<'phase'>;
  /** Descriptors of a prefill instance's write per request, after coalescing. */
  readonly pdDescriptors: Histogram;

  private readonly totals = { draftSteps: 0, verifySteps: 0, draftTokens: 0, acceptedTokens: 0 };
  private readonly totalsPerPos: number[] = [];

  constructor(source: ServerGaugeSource, options: { defaultMetrics?: boolean } = {}) {
    const registers = [this.registry];
    const spec = (): SpecDecodeTotals => this.specTotals;
    if (options.defaultMetrics === true) collectDefaultMetrics({ register: this.registry, prefix: 'specd_process_' });
    this.requests = new Counter({
      name: 'specd_requests_total',
      help: 'finished generation requests, by endpoint and the API finish_reason (stop, length, abort)',
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
    this.pdDraftContextForm = new Counter({
      name: 'specd_pd_draft_context_form_total',
      help:
        'prefill/decode requests a decode instance resumed, by the form of their draft context (kv: draft KV pages; ' +
        'features: projected features it rebuilt the draft KV from; pd.draft_context)',
      labelNames: ['form'],
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
    this.pdPhase = new Histogram({
      name: 'specd_pd_phase_seconds',
      help:
        "phases of a disaggregated request's TTFT measured here (prefill: prefill_queue, prefill_forward, bootstrap; " +
        'decode: transfer_wait, decode_queue, decode_first_step; docs/METRICS.md)',
      labelNames: ['phase'],
      buckets: PHASE_BUCKETS_S,
      registers,
    });
    this.pdDescriptors = new Histogram({
      name: 'specd_pd_transfer_descriptors',
      help: "descriptors of a prefill instance's write per request, after coalescing contiguous pages",
      buckets: [1, 4, 16, 64, 256, 1024, 4096, 16384],
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
    this.numVerifySteps = new Counter({
      name: 'specd_spec_decode_num_verify_steps_total',
      help: 'verify steps summed over requests, plain k = 0 steps included (τ = (accepted + steps) / steps)',
      registers,
    });
    this.positionLimitedSteps = new Counter({
      name: 'specd_spec_decode_position_limited_steps_total',
      help:
        "steps decoded plainly because a draft step would reach the drafter's max_position_embeddings (drafting " +
        'stops there for the rest of the request)',
      registers,
    });
    new Gauge({
      name: 'specd_spec_decode_acceptance_length_per_verify_step',
      help:
        'τ per verify step, bonus token included: (num_accepted_tokens + num_verify_steps) / num_verify_steps ' +
        'since start (0 before the first step)',
      registers,
      collect() {
        this.set(tauPerVerifyStep(spec()));
      },
    });
    new Gauge({
      name: 'specd_spec_decode_acceptance_length_per_draft',
      help:
        "τ per draft step, vLLM's mean acceptance length: 1 + num_accepted_tokens / num_drafts since start " +
        '(0 before the first draft)',
      registers,
      collect() {
        this.set(tauPerDraftStep(spec()));
      },
    });
    new Gauge({
      name: 'specd_spec_decode_draft_acceptance_rate',
      help: 'num_accepted_tokens / num_draft_tokens since start (0 before the first draft)',
      registers,
      collect() {
        this.set(acceptanceRate(spec()));
      },
    });
    new Gauge({
      name: 'specd_spec_decode_per_position_acceptance_rate',
      help: "num_accepted_tokens_per_pos / num_drafts since start, by draft position (0-based; vLLM's denominator)",
      labelNames: ['position'],
      registers,
      collect() {
        perPositionRate(spec()).forEach((r, i) => {
          this.set({ position: String(i) }, r);
        });
      },
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

  /** The speculative-decoding totals so far (a copy; the counters' values). */
  get specTotals(): SpecDecodeTotals {
    return {
      ...this.totals,
      acceptedPerPos: Array.from({ length: this.totalsPerPos.length }, (_, i) => this.totalsPerPos[i] ?? 0),
    };
  }

  /**
   * Records a finished request, labelled with its API finish reason ({@link apiFinishReason}: "stop", not the
   * engine's "eos"). Times in seconds; `ttft` undefined when no token came.
   */
  recordRequest(
    endpoint: string,
    finishReason: string,
    r: { promptTokens: number; outputTokens: number; ttft?: number; e2e: number; spec?: RequestMetrics },
  ): void {
    this.requests.inc({ endpoint, finish_reason: apiFinishReason(finishReason) });
    this.promptTokens.inc(r.promptTokens);
    this.generationTokens.inc(r.outputTokens);
    if (r.ttft !== undefined) this.ttft.observe(r.ttft);
    this.e2e.observe(r.e2e);
    if (r.ttft !== undefined && r.outputTokens >= 2) this.tpot.observe((r.e2e - r.ttft) / (r.outputTokens - 1));
    const m = r.spec;
    if (m !== undefined && m.positionLimitedSteps > 0) this.positionLimitedSteps.inc(m.positionLimitedSteps);
    if (m !== undefined && m.verifySteps > 0) {
      this.numVerifySteps.inc(m.verifySteps);
      this.totals.verifySteps += m.verifySteps;
    }
    if (m !== undefined && m.drafted > 0) {
      this.numDrafts.inc(m.draftSteps);
      this.numDraftTokens.inc(m.drafted);
      this.numAcceptedTokens.inc(m.accepted);
      this.totals.draftSteps += m.draftSteps;
      this.totals.draftTokens += m.drafted;
      this.totals.acceptedTokens += m.accepted;
      m.acceptedAt.forEach((c, i) => {
        if ((c ?? 0) > 0) this.acceptedPerPos.inc({ position: String(i) }, c);
        this.totalsPerPos[i] = (this.totalsPerPos[i] ?? 0) + (c ?? 0);
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
