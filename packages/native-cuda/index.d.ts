// Types of @specd/native-cuda (index.js; the addon's functions in src/binding.cc, src/llama_runner.cc and
// src/eagle3_runner.cc).

/** A device object owned by the addon (a buffer or a runner): opaque to JavaScript. */
export type DeviceHandle = { readonly __device: unique symbol };

/** The device the addon found. */
export interface CudaDeviceInfo {
  readonly name: string;
  readonly computeCapability: string;
  readonly totalBytes: number;
  readonly freeBytes: number;
}

/** Options of {@link CudaAddon.llamaCreate}. */
export interface LlamaRunnerOptions {
  readonly numLayers: number;
  readonly hiddenSize: number;
  readonly intermediateSize: number;
  readonly numHeads: number;
  readonly numKvHeads: number;
  readonly headDim: number;
  readonly vocabSize: number;
  readonly ropeTheta: number;
  readonly rmsNormEps: number;
  /** RoPE pairs (i, i + headDim/2) (true) or (2i, 2i + 1) (false). */
  readonly neox: boolean;
  readonly tiedEmbeddings: boolean;
  /** Rows of the largest forward. */
  readonly maxTokens: number;
}

/** What {@link CudaAddon.llamaForward} returns. */
export interface LlamaRunnerResult {
  /** The argmax of each logit row `[R]` i32 (−1: the row is not finite). */
  readonly tokens: Int32Array;
  /** Residual stream after the last layer `[T, hiddenSize]` f32. */
  readonly hidden: Float32Array;
  /** Taps in the order asked, each `[T, hiddenSize]` f32. */
  readonly taps: Float32Array[];
  /** `[R, vocabSize]` f32 when asked for. */
  readonly logits: Float32Array | undefined;
}

/** What {@link CudaAddon.llamaInfo} returns. */
export interface LlamaRunnerInfo {
  readonly weightBytes: number;
  readonly kvBytes: number;
  readonly activationBytes: number;
  readonly maxBlocks: number;
  /** Captured CUDA graphs (`"16 rows"`, `"16 rows + taps"`). */
  readonly graphs: string[];
  /**
   * Host time of the forwards so far, µs, cumulative: argument checks and result arrays, metadata + graph launch,
   * result copies + the wait for the stream (the GPU's time once the host is ahead), staged results into the arrays.
   */
  readonly hostUs: {
    readonly forwards: number;
    readonly checkUs: number;
    readonly launchUs: number;
    readonly waitUs: number;
    readonly copyUs: number;
  };
}

/** Options of {@link CudaAddon.eagle3Create} (the EAGLE-3 draft model's sizes; src/eagle3_runner.cc). */
export interface Eagle3RunnerOptions {
  readonly hiddenSize: number;
  readonly numHeads: number;
  readonly numKvHeads: number;
  /** A multiple of 16, at most 256 (the paged attention kernel's). */
  readonly headDim: number;
  readonly intermediateSize: number;
  /** The target's vocabulary (rows of the embedding; the range of d2t). */
  readonly vocabSize: number;
  /** Rows of the draft lm_head. */
  readonly draftVocabSize: number;
  /** Target taps fc reads (fc is `[hiddenSize, numTaps · hiddenSize]`). */
  readonly numTaps: number;
  readonly ropeTheta: number;
  readonly rmsNormEps: number;
  /** The draft layer's residual is hidden_norm(g) (true) or g (false). */
  readonly normBeforeResidual: boolean;
  /** Sequences at once, at most (g slots, chain rows). */
  readonly maxSequences: number;
  /** Chain steps at most. */
  readonly maxDraftTokens: number;
}

/** Options of {@link CudaAddon.dflashCreate} (the DFlash draft model's sizes; src/dflash_runner.cc). */
export interface DFlashRunnerOptions {
  readonly hiddenSize: number;
  readonly numHeads: number;
  readonly numKvHeads: number;
  /** A multiple of 16, at most 256 (the paged attention kernel's). */
  readonly headDim: number;
  readonly intermediateSize: number;
  readonly numLayers: number;
  /** The target's vocabulary (rows of the embedding; the range of the draft head's ids). */
  readonly vocabSize: number;
  /** Rows of the draft head (the target lm_head's rows of the draft vocabulary). */
  readonly draftVocabSize: number;
  /** Target taps fc reads (fc is `[hiddenSize, numTaps · hiddenSize]`). */
  readonly numTaps: number;
  /** Rows of a draft block (B: the last verified token and B − 1 masks). */
  readonly blockSize: number;
  readonly maskTokenId: number;
  readonly ropeTheta: number;
  readonly rmsNormEps: number;
  /** Sequences of one block call, at most. */
  readonly maxSequences: number;
}

/** What {@link CudaAddon.dflashBlock} returns. */
export interface DFlashBlockResult {
  /** The greedy draft of slots 1 … B − 1 of each block as token ids `[S · (B − 1)]` i32 (−1: not finite). */
  readonly ids: Int32Array;
  /** The draft-head logits `[S · (B − 1), draftVocabSize]` f32, when asked for. */
  readonly logits?: Float32Array;
}

/** What {@link CudaAddon.eagle3Step} returns. */
export interface Eagle3StepResult {
  /** The argmax of each row's draft-vocabulary logits `[S]` i32 (−1: not finite). */
  readonly argmax: Int32Array;
  /** Draft-vocabulary logits `[S, draftVocabSize]` f32. */
  readonly logits: Float32Array;
}

/** What {@link CudaAddon.eagle3Info} returns. */
export interface Eagle3RunnerInfo {
  readonly weightBytes: number;
  readonly kvBytes: number;
  readonly activationBytes: number;
  /** Block-table entries per sequence of eagle3Chain / eagle3Step. */
  readonly maxBlocks: number;
  /** Captured chain graphs (`"16 rows x 6 steps"`). */
  readonly graphs: string[];
}

/**
 * A sampling request (src/sampler.h, src/sampling.cu): G groups (sequences), each over its logit rows row0 … row0 + k
 * (its k drafts' verify rows).
 */
export interface SampleRequest {
  /** `[G · 4]` i32: row0, k, the first row of its q in `q` (−1: point masses), top-k (0: off). */
  readonly groups: Int32Array;
  /** `[G]`, each finite and > 0. */
  readonly temperature: Float64Array;
  /** `[G]`, each in (0, 1]. */
  readonly topP: Float64Array;
  /** `[Σ k]` i32 in group order. */
  readonly drafts: Int32Array;
  /** `[Σ (k + 1)]` draws in [0, 1) in group order: k for the drafts, the last for the token drawn. */
  readonly uniforms: Float64Array;
  /** The drafters' probabilities `[qRows, vocab]` f32; absent when every group's q row is −1. */
  readonly q?: Float32Array;
  /**
   * Instead of q: the device address of `[qRows, vocab]` f32 rows another runner of this addon lends (a GPU
   * drafter's q: dflashSample's qAddress), read in place.
   */
  readonly qAddress?: bigint;
  /** Rows at qAddress. */
  readonly qRows?: number;
}

/** The addon (see src/binding.cc and src/llama_runner.cc for each function's contract). */
export interface CudaAddon {
  readonly info: CudaDeviceInfo;
  deviceInfo(): CudaDeviceInfo;
  synchronize(): void;
  llamaCreate(options: LlamaRunnerOptions): DeviceHandle;
  llamaAllocKv(runner: DeviceHandle, pageSize: number, numPages: number, maxModelLen: number): void;
  llamaSetWeight(runner: DeviceHandle, name: string, layer: number, data: Uint16Array | Float32Array): void;
  llamaForward(
    runner: DeviceHandle,
    ids: Int32Array,
    positions: Int32Array,
    slots: Int32Array,
    cuSeqlensQ: Int32Array,
    kvLens: Int32Array,
    blockTables: Int32Array,
    logitRows: Int32Array,
    taps: Int32Array,
    wantLogits: boolean,
    useGraph: boolean,
  ): LlamaRunnerResult;
  llamaLmHead(runner: DeviceHandle, x: Float32Array, rows: number): Float32Array;
  /**
   * Sampling and rejection acceptance over the last llamaForward's logit rows, on the device: `[G · 2]` i32, per
   * group the accepted drafts and the token drawn (−1: a row it used is not finite).
   */
  llamaSample(runner: DeviceHandle, request: SampleRequest): Int32Array;
  llamaInfo(runner: DeviceHandle): LlamaRunnerInfo;
  /** GPU ms per replay of the last forward's CUDA graph (−1 when it ran without one). */
  llamaReplayMs(runner: DeviceHandle, reps: number): number;
  /**
   * Launch choices for later forwards (drops the captured graphs): `smallGemm` — batches of ≤ 32 rows use the small
   * row-invariant GEMM with RMSNorm / SwiGLU fused (default true); `pdl` — programmatic dependent launch on sm_90+
   * (default true, process wide).
   */
  llamaSetOptions(runner: DeviceHandle, options: { smallGemm?: boolean; pdl?: boolean }): void;
  /**
   * GPU µs of each launch of layer 0 and of the head at the last forward's batch shape (each replayed as a graph of
   * `reps` copies). Overwrites activations and that batch's KV slots: benches only, at the end of a run.
   */
  llamaProfile(runner: DeviceHandle, reps: number): { name: string; us: number }[];
  llamaDispose(runner: DeviceHandle): void;
  // the EAGLE-3 draft runner (src/eagle3_runner.cc: each function's contract there)
  eagle3Create(options: Eagle3RunnerOptions): DeviceHandle;
  eagle3AllocKv(runner: DeviceHandle, pageSize: number, numPages: number, maxModelLen: number): void;
  eagle3SetWeight(runner: DeviceHandle, name: string, data: Uint16Array | Float32Array | Int32Array): void;
  eagle3ContextWrite(
    runner: DeviceHandle,
    rows: Float32Array,
    fromTaps: boolean,
    nextTokens: Int32Array,
    positions: Int32Array,
    slots: Int32Array,
    gSlotOfRow: Int32Array,
  ): void;
  eagle3Chain(
    runner: DeviceHandle,
    gSlots: Int32Array,
    tokens: Int32Array,
    positions: Int32Array,
    blockTables: Int32Array,
    stepSlots: Int32Array,
    lengths: Int32Array,
    k: number,
    useGraph: boolean,
  ): Int32Array;
  eagle3Step(
    runner: DeviceHandle,
    j: number,
    gSlots: Int32Array,
    tokens: Int32Array,
    positions: Int32Array,
    blockTables: Int32Array,
    stepSlots: Int32Array,
    lengths: Int32Array,
  ): Eagle3StepResult;
  eagle3Synchronize(runner: DeviceHandle): void;
  /**
   * GPU ms per replay of the last chain's CUDA graph (−1 when it ran without one); with `k`, of the captured chain of k
   * steps over `sequences` (default 1) instead, replayed over the last chain's metadata (benches, after the run).
   */
  eagle3ReplayMs(runner: DeviceHandle, reps: number, k?: number, sequences?: number): number;
  eagle3Info(runner: DeviceHandle): Eagle3RunnerInfo;
  eagle3Dispose(runner: DeviceHandle): void;
  // the DFlash draft runner (src/dflash_runner.cc: each function's contract there)
  dflashCreate(options: DFlashRunnerOptions): DeviceHandle;
  dflashAllocKv(runner: DeviceHandle, pageSize: number, numPages: number, maxModelLen: number): void;
  dflashSetWeight(
    runner: DeviceHandle,
    name: string,
    layer: number,
    data: Uint16Array | Float32Array | Int32Array,
  ): void;
  dflashContextWrite(
    runner: DeviceHandle,
    rows: Float32Array,
    fromTaps: boolean,
    positions: Int32Array,
    slots: Int32Array,
  ): void;
  dflashBlock(
    runner: DeviceHandle,
    tokens: Int32Array,
    positions: Int32Array,
    blockTables: Int32Array,
    slots: Int32Array,
    useGraph: boolean,
    wantLogits: boolean,
  ): DFlashBlockResult;
  /**
   * Sampled drafts over the last block's head rows (`request` as llamaSample's, one row per group, no drafts): q stays
   * at qAddress (lent to llamaSample) and comes back as `probs` only with `copyProbs`.
   */
  dflashSample(
    runner: DeviceHandle,
    request: SampleRequest,
    copyProbs: boolean,
  ): { readonly results: Int32Array; readonly qAddress: bigint; readonly probs?: Float32Array };
  /** Rows [row, row + rows) of the last dflashSample's q, `[rows, vocab]` f32 (copied back). */
  dflashProbs(runner: DeviceHandle, row: number, rows: number): Float32Array;
  dflashSynchronize(runner: DeviceHandle): void;
  /** GPU ms per replay of the last block's CUDA graph (−1 when it ran without one). */
  dflashReplayMs(runner: DeviceHandle, reps: number): number;
  /** Sizes and the captured graphs (the Eagle3RunnerInfo fields). */
  dflashInfo(runner: DeviceHandle): Eagle3RunnerInfo;
  dflashDispose(runner: DeviceHandle): void;
  // the single kernels (src/binding.cc): alloc, free, upload, download, gemmBf16, rmsNorm, … (GPU tests)
  readonly [kernel: string]: unknown;
}

/** Where the addon is built. */
export const addonPath: string;

/**
 * The CUDA addon, checked to see a device.
 * @throws {Error} one message saying what is missing: the addon not built (how to build it), or no usable device.
 */
export function loadCuda(): CudaAddon;
