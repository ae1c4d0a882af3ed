/**
 * Tensor parallelism (TP) with ranks as worker threads (docs/ARCHITECTURE.md "Tensor
 * parallelism").
 *
 * Rank 0 runs on the driver's thread (the one running {@link SpecEngine}); ranks 1 … tp−1 are
 * worker threads (tp-worker.js). Each rank loads only its shard through the model plugin's
 * `loadShard` and keeps its own {@link SequenceCache} (its heads' state). The engine sees one
 * whole-model {@link StageModel}, {@link TensorParallelModel}:
 * - `forward` embeds the batch on rank 0, posts it (with the cache operations queued for each rank)
 *   to every worker rank, runs rank 0's shard here — the all-reduces inside meet the workers in
 *   shared memory — and waits for every rank's reply: synchronous for the engine. Every rank gets
 *   each sequence's logits request: the lm_head is vocab-parallel (each rank its vocabulary slice,
 *   all-gathered; core's vocab-parallel.ts). The result is rank 0's: logits, taps (the full residual
 *   stream: every rank has it after each all-reduce) and rank 0's KDA snapshots.
 * - `lmHead` is vocab-parallel too: inside a call that runs on every rank (a drafter shard's
 *   `propose`, tp-drafter.ts) every rank calls its shard's `lmHead` itself; called from anywhere
 *   else (a drafter loaded whole on rank 0), it posts an `lmHead` request so the workers join.
 * - the engine's cache is a {@link TpCache} (`createCache`): rank 0's SequenceCache that records the
 *   engine's cache operations and commits for the worker ranks (sent with the next forward), as the
 *   pipeline's PipelineCache does for stage processes.
 */

import * as os from 'node:os';
import { MessageChannel, Worker, type MessagePort } from 'node:worker_threads';

import { setNumThreads } from '@specd/native';

import type { TensorRead } from '../io/weight-reader.js';
import type { CacheGeometry, SequenceCache, SequenceCacheOptions } from '../kv/sequence-cache.js';
import type { Drafter, DrafterLoadOptions } from '../plugin/drafter-plugin.js';
import type { ForwardBatch, ForwardOptions, ForwardResult, StageInfo, StageModel } from '../plugin/model-plugin.js';
import { type DistributedStage, hasPrefixCommit, type PrefixCommit } from '../plugin/stage-capabilities.js';
import { MirroredCache } from '../pipeline/mirrored-cache.js';
import type { CacheOp } from '../pipeline/stage-worker.js';
import { createCommBuffers, replyWord, requestWord, SharedComm, takeMessage, TpAbortError, waitWhile } from './comm.js';
import {
  loadShardOf,
  type ShardRange,
  type TpDrafterCallRequest,
  type TpDrafterLoadRequest,
  type TpForwardRequest,
  type TpLmHeadRequest,
  type TpSyncRequest,
  type TpWorkerInit,
} from './rank.js';
import type { MemoryRegion } from '../pd/types.js';

/** A request {@link TensorParallelModel.runOnRanks} posts to the worker ranks. */
export type RankRequest = TpDrafterLoadRequest | TpDrafterCallRequest | TpLmHeadRequest | TpSyncRequest;
import { loadTensorParallelDrafter } from './tp-drafter.js';

/** A tensor-parallel rank failed (its forward threw, or it could not load). */
export class TensorParallelError extends Error {
  override readonly name = 'TensorParallelError';
}

/** A worker rank's answer to a request (rank ≥ 1). */
export interface RankReply {
  readonly rank: number;
  readonly ok: boolean;
  readonly name?: string;
  readonly message?: string;
  /** `drafter.load`: what the rank read. */
  readonly reads?: readonly TensorRead[];
  /** `sync`: the rank's PD regions (shared memory). */
  readonly regions?: readonly MemoryRegion[];
}

/** What a rank loaded (tests assert the blocks). */
export interface RankReport {
  readonly rank: number;
  /** Worker thread id; undefined for rank 0 (the driver's thread). */
  readonly threadId: number | undefined;
  readonly reads: readonly TensorRead[];
}

/** A worker rank as seen from the driver. */
interface RemoteRank {
  readonly rank: number;
  readonly worker: Worker;
  readonly port: MessagePort;
  readonly report: RankReport;
}

/**
 * The engine's cache under TP: rank 0's cache (a {@link MirroredCache}) with the model's mirror
 * attached — the engine's operations and the commits are recorded for the worker ranks (the
 * pipeline's scheme, pipeline/mirrored-cache.ts).
 */
export type TpCache = MirroredCache;

/**
 * The whole target as one {@link StageModel} over tp ranks (rank 0 here, the others worker threads): a
 * {@link DistributedStage} (drafters load spread over the same ranks), with {@link PrefixCommit} when rank 0's
 * shard has it (`commitPrefix` is then set, else absent).
 */
export class TensorParallelModel implements StageModel, DistributedStage, Partial<PrefixCommit> {
  readonly info: StageInfo;
  readonly cacheGeometry: CacheGeometry;
  /** Per worker rank, the cache operations not yet sent. @internal */
  readonly queues: CacheOp[][];
  readonly commitPrefix?: PrefixCommit['commitPrefix'];
  readonly embedTokens?: (tokens: Int32Array) => Float32Array;
  /**
   * The vocab-parallel lm_head `x [rows, hiddenSize]` f32 → `[rows, vocabSize]` f32 (rank 0's shard's
   * `lmHead`, a collective). Inside {@link runOnRanks} (a drafter shard's `propose` runs on every
   * rank, and each rank calls its own shard's `lmHead` with the same rows) it runs rank 0's part
   * directly; outside, it posts an `lmHead` request with `x` to every worker rank first.
   * @throws as the shard's `lmHead` (e.g. a mis-sized x); {@link TensorParallelError} naming a failing worker rank.
   */
  readonly lmHead?: (x: Float32Array, rows: number) => Float32Array;
  private latest: ForwardResult | undefined;
  /** Whether a {@link runOnRanks} call is running (its local part may call collectives directly). */
  private onRanks = false;
  private broken: Error | undefined;
  private disposed = false;
  private readonly dropper = new FinalizationRegistry<number>((id) =>
    this.queues.forEach((q) => {
      q.push({ op: 'drop', cache: id });
    }),
  );

  constructor(
    /** Rank 0's shard (this thread). */
    readonly rank0: StageModel,
    private readonly remotes: readonly RemoteRank[],
    readonly comm: SharedComm,
    /** What each rank loaded, in rank order. */
    readonly ranks: readonly RankReport[],
    /** Kernel threads set for the process (undefined: left as it was). */
    readonly kernelThreads: number | undefined,
  ) {
    if (rank0.embedTokens === undefined && rank0.info.isFirst)
      throw new TensorParallelError("tensor parallel: rank 0's shard has no embedTokens");
    this.info = rank0.info;
    this.cacheGeometry = rank0.cacheGeometry;
    this.queues = remotes.map(() => []);
    const { embedTokens, lmHead } = rank0;
    if (embedTokens !== undefined) this.embedTokens = (tokens) => embedTokens.call(rank0, tokens);
    if (lmHead !== undefined) {
      // outside runOnRanks, a request to every rank; stateless: a failure leaves nothing out of step
      this.lmHead = (x, rows) =>
        this.onRanks
          ? lmHead.call(rank0, x, rows)
          : this.runOnRanks({ type: 'lmHead', x, rows }, () => lmHead.call(rank0, x, rows)).value;
    }
    if (hasPrefixCommit(rank0)) {
      this.commitPrefix = (cache, result, id, committed) => {
        const tc = this.asTpCache(cache);
        if (this.latest !== result)
          throw new TensorParallelError('tensor parallel: commit of a result that is not the latest forward');
        tc.recordFor(this, { op: 'commitPrefix', cache: tc.cacheId, id, committed });
        this.local(tc, () => rank0.commitPrefix(tc, result, id, committed));
      };
    }
  }

  /** Ranks (tp). */
  get size(): number {
    return this.comm.size;
  }

  /** A cache for this model (the engine calls it instead of `new SequenceCache`). */
  createCache(options: SequenceCacheOptions): SequenceCache {
    const c = new MirroredCache(this.cacheGeometry, options);
    c.attach(this, this.queues);
    this.dropper.register(c, c.cacheId);
    return c;
  }

  private asTpCache(cache: SequenceCache): MirroredCache {
    if (!(cache instanceof MirroredCache) || !cache.mirroredBy(this))
      throw new TensorParallelError('tensor parallel: the cache must come from TensorParallelModel.createCache()');
    return cache;
  }

  private local<T>(tc: MirroredCache, f: () => T): T {
    return tc.local(this, f);
  }

  forward(batch: ForwardBatch, cache: SequenceCache, options: ForwardOptions = {}): ForwardResult {
    if (this.broken !== undefined) throw this.broken;
    if (this.disposed) throw new TensorParallelError('tensor parallel: disposed');
    const tc = this.asTpCache(cache);
    this.latest = undefined;
    let n = 0;
    for (const s of batch.sequences) n += s.tokens.length;
    const tokens = new Int32Array(n);
    let at = 0;
    for (const s of batch.sequences) {
      tokens.set(s.tokens, at);
      at += s.tokens.length;
    }
    // rank 0 embeds (validating the ids) before any rank starts
    // (a later pipeline stage gets the previous stage's hidden instead)
    let hidden = batch.hidden;
    if (hidden === undefined) {
      if (this.embedTokens === undefined)
        throw new TensorParallelError(
          "tensor parallel: batch.hidden: expected the previous stage's hidden (this shard does not embed)",
        );
      hidden = this.embedTokens(tokens);
    }
    const snapshots = options.stateSnapshots === true || (options as { kdaSnapshots?: boolean }).kdaSnapshots === true;
    this.comm.reset();
    const seen = this.remotes.map((r) => Atomics.load(this.comm.ctrl, replyWord(r.rank)));
    for (const [k, r] of this.remotes.entries()) {
      const req: TpForwardRequest = {
        type: 'forward',
        cache: tc.cacheId,
        ops: this.queues[k]!.splice(0),
        hidden,
        snapshots,
        seqs: batch.sequences.map((s) => ({
          id: s.id,
          position: s.position,
          tokens: s.tokens,
          logits: s.logits,
          ...(s.phase === undefined ? {} : { phase: s.phase }),
          ...(s.tree === undefined ? {} : { tree: s.tree }),
        })),
      };
      r.port.postMessage(req);
      Atomics.add(this.comm.ctrl, requestWord(r.rank), 1);
      Atomics.notify(this.comm.ctrl, requestWord(r.rank));
    }
    let result: ForwardResult | undefined;
    let failure: Error | undefined;
    const reducesBefore = this.comm.allReduces;
    try {
      result = this.local(tc, () => this.rank0.forward({ sequences: batch.sequences, hidden }, tc, options));
    } catch (err) {
      failure = err as Error;
      this.comm.abort();
    }
    // every rank answers (a failing rank aborts the group, so nobody waits forever in a barrier)
    const errors: string[] = [];
    let aborted = false;
    for (const [k, r] of this.remotes.entries()) {
      waitWhile(this.comm.ctrl, replyWord(r.rank), seen[k]!, false);
      const reply = takeMessage(r.port) as { ok: boolean; name?: string; message?: string } | undefined;
      if (reply === undefined) errors.push(`rank ${r.rank}: no reply`);
      else if (!reply.ok && reply.name === 'TpAbortError') aborted = true;
      else if (!reply.ok) errors.push(`rank ${r.rank}: ${reply.name}: ${reply.message}`);
    }
    if (failure === undefined && errors.length === 0 && !aborted) {
      this.latest = result;
      return result!;
    }
    // A bad batch or a full cache fails every rank the same way before the first collective: the
    // caches stay consistent and the model usable. Anything else leaves the ranks out of step.
    const clean =
      failure !== undefined &&
      !(failure instanceof TpAbortError) &&
      this.comm.allReduces === reducesBefore &&
      !aborted &&
      errors.length === this.remotes.length;
    const err =
      failure !== undefined && !(failure instanceof TpAbortError)
        ? failure
        : new TensorParallelError(`tensor parallel: ${errors.join('; ') || 'aborted'}`);
    if (!clean)
      this.broken = new TensorParallelError(
        `tensor parallel: ranks out of step after a failed forward: ${err.message}` +
          (errors.length > 0 && err === failure ? ` (${errors.join('; ')})` : ''),
        { cause: err },
      );
    throw err;
  }

  /**
   * Loads the drafter checkpoint `dir` spread over the same ranks ({@link DistributedStage.loadDrafter}):
   * every rank loads its shard through the drafter plugin's `loadShard` (rank 0 first, here, so a tp
   * that does not fit the drafter is refused before the workers load). Undefined when the plugin
   * that claims the checkpoint has no `loadShard` (the caller loads it whole on rank 0).
   * @throws {PluginError} when no plugin claims the checkpoint; the plugin's errors (e.g. a tp that
   *   does not fit the draft heads); {@link TensorParallelError} naming a worker rank that failed to load.
   */
  loadDrafter(
    dir: string,
    plugins: readonly string[],
    options: Omit<DrafterLoadOptions, 'target'>,
  ): Promise<Drafter | undefined> {
    return loadTensorParallelDrafter(this, dir, plugins, options);
  }

  /**
   * Runs one request on every rank at once (drafter shards, tp-drafter.ts): posts `request` (or `request(k)` to
   * worker rank k + 1) to each worker rank, runs `local` (rank 0) here — collectives inside meet the workers in
   * shared memory — and waits for every reply. A rank that fails aborts the group, so nobody waits forever.
   * @param onOutOfStep called (before the throw) when the failure may have left the ranks out of step
   *   (not every rank failed alike before its first collective).
   * @returns rank 0's value and the workers' replies (rank order).
   * @throws rank 0's own error, else {@link TensorParallelError} naming each failing rank.
   * @internal
   */
  runOnRanks<T>(
    request: RankRequest | ((k: number) => RankRequest),
    local: () => T,
    onOutOfStep: (err: Error) => void = () => {},
  ): { value: T; replies: RankReply[] } {
    if (this.disposed) throw new TensorParallelError('tensor parallel: disposed');
    const requests = this.remotes.map((_, k) => (typeof request === 'function' ? request(k) : request));
    const type = requests[0]?.type ?? 'request';
    if (this.onRanks)
      throw new TensorParallelError(`tensor parallel: ${type} posted while another request runs on the ranks`);
    this.comm.reset();
    const seen = this.remotes.map((r) => Atomics.load(this.comm.ctrl, replyWord(r.rank)));
    for (const [k, r] of this.remotes.entries()) {
      r.port.postMessage(requests[k]);
      Atomics.add(this.comm.ctrl, requestWord(r.rank), 1);
      Atomics.notify(this.comm.ctrl, requestWord(r.rank));
    }
    const collectives = () => this.comm.allReduces + this.comm.broadcasts + this.comm.allGathers;
    const before = collectives();
    let value: T | undefined;
    let failure: Error | undefined;
    this.onRanks = true;
    try {
      value = local();
    } catch (err) {
      failure = err as Error;
      this.comm.abort();
    } finally {
      this.onRanks = false;
    }
    const replies: RankReply[] = [];
    const errors: string[] = [];
    let aborted = false;
    for (const [k, r] of this.remotes.entries()) {
      waitWhile(this.comm.ctrl, replyWord(r.rank), seen[k]!, false);
      const reply = takeMessage(r.port) as Omit<RankReply, 'rank'> | undefined;
      if (reply === undefined) errors.push(`rank ${r.rank}: no reply`);
      else if (!reply.ok && reply.name === 'TpAbortError') aborted = true;
      else if (!reply.ok) errors.push(`rank ${r.rank}: ${reply.name}: ${reply.message}`);
      replies.push({ rank: r.rank, ...(reply ?? { ok: false }) });
    }
    if (failure === undefined && errors.length === 0 && !aborted) return { value: value as T, replies };
    const clean =
      failure !== undefined &&
      !(failure instanceof TpAbortError) &&
      collectives() === before &&
      !aborted &&
      errors.length === this.remotes.length;
    const err =
      failure !== undefined && !(failure instanceof TpAbortError)
        ? failure
        : new TensorParallelError(`tensor parallel: ${type}: ${errors.join('; ') || 'aborted'}`);
    if (!clean) onOutOfStep(err);
    throw err;
  }

  /**
   * Prefill/decode disaggregation (pd/ranks.ts): applies the cache operations queued for the worker ranks now
   * (a decode instance's reservation must be in every rank's cache before the transfer writes it: a replayed
   * `add` zeroes the state slot) and returns, per worker rank (rank 1 first), the regions of its memory a
   * transfer addresses: `cache`'s stores (pd/manifest.ts `targetRegions`), then those of the drafter shards
   * `drafters` (their `pdRegions`). Shared memory: writes through them land in the rank's stores.
   * @throws {TensorParallelError} for a cache not from {@link createCache}, a disposed model, or a rank that fails.
   */
  syncRanks(cache: SequenceCache, drafters: readonly number[] = []): MemoryRegion[][] {
    if (this.broken !== undefined) throw this.broken;
    const tc = this.asTpCache(cache);
    const { replies } = this.runOnRanks(
      (k): TpSyncRequest => ({ type: 'sync', cache: tc.cacheId, ops: this.queues[k]!.splice(0), drafters }),
      () => undefined,
      (err) => {
        this.broken = new TensorParallelError(
          `tensor parallel: ranks out of step after a failed sync: ${err.message}`,
          {
            cause: err,
          },
        );
      },
    );
    return replies.map((r) => [...(r.regions ?? [])]);
  }

  /** The error that left the ranks out of step, if any (the model then refuses every forward). */
  failure(): Error | undefined {
    return this.broken;
  }

  /** Worker thread ids (rank order, ranks ≥ 1). */
  get threadIds(): number[] {
    return this.remotes.map((r) => r.worker.threadId);
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    for (const r of this.remotes) {
      r.port.postMessage({ type: 'exit' });
      Atomics.add(this.comm.ctrl, requestWord(r.rank), 1);
      Atomics.notify(this.comm.ctrl, requestWord(r.rank));
      r.port.close();
      void r.worker.terminate();
    }
    this.rank0.dispose();
  }
}

/** The compiled worker entry (next to this file in dist/). */
export const TP_WORKER_SCRIPT = new URL('./tp-worker.js', import.meta.url);

/** Options of {@link startTensorParallel}. */
export interface TensorParallelOptions {
  /** Hugging Face checkpoint directory of the target. */
  readonly modelDir: string;
  /** Plugin packages (every rank imports the same ones). */
  readonly plugins: readonly string[];
  /** Ranks (≥ 2). */
  readonly tp: number;
  /**
   * Kernel threads for the process-wide pool: default `SPECD_NUM_THREADS` if set (left alone), else
   * max(1, ⌊CPUs / tp⌋) so the ranks' threads do not oversubscribe the cores.
   */
  readonly kernelThreads?: number;
  /** All-reduce piece, floats per rank (default 1 Mi floats = 4 MiB). */
  readonly reduceCapacity?: number;
  /**
   * Only this layer range (a pipeline stage run by a TP group, TP × PP; default the whole model):
   * every rank loads its shard of these layers; `embedding` loads the token embedding on rank 0 of a
   * non-first stage (the last stage, for drafters).
   */
  readonly range?: ShardRange;
}

/**
 * Starts a tensor-parallel group: loads rank 0's shard here (a bad tp is refused here, before any
 * thread starts), then starts ranks 1 … tp−1 as worker threads that load their shards concurrently.
 * @throws {TensorParallelError} when a rank fails to load (the others are stopped); the plugin's
 *   errors (e.g. a tp that does not divide the head counts); PluginError for a plugin without `loadShard`.
 */
export async function startTensorParallel(options: TensorParallelOptions): Promise<TensorParallelModel> {
  const tp = options.tp;
  if (!Number.isInteger(tp) || tp < 2)
    throw new TensorParallelError(
      `startTensorParallel: tp must be an integer >= 2 (tp = 1 is the plain in-process model), got ${tp}`,
    );
  const buffers = createCommBuffers(tp, options.reduceCapacity ?? 1 << 20);
  const comm = new SharedComm(0, buffers);
  const { shard } = await loadShardOf(options.modelDir, options.plugins, comm, options.range);
  let threads = options.kernelThreads;
  const env = process.env.SPECD_NUM_THREADS;
  if (threads === undefined && (env === undefined || env === ''))
    threads = Math.max(1, Math.floor(os.availableParallelism() / tp));
  if (threads !== undefined) setNumThreads(threads);
  const starting = Array.from({ length: tp - 1 }, (_, i) => spawnRank(i + 1, options, buffers, threads));
  const settled = await Promise.allSettled(starting);
  const failed = settled.find((s) => s.status === 'rejected');
  if (failed !== undefined) {
    for (const s of settled) {
      if (s.status === 'fulfilled') void s.value.worker.terminate();
    }
    shard.model.dispose();
    throw (failed as PromiseRejectedResult).reason;
  }
  const remotes = settled.map((s) => (s as PromiseFulfilledResult<RemoteRank>).value);
  return new TensorParallelModel(
    shard.model,
    remotes,
    comm,
    [{ rank: 0, threadId: undefined, reads: shard.reads }, ...remotes.map((r) => r.report)],
    threads,
  );
}

async function spawnRank(
  rank: number,
  options: TensorParallelOptions,
  buffers: ReturnType<typeof createCommBuffers>,
  threads: number | undefined,
): Promise<RemoteRank> {
  const { port1, port2 } = new MessageChannel();
  const init: TpWorkerInit = {
    modelDir: options.modelDir,
    plugins: options.plugins,
    rank,
    buffers,
    port: port2,
    ...(threads === undefined ? {} : { threads }),
    ...(options.range === undefined ? {} : { range: options.range }),
  };
  const worker = new Worker(TP_WORKER_SCRIPT, { workerData: init, transferList: [port2] });
  const where = `tensor-parallel rank ${rank} (thread ${worker.threadId})`;
  try {
    const ready = await new Promise<{ reads: TensorRead[] }>((resolve, reject) => {
      const onExit = (code: number) =>
        reject(new TensorParallelError(`${where} exited with code ${code} while loading`));
      const onError = (err: Error) => reject(new TensorParallelError(`${where}: ${err.name}: ${err.message}`));
      worker.once('exit', onExit);
      worker.once('error', onError);
      worker.once('message', (m: { type: string; reads: TensorRead[]; name?: string; message?: string }) => {
        worker.off('exit', onExit);
        worker.off('error', onError);
        if (m.type === 'ready') resolve(m);
        else reject(new TensorParallelError(`${where}: ${m.name}: ${m.message}`));
      });
    });
    worker.unref();
    port1.unref();
    return { rank, worker, port: port1, report: { rank, threadId: worker.threadId, reads: ready.reads } };
  } catch (err) {
    void worker.terminate();
    port1.close();
    throw err;
  }
}
