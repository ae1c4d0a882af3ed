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
 * This module holds types only: importing it loads no addon.
 */
import type { KvPageLayout, PagedAttentionOptions, PagedBatch } from './attention.js';
import type { GemmActivations, PackedBf16Weights } from './gemm.js';
import type {
  KdaBatch,
  KdaChunkedOptions,
  KdaInputs,
  KdaRecurrentOptions,
  KdaShape,
  KdaSnapshots,
  KdaStatePools,
} from './kda.js';
import type { MlaAttentionOptions, MlaDims, MlaWeights } from './mla.js';
import type { MoeExpertSet, MoeExpertWeights, MoeRouteOptions, MoeRouting } from './moe.js';
import type { RmsNormGate } from './norm.js';
import type { QuantizedWeights, QuantType } from './quant.js';
import type { RopeOptions } from './rope.js';

/** Every kernel a model runs, by family; each member as the exported CPU function of the same name. */
export interface KernelBackend {
  /** Short name of the backend, e.g. `'cpu'`. */
  readonly name: string;

  // ---- Conversion (convert.ts) ----
  /** f32 `[n]` → bf16 bits `[n]`, round to nearest even. */
  f32ToBf16(src: Float32Array, out?: Uint16Array): Uint16Array;
  /** bf16 bits `[n]` → f32 `[n]` (exact). */
  bf16ToF32(src: Uint16Array, out?: Float32Array): Float32Array;

  // ---- Linear layers, bf16 weights (gemm.ts) ----
  /** Packs bf16 W `[n, k]` once at load. */
  packBf16Weights(w: Uint16Array, n: number, k: number): PackedBf16Weights;
  /** `Y[m, n] = X[m, k] · Wᵀ`, f32 in and out. */
  gemmBf16(
    x: Float32Array,
    m: number,
    w: PackedBf16Weights,
    out?: Float32Array,
    activations?: GemmActivations,
  ): Float32Array;
  /** `Y[m, n] ← Y + X[m, k] · Wᵀ` (bit for bit `acc + gemmBf16(x, m, w)`). */
  gemmBf16Accumulate(
    x: Float32Array,
    m: number,
    w: PackedBf16Weights,
    acc: Float32Array,
    activations?: GemmActivations,
  ): Float32Array;
  /** `gemmBf16` off the calling thread. */
  gemmBf16Async(
    x: Float32Array,
    m: number,
    w: PackedBf16Weights,
    out?: Float32Array,
    activations?: GemmActivations,
  ): Promise<Float32Array>;

  // ---- Linear layers, GGUF-quantized weights (quant.ts) ----
  /** Repacks a raw GGUF tensor `[n, k]` once at load. */
  quantizedWeights(data: Uint8Array, type: QuantType, n: number, k: number): QuantizedWeights;
  /** `Y[m, n] = X[m, k] · Wᵀ`, weights dequantized on the fly. */
  gemmQuant(x: Float32Array, m: number, w: QuantizedWeights, out?: Float32Array): Float32Array;
  /** `gemmQuant` off the calling thread. */
  gemmQuantAsync(x: Float32Array, m: number, w: QuantizedWeights, out?: Float32Array): Promise<Float32Array>;
  /** The weights as bf16 bits `[n, k]`. */
  dequantizeToBf16(w: QuantizedWeights, out?: Uint16Array): Uint16Array;

  // ---- Norms, RoPE, activations (norm.ts, rope.ts, activation.ts) ----
  /** RMSNorm of `[rows, dim]` rows, weight `[dim]`. */
  rmsNorm(x: Float32Array, weight: Float32Array, eps: number, out?: Float32Array): Float32Array;
  /** `rmsNorm(x) · weight · act(gate)`, act = sigmoid or silu. */
  gatedRmsNorm(
    x: Float32Array,
    weight: Float32Array,
    gate: Float32Array,
    eps: number,
    gateKind: RmsNormGate,
    out?: Float32Array,
  ): Float32Array;
  /** RMSNorm of each head of `[tokens, heads, headDim]`, weight `[headDim]`, optionally gated. */
  rmsNormPerHead(
    x: Float32Array,
    heads: number,
    weight: Float32Array,
    eps: number,
    gate?: { values: Float32Array; kind: RmsNormGate },
    out?: Float32Array,
  ): Float32Array;
  /** RoPE on `[tokens, heads, headDim]` at absolute positions `[tokens]`. */
  applyRope(x: Float32Array, positions: Int32Array, options: RopeOptions, out?: Float32Array): Float32Array;
  /** `x · sigmoid(x)`, `[n]`. */
  silu(x: Float32Array, out?: Float32Array): Float32Array;
  /** `silu(gate) · up`, `[n]`. */
  swiglu(gate: Float32Array, up: Float32Array, out?: Float32Array): Float32Array;
  /** SwiGLU of fused rows `[rows, 2·inter]` → `[rows, inter]`. */
  swigluFused(gateUp: Float32Array, inter: number, out?: Float32Array): Float32Array;

  // ---- Sampling helpers over logits `[rows, vocab]` (sampling.ts) ----
  /** `softmax(x / temperature)` per row. */
  softmax(x: Float32Array, vocab: number, temperature?: number, out?: Float32Array): Float32Array;
  /** First index of the largest value per row, `[rows]` i32. */
  argmax(x: Float32Array, vocab: number): Int32Array;
  /** Keeps logits >= the k-th largest of the row, the rest −∞. */
  topKMask(logits: Float32Array, vocab: number, k: number, out?: Float32Array): Float32Array;
  /** Keeps the smallest set of tokens whose probability mass reaches p, the rest −∞. */
  topPMask(logits: Float32Array, vocab: number, p: number, out?: Float32Array): Float32Array;

  // ---- Kimi Delta Attention (kda.ts) ----
  /** Zeroed state pools for `numSlots` sequences. */
  createKdaStatePools(shape: KdaShape, numSlots: number): KdaStatePools;
  /** Snapshot buffers for a call of `tokens` rows. */
  createKdaSnapshots(shape: KdaShape, tokens: number): KdaSnapshots;
  /** Zeroes one slot (a new sequence). */
  kdaResetSlot(pools: KdaStatePools, shape: KdaShape, slot: number): void;
  /** Copies slot `from` to slot `to`. */
  kdaCopySlot(pools: KdaStatePools, shape: KdaShape, from: number, to: number): void;
  /** Commits the snapshot of batch row `row` into `slot`. */
  kdaCommitSnapshot(pools: KdaStatePools, shape: KdaShape, slot: number, snapshots: KdaSnapshots, row: number): void;
  /** Recurrent KDA over a batch of sequences → o `[T, heads, headDim]` f32. */
  kdaRecurrent(
    inputs: KdaInputs,
    batch: KdaBatch,
    pools: KdaStatePools,
    shape: KdaShape,
    options?: KdaRecurrentOptions,
  ): Float32Array;
  /** `kdaRecurrent` off the calling thread. */
  kdaRecurrentAsync(
    inputs: KdaInputs,
    batch: KdaBatch,
    pools: KdaStatePools,
    shape: KdaShape,
    options?: KdaRecurrentOptions,
  ): Promise<Float32Array>;
  /** Chunked (WY form) KDA for long prefill → o `[T, heads, headDim]` f32. */
  kdaChunked(
    inputs: KdaInputs,
    batch: KdaBatch,
    pools: KdaStatePools,
    shape: KdaShape,
    options?: KdaChunkedOptions,
  ): Float32Array;
  /** `kdaChunked` off the calling thread. */
  kdaChunkedAsync(
    inputs: KdaInputs,
    batch: KdaBatch,
    pools: KdaStatePools,
    shape: KdaShape,
    options?: KdaChunkedOptions,
  ): Promise<Float32Array>;
  /** KDA output gate `o_norm(o) · sigmoid(gate)` per head. */
  kdaOutputNorm(
    o: Float32Array,
    shape: KdaShape,
    weight: Float32Array,
    gate: Float32Array,
    eps: number,
    out?: Float32Array,
  ): Float32Array;

  // ---- Mixture of experts (moe.ts) ----
  /** Packs one SwiGLU expert from w1, w3 `[inter, hidden]` and w2 `[hidden, inter]` bf16 bits. */
  packMoeExpert(w1: Uint16Array, w3: Uint16Array, w2: Uint16Array, hidden: number, inter: number): MoeExpertWeights;
  /** Validates a layer's experts (and shared expert) once. */
  createMoeExpertSet(experts: readonly MoeExpertWeights[], shared?: MoeExpertWeights): MoeExpertSet;
  /** Sigmoid top-k routing from router logits `[n, numExperts]`. */
  moeRoute(
    logits: Float32Array,
    n: number,
    numExperts: number,
    topK: number,
    routedScalingFactor: number,
    options?: MoeRouteOptions,
  ): MoeRouting;
  /** Router from hidden states `[n, hidden]`: logits, then `moeRoute`. */
  moeRouter(
    x: Float32Array,
    n: number,
    gate: PackedBf16Weights,
    topK: number,
    routedScalingFactor: number,
    options?: MoeRouteOptions,
  ): MoeRouting & { logits: Float32Array };
  /** Routed experts + shared expert for n tokens → `[n, hidden]` f32. */
  moeExperts(x: Float32Array, n: number, experts: MoeExpertSet, routing: MoeRouting, out?: Float32Array): Float32Array;
  /** `moeExperts` off the calling thread. */
  moeExpertsAsync(
    x: Float32Array,
    n: number,
    experts: MoeExpertSet,
    routing: MoeRouting,
    out?: Float32Array,
  ): Promise<Float32Array>;

  // ---- Paged attention (attention.ts) ----
  /** A zero-filled K (or V) pool of one layer. */
  createKvPool(layout: KvPageLayout): Float32Array;
  /** Writes this step's K and V rows `[numTokens, numKvHeads, headDim]` into the pools. */
  writeKvPages(
    layout: KvPageLayout,
    k: Float32Array,
    v: Float32Array,
    kPool: Float32Array,
    vPool: Float32Array,
    slotMapping: Int32Array,
  ): void;
  /** Low-level page write: pool row `slots[t]` gets src row t at columns [colOffset, colOffset + cols). */
  writePagedRows(
    src: Float32Array,
    cols: number,
    pool: Float32Array,
    pageSize: number,
    rowElements: number,
    colOffset: number,
    slots: Int32Array,
  ): void;
  /** Copies whole pages: `dst` page `dstPages[i]` = `src` page `srcPages[i]`. */
  copyPages(
    src: Float32Array,
    dst: Float32Array,
    pageElements: number,
    srcPages: Int32Array,
    dstPages: Int32Array,
  ): void;
  /** Paged GQA attention → `[totalQ, numHeads, headDim]` f32. */
  pagedAttention(
    q: Float32Array,
    kPool: Float32Array,
    vPool: Float32Array,
    layout: KvPageLayout,
    batch: PagedBatch,
    options: PagedAttentionOptions,
    out?: Float32Array,
  ): Float32Array;
  /** `pagedAttention` off the calling thread. */
  pagedAttentionAsync(
    q: Float32Array,
    kPool: Float32Array,
    vPool: Float32Array,
    layout: KvPageLayout,
    batch: PagedBatch,
    options: PagedAttentionOptions,
    out?: Float32Array,
  ): Promise<Float32Array>;

  // ---- Multi-head latent attention (mla.ts) ----
  /** Splits kv_b_proj `[H·(nope+v), r]` into the absorption weights, once at load. */
  prepareMlaWeights(kvBProj: Float32Array | Uint16Array, dims: MlaDims): MlaWeights;
  /** A zero-filled latent pool `[numPages, pageSize, r + rope]` f32. */
  createMlaPool(numPages: number, pageSize: number, dims: MlaDims): Float32Array;
  /** Writes this step's latent rows `[latent | kPe]` into the pool. */
  writeMlaCache(
    latent: Float32Array,
    kPe: Float32Array,
    pool: Float32Array,
    pageSize: number,
    dims: MlaDims,
    slots: Int32Array,
  ): void;
  /** Absorbed MLA attention → `[totalQ, H, v]` f32 (before o_proj). */
  mlaAttention(
    q: Float32Array,
    pool: Float32Array,
    pageSize: number,
    weights: MlaWeights,
    batch: PagedBatch,
    options: MlaAttentionOptions,
    out?: Float32Array,
  ): Float32Array;
  /** `mlaAttention` off the calling thread. */
  mlaAttentionAsync(
    q: Float32Array,
    pool: Float32Array,
    pageSize: number,
    weights: MlaWeights,
    batch: PagedBatch,
    options: MlaAttentionOptions,
    out?: Float32Array,
  ): Promise<Float32Array>;
}
