/**
 * Multi-head latent attention with NoPE (mla_use_nope; REFERENCE.md §7; kimi.py `MLAAttention`),
 * over the paged latent cache, absorbed form (DeepSeek-V2 §2.1.2):
 *
 *   q = q_proj x → per head [q_nope (nope) | q_pe (rope)];  [c | k_pe] = kv_a_proj_with_mqa x
 *   latent = RMSNorm(c) · kv_a_layernorm (eps rms_norm_eps);   cache row = [latent (r) | k_pe (rope)]
 *   kv_b_proj = per head [W_uk (nope × r) ; W_uv (v × r)]
 *   score_s = (q_nope·W_uk·latent_s + q_pe·k_pe_s) · (nope + rope)^−½, causal within the sequence
 *   o_h = W_uv Σ_s softmax(score)_s latent_s;  out = o_proj [o_1 … o_H]
 * Equal to the reference's expanded form (k_nope = W_uk latent, v = W_uv latent) up to rounding.
 * No rotary anywhere (NoPE).
 */

import { type SequenceCache, sliceColumns } from '@specd/core';
import { gemmBf16, rmsNorm, type GemmActivations, type PackedBf16Weights } from '@specd/native';

import type { KimiConfig } from './config.js';
import type { KimiKernels, MlaBatch, MlaPrepared } from './kernels.js';
import { shardRange, type SeqSpan, type ShardRank } from './layout.js';
import { freshScratch, type Scratch } from '@specd/core';
import type { WeightReader } from './weights.js';

/** Weights of one MLA layer. */
export interface MlaWeights {
  /** Stacked `[H·(nope+rope) + r + rope, hidden]`: q_proj then kv_a_proj_with_mqa. */
  readonly inProj: PackedBf16Weights;
  /** kv_a_layernorm `[r]` f32. */
  readonly kvNorm: Float32Array;
  /** kv_b_proj prepared by the kernel set. */
  readonly kvB: MlaPrepared;
  /** o_proj `[hidden, H·v]`. */
  readonly oProj: PackedBf16Weights;
}

/** Tensors read by {@link loadMlaWeights}. */
export const MLA_TENSORS_PER_LAYER = 5;

/** f32 values per cached token per MLA layer: latent r + k_pe rope. */
export function mlaFloatsPerToken(c: KimiConfig): number {
  return c.kvLoraRank + c.qkRopeHeadDim;
}

/**
 * Reads layer `l`'s MLA weights (`model.layers.{l}.self_attn.*`). With a tensor-parallel `shard`
 * (and `c` the shard's config: `numHeads` = its heads), only the rank's heads [h0, h1): q_proj and
 * kv_b_proj rows of those heads, o_proj's columns of their values; kv_a_proj_with_mqa and
 * kv_a_layernorm whole (the latent cache is shared by all heads: every rank keeps it whole).
 * @throws {KimiWeightError}.
 */
export function loadMlaWeights(
  r: WeightReader,
  c: KimiConfig,
  l: number,
  kernels: KimiKernels,
  shard: ShardRank = { rank: 0, size: 1 },
): MlaWeights {
  const p = `model.layers.${l}.self_attn.`;
  const { qkNopeHeadDim: nope, qkRopeHeadDim: rope, vHeadDim: vd, kvLoraRank: rank, hiddenSize: D } = c;
  const H = c.numHeads * shard.size;
  const [h0, h1] = shardRange(H, shard);
  const sharded = shard.size > 1;
  const qk = nope + rope;
  const kvb = nope + vd;
  return {
    inProj: r.packedBlocks([
      {
        name: `${p}q_proj.weight`,
        n: H * qk,
        k: D,
        ...(sharded ? { block: { rows: [h0 * qk, h1 * qk] as const } } : {}),
      },
      { name: `${p}kv_a_proj_with_mqa.weight`, n: rank + rope, k: D },
    ]),
    kvNorm: r.f32(`${p}kv_a_layernorm.weight`, [rank]),
    kvB: kernels.prepareMla(
      r.bf16Block(`${p}kv_b_proj.weight`, H * kvb, rank, sharded ? { rows: [h0 * kvb, h1 * kvb] } : {}),
      c,
    ),
    oProj: r.packedBlocks([
      {
        name: `${p}o_proj.weight`,
        n: D,
        k: H * vd,
        ...(sharded ? { block: { cols: [h0 * vd, h1 * vd] as const } } : {}),
      },
    ]),
  };
}

/** The paged batch of a forward (same for every MLA layer of the stage; cache already extended). */
export function mlaBatch(spans: readonly SeqSpan[], cache: SequenceCache): MlaBatch {
  const kv = cache.kv!;
  const tables = spans.map((s) => kv.blockTable(s.id));
  const maxBlocks = Math.max(1, ...tables.map((t) => t.length));
  const blockTables = new Int32Array(spans.length * maxBlocks);
  tables.forEach((t, i) => {
    blockTables.set(t, i * maxBlocks);
  });
  const cu = new Int32Array(spans.length + 1);
  spans.forEach((s, i) => {
    cu[i + 1] = cu[i]! + s.numNew;
  });
  const positions = new Int32Array(cu[spans.length]!);
  spans.forEach((s) => {
    for (let t = 0; t < s.numNew; t++) positions[s.tokenStart + t] = s.position + t;
  });
  return { cuSeqlensQ: cu, kvLens: Int32Array.from(spans, (s) => s.position + s.numNew), blockTables, positions };
}

/**
 * MLA forward for a batch: `xn [N, hidden]` f32 → `[N, hidden]` f32. Writes each new token's cache
 * row into the paged store of layer `l`, then attends. `act`: the projections' activation precision
 * (`gemmBf16`'s; the latent cache and attention stay fp32). `buf`: where the intermediates and the returned
 * `[N, hidden]` go ({@link Scratch}; default fresh arrays; a kept scratch's result is overwritten by the next layer).
 */
export function mlaForward(
  w: MlaWeights,
  c: KimiConfig,
  l: number,
  xn: Float32Array,
  spans: readonly SeqSpan[],
  N: number,
  cache: SequenceCache,
  kernels: KimiKernels,
  batch: MlaBatch,
  act: GemmActivations = 'f32',
  buf: Scratch = freshScratch,
): Float32Array {
  const { numHeads: H, qkNopeHeadDim: nope, qkRopeHeadDim: rope, kvLoraRank: rank } = c;
  const qw = H * (nope + rope);
  const width = qw + rank + rope;
  const proj = gemmBf16(xn, N, w.inProj, buf('mla.proj', N * width), act);
  const kvA = sliceColumns(proj, N, width, qw, rank, buf('mla.kvA', N * rank));
  const latent = rmsNorm(kvA, w.kvNorm, c.rmsNormEps, buf('mla.latent', N * rank));
  const kv = cache.kv!;
  const store = kv.layerStore(l);
  for (const s of spans) {
    for (let t = 0; t < s.numNew; t++) {
      const tok = s.tokenStart + t;
      const off = kv.tokenOffset(s.id, s.position + t);
      store.set(latent.subarray(tok * rank, (tok + 1) * rank), off);
      store.set(proj.subarray(tok * width + qw + rank, tok * width + width), off + rank);
    }
  }
  const q = sliceColumns(proj, N, width, 0, qw, buf('mla.q', N * qw));
  const o = kernels.mla(q, store, kv.pageSize, w.kvB, batch, 1 / Math.sqrt(nope + rope), c);
  return gemmBf16(o, N, w.oProj, buf('mixer.out', N * w.oProj.n), act);
}
