/**
 * Loading a whole target in this process: resolve its model plugin (Hugging Face folder or GGUF),
 * load every layer as one stage, and its tokenizer. The parallel ways to load it (tensor and pipeline
 * parallelism) are in parallel.ts; drafters in drafter.ts.
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
import type { LoadProgress, StageModel } from '../plugin/model-plugin.js';
import { loadPluginPackages, ModelRegistry, PluginError } from '../plugin/registry.js';

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
    const model = await plugin.loadGguf(file, { onProgress });
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
