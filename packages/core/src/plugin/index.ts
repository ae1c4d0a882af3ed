/** @specd/core plugin: the model-plugin contract, DI token, registry and package loading. */
export {
  forwardSequence,
  type ForwardBatch, type ForwardOptions, type ForwardResult, type ForwardSequence, type LoadProgress, type LogitsRequest,
  type LoadedShard, type ModelPlugin, type ModelSource, type ProjectionSpec, type ShardLoadOptions, type TpComm, type StageInfo, type StageLoadOptions, type StageModel,
} from './model-plugin.js';
export {
  BUILTIN_PLUGIN_PACKAGES, DRAFTER_PLUGIN, DrafterRegistry, MODEL_PLUGIN, ModelRegistry, PluginError, loadPluginPackages,
} from './registry.js';
export {
  DrafterError, stageTaps,
  type ContextSpan, type DraftBatch, type Drafter, type DrafterLoadOptions, type DrafterPlugin, type DrafterSchema, type DrafterShardLoadOptions, type DrafterSource,
  type DraftProposal, type DraftSampling, type DraftSequence, type PartialProjection, type ProjectionLoadOptions, type RandomSource,
} from './drafter-plugin.js';
export { TapProjection } from './tap-projection.js';
