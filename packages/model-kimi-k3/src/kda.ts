/**
 * Kimi Delta Attention layer (REFERENCE.md §7; tools/reference/specd_ref/kimi.py `KDAAttention`).
 *
 * Per token x `[hidden]` (already input-normalised):
 *   q, k, v = SiLU(causal depthwise conv1d(q_proj x, k_proj x, v_proj x)), kernel ks, no bias,
 *             conv state = the last ks−1 inputs; q, k L2-normalised per head, q · d^−½
 *   g = −exp(A_log[h]) · softplus(f_b(f_a(x)) + dt_bias)   (log decay, per channel, f32)
 *   β = sigmoid(b_proj x)                                 (per head)
 *   S' = diag(exp g)·S;  S = S' + β·k (v − S'ᵀk)ᵀ;  o = Sᵀ q   (S `[H, d, d]` f32, {@link KimiKernels.kda})
 *   out = o_proj( RMSNorm_d(o) · o_norm · sigmoid(g_b(g_a(x))) )
 * Decode and verify use the recurrent form, so a token's output and the state after it are bitwise
 * identical however tokens are grouped into forwards. Prefill may use the chunked form.
 */

import { type SequenceCache, sliceColumns } from '@specd/core';
import { gatedRmsNorm, gemmBf16, type GemmActivations, type PackedBf16Weights } from '@specd/native';

import type { KimiConfig } from './config.js';
import type { KimiKernels } from './kernels.js';
import { freshScratch, type Scratch } from '@specd/core';
import { shardRange, type SeqSpan, type ShardRank } from './layout.js';
import type { WeightReader } from './weights.js';

/** Weights of one KDA layer (HD = H·d). */
export interface KdaWeights {
  /** Stacked input projections `[3·HD + 2·d + H, hidden]`: q, k, v, f_a (d), g_a (d), b (H). */
  readonly inProj: PackedBf16Weights;
  /** f_b `[HD, d]`, g_b `[HD, d]`. */
  readonly fB: PackedBf16Weights;
  readonly gB: PackedBf16Weights;
  /** q_conv1d | k_conv1d | v_conv1d `[3·HD, ks]` f32. */
  readonly convWeight: Float32Array;
  /** −exp(A_log) `[H]` f32. */
  readonly negA: Float32Array;
  /** dt_bias `[HD]` f32. */
  readonly dtBias: Float32Array;
  /** o_norm weight `[d]` f32. */
  readonly oNorm: Float32Array;
  /** o_proj `[hidden, HD]`. */
  readonly oProj: PackedBf16Weights;
}

/** Tensors read by {@link loadKdaWeights} (for progress totals). */
export const KDA_TENSORS_PER_LAYER = 15;

/**
 * Reads layer `l`'s KDA weights (`model.layers.{l}.self_attn.*`). With a tensor-parallel `shard`
 * (and `c` the shard's config: `kdaHeads` = its heads), only the rank's heads [h0, h1): rows of
 * q/k/v/f_b/g_b (channels [h0·d, h1·d)), b rows and A_log entries [h0, h1), its conv channels and
 * dt_bias, and o_proj's columns of its channels; f_a, g_a and o_norm whole (replicated).
 * @throws {KimiWeightError}.
 */
export function loadKdaWeights(
  r: WeightReader,
  c: KimiConfig,
  l: number,
  shard: ShardRank = { rank: 0, size: 1 },
): KdaWeights {
  const p = `model.layers.${l}.self_attn.`;
  const H = c.kdaHeads * shard.size;
  const d = c.kdaHeadDim;
  const HD = H * d;
  const D = c.hiddenSize;
  const ks = c.convKernel;
  const [h0, h1] = shardRange(H, shard);
  const ch: [number, number] = [h0 * d, h1 * d];
  const hd = ch[1] - ch[0];
  const convWeight = new Float32Array(3 * hd * ks);
  ['q', 'k', 'v'].forEach((n, i) => {
    convWeight.set(r.f32Range(`${p}${n}_conv1d.weight`, [HD, 1, ks], ch[0] * ks, ch[1] * ks), i * hd * ks);
  });
  const aLog = r.f32Range(`${p}A_log`, [1, 1, H, 1], h0, h1);
  const rows = (name: string, n: number, k: number, block?: [number, number]) => ({
    name: `${p}${name}.weight`,
    n,
    k,
    ...(block === undefined ? {} : { block: { rows: block } }),
  });
  const sharded = shard.size > 1;
  return {
    inProj: r.packedBlocks([
      rows('q_proj', HD, D, sharded ? ch : undefined),
      rows('k_proj', HD, D, sharded ? ch : undefined),
      rows('v_proj', HD, D, sharded ? ch : undefined),
      rows('f_a_proj', d, D),
      rows('g_a_proj', d, D),
      rows('b_proj', H, D, sharded ? [h0, h1] : undefined),
    ]),
    fB: r.packedBlocks([rows('f_b_proj', HD, d, sharded ? ch : undefined)]),
    gB: r.packedBlocks([rows('g_b_proj', HD, d, sharded ? ch : undefined)]),
    convWeight,
    negA: Float32Array.from(aLog, (a) => -Math.exp(a)),
    dtBias: r.f32Range(`${p}dt_bias`, [HD], ch[0], ch[1]),
    oNorm: r.f32(`${p}o_norm.weight`, [d]),
    oProj: r.packedBlocks([{ name: `${p}o_proj.weight`, n: D, k: HD, ...(sharded ? { block: { cols: ch } } : {}) }]),
  };
}

/**
 * What a verify forward keeps of one KDA layer so that an accepted prefix can be committed later
 * (`commitFromSnapshots`): the core's inputs of every row of the batch and each sequence's state from
 * before the forward. Committing n tokens of a sequence restores its state and re-runs the recurrent
 * kernel on its first n rows — bitwise the state after token n − 1 (the recurrent kernel over T tokens
 * equals T single-token calls), for the cost of n tokens' recurrence at commit instead of writing a
 * `[H, d, d]` state copy per token during the verify (16 MiB per layer for a 16-token block at H = 16,
 * d = 128).
 */
export interface KdaLayerSnapshots {
  /** Pre-conv q | k | v `[N, 3·H·d]`, log decay g `[N, H·d]` and β `[N, H]` of every row (batch order). */
  readonly qkv: Float32Array;
  readonly g: Float32Array;
  readonly beta: Float32Array;
  /**
   * Per span of the forward (span order): recurrent state `[H, d, d]` and conv state `[3·H·d, ks − 1]` before it —
   * for spans of two or more tokens only (unwritten for one token: such a block commits whole right after its
   * forward, which needs no replay; `commitFromSnapshots` refuses to replay it). From `kdaForward`'s `before`
   * scratch (the stage keeps two sets of these buffers, one per snapshotted forward, alternately). Empty in
   * {@link KdaCommitMode} `'copy'`, which commits from `perToken`.
   */
  readonly stateBefore: Float32Array;
  readonly convBefore: Float32Array;
  /** What the replay runs: the layer's conv weights, shape and kernel set. */
  readonly convWeight: Float32Array;
  readonly heads: number;
  readonly headDim: number;
  readonly kernels: KimiKernels;
  /**
   * Only with {@link KdaCommitMode} `'copy'`: the state `[N, H, d, d]` and conv state `[N, 3·H·d, ks − 1]`
   * after every row (the kernel writes them during the forward); the commit copies one row instead of the replay.
   */
  readonly perToken?: { readonly state: Float32Array; readonly conv: Float32Array };
}

/**
 * How a verify forward's accepted prefix is committed (`KimiStageModel.kdaCommit`): `'replay'` (default:
 * keep the inputs and the state before the forward; the commit re-runs the committed tokens' recurrence)
 * or `'copy'` (the forward writes the state after every token; the commit copies one). Same bits either way.
 */
export type KdaCommitMode = 'replay' | 'copy';

/**
 * KDA forward for a batch: `xn [N, hidden]` f32 (input-normalised) → `[N, hidden]` f32; advances
 * each sequence's recurrent and conv state in `cache` (layer `l`). `chunked[i]` selects the
 * chunked form for span i (prefill only). `onSnapshot` (verify steps; every span recurrent) receives what
 * commits a prefix later ({@link KdaLayerSnapshots}). `act`: the projections' activation precision
 * (`gemmBf16`'s; the recurrence itself is fp32 either way). `buf`: where the intermediates and the returned
 * `[N, hidden]` go ({@link Scratch}; default fresh arrays): with a stage's kept scratch the result is overwritten by
 * the next layer, so the caller consumes it at once. `before`: where the snapshots' states from before the forward go
 * (names `${l}.state` and `${l}.conv`; default fresh arrays).
 */
export function kdaForward(
  w: KdaWeights,
  c: KimiConfig,
  l: number,
  xn: Float32Array,
  spans: readonly SeqSpan[],
  N: number,
  cache: SequenceCache,
  kernels: KimiKernels,
  chunked: readonly boolean[],
  onSnapshot?: (s: KdaLayerSnapshots) => void,
  act: GemmActivations = 'f32',
  commit: KdaCommitMode = 'replay',
  buf: Scratch = freshScratch,
  before: Scratch = freshScratch,
): Float32Array {
  const H = c.kdaHeads;
  const d = c.kdaHeadDim;
  const HD = H * d;
  const width = 3 * HD + 2 * d + H;
  const proj = gemmBf16(xn, N, w.inProj, buf('kda.proj', N * width), act);
  const fa = sliceColumns(proj, N, width, 3 * HD, d, buf('kda.fa', N * d));
  const fb = gemmBf16(fa, N, w.fB, buf('kda.fb', N * HD), act);
  const ga = sliceColumns(proj, N, width, 3 * HD + d, d, buf('kda.ga', N * d));
  const gb = gemmBf16(ga, N, w.gB, buf('kda.gb', N * HD), act);
  // the snapshots keep q | k | v (and g, β) beyond this forward: a fresh array then
  const qkv = sliceColumns(
    proj,
    N,
    width,
    0,
    3 * HD,
    onSnapshot === undefined ? buf('kda.qkv', N * 3 * HD) : undefined,
  );
  const { g, beta } = kernels.kdaGate(fb, w.dtBias, w.negA, proj, 3 * HD + 2 * d, width, H, d);
  // every row is written by the kernel calls below (the spans cover rows [0, N))
  const o = buf('kda.o', N * HD);
  const pools = cache.state!;
  const state = pools.recurrentStore(l);
  const conv = pools.convStore(l);
  let perToken: { state: Float32Array; conv: Float32Array } | undefined;
  let keep: { state: Float32Array; conv: Float32Array } | undefined;
  if (onSnapshot !== undefined) {
    const stateLen = H * d * d;
    const convLen = 3 * HD * (c.convKernel - 1);
    // 'replay': written by the kernel calls below as they read each state (keepBefore); a block of one token always
    // commits whole, right after its forward, so its state before is not kept. 'copy' commits from perToken instead.
    const replay = commit === 'replay';
    const stateBefore = replay ? before(`${l}.state`, spans.length * stateLen) : new Float32Array(0);
    const convBefore = replay ? before(`${l}.conv`, spans.length * convLen) : new Float32Array(0);
    if (replay) keep = { state: stateBefore, conv: convBefore };
    else perToken = { state: new Float32Array(N * stateLen), conv: new Float32Array(N * convLen) };
    onSnapshot({
      qkv,
      g,
      beta,
      stateBefore,
      convBefore,
      convWeight: w.convWeight,
      heads: H,
      headDim: d,
      kernels,
      ...(perToken === undefined ? {} : { perToken }),
    });
  }
  // one kernel call per mode; each covers a contiguous run of spans with that mode
  let i = 0;
  while (i < spans.length) {
    let j = i;
    while (j < spans.length && chunked[j] === chunked[i]) j++;
    const first = spans[i]!.tokenStart;
    const last = spans[j - 1]!.tokenStart + spans[j - 1]!.numNew;
    kernels.kda(
      {
        qkv: qkv.subarray(first * 3 * HD, last * 3 * HD),
        g: g.subarray(first * HD, last * HD),
        beta: beta.subarray(first * H, last * H),
        convWeight: w.convWeight,
        seqLens: Int32Array.from(spans.slice(i, j), (s) => s.numNew),
        slots: Int32Array.from(spans.slice(i, j), (s) => pools.slotOf(s.id)),
        state,
        conv,
        heads: H,
        headDim: d,
        out: o.subarray(first * HD, last * HD),
        ...(keep === undefined
          ? {}
          : {
              keepBefore: {
                ...keep,
                rows: Int32Array.from(spans.slice(i, j), (s, k) => (s.numNew < 2 ? -1 : i + k)),
              },
            }),
        ...(perToken === undefined
          ? {}
          : {
              snapshots: {
                state: perToken.state.subarray(first * H * d * d, last * H * d * d),
                conv: perToken.conv.subarray(first * 3 * HD * (c.convKernel - 1), last * 3 * HD * (c.convKernel - 1)),
              },
            }),
      },
      chunked[i] ? 'chunked' : 'recurrent',
    );
    i = j;
  }
  gatedRmsNorm(o, w.oNorm, gb, c.rmsNormEps, 'sigmoid', o);
  return gemmBf16(o, N, w.oProj, buf('mixer.out', N * w.oProj.n), act);
}
