/**
 * Loading one pipeline stage (a layer range of a Hugging Face checkpoint) through its model plugin,
 * recording the tensors read (the stage processes report them; tests assert the layer ranges).
 */

import 'reflect-metadata';
import { container as rootContainer } from 'tsyringe';

import { HfConfig } from '../io/hf-config.js';
import { SafetensorsCheckpoint } from '../io/safetensors-checkpoint.js';
import type { LoadProgress, StageModel } from '../plugin/model-plugin.js';
import { loadPluginPackages, ModelRegistry } from '../plugin/registry.js';

/** What to load. */
export interface StageSpec {
  readonly modelDir: string;
  readonly plugins: readonly string[];
  readonly layerStart: number;
  readonly layerEnd: number;
  /** Also load the token embedding on a non-first stage (the last stage, for drafters that reuse it). */
  readonly embedding?: boolean;
}

/** A loaded stage and the tensors it read, in load order. */
export interface LoadedStage {
  readonly model: StageModel;
  readonly pluginName: string;
  readonly tensors: string[];
}

/** Loads `spec`'s layer range through the plugin that accepts the checkpoint's config.json. */
export async function loadStage(spec: StageSpec, onProgress?: (p: LoadProgress) => void): Promise<LoadedStage> {
  const container = rootContainer.createChildContainer();
  await loadPluginPackages(spec.plugins, container);
  const config = HfConfig.read(spec.modelDir);
  const plugin = ModelRegistry.fromContainer(container).resolve(config);
  const weights = SafetensorsCheckpoint.open(spec.modelDir);
  const tensors: string[] = [];
  try {
    const model = await plugin.load(
      { dir: spec.modelDir, config, weights },
      {
        layerStart: spec.layerStart,
        layerEnd: spec.layerEnd,
        ...(spec.embedding === true ? { embedding: true } : {}),
        onProgress: (p) => {
          tensors.push(p.tensor);
          onProgress?.(p);
        },
      },
    );
    return { model, pluginName: plugin.name, tensors };
  } finally {
    weights.close();
  }
}

/** `num_hidden_layers` of a checkpoint's config.json. */
export function numHiddenLayers(modelDir: string): number {
  return HfConfig.read(modelDir).requireInt('num_hidden_layers', { min: 1 });
}
