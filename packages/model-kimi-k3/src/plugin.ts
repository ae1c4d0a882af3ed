/** The Kimi-K3 / Kimi-Linear {@link ModelPlugin}: `load` = {@link loadKimiStageAsync} (yields between layers). */
import type {
  LoadedShard,
  ModelPlugin,
  ModelSource,
  ShardLoadOptions,
  StageLoadOptions,
  StageModel,
} from '@specd/core';

import { KIMI_ARCHITECTURES, KIMI_MODEL_TYPES } from './config.js';
import { loadKimiShard, loadKimiStageAsync } from './model.js';

/** Accepts model_type "kimi_k3" / "kimi_linear" (architecture KimiLinearForCausalLM). */
export const kimiPlugin: ModelPlugin = Object.freeze({
  // the plugin API version (core's PLUGIN_API_VERSION) this plugin is built for
  apiVersion: 1,
  name: 'kimi-k3',
  modelTypes: KIMI_MODEL_TYPES,
  architectures: KIMI_ARCHITECTURES,
  load(source: ModelSource, options?: StageLoadOptions): Promise<StageModel> {
    return loadKimiStageAsync(source, options);
  },
  loadShard(source: ModelSource, options: ShardLoadOptions): Promise<LoadedShard> {
    const { comm, ...rest } = options;
    return loadKimiShard(source, comm, rest);
  },
});
