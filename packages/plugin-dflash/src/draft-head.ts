/**
 * The draft head of a drafter that shares the target's lm_head (DFlash, DSpark): the logits of the draft rows over
 * the draft vocabulary, and the drafts chosen from them.
 *
 * - Whole vocabulary (the default): the target's own `lmHead`, `[rows, V]`; or, opted in (DFlash setting
 *   `draft_head: "packed"`), the same rows gathered into a drafter-owned packed `[V, D]` in the format below (bf16:
 *   V·D·2 bytes more memory, 57 MB for SmolLM2, run with AMX bf16 activations — 2.1× faster at 15 rows than
 *   SmolLM2's Q8_0 head with fp32 activations; Q8_0: 30 MB, int8 activations).
 * - Reduced vocabulary (FR-Spec, Zhao et al. 2025, arXiv 2502.14856, §3.2: the draft head restricted to the most
 *   frequent tokens): `dflash_config.draft_vocab_size` = Vd and the checkpoint's `draft_vocab_ids` `[Vd]` (token
 *   ids, strictly ascending, in [0, V)). At load the Vd rows of the target's lm_head are gathered into a packed
 *   bf16 sub-matrix `[Vd, D]` (read through the target's `lmHead` itself, {@link gatherLmHeadRows}, so any lm_head
 *   format works), and a propose computes `[rows, Vd]` logits only: Vd/V of the lm_head's bytes and FLOPs. The
 *   gathered rows' format follows the CPU ({@link draftHeadFormat}; the drafts are proposals only, so their
 *   precision moves τ at most, never the output): bf16 with bf16 activations on AMX tiles (2.4× faster than fp32
 *   activations at Vd = 8192, 15 rows); on an AVX-512 CPU without AMX, GGUF Q8_0 blocks (round-tripping a Q8_0
 *   lm_head's own rows) run by `gemmQuant` with int8 activations on VNNI (2× faster than bf16 weights with fp32
 *   activations at Vd = 16384, 15 rows, on AMD Zen 5); bf16 with fp32 activations elsewhere. Drafts are token ids
 *   from the list; a sampled draft's q is zero outside it (the rejection sampler stays lossless for any q).
 *   Verification keeps the whole vocabulary, so the output is unchanged.
 * - Tensor parallelism: the target's vocab-parallel lmHead is a collective every rank joins, so there the reduced
 *   head computes the whole vocabulary and keeps the Vd columns (same drafts, no saving).
 */

import {
  DrafterError,
  quantizeQ8_0,
  sampleFromSupport,
  samplingProbs,
  supportOf,
  type DraftSampling,
  type RandomSource,
} from '@specd/core';
import {
  argmax,
  argmaxProb,
  f32ToBf16,
  gemmBf16,
  gemmQuant,
  isa,
  packBf16Weights,
  quantizedWeights,
  type GemmActivations,
  type PackedBf16Weights,
  type QuantizedWeights,
} from '@specd/native';
import type { SafetensorsCheckpoint, StageModel } from '@specd/core';

/** The checkpoint tensor that lists the draft vocabulary's token ids (`[draft_vocab_size]` I32 or I64). */
export const DRAFT_VOCAB_IDS_TENSOR = 'draft_vocab_ids';

/** Columns of the identity passed through the target's lmHead per call when gathering rows (bounds the scratch). */
const GATHER_CHUNK = 64;

/**
 * Reads and validates `draft_vocab_ids` (checkpoint sanity): `[draftVocabSize]`, dtype I32 or I64, every id in
 * [0, vocabSize), strictly ascending (so unique).
 * @returns the ids `[draftVocabSize]` i32.
 * @throws {DrafterError} naming the tensor, the rule and the first bad entry.
 */
export function readDraftVocabIds(
  weights: SafetensorsCheckpoint,
  draftVocabSize: number,
  vocabSize: number,
  where: string,
): Int32Array {
  const name = DRAFT_VOCAB_IDS_TENSOR;
  if (!weights.has(name))
    throw new DrafterError(
      `${where}: dflash_config.draft_vocab_size is ${draftVocabSize} but the checkpoint has no ${name} tensor ` +
        '(the token ids of the draft vocabulary; tools/draft-vocab.mjs writes it)',
    );
  const info = weights.info(name);
  if (info.shape.length !== 1 || info.shape[0] !== draftVocabSize)
    throw new DrafterError(
      `${where}: ${name} is [${info.shape.join(', ')}], expected [${draftVocabSize}] (dflash_config.draft_vocab_size)`,
    );
  if (info.dtype !== 'I32' && info.dtype !== 'I64')
    throw new DrafterError(`${where}: ${name}: expected dtype I32 or I64, got ${info.dtype}`);
  const data = weights.read(name).data as Int32Array | BigInt64Array;
  const ids = new Int32Array(draftVocabSize);
  for (let i = 0; i < draftVocabSize; i++) {
    const v = Number(data[i]!);
    if (!(Number.isInteger(v) && v >= 0 && v < vocabSize))
      throw new DrafterError(`${where}: ${name}[${i}] = ${v} is outside the vocabulary [0, ${vocabSize})`);
    if (i > 0 && v <= ids[i - 1]!)
      throw new DrafterError(
        `${where}: ${name}[${i}] = ${v} does not follow ${name}[${i - 1}] = ${ids[i - 1]} ` +
          '(expected strictly ascending ids: sorted, no repeats)',
      );
    ids[i] = v;
  }
  return ids;
}

/**
 * Rows `ids` of the target's lm_head W `[V, D]`, read through `target.lmHead` itself: lmHead of the identity's
 * rows e_c gives W's column c (`logits[v] = Σ_d e_c[d]·W[v, d] = W[v, c]`, exact: one product by 1, the rest by
 * 0), GATHER_CHUNK columns per call. Costs one lm_head GEMM of D rows, once at load.
 * @returns `[ids.length, D]` f32, row j = W[ids[j]].
 */
export function gatherLmHeadRows(target: StageModel, ids: Int32Array): Float32Array {
  const lmHead = requireLmHead(target);
  const D = target.info.hiddenSize;
  const V = target.info.vocabSize;
  const out = new Float32Array(ids.length * D);
  for (let c0 = 0; c0 < D; c0 += GATHER_CHUNK) {
    const n = Math.min(GATHER_CHUNK, D - c0);
    const x = new Float32Array(n * D);
    for (let i = 0; i < n; i++) x[i * D + c0 + i] = 1;
    const cols = lmHead(x, n); // [n, V]: row i = W[:, c0 + i]
    ids.forEach((id, j) => {
      for (let i = 0; i < n; i++) out[j * D + c0 + i] = cols[i * V + id]!;
    });
  }
  return out;
}

/**
 * Activation precision of the packed reduced head: `'bf16'` where @specd/native runs bf16 GEMMs on AMX tiles (the
 * avx512 path of a CPU with AMX), else `'f32'` (no faster without AMX).
 */
export function draftHeadActivations(): GemmActivations {
  const i = isa();
  return i.isa === 'avx512' && i.amxAvailable ? 'bf16' : 'f32';
}

/**
 * The format of a packed reduced head's rows on this CPU: `'q8_0'` (GGUF Q8_0 blocks, `gemmQuant` with int8
 * activations) on the avx512 path without AMX, where the int8 VNNI dot products beat bf16 weights with fp32
 * activations (no bf16 tiles there); else `'bf16'` (with {@link draftHeadActivations}).
 */
export function draftHeadFormat(): 'bf16' | 'q8_0' {
  const i = isa();
  return i.isa === 'avx512' && !i.amxAvailable ? 'q8_0' : 'bf16';
}

/** The target's lmHead, bound. @throws {DrafterError} when the target stage has none (not the last stage). */
function requireLmHead(target: StageModel): (x: Float32Array, rows: number) => Float32Array {
  const lmHead = target.lmHead;
  if (lmHead === undefined)
    throw new DrafterError('draft head: the target stage exposes no lmHead (the draft head reuses the target lm_head)');
  return lmHead.bind(target);
}

/**
 * Drafts of one row block: token ids `[k]`, and when sampled q `[k, Vd]` f32 over the draft vocabulary: `probsIds`
 * (the head's ids, `[Vd]`) names a reduced one's columns; absent, q covers the whole vocabulary.
 */
export interface HeadDrafts {
  readonly tokens: Int32Array;
  readonly probs?: Float32Array;
  readonly probsIds?: Int32Array;
  /** With `withConfidence`: per draft, its distribution's largest probability `[k]` f32 ({@link draftsFromLogits}). */
  readonly confidence?: Float32Array;
}

/** {@link draftsFromLogits}'s q supports, reused call after call. */
let headSupport = new Int32Array(0);

/**
 * Drafts from draft-head logits `[k, Vd]` f32 over the draft vocabulary `ids` `[Vd]` (undefined: the whole vocabulary,
 * Vd = vocabSize): greedy (temperature 0) the argmax of each row; sampled, q = the request's temperature / top-k /
 * top-p over the draft vocabulary (core's `samplingProbs`), d ~ q, and q returned over the draft vocabulary `[k, Vd]`
 * with `probsIds = ids` (q is 0 outside it; core's `fullDraftProbs` writes it out). With `withConfidence`, also each
 * draft's confidence `[k]` f32: greedy, softmax's largest probability of its row (in the argmax's native call,
 * `argmaxProb`); sampled, the largest entry of its q row, read before the draw. Tokens, q and the PRNG draws are the
 * same either way.
 */
export function draftsFromLogits(
  logits: Float32Array,
  k: number,
  ids: Int32Array | undefined,
  vocabSize: number,
  sampling: DraftSampling,
  rng: RandomSource,
  withConfidence = false,
): HeadDrafts {
  const Vd = ids?.length ?? vocabSize;
  if (sampling.temperature === 0) {
    const top = withConfidence ? argmaxProb(logits, Vd) : undefined;
    const tokens = top?.ids ?? argmax(logits, Vd);
    if (ids !== undefined) for (let j = 0; j < k; j++) tokens[j] = ids[tokens[j]!]!;
    return top === undefined ? { tokens } : { tokens, confidence: top.prob };
  }
  // q with each row's support (its kept tokens, few at the usual top-p): the confidence and the draws read only those
  if (headSupport.length < k * Vd) headSupport = new Int32Array(k * Vd);
  const support = { ids: headSupport.subarray(0, k * Vd), counts: new Int32Array(k) };
  const q = samplingProbs(logits, Vd, sampling, undefined, support);
  const tokens = new Int32Array(k);
  // each row's largest probability, read before the draws: the verify budget never sees the draft itself
  const confidence = withConfidence
    ? Float32Array.from({ length: k }, (_, j) => {
        const kept = supportOf(support, j, Vd);
        if (kept === undefined) return Number.NaN;
        let top = 0;
        for (const v of kept) if (q[j * Vd + v]! > top) top = q[j * Vd + v]!;
        return top;
      })
    : undefined;
  for (let j = 0; j < k; j++) {
    // a NaN row (no support) throws in the draw
    const d = sampleFromSupport(q.subarray(j * Vd, (j + 1) * Vd), supportOf(support, j, Vd), rng);
    tokens[j] = ids === undefined ? d : ids[d]!;
  }
  const c = confidence === undefined ? {} : { confidence };
  return ids === undefined ? { tokens, probs: q, ...c } : { tokens, probs: q, probsIds: ids, ...c };
}

/** See the module comment. Create with {@link DraftHead.full} or {@link DraftHead.reduced}. */
export class DraftHead {
  private readonly lmHead: (x: Float32Array, rows: number) => Float32Array;

  private constructor(
    private readonly target: StageModel,
    /** Draft index → token id `[Vd]` (undefined: the whole vocabulary, index = id). */
    readonly ids: Int32Array | undefined,
    /**
     * The gathered rows `[Vd, D]` (or `[V, D]`, {@link DraftHead.packedFull}); undefined: the target's lmHead (and,
     * for a reduced vocabulary under tensor parallelism, the ids' columns of it).
     */
    private packed: PackedBf16Weights | undefined,
    /** The packed head's GEMM activations ({@link draftHeadActivations}). */
    readonly activations: GemmActivations = draftHeadActivations(),
    /** The gathered rows as Q8_0 blocks (`gemmQuant`, int8 activations; {@link draftHeadFormat}) instead of bf16. */
    private quant?: QuantizedWeights,
  ) {
    this.lmHead = requireLmHead(target);
  }

  /** The target's own lm_head over the whole vocabulary. */
  static full(target: StageModel): DraftHead {
    return new DraftHead(target, undefined, undefined);
  }

  /**
   * The whole vocabulary from a drafter-owned packed copy of the target's lm_head, in {@link draftHeadFormat}'s
   * format (see the module comment).
   */
  static packedFull(target: StageModel): DraftHead {
    const V = target.info.vocabSize;
    return DraftHead.packRows(
      target,
      Int32Array.from({ length: V }, (_, i) => i),
      undefined,
    );
  }

  /**
   * The reduced vocabulary `ids` (validated by {@link readDraftVocabIds}). `gather`: pack the rows now (one
   * lm_head GEMM of D rows); false under tensor parallelism (every propose then runs the whole vocab-parallel
   * lmHead and keeps the ids' columns).
   */
  static reduced(target: StageModel, ids: Int32Array, gather: boolean): DraftHead {
    return gather ? DraftHead.packRows(target, ids, ids) : new DraftHead(target, ids, undefined);
  }

  /**
   * A head over the lm_head rows `rows` (gathered once), in {@link draftHeadFormat}'s format (Q8_0 needs the hidden
   * size a multiple of 32, else bf16); `ids`: the draft vocabulary (undefined: `rows` is the whole vocabulary).
   */
  private static packRows(target: StageModel, rows: Int32Array, ids: Int32Array | undefined): DraftHead {
    const D = target.info.hiddenSize;
    const w = gatherLmHeadRows(target, rows);
    if (draftHeadFormat() === 'q8_0' && D % 32 === 0)
      return new DraftHead(
        target,
        ids,
        undefined,
        'f32',
        quantizedWeights(quantizeQ8_0(w, rows.length, D), 'q8_0', rows.length, D),
      );
    return new DraftHead(target, ids, packBf16Weights(f32ToBf16(w), rows.length, D));
  }

  /** Vd: the draft vocabulary's size (V for the whole vocabulary). */
  get size(): number {
    return this.ids?.length ?? this.target.info.vocabSize;
  }

  /**
   * Draft logits of `x [rows, D]` f32 (final-normed hidden states) → `[rows, Vd]` f32, written into `out` `[rows, Vd]`
   * when given and this head owns its rows (else a fresh array). Under tensor parallelism a collective (the target's
   * vocab-parallel lmHead).
   */
  logits(x: Float32Array, rows: number, out?: Float32Array): Float32Array {
    const ids = this.ids;
    if (this.quant !== undefined) return gemmQuant(x, rows, this.quant, out, 'int8');
    if (this.packed !== undefined) return gemmBf16(x, rows, this.packed, out, this.activations);
    if (ids === undefined) return this.lmHead(x, rows);
    const V = this.target.info.vocabSize;
    const all = this.lmHead(x, rows);
    const y = new Float32Array(rows * ids.length);
    for (let r = 0; r < rows; r++) for (let j = 0; j < ids.length; j++) y[r * ids.length + j] = all[r * V + ids[j]!]!;
    return y;
  }

  /** Token id of draft index `j`. */
  tokenOf(j: number): number {
    return this.ids === undefined ? j : this.ids[j]!;
  }

  /** Drafts from `logits [k, Vd]` f32 ({@link draftsFromLogits} over this head's vocabulary). */
  drafts(
    logits: Float32Array,
    k: number,
    sampling: DraftSampling,
    rng: RandomSource,
    withConfidence = false,
  ): HeadDrafts {
    return draftsFromLogits(logits, k, this.ids, this.target.info.vocabSize, sampling, rng, withConfidence);
  }

  /** Drops the packed rows. */
  dispose(): void {
    this.packed = undefined;
    this.quant = undefined;
  }
}
