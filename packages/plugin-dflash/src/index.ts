/**
 * @specd/plugin-dflash — the DFlash drafter (z-lab checkpoint format).
 * Registration: `register(container)` puts {@link dflashPlugin} under core's DRAFTER_PLUGIN token.
 */
import { DRAFTER_PLUGIN } from '@specd/core';
import type { DependencyContainer } from 'tsyringe';

import { dflashPlugin } from './plugin.js';

/** Registers the plugin in a tsyringe container. */
export function register(container: DependencyContainer): void {
  container.register(DRAFTER_PLUGIN, { useValue: dflashPlugin });
}

export { dflashPlugin } from './plugin.js';
export {
  DFLASH_ARCHITECTURES,
  DFLASH_MAX_BLOCK_SIZE,
  DFLASH_DEVICES,
  DFLASH_SCHEMA,
  DFLASH_WEIGHTS_SCHEMA,
  dflashConfidence,
  dflashDevice,
  parseDFlashConfig,
  type DFlashConfig,
  type DFlashLayerType,
} from './config.js';
export {
  DFLASH_MASK_NORM_MIN_FRACTION,
  DFlashDrafter,
  checkMaskEmbedding,
  loadDFlash,
  loadDFlashDrafter,
  loadDFlashProjection,
  loadDFlashShard,
  type DFlashLoadParts,
} from './dflash.js';
export {
  DFlashCudaDrafter,
  dflashCudaDeviceOf,
  type DFlashCudaAddon,
  type DFlashCudaDevice,
  type DFlashCudaHandle,
  type DFlashCudaLayerWeights,
  type DFlashCudaSizes,
  type DFlashCudaWeights,
} from './dflash-cuda.js';
export {
  DRAFT_VOCAB_IDS_TENSOR,
  DraftHead,
  draftHeadFormat,
  draftsFromLogits,
  gatherLmHeadRows,
  readDraftVocabIds,
  type HeadDrafts,
} from './draft-head.js';
