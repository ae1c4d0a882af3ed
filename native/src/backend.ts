/**
 * The kernel surface as an interface: what a model, a drafter or the KV cache may call, whatever
 * runs it. `cpuBackend` (cpu-backend.ts, the C++ addon) implements it; a second backend (e.g. a
 * CUDA package) implements the same members with the same contracts: shapes, dtypes, batch
 * invariance and errors as documented on the CPU function of the same name, which is also exported
 * on its own (`gemmBf16`, `pagedAttention`, …) for callers that need no other backend.
 *
 * Weight handles (`PackedBf16Weights`, `QuantizedWeights`, `MoeExpertSet`, `MlaWeights`) and state
 * buffers (KV pools, KDA pools) are made by the backend that uses them (`packBf16Weights`,
 * `createKvPool`, …) and are passed back only to it. Left out, as they belong to no backend: the
 * geometry helpers (`packedBf16Length`, `quantRawBytes`, `quantPackedBytes`, `kdaSlotLengths`,
 * `kvPageElements`, `mlaRowElements`, `makePagedBatch`) and the CPU runtime controls (`isa`,
 * `setIsa`, `setNumThreads`, `parallelCopy`, `guardedFloat32Array`).
 *
 * Each member's type is the CPU function's own (`typeof gemmBf16`), so the interface cannot drift from
 * the functions whose doc comments define the contracts. This module holds types only: importing it
 * loads no addon.
 */
import type * as activation from './activation.js';
import type * as attention from './attention.js';
import type * as convert from './convert.js';
import type * as gemm from './gemm.js';
import type * as kda from './kda.js';
import type * as mla from './mla.js';
import type * as moe from './moe.js';
import type * as norm from './norm.js';
import type * as quant from './quant.js';
import type * as rope from './rope.js';
import type * as sampling from './sampling.js';

/** Every kernel a model runs, by family; each member typed as the exported CPU function of the same name. */
export interface KernelBackend {
  /** Short name of the backend, e.g. `'cpu'`. */
  readonly name: string;

  // ---- Conversion (convert.ts) ----
  readonly f32ToBf16: typeof convert.f32ToBf16;
  readonly bf16ToF32: typeof convert.bf16ToF32;

  // ---- Linear layers, bf16 weights (gemm.ts) ----
  readonly packBf16Weights: typeof gemm.packBf16Weights;
  readonly gemmBf16: typeof gemm.gemmBf16;
  readonly gemmBf16Accumulate: typeof gemm.gemmBf16Accumulate;
  readonly gemmBf16Async: typeof gemm.gemmBf16Async;

  // ---- Linear layers, GGUF block-quantized weights (quant.ts) ----
  readonly quantizedWeights: typeof quant.quantizedWeights;
  readonly gemmQuant: typeof quant.gemmQuant;
  readonly gemmQuantAsync: typeof quant.gemmQuantAsync;
  readonly dequantizeToBf16: typeof quant.dequantizeToBf16;

  // ---- Norms (norm.ts) ----
  readonly rmsNorm: typeof norm.rmsNorm;
  readonly gatedRmsNorm: typeof norm.gatedRmsNorm;
  readonly rmsNormPerHead: typeof norm.rmsNormPerHead;

  // ---- Rotary embeddings (rope.ts) ----
  readonly applyRope: typeof rope.applyRope;

  // ---- Activations (activation.ts) ----
  readonly silu: typeof activation.silu;
  readonly swiglu: typeof activation.swiglu;
  readonly swigluFused: typeof activation.swigluFused;

  // ---- Sampling (sampling.ts) ----
  readonly softmax: typeof sampling.softmax;
  readonly argmax: typeof sampling.argmax;
  readonly topKMask: typeof sampling.topKMask;
  readonly topPMask: typeof sampling.topPMask;

  // ---- KDA linear attention (kda.ts) ----
  readonly createKdaStatePools: typeof kda.createKdaStatePools;
  readonly createKdaSnapshots: typeof kda.createKdaSnapshots;
  readonly kdaResetSlot: typeof kda.kdaResetSlot;
  readonly kdaCopySlot: typeof kda.kdaCopySlot;
  readonly kdaCommitSnapshot: typeof kda.kdaCommitSnapshot;
  readonly kdaGate: typeof kda.kdaGate;
  readonly kdaRecurrent: typeof kda.kdaRecurrent;
  readonly kdaRecurrentAsync: typeof kda.kdaRecurrentAsync;
  readonly kdaChunked: typeof kda.kdaChunked;
  readonly kdaChunkedAsync: typeof kda.kdaChunkedAsync;
  readonly kdaOutputNorm: typeof kda.kdaOutputNorm;

  // ---- Mixture of experts (moe.ts) ----
  readonly packMoeExpert: typeof moe.packMoeExpert;
  readonly createMoeExpertSet: typeof moe.createMoeExpertSet;
  readonly moeRoute: typeof moe.moeRoute;
  readonly moeRouter: typeof moe.moeRouter;
  readonly moeExperts: typeof moe.moeExperts;
  readonly moeExpertsAsync: typeof moe.moeExpertsAsync;

  // ---- Paged KV cache and attention (attention.ts) ----
  readonly createKvPool: typeof attention.createKvPool;
  readonly writeKvPages: typeof attention.writeKvPages;
  readonly writePagedRows: typeof attention.writePagedRows;
  readonly copyPages: typeof attention.copyPages;
  readonly pagedAttention: typeof attention.pagedAttention;
  readonly pagedAttentionAsync: typeof attention.pagedAttentionAsync;

  // ---- Multi-head latent attention (mla.ts) ----
  readonly prepareMlaWeights: typeof mla.prepareMlaWeights;
  readonly createMlaPool: typeof mla.createMlaPool;
  readonly writeMlaCache: typeof mla.writeMlaCache;
  readonly mlaAttention: typeof mla.mlaAttention;
  readonly mlaAttentionAsync: typeof mla.mlaAttentionAsync;
}
