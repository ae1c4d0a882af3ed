/**
 * Continuous batching over one {@link SpecEngine}: one loop, one `step()` per macrotask
 * (`setImmediate`), so HTTP handlers run between steps; a request submitted between two steps
 * joins the running batch at the next one (`SpecEngine.add`), an abort frees its pages, state slot
 * and draft context before the next step. Admission control: at most `maxWaiting` queued requests
 * and `maxTokensInFlight` (Σ prompt + max_tokens over waiting and running; an idle loop takes any one
 * request — its own length is bounded by max_sequence_tokens) → {@link OverloadedError}.
 */

import { SpecEngine } from '../engine/engine.js';
import type { TokenLogprob } from '../engine/logprobs.js';
import type { HandoffState, SamplingParams, SpecEngineOptions, SpecRequest, SpecResult } from '../engine/types.js';
import type { Drafter } from '../plugin/drafter-plugin.js';
import type { StageModel } from '../plugin/model-plugin.js';

/** A request for the loop (the loop assigns the id). */
export interface LoopRequest {
  readonly promptIds: Int32Array;
  readonly maxTokens: number;
  readonly sampling: SamplingParams;
  readonly seed: number;
  /** The client fixed `seed` (see SpecRequest.seeded). */
  readonly seeded?: boolean;
  readonly stopStrings?: readonly string[];
  readonly ignoreEos?: boolean;
  /** Ids that end the request with finish reason `'stop'` (SpecRequest.stopTokenIds). */
  readonly stopTokenIds?: readonly number[];
  /**
   * Prefill role (prefill/decode disaggregation): end after the first token with finish reason `'handoff'`,
   * the caches kept for the transfer (`SpecEngine.release` / `abort` frees them; see SpecRequest.handoff).
   */
  readonly handoff?: boolean;
  /** Alternatives per generated token's logprob, in [0, 20] (SpecRequest.logprobs); absent: no logprobs. */
  readonly logprobs?: number;
  /** Alternatives per prompt token's logprob (SpecRequest.promptLogprobs); absent: none. */
  readonly promptLogprobs?: number;
}

/** Callbacks of one request (called from the loop, between HTTP events). */
export interface LoopListener {
  /** A committed token, with its logprob when the request asked for logprobs. */
  onToken(id: number, logprob?: TokenLogprob): void;
  /** The prompt's logprobs (entry 0 null), before the first token, when the request asked for them. */
  onPromptLogprobs?(logprobs: readonly (TokenLogprob | null)[]): void;
  /** The request's first prefill chunk is about to run (SpecRequest.onPrefillStart). */
  onPrefillStart?(): void;
  /**
   * A handed-off request's prefill chunk (not the last) ran: `rows` prompt rows done; `lastNext`: the next chunk is
   * the last (SpecRequest.onPrefillChunk).
   */
  onPrefillChunk?(rows: number, lastNext: boolean): void;
  onFinish(result: SpecResult): void;
  /**
   * The request failed: alone (a SequenceError, engine/types.ts: the others go on) or with the whole batch (a step
   * that threw).
   */
  onError(err: Error): void;
}

/** Thrown by {@link EngineLoop.submit} when the queue or the tokens in flight are full. */
export class OverloadedError extends Error {
  override readonly name = 'OverloadedError';
}

interface Entry {
  readonly listener: LoopListener;
  readonly tokens: number;
  started: boolean;
}

/** Options of {@link EngineLoop}. */
export interface EngineLoopOptions {
  readonly maxWaiting: number;
  readonly maxTokensInFlight: number;
  readonly eosTokenIds: readonly number[];
}

/** The one engine loop of a server. */
export class EngineLoop {
  /** The engine the loop steps. */
  readonly engine: SpecEngine;
  private nextId = 1;
  private readonly entries = new Map<number, Entry>();
  private scheduled = false;
  private closed = false;
  private inFlight = 0;
  private generated = 0;
  private readonly freedWaiters: (() => void)[] = [];

  /**
   * Builds the loop's {@link SpecEngine} over `target` and `drafter`. @throws {EngineError} as the engine's
   * constructor.
   */
  constructor(
    target: StageModel,
    drafter: Drafter | undefined,
    engineOptions: SpecEngineOptions,
    private readonly options: EngineLoopOptions,
  ) {
    this.engine = new SpecEngine(target, drafter, engineOptions);
  }

  /** Requests prefilled and not finished. */
  get running(): number {
    let n = 0;
    for (const e of this.entries.values()) if (e.started) n++;
    return n;
  }

  /** Requests queued, not yet prefilled. */
  get waiting(): number {
    return this.entries.size - this.running;
  }

  /** Tokens delivered to requests since the loop started (every onToken; the stats line's generation throughput). */
  get generatedTokens(): number {
    return this.generated;
  }

  /** Σ (prompt + max_tokens) over waiting and running requests. */
  get tokensInFlight(): number {
    return this.inFlight;
  }

  /**
   * Queues a request. @returns its id (for {@link abort}).
   * @throws {OverloadedError} when full; {@link EngineError} for a request the engine refuses.
   */
  submit(req: LoopRequest, listener: LoopListener): number {
    const { id, entry } = this.admission(req, listener);
    this.engine.add(this.engineRequest(id, req, entry));
    this.entries.set(id, entry);
    this.inFlight += entry.tokens;
    this.schedule();
    return id;
  }

  /**
   * Decode role (prefill/decode disaggregation): reserves a request's sequence for a transfer
   * (`SpecEngine.reserve`: target pages for its prompt, a state slot, an empty draft context); nothing runs
   * until {@link resume}. @returns its id, or undefined when no sequence or page is free now.
   * @throws {OverloadedError} when the queue or the tokens in flight are full; {@link EngineError} for a request the
   *   engine refuses.
   */
  reserve(req: LoopRequest, listener: LoopListener): number | undefined {
    const { id, entry } = this.admission(req, listener);
    if (!this.engine.reserve(this.engineRequest(id, req, entry))) return undefined;
    this.entries.set(id, entry);
    this.inFlight += entry.tokens;
    return id;
  }

  /**
   * Continues a {@link reserve}d request whose state arrived (`SpecEngine.resume`): its first token reaches the
   * listener now, the rest from the next steps. @throws {EngineError} as `SpecEngine.resume`.
   */
  resume(id: number, state: HandoffState): void {
    const entry = this.entries.get(id);
    if (entry === undefined) throw new OverloadedError(`request ${id} is no longer reserved`);
    const done = this.engine.resume(id, state);
    this.engine.metrics.requests.length = 0;
    if (done !== undefined) {
      this.release(id);
      entry.listener.onFinish(done);
      return;
    }
    this.schedule();
  }

  /** Checks a request against the queue bounds and makes its entry (not yet registered). */
  private admission(req: LoopRequest, listener: LoopListener): { id: number; entry: Entry } {
    if (this.closed) throw new OverloadedError('the server is shutting down');
    if (this.waiting >= this.options.maxWaiting)
      throw new OverloadedError(
        `too many waiting requests (${this.waiting}, max_waiting_requests ${this.options.maxWaiting}); retry later`,
      );
    const tokens = req.promptIds.length + req.maxTokens;
    if (this.inFlight + tokens > this.options.maxTokensInFlight && this.entries.size > 0) {
      throw new OverloadedError(
        `too many tokens in flight (${this.inFlight} + ${tokens} > ` +
          `max_tokens_in_flight ${this.options.maxTokensInFlight}); retry later`,
      );
    }
    return { id: this.nextId++, entry: { listener, tokens, started: false } };
  }

  /** The engine's request for a loop request. */
  private engineRequest(id: number, req: LoopRequest, entry: Entry): SpecRequest {
    return {
      id,
      promptIds: req.promptIds,
      maxTokens: req.maxTokens,
      sampling: req.sampling,
      seed: req.seed,
      seeded: req.seeded,
      ignoreEos: req.ignoreEos,
      eosTokenIds: this.options.eosTokenIds,
      stopStrings: req.stopStrings,
      ...(req.stopTokenIds === undefined ? {} : { stopTokenIds: req.stopTokenIds }),
      handoff: req.handoff,
      logprobs: req.logprobs,
      promptLogprobs: req.promptLogprobs,
      onPromptLogprobs: (lps) => entry.listener.onPromptLogprobs?.(lps),
      onPrefillStart: () => entry.listener.onPrefillStart?.(),
      ...(entry.listener.onPrefillChunk === undefined
        ? {}
        : { onPrefillChunk: (rows: number, lastNext: boolean) => entry.listener.onPrefillChunk?.(rows, lastNext) }),
      onToken: (t, lp) => {
        this.generated++;
        entry.started = true;
        entry.listener.onToken(t, lp);
      },
    };
  }

  /**
   * Aborts a request (waiting, reserved, running or handed off): frees its pages, slot and draft context now.
   * No callback follows.
   */
  abort(id: number): void {
    this.release(id);
    this.engine.abort(id);
    this.engine.metrics.requests.length = 0; // the server keeps no per-request history
  }

  /** Stops taking requests and aborts every one (their listeners get an error). */
  close(): void {
    this.closed = true;
    for (const [id, e] of [...this.entries]) {
      this.abort(id);
      e.listener.onError(new OverloadedError('the server is shutting down'));
    }
  }

  private release(id: number): Entry | undefined {
    const e = this.entries.get(id);
    if (e === undefined) return undefined;
    this.entries.delete(id);
    this.inFlight -= e.tokens;
    const waiters = this.freedWaiters.splice(0);
    for (const w of waiters) w();
    return e;
  }

  /** Resolves the next time a request leaves the loop (finished, aborted or failed): a sequence may be free. */
  whenFreed(): Promise<void> {
    return new Promise((resolve) => this.freedWaiters.push(resolve));
  }

  private schedule(): void {
    if (this.scheduled || this.closed || this.engine.pending === 0) return;
    this.scheduled = true;
    setImmediate(() => this.tick());
  }

  private tick(): void {
    this.scheduled = false;
    if (this.closed) return;
    let done: SpecResult[];
    try {
      done = this.engine.step();
    } catch (err) {
      // a batched verify forward or draft context write threw (a request that fails alone comes back as a result
      // with `error`): no safe state to continue the batch from, so fail every request and free everything
      for (const [id, e] of [...this.entries]) {
        this.release(id);
        this.engine.abort(id);
        e.listener.onError(err as Error);
      }
      this.engine.metrics.requests.length = 0;
      return;
    }
    this.engine.metrics.requests.length = 0;
    for (const r of done) {
      const e = this.release(r.id as number);
      // a request that failed alone (SequenceError): its caches are free, the others went on
      if (r.error !== undefined) e?.listener.onError(r.error);
      else e?.listener.onFinish(r);
    }
    this.schedule();
  }
}
