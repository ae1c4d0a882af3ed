/**
 * Pipeline parallelism (PP) with stages as separate processes (issue #8, docs/ARCHITECTURE.md
 * "Pipeline parallelism").
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
 */

import { fork, execFileSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as nodePath from 'node:path';
import { fileURLToPath } from 'node:url';

import type { CacheGeometry, SequenceCache, SequenceCacheOptions } from '../kv/sequence-cache.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import { stageTaps } from '../plugin/drafter-plugin.js';
import type { TensorRead } from '../io/weight-reader.js';
import type {
  ForwardBatch,
  ForwardOptions,
  ForwardResult,
  LoadProgress,
  ProjectionSpec,
  StageInfo,
  StageModel,
} from '../plugin/model-plugin.js';
import { MirroredCache } from './mirrored-cache.js';
import { startTensorParallel, type RankReport } from '../tensor-parallel/tp-model.js';
import { defaultPartition, partitionRanges } from './partition.js';
import { loadStage, numHiddenLayers } from './stage-loader.js';
import type { CacheOp, StageInit, WireSequence } from './stage-worker.js';
import { FifoChannel, PeerGoneError, type Frame, type Message, type SyncChannel } from './transport.js';
import { processAlive, ZmqChannel } from './zmq-channel.js';

/** A pipeline stage failed: it died (exit code / signal in the message) or its forward threw. */
export class PipelineStageError extends Error {
  override readonly name = 'PipelineStageError';
}

// --- child bookkeeping: no orphans -------------------------------------------------------------

const live = new Set<ChildProcess>();
let hooked = false;

function killAll(): void {
  for (const c of live) {
    try {
      c.kill('SIGKILL');
    } catch {
      /* gone */
    }
  }
  live.clear();
}

/**
 * Stage processes die with the driver: on its `exit` they are SIGKILLed here. No SIGINT / SIGTERM
 * handler is installed — one would replace the signal's default action, and a synchronous
 * `generate` loop would only run it after the whole generation (tested). The driver dies by the
 * signal, and each stage exits when its channel to the driver closes (ZeroMQ: the IPC channel's
 * `disconnect`; FIFOs: end of file); `specd serve` handles the signals itself and disposes the model.
 */
function track(c: ChildProcess): void {
  live.add(c);
  c.once('exit', () => live.delete(c));
  if (hooked) return;
  hooked = true;
  process.on('exit', killAll);
}

/** Pids of the stage processes alive (spawned by this process and not yet exited). */
export function liveStagePids(): number[] {
  return [...live].flatMap((c) => (c.pid === undefined ? [] : [c.pid]));
}

/** `exited with code N` / `was killed by SIGKILL` for a dead child, reading /proc when the event loop could not reap it yet. */
function exitDescription(child: ChildProcess): string {
  const pid = child.pid;
  const deadline = Date.now() + 2000;
  const cell = new Int32Array(new SharedArrayBuffer(4));
  for (;;) {
    if (child.exitCode !== null) return `exited with code ${child.exitCode}`;
    if (child.signalCode !== null) return `was killed by ${child.signalCode}`;
    try {
      const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (fields[0] === 'Z') {
        const status = Number(fields[49]); // field 52: exit status as waitpid(2) reports it
        if ((status & 0x7f) === 0) return `exited with code ${(status >> 8) & 0xff}`;
        const sig = Object.entries(os.constants.signals).find(([, n]) => n === (status & 0x7f))?.[0];
        return `was killed by ${sig ?? `signal ${status & 0x7f}`}`;
      }
    } catch {
      return 'exited (exit code unknown)';
    }
    if (Date.now() > deadline) return 'closed its channel (still running)';
    Atomics.wait(cell, 0, 0, 5);
  }
}

// --- the remote stage ----------------------------------------------------------------------------

/** What a stage loaded (tests assert layer ranges). */
export interface StageReport {
  readonly stage: number;
  readonly layerStart: number;
  readonly layerEnd: number;
  /** Stage process id; undefined for the last stage (the driver). */
  readonly pid: number | undefined;
  /** Tensor names read, in load order (under TP × PP: rank 0's, each name once). */
  readonly tensors: readonly string[];
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

  constructor(
    readonly index: number,
    readonly info: StageInfo,
    private readonly child: ChildProcess,
    private readonly channel: SyncChannel,
    readonly report: StageReport,
  ) {
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
    return `pipeline stage ${this.index} (layers ${this.info.layerStart}–${this.info.layerEnd - 1}, pid ${this.child.pid})`;
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

  private pc(cache: SequenceCache): MirroredCache {
    return this.pipeline!.asPipelineCache(cache);
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
    const ops = this.pipeline!.queues[this.index]!.splice(0);
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
      header: spec === undefined ? { type: 'projection' } : { type: 'projection', dir: spec.dir, taps: spec.taps },
      frames: [],
    });
    return reply.header.reads as TensorRead[];
  }

  /** One request → its reply; a dead stage or an error reply throws {@link PipelineStageError}. */
  private exchange(msg: Message): Message {
    let reply: Message;
    try {
      this.channel.send(msg);
      reply = this.channel.receive();
    } catch (err) {
      if (!(err instanceof PeerGoneError)) throw err;
      this.dead = new PipelineStageError(`${this.name()} ${exitDescription(this.child)}`, { cause: err });
      throw this.dead;
    }
    const h = reply.header;
    if (h.type === 'error') throw new PipelineStageError(`${this.name()}: ${String(h.name)}: ${String(h.message)}`);
    return reply;
  }

  /** Records a commit for the stage's latest forward (sent with the next request). */
  commitPrefix(cache: SequenceCache, _result: ForwardResult, id: SequenceId, committed: number): void {
    const pc = this.pc(cache);
    pc.recordFor(this.pipeline!, { op: 'commitPrefix', cache: pc.cacheId, id, committed }, this.index);
  }

  commitTreePath(cache: SequenceCache, _result: ForwardResult, id: SequenceId, rows: readonly number[]): void {
    const pc = this.pc(cache);
    pc.recordFor(this.pipeline!, { op: 'commitTreePath', cache: pc.cacheId, id, rows: [...rows] }, this.index);
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
    live.delete(this.child);
  }
}

// --- the mirrored cache --------------------------------------------------------------------------

/**
 * The engine's cache of a pipeline: the last stage's cache (a {@link MirroredCache}; under TP × PP
 * the last stage's TP cache) with the pipeline's mirror attached — the engine's operations are
 * recorded for every remote stage and applied there, in order, before its next forward. Operations
 * the last stage's own forward / commit performs are not recorded (each stage does its own).
 */
export type PipelineCache = MirroredCache;

// --- the composite model -------------------------------------------------------------------------

/** Options of {@link startPipeline}. */
export interface PipelineOptions {
  /** Hugging Face checkpoint directory of the target. */
  readonly modelDir: string;
  /** Plugin packages (the stage processes import the same ones). */
  readonly plugins: readonly string[];
  /** Stages (≥ 2). */
  readonly pp: number;
  /** Layers per stage (length pp, each ≥ 1, sum = num_hidden_layers); default {@link defaultPartition}. */
  readonly partition?: readonly number[];
  /**
   * Load the token embedding on the last stage too (default true): drafters reuse the target's
   * embedding (`embedTokens`), and they live with the last stage. Plain decoding does not need it.
   */
  readonly lastStageEmbedding?: boolean;
  /** Progress of the last stage's load (the driver's own; not reported under TP × PP). */
  readonly onProgress?: (p: LoadProgress) => void;
  /**
   * TP × PP: every stage runs as a tensor-parallel group of `tp` ranks (default 1) — worker threads
   * of the stage process (the last stage's in the driver). Kernel threads per process:
   * max(1, ⌊CPUs / (tp · pp)⌋) unless `SPECD_NUM_THREADS` is set.
   */
  readonly tp?: number;
  /**
   * Driver ↔ stage transport: `'zmq'` (default) — ZeroMQ PAIR sockets over `ipc://` in a private temp
   * dir (the issue's choice; a `tcp://` endpoint would let a stage live on another host later);
   * `'fifo'` — a pair of named pipes per stage (same host only; lower latency, docs/BENCHMARKS.md).
   */
  readonly transport?: StageTransport;
}

/** How the driver and a stage process talk (see {@link PipelineOptions.transport}). */
export type StageTransport = 'zmq' | 'fifo';

/** The whole target as one {@link StageModel} over stage processes + the local last stage. */
export class PipelineModel implements StageModel {
  readonly info: StageInfo;
  readonly cacheGeometry: CacheGeometry;
  /** Per remote stage, the cache operations not yet sent. @internal */
  readonly queues: CacheOp[][];
  readonly commitPrefix?: (cache: SequenceCache, result: ForwardResult, id: SequenceId, committed: number) => void;
  readonly commitTreePath?: (
    cache: SequenceCache,
    result: ForwardResult,
    id: SequenceId,
    rows: readonly number[],
  ) => void;
  readonly embedTokens?: (tokens: Int32Array) => Float32Array;
  readonly lmHead?: (x: Float32Array, rows: number) => Float32Array;
  /** The last stage's (the drafter lives with the last stage; under TP × PP it is spread over its TP group). */
  readonly loadDrafter?: StageModel['loadDrafter'];
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
    if (last.commitPrefix !== undefined) {
      this.commitPrefix = (cache, result, id, committed) => {
        const pc = this.commit(cache, result);
        for (const r of remotes) r.commitPrefix(pc, result, id, committed);
        this.local(pc, () => last.commitPrefix!(pc, this.latest!.inner, id, committed));
      };
    }
    if (last.commitTreePath !== undefined) {
      this.commitTreePath = (cache, result, id, rows) => {
        const pc = this.commit(cache, result);
        for (const r of remotes) r.commitTreePath(pc, result, id, rows);
        this.local(pc, () => last.commitTreePath!(pc, this.latest!.inner, id, rows));
      };
    }
    if (last.embedTokens !== undefined) this.embedTokens = (tokens) => last.embedTokens!(tokens);
    if (last.lmHead !== undefined) this.lmHead = (x, rows) => last.lmHead!(x, rows);
    if (last.loadDrafter !== undefined)
      this.loadDrafter = (dir, plugins, options) => last.loadDrafter!(dir, plugins, options);
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

/** The compiled stage-worker entry (next to this file in dist/). */
export const STAGE_WORKER_SCRIPT = nodePath.join(nodePath.dirname(fileURLToPath(import.meta.url)), 'stage-worker.js');

type Ready = { info: StageInfo; tensors: string[]; ranks?: RankReport[] };

/** Sends `init` to a forked stage and waits for its `ready` (or its load error / exit) over the IPC channel. */
function stageReady(
  child: ChildProcess,
  stage: number,
  init: Omit<StageInit, 'type' | 'stage'>,
  where: string,
  onWaiting?: (reject: (err: unknown) => void) => () => void,
): Promise<Ready> {
  return new Promise<Ready>((resolve, reject) => {
    let stop: (() => void) | undefined;
    const onExit = (code: number | null, sig: NodeJS.Signals | null) => {
      stop?.();
      reject(
        new PipelineStageError(
          `${where} ${code !== null ? `exited with code ${code}` : `was killed by ${sig}`} while loading`,
        ),
      );
    };
    child.once('exit', onExit);
    child.once('message', (m: Ready & { type: string; name?: string; message?: string }) => {
      child.off('exit', onExit);
      if (m.type === 'ready') resolve(m);
      else reject(new PipelineStageError(`${where}: ${m.name}: ${m.message}`));
    });
    stop = onWaiting?.(reject);
    child.send({ type: 'init', stage, ...init } satisfies StageInit);
  });
}

function stageReport(
  stage: number,
  init: Omit<StageInit, 'type' | 'stage'>,
  child: ChildProcess,
  ready: Ready,
): StageReport {
  return {
    stage,
    layerStart: init.layerStart,
    layerEnd: init.layerEnd,
    pid: child.pid,
    tensors: ready.tensors,
    ...(ready.ranks === undefined ? {} : { ranks: ready.ranks }),
  };
}

function forkStage(args: string[]): ChildProcess {
  const child = fork(STAGE_WORKER_SCRIPT, args, { stdio: ['ignore', 2, 2, 'ipc'], serialization: 'json' });
  track(child);
  return child;
}

/** Unix socket paths are limited to ~107 bytes: a longer temp dir falls back to local TCP. */
function zmqEndpoint(tmp: string, stage: number): string {
  const p = nodePath.join(tmp, `stage${stage}.zmq`);
  return Buffer.byteLength(p) <= 100 ? `ipc://${p}` : 'tcp://127.0.0.1:*';
}

/**
 * Forks stage `stage` connected over ZeroMQ and waits for it to load: the driver binds a PAIR socket
 * (on its bridge thread), the stage connects and sends `hello` first, which the driver receives
 * after `ready` — so the connection exists before startPipeline removes the temp dir holding the
 * `ipc://` socket file. A dead stage is seen by its process's liveness.
 */
async function spawnStageZmq(
  stage: number,
  init: Omit<StageInit, 'type' | 'stage'>,
  tmp: string,
): Promise<RemoteStage> {
  let pid: number | undefined;
  const channel = ZmqChannel.bind(zmqEndpoint(tmp, stage), { isPeerAlive: () => processAlive(pid) });
  let child: ChildProcess | undefined;
  try {
    child = forkStage(['zmq', channel.endpoint]);
    pid = child.pid;
    const where = `pipeline stage ${stage} (layers ${init.layerStart}–${init.layerEnd - 1}, pid ${child.pid})`;
    const ready = await stageReady(child, stage, init, where);
    let hello: ReturnType<typeof channel.receive>;
    try {
      hello = channel.receive();
    } catch (err) {
      throw new PipelineStageError(`${where} ${exitDescription(child)} before connecting`, { cause: err });
    }
    if (hello.header.type !== 'hello')
      throw new PipelineStageError(`${where}: expected hello, got ${String(hello.header.type)}`);
    child.channel?.unref();
    child.unref();
    return new RemoteStage(stage, ready.info, child, channel, stageReport(stage, init, child, ready));
  } catch (err) {
    if (child !== undefined) {
      child.kill('SIGKILL');
      live.delete(child);
    }
    channel.close();
    throw err;
  }
}

/** Forks stage `stage` connected by a pair of FIFOs and waits for it to load. */
async function spawnStageFifo(
  stage: number,
  init: Omit<StageInit, 'type' | 'stage'>,
  tmp: string,
): Promise<RemoteStage> {
  const req = nodePath.join(tmp, `stage${stage}.req`);
  const resp = nodePath.join(tmp, `stage${stage}.resp`);
  execFileSync('mkfifo', [req, resp]);
  // the response FIFO's read end first (non-blocking): the stage's blocking open for writing then succeeds at once
  const readFd = fs.openSync(resp, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  const child = forkStage(['fifo', req, resp]);
  let writeFd: number | undefined;
  const where = `pipeline stage ${stage} (layers ${init.layerStart}–${init.layerEnd - 1}, pid ${child.pid})`;
  try {
    const ready = await stageReady(child, stage, init, where, (reject) => {
      // the request FIFO's write end: succeeds once the stage has opened it for reading
      let opening: NodeJS.Timeout | undefined;
      const open = (): void => {
        try {
          writeFd = fs.openSync(req, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'ENXIO') {
            reject(err);
            return;
          }
          opening = setTimeout(open, 5);
        }
      };
      open();
      return () => clearTimeout(opening);
    });
    if (writeFd === undefined) throw new PipelineStageError(`${where}: ready before its request channel opened`);
    child.channel?.unref();
    child.unref();
    return new RemoteStage(
      stage,
      ready.info,
      child,
      new FifoChannel(readFd, writeFd),
      stageReport(stage, init, child, ready),
    );
  } catch (err) {
    child.kill('SIGKILL');
    live.delete(child);
    fs.closeSync(readFd);
    if (writeFd !== undefined) fs.closeSync(writeFd);
    throw err;
  } finally {
    fs.rmSync(req, { force: true });
    fs.rmSync(resp, { force: true });
  }
}

/**
 * Starts a pipeline: forks stages 0 … pp−2 (each loads only its layers) and loads the last stage
 * here, all at once. @throws {PartitionError} for a bad partition; {@link PipelineStageError} when a
 * stage fails to load (the others are killed).
 */
export async function startPipeline(options: PipelineOptions): Promise<PipelineModel> {
  const L = numHiddenLayers(options.modelDir);
  const partition = options.partition ?? defaultPartition(L, options.pp);
  const ranges = partitionRanges(partition, L, options.pp);
  if (ranges.length < 2)
    throw new PipelineStageError('startPipeline: pp must be >= 2 (pp = 1 is the plain in-process model)');
  const tp = options.tp ?? 1;
  if (!Number.isInteger(tp) || tp < 1)
    throw new PipelineStageError(`startPipeline: tp must be an integer >= 1, got ${tp}`);
  const env = process.env.SPECD_NUM_THREADS;
  const kernelThreads =
    tp > 1 && (env === undefined || env === '')
      ? Math.max(1, Math.floor(os.availableParallelism() / (tp * ranges.length)))
      : undefined;
  const par = tp > 1 ? { tp, ...(kernelThreads === undefined ? {} : { kernelThreads }) } : {};
  const tmp = fs.mkdtempSync(nodePath.join(os.tmpdir(), 'specd-pp-'));
  const [ls, le] = ranges[ranges.length - 1]!;
  const transport = options.transport ?? 'zmq';
  if (transport !== 'zmq' && transport !== 'fifo')
    throw new PipelineStageError(`startPipeline: transport must be 'zmq' or 'fifo', got ${String(transport)}`);
  const spawnStage = transport === 'zmq' ? spawnStageZmq : spawnStageFifo;
  const remotes = ranges
    .slice(0, -1)
    .map(([a, b], k) =>
      spawnStage(k, { modelDir: options.modelDir, plugins: options.plugins, layerStart: a, layerEnd: b, ...par }, tmp),
    );
  const embedding = options.lastStageEmbedding ?? true;
  const lastP: Promise<{ model: StageModel; tensors: string[]; ranks?: readonly RankReport[] }> =
    tp > 1
      ? startTensorParallel({
          modelDir: options.modelDir,
          plugins: options.plugins,
          tp,
          ...(kernelThreads === undefined ? {} : { kernelThreads }),
          range: { layerStart: ls, layerEnd: le, ...(embedding ? { embedding: true } : {}) },
        }).then((m) => ({ model: m, tensors: [...new Set(m.ranks[0]!.reads.map((r) => r.name))], ranks: m.ranks }))
      : loadStage(
          { modelDir: options.modelDir, plugins: options.plugins, layerStart: ls, layerEnd: le, embedding },
          options.onProgress,
        );
  const settled = await Promise.allSettled([...remotes, lastP]);
  fs.rmSync(tmp, { recursive: true, force: true });
  const failed = settled.find((s) => s.status === 'rejected');
  if (failed !== undefined) {
    for (const s of settled) {
      if (s.status === 'fulfilled') ('index' in s.value ? s.value : s.value.model).dispose();
    }
    throw (failed as PromiseRejectedResult).reason;
  }
  const stages = settled.slice(0, -1).map((s) => (s as PromiseFulfilledResult<RemoteStage>).value);
  const last = (settled[settled.length - 1] as PromiseFulfilledResult<Awaited<typeof lastP>>).value;
  return new PipelineModel(stages, last.model, [
    ...stages.map((s) => s.report),
    {
      stage: stages.length,
      layerStart: ls,
      layerEnd: le,
      pid: undefined,
      tensors: last.tensors,
      ...(last.ranks === undefined ? {} : { ranks: last.ranks }),
    },
  ]);
}
