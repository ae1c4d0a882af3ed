/**
 * Loading a whole target in this process: resolve its model plugin (Hugging Face folder or GGUF),
 * load every layer as one stage, and its tokenizer. The parallel ways to load it (tensor and pipeline
 * parallelism) are in parallel.ts; drafters in drafter.ts.
 */

import 'reflect-metadata';
import { container as rootContainer } from 'tsyringe';

import * as fs from 'node:fs';
import * as nodePath from 'node:path';

import { CheckpointSanity, type CheckpointSanityMode } from '../io/checkpoint-sanity.js';
import { GgufFile } from '../io/gguf.js';
import { tokenizerFromGguf } from '../io/gguf-tokenizer.js';
import { HfConfig } from '../io/hf-config.js';
import { SafetensorsCheckpoint } from '../io/safetensors-checkpoint.js';
import { Tokenizer } from '../io/tokenizer.js';
import type { Device, LoadProgress, ModelPlugin, StageLoadOptions, StageModel } from '../plugin/model-plugin.js';
import { loadPluginPackages, ModelRegistry, PluginError } from '../plugin/registry.js';

/** A loaded target + tokenizer. */
export interface LoadedTarget {
  readonly model: StageModel;
  readonly tokenizer: Tokenizer;
  readonly pluginName: string;
  /** EOS ids (tokenizer ∪ generation_config). */
  readonly eosTokenIds: readonly number[];
}

/** Checkpoint sanity options of {@link loadTarget} and `loadDrafter` (io/checkpoint-sanity.ts). */
export interface SanityLoadOptions {
  /**
   * The deployment config's `checkpoint_sanity`: `'refuse'` (default) refuses a checkpoint with a non-finite
   * weight; `'warn'` reports it and loads it anyway. Structural problems are refused in both modes.
   */
  readonly checkpointSanity?: CheckpointSanityMode;
  /** Where the warnings go (default: a `warning: …` line on stderr). */
  readonly onWarning?: (message: string) => void;
}

/** Options of {@link loadTarget}: checkpoint sanity and the device. */
export interface TargetLoadOptions extends SanityLoadOptions {
  /** Where the model runs (default `'cpu'`; StageLoadOptions.device). */
  readonly device?: Device;
  /** Rows of the largest forward, for a device that allocates activations up front (StageLoadOptions.maxTokens). */
  readonly maxTokens?: number;
}

/**
 * The options a plugin's load gets for `device` (and `maxTokens`).
 * @throws {PluginError} when the plugin does not run on the device (its `devices`, default `['cpu']`).
 */
export function deviceLoadOptions(plugin: ModelPlugin, options: TargetLoadOptions): StageLoadOptions {
  const device = options.device ?? 'cpu';
  const devices = plugin.devices ?? ['cpu'];
  if (!devices.includes(device))
    throw new PluginError(
      `model plugin ${plugin.name} runs on ${devices.join(', ')} only: --device ${device} is not available for it`,
    );
  return device === 'cpu'
    ? {}
    : { device, ...(options.maxTokens === undefined ? {} : { maxTokens: options.maxTokens }) };
}

/** The {@link CheckpointSanity} of one load. */
export function sanityOf(options: SanityLoadOptions): CheckpointSanity {
  return new CheckpointSanity({
    ...(options.checkpointSanity === undefined ? {} : { mode: options.checkpointSanity }),
    ...(options.onWarning === undefined ? {} : { onWarning: options.onWarning }),
  });
}

/**
 * The checks after a checkpoint's load that need the loaded model: every EOS id and every token id the
 * tokenizer can produce inside the model's vocabulary (refused), and the checkpoint's tensors the plugin
 * never read (a warning naming them: e.g. a tensor of a variant the plugin does not implement).
 * @param where the checkpoint, for messages.
 * @throws {CheckpointSanityError} `'config'` naming the EOS id or the tokenizer's size.
 */
export function checkLoadedCheckpoint(
  sanity: CheckpointSanity,
  where: string,
  vocabSize: number,
  tokenizer: Tokenizer | undefined,
  weights: SafetensorsCheckpoint | undefined,
): void {
  if (tokenizer !== undefined) {
    if (tokenizer.vocabSize > vocabSize)
      sanity.refuse(
        'config',
        'tokenizer',
        `${where}: the tokenizer has token ids up to ${tokenizer.vocabSize - 1}, ` +
          `outside the model's vocabulary [0, ${vocabSize}) (config vocab_size)`,
      );
    const eos = tokenizer.eosTokenIds.find((id) => id >= vocabSize);
    if (eos !== undefined)
      sanity.refuse(
        'config',
        'eos_token_id',
        `${where}: EOS token id ${eos} (tokenizer / generation_config eos_token_id) is outside the model's ` +
          `vocabulary [0, ${vocabSize})`,
      );
  }
  if (weights === undefined) return;
  const unread = weights.unreadNames();
  if (unread.length > 0) {
    const shown = unread.slice(0, 8).map((n) => JSON.stringify(n));
    sanity.warn(
      `${where}: ${unread.length} tensor${unread.length === 1 ? '' : 's'} present but ignored by the loader: ` +
        `${shown.join(', ')}${unread.length > shown.length ? ', …' : ''}`,
    );
  }
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
 * GGUF metadata; tokenizer.json next to it wins when present). Checkpoint sanity (`options`,
 * io/checkpoint-sanity.ts): the plugin's reads are scanned for non-finite values, then
 * {@link checkLoadedCheckpoint} (EOS ids, tokenizer size, tensors present but ignored).
 * @throws {PluginError} / {HfConfigError} / {SafetensorsError} / {GgufError} / {TokenizerError} /
 *   {CheckpointSanityError} / the plugin's errors.
 */
export async function loadTarget(
  modelDir: string,
  plugins: readonly string[],
  onProgress?: (p: LoadProgress) => void,
  options: TargetLoadOptions = {},
): Promise<LoadedTarget> {
  const sanity = sanityOf(options);
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
    const model = await plugin.loadGguf(file, {
      ...(onProgress === undefined ? {} : { onProgress }),
      sanity,
      ...deviceLoadOptions(plugin, options),
    });
    try {
      checkLoadedCheckpoint(sanity, ggufPath, model.info.vocabSize, tokenizer, undefined);
    } catch (err) {
      model.dispose();
      throw err;
    }
    return { model, tokenizer, pluginName: plugin.name, eosTokenIds: tokenizer.eosTokenIds };
  }
  const config = HfConfig.read(modelDir);
  const plugin = ModelRegistry.fromContainer(container).resolve(config);
  const tokenizer = Tokenizer.load(modelDir);
  const weights = SafetensorsCheckpoint.open(modelDir);
  let model: StageModel;
  try {
    model = await plugin.load(
      { dir: modelDir, config, weights, sanity },
      { ...(onProgress === undefined ? {} : { onProgress }), ...deviceLoadOptions(plugin, options) },
    );
    try {
      checkLoadedCheckpoint(sanity, modelDir, model.info.vocabSize, tokenizer, weights);
    } catch (err) {
      model.dispose();
      throw err;
    }
  } finally {
    weights.close();
  }
  return { model, tokenizer, pluginName: plugin.name, eosTokenIds: tokenizer.eosTokenIds };
}
