/**
 * @specd/model-kimi-k3 — the Kimi-K3 / Kimi-Linear target (KDA + MLA with NoPE + MoE).
 * Registration: `register(container)` puts {@link kimiPlugin} under core's MODEL_PLUGIN token.
 */
import { MODEL_PLUGIN } from '@specd/core';
import type { DependencyContainer } from 'tsyringe';

import { kimiPlugin } from './plugin.js';

/** Registers the plugin in a tsyringe container. */
export function register(container: DependencyContainer): void {
  container.register(MODEL_PLUGIN, { useValue: kimiPlugin });
}

export { kimiPlugin } from './plugin.js';
export {
  KIMI_ARCHITECTURES,
  KIMI_MODEL_TYPES,
  parseKimiConfig,
  type KimiConfig,
  type KimiLayerKind,
} from './config.js';
export {
  KimiForwardError,
  KimiStageModel,
  KimiTensorParallelError,
  defaultKimiActivations,
  kimiShardConfig,
  loadKimiFromDir,
  loadKimiShard,
  loadKimiStage,
  loadKimiStageAsync,
  type KdaSnapshotSet,
  type KimiDebugHooks,
  type KimiForwardOptions,
  type KimiForwardResult,
  type KimiKernelChoice,
  type KimiLoadOptions,
} from './model.js';
export type { KdaCommitMode, KdaLayerSnapshots } from './kda.js';
export {
  tsKernels,
  type KdaCall,
  type KimiKernels,
  type MlaBatch,
  type Routing,
  type SwigluWeights,
} from './kernels.js';
export { nativeKernels } from './kernels-native.js';
export type { RouterChoice } from './moe.js';
export { KimiWeightError } from './weights.js';
export { commitByReplay, commitFromSnapshots } from './rollback.js';
