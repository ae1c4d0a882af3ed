/**
 * @specd/plugin-eagle3 — the EAGLE-3 drafter, chain drafting and greedy dynamic trees on all-attention
 * targets (EAGLE-3 and vLLM speculators checkpoint formats); chains on the GPU beside a target on the GPU.
 * Registration: `register(container)` puts {@link eagle3Plugin} under core's DRAFTER_PLUGIN token.
 */
import { DRAFTER_PLUGIN } from '@specd/core';
import type { DependencyContainer } from 'tsyringe';

import { eagle3Plugin } from './plugin.js';

/** Registers the plugin in a tsyringe container. */
export function register(container: DependencyContainer): void {
  container.register(DRAFTER_PLUGIN, { useValue: eagle3Plugin });
}

export { eagle3Plugin } from './plugin.js';
export {
  EAGLE3_ARCHITECTURES,
  EAGLE3_DEFAULT_DRAFT_TOKENS,
  EAGLE3_DEVICES,
  EAGLE3_MAX_DRAFT_TOKENS,
  EAGLE3_MAX_TREE_DEPTH,
  EAGLE3_MAX_TREE_TOP_K,
  EAGLE3_SCHEMA,
  EAGLE3_WEIGHT_FORMATS,
  parseEagle3Config,
  parseEagle3Settings,
  type Eagle3Config,
  type Eagle3Device,
  type Eagle3Layout,
  type Eagle3Settings,
  type Eagle3TreeSettings,
  type Eagle3WeightFormat,
} from './config.js';
export { Eagle3Drafter } from './eagle3.js';
export {
  Eagle3CudaDrafter,
  cudaDeviceOf,
  type CudaTargetDevice,
  type Eagle3CudaAddon,
  type Eagle3CudaSizes,
  type Eagle3CudaWeights,
} from './eagle3-cuda.js';
export {
  EAGLE3_LAYER_PREFIXES,
  checkVocabularyMaps,
  loadEagle3,
  loadEagle3Drafter,
  loadEagle3Projection,
  loadEagle3Shard,
} from './eagle3-load.js';
