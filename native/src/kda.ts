/**
 * Kimi Delta Attention (KDA) core with fp32 state (REFERENCE.md §7; numerics oracle
 * tools/reference/specd_ref/kimi.py `KDAAttention`, `kda_recurrent`, `kda_chunked`).
 *
 * What runs here, per sequence and head, after the projections (done elsewhere with `gemmBf16`):
 *   causal depthwise conv (kernel 4, no bias) + SiLU on q, k, v, reading and updating a conv state;
 *   q̂, k̂ = x / sqrt(Σx² + 1e-6) per head; q̂ · scale (default headDim^-½); then per token
 *   S' = diag(exp g)·S;  S = S' + β k̂ (v − S'ᵀk̂)ᵀ;  o = Sᵀ q̂·scale      (fp32 state `[d_k, d_v]`).
 * The output gate `o_norm(o) · sigmoid(g_b(g_a(x)))` is the existing per-head gated RMSNorm
 * (`rmsNormPerHead` with a sigmoid gate; `kdaOutputNorm` below only names that call).
 *
 * Layouts (C = heads·headDim channels per projection, T tokens of the batch, row-major f32):
 * - `qkv` `[T, 3C]`: pre-conv q | k | v of each token (one fused projection GEMM writes this).
 * - `convWeight` `[3C, 4]` f32: q_conv1d | k_conv1d | v_conv1d weights, each checkpoint tensor
 *   `[C, 1, 4]` (bf16 → `bf16ToF32` once at load; same memory order). fp32 was chosen over bf16:
 *   4 weights per channel are negligible bytes, and the conv then runs in plain fp32.
 * - `g` `[T, heads, headDim]` f32 log decay (≤ 0; −exp(A_log[h])·softplus(f + dt_bias), computed
 *   elsewhere); `beta` `[T, heads]` f32 (sigmoid already applied).
 * - Sequences: `seqLens` `[B]` i32 (≥ 0; sequence b owns the next seqLens[b] rows of the batch) and
 *   `slots` `[B]` i32 (distinct) into caller-owned pools: `state` `[numSlots, heads, headDim,
 *   headDim]` (S[i = key][j = value]) and `conv` `[numSlots, 3C, 3]` (last 3 pre-conv inputs per
 *   channel, oldest first). A fresh sequence starts from a zeroed slot (`kdaResetSlot`). A slot is a
 *   contiguous byte range, so it can be described, copied and sent by slot (PD hand-over).
 * - Output `o` `[T, heads, headDim]` f32.
 *
 * Two kernels, one contract:
 * - `kdaRecurrent` (decode, verification, replay; T per sequence small): token by token.
 * - `kdaChunked` (long prefill): WY form over chunks of `chunk` tokens (default 64), pairwise
 *   exponent differences only (nothing overflows). Equal to the recurrent kernel within fp32
 *   tolerance, NOT bitwise (another summation order). Measured on the 2-core dev VM
 *   (docs/BENCHMARKS.md, "KDA and MoE") the recurrent kernel is ~2× faster for prefill as well
 *   (the state block stays in L1 across tokens; the WY form adds pairwise work), so the
 *   recommendation is `kdaRecurrent` for every regime — one kernel, bitwise consistent across
 *   prefill, decode and verification. `kdaChunked` stays for parity with GPU engines and re-tuning.
 *
 * Reproducibility (batch invariance): each (sequence, head) is computed by one thread in a fixed
 * order, so a token's output and its sequence's new state are bit-identical whatever the other
 * sequences in the batch, their order, and the thread count. `kdaRecurrent` over a block of T
 * tokens equals T single-token calls bit for bit, so plain decoding and speculative verification
 * agree exactly **as long as both use `kdaRecurrent`** (and the same ISA path). The engine must
 * therefore pick the kernel by regime, never by batch composition: e.g. chunked only for prefill
 * (and consistently: a prefill split at multiples of `chunk` tokens gives the same bits as one
 * call), recurrent for every decode/verify/replay step.
 *
 * Speculative rollback — two ways to keep the state at an accepted position n (engine measures):
 * 1. Snapshots: pass `snapshots` (`createKdaSnapshots`) to `kdaRecurrent`; row r of
 *    `snapshots.state` `[T, heads, headDim, headDim]` and `snapshots.conv` `[T, 3C, 3]` hold the
 *    states of row r's sequence right after token r. Commit = `kdaCommitSnapshot(pools, slot,
 *    snapshots, r0 + n − 1)` (a copy of heads·headDim² + 9C floats; r0 = the sequence's first row).
 *    Cost: writing T state copies during verification (T·heads·headDim²·4 bytes per layer).
 * 2. Replay: copy the slot before verification (`kdaCopySlot` to a spare slot), verify, then copy it
 *    back and run `kdaRecurrent` on the n accepted tokens' qkv/g/beta rows (subarrays of the verify
 *    inputs, no recomputation of the projections). Bit-identical to the snapshot (same kernel).
 */
import { addon, type KdaRawArgs } from './addon.js';
import { rmsNormPerHead } from './norm.js';
import { expectArray, expectInt, expectNumber, fail, outArray } from './validate.js';

/** Geometry of one KDA layer (d_k = d_v = headDim). */
export interface KdaShape {
  readonly heads: number;
  readonly headDim: number;
}

/** Caller-owned per-sequence states, indexed by slot. */
export interface KdaStatePools {
  /** f32 `[numSlots, heads, headDim, headDim]`, S[i = key channel][j = value channel]. */
  readonly state: Float32Array;
  /** f32 `[numSlots, 3·heads·headDim, 3]`: q | k | v channels, last 3 pre-conv inputs, oldest first. */
  readonly conv: Float32Array;
}

/** Per-token inputs of one call (T = Σ seqLens rows). */
export interface KdaInputs {
  /** f32 `[T, 3·heads·headDim]`: pre-conv q | k | v. */
  readonly qkv: Float32Array;
  /** f32 `[T, heads, headDim]`: log decay (≤ 0). */
  readonly g: Float32Array;
  /** f32 `[T, heads]`: β (after sigmoid). */
  readonly beta: Float32Array;
  /** f32 `[3·heads·headDim, 4]`: q_conv1d | k_conv1d | v_conv1d weights. */
  readonly convWeight: Float32Array;
}

/** Which sequences the batch rows belong to. */
export interface KdaBatch {
  /** i32 `[B]`, ≥ 0: rows per sequence, in row order. */
  readonly seqLens: Int32Array;
  /** i32 `[B]`, distinct, in [0, numSlots): each sequence's state slot. */
  readonly slots: Int32Array;
}

/** Per-token copies of the states, written by `kdaRecurrent` (rollback by copy). */
export interface KdaSnapshots {
  /** f32 `[T, heads, headDim, headDim]`: row r = state of row r's sequence after token r. */
  readonly state: Float32Array;
  /** f32 `[T, 3·heads·headDim, 3]`: row r = conv state of row r's sequence after token r. */
  readonly conv: Float32Array;
}

/** Options of `kdaRecurrent` / `kdaChunked`. */
export interface KdaOptions {
  /** f32 `[T, heads, headDim]` to write into (must not alias an input). */
  readonly out?: Float32Array;
  /** Multiplier of q̂; default headDim^-½ (kimi.py). */
  readonly scale?: number;
}

/** `kdaRecurrent` options: optional snapshots, optional initial states. */
export interface KdaRecurrentOptions extends KdaOptions {
  readonly snapshots?: KdaSnapshots;
  /**
   * Each sequence's state before its tokens, copied into its slot first inside the kernel (a replay from a kept
   * state without a separate restore pass over the pools): rows of `state` `[R, heads, headDim, headDim]` f32 and
   * `conv` `[R, 3·heads·headDim, 3]` f32, sequence b's at row `rows[b]` (`[B]` i32 in [0, R); default b, R = B).
   * Needs every `seqLens[b] ≥ 1`.
   */
  readonly initial?: KdaInitial;
  /**
   * Where each sequence's state and conv state before its tokens are written (after `initial`, if given), for a later
   * replay: rows of `state` `[R, heads, headDim, headDim]` f32 and `conv` `[R, 3·heads·headDim, 3]` f32, sequence b's
   * at row `rows[b]` (`[B]` i32, distinct, in [0, R); −1: not written). The kernel reads those states anyway, so this
   * costs one write of each, not a separate pass.
   */
  readonly keepBefore?: KdaKeepBefore;
}

/** {@link KdaRecurrentOptions.keepBefore}. */
export interface KdaKeepBefore {
  readonly state: Float32Array;
  readonly conv: Float32Array;
  readonly rows: Int32Array;
}

/** {@link KdaRecurrentOptions.initial}. */
export interface KdaInitial {
  readonly state: Float32Array;
  readonly conv: Float32Array;
  readonly rows?: Int32Array;
}

/** `kdaChunked` options: chunk length in tokens (1..1024, default 64). */
export interface KdaChunkedOptions extends KdaOptions {
  readonly chunk?: number;
}

function checkShape(call: string, shape: KdaShape): { heads: number; headDim: number; channels: number } {
  if (typeof shape !== 'object' || shape === null) fail(call, 'shape', '{ heads, headDim }', shape);
  const heads = expectInt(call, 'shape.heads', shape.heads, 1, 1 << 16);
  const headDim = expectInt(call, 'shape.headDim', shape.headDim, 1, 1 << 12);
  return { heads, headDim, channels: heads * headDim };
}

/** Floats of one state slot (`heads·headDim²`) and of one conv slot (`9·heads·headDim`). */
export function kdaSlotLengths(shape: KdaShape): { state: number; conv: number } {
  const { heads, headDim, channels } = checkShape('kdaSlotLengths', shape);
  return { state: heads * headDim * headDim, conv: 3 * channels * 3 };
}

/** Zeroed pools for `numSlots` sequences. */
export function createKdaStatePools(shape: KdaShape, numSlots: number): KdaStatePools {
  expectInt('createKdaStatePools', 'numSlots', numSlots, 1);
  const l = kdaSlotLengths(shape);
  return { state: new Float32Array(numSlots * l.state), conv: new Float32Array(numSlots * l.conv) };
}

/** Snapshot buffers for a call of `tokens` rows. */
export function createKdaSnapshots(shape: KdaShape, tokens: number): KdaSnapshots {
  expectInt('createKdaSnapshots', 'tokens', tokens, 0);
  const l = kdaSlotLengths(shape);
  return { state: new Float32Array(tokens * l.state), conv: new Float32Array(tokens * l.conv) };
}

function numSlots(call: string, pools: KdaStatePools, shape: KdaShape): number {
  const l = kdaSlotLengths(shape);
  if (typeof pools !== 'object' || pools === null) fail(call, 'pools', '{ state, conv }', pools);
  const state = expectArray(call, 'pools.state', pools.state, Float32Array);
  if (state.length === 0 || state.length % l.state !== 0) {
    fail(call, 'pools.state', `a Float32Array of numSlots*heads*headDim² = numSlots*${l.state} elements`, state);
  }
  const n = state.length / l.state;
  expectArray(call, 'pools.conv', pools.conv, Float32Array, n * l.conv, 'numSlots*3*heads*headDim*3');
  return n;
}

function checkSlot(call: string, param: string, slot: number, n: number): number {
  return expectInt(call, param, slot, 0, n - 1);
}

/** Zeroes one slot (a new sequence). */
export function kdaResetSlot(pools: KdaStatePools, shape: KdaShape, slot: number): void {
  const n = numSlots('kdaResetSlot', pools, shape);
  const l = kdaSlotLengths(shape);
  checkSlot('kdaResetSlot', 'slot', slot, n);
  pools.state.fill(0, slot * l.state, (slot + 1) * l.state);
  pools.conv.fill(0, slot * l.conv, (slot + 1) * l.conv);
}

/** Copies slot `from` to slot `to` (state and conv); e.g. keep the pre-verify state for replay. */
export function kdaCopySlot(pools: KdaStatePools, shape: KdaShape, from: number, to: number): void {
  const n = numSlots('kdaCopySlot', pools, shape);
  const l = kdaSlotLengths(shape);
  checkSlot('kdaCopySlot', 'from', from, n);
  checkSlot('kdaCopySlot', 'to', to, n);
  pools.state.copyWithin(to * l.state, from * l.state, (from + 1) * l.state);
  pools.conv.copyWithin(to * l.conv, from * l.conv, (from + 1) * l.conv);
}

/**
 * Commits the snapshot of batch row `row` (state after that token) into `slot`: after verifying a
 * block whose first row is r0, accepting n tokens (incl. the bonus' predecessor) is row r0 + n − 1.
 */
export function kdaCommitSnapshot(
  pools: KdaStatePools,
  shape: KdaShape,
  slot: number,
  snapshots: KdaSnapshots,
  row: number,
): void {
  const call = 'kdaCommitSnapshot';
  const n = numSlots(call, pools, shape);
  const l = kdaSlotLengths(shape);
  checkSlot(call, 'slot', slot, n);
  const s = expectArray(call, 'snapshots.state', snapshots?.state, Float32Array);
  const rows = s.length / l.state;
  if (!Number.isInteger(rows)) fail(call, 'snapshots.state', `a multiple of heads*headDim² = ${l.state}`, s);
  expectArray(call, 'snapshots.conv', snapshots.conv, Float32Array, rows * l.conv, 'T*3*heads*headDim*3');
  expectInt(call, 'row', row, 0, rows - 1);
  pools.state.set(s.subarray(row * l.state, (row + 1) * l.state), slot * l.state);
  pools.conv.set(snapshots.conv.subarray(row * l.conv, (row + 1) * l.conv), slot * l.conv);
}

function prepare(
  call: string,
  inputs: KdaInputs,
  batch: KdaBatch,
  pools: KdaStatePools,
  shape: KdaShape,
  options: KdaOptions,
  mode: 'recurrent' | 'chunked',
  chunk: number,
  snapshots: KdaSnapshots | undefined,
): KdaRawArgs {
  const { heads, headDim, channels } = checkShape(call, shape);
  if (typeof inputs !== 'object' || inputs === null) fail(call, 'inputs', '{ qkv, g, beta, convWeight }', inputs);
  if (typeof batch !== 'object' || batch === null) fail(call, 'batch', '{ seqLens, slots }', batch);
  const n = numSlots(call, pools, shape);
  const seqLens = expectArray(call, 'batch.seqLens', batch.seqLens, Int32Array);
  const slots = expectArray(call, 'batch.slots', batch.slots, Int32Array, seqLens.length, 'seqLens.length');
  let tokens = 0;
  const seen = new Set<number>();
  for (let b = 0; b < seqLens.length; b++) {
    if (seqLens[b]! < 0) fail(call, `batch.seqLens[${b}]`, 'a length >= 0', seqLens[b]);
    tokens += seqLens[b]!;
    const s = slots[b]!;
    if (s < 0 || s >= n) fail(call, `batch.slots[${b}]`, `a slot in [0, ${n})`, s);
    if (seen.has(s)) fail(call, `batch.slots[${b}]`, 'distinct slots', s);
    seen.add(s);
  }
  expectArray(call, 'inputs.qkv', inputs.qkv, Float32Array, tokens * 3 * channels, 'T*3*heads*headDim');
  expectArray(call, 'inputs.g', inputs.g, Float32Array, tokens * channels, 'T*heads*headDim');
  expectArray(call, 'inputs.beta', inputs.beta, Float32Array, tokens * heads, 'T*heads');
  expectArray(call, 'inputs.convWeight', inputs.convWeight, Float32Array, 3 * channels * 4, '3*heads*headDim*4');
  const out = outArray(call, options.out, Float32Array, tokens * channels, 'T*heads*headDim');
  const scale = options.scale === undefined ? 1 / Math.sqrt(headDim) : expectNumber(call, 'scale', options.scale);
  let snapState: Float32Array | null = null;
  let snapConv: Float32Array | null = null;
  if (snapshots !== undefined) {
    snapState = expectArray(
      call,
      'snapshots.state',
      snapshots.state,
      Float32Array,
      tokens * heads * headDim * headDim,
      'T*heads*headDim²',
    );
    snapConv = expectArray(
      call,
      'snapshots.conv',
      snapshots.conv,
      Float32Array,
      tokens * 9 * channels,
      'T*3*heads*headDim*3',
    );
  }
  return [
    inputs.qkv,
    inputs.g,
    inputs.beta,
    inputs.convWeight,
    seqLens,
    slots,
    pools.state,
    pools.conv,
    heads,
    headDim,
    out,
    mode,
    chunk,
    snapState,
    snapConv,
    scale,
    null,
    null,
    null,
    null,
    null,
    null,
  ];
}

/**
 * Checks a state-rows option (`options.initial` or `options.keepBefore`): `{ state [R, heads, headDim²], conv
 * [R, 3·heads·headDim, 3] }` f32 with R ≥ 1. @returns the arrays and R.
 */
function stateRows(
  call: string,
  name: string,
  value: { readonly state: Float32Array; readonly conv: Float32Array } | null,
  shape: KdaShape,
  fields: string,
): { state: Float32Array; conv: Float32Array; R: number } {
  const { heads, headDim, channels } = checkShape(call, shape);
  if (typeof value !== 'object' || value === null) fail(call, name, fields, value);
  const state = expectArray(call, `${name}.state`, value.state, Float32Array);
  const perRow = heads * headDim * headDim;
  const R = state.length / perRow;
  if (!(Number.isInteger(R) && R >= 1))
    fail(call, `${name}.state`, `a Float32Array of R*heads*headDim² = R*${perRow} elements (R >= 1)`, state);
  const conv = expectArray(call, `${name}.conv`, value.conv, Float32Array, R * 9 * channels, 'R*3*heads*headDim*3');
  return { state, conv, R };
}

/**
 * Checks `options.initial` and `options.keepBefore` ({@link KdaRecurrentOptions}) and sets them into the raw
 * arguments.
 */
function addStates(
  call: string,
  args: KdaRawArgs,
  shape: KdaShape,
  batch: KdaBatch,
  options: KdaRecurrentOptions,
): void {
  const B = batch.seqLens.length;
  const { initial, keepBefore: keep } = options;
  if (initial !== undefined) {
    for (let b = 0; b < B; b++)
      if (batch.seqLens[b]! < 1)
        fail(call, `batch.seqLens[${b}]`, 'a length >= 1 with options.initial', batch.seqLens[b]);
    const { state, conv, R } = stateRows(call, 'options.initial', initial, shape, '{ state, conv, rows? }');
    args[16] = state;
    args[17] = conv;
    if (initial.rows === undefined) {
      if (R !== B) fail(call, 'options.initial.state', `${B} rows (one per sequence) without options.initial.rows`, R);
    } else {
      const rows = expectArray(call, 'options.initial.rows', initial.rows, Int32Array, B, 'seqLens.length');
      for (let b = 0; b < B; b++)
        if (!(rows[b]! >= 0 && rows[b]! < R)) fail(call, `options.initial.rows[${b}]`, `a row in [0, ${R})`, rows[b]);
      args[18] = rows;
    }
  }
  if (keep !== undefined) {
    const { state, conv, R } = stateRows(call, 'options.keepBefore', keep, shape, '{ state, conv, rows }');
    const rows = expectArray(call, 'options.keepBefore.rows', keep.rows, Int32Array, B, 'seqLens.length');
    const seen = new Set<number>();
    for (let b = 0; b < B; b++) {
      const r = rows[b]!;
      if (!(r >= -1 && r < R)) fail(call, `options.keepBefore.rows[${b}]`, `a row in [-1, ${R})`, r);
      if (r >= 0 && seen.has(r)) fail(call, `options.keepBefore.rows[${b}]`, 'distinct rows', r);
      seen.add(r);
    }
    args[19] = state;
    args[20] = conv;
    args[21] = rows;
  }
}

/**
 * Recurrent KDA over a batch of sequences (decode, verification, replay); updates the slots'
 * states in place and optionally writes per-token snapshots (module comment).
 * @returns o f32 `[T, heads, headDim]`.
 * @throws SpecdArgumentError on a wrong type, length, slot (out of range or repeated) or length.
 */
export function kdaRecurrent(
  inputs: KdaInputs,
  batch: KdaBatch,
  pools: KdaStatePools,
  shape: KdaShape,
  options: KdaRecurrentOptions = {},
): Float32Array {
  const args = prepare('kdaRecurrent', inputs, batch, pools, shape, options, 'recurrent', 1, options.snapshots);
  addStates('kdaRecurrent', args, shape, batch, options);
  addon.kdaForward(...args);
  return args[10];
}

/**
 * `kdaRecurrent` on a libuv thread. Do not touch any argument's memory (inputs, pools, snapshots,
 * out) until the Promise settles; do not transfer their buffers.
 */
export function kdaRecurrentAsync(
  inputs: KdaInputs,
  batch: KdaBatch,
  pools: KdaStatePools,
  shape: KdaShape,
  options: KdaRecurrentOptions = {},
): Promise<Float32Array> {
  const args = prepare('kdaRecurrentAsync', inputs, batch, pools, shape, options, 'recurrent', 1, options.snapshots);
  addStates('kdaRecurrentAsync', args, shape, batch, options);
  return addon.kdaForwardAsync(...args).then(() => args[10]);
}

/**
 * Chunked (WY form) KDA for long prefill; same contract as `kdaRecurrent` without snapshots.
 * @returns o f32 `[T, heads, headDim]`.
 */
export function kdaChunked(
  inputs: KdaInputs,
  batch: KdaBatch,
  pools: KdaStatePools,
  shape: KdaShape,
  options: KdaChunkedOptions = {},
): Float32Array {
  const chunk = expectInt('kdaChunked', 'chunk', options.chunk ?? 64, 1, 1024);
  const args = prepare('kdaChunked', inputs, batch, pools, shape, options, 'chunked', chunk, undefined);
  addon.kdaForward(...args);
  return args[10];
}

/** `kdaChunked` on a libuv thread (the usual call for a long prefill); see `kdaRecurrentAsync`. */
export function kdaChunkedAsync(
  inputs: KdaInputs,
  batch: KdaBatch,
  pools: KdaStatePools,
  shape: KdaShape,
  options: KdaChunkedOptions = {},
): Promise<Float32Array> {
  const chunk = expectInt('kdaChunkedAsync', 'chunk', options.chunk ?? 64, 1, 1024);
  const args = prepare('kdaChunkedAsync', inputs, batch, pools, shape, options, 'chunked', chunk, undefined);
  return addon.kdaForwardAsync(...args).then(() => args[10]);
}

/** Where {@link kdaGate} reads β's logits: `b[offset + t·stride + h]` (default offset 0, stride heads). */
export interface KdaGateBetaLayout {
  readonly offset?: number;
  readonly stride?: number;
}

/**
 * The KDA gates of T tokens (kimi.py `KDAAttention`, the part between the projections and the core):
 *   g[t][h·d + i] = negA[h] · softplus(f[t][h·d + i] + dtBias[h·d + i])   (log decay, ≤ 0)
 *   β[t][h] = sigmoid(b[offset + t·stride + h])
 * with softplus(x) = x for x > 20, else log1p(exp(x)) (torch's threshold). fp32 throughout, with a
 * vectorisable exp and log1p series (kda_math.h; within 4 ulp of the double formula), one portable build
 * for every ISA path, elementwise — a token's gates never depend on the batch, the thread count or the path.
 * @param f f32 `[T, heads·headDim]` (f_b_proj output); @param dtBias f32 `[heads·headDim]`;
 * @param negA f32 `[heads]` (−exp(A_log)); @param b f32 holding β's logits at `layout` (e.g. the fused
 * in-projection's rows, one of its column ranges).
 * @returns `{ g: [T, heads·headDim], beta: [T, heads] }` f32 (`out`'s arrays when given).
 * @throws SpecdArgumentError on a wrong type or length (b shorter than its layout needs included).
 */
export function kdaGate(
  f: Float32Array,
  dtBias: Float32Array,
  negA: Float32Array,
  b: Float32Array,
  shape: KdaShape,
  layout: KdaGateBetaLayout = {},
  out?: { readonly g: Float32Array; readonly beta: Float32Array },
): { g: Float32Array; beta: Float32Array } {
  const call = 'kdaGate';
  const heads = expectInt(call, 'heads', shape?.heads, 1, 1 << 16);
  const headDim = expectInt(call, 'headDim', shape?.headDim, 1, 1 << 16);
  const C = heads * headDim;
  expectArray(call, 'f', f, Float32Array);
  if (f.length % C !== 0) fail(call, 'f', `a Float32Array of T*heads*headDim floats (a multiple of ${C})`, f);
  const T = f.length / C;
  const offset = expectInt(call, 'layout.offset', layout.offset ?? 0, 0);
  const stride = expectInt(call, 'layout.stride', layout.stride ?? heads, heads);
  const g = out === undefined ? new Float32Array(T * C) : expectArray(call, 'out.g', out.g, Float32Array, T * C);
  const beta =
    out === undefined ? new Float32Array(T * heads) : expectArray(call, 'out.beta', out.beta, Float32Array, T * heads);
  addon.kdaGate(f, dtBias, negA, b, offset, stride, T, heads, headDim, g, beta);
  return { g, beta };
}

/**
 * KDA output gate: `o_norm(o) · sigmoid(gate)` per head (RMSNorm over headDim, one weight shared by
 * the heads) — exactly `rmsNormPerHead(o, heads, weight, eps, { values: gate, kind: 'sigmoid' }, out)`.
 * @param o f32 `[T, heads, headDim]`; @param gate f32 like o (g_b(g_a(x)) before the sigmoid).
 * @param weight f32 `[headDim]` (o_norm.weight); @param eps rms_norm_eps; @param out may be `o`.
 */
export function kdaOutputNorm(
  o: Float32Array,
  shape: KdaShape,
  weight: Float32Array,
  gate: Float32Array,
  eps: number,
  out?: Float32Array,
): Float32Array {
  const { heads, headDim } = checkShape('kdaOutputNorm', shape);
  expectArray('kdaOutputNorm', 'weight', weight, Float32Array, headDim, 'headDim');
  return rmsNormPerHead(o, heads, weight, eps, { values: gate, kind: 'sigmoid' }, out);
}
