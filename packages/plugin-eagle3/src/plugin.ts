/**
 * The EAGLE-3 {@link DrafterPlugin}: chosen for checkpoints with `architectures ["LlamaForCausalLMEagle3"]`
 * (EAGLE-3 layout) or `["Eagle3Speculator"]` (vLLM speculators layout). `load` puts the draft model on the
 * target's GPU when the target stage runs on one (eagle3-cuda.ts), else on the CPU (the `device` setting overrides).
 */
import type {
  Drafter,
  DrafterLoadOptions,
  DrafterPlugin,
  DrafterShardLoadOptions,
  DrafterSource,
  PartialProjection,
  ProjectionLoadOptions,
} from '@specd/core';

import { EAGLE3_ARCHITECTURES, EAGLE3_SCHEMA, parseEagle3Config } from './config.js';
import { loadEagle3, loadEagle3Projection, loadEagle3Shard } from './eagle3-load.js';

export const eagle3Plugin: DrafterPlugin = Object.freeze({
  // the plugin API version (core's PLUGIN_API_VERSION) this plugin is built for
  apiVersion: 1,
  method: 'eagle3',
  architectures: EAGLE3_ARCHITECTURES,
  schema: EAGLE3_SCHEMA,
  load(source: DrafterSource, options: DrafterLoadOptions): Promise<Drafter> {
    return Promise.resolve().then(() => loadEagle3(source, parseEagle3Config(source.config), options));
  },
  loadShard(source: DrafterSource, options: DrafterShardLoadOptions): Promise<Drafter> {
    return Promise.resolve().then(() => loadEagle3Shard(source, parseEagle3Config(source.config), options));
  },
  loadProjection(source: DrafterSource, options: ProjectionLoadOptions): PartialProjection {
    return loadEagle3Projection(source, parseEagle3Config(source.config), options);
  },
});
