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
import { swigluForward, type KimiKernels, type MoePrepared, type Routing, type SwigluWeights } from './kernels.js';
import { shardRange, type ShardRank } from './layout.js';
import { freshScratch, type Scratch } from '@specd/core';
import type { WeightReader } from './weights.js';

/** Weights of one MoE block. */
export interface MoeWeights {
  /** Router `[E, hidden]`. */
  readonly gate: PackedBf16Weights;
  /** e_score_correction_bias `[E]` f32. */
  readonly bias: Float32Array;
  /** Routed experts (w1 = gate, w3 = up, w2 = down) and the shared expert, prepared by the kernel set. */
  readonly experts: MoePrepared;
  /**
   * Tensor-parallel shard only: the rank's experts [e0, e1) (`experts` holds them as local ids 0…),
   * and its columns of the shared expert (run apart from the routed ones, added after them).
   */
  readonly local?: { readonly e0: number; readonly e1: number; readonly shared: SwigluWeights | undefined };
}

/** Router decisions for a batch (what the goldens check). */
export interface RouterChoice extends Routing {
  /** Choice scores sigmoid + bias `[N, E]` f32. */
  readonly choiceScores: Float32Array;
}

/**
 * Reads a SwiGLU MLP stored as `{prefix}{gate}.weight`, `{up}`, `{down}`. With a tensor-parallel
 * `shard`, only its block of the intermediate width: gate/up rows and down columns [i0, i1)
 * (Megatron column- then row-parallel: the rank's output is a partial sum, all-reduced).
 */
export function loadSwiglu(
  r: WeightReader,
  prefix: string,
  names: readonly [string, string, string],
  hidden: number,
  inter: number,
  shard: ShardRank = { rank: 0, size: 1 },
): SwigluWeights {
  const sharded = shard.size > 1;
  const block = sharded ? shardRange(inter, shard) : undefined;
  const rows = block === undefined ? {} : { block: { rows: block } };
  return {
    inter: block === undefined ? inter : block[1] - block[0],
    gateUp: r.packedBlocks([
      { name: `${prefix}${names[0]}.weight`, n: inter, k: hidden, ...rows },
      { name: `${prefix}${names[1]}.weight`, n: inter, k: hidden, ...rows },
    ]),
    down: r.packedBlocks([
      {
        name: `${prefix}${names[2]}.weight`,
        n: hidden,
        k: inter,
        ...(block === undefined ? {} : { block: { cols: block } }),
      },
    ]),
  };
}

/** Tensors read by {@link loadMoeWeights}. */
export function moeTensorCount(c: KimiConfig): number {
  return 2 + 3 * c.numExperts + (c.numSharedExperts > 0 ? 3 : 0);
}

/**
 * Reads layer `l`'s MoE (`model.layers.{l}.block_sparse_moe.*`). With a tensor-parallel `shard`:
 * the router whole (replicated), only the rank's experts [e0, e1) = its 1/size of them
 * (expert parallelism inside TP), and its columns of the shared expert. @throws {KimiWeightError}.
 */
export function loadMoeWeights(
  r: WeightReader,
  c: KimiConfig,
  l: number,
  kernels: KimiKernels,
  shard: ShardRank = { rank: 0, size: 1 },
): MoeWeights {
  const p = `model.layers.${l}.block_sparse_moe.`;
  const D = c.hiddenSize;
  const [e0, e1] = shardRange(c.numExperts, shard);
  const experts: SwigluWeights[] = [];
  for (let e = e0; e < e1; e++)
    experts.push(loadSwiglu(r, `${p}experts.${e}.`, ['w1', 'w3', 'w2'], D, c.moeIntermediateSize));
  const shared =
    c.numSharedExperts > 0
      ? loadSwiglu(
          r,
          `${p}shared_experts.`,
          ['gate_proj', 'up_proj', 'down_proj'],
          D,
          c.moeIntermediateSize * c.numSharedExperts,
          shard,
        )
      : undefined;
  const gate = r.packedRows([`${p}gate.weight`], [c.numExperts], D);
  const bias = r.f32(`${p}gate.e_score_correction_bias`, [c.numExperts]);
  if (shard.size > 1) return { gate, bias, experts: kernels.prepareMoe(experts, undefined), local: { e0, e1, shared } };
  return { gate, bias, experts: kernels.prepareMoe(experts, shared) };
}

/**
 * A shard's routed experts: for each token only its chosen experts in [e0, e1) (local ids), run in
 * one kernel call per count of such experts (1 … topK; tokens with none skip the call), each token
 * still summing its experts in ascending id; then the shard's shared-expert columns are added.
 */
function moeShardForward(
  w: MoeWeights,
  x: Float32Array,
  N: number,
  D: number,
  kernels: KimiKernels,
  r: Routing,
): Float32Array {
  const { e0, e1, shared } = w.local!;
  const K = r.topK;
  const out = new Float32Array(N * D);
  const owned = new Int32Array(N);
  for (let t = 0; t < N; t++)
    for (let j = 0; j < K; j++) if (r.ids[t * K + j]! >= e0 && r.ids[t * K + j]! < e1) owned[t]!++;
  for (let cnt = 1; cnt <= K; cnt++) {
    const rows: number[] = [];
    for (let t = 0; t < N; t++) if (owned[t] === cnt) rows.push(t);
    if (rows.length === 0) continue;
    const xg = new Float32Array(rows.length * D);
    const ids = new Int32Array(rows.length * cnt);
    const weights = new Float32Array(rows.length * cnt);
    rows.forEach((t, i) => {
      xg.set(x.subarray(t * D, (t + 1) * D), i * D);
      let m = 0;
      for (let j = 0; j < K; j++) {
        const e = r.ids[t * K + j]!;
        if (e >= e0 && e < e1) {
          ids[i * cnt + m] = e - e0;
          weights[i * cnt + m] = r.weights[t * K + j]!;
          m++;
        }
      }
    });
    const y = kernels.moe(xg, rows.length, w.experts, { topK: cnt, ids, weights });
    rows.forEach((t, i) => {
      out.set(y.subarray(i * D, (i + 1) * D), t * D);
    });
  }
  if (shared !== undefined) {
    const ys = swigluForward(shared, x, N);
    for (let i = 0; i < out.length; i++) out[i] = out[i]! + ys[i]!;
  }
  return out;
}

/**
 * Sparse MoE block: `x [N, hidden]` f32 (post-attention-normalised) → `[N, hidden]` f32.
 * @param onRoute receives the router decisions (tests, statistics).
 * @param buf where the router logits and the result go ({@link Scratch}; default fresh arrays; a kept scratch's
 *   result is overwritten by the next layer).
 */
export function moeForward(
  w: MoeWeights,
  c: KimiConfig,
  x: Float32Array,
  N: number,
  kernels: KimiKernels,
  onRoute?: (r: RouterChoice) => void,
  buf: Scratch = freshScratch,
): Float32Array {
  const logits = gemmBf16(x, N, w.gate, buf('moe.logits', N * w.gate.n));
  const r = kernels.route(logits, N, w.bias, c);
  if (onRoute !== undefined) {
    const E = c.numExperts;
    const choiceScores = Float32Array.from(logits, (v, i) => 1 / (1 + Math.exp(-v)) + w.bias[i % E]!);
    onRoute({ ...r, choiceScores });
  }
  if (w.local !== undefined) return moeShardForward(w, x, N, c.hiddenSize, kernels, r);
  return kernels.moe(x, N, w.experts, r, buf('ffn.out', x.length));
}
