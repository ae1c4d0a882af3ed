/**
 * The raw addon, typed once: every function `build/Release/specd_native.node` exports (argument
 * order as documented in the header of each family's native/src/*.cc), and the branded buffers
 * that only the addon writes. This is the only module that loads the `.node` file; the family
 * modules (gemm.ts, kda.ts, …) validate arguments and call `addon`, and `native/index.ts`
 * re-exports their typed wrappers. Nothing outside this package sees the raw addon.
 *
 * @throws Error with code `ERR_SPECD_NATIVE_MISSING` when the addon has not been built, telling
 *   how to build it; the addon's own load error (e.g. a malformed `SPECD_ISA` or
 *   `SPECD_NUM_THREADS`, code `ERR_SPECD_INIT`) is rethrown unchanged.
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

// ---- Branded buffers (node-llama-cpp style: a plain type plus a brand no other value carries) ----

/**
 * bf16 weights `[n, k]` in the packed panel layout (native/src/gemm_kernels.h), written by
 * `packBf16`: `packedBf16Length(n, k)` elements. Only the addon's GEMMs read it.
 */
export type PackedBf16Data = Uint16Array & { readonly __brand: 'PackedBf16' };

/**
 * GGUF-quantized weights `[n, k]` in the packed panel layout (native/src/quant_kernels.h), written
 * by `quantPack`: `quantPackedBytes(type, n, k)` bytes. Only `gemmQuant` and `quantDequantBf16`
 * read it.
 */
export type PackedQuantData = Uint8Array & { readonly __brand: 'PackedQuant' };

/** GGUF block type as the addon names it. */
export type RawQuantType = 'q4_0' | 'q4_1' | 'q8_0';

/** Activation precision of the bf16 GEMM. */
export type RawGemmActivations = 'f32' | 'bf16' | 'bf16x2';

/** Which keys a query sees in the attention kernels. */
export type RawAttentionMask = 'causal' | 'non-causal';

// ---- Argument lists shared by a function and its Async twin ----

/** gemmBf16(x [m·k], m, k, packed, n, y [m·n], activations, accumulate?) (native/src/gemm.cc). */
export type GemmBf16RawArgs = [
  x: Float32Array,
  m: number,
  k: number,
  packed: PackedBf16Data,
  n: number,
  y: Float32Array,
  activations: RawGemmActivations,
];

/** gemmQuant(x [m·k], m, k, packed, type, n, y [m·n], act?) (native/src/quant.cc). */
export type GemmQuantRawArgs = [
  x: Float32Array,
  m: number,
  k: number,
  packed: PackedQuantData,
  type: RawQuantType,
  n: number,
  y: Float32Array,
  act?: 'f32' | 'int8' | 'int16',
];

/** kdaForward(…) (native/src/kda.cc); snapshots only in the recurrent mode. */
export type KdaRawArgs = [
  qkv: Float32Array,
  g: Float32Array,
  beta: Float32Array,
  convWeight: Float32Array,
  seqLens: Int32Array,
  slots: Int32Array,
  statePool: Float32Array,
  convPool: Float32Array,
  heads: number,
  headDim: number,
  out: Float32Array,
  mode: 'recurrent' | 'chunked',
  chunk: number,
  snapState: Float32Array | null,
  snapConv: Float32Array | null,
  scale: number,
  initState: Float32Array | null,
  initConv: Float32Array | null,
  initRows: Int32Array | null,
  keepState: Float32Array | null,
  keepConv: Float32Array | null,
  keepRows: Int32Array | null,
];

/** moeExperts(…) (native/src/moe.cc); one packed array per routed expert. */
export type MoeExpertsRawArgs = [
  x: Float32Array,
  n: number,
  hidden: number,
  ids: Int32Array,
  weights: Float32Array,
  topK: number,
  inter: number,
  w13: readonly PackedBf16Data[],
  w2: readonly PackedBf16Data[],
  sharedW13: PackedBf16Data | null,
  sharedW2: PackedBf16Data | null,
  sharedInter: number,
  out: Float32Array,
];

/** pagedAttention(…) (native/src/attention.cc); headMajor 1 = HND pages, 0 = NHD. */
export type PagedAttentionRawArgs = [
  q: Float32Array,
  kPool: Float32Array,
  vPool: Float32Array,
  out: Float32Array,
  numPages: number,
  pageSize: number,
  numKvHeads: number,
  headDim: number,
  numHeads: number,
  scale: number,
  cuSeqlensQ: Int32Array,
  kvLens: Int32Array,
  blockTables: Int32Array,
  maxBlocksPerSeq: number,
  positions: Int32Array,
  mask: RawAttentionMask,
  window: number,
  headMajor: 0 | 1,
];

/** mlaAttention(…) (native/src/mla.cc). */
export type MlaAttentionRawArgs = [
  q: Float32Array,
  pool: Float32Array,
  wUk: Float32Array,
  wUvT: Float32Array,
  out: Float32Array,
  numPages: number,
  pageSize: number,
  numHeads: number,
  nope: number,
  rope: number,
  v: number,
  r: number,
  scale: number,
  cuSeqlensQ: Int32Array,
  kvLens: Int32Array,
  blockTables: Int32Array,
  maxBlocksPerSeq: number,
  positions: Int32Array,
  mask: RawAttentionMask,
  window: number,
];

/**
 * Every function of the addon. Sync functions return when done; `…Async` ones run on a libuv
 * thread and resolve when done (the memory of their arguments is used in place). Bad arguments
 * throw TypeError/RangeError with code `ERR_SPECD_INVALID_ARG`; kernel failures code
 * `ERR_SPECD_KERNEL` (native/src/common.h).
 */
export interface RawAddon {
  // runtime.cc
  isa(): {
    isa: 'avx512' | 'portable';
    avx512Available: boolean;
    amxAvailable: boolean;
    threads: number;
    parallelMinWork: number;
  };
  setIsa(name: 'auto' | 'avx512' | 'portable'): void;
  setNumThreads(threads: number): void;
  setParallelMinWork(units: number): void;
  parallelCopy(dst: Float32Array, src: Float32Array): void;
  guardedFloat32Array(n: number): Float32Array;
  // convert.cc
  f32ToBf16(src: Float32Array, dst: Uint16Array): void;
  bf16ToF32(src: Uint16Array, dst: Float32Array): void;
  // gemm.cc
  packBf16(w: Uint16Array, n: number, k: number, out: PackedBf16Data): void;
  gemmBf16(...args: [...GemmBf16RawArgs, accumulate?: boolean]): void;
  gemmBf16Async(...args: GemmBf16RawArgs): Promise<void>;
  // quant.cc
  quantPack(src: Uint8Array, type: RawQuantType, n: number, k: number, out: PackedQuantData): void;
  gemmQuant(...args: GemmQuantRawArgs): void;
  gemmQuantAsync(...args: GemmQuantRawArgs): Promise<void>;
  quantDequantBf16(packed: PackedQuantData, type: RawQuantType, n: number, k: number, out: Uint16Array): void;
  // norm.cc
  rmsNorm(
    x: Float32Array,
    weight: Float32Array,
    rows: number,
    dim: number,
    eps: number,
    out: Float32Array,
    gate: Float32Array | null,
    gateKind: 'none' | 'sigmoid' | 'silu',
  ): void;
  // rope.cc
  rope(
    x: Float32Array,
    positions: Int32Array,
    tokens: number,
    heads: number,
    headDim: number,
    rotaryDim: number,
    theta: number,
    style: 'neox' | 'interleaved',
    out: Float32Array,
  ): void;
  // activation.cc
  silu(x: Float32Array, out: Float32Array): void;
  swiglu(gate: Float32Array, up: Float32Array, out: Float32Array): void;
  swigluFused(gateUp: Float32Array, rows: number, inter: number, out: Float32Array): void;
  add(a: Float32Array, b: Float32Array, out: Float32Array): void;
  // sampling.cc
  softmax(x: Float32Array, rows: number, cols: number, temperature: number, out: Float32Array): void;
  argmax(x: Float32Array, rows: number, cols: number, out: Int32Array, checked?: boolean, prob?: Float32Array): void;
  topKMask(logits: Float32Array, rows: number, cols: number, k: number, out: Float32Array): void;
  topPMask(logits: Float32Array, rows: number, cols: number, p: number, out: Float32Array): void;
  samplingProbs(
    logits: Float32Array,
    rows: number,
    cols: number,
    temperature: number,
    topK: number,
    topP: number,
    out: Float32Array,
    support?: Int32Array,
    counts?: Int32Array,
  ): void;
  // kda.cc
  kdaForward(...args: KdaRawArgs): void;
  kdaForwardAsync(...args: KdaRawArgs): Promise<void>;
  kdaGate(
    f: Float32Array,
    dtBias: Float32Array,
    negA: Float32Array,
    b: Float32Array,
    bOffset: number,
    bStride: number,
    tokens: number,
    heads: number,
    headDim: number,
    g: Float32Array,
    beta: Float32Array,
  ): void;
  // moe.cc
  moeRoute(
    logits: Float32Array,
    n: number,
    numExperts: number,
    bias: Float32Array | null,
    topK: number,
    factor: number,
    renormalize: boolean,
    ids: Int32Array,
    weights: Float32Array,
    scores: Float32Array | null,
  ): void;
  moeExperts(...args: MoeExpertsRawArgs): void;
  moeExpertsAsync(...args: MoeExpertsRawArgs): Promise<void>;
  // attention.cc
  pagedAttention(...args: PagedAttentionRawArgs): void;
  pagedAttentionAsync(...args: PagedAttentionRawArgs): Promise<void>;
  /** Pool row `slots[t]` gets src row t, columns [colOffset, colOffset + cols); pages `[heads, pageSize, row]`. */
  writePagedRows(
    src: Float32Array,
    tokens: number,
    cols: number,
    pool: Float32Array,
    numPages: number,
    pageSize: number,
    rowElements: number,
    colOffset: number,
    slots: Int32Array,
    heads?: number,
  ): void;
  copyPages(
    src: Float32Array,
    dst: Float32Array,
    pageElements: number,
    srcPages: Int32Array,
    dstPages: Int32Array,
  ): void;
  prefetchPages(pool: Float32Array, pageElements: number, pages: Int32Array, pool2?: Float32Array): void;
  // mla.cc
  mlaAttention(...args: MlaAttentionRawArgs): void;
  mlaAttentionAsync(...args: MlaAttentionRawArgs): Promise<void>;
  // nixl.cc (handles are opaque)
  nixlLoad(capiPath: string): void;
  /** progressDelayUs 0: no NIXL progress thread. */
  nixlCreateAgent(name: string, progressDelayUs: number): NixlHandle;
  nixlCreateBackend(agent: NixlHandle, plugin: string): NixlHandle;
  nixlAddress(bytes: Uint8Array): number;
  nixlRegister(agent: NixlHandle, backend: NixlHandle, bytes: Uint8Array): number;
  nixlDeregister(agent: NixlHandle, backend: NixlHandle, addr: number, length: number): void;
  nixlLocalMetadata(agent: NixlHandle): Buffer;
  nixlLoadRemoteMetadata(agent: NixlHandle, md: Uint8Array): string;
  nixlInvalidateRemote(agent: NixlHandle, name: string): void;
  nixlPostWrite(
    agent: NixlHandle,
    backend: NixlHandle,
    remote: string,
    local: Float64Array,
    remoteDescs: Float64Array,
    notif: Uint8Array,
  ): NixlHandle;
  nixlXferStatus(agent: NixlHandle, xfer: NixlHandle): number;
  nixlReleaseXfer(agent: NixlHandle, xfer: NixlHandle): void;
  nixlGetNotifs(agent: NixlHandle): [string, Buffer][];
  nixlDestroyBackend(backend: NixlHandle): void;
  nixlDestroyAgent(agent: NixlHandle): void;
}

/** An opaque NIXL C API handle (agent, backend or transfer request) held by the addon (native/src/nixl.cc). */
export type NixlHandle = { readonly __brand: 'NixlHandle' };

/** Absolute path of the addon this package loads. */
export const addonPath: string = fileURLToPath(new URL('../../build/Release/specd_native.node', import.meta.url));

function load(): RawAddon {
  if (!existsSync(addonPath)) {
    const error = new Error(
      `@specd/native: native addon not found at ${addonPath}. Build it from the repository root with ` +
        '`npm run build:native` (cmake >= 3.15 and a C++17 compiler; no network needed), or `npm run build`.',
    );
    (error as Error & { code: string }).code = 'ERR_SPECD_NATIVE_MISSING';
    throw error;
  }
  const require = createRequire(import.meta.url);
  return require(addonPath) as RawAddon;
}

/** The loaded addon (loaded once, when this module is first imported). */
export const addon: RawAddon = load();
