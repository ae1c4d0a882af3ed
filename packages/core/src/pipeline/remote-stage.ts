/**
 * A pipeline stage running in another process, as the driver sees it: a {@link StageModel} whose
 * forward ships the batch (and the cache operations queued for it) over the stage's channel and
 * blocks for the answer (pipeline-model.ts has the whole picture).
 */

import type { ChildProcess } from 'node:child_process';

import type { TensorRead } from '../io/weight-reader.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { CacheGeometry, SequenceCache } from '../kv/sequence-cache.js';
import type {
  ForwardBatch,
  ForwardOptions,
  ForwardResult,
  ProjectionSpec,
  StageInfo,
  StageModel,
} from '../plugin/model-plugin.js';
import type { RankReport } from '../tensor-parallel/tp-model.js';
import type { MirroredCache } from './mirrored-cache.js';
import type { PipelineModel } from './pipeline-model.js';
import { exitDescription, PipelineStageError, untrack } from './stage-process.js';
import type { StageSendRequest, StageUsage } from '../pd/stages.js';
import { PdError } from '../pd/types.js';
import type { StagePdDone, StagePdStart } from './stage-pd.js';
import { processAlive } from './zmq-channel.js';
import type { CacheOp, WireSequence } from './stage-worker.js';
import { PeerGoneError, type Frame, type Message, type SyncChannel } from './transport.js';

// --- the remote stage ----------------------------------------------------------------------------

/** A write's promise with its resolve / reject (no unhandled rejection while nobody waits yet). */
interface Deferred<T> {
  readonly promise: Promise<T>;
  resolve(value: T): void;
  reject(err: Error): void;
}

function deferred<T>(): Deferred<T> {
  let resolve!: (v: T) => void;
  let reject!: (e: Error) => void;
  const promise = new Promise<T>((a, b) => {
    resolve = a;
    reject = b;
  });
  promise.catch(() => undefined);
  return { promise, resolve, reject };
}

/** What a stage loaded (tests assert layer ranges). */
export interface StageReport {
  readonly stage: number;
  readonly layerStart: number;
  readonly layerEnd: number;
  /** Stage process id; undefined for the last stage (the driver). */
  readonly pid: number | undefined;
  /** Tensor names read, in load order (under TP × PP: rank 0's, each name once). */
  readonly tensors: readonly string[];
  /** The target cache layer ids the stage keeps (its paged layers, then its linear-state layers). */
  readonly cacheLayers: readonly number[];
  /** TP × PP: what each of the stage's TP ranks read (blocks of tensors), in rank order. */
  readonly ranks?: readonly RankReport[];
}

/**
 * A stage running in another process, as a {@link StageModel}: `forward` ships the batch (and the
 * cache operations queued for it by a {@link PipelineCache}) and blocks for the answer. The cache
 * passed in must come from {@link PipelineModel.createCache}.
 */
export class RemoteStage implements StageModel {
  readonly cacheGeometry: CacheGeometry;
  private dead: PipelineStageError | undefined;

  /** PD writes in flight on the stage (`pdSend`), by transfer id. */
  private readonly pdWrites = new Map<string, Deferred<void>>();
  /** The stage's own address when it runs on another host: its PD transfer agent binds there (start-pipeline.ts). */
  pdHost: string | undefined;

  constructor(
    readonly index: number,
    readonly info: StageInfo,
    private readonly child: ChildProcess,
    private readonly channel: SyncChannel,
    readonly report: StageReport,
  ) {
    // a write's end arrives over the IPC channel; the process's death fails every write in flight
    child.on('message', (m: StagePdDone) => {
      if (m?.type !== 'pd-done') return;
      const w = this.pdWrites.get(m.transferId);
      this.pdWrites.delete(m.transferId);
      if (m.ok) w?.resolve();
      else w?.reject(new PdError(m.code, `${this.name()}: ${m.message}`));
    });
    child.once('exit', () => {
      const err = new PdError('peer', `${this.name()} ${exitDescription(child)}`);
      for (const w of this.pdWrites.values()) w.reject(err);
      this.pdWrites.clear();
    });
    // the driver never sizes a cache from a remote stage (the stage process does)
    this.cacheGeometry = Object.freeze({
      pagedKv: { layers: [], floatsPerToken: 0 },
      linearState: { layers: [], heads: 0, keyDim: 0, valueDim: 0, convStates: 0, convChannels: 0, convWidth: 0 },
    });
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  private name(): string {
    const { layerStart, layerEnd } = this.info;
    return `pipeline stage ${this.index} (layers ${layerStart}–${layerEnd - 1}, pid ${this.child.pid})`;
  }

  /** Throws the stage's death error, if it died. */
  checkAlive(): void {
    const f = this.failure();
    if (f !== undefined) throw f;
  }

  /** The stage's death error: set by a failed exchange, or now if the process has exited (reaped by the event loop). */
  failure(): PipelineStageError | undefined {
    if (this.dead === undefined && (this.child.exitCode !== null || this.child.signalCode !== null)) {
      this.dead = new PipelineStageError(`${this.name()} ${exitDescription(this.child)}`);
    }
    return this.dead;
  }

  /** The pipeline this stage belongs to (set by {@link PipelineModel}). @internal */
  pipeline: PipelineModel | undefined;

  /** {@link pipeline}, which PipelineModel's constructor sets before any forward or commit reaches this stage. */
  private get owner(): PipelineModel {
    if (this.pipeline === undefined)
      throw new PipelineStageError(`${this.name()}: internal error: a stage used outside a PipelineModel`);
    return this.pipeline;
  }

  private pc(cache: SequenceCache): MirroredCache {
    return this.owner.asPipelineCache(cache);
  }

  /**
   * Runs the stage. `projection` (internal to the pipeline): the accumulator of the earlier stages'
   * projected taps, `[numTokens, hiddenSize]` f32, which a stage that loaded its projection adds into.
   */
  forward(
    batch: ForwardBatch,
    cache: SequenceCache,
    options: ForwardOptions = {},
    projection?: Float32Array,
  ): ForwardResult {
    this.checkAlive();
    const pc = this.pc(cache);
    const seqs: WireSequence[] = batch.sequences.map((s) => ({
      id: s.id,
      position: s.position,
      n: s.tokens.length,
      ...(s.phase === undefined ? {} : { phase: s.phase }),
      ...(s.tree === undefined ? {} : { tree: Array.from(s.tree) }),
    }));
    const tokens = new Int32Array(seqs.reduce((a, s) => a + s.n, 0));
    let at = 0;
    for (const s of batch.sequences) {
      tokens.set(s.tokens, at);
      at += s.tokens.length;
    }
    const frames: Frame[] = [tokens];
    if (batch.hidden !== undefined) frames.push(batch.hidden);
    if (projection !== undefined) frames.push(projection);
    const ops = this.takeOps();
    const reply = this.exchange({
      header: {
        type: 'forward',
        cache: pc.cacheId,
        ops,
        seqs,
        taps: options.taps ?? [],
        snapshots: options.stateSnapshots === true,
        hasHidden: batch.hidden !== undefined,
        hasProjection: projection !== undefined,
      },
      frames,
    });
    const tapIds = reply.header.taps as number[];
    const projected = reply.header.projection === true;
    const taps = new Map<number, Float32Array>();
    const first = projected ? 2 : 1;
    tapIds.forEach((t, i) => {
      taps.set(t, reply.frames[i + first] as Float32Array);
    });
    return {
      logits: undefined,
      logitRowStart: new Int32Array(batch.sequences.length + 1),
      hidden: reply.frames[0] as Float32Array,
      taps,
      ...(projected ? { projection: reply.frames[1] as Float32Array } : {}),
    };
  }

  /**
   * Has the stage load its share of the drafter's context projection (the fc blocks of the taps it
   * produces, `DrafterPlugin.loadProjection`); its forwards then return the accumulator instead of those
   * taps. `undefined`: drop it (raw taps again).
   * @returns the tensor reads the stage made.
   * @throws {PipelineStageError} with the stage's error (e.g. a plugin without loadProjection).
   */
  loadProjection(spec: ProjectionSpec | undefined): TensorRead[] {
    this.checkAlive();
    const reply = this.exchange({
      header:
        spec === undefined
          ? { type: 'projection' }
          : { type: 'projection', dir: spec.dir, taps: spec.taps, format: spec.format ?? 'bf16' },
      frames: [],
    });
    return reply.header.reads as TensorRead[];
  }

  /** The cache operations queued for this stage (they travel with its next request). */
  private takeOps(): CacheOp[] {
    const q = this.owner.queues[this.index];
    if (q === undefined)
      throw new PipelineStageError(`${this.name()}: internal error: no queue for stage ${this.index}`);
    return q.splice(0);
  }

  /** The target cache layers this stage keeps (pd/stages.ts). */
  get cacheLayers(): readonly number[] {
    return this.report.cacheLayers;
  }

  /**
   * Binds the stage's PD transfer agent (prefill role; once). Blocks until it is bound.
   * @returns its address. @throws {PipelineStageError} (a dead stage; the FIFO transport refuses PD).
   */
  pdStart(options: StagePdStart): string {
    this.checkAlive();
    const o = this.pdHost === undefined ? options : { ...options, host: this.pdHost };
    return this.exchange({ header: { type: 'pd-start', options: o }, frames: [] }).header.agent as string;
  }

  /**
   * Has the stage write its entries `request.entries` of sequence `id` to D (stage-pd.ts). The queued cache
   * operations go first, so the stage's replica holds the sequence as the driver's cache does. Blocks only until
   * the stage started the write; the promise settles with the write's end (D's acknowledgement).
   * @throws {PdError} (rejects) with the stage's error, named by stage, layers and pid: `'manifest'` (an entry it
   *   lacks), the transfer's codes, `'peer'` when the stage process dies before the end.
   */
  pdSend(cache: SequenceCache, id: SequenceId, request: StageSendRequest): Promise<void> {
    const pc = this.pc(cache);
    const write = deferred<void>();
    try {
      this.checkAlive();
      if (this.pdWrites.has(request.transferId))
        throw new PdError('layout', `${this.name()}: ${request.transferId} is already being sent`);
      const ops = this.takeOps();
      this.pdWrites.set(request.transferId, write);
      this.exchange({ header: { type: 'pd-send', cache: pc.cacheId, ops, seq: id, request }, frames: [] });
    } catch (err) {
      this.pdWrites.delete(request.transferId);
      const e = err as Error & { pdCode?: PdError['code'] };
      write.reject(err instanceof PdError ? err : new PdError(e.pdCode ?? 'peer', e.message));
    }
    return write.promise;
  }

  /** Stops the stage's write `transferId` (its promise rejects `'abort'`); a dead stage or an ended write: no-op. */
  pdAbort(transferId: string, reason: string): void {
    const w = this.pdWrites.get(transferId);
    if (w === undefined) return;
    this.pdWrites.delete(transferId);
    w.reject(new PdError('abort', `${this.name()}: ${transferId} aborted (${reason})`));
    if (this.failure() !== undefined) return;
    try {
      this.exchange({ header: { type: 'pd-abort', transferId, reason }, frames: [] });
    } catch {
      // a stage that died meanwhile: its writes died with it
    }
  }

  /**
   * The pages and state slots the stage's caches hold and its PD writes in flight, after the queued cache
   * operations (so what the driver freed is free there too). Blocks for one round trip.
   * @throws {PipelineStageError} for a dead stage.
   */
  usage(): StageUsage {
    this.checkAlive();
    const ops = this.takeOps();
    const h = this.exchange({ header: { type: 'usage', ops }, frames: [] }).header;
    return {
      pagesInUse: h.pagesInUse as number,
      slotsInUse: h.slotsInUse as number,
      transfersInFlight: h.transfersInFlight as number,
    };
  }

  /**
   * One request → its reply; a dead stage or an error reply throws {@link PipelineStageError}. A transport error
   * other than the peer's close (ZeroMQ: a send to a killed stage can time out before the close is seen) names the
   * stage's death too when the process has exited (reaped, or a zombie); while it runs, the error is rethrown as is.
   */
  private exchange(msg: Message): Message {
    let reply: Message;
    try {
      this.channel.send(msg);
      reply = this.channel.receive();
    } catch (err) {
      const exited = this.child.exitCode !== null || this.child.signalCode !== null || !processAlive(this.child.pid);
      if (!(err instanceof PeerGoneError) && !exited) throw err;
      this.dead = new PipelineStageError(`${this.name()} ${exitDescription(this.child)}`, { cause: err });
      throw this.dead;
    }
    const h = reply.header;
    if (h.type === 'error') {
      const err = new PipelineStageError(`${this.name()}: ${String(h.name)}: ${String(h.message)}`);
      // a PD error keeps its code (pdSend reports it as a PdError)
      if (typeof h.code === 'string') Object.assign(err, { pdCode: h.code });
      throw err;
    }
    return reply;
  }

  /** Records a commit for the stage's latest forward (sent with the next request). */
  commitPrefix(cache: SequenceCache, _result: ForwardResult, id: SequenceId, committed: number): void {
    const pc = this.pc(cache);
    pc.recordFor(this.owner, { op: 'commitPrefix', cache: pc.cacheId, id, committed }, this.index);
  }

  commitTreePath(cache: SequenceCache, _result: ForwardResult, id: SequenceId, rows: readonly number[]): void {
    const pc = this.pc(cache);
    pc.recordFor(this.owner, { op: 'commitTreePath', cache: pc.cacheId, id, rows: [...rows] }, this.index);
  }

  /** Asks the process to exit, closes the channel and kills it. */
  dispose(): void {
    if (this.dead === undefined) {
      try {
        this.channel.send({ header: { type: 'exit' }, frames: [] });
      } catch {
        /* already gone */
      }
    }
    this.dead ??= new PipelineStageError(`${this.name()}: disposed`);
    this.channel.close();
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL');
    untrack(this.child);
  }
}
