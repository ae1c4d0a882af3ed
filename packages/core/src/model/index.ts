/** @specd/core model: model pieces shared by plugins — the dense decoder block, shard-aware weight packing. */
export {
  accumulateBlockLinear,
  applyBlockLinear,
  type BlockLinear,
  denseBlock,
  denseBlockOutput,
  type DenseBlockOptions,
  type DenseBlockOutputWeights,
  type DenseBlockWeights,
} from './dense-block.js';
export {
  DRAFT_WEIGHT_FORMATS,
  draftWeightFormat,
  packLinear,
  projectionFormatOf,
  blockDrafterWeightsDefault,
  isQ8_0Format,
  q8_0Blocker,
  q8_0Linear,
  q8_0LinearIfFinite,
  type DraftWeightFormat,
  type Q8_0Linear,
} from './quant-linear.js';
export { freshScratch, keptScratch, type Scratch } from './scratch.js';
export { packShard, type ShardPart, type ShardSplit, type WeightShard } from './shard-weights.js';
