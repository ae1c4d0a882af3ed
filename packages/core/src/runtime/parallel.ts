/**
 * Loading a target spread over tensor-parallel ranks (threads of this process), pipeline stages
 * (processes), or both (TP × PP: every stage a TP group); {@link loadParallelTarget} picks the way
 * from the deployment's parallelism, as `specd generate` and `specd serve` load it.
 */

import 'reflect-metadata';
import { container as rootContainer } from 'tsyringe';

import { HfConfig } from '../io/hf-config.js';
import { Tokenizer } from '../io/tokenizer.js';
import { type LoadProgress, TensorParallelUnsupportedError } from '../plugin/model-plugin.js';
import { loadPluginPackages, ModelRegistry, PluginError } from '../plugin/registry.js';
import { type StageHost, startPipeline } from '../pipeline/start-pipeline.js';
import { startTensorParallel } from '../tensor-parallel/tp-model.js';
import { ggufPathOf, loadTarget, type LoadedTarget, type TargetLoadOptions } from './target.js';

/**
 * A parallelism the deployment asks for that cannot be used: a partition whose length is not pp, or
 * (from {@link loadParallelTarget}) a tp that does not fit the model. The message names the flag
 * (`--pp-partition`, `--tp`), as the CLI reports it.
 */
export class ParallelismError extends Error {
  override readonly name = 'ParallelismError';
}

/** Options of {@link loadPipelineTarget}. */
export interface PipelineTargetOptions {
  /** Stages (≥ 2). */
  readonly pp: number;
  /** Layers per stage; default vLLM's split (pipeline/partition.ts). */
  readonly partition?: readonly number[];
  /** Load the embedding on the last stage too (needed when a drafter reuses it; default true). */
  readonly lastStageEmbedding?: boolean;
  readonly onProgress?: (p: LoadProgress) => void;
  /** TP × PP: tensor-parallel ranks per stage (default 1). */
  readonly tp?: number;
  /** Driver ↔ stage transport (default `'zmq'`; {@link PipelineOptions.transport}). */
  readonly transport?: 'zmq' | 'fifo';
  /** Stage processes on other hosts and the driver's address for them ({@link PipelineOptions.stageHosts}). */
  readonly stageHosts?: readonly StageHost[];
  readonly bindHost?: string;
}

/**
 * {@link loadTarget} under pipeline parallelism: stages 0 … pp−2 as stage processes, the last stage
 * here ({@link startPipeline}); `model` is the {@link PipelineModel}. Hugging Face folders only.
 * @throws {PluginError} for a GGUF model; PartitionError / PipelineStageError; the plugin's errors.
 */
export async function loadPipelineTarget(
  modelDir: string,
  plugins: readonly string[],
  options: PipelineTargetOptions,
): Promise<LoadedTarget> {
  if (ggufPathOf(modelDir) !== undefined)
    throw new PluginError(
      `${modelDir}: pipeline parallelism loads Hugging Face folders (config.json + safetensors), not GGUF`,
    );
  const config = HfConfig.read(modelDir);
  const container = rootContainer.createChildContainer();
  await loadPluginPackages(plugins, container);
  const plugin = ModelRegistry.fromContainer(container).resolve(config);
  if ((options.tp ?? 1) > 1 && plugin.loadShard === undefined)
    throw new PluginError(`model plugin ${plugin.name} does not support tensor parallelism (it has no loadShard)`);
  const tokenizer = Tokenizer.load(modelDir);
  const model = await startPipeline({
    ...(options.tp === undefined ? {} : { tp: options.tp }),
    ...(options.transport === undefined ? {} : { transport: options.transport }),
    ...(options.stageHosts === undefined ? {} : { stageHosts: options.stageHosts }),
    ...(options.bindHost === undefined ? {} : { bindHost: options.bindHost }),
    modelDir,
    plugins,
    pp: options.pp,
    ...(options.partition === undefined ? {} : { partition: options.partition }),
    ...(options.lastStageEmbedding === undefined ? {} : { lastStageEmbedding: options.lastStageEmbedding }),
    ...(options.onProgress === undefined ? {} : { onProgress: options.onProgress }),
  });
  return { model, tokenizer, pluginName: plugin.name, eosTokenIds: tokenizer.eosTokenIds };
}

/** Options of {@link loadTensorParallelTarget}. */
export interface TensorParallelTargetOptions {
  /** Ranks (≥ 2). */
  readonly tp: number;
  /** Kernel threads for the process-wide pool ({@link TensorParallelOptions.kernelThreads}). */
  readonly kernelThreads?: number;
}

/**
 * {@link loadTarget} under tensor parallelism: `tp` ranks (rank 0 here, the others worker threads),
 * each loading its shard through the plugin's `loadShard` ({@link startTensorParallel}); `model` is
 * the {@link TensorParallelModel}. Hugging Face folders only.
 * @throws {PluginError} for a GGUF model or a plugin without `loadShard`; the plugin's errors (a tp that does not
 *   fit the model).
 */
export async function loadTensorParallelTarget(
  modelDir: string,
  plugins: readonly string[],
  options: TensorParallelTargetOptions,
): Promise<LoadedTarget> {
  if (ggufPathOf(modelDir) !== undefined)
    throw new PluginError(
      `${modelDir}: tensor parallelism loads Hugging Face folders (config.json + safetensors), not GGUF`,
    );
  const config = HfConfig.read(modelDir);
  const container = rootContainer.createChildContainer();
  await loadPluginPackages(plugins, container);
  const plugin = ModelRegistry.fromContainer(container).resolve(config);
  if (plugin.loadShard === undefined)
    throw new PluginError(`model plugin ${plugin.name} does not support tensor parallelism (it has no loadShard)`);
  const tokenizer = Tokenizer.load(modelDir);
  const model = await startTensorParallel({
    modelDir,
    plugins,
    tp: options.tp,
    ...(options.kernelThreads === undefined ? {} : { kernelThreads: options.kernelThreads }),
  });
  return { model, tokenizer, pluginName: plugin.name, eosTokenIds: tokenizer.eosTokenIds };
}

/**
 * Parallelism of {@link loadParallelTarget} (the config's `parallelism`, flags applied), and the checkpoint
 * sanity options (applied at tp = pp = 1; tensor- and pipeline-parallel loads keep the default, `'refuse'`).
 */
export interface ParallelTargetOptions extends TargetLoadOptions {
  readonly tp: number;
  readonly pp: number;
  readonly partition?: readonly number[];
  /** Under pp > 1: load the embedding on the last stage too (a drafter reuses it). */
  readonly lastStageEmbedding?: boolean;
  readonly onProgress?: (p: LoadProgress) => void;
  /** Under pp > 1: driver ↔ stage transport (default `'zmq'`). */
  readonly transport?: 'zmq' | 'fifo';
  /** Under pp > 1: stage processes on other hosts, and the driver's address for them (PipelineOptions). */
  readonly stageHosts?: readonly StageHost[];
  readonly bindHost?: string;
}

/**
 * Refuses a partition whose length is not pp (the model checks the layer counts when it loads).
 * (tp > 1 with pp > 1 is TP × PP: every stage a TP group.)
 * @throws {ParallelismError} naming `--pp-partition` and the `--pp` to give.
 */
export function checkParallelism(tp: number, pp: number, partition: readonly number[] | undefined): void {
  if (partition !== undefined && partition.length !== pp) {
    throw new ParallelismError(
      `--pp-partition ${partition.join(',')}: ${partition.length} entries (layers per pipeline stage) ` +
        `but ${pp} stage${pp === 1 ? '' : 's'}; give --pp ${partition.length}`,
    );
  }
}

/**
 * The target as `specd generate` and `specd serve` load it: {@link loadTarget} (tp = pp = 1),
 * {@link loadTensorParallelTarget} (tp > 1) or {@link loadPipelineTarget} (pp > 1; with tp > 1 every
 * stage a TP group). A tp that does not fit the model (the plugin's {@link TensorParallelUnsupportedError}) or a
 * plugin without `loadShard` (a {@link PluginError}) becomes a {@link ParallelismError} naming `--tp`.
 * @throws {ParallelismError}; as the loader it picks.
 */
export async function loadParallelTarget(
  modelDir: string,
  plugins: readonly string[],
  options: ParallelTargetOptions,
): Promise<LoadedTarget> {
  const { tp, pp } = options;
  checkParallelism(tp, pp, options.partition);
  if ((options.device ?? 'cpu') !== 'cpu' && (tp > 1 || pp > 1))
    throw new ParallelismError(
      `--device ${options.device} runs the whole model on one GPU: --tp and --pp are not available with it yet`,
    );
  const tpError = (err: Error): never => {
    throw err instanceof TensorParallelUnsupportedError || err instanceof PluginError
      ? new ParallelismError(`--tp ${tp}: ${err.message}`)
      : err;
  };
  if (pp > 1) {
    return loadPipelineTarget(modelDir, plugins, {
      pp,
      ...(tp > 1 ? { tp } : {}),
      ...(options.partition === undefined ? {} : { partition: options.partition }),
      ...(options.transport === undefined ? {} : { transport: options.transport }),
      ...(options.stageHosts === undefined ? {} : { stageHosts: options.stageHosts }),
      ...(options.bindHost === undefined ? {} : { bindHost: options.bindHost }),
      ...(options.lastStageEmbedding === undefined ? {} : { lastStageEmbedding: options.lastStageEmbedding }),
      ...(options.onProgress === undefined ? {} : { onProgress: options.onProgress }),
    }).catch(
      tp > 1
        ? tpError
        : (err: Error): never => {
            throw err;
          },
    );
  }
  if (tp > 1) return loadTensorParallelTarget(modelDir, plugins, { tp }).catch(tpError);
  return loadTarget(modelDir, plugins, options.onProgress, options);
}
