/**
 * @specd/native — typed facade over the C++ kernels (bf16 weights, f32 activations and
 * accumulation, row-major tensors as typed arrays, never copied). This package's
 * `src/addon.ts` types the raw addon and is the only module that loads the `.node` file.
 *
 * Environment: `SPECD_ISA=auto|portable|avx512` (ISA path at load), `SPECD_NUM_THREADS=<n>`
 * (compute pool size), `SPECD_PARALLEL_MIN_WORK=<units>` (`setParallelMinWork` at load). See `isa()`.
 */
export {
  isa,
  setIsa,
  setNumThreads,
  setParallelMinWork,
  DEFAULT_PARALLEL_MIN_WORK,
  parallelCopy,
  guardedFloat32Array,
  type IsaInfo,
  type IsaName,
} from './src/runtime.js';
export { f32ToBf16, bf16ToF32 } from './src/convert.js';
export {
  packedBf16Length,
  packBf16Weights,
  gemmBf16,
  gemmBf16Accumulate,
  gemmBf16Async,
  type GemmActivations,
  type PackedBf16Weights,
} from './src/gemm.js';
export {
  quantizedWeights,
  gemmQuant,
  gemmQuantAsync,
  dequantizeToBf16,
  quantRawBytes,
  quantPackedBytes,
  type QuantActivation,
  type QuantType,
  type QuantizedWeights,
} from './src/quant.js';
export { rmsNorm, gatedRmsNorm, rmsNormPerHead, type RmsNormGate } from './src/norm.js';
export { applyRope, type RopeOptions, type RopeStyle } from './src/rope.js';
export { addF32, silu, swiglu, swigluFused } from './src/activation.js';
export { softmax, argmax, argmaxChecked, argmaxProb, topKMask, topPMask, samplingProbs } from './src/sampling.js';
export { SpecdArgumentError } from './src/validate.js';
export { addonPath } from './src/addon.js';
export {
  kdaRecurrent,
  kdaRecurrentAsync,
  kdaChunked,
  kdaChunkedAsync,
  kdaOutputNorm,
  kdaSlotLengths,
  createKdaStatePools,
  createKdaSnapshots,
  kdaResetSlot,
  kdaCopySlot,
  kdaCommitSnapshot,
  kdaGate,
  type KdaGateBetaLayout,
  type KdaShape,
  type KdaStatePools,
  type KdaInputs,
  type KdaBatch,
  type KdaSnapshots,
  type KdaInitial,
  type KdaKeepBefore,
  type KdaOptions,
  type KdaRecurrentOptions,
  type KdaChunkedOptions,
} from './src/kda.js';
export {
  packMoeExpert,
  createMoeExpertSet,
  moeRoute,
  moeRouter,
  moeExperts,
  moeExpertsAsync,
  type MoeExpertWeights,
  type MoeExpertSet,
  type MoeRouting,
  type MoeRouteOptions,
} from './src/moe.js';
export {
  pagedAttention,
  pagedAttentionAsync,
  writeKvPages,
  writePagedRows,
  copyPages,
  prefetchPages,
  createKvPool,
  kvPageElements,
  makePagedBatch,
  type KvPageLayout,
  type KvLayout,
  type AttentionMask,
  type PagedBatch,
  type PagedSequence,
  type PagedAttentionOptions,
} from './src/attention.js';
export {
  mlaAttention,
  mlaAttentionAsync,
  prepareMlaWeights,
  writeMlaCache,
  createMlaPool,
  mlaRowElements,
  type MlaDims,
  type MlaWeights,
  type MlaAttentionOptions,
} from './src/mla.js';
export type { KernelBackend } from './src/backend.js';
export { cpuBackend } from './src/cpu-backend.js';
export type { PackedBf16Data, PackedQuantData } from './src/addon.js';
export { nixlLoad, type NixlApi, type NixlHandle } from './src/nixl.js';
