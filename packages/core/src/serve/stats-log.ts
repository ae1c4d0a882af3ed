/**
 * The server's periodic stats line, as vLLM's `LoggingStatLogger` (vllm/v1/metrics/loggers.py): every interval
 * (10 s by default; `--disable-log-stats` turns it off) one line with the interval's prompt and generation
 * throughput, the running and waiting requests, the target's KV use and, when verify steps finished in the
 * interval, τ per verify step, vLLM's mean acceptance length (per draft step), the draft acceptance rate and the
 * per-position acceptance rates. Logging only: the counting is the engine's (RunMetrics, RequestMetrics), the engine
 * loop's (generated tokens) and ServerMetrics' (speculative-decoding totals, counted when a request finishes).
 * An interval in which nothing ran is logged at debug level (vLLM does the same), so an idle server stays quiet.
 */

import {
  acceptanceRate,
  perPositionRate,
  type SpecDecodeTotals,
  tauPerDraftStep,
  tauPerVerifyStep,
} from './metrics.js';

/** What the stats line reads, sampled once per line. Token counts are totals since start. */
export interface StatsSource {
  /** Prompt tokens run through the target's prefill forwards so far. */
  promptTokens(): number;
  /** Tokens generated so far (every token a request received). */
  generationTokens(): number;
  /** Requests being decoded. */
  running(): number;
  /** Requests queued, not yet prefilled. */
  waiting(): number;
  /** The target's KV pages `{used, total}`; undefined for a target without paged KV layers. */
  kvPages(): { readonly used: number; readonly total: number } | undefined;
  /** Speculative-decoding totals of the finished requests ({@link ServerMetrics.specTotals}). */
  spec(): SpecDecodeTotals;
}

/** One stats line: the numbers (logged as fields) and the text. */
export interface StatsLine {
  /** Length of the interval, ms. */
  readonly intervalMs: number;
  /** Prompt tokens prefilled per second over the interval. */
  readonly promptTokensPerS: number;
  /** Tokens generated per second over the interval. */
  readonly generationTokensPerS: number;
  readonly running: number;
  readonly waiting: number;
  /** Fraction of the target's KV pages in use now, [0, 1]; undefined without paged KV. */
  readonly kvCacheUsage: number | undefined;
  /** The speculative-decoding numbers of the requests finished in the interval (absent: no verify step). */
  readonly spec?: {
    /** τ per verify step, bonus included: (accepted + verify steps) / verify steps. */
    readonly tauPerVerifyStep: number;
    /** vLLM's mean acceptance length: 1 + accepted / draft steps (0 when nothing was drafted). */
    readonly meanAcceptanceLength: number;
    /** accepted / drafted tokens (0 when nothing was drafted). */
    readonly acceptanceRate: number;
    readonly verifySteps: number;
    readonly draftSteps: number;
    readonly draftTokens: number;
    readonly acceptedTokens: number;
    /** `[i]` = accepted at position i / draft steps (vLLM's per-position acceptance rate). */
    readonly perPositionAcceptanceRate: readonly number[];
  };
  /** False when nothing ran, was queued or finished in the interval (logged at debug level). */
  readonly active: boolean;
  /** The human-readable line. */
  readonly text: string;
}

/** The difference `now − before` of two totals. */
function specDelta(now: SpecDecodeTotals, before: SpecDecodeTotals): SpecDecodeTotals {
  return {
    draftSteps: now.draftSteps - before.draftSteps,
    verifySteps: now.verifySteps - before.verifySteps,
    draftTokens: now.draftTokens - before.draftTokens,
    acceptedTokens: now.acceptedTokens - before.acceptedTokens,
    acceptedPerPos: now.acceptedPerPos.map((c, i) => c - (before.acceptedPerPos[i] ?? 0)),
  };
}

/** Where a line goes: `(fields, text)` at info level, or debug for an idle interval. */
export type StatsSink = (line: StatsLine) => void;

/** Computes a stats line per interval from a {@link StatsSource}; start / stop the timer, or call {@link sample}. */
export class StatsLogger {
  private timer: NodeJS.Timeout | undefined;
  private lastMs: number;
  private lastPrompt: number;
  private lastGeneration: number;
  private lastSpec: SpecDecodeTotals;

  /**
   * @param intervalMs the period of the line, ms (an integer ≥ 1).
   * @param now the clock, ms (default `performance.now`; tests may inject one).
   * @throws {RangeError} for an interval that is not an integer ≥ 1.
   */
  constructor(
    private readonly source: StatsSource,
    private readonly sink: StatsSink,
    readonly intervalMs: number,
    private readonly now: () => number = () => performance.now(),
  ) {
    if (!(Number.isSafeInteger(intervalMs) && intervalMs >= 1))
      throw new RangeError(`stats log: intervalMs: expected an integer >= 1, got ${intervalMs}`);
    this.lastMs = now();
    this.lastPrompt = source.promptTokens();
    this.lastGeneration = source.generationTokens();
    this.lastSpec = source.spec();
  }

  /** Starts the timer (unref'd: it never keeps the process alive). Idempotent. */
  start(): void {
    if (this.timer !== undefined) return;
    this.timer = setInterval(() => this.sink(this.sample()), this.intervalMs);
    this.timer.unref();
  }

  /** Stops the timer. Idempotent. */
  stop(): void {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
  }

  /** The line for the interval since the previous sample (or the start), and starts the next interval. */
  sample(): StatsLine {
    const t = this.now();
    const prompt = this.source.promptTokens();
    const generation = this.source.generationTokens();
    const spec = this.source.spec();
    const intervalMs = t - this.lastMs;
    const seconds = intervalMs / 1000;
    const perS = (n: number): number => (seconds > 0 ? n / seconds : 0);
    const d = specDelta(spec, this.lastSpec);
    const promptTokens = prompt - this.lastPrompt;
    const generationTokens = generation - this.lastGeneration;
    this.lastMs = t;
    this.lastPrompt = prompt;
    this.lastGeneration = generation;
    this.lastSpec = spec;
    const running = this.source.running();
    const waiting = this.source.waiting();
    const kv = this.source.kvPages();
    const kvCacheUsage = kv === undefined || kv.total === 0 ? undefined : kv.used / kv.total;
    const specLine =
      d.verifySteps === 0
        ? undefined
        : {
            tauPerVerifyStep: tauPerVerifyStep(d),
            meanAcceptanceLength: tauPerDraftStep(d),
            acceptanceRate: acceptanceRate(d),
            verifySteps: d.verifySteps,
            draftSteps: d.draftSteps,
            draftTokens: d.draftTokens,
            acceptedTokens: d.acceptedTokens,
            perPositionAcceptanceRate: perPositionRate(d),
          };
    const parts = [
      `Avg prompt throughput: ${perS(promptTokens).toFixed(1)} tokens/s`,
      `Avg generation throughput: ${perS(generationTokens).toFixed(1)} tokens/s`,
      `Running: ${running} reqs`,
      `Waiting: ${waiting} reqs`,
      kv === undefined || kvCacheUsage === undefined
        ? 'KV cache usage: n/a (no paged KV layers)'
        : `KV cache usage: ${(100 * kvCacheUsage).toFixed(1)}% (${kv.used}/${kv.total} pages)`,
    ];
    if (specLine !== undefined) {
      const s = specLine;
      parts.push(
        `τ per verify step: ${s.tauPerVerifyStep.toFixed(2)} (${s.verifySteps} steps)`,
        `Mean acceptance length: ${s.draftSteps === 0 ? 'n/a' : s.meanAcceptanceLength.toFixed(2)}`,
        `Draft acceptance rate: ${s.draftTokens === 0 ? 'n/a' : `${(100 * s.acceptanceRate).toFixed(1)}%`}` +
          ` (${s.acceptedTokens}/${s.draftTokens} tokens)`,
        `Per-position acceptance rate: ${s.perPositionAcceptanceRate.map((r) => r.toFixed(3)).join(', ') || 'n/a'}`,
      );
    }
    return {
      intervalMs,
      promptTokensPerS: perS(promptTokens),
      generationTokensPerS: perS(generationTokens),
      running,
      waiting,
      kvCacheUsage,
      ...(specLine === undefined ? {} : { spec: specLine }),
      active: promptTokens > 0 || generationTokens > 0 || running > 0 || waiting > 0 || specLine !== undefined,
      text: parts.join(', '),
    };
  }
}
