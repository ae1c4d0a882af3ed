/**
 * The speculative-decoding engine (aggregated, one stage). It knows only the contracts
 * ({@link StageModel}, {@link Drafter}) and never branches on a method.
 *
 * Per request: prefill in chunks of `prefillChunk` tokens, ONE chunk per step (chunked prefill that
 * interleaves with decoding, as vLLM / SGLang: a long prompt never stalls the running streams for
 * more than one chunk forward per step); each chunk's taps are kept for the draft context
 * (`projectTargetHiddenPartial` → `writeProjectedContextKV` before the sequence first drafts;
 * draft-context.ts); first token from the last chunk's logits; then every {@link step}, as named
 * phases (spec-step.ts):
 *   propose (all decoding sequences, one call) → verify (ONE target forward over
 *   `[last verified token, drafts…]` of every decoding sequence, logits for every row, taps, and
 *   per-token linear-state snapshots) → accept (greedy, or rejection sampling at temperature > 0)
 *   → commit (target: keep `accepted + 1` tokens — KV truncated, linear state restored from the
 *   snapshot after the last committed token; draft: the block KV was never kept, the verify pass's
 *   taps of the committed tokens become new draft context).
 * Without a drafter (or with 0 drafts) a step is plain decoding: a block of one token.
 * Draft lengths per sequence and step come from a draft policy (draft-policy.ts): the drafter's
 * maximum (`'max'`), the cost-based policy (`'cost'`, default: measured t_verify / t_draft and
 * online acceptance, k = 0 included), any {@link DraftPolicy}, or the per-sequence `draftLength` hook.
 * Verify budgets: a proposal that carries `confidence` (any drafter with a confidence head) is
 * offered to the policy's optional `budgets` hook right after propose; the engine verifies only the
 * leading drafts it allows (tokens, q, parents and confidence cut alike; a budget of 0 makes that
 * sequence's step a plain decode step). The cost policy's rule is survival ≥ λ (draft-policy.ts).
 *
 * Commit modes: `'snapshots'` (default when the stage has `PrefixCommit`) needs exactly one target
 * forward per verify step; `'replay'` restores a checkpoint and re-runs the committed tokens when a
 * draft was rejected (one more forward). docs/BENCHMARKS.md has the measured comparison.
 */

import { SequenceCache } from '../kv/sequence-cache.js';
import { CacheError } from '../kv/paged-kv-pool.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { Drafter } from '../plugin/drafter-plugin.js';
import type { StageModel } from '../plugin/model-plugin.js';
import { hasDeviceSampling, hasPrefixCommit, type PrefixCommit } from '../plugin/stage-capabilities.js';
import { DraftContextWriter } from './draft-context.js';
import { CostDraftPolicy, fixedDraftPolicy, type DraftPolicy } from './draft-policy.js';
import { calibrateStepCosts, type StepCosts } from './step-costs.js';
import { RequestMetrics, RunMetrics } from './metrics.js';
import { LogitsProcessor, logitsProcessingProblem } from './logits-processors.js';
import { checkLogitsRow, NonFiniteLogitsError, nextToken } from './probs.js';
import { SeededRandom } from './random.js';
import { samplingProblem } from './sampling-params.js';
import { MAX_TOP_LOGPROBS, type TokenLogprob, tokenLogprob } from './logprobs.js';
import {
  accept,
  commit,
  committedLogprobs,
  propose,
  type Running,
  type StepContext,
  verify,
  deviceSpec,
  wantsArgmaxOnly,
} from './spec-step.js';
import {
  DEFAULT_DRAFT_POLICY,
  EngineError,
  type FinishReason,
  type HandoffState,
  type SpecEngineOptions,
  type SpecRequest,
  type SpecResult,
  SequenceError,
} from './types.js';

/** The spec-decode loop over one target stage and an optional drafter. Not thread-safe. */
export class SpecEngine {
  /** The target's caches (inspect `pagesInUse` / `slotsInUse`). */
  readonly cache: SequenceCache;
  readonly metrics = new RunMetrics();
  private readonly waiting: SpecRequest[] = [];
  /** Ids waiting or running. */
  private readonly known = new Set<SequenceId>();
  private readonly running = new Map<SequenceId, Running>();
  /** Handed-off requests (prefill role): their caches kept for the transfer until `release`. */
  private readonly parked = new Map<SequenceId, Running>();
  /** Reserved requests (decode role): caches allocated for a transfer, waiting for `resume`. */
  private readonly reserved = new Map<SequenceId, SpecRequest>();
  private readonly taps: readonly number[];
  /** Writes (and defers) the draft context; undefined without a drafter. */
  private readonly context: DraftContextWriter | undefined;
  private readonly maxSequences: number;
  private readonly maxTokensPerSequence: number;
  private readonly prefillChunk: number;
  private readonly commitMode: 'snapshots' | 'replay';
  private readonly vocab: number;
  /** The batch-level policy (undefined: `draftLength` hook, or no drafter). Set at the first step for `'cost'`. */
  private policy: DraftPolicy | undefined;
  /**
   * True when k comes from measured timings (`'cost'` or a {@link CostDraftPolicy}; see
   * {@link SpecRequest.seeded}).
   */
  private readonly timingPolicy: boolean;
  /** The measured costs of the `'cost'` policy (after the first step). */
  stepCosts: StepCosts | undefined;

  /**
   * @throws {EngineError} for a stage that is not a whole model, `commit: 'snapshots'` on a stage
   *   without `commitPrefix` ({@link PrefixCommit}), or a prefillChunk that is not an integer ≥ 1.
   */
  constructor(
    readonly target: StageModel,
    readonly drafter: Drafter | undefined,
    private readonly options: SpecEngineOptions = {},
  ) {
    const info = target.info;
    if (!info.isFirst || !info.isLast)
      throw new EngineError(
        'SpecEngine: target: expected a whole-model stage ' +
          '(first and last; a pipeline is one PipelineModel, pipeline/pipeline-model.ts)',
      );
    this.maxSequences = options.maxSequences ?? 8;
    this.maxTokensPerSequence = options.maxTokensPerSequence ?? 4096;
    this.prefillChunk = options.prefillChunk ?? 64;
    if (!(Number.isSafeInteger(this.prefillChunk) && this.prefillChunk >= 1))
      throw new EngineError(`SpecEngine: prefillChunk: expected an integer >= 1, got ${this.prefillChunk}`);
    const pageSize = options.pageSize ?? 16;
    const pagesPerSeq = Math.ceil(this.maxTokensPerSequence / pageSize) + 1;
    const cacheOptions = {
      pageSize,
      numPages: this.maxSequences * pagesPerSeq,
      numSlots: this.maxSequences,
      maxSequenceLength: this.maxTokensPerSequence,
    };
    this.cache = target.createCache?.(cacheOptions) ?? new SequenceCache(target.cacheGeometry, cacheOptions);
    this.commitMode = options.commit ?? (hasPrefixCommit(target) ? 'snapshots' : 'replay');
    if (this.commitMode === 'snapshots' && !hasPrefixCommit(target))
      throw new EngineError('SpecEngine: commit: "snapshots" needs a stage with commitPrefix');
    this.taps = drafter === undefined ? [] : drafter.captureSetter(info);
    this.context = drafter === undefined ? undefined : new DraftContextWriter(drafter, info.hiddenSize);
    this.vocab = info.vocabSize;
    let timing = false;
    if (drafter !== undefined && options.draftLength === undefined) {
      const p = options.draftPolicy ?? DEFAULT_DRAFT_POLICY;
      this.policy = p === 'max' ? fixedDraftPolicy(drafter.maxDraftTokens) : p === 'cost' ? undefined : p;
      timing = p === 'cost' || p instanceof CostDraftPolicy;
    }
    this.timingPolicy = timing;
  }

  /** True until the `'cost'` policy has its measured costs. */
  private get needsCalibration(): boolean {
    return (
      this.drafter !== undefined &&
      this.options.draftLength === undefined &&
      (this.options.draftPolicy ?? DEFAULT_DRAFT_POLICY) === 'cost' &&
      this.policy === undefined
    );
  }

  /**
   * Measures the step costs of the `'cost'` policy now (needs every sequence free; step() calls it
   * before admitting the first requests), or takes `stepCosts` of the options. @returns the measured (cached or
   * given) costs.
   */
  calibrate(): StepCosts | undefined {
    const drafter = this.drafter;
    // (needsCalibration implies a drafter)
    if (!this.needsCalibration || drafter === undefined) return this.stepCosts;
    if (this.running.size > 0) throw new EngineError('calibrate: needs an idle engine (no running sequences)');
    const t0 = performance.now();
    this.stepCosts =
      this.options.stepCosts ??
      calibrateStepCosts(this.target, drafter, this.cache, {
        maxSequences: this.maxSequences,
        maxDrafts: drafter.maxDraftTokens,
        stateSnapshots: this.commitMode === 'snapshots',
        taps: this.taps,
        // the scratch context plus the largest verify block must fit a sequence (a short `generate` sizes it tightly)
        contextTokens: Math.max(1, Math.min(32, this.maxTokensPerSequence - drafter.maxDraftTokens - 1)),
      });
    this.metrics.calibrationMs += performance.now() - t0;
    this.policy = new CostDraftPolicy(this.stepCosts, this.options.costPolicy);
    return this.stepCosts;
  }

  /** Requests not finished (waiting or running). */
  get pending(): number {
    return this.waiting.length + this.running.size;
  }

  /** Queues a request. @throws {EngineError} naming the bad field. */
  add(req: SpecRequest): void {
    this.check(req);
    this.waiting.push(req);
    this.known.add(req.id);
  }

  /** Sequences holding caches: running, handed off (kept for a transfer) and reserved (awaiting one). */
  get occupied(): number {
    return this.running.size + this.parked.size + this.reserved.size;
  }

  /**
   * Decode role of prefill/decode disaggregation: allocates a request's sequence for a transfer — target
   * pages for its `P` prompt tokens (the cache's length becomes P), a state slot and an empty draft context
   * (the caller reserves the draft context's rows, drafter-specific) — without computing anything. The
   * transfer then writes the prefill instance's state into them, and {@link resume} continues the request.
   * @returns false when no sequence or page is free now (nothing is left allocated; the caller queues or
   *   refuses). @throws {EngineError} naming the bad field, as {@link add}.
   */
  reserve(req: SpecRequest): boolean {
    this.check(req);
    if (this.occupied >= this.maxSequences) return false;
    const id = req.id;
    this.cache.add(id);
    try {
      this.cache.extend(id, req.promptIds.length);
      this.drafter?.addSequence(id);
    } catch (err) {
      this.cache.abort(id);
      this.drafter?.freeSequence(id);
      if (err instanceof CacheError && err.code === 'full') return false;
      throw err;
    }
    this.reserved.set(id, req);
    this.known.add(id);
    return true;
  }

  /**
   * Continues a {@link reserve}d request whose state arrived: it becomes a running sequence whose prompt
   * is prefilled, its first token (`state.firstToken`) is emitted (`onToken`) and it takes part in the
   * next step's verify round, drafting from a draft context of `state.position` rows, with the request's
   * PRNG continued from `(seed, draws)` — exactly as the prefill instance would have gone on. The state's logprobs
   * (the prefill instance's, for a request that asks) go to `onPromptLogprobs` and with the first token.
   * @returns the request's result when it finished on its first token, else undefined.
   * @throws {EngineError} for an id that is not reserved or a position that is not the prompt length.
   */
  resume(id: SequenceId, state: HandoffState): SpecResult | undefined {
    const req = this.reserved.get(id);
    if (req === undefined) throw new EngineError(`resume: request ${String(id)} is not reserved`);
    const P = req.promptIds.length;
    if (state.position !== P)
      throw new EngineError(
        `resume: request ${String(id)}: position: expected the prompt length ${P}, got ${state.position}`,
      );
    this.reserved.delete(id);
    const r = this.runningOf(req, SeededRandom.resume(state.seed, state.draws));
    r.prefilled = P;
    this.running.set(id, r);
    if (req.promptLogprobs !== undefined && state.promptLogprobs !== undefined)
      req.onPromptLogprobs?.(state.promptLogprobs);
    const first = state.firstLogprob === undefined ? undefined : [state.firstLogprob];
    const reason = this.emit(r, [state.firstToken], first);
    return reason === undefined ? undefined : this.finish(r, reason);
  }

  /**
   * Frees a handed-off request (prefill role, finish reason `'handoff'`) once its state was transferred:
   * its target pages, state slot and draft context. @returns false if `id` is not handed off.
   */
  release(id: SequenceId): boolean {
    const r = this.parked.get(id);
    if (r === undefined) return false;
    this.parked.delete(id);
    this.known.delete(id);
    this.cache.finish(id);
    this.drafter?.freeSequence(id);
    this.context?.discard(r);
    this.policy?.release(id);
    return true;
  }

  /** Validates a request (the fields {@link add} checks). @throws {EngineError} naming the bad field. */
  private check(req: SpecRequest): void {
    const P = req.promptIds.length;
    if (P < 1) throw new EngineError(`add: request ${String(req.id)}: promptIds: expected at least one token`);
    if (!Number.isSafeInteger(req.maxTokens) || req.maxTokens < 1)
      throw new EngineError(
        `add: request ${String(req.id)}: maxTokens: expected an integer >= 1, got ${req.maxTokens}`,
      );
    const need = P + req.maxTokens + (this.drafter?.maxDraftTokens ?? 0) + 1;
    if (need > this.maxTokensPerSequence) {
      throw new EngineError(
        `add: request ${String(req.id)}: prompt ${P} + maxTokens ${req.maxTokens} + a draft block needs ` +
          `${need} tokens, maxTokensPerSequence is ${this.maxTokensPerSequence}`,
      );
    }
    const bad = samplingProblem(req.sampling);
    if (bad !== undefined)
      throw new EngineError(`add: request ${String(req.id)}: sampling.${bad.field}: ${bad.message}`);
    for (const field of ['logprobs', 'promptLogprobs'] as const) {
      const n = req[field];
      if (n !== undefined && !(Number.isInteger(n) && n >= 0 && n <= MAX_TOP_LOGPROBS))
        throw new EngineError(
          `add: request ${String(req.id)}: ${field}: expected an integer in [0, ${MAX_TOP_LOGPROBS}], got ${n}`,
        );
    }
    const badLogits = logitsProcessingProblem(req.sampling, this.vocab);
    if (badLogits !== undefined)
      throw new EngineError(`add: request ${String(req.id)}: sampling.${badLogits.field}: ${badLogits.message}`);
    if (this.known.has(req.id)) throw new EngineError(`add: request ${String(req.id)}: id already queued`);
    if ((req.stopStrings?.length ?? 0) > 0 && this.options.decode === undefined)
      throw new EngineError(`add: request ${String(req.id)}: stopStrings need the engine's decode option`);
  }

  /**
   * Aborts a request, waiting, prefilling (some chunks done), decoding, handed off or reserved: frees its
   * target pages, state slot, draft pages and deferred taps. @returns its result, or undefined if unknown.
   */
  abort(id: SequenceId): SpecResult | undefined {
    const kept = this.parked.get(id);
    if (kept !== undefined) {
      this.release(id);
      this.metrics.requests.push(kept.metrics);
      return { id, tokenIds: kept.out, finishReason: 'abort', metrics: kept.metrics };
    }
    if (this.reserved.has(id)) {
      this.reserved.delete(id);
      this.known.delete(id);
      this.cache.abort(id);
      this.drafter?.freeSequence(id);
      const m = new RequestMetrics();
      this.metrics.requests.push(m);
      return { id, tokenIds: [], finishReason: 'abort', metrics: m };
    }
    const w = this.waiting.findIndex((r) => r.id === id);
    if (w >= 0) {
      this.waiting.splice(w, 1);
      this.known.delete(id);
      const m = new RequestMetrics();
      this.metrics.requests.push(m);
      return { id, tokenIds: [], finishReason: 'abort', metrics: m };
    }
    const r = this.running.get(id);
    return r === undefined ? undefined : this.finish(r, 'abort');
  }

  /**
   * Runs every queued request to the end. @returns results in finishing order (a request that failed alone with
   * finish reason `'error'` and its `error`). @throws as {@link step}.
   */
  run(requests: readonly SpecRequest[] = []): SpecResult[] {
    for (const r of requests) this.add(r);
    const out: SpecResult[] = [];
    while (this.pending > 0) out.push(...this.step());
    return out;
  }

  /**
   * One engine step (continuous batching with chunked prefill):
   * 1. admits waiting requests while fewer than maxSequences are running (target pages, state slot
   *    and draft sequence allocated; nothing computed yet);
   * 2. runs the NEXT prefill chunk (≤ prefillChunk tokens, one target forward, phase 'prefill') of
   *    every sequence still prefilling, in admission order — a sequence whose last chunk ran gets its
   *    first token (from that chunk's last logits) and may finish on it;
   * 3. one propose → verify → accept → commit round over every sequence done prefilling, those that
   *    finished prefilling in 2. included.
   * So a prompt of P tokens takes ⌈P / prefillChunk⌉ steps to prefill, and every decoding sequence
   * commits ≥ 1 token in each of them. Chunk boundaries are the same positions as a whole-prompt
   * prefill's (chunk i = tokens [i·prefillChunk, (i+1)·prefillChunk)), so outputs are bit-identical.
   * A request that fails alone (its prefill forward throws, the drafter throws on it alone, a logits row it
   * uses is not finite) ends in this step with finish reason `'error'` and its {@link SequenceError}, its caches
   * freed; the others go on with the tokens they would have had without it.
   * @returns the requests that finished (or failed alone) in this step.
   * @throws what a batched verify forward or draft context write throws (nothing tells which sequence broke it:
   *   the caller fails the batch).
   */
  step(): SpecResult[] {
    const done: SpecResult[] = [];
    if (this.needsCalibration && this.running.size === 0 && this.waiting.length > 0) this.calibrate();
    const admit = Math.min(this.waiting.length, this.maxSequences - this.occupied);
    if (admit > 0) for (const req of this.waiting.splice(0, admit)) this.admit(req);
    let prefilling = false;
    for (const r of this.running.values()) if (r.prefilled < r.req.promptIds.length) prefilling = true;
    if (prefilling)
      for (const r of [...this.running.values()]) {
        if (r.prefilled === r.req.promptIds.length) continue;
        const t0 = performance.now();
        const f = this.prefillStep(r);
        this.metrics.prefillMs += performance.now() - t0;
        if (f !== undefined) done.push(f);
      }
    const decoding: Running[] = [];
    for (const r of this.running.values()) if (r.prefilled === r.req.promptIds.length) decoding.push(r);
    if (decoding.length > 0) for (const f of this.specStep(decoding)) done.push(f);
    return done;
  }

  /** Requests admitted whose prompt is not fully prefilled yet. */
  get prefilling(): number {
    let n = 0;
    for (const r of this.running.values()) if (r.prefilled < r.req.promptIds.length) n++;
    return n;
  }

  /** Aborts every request (frees their pages, slots and draft context); target and drafter stay loaded. */
  dispose(): void {
    for (const r of [...this.running.values()]) this.finish(r, 'abort');
    for (const id of [...this.parked.keys(), ...this.reserved.keys()]) this.abort(id);
    for (const w of this.waiting) this.known.delete(w.id);
    this.waiting.length = 0;
  }

  // --- prefill -----------------------------------------------------------------------------------

  /** Allocates a sequence for `req` (target cache, draft context) and makes it running, 0 tokens prefilled. */
  private admit(req: SpecRequest): void {
    const id = req.id;
    this.cache.add(id);
    this.drafter?.addSequence(id);
    this.running.set(id, this.runningOf(req, new SeededRandom(req.seed)));
  }

  /** The running record of `req`: 0 tokens prefilled, its history holding the prompt. */
  private runningOf(req: SpecRequest, rng: SeededRandom): Running {
    const P = req.promptIds.length;
    const r: Running = {
      id: req.id,
      req,
      rng,
      metrics: new RequestMetrics(),
      prefilled: 0,
      plainOnly: this.timingPolicy && req.seeded === true && req.sampling.temperature > 0,
      history: new Int32Array(P + req.maxTokens + (this.drafter?.maxDraftTokens ?? 0) + 1),
      historyLength: P,
      out: [],
      logits: LogitsProcessor.of(req),
    };
    r.history.set(req.promptIds);
    return r;
  }

  /**
   * Runs the next prefill chunk of `r`: prompt tokens [prefilled, min(P, prefilled + prefillChunk)),
   * one target forward with taps (kept for the draft context, written before the sequence first
   * drafts). After the last chunk: the first token (argmax, or sampled from the processed p) from a
   * finite logits row ({@link checkLogitsRow}).
   * @returns the request's result when it finished on its first token, or failed: the forward (of this request
   *   alone) threw or its last row is not finite — finish reason `'error'`, everything it held freed, its metrics
   *   not recorded.
   */
  private prefillStep(r: Running): SpecResult | undefined {
    const req = r.req;
    const id = req.id;
    const P = req.promptIds.length;
    const p = r.prefilled;
    const end = Math.min(P, p + this.prefillChunk);
    const tokens = req.promptIds.subarray(p, end);
    let first: number | undefined;
    let firstLogprob: TokenLogprob | undefined;
    const promptTopN = req.promptLogprobs;
    if (p === 0) req.onPrefillStart?.();
    // a sampled request without processors or logprobs draws its first token where the logits live (DeviceSampling)
    const sampler = hasDeviceSampling(this.target) ? this.target : undefined;
    const drawOnDevice =
      sampler !== undefined &&
      end === P &&
      promptTopN === undefined &&
      req.sampling.temperature > 0 &&
      r.logits === undefined &&
      req.logprobs === undefined;
    try {
      const res = this.target.forward(
        {
          sequences: [
            {
              id,
              position: p,
              tokens,
              logits: promptTopN !== undefined ? 'all' : end === P ? 'last' : 'none',
              phase: 'prefill',
            },
          ],
        },
        this.cache,
        // a greedy request without processors or logprobs needs the last row's argmax only (a GPU stage keeps
        // the logits on the device)
        { taps: this.taps, argmaxOnly: (promptTopN === undefined && wantsArgmaxOnly(r)) || drawOnDevice },
      );
      this.metrics.prefillForwards++;
      this.metrics.prefillTokens += tokens.length;
      r.metrics.prefillForwards++;
      r.metrics.targetForwards++;
      r.prefilled = end;
      // written before its first propose (a handed-off request's at the handoff: its decode instance drafts)
      if (this.context !== undefined && (!r.plainOnly || req.handoff === true))
        this.context.defer(r, res, 0, p, tokens.length);
      // a handed-off request sent while it prefills: the chunk's draft context now (the token after each row is known)
      if (req.handoff === true && req.onPrefillChunk !== undefined && end < P) this.context?.flush([r]);
      if (promptTopN !== undefined) this.promptLogprobs(r, res.logits!, p, end, promptTopN);
      if (drawOnDevice) {
        first = sampler!.sampleOnDevice(res, [deviceSpec(r, new Int32Array(0), undefined, this.vocab)])[1]!;
        if (first < 0)
          throw new NonFiniteLogitsError(`the logits after prompt position ${P - 1}: the model's output is not finite`);
      } else if (end === P && res.logits === undefined) {
        first = res.argmax![0]!;
        if (first < 0)
          throw new NonFiniteLogitsError(`the logits after prompt position ${P - 1}: the model's output is not finite`);
      } else if (end === P) {
        const last = promptTopN === undefined ? 0 : end - p - 1;
        const row = res.logits!.subarray(last * this.vocab, (last + 1) * this.vocab);
        checkLogitsRow(row, `the logits after prompt position ${P - 1}`);
        let processed = row;
        if (r.logits !== undefined) {
          processed = Float32Array.from(row);
          r.logits.apply(processed);
        }
        first = nextToken(processed, req.sampling, r.rng);
        // logprobs are of the raw target distribution (vLLM's default), before penalties and temperature
        if (req.logprobs !== undefined) firstLogprob = tokenLogprob(row, first, req.logprobs);
      }
    } catch (err) {
      return this.fail(r, new SequenceError(id, 'prefill', err));
    }
    if (first === undefined) {
      if (req.handoff === true) req.onPrefillChunk?.(end, P - end <= this.prefillChunk);
      return undefined;
    }
    if (r.promptLogprobs !== undefined) req.onPromptLogprobs?.(r.promptLogprobs);
    const reason = this.emit(r, [first], firstLogprob === undefined ? undefined : [firstLogprob]);
    if (reason !== undefined) return this.finish(r, reason);
    return req.handoff === true ? this.handoff(r, first) : undefined;
  }

  /**
   * Appends the logprobs of prompt tokens (p, end] — and null for token 0 — to `r.promptLogprobs`, from the chunk's
   * logits `[end − p, V]` f32 (row j predicts prompt token p + j + 1; the last chunk's last row predicts the first
   * generated token and is left to it). @throws {NonFiniteLogitsError} for a row that is not finite.
   */
  private promptLogprobs(r: Running, logits: Float32Array, p: number, end: number, topN: number): void {
    const ids = r.req.promptIds;
    r.promptLogprobs ??= [null];
    const out = r.promptLogprobs;
    const V = this.vocab;
    for (let pos = p; pos < end && pos + 1 < ids.length; pos++) {
      const row = logits.subarray((pos - p) * V, (pos - p + 1) * V);
      checkLogitsRow(row, `the logits after prompt position ${pos}`);
      out.push(tokenLogprob(row, ids[pos + 1]!, topN));
    }
  }

  /**
   * Ends a prefilled request for prefill/decode disaggregation: writes its draft context (its prompt rows,
   * the first token as the last row's next token), keeps its caches until {@link release} and reports the
   * state its decode instance continues from (or, when that write throws, fails it alone: finish reason
   * `'error'`, everything freed).
   */
  private handoff(r: Running, first: number): SpecResult {
    try {
      this.context?.flush([r]);
    } catch (err) {
      return this.fail(r, new SequenceError(r.id, 'prefill', err));
    }
    this.running.delete(r.id);
    this.parked.set(r.id, r);
    const state: HandoffState = {
      firstToken: first,
      position: r.req.promptIds.length,
      seed: r.rng.seed,
      draws: r.rng.draws,
    };
    return { id: r.id, tokenIds: r.out, finishReason: 'handoff', metrics: r.metrics, handoff: state };
  }

  // --- the speculative step: propose → verify → accept → commit (spec-step.ts) ---------------------

  /**
   * One propose → verify → accept → commit round over `seqs` (running, done prefilling). A sequence that fails
   * alone in a phase (spec-step.ts: the drafter throws on it alone, a row it uses is not finite, its commit throws)
   * ends with finish reason `'error'` and its caches freed; the others go on, their tokens unchanged.
   * @throws what the batched verify forward or draft context write throws (nothing tells which sequence broke it).
   */
  private specStep(seqs: readonly Running[]): SpecResult[] {
    const ctx: StepContext = {
      target: this.target,
      drafter: this.drafter,
      context: this.context,
      cache: this.cache,
      policy: this.policy,
      options: this.options,
      vocab: this.vocab,
      taps: this.taps,
      commitMode: this.commitMode,
      metrics: this.metrics,
      running: this.running,
    };
    const done: SpecResult[] = [];
    const t0 = performance.now();
    const proposed = propose(ctx, seqs);
    const t1 = performance.now();
    let live = seqs;
    if (proposed.failed.size > 0) {
      live = seqs.filter((r) => !proposed.failed.has(r.id));
      for (const r of seqs) {
        const err = proposed.failed.get(r.id);
        if (err !== undefined) done.push(this.fail(r, err));
      }
    }
    if (live.length === 0) return done;
    const verified = verify(ctx, live, proposed.proposals);
    const t2 = performance.now();
    const accepted = accept(ctx, live, verified, proposed.proposals);
    const commitFailed = commit(ctx, verified, accepted.outcomes);
    const failed =
      accepted.failed.size === 0
        ? commitFailed
        : commitFailed.size === 0
          ? accepted.failed
          : new Map([...accepted.failed, ...commitFailed]);
    const t3 = performance.now();
    let rows = 0;
    for (const b of verified.blocks) rows += b.tokens.length;
    this.metrics.draftMs += t1 - t0;
    this.metrics.verifyMs += t2 - t1;
    this.metrics.commitMs += t3 - t2;
    const { drafted, proposedDrafts, proposeMs, catchUpRows, catchUpMs } = proposed;
    // the lazy catch-up is charged per deferred row (the policy's catch-up cost), not as per-step overhead
    if (catchUpRows > 0) this.policy?.observeContext?.(catchUpRows, catchUpMs);
    this.policy?.observeOverhead?.(t1 - t0 - proposeMs - catchUpMs + (t3 - t2), drafted > 0, rows, {
      sequences: live.length,
      drafting: drafted,
      drafts: rows - live.length,
    });
    this.policy?.observeStep?.(live.length, rows, drafted, rows - live.length, t2 - t1, proposeMs, proposedDrafts);
    if (this.policy?.observeRealized !== undefined) {
      let committed = 0;
      for (const o of accepted.outcomes) if (!failed.has(o.seq.id)) committed += o.acc.accepted + 1;
      this.policy.observeRealized(live.length, committed, t3 - t0);
    }
    for (const o of accepted.outcomes) {
      const { seq: r, acc, drafts } = o;
      if (failed.size > 0 && failed.has(r.id)) continue;
      const committed: number[] = [];
      for (let j = 0; j < acc.accepted; j++) committed.push(drafts[j]!);
      committed.push(acc.bonus);
      const reason = this.emit(r, committed, committedLogprobs(ctx, verified, o));
      if (reason !== undefined) done.push(this.finish(r, reason));
    }
    if (failed.size > 0)
      for (const r of live) {
        const err = failed.get(r.id);
        if (err !== undefined) done.push(this.fail(r, err));
      }
    return done;
  }

  /**
   * Appends committed tokens to the output, stopping at the first finish condition; `logprobs` (requests that asked
   * for them) go with their tokens to `onToken`.
   */
  private emit(r: Running, tokens: readonly number[], logprobs?: readonly TokenLogprob[]): FinishReason | undefined {
    const req = r.req;
    // below minTokens the processor masked EOS and the stop ids, and stop strings are not checked (vLLM)
    const minTokens = req.sampling.minTokens ?? 0;
    for (let i = 0; i < tokens.length; i++) {
      const t = tokens[i]!;
      r.history[r.historyLength++] = t;
      r.out.push(t);
      r.logits?.push(t);
      req.onToken?.(t, logprobs?.[i]);
      if (req.ignoreEos !== true && req.eosTokenIds?.includes(t) === true && r.out.length >= minTokens) return 'eos';
      if (req.stopTokenIds?.includes(t) === true && r.out.length >= minTokens) return 'stop';
      if (req.stopStrings !== undefined && req.stopStrings.length > 0 && r.out.length > minTokens) {
        // add() refuses stopStrings without the decode option
        if (this.options.decode === undefined)
          throw new EngineError(`emit: request ${String(req.id)}: internal error: stopStrings without decode`);
        const text = this.options.decode(r.out);
        // with min_tokens, a stop string counts from the end of the first min_tokens tokens' text
        r.stopTextFrom ??= minTokens > 0 ? this.options.decode(r.out.slice(0, minTokens)).length : 0;
        const from = r.stopTextFrom;
        if (req.stopStrings.some((s) => text.indexOf(s, from) >= 0)) return 'stop';
      }
      if (r.out.length >= req.maxTokens) return 'length';
    }
    return undefined;
  }

  private finish(r: Running, reason: FinishReason): SpecResult {
    const id = r.req.id;
    this.running.delete(id);
    this.known.delete(id);
    this.cache.finish(id);
    this.drafter?.freeSequence(id);
    this.context?.discard(r);
    this.policy?.release(id);
    this.metrics.requests.push(r.metrics);
    return { id, tokenIds: r.out, finishReason: reason, metrics: r.metrics };
  }

  /**
   * Ends a request that failed alone: frees its target pages, state slot and draft context (its metrics are not
   * recorded) and reports it with finish reason `'error'`.
   */
  private fail(r: Running, error: SequenceError): SpecResult {
    const result = this.finish(r, 'error');
    this.metrics.requests.pop();
    return { ...result, error };
  }
}
