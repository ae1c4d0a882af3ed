/**
 * The EAGLE-3 draft model — one decoder layer and the head (eagle3.ts, module comment) — on one thread
 * or one tensor-parallel rank: the step math that context writes, chains (eagle3-chain.ts) and trees
 * (eagle3-tree.ts) share. Oracle: tools/reference/specd_ref/eagle3.py (`Eagle3Draft.qkv`, `finish`,
 * `logits`).
 */

import {
  DrafterError,
  applyBlockLinear,
  denseBlockOutput,
  type BlockLinear,
  keptScratch,
  sliceColumns,
  type DraftSequence,
  type DenseBlockOutputWeights,
  type DraftShard,
  type StageModel,
  type TapProjection,
} from '@specd/core';
import { applyRope, rmsNorm } from '@specd/native';

import type { Eagle3Config } from './config.js';

/**
 * The weights of the draft (one decoder layer + head; its o_proj and MLP are core's dense block's): core's Q8_0 linear
 * maps, or packed bf16 (the `weights` setting and its default: config.ts, EAGLE3_WEIGHT_FORMATS).
 */
export interface Eagle3Weights extends DenseBlockOutputWeights {
  /** fc's column blocks, one per tap: the context projection (core's accumulate-by-tap {@link TapProjection}). */
  readonly projection: TapProjection;
  readonly inputNorm: Float32Array;
  readonly hiddenNorm: Float32Array;
  readonly postNorm: Float32Array;
  /** `norm` (rank 0 only under tensor parallelism). */
  readonly finalNorm?: Float32Array;
  /** q_proj `[H·hd, 2D]` (step 1: the query of the last context entry). */
  readonly q: BlockLinear;
  /** q_proj ; k_proj ; v_proj stacked: `[(H + 2·KV)·hd, 2D]`. */
  readonly qkv: BlockLinear;
  /** k_proj ; v_proj stacked: `[2·KV·hd, 2D]` (context entries need no query). */
  readonly kv: BlockLinear;
  /** o_proj `[D, H·hd]`. */
  readonly o: BlockLinear;
  /** gate_proj ; up_proj stacked `[2·I, D]`. */
  readonly gateUp: BlockLinear;
  /** down_proj `[D, I]`. */
  readonly down: BlockLinear;
  /** lm_head `[draftVocab, D]`. */
  readonly lmHead?: BlockLinear;
  /**
   * Target id of each draft id (`draft_id + d2t[draft_id]`), `[draftVocab]` i32 (`[0]` off rank 0 under
   * tensor parallelism).
   */
  readonly draftToTarget: Int32Array;
}

/** `[a_r ; b_r]` per row: `a, b [n, w]` → `[n, 2w]`. */
function concatRows(a: Float32Array, b: Float32Array, n: number, w: number): Float32Array {
  const out = new Float32Array(n * 2 * w);
  for (let r = 0; r < n; r++) {
    out.set(a.subarray(r * w, (r + 1) * w), 2 * r * w);
    out.set(b.subarray(r * w, (r + 1) * w), (2 * r + 1) * w);
  }
  return out;
}

/** The draft model's step math on this thread or rank (module comment). Not part of the package API. */
export class Eagle3Model {
  /** Query heads, KV heads and intermediate width this rank computes (the whole model's without tensor parallelism). */
  readonly heads: number;
  readonly kvHeads: number;
  readonly inter: number;
  /** The dense block's intermediates, kept between steps (core's `keptScratch`). */
  private readonly scratch = keptScratch();

  constructor(
    readonly config: Eagle3Config,
    private readonly target: StageModel,
    private w: Eagle3Weights | undefined,
    /** The rank's tensor-parallel group and blocks; undefined = the whole draft model on this thread. */
    readonly tp: DraftShard | undefined,
  ) {
    const c = config;
    this.heads = tp?.heads ?? c.numHeads;
    this.kvHeads = tp?.kvHeads ?? c.numKvHeads;
    this.inter = tp?.intermediate ?? c.intermediateSize;
  }

  /** Whether this rank embeds, computes logits and picks drafts (always without tensor parallelism). */
  get root(): boolean {
    return this.tp === undefined || this.tp.isRoot;
  }

  /** The weights. @throws {DrafterError} once disposed. */
  weights(): Eagle3Weights {
    if (this.w === undefined) throw new DrafterError('eagle3: the drafter was disposed');
    return this.w;
  }

  /** Drops the weights (later calls throw). */
  dispose(): void {
    this.w = undefined;
  }

  /** Token embeddings `[tokens.length, D]` f32: the target's, or under tensor parallelism rank 0's broadcast. */
  embed(tokens: Int32Array): Float32Array {
    return this.tp === undefined
      ? this.target.embedTokens!(tokens)
      : this.tp.embed(this.target, tokens, this.config.hiddenSize);
  }

  /** The rank's row-parallel partial summed over the ranks (identity without tensor parallelism). */
  reduce(x: Float32Array): Float32Array {
    return this.tp === undefined ? x : this.tp.reduce(x);
  }

  /** `[input_layernorm(emb); hidden_norm(g)]` for `n` rows → `[n, 2D]` f32. */
  layerInput(emb: Float32Array, g: Float32Array, n: number): Float32Array {
    const c = this.config;
    const w = this.weights();
    return concatRows(rmsNorm(emb, w.inputNorm, c.rmsNormEps), rmsNorm(g, w.hiddenNorm, c.rmsNormEps), n, c.hiddenSize);
  }

  /**
   * Step 1's query: the query of anchor p − 1 from `x` (`[n, 2D]`), RoPE at p − 1; its K/V are already the
   * last context entry. → `[n, H·hd]` f32.
   */
  firstQuery(x: Float32Array, seqs: readonly DraftSequence[]): Float32Array {
    const c = this.config;
    const q = applyBlockLinear(this.weights().q, x, seqs.length);
    applyRope(
      q,
      Int32Array.from(seqs, (s) => s.position - 1),
      { heads: this.heads, headDim: c.headDim, theta: c.ropeTheta, style: 'neox' },
      q,
    );
    return q;
  }

  /**
   * A step's query, key and value rows from `x` (`[n, 2D]`) at `positions` (`[n]` i32): Q = RoPE(q_proj x)
   * `[n, H·hd]`, K = RoPE(k_proj x) and V = v_proj x `[n, KV, hd]` f32 each.
   */
  queryKeysValues(x: Float32Array, positions: Int32Array): [Float32Array, Float32Array, Float32Array] {
    const c = this.config;
    const n = positions.length;
    const H = this.heads;
    const hd = c.headDim;
    const W = this.kvHeads * hd;
    const qkv = applyBlockLinear(this.weights().qkv, x, n);
    const q = sliceColumns(qkv, n, H * hd + 2 * W, 0, H * hd);
    applyRope(q, positions, { heads: H, headDim: hd, theta: c.ropeTheta, style: 'neox' }, q);
    const [k, v] = this.keysValues(qkv, positions, H * hd);
    return [q, k, v];
  }

  /**
   * After attention: h = r + o_proj(a) (r = g, or hidden_norm(g)); h + mlp(post_attention_layernorm(h))
   * → `[n, D]`.
   */
  finish(g: Float32Array, a: Float32Array, n: number): Float32Array {
    const c = this.config;
    const w = this.weights();
    const h = c.normBeforeResidual ? rmsNorm(g, w.hiddenNorm, c.rmsNormEps) : Float32Array.from(g);
    // core's dense block after attention: o_proj → residual → norm → SwiGLU → residual
    return denseBlockOutput(h, a, n, w, {
      eps: c.rmsNormEps,
      intermediate: this.inter,
      reduce: (x) => this.reduce(x),
      scratch: this.scratch,
    });
  }

  /** Draft-vocabulary logits lm_head(norm(h)) of `n` rows `h [n, D]` → `[n, draftVocab]` f32 (rank 0 only). */
  logits(h: Float32Array, n: number): Float32Array {
    const { finalNorm, lmHead } = this.weights();
    // the root (rank 0) loads both, and only the root computes logits
    if (finalNorm === undefined || lmHead === undefined)
      throw new DrafterError('eagle3: logits: internal error: no final norm / lm_head (not the root rank)');
    return applyBlockLinear(lmHead, rmsNorm(h, finalNorm, this.config.rmsNormEps), n);
  }

  /**
   * From projected rows `y [n, width]` whose columns [col, col + 2W) are k ; v: K = RoPE(k) at `positions`,
   * V = v → `[n, KV, hd]` f32 each.
   */
  keysValues(y: Float32Array, positions: Int32Array, col: number): [Float32Array, Float32Array] {
    const c = this.config;
    const n = positions.length;
    const W = this.kvHeads * c.headDim;
    const width = y.length / n;
    const k = sliceColumns(y, n, width, col, W);
    const v = sliceColumns(y, n, width, col + W, W);
    applyRope(k, positions, { heads: this.kvHeads, headDim: c.headDim, theta: c.ropeTheta, style: 'neox' }, k);
    return [k, v];
  }
}
