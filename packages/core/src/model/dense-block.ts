/**
 * The dense decoder block of Llama-style models, shared by drafters (DFlash's layers, EAGLE-3's one
 * layer): norm → attention → o_proj → residual → norm → SwiGLU MLP → residual. The attention itself
 * (query / key norms, RoPE, which KV it reads) differs by model and is passed in.
 *
 * Tensor parallelism (Megatron-LM, Shoeybi et al. 2019 §3): with a rank's blocks of o_proj (columns of
 * its heads) and of the MLP (gate/up rows, down columns of its intermediate channels), `reduce` sums the
 * rank's row-parallel partials over the group (an all-reduce); without it the block is the whole model's.
 */

import { addF32, gemmBf16, gemmBf16Accumulate, rmsNorm, swigluFused, type PackedBf16Weights } from '@specd/native';
import { freshScratch, type Scratch } from './scratch.js';

/**
 * A projection y = x·Wᵀ of a block: packed bf16 weights (@specd/native `gemmBf16`), or any linear map
 * `x [rows, k]` f32 → `[rows, n]` f32 with the same batch invariance (e.g. a model's quantized weights), written
 * into `out` `[rows, n]` f32 when given.
 */
export type BlockLinear =
  | PackedBf16Weights
  | { readonly n: number; apply(x: Float32Array, rows: number, out?: Float32Array): Float32Array };

/**
 * `x [rows, k]` f32 · Wᵀ → `[rows, n]` f32, into `out` when given: `w.apply`, or `gemmBf16` for packed bf16 weights.
 * @throws what the linear map or `gemmBf16` throws (a SpecdArgumentError on a wrong length).
 */
export function applyBlockLinear(w: BlockLinear, x: Float32Array, rows: number, out?: Float32Array): Float32Array {
  return 'apply' in w ? w.apply(x, rows, out) : gemmBf16(x, rows, w, out);
}

/**
 * `h [rows, n] f32 += x [rows, k] f32 · Wᵀ` in place: one fused native call for packed bf16 weights without a reduction
 * (`gemmBf16Accumulate`: bit for bit `h[e] + gemmBf16(x)[e]`), else the projection (into `scratch('block.proj')`),
 * `reduce` (a tensor-parallel all-reduce, if any), then `addF32` — h[e] + y[e] rounded once either way.
 * @throws what the linear map, `reduce` or the native calls throw (a SpecdArgumentError on a wrong length).
 */
export function accumulateBlockLinear(
  h: Float32Array,
  w: BlockLinear,
  x: Float32Array,
  rows: number,
  reduce: ((x: Float32Array) => Float32Array) | undefined,
  scratch: Scratch,
): void {
  if (reduce === undefined && !('apply' in w)) {
    gemmBf16Accumulate(x, rows, w, h);
    return;
  }
  const y = applyBlockLinear(w, x, rows, scratch('block.proj', rows * w.n));
  addF32(h, reduce === undefined ? y : reduce(y), h); // the bits of h[e] + y[e] in JavaScript, without the loop
}

/** The weights after attention: o_proj and the MLP with its norm. */
export interface DenseBlockOutputWeights {
  /** o_proj `[D, H·hd]` (under tensor parallelism the rank's columns `[D, H_r·hd]`). */
  readonly o: BlockLinear;
  /** post_attention_layernorm `[D]` f32. */
  readonly postNorm: Float32Array;
  /** gate_proj ; up_proj stacked `[2·I, D]` (the rank's rows `[2·I_r, D]`). */
  readonly gateUp: BlockLinear;
  /** down_proj `[D, I]` (the rank's columns `[D, I_r]`). */
  readonly down: BlockLinear;
}

/** The weights of a whole block, attention's own projections excepted. */
export interface DenseBlockWeights extends DenseBlockOutputWeights {
  /** input_layernorm `[D]` f32. */
  readonly inputNorm: Float32Array;
}

/** Sizes and collectives of a {@link denseBlock}. */
export interface DenseBlockOptions {
  /** RMSNorm epsilon. */
  readonly eps: number;
  /** Intermediate channels this rank computes (I, or I_r under tensor parallelism). */
  readonly intermediate: number;
  /** Sum of a row-parallel partial `[n, D]` f32 over the ranks; absent = identity (no tensor parallelism). */
  readonly reduce?: (x: Float32Array) => Float32Array;
  /**
   * Where the block's intermediates go (normed rows, projections, SwiGLU): a stage's kept buffers
   * (`keptScratch`), so a decode step allocates none; default fresh arrays. Names used: `block.*`.
   */
  readonly scratch?: Scratch;
}

/**
 * After attention, in place on the residual stream: h += o_proj(a); h += down(silu(gate(x)) · up(x)) with
 * x = post_attention_layernorm(h). The row-parallel outputs go through `options.reduce`.
 * @param h residual `[n, D]` f32, updated in place and returned.
 * @param a attention output `[n, H·hd]` f32 (the rank's heads under tensor parallelism).
 */
export function denseBlockOutput(
  h: Float32Array,
  a: Float32Array,
  n: number,
  w: DenseBlockOutputWeights,
  options: DenseBlockOptions,
): Float32Array {
  const scratch = options.scratch ?? freshScratch;
  const I = options.intermediate;
  accumulateBlockLinear(h, w.o, a, n, options.reduce, scratch);
  const xm = rmsNorm(h, w.postNorm, options.eps, scratch('block.xn', h.length));
  const gu = applyBlockLinear(w.gateUp, xm, n, scratch('block.gateUp', n * 2 * I));
  accumulateBlockLinear(h, w.down, swigluFused(gu, I, scratch('block.act', n * I)), n, options.reduce, scratch);
  return h;
}

/**
 * One dense decoder block, in place on the residual stream: x = input_layernorm(h); a = attention(x);
 * then {@link denseBlockOutput}.
 * @param h residual `[n, D]` f32, updated in place and returned.
 * @param attention the model's attention: normed rows `x [n, D]` f32 → `[n, H·hd]` f32.
 */
export function denseBlock(
  h: Float32Array,
  n: number,
  w: DenseBlockWeights,
  attention: (x: Float32Array) => Float32Array,
  options: DenseBlockOptions,
): Float32Array {
  const a = attention(rmsNorm(h, w.inputNorm, options.eps, (options.scratch ?? freshScratch)('block.xn', h.length)));
  return denseBlockOutput(h, a, n, w, options);
}
