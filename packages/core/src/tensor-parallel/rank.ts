/**
 * Loading a tensor-parallel rank's shard and applying the driver's cache operations to a rank's
 * caches (shared by the driver's rank 0 and the worker ranks, tp-worker.ts).
 */

import 'reflect-metadata';
import { container as rootContainer } from 'tsyringe';

import type { MessagePort } from 'node:worker_threads';

import { HfConfig } from '../io/hf-config.js';
import { SafetensorsCheckpoint } from '../io/safetensors-checkpoint.js';

import type { TensorRead } from '../io/weight-reader.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { SequenceCache } from '../kv/sequence-cache.js';
import type { Drafter, DrafterLoadOptions } from '../plugin/drafter-plugin.js';
import type { ForwardSequence, LogitsRequest, StageModel, TpComm } from '../plugin/model-plugin.js';
import { DrafterRegistry, loadPluginPackages, ModelRegistry, PluginError } from '../plugin/registry.js';
import { CacheReplica } from '../pipeline/cache-replica.js';
import type { CacheOp } from '../pipeline/stage-worker.js';
import type { CommBuffers, SharedComm } from './comm.js';

/** workerData of a rank. */
export interface TpWorkerInit {
  readonly modelDir: string;
  readonly plugins: readonly string[];
  readonly rank: number;
  readonly buffers: CommBuffers;
  readonly port: MessagePort;
  /** Kernel threads to use in this process (set by the driver; informational here). */
  readonly threads?: number;
  /** The layer range to load (a pipeline stage under TP × PP; default the whole model). */
  readonly range?: ShardRange;
}

/** A layer range of a shard ({@link ShardLoadOptions}'s layerStart / layerEnd / embedding). */
export interface ShardRange {
  readonly layerStart: number;
  readonly layerEnd: number;
  readonly embedding?: boolean;
}

/** A forward request (driver → rank). */
export interface TpForwardRequest {
  readonly type: 'forward';
  readonly cache: number;
  readonly ops: readonly CacheOp[];
  /**
   * The batch's sequences, each with its logits request: the lm_head is vocab-parallel (every rank
   * computes its vocabulary slice of the same rows, then all-gathers), so every rank asks for rank 0's rows.
   */
  readonly seqs: readonly {
    id: SequenceId;
    position: number;
    tokens: Int32Array;
    logits: LogitsRequest;
    phase?: 'prefill';
    tree?: Int32Array;
  }[];
  readonly hidden: Float32Array;
  readonly snapshots: boolean;
}

/**
 * Run the shard's vocab-parallel `lmHead` on `x [rows, hiddenSize]` f32 (driver → rank; the driver's
 * `TensorParallelModel.lmHead` called outside a request that already runs on every rank).
 */
export interface TpLmHeadRequest {
  readonly type: 'lmHead';
  readonly x: Float32Array;
  readonly rows: number;
}

/**
 * Applies the queued cache operations of cache `cache` now (driver → rank; no forward) and answers the regions of
 * this rank's memory that a prefill/decode transfer addresses: the cache's stores, then each listed drafter
 * shard's (`pdRegions`, when it declares it). The regions are views of shared memory, so the driver's thread
 * reads and writes them in place (pd/ranks.ts).
 */
export interface TpSyncRequest {
  readonly type: 'sync';
  readonly cache: number;
  readonly ops: readonly CacheOp[];
  /** Drafter shard ids whose regions to include. */
  readonly drafters: readonly number[];
}

/** Loads the shard of `rank` through the plugin that accepts the checkpoint. */
export async function loadShardOf(modelDir: string, plugins: readonly string[], comm: SharedComm, range?: ShardRange) {
  const container = rootContainer.createChildContainer();
  await loadPluginPackages(plugins, container);
  const config = HfConfig.read(modelDir);
  const plugin = ModelRegistry.fromContainer(container).resolve(config);
  if (plugin.loadShard === undefined)
    throw new PluginError(`model plugin ${plugin.name} does not support tensor parallelism (no loadShard)`);
  const weights = SafetensorsCheckpoint.open(modelDir);
  try {
    return { plugin, shard: await plugin.loadShard({ dir: modelDir, config, weights }, { comm, ...range }) };
  } finally {
    weights.close();
  }
}

/** Drafter load options every rank gets (cloneable: no target). */
export type DrafterShardRequestOptions = Omit<DrafterLoadOptions, 'target'>;

/** Load a drafter shard on a worker rank (driver → rank; `id` names it in later calls). */
export interface TpDrafterLoadRequest {
  readonly type: 'drafter.load';
  readonly id: number;
  readonly dir: string;
  readonly plugins: readonly string[];
  readonly options: DrafterShardRequestOptions;
}

/** Call `name(...args)` on a worker rank's drafter shard `id` (driver → rank; `dispose` also forgets it). */
export interface TpDrafterCallRequest {
  readonly type: 'drafter.call';
  readonly id: number;
  readonly name: string;
  readonly args: readonly unknown[];
}

/**
 * Loads this rank's shard of the drafter checkpoint `dir` through the drafter plugin that claims it
 * (config.json `architectures`) and its `loadShard`; undefined when that plugin has no `loadShard`.
 * @throws {PluginError} when no plugin claims the checkpoint; the plugin's errors (a tp that does not fit).
 */
export async function loadDrafterShardOf(
  dir: string,
  plugins: readonly string[],
  target: StageModel,
  comm: TpComm,
  options: DrafterShardRequestOptions,
): Promise<{ drafter: Drafter; reads: readonly TensorRead[] } | undefined> {
  const container = rootContainer.createChildContainer();
  await loadPluginPackages(plugins, container);
  const config = HfConfig.read(dir);
  const plugin = DrafterRegistry.fromContainer(container).resolve(config);
  if (plugin.loadShard === undefined) return undefined;
  const weights = SafetensorsCheckpoint.open(dir);
  try {
    let reads: readonly TensorRead[] = [];
    const drafter = await plugin.loadShard(
      { dir, config, weights },
      { ...options, target, comm, onReads: (r) => (reads = r) },
    );
    return { drafter, reads };
  } finally {
    weights.close();
  }
}

/** Applies the driver's cache operations to this rank's caches (pipeline stage-worker semantics). */
export class RankCaches extends CacheReplica {
  constructor(model: StageModel) {
    super(model, 'tensor-parallel rank');
  }

  /** Applies `ops` in order and returns cache `id` (a {@link TpSyncRequest}). */
  sync(ops: readonly CacheOp[], id: number): SequenceCache {
    for (const op of ops) this.apply(op);
    return this.cache(id);
  }

  forward(req: TpForwardRequest): void {
    for (const op of req.ops) this.apply(op);
    const sequences: ForwardSequence[] = req.seqs.map((s) => ({
      id: s.id,
      position: s.position,
      tokens: s.tokens,
      logits: s.logits,
      ...(s.phase === undefined ? {} : { phase: s.phase }),
      ...(s.tree === undefined ? {} : { tree: s.tree }),
    }));
    this.runForward(req.cache, (cache) =>
      this.model.forward({ sequences, hidden: req.hidden }, cache, { stateSnapshots: req.snapshots }),
    );
  }
}
