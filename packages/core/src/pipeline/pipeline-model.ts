/**
 * Pipeline parallelism (PP) with stages as separate processes (docs/ARCHITECTURE.md "Pipeline
 * parallelism").
 *
 * The driver process (the one running {@link SpecEngine}) runs the LAST stage in-process — it owns
 * the drafter, the sampler and the draft KV (REFERENCE.md §8) — and forks one stage process per
 * earlier stage (stage-worker.js), each loading only its layer range with its own
 * {@link SequenceCache}. The engine sees one whole-model {@link StageModel}, {@link PipelineModel}:
 * - `forward` runs stage 0 → 1 → … → last: each remote stage gets the batch (ids, positions, tokens),
 *   the previous stage's `hidden` and the fp32 projection accumulator, and answers its `hidden` plus
 *   either the accumulator with its own taps' products added (once `distributeProjection` loaded its
 *   share of the drafter's fc: the default for DFlash, DSpark and EAGLE-3) or its raw taps
 *   (`stageTaps`); the last stage runs locally. The result carries the accumulator
 *   (`ForwardResult.projection`) and the taps not projected yet; the engine projects those into the
 *   accumulator — tap by tap in ascending order, as at pp = 1, so the bits are pp = 1's.
 * - the engine's cache is a {@link PipelineCache} (`createCache`): a SequenceCache for the last
 *   stage that also records the engine's cache operations (add, finish/abort, checkpoint, rollback)
 *   and the commits (`commitPrefix`, `commitTreePath`) per remote stage; the records travel with the
 *   next forward request and each stage applies them to its own cache before running — no extra
 *   round trip.
 * - a stage process that dies fails the call in progress (and every later one) with a
 *   {@link PipelineStageError} naming the stage, its layers, pid and exit code / signal.
 * - transport (`PipelineOptions.transport`): ZeroMQ PAIR sockets over `ipc://` (default;
 *   zmq-channel.ts, zmq-stage.ts) or a pair of FIFOs per stage (transport.ts).
 *
 * This file holds the composite; {@link RemoteStage} is in remote-stage.ts, the stage processes'
 * forking, registry and liveness in stage-process.ts, and {@link startPipeline} in start-pipeline.ts.
 */

import type { TensorRead } from '../io/weight-reader.js';
import type { CacheGeometry, SequenceCache, SequenceCacheOptions } from '../kv/sequence-cache.js';
import { type Drafter, type DrafterLoadOptions, stageTaps } from '../plugin/drafter-plugin.js';
import type {
  ForwardBatch,
  ForwardOptions,
  ForwardResult,
  ProjectionSpec,
  StageInfo,
  StageModel,
} from '../plugin/model-plugin.js';
import {
  type DistributedStage,
  hasPrefixCommit,
  hasTreeCommit,
  isDistributedStage,
  type PrefixCommit,
  type ProjectionDistribution,
  type TreeCommit,
} from '../plugin/stage-capabilities.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { PdStageLayout, StageSenders, StageSendersStart, StageSendRequest, StageUsage } from '../pd/stages.js';
import { PdError } from '../pd/types.js';
import { MirroredCache } from './mirrored-cache.js';
import type { RemoteStage, StageReport } from './remote-stage.js';
import { PipelineStageError } from './stage-process.js';
import type { CacheOp } from './stage-worker.js';

// --- the mirrored cache --------------------------------------------------------------------------

/**
 * The engine's cache of a pipeline: the last stage's cache (a {@link MirroredCache}; under TP × PP
 * the last stage's TP cache) with the pipeline's mirror attached — the engine's operations are
 * recorded for every remote stage and applied there, in order, before its next forward. Operations
 * the last stage's own forward / commit performs are not recorded (each stage does its own).
 */
export type PipelineCache = MirroredCache;

// --- the composite model -------------------------------------------------------------------------

/**
 * The whole target as one {@link StageModel} over stage processes + the local last stage: a
 * {@link ProjectionDistribution} and a {@link DistributedStage} (the drafter lives with the last stage),
 * with the last stage's commits ({@link PrefixCommit}, {@link TreeCommit}: each method set when the last
 * stage has it, else absent).
 */
export class PipelineModel
  implements
    StageModel,
    ProjectionDistribution,
    DistributedStage,
    StageSenders,
    Partial<PrefixCommit>,
    Partial<TreeCommit>
{
  readonly info: StageInfo;
  readonly cacheGeometry: CacheGeometry;
  /** Per remote stage, the cache operations not yet sent. @internal */
  readonly queues: CacheOp[][];
  readonly commitPrefix?: PrefixCommit['commitPrefix'];
  readonly commitTreePath?: TreeCommit['commitTreePath'];
  readonly embedTokens?: (tokens: Int32Array) => Float32Array;
  readonly lmHead?: (x: Float32Array, rows: number) => Float32Array;
  /** The latest forward: the composite result (what the engine holds) and the last stage's own. */
  private latest: { outer: ForwardResult; inner: ForwardResult } | undefined;
  private broken: Error | undefined;
  private readonly dropper = new FinalizationRegistry<number>((id) =>
    this.queues.forEach((q) => {
      q.push({ op: 'drop', cache: id });
    }),
  );

  constructor(
    readonly remotes: readonly RemoteStage[],
    readonly last: StageModel,
    /** What each stage loaded, in stage order (the last one = this process). */
    readonly stages: readonly StageReport[],
  ) {
    const li = last.info;
    this.info = Object.freeze({ ...li, layerStart: 0, layerEnd: li.numLayers, isFirst: true, isLast: true });
    this.cacheGeometry = last.cacheGeometry;
    this.queues = remotes.map(() => []);
    for (const r of remotes) r.pipeline = this;
    if (hasPrefixCommit(last)) {
      this.commitPrefix = (cache, result, id, committed) => {
        const pc = this.commit(cache, result);
        for (const r of remotes) r.commitPrefix(pc, result, id, committed);
        this.local(pc, () => last.commitPrefix(pc, this.latest!.inner, id, committed));
      };
    }
    if (hasTreeCommit(last)) {
      this.commitTreePath = (cache, result, id, rows) => {
        const pc = this.commit(cache, result);
        for (const r of remotes) r.commitTreePath(pc, result, id, rows);
        this.local(pc, () => last.commitTreePath(pc, this.latest!.inner, id, rows));
      };
    }
    const { embedTokens, lmHead } = last;
    if (embedTokens !== undefined) this.embedTokens = (tokens) => embedTokens.call(last, tokens);
    if (lmHead !== undefined) this.lmHead = (x, rows) => lmHead.call(last, x, rows);
  }

  /**
   * Loads a drafter where it lives, with the last stage: spread over the last stage's ranks when it is a
   * {@link DistributedStage} itself (TP × PP: its TP group), else undefined (the caller loads the whole
   * drafter on this process, beside the last stage).
   * @throws as the last stage's `loadDrafter`.
   */
  loadDrafter(
    dir: string,
    plugins: readonly string[],
    options: Omit<DrafterLoadOptions, 'target'>,
  ): Promise<Drafter | undefined> {
    return isDistributedStage(this.last) ? this.last.loadDrafter(dir, plugins, options) : Promise.resolve(undefined);
  }

  /**
   * A cache for this pipeline (the engine calls it instead of `new SequenceCache`): the last stage's
   * own cache when it makes one (a TP group's), else a plain {@link MirroredCache}, with this
   * pipeline's mirror attached.
   */
  createCache(options: SequenceCacheOptions): SequenceCache {
    const own = this.last.createCache?.(options);
    if (own !== undefined && !(own instanceof MirroredCache))
      throw new PipelineStageError("pipeline: the last stage's createCache must return a MirroredCache");
    const c = own ?? new MirroredCache(this.cacheGeometry, options);
    c.attach(this, this.queues);
    this.dropper.register(c, c.cacheId);
    return c;
  }

  /** `cache` as this pipeline's cache. @internal */
  asPipelineCache(cache: SequenceCache): MirroredCache {
    if (!(cache instanceof MirroredCache) || !cache.mirroredBy(this))
      throw new PipelineStageError('pipeline: the cache must come from PipelineModel.createCache()');
    return cache;
  }

  private commit(cache: SequenceCache, result: ForwardResult): MirroredCache {
    const pc = this.asPipelineCache(cache);
    if (this.latest === undefined || this.latest.outer !== result)
      throw new PipelineStageError('pipeline: commit of a result that is not the latest forward');
    return pc;
  }

  private local<T>(pc: MirroredCache, f: () => T): T {
    return pc.local(this, f);
  }

  forward(batch: ForwardBatch, cache: SequenceCache, options: ForwardOptions = {}): ForwardResult {
    if (this.broken !== undefined) throw this.broken;
    const pc = this.asPipelineCache(cache);
    const taps = options.taps ?? [];
    const merged = new Map<number, Float32Array>();
    let hidden: Float32Array | undefined;
    let projection: Float32Array | undefined;
    this.latest = undefined;
    let k = 0;
    try {
      for (; k < this.remotes.length; k++) {
        const r = this.remotes[k]!.forward(
          { sequences: batch.sequences, ...(hidden === undefined ? {} : { hidden }) },
          pc,
          {
            taps: stageTaps(taps, this.remotes[k]!.info),
            ...(options.stateSnapshots === undefined ? {} : { stateSnapshots: options.stateSnapshots }),
          },
          projection,
        );
        hidden = r.hidden;
        projection = r.projection ?? projection;
        for (const [t, h] of r.taps) merged.set(t, h);
      }
      const inner = this.local(pc, () =>
        this.last.forward({ sequences: batch.sequences, hidden }, pc, {
          ...options,
          taps: stageTaps(taps, this.last.info),
        }),
      );
      for (const [t, h] of inner.taps) merged.set(t, h);
      const outer: ForwardResult = { ...inner, taps: merged, ...(projection === undefined ? {} : { projection }) };
      this.latest = { outer, inner };
      return outer;
    } catch (err) {
      // stage 0 failing leaves every cache as it was; a later stage failing leaves earlier stages ahead
      if (k > 0)
        this.broken =
          err instanceof PipelineStageError
            ? err
            : new PipelineStageError(
                `pipeline: stage ${k} failed after earlier stages ran: ${(err as Error).message}`,
                { cause: err },
              );
      throw err;
    }
  }

  /**
   * Each remote stage loads the fc blocks of the drafter taps it produces and from then on returns
   * their fp32 partial projection instead of the taps; the accumulator travels stage to stage with
   * `hidden`, and the composite result's {@link ForwardResult.projection} holds it (the last stage's
   * own taps stay in `taps`, projected by the drafter on this process). The sum is bitwise the
   * pp = 1 projection (accumulate by tap in ascending order, core's TapProjection).
   * `undefined` drops the stages' projections (they ship raw taps again).
   * @returns per stage (stage order, the last = this process: `[]`), the tensor reads it made.
   * @throws {PipelineStageError} naming the stage that could not load it.
   */
  distributeProjection(spec: ProjectionSpec | undefined): TensorRead[][] {
    const reads = this.remotes.map((r) => r.loadProjection(spec));
    this.projectionReads = reads;
    return [...reads, []];
  }

  /** What each remote stage loaded for the projection ({@link distributeProjection}), stage order; empty before. */
  projectionReads: readonly (readonly TensorRead[])[] = [];

  // --- prefill/decode: each stage process sends the layers it owns (pd/stages.ts) ---------------

  /** The stages as a prefill instance names them to its decode instances (`hello-ok`). */
  get pdStages(): readonly PdStageLayout[] {
    return this.stages.map((s) => ({ layerStart: s.layerStart, layerEnd: s.layerEnd, cacheLayers: s.cacheLayers }));
  }

  /** Binds every stage process's transfer agent. @throws {PipelineStageError} naming the stage. */
  pdStart(options: StageSendersStart): void {
    for (const r of this.remotes) r.pdStart(options);
  }

  /** Stage `stage`'s process writes its entries of sequence `id` (stage-pd.ts). @throws {PdError} (rejects). */
  pdSend(stage: number, cache: SequenceCache, id: SequenceId, request: StageSendRequest): Promise<void> {
    const r = this.remotes[stage];
    if (r === undefined)
      return Promise.reject(
        new PdError('layout', `pipeline: pdSend to stage ${stage}: stages 0–${this.remotes.length - 1} send`),
      );
    return r.pdSend(cache, id, request);
  }

  pdAbort(stage: number, transferId: string, reason: string): void {
    this.remotes[stage]?.pdAbort(transferId, reason);
  }

  /** Pages and slots each stage process holds (one round trip each; the queued cache operations go first). */
  stageUsage(): ({ stage: number } & StageUsage)[] {
    return this.remotes.map((r, stage) => ({ stage, ...r.usage() }));
  }

  /** The error that broke the pipeline (a stage that died or failed after earlier stages ran), if any. */
  failure(): Error | undefined {
    if (this.broken !== undefined) return this.broken;
    for (const r of this.remotes) {
      const f = r.failure();
      if (f !== undefined) return f;
    }
    return this.last.failure?.();
  }

  /** Stage processes' pids (stage order). */
  get pids(): number[] {
    return this.remotes.flatMap((r) => (r.pid === undefined ? [] : [r.pid]));
  }

  dispose(): void {
    for (const r of this.remotes) r.dispose();
    this.last.dispose();
  }
}
