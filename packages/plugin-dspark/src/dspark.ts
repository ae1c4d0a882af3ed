/**
 * The DSpark drafter (DeepSpec): the DFlash block-diffusion backbone (context projection, draft KV,
 * one block per step — reused from @specd/plugin-dflash, {@link DFlashDrafter.runBlocks}) with
 * next-token slots, a Markov head and a confidence head. Oracle: tools/reference/specd_ref/dflash.py
 * (module docstring, `markov_bias`, `confidence`) and tools/reference/eval_tau.py (`Proposer.propose`).
 *
 * - Slots: block [last verified token, MASK × (B − 1)] at positions p … p + B − 1; slot j (0 … B − 1)
 *   predicts the NEXT token, at p + j + 1 → up to B drafts.
 * - Markov head, left to right: logits_j = lm_head(h_j) + W2 · W1[x_j], x_j = the token at p + j
 *   (the last verified token for j = 0, else draft j − 1); W1 = markov_head.embed `[V, r]`,
 *   W2 = markov_head.proj `[V, r]` (bf16, or Q8_0 where the draft layers are: `markovProj`). Greedy: argmax;
 *   sampled: q_j = samplingProbs(logits_j), d_j ~ q_j (q returned for rejection sampling).
 * - Reduced draft vocabulary (FR-Spec, arXiv 2502.14856; `dflash_config.draft_vocab_size` and the checkpoint's
 *   `draft_vocab_ids`, the backbone's draft head: @specd/plugin-dflash `DraftHead`): lm_head and W2 keep the listed
 *   ids' rows only, the drafts are listed ids (x_j stays a token id for W1), a sampled q is 0 off the list.
 * - Confidence head: c_j = sigmoid(w · [h_j; W1[x_j]] + b) (h_j after the final norm), returned as
 *   the proposal's `confidence` (setting `confidence`, default true; false: proposals carry none). c_j depends on
 *   the token BEFORE draft j (x_j), never on d_j, so the engine's cost policy may cut a proposal to its survival
 *   budget Π c_l ≥ λ losslessly (adaptive verification lives in core: engine/draft-policy.ts; nothing here names
 *   it).
 * - Context-KV-only mode (settings `context_only: true` or `DrafterLoadOptions.contextOnly`): only
 *   the projection (fc, hidden_norm) and each layer's k_proj / v_proj / k_norm are loaded — for a
 *   prefill-only producer that writes draft KV and never drafts; `propose` throws.
 * - Prefill/decode disaggregation ({@link DraftContextTransfer}): the context is the backbone's draft KV
 *   pages (`'draft-kv'` layer j part `'k'` / `'v'`); the heads keep nothing per sequence (x_0 is the last
 *   verified token, which travels with the request), so a context-KV-only P feeds a full D. As DFlash's: a
 *   sliding layer sends its window's rows only, and with `pdFeatures` the projected features may travel instead
 *   ({@link DraftContextFeatures}, the backbone rebuilds).
 * - Tensor parallelism ({@link loadDSparkShard}): the backbone sharded as DFlash's
 *   (`loadDFlashShard`); every rank passes the same rows to its target shard's vocab-parallel
 *   `lmHead` (a collective); the Markov and confidence heads on rank 0 only, which alone runs them.
 */

import {
  accumulateBlockLinear,
  blockDrafterWeightsDefault,
  draftWeightFormat,
  DrafterBase,
  DrafterError,
  WeightReader,
  sampleFromSupport,
  samplingProbs,
  supportOf,
  type ContextSpan,
  type DraftBatch,
  type DraftContextFeatures,
  type DraftContextTransfer,
  type DrafterLoadOptions,
  type DrafterShardLoadOptions,
  type DrafterSource,
  type DraftProposal,
  type LocalEntry,
  type MemoryRegion,
  type SequenceId,
  type TensorRead,
  type ProjectionFormat,
  type StageInfo,
  type StageModel,
  keptScratch,
  q8_0Blocker,
  q8_0LinearIfFinite,
  type BlockLinear,
} from '@specd/core';
import { argmax, packBf16Weights } from '@specd/native';
import { dflashConfidence, loadDFlashDrafter, loadDFlashShard, type DFlashDrafter } from '@specd/plugin-dflash';

import type { DSparkConfig } from './config.js';

/**
 * Loads a DSpark checkpoint for `options.target`: the DFlash backbone (validated as DFlash's) plus
 * the Markov and confidence heads.
 * @throws {DrafterError} as {@link loadDFlashDrafter}, or if a head tensor is missing / mis-shaped.
 */
export function loadDSparkDrafter(
  source: DrafterSource,
  config: DSparkConfig,
  options: DrafterLoadOptions,
): DSparkDrafter {
  return buildDSpark(source, config, options, undefined);
}

/**
 * Loads rank `options.comm.rank`'s shard of a DSpark checkpoint: the DFlash backbone's shard
 * (`loadDFlashShard`: the rank's heads, KV heads and MLP block) and, on rank 0 only, the Markov and
 * confidence heads. SPMD as the backbone's (call `propose` etc. on every rank at once; other ranks'
 * `propose` runs the block forward and the target's vocab-parallel lm_head, then returns `[]`). Reports its reads
 * (backbone, then heads) through `options.onReads`.
 * @throws {DrafterError} as {@link loadDFlashShard} and {@link loadDSparkDrafter}.
 */
export function loadDSparkShard(
  source: DrafterSource,
  config: DSparkConfig,
  options: DrafterShardLoadOptions,
): DSparkDrafter {
  return buildDSpark(source, config, options, options);
}

function buildDSpark(
  source: DrafterSource,
  config: DSparkConfig,
  options: DrafterLoadOptions,
  shard: DrafterShardLoadOptions | undefined,
): DSparkDrafter {
  const contextOnly = options.contextOnly === true || options.settings?.context_only === true;
  const confidence = dflashConfidence(options.settings?.confidence, 'dspark');
  const parts = {
    contextOnly,
    wholeVocab: options.settings?.draft_vocab === 'whole',
    weights: draftWeightFormat('dspark', options.settings?.weights),
  };
  let backboneReads: readonly TensorRead[] = [];
  const backbone =
    shard === undefined
      ? loadDFlashDrafter(source, config, options, parts)
      : loadDFlashShard(source, config, { ...shard, onReads: (r) => (backboneReads = r) }, parts);
  if (contextOnly || (shard !== undefined && shard.comm.rank !== 0)) {
    shard?.onReads?.(backboneReads);
    return new DSparkDrafter(config, options.target, backbone, undefined, confidence !== false);
  }
  try {
    const r = new WeightReader(source.weights, {
      makeError: (m) => new DrafterError(`dspark: ${source.dir}: ${m}`),
      ...(source.sanity === undefined ? {} : { sanity: source.sanity }),
    });
    const V = options.target.info.vocabSize;
    const R = config.markovRank;
    const D = config.hiddenSize;
    // a reduced draft vocabulary (FR-Spec, the backbone's draft head): W2's rows of the listed ids only
    const ids = backbone.draftHead?.ids;
    // W2 as the draft layers' weights are (the backbone's `weights` setting or its default), with int16 activations:
    // Q8_0 reads half the bytes of bf16 each step (R a multiple of 32, whole matrices: not under tensor parallelism)
    const format =
      parts.weights ?? blockDrafterWeightsDefault(q8_0Blocker([D, R], shard === undefined ? 1 : shard.comm.size));
    const d = new DSparkDrafter(
      config,
      options.target,
      backbone,
      {
        embed: r.f32('markov_head.embed.weight', [V, R]),
        proj: markovProj(r, ids, V, R, format !== 'bf16' && R % 32 === 0 && shard === undefined),
        confW: r.f32('confidence_head.weight', [1, D + R]),
        confB: r.f32('confidence_head.bias', [1])[0]!,
      },
      confidence !== false,
    );
    shard?.onReads?.([...backboneReads, ...r.reads]);
    return d;
  } catch (err) {
    backbone.dispose();
    throw err;
  }
}

/**
 * markov_head.proj `[V, r]` bf16, or its rows `ids` only (a reduced draft vocabulary), as `[Vd, r]`: with `q8_0`,
 * core's `q8_0LinearIfFinite` (int16 activations; bf16 if a weight is not finite), else packed bf16.
 */
function markovProj(r: WeightReader, ids: Int32Array | undefined, V: number, R: number, q8_0: boolean): BlockLinear {
  const all = r.bf16('markov_head.proj.weight', [V, R]);
  let rows = all;
  if (ids !== undefined) {
    rows = new Uint16Array(ids.length * R);
    ids.forEach((id, j) => {
      rows.set(all.subarray(id * R, (id + 1) * R), j * R);
    });
  }
  const n = rows.length / R;
  return q8_0 ? q8_0LinearIfFinite(rows, n, R) : packBf16Weights(rows, n, R);
}

/** DSpark's own weights. */
export interface DSparkHeads {
  /** W1 = markov_head.embed `[V, r]` f32. */
  readonly embed: Float32Array;
  /**
   * W2 = markov_head.proj `[V, r]`, `[Vd, r]` (the listed ids' rows) with a reduced draft vocabulary: packed bf16, or
   * Q8_0 with the draft layers' Q8_0 formats ({@link markovProj}).
   */
  readonly proj: BlockLinear;
  /** confidence_head.weight `[D + r]` f32. */
  readonly confW: Float32Array;
  readonly confB: number;
}

/**
 * A loaded DSpark drafter bound to one target stage. Its draft context is the backbone's
 * (`backbone.kv`, shared): core's {@link DrafterBase} keeps the sequence bookkeeping on it.
 */
export class DSparkDrafter extends DrafterBase implements DraftContextTransfer, DraftContextFeatures {
  readonly method = 'dspark';
  /** block_size: every slot predicts the next token. */
  readonly maxDraftTokens: number;
  /** propose's head inputs and logits, kept between proposals (core's `keptScratch`; none leaves propose). */
  private readonly scratch = keptScratch();
  /** A sampled q row's support ids `[Vd]` (core's `samplingProbs`), kept between proposals. */
  private supportIds = new Int32Array(0);

  constructor(
    readonly config: DSparkConfig,
    private readonly target: StageModel,
    /** The DFlash backbone: context projection, draft KV, block forward. */
    readonly backbone: DFlashDrafter,
    /** The Markov and confidence heads; undefined when loaded context-KV-only (or disposed). */
    private heads: DSparkHeads | undefined,
    /**
     * Whether proposals carry the confidence head's per-draft `confidence` (setting `confidence`, default true; the
     * cost policy verifies a prefix of them by it). False: every proposed draft is verified.
     */
    readonly withConfidence = true,
  ) {
    super(backbone.kv);
    this.maxDraftTokens = config.blockSize;
  }

  /** {@link supportIds}, at least `n` long. */
  private support(n: number): Int32Array {
    if (this.supportIds.length < n) this.supportIds = new Int32Array(n);
    return this.supportIds.subarray(0, n);
  }

  /** Loaded in context-KV-only mode (see the module comment): projection and draft KV only, never drafts. */
  get contextOnly(): boolean {
    return this.backbone.contextOnly;
  }

  /** Draft KV (the backbone's). */
  get pool(): DFlashDrafter['pool'] {
    return this.backbone.pool;
  }

  override captureSetter(target: StageInfo): readonly number[] {
    return this.backbone.captureSetter(target);
  }

  /** The backbone's context projection format (its `weights` setting's). */
  get projectionFormat(): ProjectionFormat {
    return this.backbone.projectionFormat;
  }

  override projectTargetHiddenPartial(
    stageTaps: ReadonlyMap<number, Float32Array>,
    numTokens: number,
    accumulator?: Float32Array,
  ): Float32Array {
    return this.backbone.projectTargetHiddenPartial(stageTaps, numTokens, accumulator);
  }

  override writeProjectedContextKV(sum: Float32Array, spans: readonly ContextSpan[]): void {
    this.backbone.writeProjectedContextKV(sum, spans);
  }

  propose(batch: DraftBatch): DraftProposal[] {
    if (this.contextOnly) {
      throw new DrafterError(
        'dspark: propose: this drafter was loaded in context-KV-only mode (projection and draft KV only, ' +
          'for a prefill-only producer); load it without context_only to draft',
      );
    }
    const heads = this.heads;
    const worker = this.backbone.tp !== undefined && !this.backbone.tp.isRoot;
    if (heads === undefined && !worker) throw new DrafterError('dspark: propose: the drafter is disposed');
    const c = this.config;
    const B = c.blockSize;
    const D = c.hiddenSize;
    const R = c.markovRank;
    const V = this.target.info.vocabSize;
    const seqs = batch.sequences;
    const S = seqs.length;
    if (S === 0) return [];
    seqs.forEach((s, i) => {
      this.checkMaxDrafts(s, i, B);
    });
    // slots 0 … k − 1 of every block, final-normed (the backbone's last layer runs for them only): [Σ k, D],
    // sequence i's from row off[i]
    const h = this.backbone.runBlocks(seqs, { first: 0, counts: seqs.map((s) => s.maxDrafts) });
    const off = new Int32Array(seqs.length);
    for (let i = 1; i < seqs.length; i++) off[i] = off[i - 1]! + seqs[i - 1]!.maxDrafts;
    // slots 0 … k − 1 of every block → target lm_head (the Markov bias is added left to right below);
    // under tensor parallelism a collective: every rank passes the same rows to its target shard's lmHead.
    // Rows slot-major: slot j's rows (the sequences with maxDrafts > j, in batch order) from row first[j] on, so that
    // step j below adds its Markov bias in place to one contiguous block of the head's output.
    const maxK = Math.max(...seqs.map((s) => s.maxDrafts));
    const first = new Int32Array(maxK + 1);
    for (let j = 0; j < maxK; j++) first[j + 1] = first[j]! + seqs.filter((s) => j < s.maxDrafts).length;
    const Rows = first[maxK]!;
    const x = this.scratch('dspark.headIn', Rows * D);
    for (let j = 0, row = 0; j < maxK; j++)
      seqs.forEach((s, i) => {
        if (j < s.maxDrafts) x.set(h.subarray((off[i]! + j) * D, (off[i]! + j + 1) * D), row++ * D);
      });
    // the backbone's draft head: the target lm_head `[Rows, V]`, or the reduced vocabulary's rows `[Rows, Vd]`
    const head = this.backbone.draftHead;
    if (head === undefined) throw new DrafterError('dspark: propose: the drafter is disposed');
    const base = head.logits(x, Rows, this.scratch('dspark.base', Rows * head.size));
    if (heads === undefined) return []; // a worker rank of a tensor-parallel group: the heads are rank 0's
    const Vd = head.size;
    // per sequence (i: its index in seqs): drafts, confidences, q rows (temperature > 0) over the draft vocabulary:
    // [maxDrafts, Vd], the proposal's probsIds naming a reduced one's columns
    const outs = seqs.map((s, i) => ({
      i,
      s,
      tokens: new Int32Array(s.maxDrafts),
      conf: new Float32Array(s.maxDrafts),
      probs: s.sampling.temperature === 0 ? undefined : new Float32Array(s.maxDrafts * Vd),
    }));
    const prev = Int32Array.from(seqs, (s) => s.lastToken);
    const support = { ids: this.support(Vd), counts: new Int32Array(1) };
    for (let j = 0; j < maxK; j++) {
      const active = outs.filter(({ s }) => j < s.maxDrafts);
      const n = active.length;
      const e = new Float32Array(n * R);
      active.forEach(({ i }, a) => {
        const t = prev[i]!;
        if (!(t >= 0 && t < V))
          throw new DrafterError(`dspark: propose: sequences[${i}]: token ${t} is outside the vocabulary [0, ${V})`);
        e.set(heads.embed.subarray(t * R, (t + 1) * R), a * R);
      });
      // logits_j = lm_head(h_j) + W2 · W1[x_j]: the Markov bias added onto the base rows in place, base + bias each
      // rounded once in fp32 (core's accumulateBlockLinear), and the greedy drafts by native argmax
      const lgs = base.subarray(first[j]! * Vd, first[j + 1]! * Vd); // [n, Vd]
      accumulateBlockLinear(lgs, heads.proj, e, n, undefined, this.scratch);
      const greedy = active.some(({ probs: q }) => q === undefined) ? argmax(lgs, Vd) : undefined;
      active.forEach(({ i, s, tokens, conf, probs: q }, a) => {
        const lg = lgs.subarray(a * Vd, (a + 1) * Vd);
        // confidence: sigmoid(w · [h_j; W1[x_j]] + b)
        let z = heads.confB;
        const hj = (off[i]! + j) * D;
        for (let d = 0; d < D; d++) z += heads.confW[d]! * h[hj + d]!;
        for (let k = 0; k < R; k++) z += heads.confW[D + k]! * e[a * R + k]!;
        conf[j] = 1 / (1 + Math.exp(-z));
        let d: number;
        if (q === undefined) {
          d = greedy![a]!; // the first largest logit, as a left-to-right scan
        } else {
          // q_j written straight into the proposal's row j (draft-vocabulary columns); the draw reads its support
          const qj = samplingProbs(lg, Vd, s.sampling, q.subarray(j * Vd, (j + 1) * Vd), support);
          d = sampleFromSupport(qj, supportOf(support, 0, Vd), s.rng);
        }
        d = head.tokenOf(d);
        tokens[j] = d;
        prev[i] = d;
      });
    }
    const ids = head.ids;
    const withConf = (conf: Float32Array) => (this.withConfidence ? { confidence: conf } : {});
    return outs.map(({ s, tokens, conf, probs }) =>
      probs === undefined
        ? { id: s.id, tokens, ...withConf(conf) }
        : { id: s.id, tokens, probs, ...(ids === undefined ? {} : { probsIds: ids }), ...withConf(conf) },
    );
  }

  /** PD: the backbone's K and V page stores of every draft layer (core's helper over the shared draft KV cache). */
  pdRegions(): readonly MemoryRegion[] {
    return [...this.draftKvRegions(), ...this.draftFeatureRegions()];
  }

  /** PD: floats per projected feature when loaded with `pdFeatures` (the backbone's), else 0. */
  get pdFeatureWidth(): number {
    return this.backbone.pdFeatureWidth;
  }

  /** PD: the backbone's feature pages of the rows D rebuilds. */
  pdFeatureEntries(id: SequenceId): readonly LocalEntry[] {
    return this.draftFeatureEntries(id, (j) => this.backbone.slidingWindow(j));
  }

  /** PD (decode side): the backbone rebuilds its draft KV rows from the features (DSpark's heads keep nothing). */
  pdRebuildFromFeatures(id: SequenceId): number {
    return this.backbone.pdRebuildFromFeatures(id);
  }

  /**
   * PD: the sequence's draft KV pages, `'draft-kv'` layer j part `'k'` / `'v'` — DSpark's whole context, a sliding
   * backbone layer only its window's pages (as DFlash's).
   */
  pdContextEntries(id: SequenceId): readonly LocalEntry[] {
    return this.draftKvEntries(id, (j) => this.backbone.slidingWindow(j));
  }

  /** PD (decode side): allocates the pages of a `length`-row draft context for the transfer to fill. */
  pdReserveContext(id: SequenceId, length: number): void {
    this.reserveDraftContext(id, length);
  }

  /** Drops the heads and the backbone (its weights and the shared draft KV cache). */
  override dispose(): void {
    this.heads = undefined;
    this.backbone.dispose();
  }
}
