/**
 * Feed-forward blocks: the dense SwiGLU MLP (layers < first_k_dense_replace) and the sparse MoE
 * (REFERENCE.md §7; kimi.py `MoEGate`, `SparseMoE`):
 *   scores = sigmoid(x · W_gateᵀ) (f32);  chosen = top-k of scores + e_score_correction_bias
 *   (the bias only chooses);  weights = scores[chosen] / (Σ + 1e−20) · routed_scaling_factor
 *   out = Σ_{e ∈ chosen, ascending e} weight_e · w2(silu(w1 x) · w3 x)  +  shared_experts(x) (unscaled)
 * Tokens are grouped per expert into one GEMM; GEMM rows are batch invariant and each token sums
 * its experts in ascending id order, so a token's output never depends on the rest of the batch.
 */

import { gemmBf16, type PackedBf16Weights } from '@specd/native';

import type { KimiConfig } from './config.js';
import type { KimiKernels, MoePrepared, Routing, SwigluWeights } from './kernels.js';
import type { WeightReader } from './weights.js';

/** Weights of one MoE block. */
export interface MoeWeights {
  /** Router `[E, hidden]`. */
  readonly gate: PackedBf16Weights;
  /** e_score_correction_bias `[E]` f32. */
  readonly bias: Float32Array;
  /** Routed experts (w1 = gate, w3 = up, w2 = down) and the shared expert, prepared by the kernel set. */
  readonly experts: MoePrepared;
}

/** Router decisions for a batch (what the goldens check). */
export interface RouterChoice extends Routing {
  /** Choice scores sigmoid + bias `[N, E]` f32. */
  readonly choiceScores: Float32Array;
}

/** Reads a SwiGLU MLP stored as `{prefix}{gate}.weight`, `{up}`, `{down}`. */
export function loadSwiglu(r: WeightReader, prefix: string, names: readonly [string, string, string], hidden: number, inter: number): SwigluWeights {
  return {
    inter,
    gateUp: r.packedRows([`${prefix}${names[0]}.weight`, `${prefix}${names[1]}.weight`], [inter, inter], hidden),
    down: r.packedRows([`${prefix}${names[2]}.weight`], [hidden], inter),
  };
}

/** Tensors read by {@link loadMoeWeights}. */
export function moeTensorCount(c: KimiConfig): number {
  return 2 + 3 * c.numExperts + (c.numSharedExperts > 0 ? 3 : 0);
}

/** Reads layer `l`'s MoE (`model.layers.{l}.block_sparse_moe.*`). @throws {KimiWeightError}. */
export function loadMoeWeights(r: WeightReader, c: KimiConfig, l: number, kernels: KimiKernels): MoeWeights {
  const p = `model.layers.${l}.block_sparse_moe.`;
  const D = c.hiddenSize;
  const experts: SwigluWeights[] = [];
  for (let e = 0; e < c.numExperts; e++) experts.push(loadSwiglu(r, `${p}experts.${e}.`, ['w1', 'w3', 'w2'], D, c.moeIntermediateSize));
  const shared = c.numSharedExperts > 0
    ? loadSwiglu(r, `${p}shared_experts.`, ['gate_proj', 'up_proj', 'down_proj'], D, c.moeIntermediateSize * c.numSharedExperts)
    : undefined;
  return {
    gate: r.packedRows([`${p}gate.weight`], [c.numExperts], D),
    bias: r.f32(`${p}gate.e_score_correction_bias`, [c.numExperts]),
    experts: kernels.prepareMoe(experts, shared),
  };
}

/**
 * Sparse MoE block: `x [N, hidden]` f32 (post-attention-normalised) → `[N, hidden]` f32.
 * @param onRoute receives the router decisions (tests, statistics).
 */
export function moeForward(w: MoeWeights, c: KimiConfig, x: Float32Array, N: number, kernels: KimiKernels,
  onRoute?: (r: RouterChoice) => void): Float32Array {
  const logits = gemmBf16(x, N, w.gate);
  const r = kernels.route(logits, N, w.bias, c);
  if (onRoute !== undefined) {
    const E = c.numExperts;
    const choiceScores = Float32Array.from(logits, (v, i) => 1 / (1 + Math.exp(-v)) + w.bias[i % E]!);
    onRoute({ ...r, choiceScores });
  }
  return kernels.moe(x, N, w.experts, r);
}
