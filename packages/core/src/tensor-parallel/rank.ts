/**
 * Loading a tensor-parallel rank's shard and applying the driver's cache operations to a rank's
 * caches (shared by the driver's rank 0 and the worker ranks, tp-worker.ts).
 */

import 'reflect-metadata';
import { container as rootContainer } from 'tsyringe';

import type { MessagePort } from 'node:worker_threads';

import { HfConfig } from '../io/hf-config.js';
import { SafetensorsCheckpoint } from '../io/safetensors-checkpoint.js';
import { SequenceCache, type SequenceCheckpoint } from '../kv/sequence-cache.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { ForwardResult, ForwardSequence, StageModel } from '../plugin/model-plugin.js';
import { loadPluginPackages, ModelRegistry, PluginError } from '../plugin/registry.js';
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
  readonly seqs: readonly { id: SequenceId; position: number; tokens: Int32Array; phase?: 'prefill'; tree?: Int32Array }[];
  readonly hidden: Float32Array;
  readonly snapshots: boolean;
}

/** Loads the shard of `rank` through the plugin that accepts the checkpoint. */
export async function loadShardOf(modelDir: string, plugins: readonly string[], comm: SharedComm, range?: ShardRange) {
  const container = rootContainer.createChildContainer();
  await loadPluginPackages(plugins, container);
  const config = HfConfig.read(modelDir);
  const plugin = ModelRegistry.fromContainer(container).resolve(config);
  if (plugin.loadShard === undefined) throw new PluginError(`model plugin ${plugin.name} does not support tensor parallelism (no loadShard)`);
  const weights = SafetensorsCheckpoint.open(modelDir);
  try {
    return { plugin, shard: await plugin.loadShard({ dir: modelDir, config, weights }, { comm, ...range }) };
  } finally {
    weights.close();
  }
}

/** Applies the driver's cache operations to this rank's caches (pipeline stage-worker semantics). */
export class RankCaches {
  private readonly caches = new Map<number, SequenceCache>();
  private readonly checkpoints = new Map<number, Map<SequenceId, SequenceCheckpoint>>();
  last: { cache: number; result: ForwardResult } | undefined;

  constructor(private readonly model: StageModel) {}

  cache(id: number): SequenceCache {
    const c = this.caches.get(id);
    if (c === undefined) throw new Error(`tensor-parallel rank: unknown cache ${id}`);
    return c;
  }

  private lastResult(cache: number): ForwardResult {
    if (this.last === undefined || this.last.cache !== cache) throw new Error('tensor-parallel rank: commit without a forward on this cache');
    return this.last.result;
  }

  apply(op: CacheOp): void {
    switch (op.op) {
      case 'cache':
        this.caches.set(op.cache, new SequenceCache(this.model.cacheGeometry, op.options));
        this.checkpoints.set(op.cache, new Map());
        return;
      case 'drop':
        this.caches.delete(op.cache);
        this.checkpoints.delete(op.cache);
        if (this.last?.cache === op.cache) this.last = undefined;
        return;
      case 'add':
        this.cache(op.cache).add(op.id);
        return;
      case 'finish':
        this.cache(op.cache).finish(op.id);
        this.checkpoints.get(op.cache)!.delete(op.id);
        return;
      case 'checkpoint':
        this.checkpoints.get(op.cache)!.set(op.id, this.cache(op.cache).checkpoint(op.id));
        return;
      case 'rollback': {
        const cp = this.checkpoints.get(op.cache)!.get(op.id);
        if (cp === undefined) throw new Error(`tensor-parallel rank: rollback of ${String(op.id)} without a checkpoint`);
        this.cache(op.cache).rollback(op.id, cp);
        this.checkpoints.get(op.cache)!.delete(op.id);
        return;
      }
      case 'commitPrefix':
        this.model.commitPrefix!(this.cache(op.cache), this.lastResult(op.cache), op.id, op.committed);
        return;
      case 'commitTreePath':
        this.model.commitTreePath!(this.cache(op.cache), this.lastResult(op.cache), op.id, op.rows);
        return;
    }
  }

  forward(req: TpForwardRequest): void {
    for (const op of req.ops) this.apply(op);
    const sequences: ForwardSequence[] = req.seqs.map((s) => ({
      id: s.id, position: s.position, tokens: s.tokens, logits: 'none',
      ...(s.phase === undefined ? {} : { phase: s.phase }), ...(s.tree === undefined ? {} : { tree: s.tree }),
    }));
    this.last = undefined;
    const result = this.model.forward({ sequences, hidden: req.hidden }, this.cache(req.cache), { stateSnapshots: req.snapshots });
    this.last = { cache: req.cache, result };
  }
}

