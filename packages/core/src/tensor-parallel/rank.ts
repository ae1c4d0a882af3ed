/**
 * Loading a tensor-parallel rank's shard and applying the driver's cache operations to a rank's
 * caches (shared by the driver's rank 0 and the worker ranks, tp-worker.ts).
 */

import 'reflect-metadata';
import { container as rootContainer } from 'tsyringe';

import type { MessagePort } from 'node:worker_threads';

import { HfConfig } from '../io/hf-config.js';
import { SafetensorsCheckpoint } from '../io/safetensors-checkpoint.js';

import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { ForwardSequence, StageModel } from '../plugin/model-plugin.js';
import { loadPluginPackages, ModelRegistry, PluginError } from '../plugin/registry.js';
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
export class RankCaches extends CacheReplica {
  constructor(model: StageModel) {
    super(model, 'tensor-parallel rank');
  }

  forward(req: TpForwardRequest): void {
    for (const op of req.ops) this.apply(op);
    const sequences: ForwardSequence[] = req.seqs.map((s) => ({
      id: s.id, position: s.position, tokens: s.tokens, logits: 'none',
      ...(s.phase === undefined ? {} : { phase: s.phase }), ...(s.tree === undefined ? {} : { tree: s.tree }),
    }));
    this.runForward(req.cache, (cache) => this.model.forward({ sequences, hidden: req.hidden }, cache, { stateSnapshots: req.snapshots }));
  }
}

