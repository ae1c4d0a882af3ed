/**
 * The speculative-decoding engine (aggregated, one stage). It knows only the contracts
 * ({@link StageModel}, {@link Drafter}) and never branches on a method.
 *
 * Per request: prefill in chunks of `prefillChunk` tokens, ONE chunk per step (chunked prefill that
 * interleaves with decoding, as vLLM / SGLang: a long prompt never stalls the running streams for
 * more than one chunk forward per step); each chunk's taps are kept for the draft context
 * (`projectTargetHiddenPartial` → `writeProjectedContextKV` before the sequence first drafts);
 * first token from the last chunk's logits; then every {@link step}:
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
 * Commit modes: `'snapshots'` (default when the stage has `commitPrefix`) needs exactly one target
 * forward per verify step; `'replay'` restores a checkpoint and re-runs the committed tokens when a
 * draft was rejected (one more forward). docs/ARCHITECTURE.md has the measured comparison.
 */

import { argmax } from '@specd/native';

import { SequenceCache } from '../kv/sequence-cache.js';
import type { SequenceCheckpoint } from '../kv/sequence-cache.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { ContextSpan, DraftProposal, DraftSampling, DraftSequence, Drafter } from '../plugin/drafter-plugin.js';
import type { ForwardResult, ForwardSequence, StageModel } from '../plugin/model-plugin.js';
import { acceptGreedy, acceptSampled, type AcceptResult } from './accept.js';
import { CostDraftPolicy, fixedDraftPolicy, type CostDraftPolicyOptions, type DraftPolicy } from './draft-policy.js';
import { calibrateStepCosts, type StepCosts } from './step-costs.js';
import { RequestMetrics, RunMetrics } from './metrics.js';
import { sampleFromProbs, samplingProbs } from './probs.js';
import { SeededRandom } from '../cli/sampling.js';

/** One generation request. */
export interface SpecRequest {
  readonly id: SequenceId;
  /** Prompt token ids `[P]` i32, P ≥ 1. */
  readonly promptIds: Int32Array;
  /** New tokens at most (≥ 1). */
  readonly maxTokens: number;
  readonly sampling: DraftSampling;
  /** PRNG seed of the request (drafts and verification draw from one stream). */
  readonly seed: number;
  /**
   * The client fixed `seed` (OpenAI `seed`, `specd generate --seed`, a configured default seed) and
   * expects the same output for the same request. With temperature > 0 under a timing-based draft
   * policy (`'cost'`, or any {@link CostDraftPolicy}) the engine then verifies this request with
   * k = 0 every step: plain decoding, one PRNG draw per token, so its tokens depend only on the seed
   * and the target's logits (batch-invariant) — a k picked from measured timings would consume the
   * PRNG stream differently run to run. No effect at temperature 0 (greedy output never depends on
   * k), under `'max'`, a fixed policy or the `draftLength` hook (their k is not timing-based).
   * Default false.
   */
  readonly seeded?: boolean;
  /** Keep going after EOS. */
  readonly ignoreEos?: boolean;
  /** EOS ids (ignored with ignoreEos). */
  readonly eosTokenIds?: readonly number[];
  /** Stop when the generated text contains one of these (needs the engine's `decode`). */
  readonly stopStrings?: readonly string[];
  /** Called with each committed token, in order. */
  readonly onToken?: (id: number) => void;
}

/** Why a request ended. */
export type FinishReason = 'eos' | 'stop' | 'length' | 'abort';

/** A finished request. */
export interface SpecResult {
  readonly id: SequenceId;
  /** Generated ids (the EOS / stop-completing token included). */
  readonly tokenIds: number[];
  readonly finishReason: FinishReason;
  readonly metrics: RequestMetrics;
}

/** Options of {@link SpecEngine}. */
export interface SpecEngineOptions {
  /** Running sequences at most (default 8). */
  readonly maxSequences?: number;
  /** Prompt + generated + one draft block, per sequence, at most (sizes the KV pools; default 4096). */
  readonly maxTokensPerSequence?: number;
  /** Target KV page size, tokens (default 16). */
  readonly pageSize?: number;
  /**
   * Tokens per prefill forward (default 64). A prompt of P tokens is prefilled over ⌈P / prefillChunk⌉
   * steps, one chunk per step (chunk i = prompt tokens [i·prefillChunk, (i+1)·prefillChunk)), while
   * the sequences already decoding take their propose → verify round in every one of those steps.
   */
  readonly prefillChunk?: number;
  /** How to commit a partially accepted block (default: 'snapshots' when the stage supports it, else 'replay'). */
  readonly commit?: 'snapshots' | 'replay';
  /** Detokenizer for stop strings. */
  readonly decode?: (ids: readonly number[]) => string;
  /**
   * How many drafts each sequence verifies per step (draft-policy.ts). `'cost'` (default, see
   * {@link DEFAULT_DRAFT_POLICY}): the cost-based policy — at the first step (before any request is admitted) the engine measures
   * t_verify / t_draft for its batch-size buckets on this machine (step-costs.ts; cached per
   * target/drafter, thread count and commit mode), then each step picks per sequence the k that
   * maximises expected committed tokens per second, k = 0 (a plain decode step) included; with
   * proposal confidences it also cuts each proposal to its survival budget ({@link verifyBudget}).
   * `'max'`: always the drafter's maximum (fixed k = maxDraftTokens; τ tests
   * compare with the reference at the full block, and sampled outputs stay reproducible per seed,
   * which a timing-based policy does not guarantee).
   * Or any {@link DraftPolicy}, e.g. `fixedDraftPolicy(7)`. Ignored when `draftLength` is given.
   */
  readonly draftPolicy?: 'cost' | 'max' | DraftPolicy;
  /** Options of the `'cost'` policy. */
  readonly costPolicy?: CostDraftPolicyOptions;
  /**
   * Verify budgets for proposals with `confidence` (adaptive verification): `'survival'` (default)
   * asks the policy's `budgets` hook — the `'cost'` policy verifies the drafts whose survival
   * Π c_l ≥ λ; `'max'` and fixed policies have no hook and verify everything — `'all'` never cuts.
   */
  readonly verifyBudget?: 'survival' | 'all';
  /**
   * Per-sequence draft length hook (fixed k: `() => 7`; EMA: `adaptiveDraftLength()`), clamped to
   * [0, drafter.maxDraftTokens]; takes precedence over `draftPolicy`.
   */
  readonly draftLength?: (id: SequenceId, metrics: RequestMetrics) => number;
}

/** The engine's draft policy when none is given (see {@link SpecEngineOptions.draftPolicy}). */
export const DEFAULT_DRAFT_POLICY: 'cost' | 'max' = 'cost';

/** Tap bytes a sequence may hold for its deferred draft context before it is written (8 MiB). */
const PENDING_TAP_BYTES = 8 << 20;

/**
 * Key of `ForwardResult.projection` among a result's context inputs: the fp32 partial projection of
 * the taps earlier pipeline stages projected, passed as the accumulator of
 * `projectTargetHiddenPartial` for the remaining taps (tap ids are ≥ 0).
 */
const PROJECTED = -1;

/** A forward result's inputs to the draft context: its taps, and its partial projection under {@link PROJECTED}. */
function contextInputs(res: ForwardResult): [number, Float32Array][] {
  const out = [...res.taps];
  if (res.projection !== undefined) out.push([PROJECTED, res.projection]);
  return out;
}

/** Projects gathered context inputs (taps + {@link PROJECTED} rows) of `n` rows: Σ over the taps added into the projected rows. */
function project(drafter: Drafter, inputs: ReadonlyMap<number, Float32Array>, n: number): Float32Array {
  const taps = new Map([...inputs].filter(([t]) => t !== PROJECTED));
  return drafter.projectTargetHiddenPartial(taps, n, inputs.get(PROJECTED));
}

/** True for a proposal whose drafts form a tree (some parent is not the previous draft). */
function isTree(p: DraftProposal): boolean {
  return p.parents?.some((v, j) => v !== j - 1) ?? false;
}

/**
 * Greedy acceptance of a token tree (REFERENCE.md §5, EAGLE tree verification at temperature 0):
 * from the root row, follow the child whose token is the target's argmax at the current row; stop
 * where no child matches — the argmax there is the bonus.
 * @param tokens block `[n]` (row 0 = the last verified token); @param tree parent row of each row
 *   (`[n]`, row 0: −1); @param logits `[n, V]` f32, the verify forward's rows.
 * @returns the kept rows (a root path, `rows[0] = 0`) and the accept result (accepted = rows − 1).
 */
export function acceptTreeGreedy(
  tokens: Int32Array,
  tree: Int32Array,
  logits: Float32Array,
  V: number,
): { rows: number[]; acc: AcceptResult } {
  const rows = [0];
  for (;;) {
    const cur = rows[rows.length - 1]!;
    const t = argmax(logits.subarray(cur * V, (cur + 1) * V), V)[0]!;
    let next = -1;
    for (let c = cur + 1; c < tokens.length; c++) {
      if (tree[c] === cur && tokens[c] === t) {
        next = c;
        break;
      }
    }
    if (next < 0) return { rows, acc: { accepted: rows.length - 1, bonus: t } };
    rows.push(next);
  }
}

interface Running {
  readonly req: SpecRequest;
  readonly rng: SeededRandom;
  readonly metrics: RequestMetrics;
  /**
   * Prompt tokens prefilled so far, in [0, P]. The sequence is prefilling while it is < P (one chunk
   * per step); at P its first token has been emitted and it takes part in every verify round.
   */
  prefilled: number;
  /** Verified with k = 0 every step (a seeded sampled request under a timing-based policy; {@link SpecRequest.seeded}). */
  readonly plainOnly: boolean;
  /** Prompt + committed tokens, the last verified token included. */
  history: Int32Array;
  historyLength: number;
  readonly out: number[];
  /**
   * Committed tokens whose draft context is not written yet (steps with k = 0 defer it: a sequence
   * that is not drafting does not pay the projection; flushed in one call before it drafts again).
   * `taps`: per tap id, row blocks `[n_i, hidden]` f32 in position order; key {@link PROJECTED} holds
   * the rows of `ForwardResult.projection` (taps already projected by pipeline stages).
   */
  pending?: { position: number; numTokens: number; readonly taps: Map<number, Float32Array[]> };
}

/** Thrown for a bad request (names the field) or a misuse of the engine. */
export class EngineError extends Error {
  override readonly name = 'EngineError';
}

/** The spec-decode loop over one target stage and an optional drafter. Not thread-safe. */
export class SpecEngine {
  /** The target's caches (inspect `pagesInUse` / `slotsInUse`). */
  readonly cache: SequenceCache;
  readonly metrics = new RunMetrics();
  private readonly waiting: SpecRequest[] = [];
  /** Ids waiting or running. */
  private readonly known = new Set<SequenceId>();
  private readonly running = new Map<SequenceId, Running>();
  private readonly taps: readonly number[];
  private readonly maxSequences: number;
  private readonly maxTokensPerSequence: number;
  private readonly prefillChunk: number;
  private readonly commitMode: 'snapshots' | 'replay';
  private readonly vocab: number;
  /** The batch-level policy (undefined: `draftLength` hook, or no drafter). Set at the first step for `'cost'`. */
  private policy: DraftPolicy | undefined;
  /** True when k comes from measured timings (`'cost'` or a {@link CostDraftPolicy}; see {@link SpecRequest.seeded}). */
  private readonly timingPolicy: boolean;
  /** The measured costs of the `'cost'` policy (after the first step). */
  stepCosts: StepCosts | undefined;

  /**
   * @throws {EngineError} for a stage that is not a whole model, `commit: 'snapshots'` on a stage
   *   without commitPrefix, or a prefillChunk that is not an integer ≥ 1.
   */
  constructor(
    readonly target: StageModel,
    readonly drafter: Drafter | undefined,
    private readonly options: SpecEngineOptions = {},
  ) {
    const info = target.info;
    if (!info.isFirst || !info.isLast)
      throw new EngineError(
        'SpecEngine: target: expected a whole-model stage (first and last; a pipeline is one PipelineModel, pipeline/pipeline-model.ts)',
      );
    this.maxSequences = options.maxSequences ?? 8;
    this.maxTokensPerSequence = options.maxTokensPerSequence ?? 4096;
    this.prefillChunk = options.prefillChunk ?? 64;
    if (!(Number.isSafeInteger(this.prefillChunk) && this.prefillChunk >= 1))
      throw new EngineError(`SpecEngine: prefillChunk: expected an integer >= 1, got ${this.prefillChunk}`);
    const pageSize = options.pageSize ?? 16;
    const pagesPerSeq = Math.ceil(this.maxTokensPerSequence / pageSize) + 1;
    const cacheOptions = { pageSize, numPages: this.maxSequences * pagesPerSeq, numSlots: this.maxSequences };
    this.cache = target.createCache?.(cacheOptions) ?? new SequenceCache(target.cacheGeometry, cacheOptions);
    this.commitMode = options.commit ?? (target.commitPrefix !== undefined ? 'snapshots' : 'replay');
    if (this.commitMode === 'snapshots' && target.commitPrefix === undefined)
      throw new EngineError('SpecEngine: commit: "snapshots" needs a stage with commitPrefix');
    this.taps = drafter === undefined ? [] : drafter.captureSetter(info);
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
   * before admitting the first requests). @returns the measured (or cached) costs.
   */
  calibrate(): StepCosts | undefined {
    if (!this.needsCalibration) return this.stepCosts;
    if (this.running.size > 0) throw new EngineError('calibrate: needs an idle engine (no running sequences)');
    const t0 = performance.now();
    this.stepCosts = calibrateStepCosts(this.target, this.drafter!, this.cache, {
      maxSequences: this.maxSequences,
      maxDrafts: this.drafter!.maxDraftTokens,
      stateSnapshots: this.commitMode === 'snapshots',
      taps: this.taps,
      // the scratch context plus the largest verify block must fit a sequence (a short `generate` sizes it tightly)
      contextTokens: Math.max(1, Math.min(32, this.maxTokensPerSequence - this.drafter!.maxDraftTokens - 1)),
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
    const P = req.promptIds.length;
    if (P < 1) throw new EngineError(`add: request ${String(req.id)}: promptIds: expected at least one token`);
    if (!Number.isSafeInteger(req.maxTokens) || req.maxTokens < 1)
      throw new EngineError(
        `add: request ${String(req.id)}: maxTokens: expected an integer >= 1, got ${req.maxTokens}`,
      );
    const need = P + req.maxTokens + (this.drafter?.maxDraftTokens ?? 0) + 1;
    if (need > this.maxTokensPerSequence) {
      throw new EngineError(
        `add: request ${String(req.id)}: prompt ${P} + maxTokens ${req.maxTokens} + a draft block needs ${need} tokens, maxTokensPerSequence is ${this.maxTokensPerSequence}`,
      );
    }
    if (this.known.has(req.id)) throw new EngineError(`add: request ${String(req.id)}: id already queued`);
    if ((req.stopStrings?.length ?? 0) > 0 && this.options.decode === undefined)
      throw new EngineError(`add: request ${String(req.id)}: stopStrings need the engine's decode option`);
    this.waiting.push(req);
    this.known.add(req.id);
  }

  /**
   * Aborts a request, waiting, prefilling (some chunks done) or decoding: frees its target pages,
   * state slot, draft pages and deferred taps. @returns its result, or undefined if unknown.
   */
  abort(id: SequenceId): SpecResult | undefined {
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

  /** Runs every queued request to the end. @returns results in finishing order. */
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
   * @returns the requests that finished in this step.
   * @throws the target's / drafter's errors; a failing prefill chunk first frees its own request.
   */
  step(): SpecResult[] {
    const done: SpecResult[] = [];
    if (this.needsCalibration && this.running.size === 0 && this.waiting.length > 0) this.calibrate();
    const admit = Math.min(this.waiting.length, this.maxSequences - this.running.size);
    for (const req of this.waiting.splice(0, Math.max(0, admit))) this.admit(req);
    for (const r of [...this.running.values()]) {
      if (r.prefilled === r.req.promptIds.length) continue;
      const f = this.prefillStep(r);
      if (f !== undefined) done.push(f);
    }
    const decoding = [...this.running.values()].filter((r) => r.prefilled === r.req.promptIds.length);
    if (decoding.length > 0) done.push(...this.specStep(decoding));
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
    for (const w of this.waiting) this.known.delete(w.id);
    this.waiting.length = 0;
  }

  // --- prefill -----------------------------------------------------------------------------------

  /** Allocates a sequence for `req` (target cache, draft context) and makes it running, 0 tokens prefilled. */
  private admit(req: SpecRequest): void {
    const id = req.id;
    this.cache.add(id);
    this.drafter?.addSequence(id);
    const P = req.promptIds.length;
    const r: Running = {
      req,
      rng: new SeededRandom(req.seed),
      metrics: new RequestMetrics(),
      prefilled: 0,
      plainOnly: this.timingPolicy && req.seeded === true && req.sampling.temperature > 0,
      history: new Int32Array(P + req.maxTokens + (this.drafter?.maxDraftTokens ?? 0) + 1),
      historyLength: P,
      out: [],
    };
    r.history.set(req.promptIds);
    this.running.set(id, r);
  }

  /**
   * Runs the next prefill chunk of `r`: prompt tokens [prefilled, min(P, prefilled + prefillChunk)),
   * one target forward with taps (kept for the draft context, written before the sequence first
   * drafts). After the last chunk: the first token (argmax, or sampled from the processed p).
   * @returns the request's result when it finished on its first token.
   * @throws what the forward throws, after freeing the request (its metrics are not recorded).
   */
  private prefillStep(r: Running): SpecResult | undefined {
    const req = r.req;
    const id = req.id;
    const P = req.promptIds.length;
    const p = r.prefilled;
    const end = Math.min(P, p + this.prefillChunk);
    const tokens = req.promptIds.subarray(p, end);
    let first: number | undefined;
    try {
      const res = this.target.forward(
        { sequences: [{ id, position: p, tokens, logits: end === P ? 'last' : 'none', phase: 'prefill' }] },
        this.cache,
        { taps: this.taps },
      );
      this.metrics.prefillForwards++;
      r.metrics.prefillForwards++;
      r.metrics.targetForwards++;
      r.prefilled = end;
      if (this.drafter !== undefined && !r.plainOnly) this.defer(r, res, 0, p, tokens.length); // written before its first propose
      if (end === P) {
        first =
          req.sampling.temperature === 0
            ? argmax(res.logits!, this.vocab)[0]!
            : sampleFromProbs(samplingProbs(res.logits!, this.vocab, req.sampling), r.rng);
      }
    } catch (err) {
      this.finish(r, 'abort'); // frees what the failed prefill holds, then reports the error
      this.metrics.requests.pop();
      throw err;
    }
    if (first === undefined) return undefined;
    const reason = this.emit(r, [first]);
    return reason === undefined ? undefined : this.finish(r, reason);
  }

  /**
   * A tree proposal must be verifiable: a target with `commitTreePath` (attention-only; a tree over
   * linear-attention layers would need per-branch state), greedy sampling (trees are verified along
   * the argmax path; drafters propose chains at temperature > 0), parents before children.
   * @throws {EngineError} naming the sequence and the reason.
   */
  private checkTree(p: DraftProposal, r: Running): void {
    const id = String(p.id);
    if (this.target.commitTreePath === undefined)
      throw new EngineError(
        `propose: ${id}: tree drafts need a target that verifies trees (StageModel.commitTreePath: attention-only stages); this one verifies chains only`,
      );
    if (r.req.sampling.temperature !== 0)
      throw new EngineError(
        `propose: ${id}: tree drafts are verified greedily only (temperature 0); at temperature ${r.req.sampling.temperature} the drafter must propose a chain`,
      );
    if (p.parents!.length !== p.tokens.length)
      throw new EngineError(`propose: ${id}: parents: expected [${p.tokens.length}], got ${p.parents!.length}`);
    p.parents!.forEach((v, j) => {
      if (!(Number.isInteger(v) && v >= -1 && v < j))
        throw new EngineError(`propose: ${id}: parents[${j}] = ${v}: expected −1 or an earlier draft`);
    });
  }

  /** Projects the taps of rows `rows[s]` (`[spans[s].numTokens]`, batch rows of `res`) and writes them as draft context. */
  private materialise(spans: readonly ContextSpan[], res: ForwardResult, rows: readonly Int32Array[]): void {
    const drafter = this.drafter!;
    const n = spans.reduce((a, s) => a + s.numTokens, 0);
    if (n === 0) return;
    const D = this.target.info.hiddenSize;
    const gathered = new Map<number, Float32Array>();
    for (const [tap, h] of contextInputs(res)) {
      const g = new Float32Array(n * D);
      let at = 0;
      spans.forEach((s, i) => {
        for (let j = 0; j < s.numTokens; j++) g.set(h.subarray(rows[i]![j]! * D, (rows[i]![j]! + 1) * D), (at + j) * D);
        at += s.numTokens;
      });
      gathered.set(tap, g);
    }
    drafter.writeProjectedContextKV(project(drafter, gathered, n), spans);
  }

  /**
   * Keeps the taps of `n` committed rows from `row` of `res` for the sequence's draft context, to
   * write before the sequence next drafts (a sequence that never drafts again never pays the
   * projection). Written at once when the kept taps pass {@link PENDING_TAP_BYTES}.
   */
  private defer(r: Running, res: ForwardResult, row: number, position: number, n: number): void {
    const D = this.target.info.hiddenSize;
    r.pending ??= { position, numTokens: 0, taps: new Map() };
    const inputs = contextInputs(res);
    for (const [tap, h] of inputs) {
      let list = r.pending.taps.get(tap);
      if (list === undefined) {
        list = [];
        r.pending.taps.set(tap, list);
      }
      list.push(h.slice(row * D, (row + n) * D));
    }
    r.pending.numTokens += n;
    // Flush early only when the token after every kept row is known (not at the last prefill chunk,
    // whose last row is followed by the first generated token): the bound is then one chunk over.
    const known = r.historyLength > r.pending.position + r.pending.numTokens;
    if (known && r.pending.numTokens * inputs.length * D * 4 > PENDING_TAP_BYTES) this.flushPending([r]);
  }

  /** Writes the deferred draft context of `rs` (one projection call for all of them). */
  private flushPending(rs: readonly Running[]): void {
    if (rs.length === 0) return;
    const D = this.target.info.hiddenSize;
    const n = rs.reduce((a, r) => a + r.pending!.numTokens, 0);
    const gathered = new Map<number, Float32Array>();
    for (const tap of rs[0]!.pending!.taps.keys()) {
      const g = new Float32Array(n * D);
      let at = 0;
      for (const r of rs) {
        for (const block of r.pending!.taps.get(tap)!) {
          g.set(block, at);
          at += block.length;
        }
      }
      gathered.set(tap, g);
    }
    const spans = rs.map((r) => {
      const { position, numTokens } = r.pending!;
      return { id: r.req.id, position, numTokens, nextTokens: r.history.slice(position + 1, position + 1 + numTokens) };
    });
    const drafter = this.drafter!;
    drafter.writeProjectedContextKV(project(drafter, gathered, n), spans);
    for (const r of rs) r.pending = undefined;
  }

  // --- the speculative step ------------------------------------------------------------------------

  /** One propose → verify → accept → commit round over `seqs` (running, done prefilling). */
  private specStep(seqs: readonly Running[]): SpecResult[] {
    const drafter = this.drafter;
    // propose
    const t0 = performance.now();
    const maxK = drafter?.maxDraftTokens ?? 0;
    const caps = seqs.map((r) => (r.plainOnly ? 0 : Math.max(0, Math.min(maxK, r.req.maxTokens - r.out.length))));
    let wants: number[];
    if (drafter === undefined) {
      wants = caps.map(() => 0);
    } else if (this.options.draftLength !== undefined) {
      const hook = this.options.draftLength;
      wants = seqs.map((r, i) =>
        Math.min(caps[i]!, Math.max(0, Math.min(maxK, Math.floor(hook(r.req.id, r.metrics))))),
      );
    } else {
      const chosen = this.policy!.choose(
        seqs.map((r, i) => ({ id: r.req.id, maxDrafts: caps[i]!, metrics: r.metrics })),
      );
      wants = chosen.map((k, i) => Math.max(0, Math.min(caps[i]!, Math.floor(k))));
    }
    this.flushPending(seqs.filter((r, i) => wants[i]! > 0 && r.pending !== undefined));
    const proposals = new Map<SequenceId, DraftProposal>();
    const toDraft: DraftSequence[] = [];
    seqs.forEach((r, i) => {
      if (wants[i]! > 0) {
        toDraft.push({
          id: r.req.id,
          position: r.historyLength - 1,
          lastToken: r.history[r.historyLength - 1]!,
          maxDrafts: wants[i]!,
          history: r.history.subarray(0, r.historyLength),
          sampling: r.req.sampling,
          rng: r.rng,
        });
      }
    });
    let proposeMs = 0;
    if (toDraft.length > 0) {
      this.metrics.proposeCalls++;
      const tp = performance.now();
      const proposed = drafter!.propose({ sequences: toDraft });
      proposeMs = performance.now() - tp;
      for (const p of proposed) {
        const at = seqs.findIndex((r) => r.req.id === p.id);
        if (p.tokens.length > (wants[at] ?? 0))
          throw new EngineError(`propose: ${String(p.id)}: more drafts than maxDrafts`);
        if (isTree(p)) this.checkTree(p, seqs[at]!);
        proposals.set(p.id, p);
      }
      this.applyBudgets(proposals);
    }
    const t1 = performance.now();
    // verify: one forward over every running sequence
    const fseqs: ForwardSequence[] = [];
    const checkpoints = new Map<SequenceId, SequenceCheckpoint>();
    for (const r of seqs) {
      const drafts = proposals.get(r.req.id)?.tokens ?? new Int32Array(0);
      const tokens = new Int32Array(drafts.length + 1);
      tokens[0] = r.history[r.historyLength - 1]!;
      tokens.set(drafts, 1);
      if (this.commitMode === 'replay' && drafts.length > 0) checkpoints.set(r.req.id, this.cache.checkpoint(r.req.id));
      const p = proposals.get(r.req.id);
      const tree =
        p !== undefined && isTree(p)
          ? Int32Array.from([-1, ...Array.from(p.parents!.subarray(0, drafts.length), (v) => v + 1)])
          : undefined;
      fseqs.push({
        id: r.req.id,
        position: this.cache.length(r.req.id),
        tokens,
        logits: 'all',
        ...(tree === undefined ? {} : { tree }),
      });
    }
    // A block of one token always commits whole: no snapshots (and no commitPrefix) when nobody drafted.
    const snapshots = this.commitMode === 'snapshots' && fseqs.some((f) => f.tokens.length > 1);
    const res = this.target.forward({ sequences: fseqs }, this.cache, { taps: this.taps, stateSnapshots: snapshots });
    this.metrics.verifyForwards++;
    this.metrics.decodeForwards++;
    const t2 = performance.now();
    // accept + commit
    const V = this.vocab;
    const spans: ContextSpan[] = [];
    const spanRows: Int32Array[] = [];
    const outcomes: { r: Running; acc: AcceptResult; drafts: Int32Array }[] = [];
    let row = 0;
    seqs.forEach((r, i) => {
      const id = r.req.id;
      const fs = fseqs[i]!;
      const k = fs.tokens.length - 1;
      let drafts = fs.tokens.subarray(1);
      const lg = res.logits!.subarray(res.logitRowStart[i]! * V, res.logitRowStart[i + 1]! * V);
      // A tree is accepted greedily along the target's argmax path (rows = the kept block rows).
      const path = fs.tree === undefined ? undefined : acceptTreeGreedy(fs.tokens, fs.tree, lg, V);
      const acc =
        path !== undefined
          ? path.acc
          : r.req.sampling.temperature === 0
            ? acceptGreedy(drafts, lg, V)
            : acceptSampled(drafts, proposals.get(id)?.probs, samplingProbs(lg, V, r.req.sampling), V, r.rng);
      if (path !== undefined) drafts = Int32Array.from(path.rows.slice(1), (x) => fs.tokens[x]!);
      const committed = acc.accepted + 1;
      if (path !== undefined) {
        this.target.commitTreePath!(this.cache, res, id, path.rows);
      } else if (snapshots) {
        this.target.commitPrefix!(this.cache, res, id, committed);
      } else if (committed < k + 1) {
        this.cache.rollback(id, checkpoints.get(id)!);
        this.target.forward(
          { sequences: [{ id, position: fs.position, tokens: fs.tokens.subarray(0, committed), logits: 'none' }] },
          this.cache,
        );
        this.metrics.decodeForwards++;
        r.metrics.targetForwards++;
      }
      r.metrics.targetForwards++;
      r.metrics.recordStep(k, acc.accepted);
      this.policy?.observe(id, k, acc.accepted);
      if (k === 0) {
        // a plain-only sequence never drafts: its draft context is never needed
        if (this.drafter !== undefined && !r.plainOnly) this.defer(r, res, row, fs.position, committed);
      } else {
        const next = new Int32Array(committed);
        next.set(drafts.subarray(0, acc.accepted));
        next[acc.accepted] = acc.bonus;
        spans.push({ id, position: fs.position, numTokens: committed, nextTokens: next });
        spanRows.push(Int32Array.from(path?.rows ?? Array.from({ length: committed }, (_, j) => j), (x) => row + x));
      }
      row += fs.tokens.length;
      outcomes.push({ r, acc, drafts });
    });
    if (this.drafter !== undefined && spans.length > 0) this.materialise(spans, res, spanRows);
    const t3 = performance.now();
    this.metrics.draftMs += t1 - t0;
    this.metrics.verifyMs += t2 - t1;
    this.metrics.commitMs += t3 - t2;
    this.policy?.observeOverhead?.(t1 - t0 - proposeMs + (t3 - t2), toDraft.length > 0);
    this.policy?.observeStep?.(seqs.length, row, toDraft.length, row - seqs.length, t2 - t1, proposeMs);
    const done: SpecResult[] = [];
    for (const { r, acc, drafts } of outcomes) {
      const toks = [...drafts.subarray(0, acc.accepted), acc.bonus];
      const reason = this.emit(r, toks);
      if (reason !== undefined) done.push(this.finish(r, reason));
    }
    return done;
  }

  /**
   * Verify budgets (see {@link SpecEngineOptions.verifyBudget}): offers the proposals with
   * `confidence` to the policy's `budgets` hook and cuts each to its budget in place (in `proposals`).
   */
  private applyBudgets(proposals: Map<SequenceId, DraftProposal>): void {
    const hook = this.policy?.budgets;
    if (
      hook === undefined ||
      (this.options.verifyBudget ?? 'survival') === 'all' ||
      this.options.draftLength !== undefined
    )
      return;
    const items = [...proposals.values()].filter((p) => p.confidence !== undefined && p.tokens.length > 0);
    if (items.length === 0) return;
    for (const p of items) {
      if (p.confidence!.length !== p.tokens.length)
        throw new EngineError(
          `propose: ${String(p.id)}: confidence has ${p.confidence!.length} entries for ${p.tokens.length} drafts`,
        );
    }
    const budgets = hook.call(
      this.policy,
      items.map((p) => ({ id: p.id, confidence: p.confidence! })),
    );
    const V = this.vocab;
    items.forEach((p, i) => {
      const k = p.tokens.length;
      const b = Math.max(0, Math.min(k, Math.floor(budgets[i] ?? k)));
      this.running.get(p.id)?.metrics.recordBudget(k, b);
      if (b === k) return;
      proposals.set(p.id, {
        id: p.id,
        tokens: p.tokens.subarray(0, b),
        ...(p.probs === undefined ? {} : { probs: p.probs.subarray(0, b * V) }),
        ...(p.parents === undefined ? {} : { parents: p.parents.subarray(0, b) }),
        confidence: p.confidence!.subarray(0, b),
      });
    });
  }

  /** Appends committed tokens to the output, stopping at the first finish condition. */
  private emit(r: Running, tokens: readonly number[]): FinishReason | undefined {
    const req = r.req;
    for (const t of tokens) {
      r.history[r.historyLength++] = t;
      r.out.push(t);
      req.onToken?.(t);
      if (req.ignoreEos !== true && req.eosTokenIds?.includes(t) === true) return 'eos';
      if (req.stopStrings !== undefined && req.stopStrings.length > 0) {
        const text = this.options.decode!(r.out);
        if (req.stopStrings.some((s) => text.includes(s))) return 'stop';
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
    this.policy?.release(id);
    this.metrics.requests.push(r.metrics);
    return { id, tokenIds: r.out, finishReason: reason, metrics: r.metrics };
  }
}
