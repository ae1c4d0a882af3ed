/** @specd/core plugin: model and drafter contracts, the drafter base class, DI tokens, registry, package loading. */
export {
  forwardSequence,
  type ForwardBatch,
  type ForwardOptions,
  type ForwardResult,
  type ForwardSequence,
  type LoadProgress,
  type LogitsRequest,
  type LoadedShard,
  type ModelPlugin,
  type ModelSource,
  type ProjectionSpec,
  type ShardLoadOptions,
  type TpComm,
  type StageInfo,
  type StageLoadOptions,
  type Device,
  type StageModel,
  TensorParallelUnsupportedError,
} from './model-plugin.js';
export {
  BUILTIN_PLUGIN_PACKAGES,
  checkApiVersion,
  DRAFTER_PLUGIN,
  DrafterRegistry,
  MODEL_PLUGIN,
  ModelRegistry,
  PLUGIN_API_VERSION,
  PluginError,
  loadPluginPackages,
} from './registry.js';
export { DrafterBase } from './drafter-base.js';
export { PackedTaps } from './packed-taps.js';
export { DeviceQRows, lentCudaDevice, type LentCudaDevice } from './cuda-device.js';
export {
  DrafterError,
  stageTaps,
  type ContextSpan,
  type DraftBatch,
  type Drafter,
  type DrafterLoadOptions,
  type DrafterPlugin,
  type DrafterSchema,
  type DrafterShardLoadOptions,
  type DrafterSource,
  type DeviceDraftProbs,
  type DraftProposal,
  type DraftSampling,
  type DraftSequence,
  type PartialProjection,
  type ProjectionLoadOptions,
  type RandomSource,
} from './drafter-plugin.js';
export { TapProjection } from './tap-projection.js';
export {
  hasDeviceSampling,
  hasPrefixCommit,
  hasProjectionDistribution,
  hasTreeCommit,
  isDistributedStage,
  type DeviceSampleSpec,
  type DeviceSampling,
  type DistributedStage,
  type PrefixCommit,
  type ProjectionDistribution,
  type TreeCommit,
} from './stage-capabilities.js';
