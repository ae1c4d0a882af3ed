/**
 * Plain generation (no drafter): load a target through its model plugin, prefill the prompt in
 * chunks, then decode one token per forward with greedy or seeded sampling. What `specd generate`
 * runs; plain and speculative generation both run the spec-decode engine (propose → verify →
 * accept → commit; without a drafter every step is a plain decode step).
 */

import 'reflect-metadata';
import { container as rootContainer } from 'tsyringe';

import * as fs from 'node:fs';
import * as nodePath from 'node:path';

import { GgufFile } from '../io/gguf.js';
import { tokenizerFromGguf } from '../io/gguf-tokenizer.js';
import { HfConfig } from '../io/hf-config.js';
import { SafetensorsCheckpoint } from '../io/safetensors-checkpoint.js';
import { Tokenizer } from '../io/tokenizer.js';
import { SpecEngine, type SpecRequest } from '../engine/engine.js';
import type { RequestMetrics } from '../engine/metrics.js';
import type { SamplingParams } from '../engine/types.js';
import type { Drafter } from '../plugin/drafter-plugin.js';
import type { LoadProgress, StageModel } from '../plugin/model-plugin.js';
import { DrafterRegistry, loadPluginPackages, ModelRegistry, PluginError } from '../plugin/registry.js';
import { startPipeline } from '../pipeline/pipeline-model.js';
import { startTensorParallel } from '../tensor-parallel/tp-model.js';
import { CliError, type DrafterChoice } from './config-file.js';

/** Tokens per prefill forward. */
export const PREFILL_CHUNK_TOKENS = 64;
/** KV page size used by generate. */
const PAGE_SIZE = 16;

/** A loaded target + tokenizer. */
export interface LoadedTarget {
  readonly model: StageModel;
  readonly tokenizer: Tokenizer;
  readonly pluginName: string;
  /** EOS ids (tokenizer ∪ generation_config). */
  readonly eosTokenIds: readonly number[];
}

/**
 * The GGUF file a model path names: the path itself when it ends in `.gguf`, or the one `.gguf` of a
 * folder without config.json; undefined for a Hugging Face folder.
 * @throws {PluginError} for a folder without config.json that holds no or several `.gguf` files.
 */
export function ggufPathOf(modelPath: string): string | undefined {
  if (modelPath.endsWith('.gguf')) return modelPath;
  if (
    !fs.existsSync(modelPath) ||
    !fs.statSync(modelPath).isDirectory() ||
    fs.existsSync(nodePath.join(modelPath, 'config.json'))
  )
    return undefined;
  const ggufs = fs
    .readdirSync(modelPath)
    .filter((f) => f.endsWith('.gguf'))
    .sort();
  if (ggufs.length === 1) return nodePath.join(modelPath, ggufs[0]!);
  if (ggufs.length > 1)
    throw new PluginError(`${modelPath}: several GGUF files (${ggufs.join(', ')}) and no config.json: name the file`);
  return undefined;
}

/**
 * Imports the plugin packages, resolves the plugin for the model, loads the whole model (one stage)
 * and the tokenizer. The model is a Hugging Face folder (config.json, safetensors, tokenizer.json),
 * a `.gguf` file, or a folder holding one `.gguf` and no config.json (config and tokenizer from the
 * GGUF metadata; tokenizer.json next to it wins when present).
 * @throws {PluginError} / {HfConfigError} / {SafetensorsError} / {GgufError} / {TokenizerError} / the plugin's errors.
 */
export async function loadTarget(
  modelDir: string,
  plugins: readonly string[],
  onProgress?: (p: LoadProgress) => void,
): Promise<LoadedTarget> {
  const container = rootContainer.createChildContainer();
  await loadPluginPackages(plugins, container);
  const ggufPath = ggufPathOf(modelDir);
  if (ggufPath !== undefined) {
    const file = GgufFile.open(ggufPath);
    const plugin = ModelRegistry.fromContainer(container).resolveGguf(file);
    const dir = nodePath.dirname(ggufPath);
    const tokenizer = fs.existsSync(nodePath.join(dir, 'tokenizer.json'))
      ? Tokenizer.load(dir)
      : tokenizerFromGguf(file);
    const model = await plugin.loadGguf!(file, { onProgress });
    return { model, tokenizer, pluginName: plugin.name, eosTokenIds: tokenizer.eosTokenIds };
  }
  const config = HfConfig.read(modelDir);
  const plugin = ModelRegistry.fromContainer(container).resolve(config);
  const tokenizer = Tokenizer.load(modelDir);
  const weights = SafetensorsCheckpoint.open(modelDir);
  let model: StageModel;
  try {
    model = await plugin.load({ dir: modelDir, config, weights }, { onProgress });
  } finally {
    weights.close();
  }
  return { model, tokenizer, pluginName: plugin.name, eosTokenIds: tokenizer.eosTokenIds };
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
    modelDir,
    plugins,
    pp: options.pp,
    ...(options.partition === undefined ? {} : { partition: options.partition }),
    ...(options.lastStageEmbedding === undefined ? {} : { lastStageEmbedding: options.lastStageEmbedding }),
    ...(options.onProgress === undefined ? {} : { onProgress: options.onProgress }),
  });
  return { model, tokenizer, pluginName: plugin.name, eosTokenIds: tokenizer.eosTokenIds };
}

/**
 * {@link loadTarget} under tensor parallelism: `tp` ranks (rank 0 here, the others worker threads),
 * each loading its shard through the plugin's `loadShard` ({@link startTensorParallel}); `model` is
 * the {@link TensorParallelModel}. Hugging Face folders only.
 * @throws {PluginError} for a GGUF model or a plugin without `loadShard`; the plugin's errors (a tp that does not fit the model).
 */
export async function loadTensorParallelTarget(
  modelDir: string,
  plugins: readonly string[],
  options: { readonly tp: number; readonly kernelThreads?: number },
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

/** Parallelism of {@link loadParallelTarget} (the config's `parallelism`, flags applied). */
export interface ParallelTargetOptions {
  readonly tp: number;
  readonly pp: number;
  readonly partition?: readonly number[];
  /** Under pp > 1: load the embedding on the last stage too (a drafter reuses it). */
  readonly lastStageEmbedding?: boolean;
  readonly onProgress?: (p: LoadProgress) => void;
  /** Under pp > 1: driver ↔ stage transport (default `'zmq'`). */
  readonly transport?: 'zmq' | 'fifo';
}

/**
 * Refuses a partition whose length is not pp (the model checks the layer counts when it loads).
 * (tp > 1 with pp > 1 is TP × PP: every stage a TP group.)
 * @throws {CliError}
 */
export function checkParallelism(tp: number, pp: number, partition: readonly number[] | undefined): void {
  if (partition !== undefined && partition.length !== pp) {
    throw new CliError(
      `--pp-partition ${partition.join(',')}: ${partition.length} entries (layers per pipeline stage) but ${pp} stage${pp === 1 ? '' : 's'}; give --pp ${partition.length}`,
    );
  }
}

/**
 * The target as `specd generate` and `specd serve` load it: {@link loadTarget} (tp = pp = 1),
 * {@link loadTensorParallelTarget} (tp > 1) or {@link loadPipelineTarget} (pp > 1; with tp > 1 every
 * stage a TP group). A tp that does not
 * fit the model or a plugin without `loadShard` becomes a {@link CliError} naming `--tp`.
 */
export async function loadParallelTarget(
  modelDir: string,
  plugins: readonly string[],
  options: ParallelTargetOptions,
): Promise<LoadedTarget> {
  const { tp, pp } = options;
  checkParallelism(tp, pp, options.partition);
  const tpError = (err: Error): never => {
    throw err.name === 'KimiTensorParallelError' || err.name === 'PluginError'
      ? new CliError(`--tp ${tp}: ${err.message}`)
      : err;
  };
  if (pp > 1) {
    return loadPipelineTarget(modelDir, plugins, {
      pp,
      ...(tp > 1 ? { tp } : {}),
      ...(options.partition === undefined ? {} : { partition: options.partition }),
      ...(options.transport === undefined ? {} : { transport: options.transport }),
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
  return loadTarget(modelDir, plugins, options.onProgress);
}

/** Options of {@link generateTokens}. */
export interface GenerateOptions {
  readonly promptIds: Int32Array;
  /** New tokens at most (≥ 1). */
  readonly maxTokens: number;
  readonly sampling: SamplingParams;
  readonly seed: number;
  /**
   * The user fixed `seed` (`--seed`, or the config's `sampling.seed`): speculative generation under
   * the timing-based default policy then decodes a sampled request plainly (k = 0) so the output is
   * reproducible per seed ({@link SpecRequest.seeded}). Plain generation is reproducible regardless.
   */
  readonly seeded?: boolean;
  /** Keep going after EOS. */
  readonly ignoreEos?: boolean;
  /** Called with each new token id, in order. */
  readonly onToken?: (id: number) => void;
}

/** What {@link generateTokens} returns. */
export interface GenerateResult {
  readonly tokenIds: number[];
  /** Wall time of prefill + decode, seconds (loading excluded). */
  readonly seconds: number;
  /** True if generation stopped at an EOS token (included in tokenIds). */
  readonly stoppedAtEos: boolean;
}

/**
 * Generates up to `maxTokens` tokens after the prompt (prefill in {@link PREFILL_CHUNK_TOKENS}
 * chunks; one forward per new token): one request through {@link SpecEngine} without a drafter,
 * so plain decoding and speculative decoding share one decode loop and one sampler (probs.ts).
 * @throws {RangeError} for an empty prompt or a bad maxTokens.
 */
export function generateTokens(target: LoadedTarget, options: GenerateOptions): GenerateResult {
  const { promptIds, maxTokens } = options;
  if (promptIds.length === 0) throw new RangeError('generate: the prompt encodes to no tokens');
  if (!Number.isSafeInteger(maxTokens) || maxTokens < 1)
    throw new RangeError(`generate: maxTokens: expected an integer >= 1, got ${maxTokens}`);
  const engine = new SpecEngine(target.model, undefined, {
    maxSequences: 1,
    maxTokensPerSequence: promptIds.length + maxTokens + 1,
    pageSize: PAGE_SIZE,
    prefillChunk: PREFILL_CHUNK_TOKENS,
  });
  const t0 = performance.now();
  try {
    const [r] = engine.run([
      {
        id: 0,
        promptIds,
        maxTokens,
        sampling: options.sampling,
        seed: options.seed,
        ignoreEos: options.ignoreEos,
        eosTokenIds: target.eosTokenIds,
        onToken: options.onToken,
      },
    ]);
    return { tokenIds: r!.tokenIds, seconds: (performance.now() - t0) / 1000, stoppedAtEos: r!.finishReason === 'eos' };
  } finally {
    engine.dispose(); // a failed decode step leaves the sequence running: free its cache
  }
}

/** A loaded drafter bound to a target. */
export interface LoadedDrafter {
  readonly drafter: Drafter;
  /** Its checkpoint directory; absent for a method without one. */
  readonly dir?: string;
}

/**
 * Imports the plugin packages and loads a drafter for `target` (room for `maxSequences` sequences of
 * `maxTokensPerSequence`): from a checkpoint directory (a string, or a choice with `dir`), resolving
 * the plugin by its config.json `architectures`; or, for a choice without `dir`, the plugin of
 * `choice.method` through its `loadWithoutCheckpoint`. A target with `loadDrafter` (tensor parallel,
 * or a pipeline whose last stage is) loads the drafter spread over its ranks when the plugin has
 * `loadShard`; otherwise the drafter is loaded whole here. On a target split into stages (a pipeline:
 * `StageModel.distributeProjection`) whose drafter plugin has `loadProjection`, every stage that
 * produces taps then loads its share of the projection and projects its taps itself.
 * @throws {PluginError} naming the loaded methods when none matches, a method that needs a checkpoint, or a `choice.method`
 *   other than the plugin that claims the checkpoint; the plugin's errors.
 */
export async function loadDrafter(
  choice: string | DrafterChoice,
  plugins: readonly string[],
  target: LoadedTarget,
  maxTokensPerSequence: number,
  maxSequences = 1,
): Promise<LoadedDrafter> {
  const c: DrafterChoice = typeof choice === 'string' ? { dir: choice } : choice;
  const container = rootContainer.createChildContainer();
  await loadPluginPackages(plugins, container);
  const options = {
    target: target.model,
    maxSequences,
    maxTokensPerSequence,
    ...(c.settings === undefined ? {} : { settings: c.settings }),
  };
  const drafterDir = c.dir;
  if (drafterDir === undefined) {
    if (c.method === undefined) throw new PluginError('drafter: neither a checkpoint directory nor a method');
    const plugin = DrafterRegistry.fromContainer(container).resolveMethod(c.method);
    if (plugin.loadWithoutCheckpoint === undefined)
      throw new PluginError(`drafter: method ${JSON.stringify(c.method)} needs a checkpoint: give "path"`);
    return { drafter: await plugin.loadWithoutCheckpoint(options) };
  }
  const config = HfConfig.read(drafterDir);
  const plugin = DrafterRegistry.fromContainer(container).resolve(config);
  if (c.method !== undefined && c.method !== plugin.method) {
    throw new PluginError(
      `drafter: method ${JSON.stringify(c.method)}, but ${config.file} (architectures [${config.architectures.join(', ')}]) is a ${JSON.stringify(plugin.method)} checkpoint; set "method": ${JSON.stringify(plugin.method)} or point "path" at a ${c.method} checkpoint`,
    );
  }
  // a target spread over tensor-parallel ranks loads the drafter spread the same way (if its plugin can)
  const { target: _whole, ...spreadOptions } = options;
  let drafter = await target.model.loadDrafter?.(drafterDir, plugins, spreadOptions);
  if (drafter === undefined) {
    const weights = SafetensorsCheckpoint.open(drafterDir);
    try {
      drafter = await plugin.load({ dir: drafterDir, config, weights }, options);
    } finally {
      weights.close();
    }
  }
  // A pipeline: the stages that produce taps project them in place (REFERENCE.md §8).
  // (A plugin without loadProjection resets the stages to shipping raw taps.)
  const taps = drafter.captureSetter(target.model.info);
  if (target.model.distributeProjection !== undefined) {
    try {
      target.model.distributeProjection(
        plugin.loadProjection !== undefined && taps.length > 0 ? { dir: drafterDir, taps } : undefined,
      );
    } catch (err) {
      drafter.dispose();
      throw err;
    }
  }
  return { drafter, dir: drafterDir };
}

/** What {@link generateSpeculative} returns: the plain result plus the spec-decode counters. */
export interface SpecGenerateResult extends GenerateResult {
  readonly metrics: RequestMetrics;
}

/**
 * {@link generateTokens} with speculative decoding (one request through {@link SpecEngine}).
 * Greedy output is token-for-token plain greedy decoding's; sampled output follows the same
 * distribution (rejection sampling) but not the same random stream (with `seeded` and no
 * `numDraftTokens` it decodes plainly, k = 0, reproducible per seed).
 * @throws {RangeError} for an empty prompt or a bad maxTokens.
 */
export function generateSpeculative(
  target: LoadedTarget,
  drafter: Drafter,
  options: GenerateOptions & { readonly numDraftTokens?: number },
): SpecGenerateResult {
  const { promptIds, maxTokens } = options;
  if (promptIds.length === 0) throw new RangeError('generate: the prompt encodes to no tokens');
  if (!Number.isSafeInteger(maxTokens) || maxTokens < 1)
    throw new RangeError(`generate: maxTokens: expected an integer >= 1, got ${maxTokens}`);
  const engine = new SpecEngine(target.model, drafter, {
    maxSequences: 1,
    maxTokensPerSequence: promptIds.length + maxTokens + drafter.maxDraftTokens + 1,
    pageSize: PAGE_SIZE,
    prefillChunk: PREFILL_CHUNK_TOKENS,
    ...(options.numDraftTokens === undefined ? {} : { draftLength: () => options.numDraftTokens! }),
  });
  // The cost policy measures draft/verify costs once per process; that is start-up (like loading),
  // not generation, so it happens before the clock starts.
  engine.calibrate();
  const t0 = performance.now();
  const [r] = engine.run([
    {
      id: 0,
      promptIds,
      maxTokens,
      sampling: options.sampling,
      seed: options.seed,
      seeded: options.seeded,
      ignoreEos: options.ignoreEos,
      eosTokenIds: target.eosTokenIds,
      onToken: options.onToken,
    },
  ]);
  return {
    tokenIds: r!.tokenIds,
    seconds: (performance.now() - t0) / 1000,
    stoppedAtEos: r!.finishReason === 'eos',
    metrics: r!.metrics,
  };
}
