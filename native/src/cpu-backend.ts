/**
 * The CPU backend: the C++ addon's kernels (through the validating wrappers of each family module)
 * gathered as one {@link KernelBackend}. The members are the very functions `@specd/native` exports,
 * so `cpuBackend.gemmBf16(…)` and `gemmBf16(…)` are the same call.
 */
import { bf16ToF32, f32ToBf16 } from './convert.js';
import { swiglu, swigluFused, silu } from './activation.js';
import {
  copyPages,
  createKvPool,
  pagedAttention,
  pagedAttentionAsync,
  writeKvPages,
  writePagedRows,
} from './attention.js';
import type { KernelBackend } from './backend.js';
import { gemmBf16, gemmBf16Accumulate, gemmBf16Async, packBf16Weights } from './gemm.js';
import {
  createKdaSnapshots,
  createKdaStatePools,
  kdaChunked,
  kdaChunkedAsync,
  kdaCommitSnapshot,
  kdaCopySlot,
  kdaGate,
  kdaOutputNorm,
  kdaRecurrent,
  kdaRecurrentAsync,
  kdaResetSlot,
} from './kda.js';
import { createMlaPool, mlaAttention, mlaAttentionAsync, prepareMlaWeights, writeMlaCache } from './mla.js';
import { createMoeExpertSet, moeExperts, moeExpertsAsync, moeRoute, moeRouter, packMoeExpert } from './moe.js';
import { gatedRmsNorm, rmsNorm, rmsNormPerHead } from './norm.js';
import { dequantizeToBf16, gemmQuant, gemmQuantAsync, quantizedWeights } from './quant.js';
import { applyRope } from './rope.js';
import { argmax, softmax, topKMask, topPMask } from './sampling.js';

/** The kernels of this package's C++ addon (ISA path and threads: `isa()`, `setIsa`, `setNumThreads`). */
export const cpuBackend: KernelBackend = Object.freeze({
  name: 'cpu',
  f32ToBf16,
  bf16ToF32,
  packBf16Weights,
  gemmBf16,
  gemmBf16Accumulate,
  gemmBf16Async,
  quantizedWeights,
  gemmQuant,
  gemmQuantAsync,
  dequantizeToBf16,
  rmsNorm,
  gatedRmsNorm,
  rmsNormPerHead,
  applyRope,
  silu,
  swiglu,
  swigluFused,
  softmax,
  argmax,
  topKMask,
  topPMask,
  createKdaStatePools,
  createKdaSnapshots,
  kdaResetSlot,
  kdaCopySlot,
  kdaCommitSnapshot,
  kdaGate,
  kdaRecurrent,
  kdaRecurrentAsync,
  kdaChunked,
  kdaChunkedAsync,
  kdaOutputNorm,
  packMoeExpert,
  createMoeExpertSet,
  moeRoute,
  moeRouter,
  moeExperts,
  moeExpertsAsync,
  createKvPool,
  writeKvPages,
  writePagedRows,
  copyPages,
  pagedAttention,
  pagedAttentionAsync,
  prepareMlaWeights,
  createMlaPool,
  writeMlaCache,
  mlaAttention,
  mlaAttentionAsync,
});
