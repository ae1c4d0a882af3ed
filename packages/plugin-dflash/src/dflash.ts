/**
 * The DFlash drafter (block diffusion; z-lab/dflash, arXiv 2602.06036; REFERENCE.md §3). Oracle:
 * tools/reference/specd_ref/dflash.py (`DFlashDraft.context`, `forward_blocks`) and
 * tools/reference/eval_tau.py (`Proposer.propose`).
 *
 * - Context (per committed token): f = hidden_norm(Σ_i h_i · fc_iᵀ) — the sum over taps is
 *   accumulated in fp32 per stage (`projectTargetHiddenPartial`), the norm applied once after it
 *   (`writeProjectedContextKV`); then per draft layer K = RoPE(k_norm(k_proj f)), V = v_proj f,
 *   written into that layer's draft KV pages at the tokens' absolute positions. No input_layernorm on f.
 * - Block (per step): [last verified token, MASK × (B − 1)] at positions p … p + B − 1, embedded
 *   with the target's embedding. Each layer: x = input_layernorm(h); Q, K, V from x (q/k norm,
 *   RoPE); the block's K/V are written after the context (temporarily); attention over context +
 *   block — full-attention layers non-causal, sliding layers causal with the window; o_proj,
 *   residual, post_attention_layernorm, SwiGLU MLP, residual. Then `norm` and the draft head (the target's
 *   lm_head, or its rows of FR-Spec's reduced draft vocabulary: draft-head.ts); slot j (1 … B − 1) predicts the
 *   token at position p + j. The block's KV is discarded after.
 * - Confidence (`DraftProposal.confidence`; setting `confidence`, default true; the CPU drafter): c_j = max_x q_j(x),
 *   the largest probability of slot j's draft distribution (greedy: softmax of the draft logits, one native
 *   `argmaxProb` call; sampled: of q after temperature / top-k / top-p) — EAGLE-2's draft-probability score (Li et
 *   al., arXiv 2406.16858, §4). The cost policy calibrates it to acceptance online and verifies draft j only while
 *   the calibrated survival clears the step's threshold (core's draft-policy.ts, verify budgets). Every slot of a
 *   block comes from one forward over the context, before any draft is drawn, so whether a draft is verified never
 *   depends on a draft's value: lossless. Measured: docs/BENCHMARKS.md, "DFlash's confidences".
 *
 * Prefill/decode disaggregation ({@link DraftContextTransfer}): the context is the draft KV pages alone (fc,
 * hidden_norm and the K/V path are applied when it is written), entries `'draft-kv'` layer j part `'k'` / `'v'`;
 * a sliding layer's entries hold only its window's last rows. Loaded with `pdFeatures`
 * ({@link DraftContextFeatures}), the draft KV cache also keeps each context row's projected feature (the fp32 sum,
 * before hidden_norm): D can receive those instead (`'draft-features'`) and rebuild the K/V rows from them with the
 * same path (`pdRebuildFromFeatures`).
 *
 * Draft KV: core's {@link DraftKvCache} — K and V of every draft layer (pool "layers" 2j and 2j + 1),
 * `numKvHeads · headDim` f32 per token, NHD pages (@specd/native's `pagedAttention` layout); one block
 * table per sequence shared by all layers. Sequence bookkeeping (add / free / context length / pages in
 * use) is core's {@link DrafterBase}.
 *
 * Tensor parallelism ({@link loadDFlashShard}; core's `DrafterPlugin.loadShard`): rank r of N holds
 * q_proj rows of its heads, k/v_proj rows of its KV heads (one replicated head when N exceeds the KV
 * heads), o_proj columns of its heads, gate/up rows and down columns of its I/N (core's
 * `draftShardLayout`); norms replicated; fc on rank 0 only. Its draft KV pool holds its KV heads only.
 * Per layer h += allReduce(o_r(attn_r(norm h))), h += allReduce(down_r(swiglu(gateUp_r(norm h))));
 * the block's embeddings are rank 0's, broadcast; the target's lm_head is vocab-parallel (every rank
 * passes the same rows to its target shard's `lmHead`, which all-gathers the vocabulary slices;
 * Megatron-LM, Shoeybi et al. 2019 §3; vLLM `ParallelLMHead`); sampling runs on rank 0 only.
 */

import {
  CheckpointSanity,
  DrafterBase,
  DrafterError,
  DraftKvCache,
  DraftShard,
  TapProjection,
  WeightReader,
  denseBlock,
  denseBlockOutput,
  draftShardLayout,
  keptScratch,
  packLinear,
  projectionFormatOf,
  blockDrafterWeightsDefault,
  isQ8_0Format,
  q8_0Blocker,
  applyBlockLinear,
  type BlockLinear,
  type DraftWeightFormat,
  sliceColumns,
  type ContextSpan,
  type DenseBlockWeights,
  type DraftContextFeatures,
  type DrafterDevice,
  type DraftContextTransfer,
  type DraftBatch,
  type DrafterLoadOptions,
  type DrafterShardLoadOptions,
  type DrafterSource,
  type DraftProposal,
  type LocalEntry,
  type MemoryRegion,
  type PagedKvPool,
  type ProjectionFormat,
  type ProjectionLoadOptions,
  type SequenceId,
  type ShardPart,
  type StageInfo,
  type StageModel,
} from '@specd/core';
import { applyRope, f32ToBf16, makePagedBatch, pagedAttention, rmsNorm, rmsNormPerHead } from '@specd/native';

import { dflashTaps, type DFlashConfig } from './config.js';
import {
  DFlashCudaDrafter,
  dflashCudaDeviceOf,
  type DFlashCudaDevice,
  type DFlashCudaLayerWeights,
} from './dflash-cuda.js';
import { DraftHead, gatherLmHeadRows, readDraftVocabIds } from './draft-head.js';

/** A draft layer's context-KV path (all a context-KV-only drafter loads). */
interface DraftLayerKvWeights {
  /** k_proj ; v_proj stacked: `[2·KV·hd, D]`. */
  readonly kv: BlockLinear;
  readonly kNorm: Float32Array;
}

/** The rest of a draft layer (the block forward only): core's dense block weights plus the attention's own. */
interface DraftLayerBlockWeights extends DenseBlockWeights {
  readonly sliding: boolean;
  /**
   * q_proj ; k_proj ; v_proj stacked: `[(H + 2·KV)·hd, D]` — the block's queries, keys and values in one GEMM
   * (each output column is its own dot product, so the same bits as q_proj and the context path's k/v GEMM).
   */
  readonly qkv: BlockLinear;
  readonly qNorm: Float32Array;
}

/** A draft layer: its KV path, and the block weights unless loaded context-KV-only. */
interface DraftLayerWeights extends DraftLayerKvWeights {
  readonly block?: DraftLayerBlockWeights;
}

/** Which parts of a checkpoint {@link loadDFlashDrafter} loads. */
export interface DFlashLoadParts {
  /**
   * Context-KV-only (a prefill-only producer): load only `fc`, `hidden_norm` and each layer's
   * k_proj / v_proj / k_norm — the projection and the draft KV path; the block forward (q / o /
   * MLP / layer norms / final norm) is not loaded, so `runBlocks` / `propose` throw. The target
   * then needs no embedTokens / lmHead. Default false (everything).
   */
  readonly contextOnly?: boolean;
  /**
   * Draft from a drafter-owned packed bf16 copy of the target's lm_head instead of the target's own (setting
   * `draft_head: "packed"`; draft-head.ts, {@link DraftHead.packedFull}); whole vocabulary, no tensor parallelism
   * only. Default false.
   */
  readonly packedHead?: boolean;
  /**
   * Draft over the whole vocabulary even when the checkpoint lists a reduced one (setting `draft_vocab: "whole"`;
   * `draft_vocab_ids` is still validated). Default false (the checkpoint's list).
   */
  readonly wholeVocab?: boolean;
  /**
   * Where the draft model runs (setting `device`; {@link loadDFlash}): `"auto"` (default), `"cpu"` or `"cuda"`.
   * {@link loadDFlashDrafter} itself always loads the CPU drafter.
   */
  readonly device?: DrafterDevice;
  /**
   * The draft layers' projections (setting `weights`, core's `draftWeightFormat`): `"bf16"` (packed bf16), `"q8_0"`
   * (q/k/v, o and the MLP quantized to GGUF Q8_0 at load, core's `q8_0Linear`: int16 activations, half the bytes) or
   * `"q8_0_int8"` (the same weights with int8 activations: half the dot-product work again); the Q8_0 formats on the
   * CPU drafter of a whole draft model only. Absent: core's `blockDrafterWeightsDefault` (`"q8_0_int8"` on AVX-512
   * without AMX, else `"bf16"`; a GPU drafter is bf16). The context projection fc follows (core's `projectionFormatOf`:
   * Q8_0 with int16 activations for either Q8_0 format). The draft head keeps its own format (draft-head.ts).
   */
  readonly weights?: DraftWeightFormat;
  /**
   * Whether proposals carry per-draft confidences (setting `confidence`; absent: {@link DFlashDrafter.confidence}'s
   * default, true).
   */
  readonly confidence?: boolean;
}

/**
 * Loads a DFlash checkpoint for `options.target` (validated against it) and packs its weights.
 * @throws {DrafterError} if the mask token is outside the target vocabulary, `fc` is not
 *   `[hidden, taps × hidden]`, a tap is beyond the target's layers, hidden sizes differ, the target
 *   lacks `embedTokens` / `lmHead`, a tensor is missing / mis-shaped, or `dflash_config.draft_vocab_size` is set and
 *   `draft_vocab_ids` is missing or not `[draft_vocab_size]` I32/I64 ids, strictly ascending, in the vocabulary
 *   (draft-head.ts `readDraftVocabIds`).
 */
export function loadDFlashDrafter(
  source: DrafterSource,
  config: DFlashConfig,
  options: DrafterLoadOptions,
  parts: DFlashLoadParts = {},
): DFlashDrafter {
  return buildDFlash(source, config, options, parts, undefined).drafter;
}

/**
 * Loads rank `options.comm.rank`'s shard of a DFlash checkpoint (module comment, "Tensor
 * parallelism"): an SPMD drafter whose `writeProjectedContextKV`, `propose` / `runBlocks` run the
 * group's collectives (call them on every rank at once; rank 0's results are the real ones; other
 * ranks' `propose` runs the block forward and the target shard's vocab-parallel `lmHead`, then
 * returns `[]`). `projectTargetHiddenPartial` works on rank 0 only (fc lives there).
 * Reports its reads through `options.onReads`.
 * @throws {DrafterError} when tp does not divide the heads / intermediate width, or neither tp
 *   divides the KV heads nor they divide tp (counts named); as {@link loadDFlashDrafter} otherwise
 *   (the target checks: embedTokens on rank 0, lmHead on every rank).
 */
export function loadDFlashShard(
  source: DrafterSource,
  config: DFlashConfig,
  options: DrafterShardLoadOptions,
  parts: DFlashLoadParts = {},
): DFlashDrafter {
  const layout = draftShardLayout(
    { heads: config.numHeads, kvHeads: config.numKvHeads, intermediate: config.intermediateSize },
    options.comm,
    `dflash: ${source.dir}`,
  );
  const { drafter, reads } = buildDFlash(source, config, options, parts, new DraftShard(options.comm, layout));
  options.onReads?.(reads);
  return drafter;
}

function buildDFlash(
  source: DrafterSource,
  config: DFlashConfig,
  options: DrafterLoadOptions,
  parts: DFlashLoadParts,
  tp: DraftShard | undefined,
): { drafter: DFlashDrafter; reads: WeightReader['reads'] } {
  const contextOnly = parts.contextOnly === true;
  const root = tp === undefined || tp.isRoot;
  const c = config;
  const t = options.target;
  const where = `dflash: ${source.dir}`;
  const r = checkTarget(source, c, t, contextOnly, root);
  const D = c.hiddenSize;
  const H = c.numHeads;
  const KV = c.numKvHeads;
  const hd = c.headDim;
  const I = c.intermediateSize;
  const layers: DraftLayerWeights[] = [];
  // whole matrices, or the rank's blocks under tensor parallelism
  const shard = tp === undefined ? undefined : { layout: tp.layout, headDim: hd };
  const blocker = q8_0Blocker([D, H * hd, I], tp?.comm.size ?? 1);
  if (isQ8_0Format(parts.weights) && blocker !== undefined)
    throw new DrafterError(`${where}: weights "${parts.weights}" ${blocker}; use "bf16"`);
  const weights = parts.weights ?? blockDrafterWeightsDefault(blocker);
  // fc (the context projection) lives on rank 0 only under tensor parallelism: core projects there. Its format follows
  // the draft layers' (Q8_0 with int16 activations for either Q8_0 format)
  const fcFormat = projectionFormatOf(weights);
  const projection = TapProjection.read(r, 'fc.weight', D, c.taps, where, root ? c.taps : [], fcFormat);
  /** Row blocks stacked (one `k`) as one linear map: packed bf16 (the rank's blocks), or Q8_0 (whole matrices). */
  const pack = (p: readonly ShardPart[]): BlockLinear => packLinear(r, p, shard, weights, parts.weights === undefined);
  for (let j = 0; j < c.numLayers; j++) {
    const p = `layers.${j}.`;
    const kvPath: DraftLayerKvWeights = {
      kv: pack([
        { name: `${p}self_attn.k_proj.weight`, n: KV * hd, k: D, split: 'kvHeads' },
        { name: `${p}self_attn.v_proj.weight`, n: KV * hd, k: D, split: 'kvHeads' },
      ]),
      kNorm: r.f32(`${p}self_attn.k_norm.weight`, [hd]),
    };
    layers.push(
      contextOnly
        ? kvPath
        : {
            ...kvPath,
            block: {
              sliding: c.layerTypes[j] === 'sliding_attention',
              inputNorm: r.f32(`${p}input_layernorm.weight`, [D]),
              postNorm: r.f32(`${p}post_attention_layernorm.weight`, [D]),
              // q | k | v in one GEMM for the block; k and v are packed a second time here (kv above serves the
              // context writes, which need no q): 2 · KV · hd · D bf16 more a layer, 0.44 MB on SmolLM2's DFlash
              qkv: pack([
                { name: `${p}self_attn.q_proj.weight`, n: H * hd, k: D, split: 'heads' },
                { name: `${p}self_attn.k_proj.weight`, n: KV * hd, k: D, split: 'kvHeads' },
                { name: `${p}self_attn.v_proj.weight`, n: KV * hd, k: D, split: 'kvHeads' },
              ]),
              o: pack([{ name: `${p}self_attn.o_proj.weight`, n: D, k: H * hd, split: 'headsIn' }]),
              qNorm: r.f32(`${p}self_attn.q_norm.weight`, [hd]),
              gateUp: pack([
                { name: `${p}mlp.gate_proj.weight`, n: I, k: D, split: 'intermediate' },
                { name: `${p}mlp.up_proj.weight`, n: I, k: D, split: 'intermediate' },
              ]),
              down: pack([{ name: `${p}mlp.down_proj.weight`, n: D, k: I, split: 'intermediateIn' }]),
            },
          },
    );
  }
  // a block's B rows are temporary: context + B per sequence at most
  const numPages = DraftKvCache.pagesFor(options.maxSequences, options.maxTokensPerSequence + c.blockSize);
  const finalNorm = contextOnly ? undefined : r.f32('norm.weight', [D]);
  // the draft vocabulary (FR-Spec): validated at load even context-KV-only; rows gathered only to draft
  const ids =
    c.draftVocabSize === undefined
      ? undefined
      : readDraftVocabIds(source.weights, c.draftVocabSize, c.vocabSize, where);
  const whole = ids === undefined || ids.length === c.vocabSize || parts.wholeVocab === true;
  const head = contextOnly
    ? undefined
    : !whole
      ? DraftHead.reduced(t, ids, tp === undefined)
      : parts.packedHead === true && tp === undefined
        ? DraftHead.packedFull(t)
        : DraftHead.full(t);
  const drafter = new DFlashDrafter(
    c,
    t,
    projection,
    r.f32('hidden_norm.weight', [D]),
    finalNorm,
    layers,
    numPages,
    tp,
    head,
    options.pdFeatures === true && tp === undefined,
  );
  if (parts.confidence !== undefined) drafter.confidence = parts.confidence;
  return { drafter, reads: r.reads };
}

/**
 * The checks of a DFlash checkpoint against its target (module comment of {@link loadDFlashDrafter}'s errors); → the
 * weight reader over it. `contextOnly`: the block forward is not loaded (no embedding / lm_head needed); `root`: this
 * rank embeds (rank 0 under tensor parallelism).
 */
function checkTarget(
  source: DrafterSource,
  c: DFlashConfig,
  t: StageModel,
  contextOnly: boolean,
  root: boolean,
): WeightReader {
  const info = t.info;
  const where = `dflash: ${source.dir}`;
  if (c.maskTokenId >= info.vocabSize) {
    throw new DrafterError(
      `${where}: dflash_config.mask_token_id ${c.maskTokenId} is outside the target vocabulary [0, ${info.vocabSize})`,
    );
  }
  if (c.hiddenSize !== info.hiddenSize)
    throw new DrafterError(`${where}: hidden_size ${c.hiddenSize} differs from the target's ${info.hiddenSize}`);
  // DFlash drafts with the target's lm_head: a checkpoint made for another vocabulary drafts ids of another tokenizer
  if (c.vocabSize !== info.vocabSize)
    throw new DrafterError(`${where}: vocab_size ${c.vocabSize} differs from the target's ${info.vocabSize}`);
  const sanity = source.sanity ?? new CheckpointSanity();
  const r = new WeightReader(source.weights, {
    makeError: (m) => new DrafterError(`dflash: ${source.dir}: ${m}`),
    sanity,
  });
  const bad = c.taps.filter((tap) => tap > info.numLayers);
  if (bad.length > 0) {
    throw new DrafterError(
      `${where}: dflash_config.target_layer_ids [${c.targetLayerIds.join(', ')}] name taps [${bad.join(', ')}] ` +
        `the target does not have (it has taps 0..${info.numLayers}, ${info.numLayers} layers)`,
    );
  }
  // under tensor parallelism the embedding is rank 0's, the lm_head vocab-parallel (every rank's target shard has one)
  if (!contextOnly && ((root && t.embedTokens === undefined) || t.lmHead === undefined))
    throw new DrafterError(
      `${where}: the target stage exposes no embedTokens / lmHead (DFlash reuses the target's embedding and lm_head)`,
    );
  if (!contextOnly && root) checkMaskEmbedding(sanity, where, t, c.maskTokenId);
  return r;
}

/**
 * Loads a DFlash checkpoint where the config's `device` setting puts it (`parts.device`): `"auto"` (default) — on the
 * target's GPU when the target stage runs on one ({@link dflashCudaDeviceOf}: the CUDA Llama stage, `--device cuda`)
 * and the draft model has full-attention layers only, else on the CPU; `"cpu"`; `"cuda"`. Context-KV-only loads stay
 * on the CPU. The plugin's `load`.
 * @throws {DrafterError} for `device` `"cuda"` with a target that is not on a GPU, a sliding-window draft layer or
 *   `draft_head: "packed"` (a CPU format), and as {@link loadDFlashDrafter}.
 */
export function loadDFlash(
  source: DrafterSource,
  config: DFlashConfig,
  options: DrafterLoadOptions,
  parts: DFlashLoadParts = {},
): DFlashDrafter | DFlashCudaDrafter {
  const device = parts.device ?? 'auto';
  const where = `dflash: ${source.dir}: device "cuda"`;
  const cuda = device === 'cpu' || parts.contextOnly === true ? undefined : dflashCudaDeviceOf(options.target);
  if (device === 'cuda') {
    if (cuda === undefined)
      throw new DrafterError(
        `${where}: the target stage does not run on a GPU` +
          (parts.contextOnly === true ? ' (or the drafter is loaded context-KV-only, a CPU path)' : '') +
          ' (run the target with --device cuda, or set device to "auto" or "cpu")',
      );
    if (config.layerTypes.some((l) => l !== 'full_attention'))
      throw new DrafterError(`${where}: sliding-window draft layers run on the CPU only (set device to "cpu")`);
    if (parts.packedHead === true)
      throw new DrafterError(`${where}: draft_head "packed" is a CPU format (the GPU drafter packs its own head)`);
    if (isQ8_0Format(parts.weights))
      throw new DrafterError(
        `${where}: weights "${parts.weights}" is a CPU format (set weights to "bf16" or device to "cpu")`,
      );
  }
  if (
    cuda === undefined ||
    config.layerTypes.some((l) => l !== 'full_attention') ||
    parts.packedHead === true ||
    isQ8_0Format(parts.weights)
  )
    return loadDFlashDrafter(source, config, options, parts);
  return buildDFlashCuda(source, config, options, parts, cuda);
}

/** The GPU drafter: the checks of {@link buildDFlash}, then the weights as the device runner takes them. */
function buildDFlashCuda(
  source: DrafterSource,
  c: DFlashConfig,
  options: DrafterLoadOptions,
  parts: DFlashLoadParts,
  cuda: DFlashCudaDevice,
): DFlashCudaDrafter {
  const t = options.target;
  const where = `dflash: ${source.dir}`;
  const r = checkTarget(source, c, t, false, true);
  const D = c.hiddenSize;
  const H = c.numHeads;
  const KV = c.numKvHeads;
  const hd = c.headDim;
  const I = c.intermediateSize;
  const shape = r.shape('fc.weight');
  if (shape.length !== 2 || shape[0] !== D || shape[1] !== c.taps.length * D)
    throw new DrafterError(
      `${where}: fc.weight is [${shape.join(', ')}], expected [${D}, ${c.taps.length * D}] ` +
        `(hidden ${D}, taps × hidden = ${c.taps.length} × ${D})`,
    );
  const layers: DFlashCudaLayerWeights[] = [];
  for (let j = 0; j < c.numLayers; j++) {
    const p = `layers.${j}.`;
    // row-major bf16 as the device runner takes them (q|k|v and gate|up stacked by rows)
    layers.push({
      qkv: r.bf16Rows(
        ['q_proj', 'k_proj', 'v_proj'].map((n) => `${p}self_attn.${n}.weight`),
        [H * hd, KV * hd, KV * hd],
        D,
      ),
      o: r.bf16(`${p}self_attn.o_proj.weight`, [D, H * hd]),
      gateUp: r.bf16Rows([`${p}mlp.gate_proj.weight`, `${p}mlp.up_proj.weight`], [I, I], D),
      down: r.bf16(`${p}mlp.down_proj.weight`, [D, I]),
      inputNorm: r.f32(`${p}input_layernorm.weight`, [D]),
      postNorm: r.f32(`${p}post_attention_layernorm.weight`, [D]),
      qNorm: r.f32(`${p}self_attn.q_norm.weight`, [hd]),
      kNorm: r.f32(`${p}self_attn.k_norm.weight`, [hd]),
    });
  }
  const reduced =
    c.draftVocabSize === undefined
      ? undefined
      : readDraftVocabIds(source.weights, c.draftVocabSize, c.vocabSize, where);
  const ids =
    reduced === undefined || reduced.length === c.vocabSize || parts.wholeVocab === true ? undefined : reduced;
  // the draft head's rows gathered once through the target's lmHead (exact: bf16 values in f32 round back to the bits)
  const headIds = ids ?? Int32Array.from({ length: c.vocabSize }, (_, i) => i);
  const head = f32ToBf16(gatherLmHeadRows(t, headIds));
  return DFlashCudaDrafter.create(
    c,
    cuda,
    {
      fc: r.bf16('fc.weight', [D, c.taps.length * D]),
      hiddenNorm: r.f32('hidden_norm.weight', [D]),
      finalNorm: r.f32('norm.weight', [D]),
      layers,
      head,
      ids,
    },
    { maxSequences: options.maxSequences, maxTokensPerSequence: options.maxTokensPerSequence },
  );
}

/** A mask-token embedding whose norm is below this fraction of the median row norm draws a warning. */
export const DFLASH_MASK_NORM_MIN_FRACTION = 0.01;

/**
 * Warns when the target's embedding of the mask token has near-zero norm (below
 * {@link DFLASH_MASK_NORM_MIN_FRACTION} of the median norm of 64 rows spread over the vocabulary): every
 * mask slot of a block then starts from nothing but its position, and τ drops (issue 15's fuzz run: from 2.5
 * to 1.2 on kimi-k3-tiny). Verification keeps the output lossless, so this is a warning, not a refusal.
 */
export function checkMaskEmbedding(sanity: CheckpointSanity, where: string, target: StageModel, maskId: number): void {
  if (target.embedTokens === undefined) return;
  const V = target.info.vocabSize;
  const D = target.info.hiddenSize;
  const norm = (e: Float32Array, row: number) => {
    let s = 0;
    for (let i = row * D; i < (row + 1) * D; i++) s += e[i]! * e[i]!;
    return Math.sqrt(s);
  };
  const sample = Int32Array.from({ length: Math.min(64, V) }, (_, i) => Math.floor((i * V) / Math.min(64, V)));
  const rows = target.embedTokens(sample);
  const norms = Array.from(sample, (_, i) => norm(rows, i)).sort((a, b) => a - b);
  const median = norms[norms.length >> 1]!;
  const mask = norm(target.embedTokens(Int32Array.of(maskId)), 0);
  if (mask < DFLASH_MASK_NORM_MIN_FRACTION * median)
    sanity.warn(
      `${where}: the target's embedding of dflash_config.mask_token_id ${maskId} has norm ${mask.toPrecision(3)}, ` +
        `under ${DFLASH_MASK_NORM_MIN_FRACTION} × the median row norm ${median.toPrecision(3)}: drafts will be ` +
        'poor (acceptance falls) — check mask_token_id against the tokenizer the drafter was trained with',
    );
}

/**
 * One pipeline stage's share of a DFlash checkpoint's context projection
 * (`DrafterPlugin.loadProjection`, REFERENCE.md §8): the `[D, D]` column blocks of `fc.weight` for
 * `options.taps` only — bit for bit the blocks {@link loadDFlashDrafter} packs, so the stage adds the
 * same products the whole drafter would.
 * @param method the error prefix (`'dspark'` for DSpark's backbone).
 * @throws {DrafterError} if the hidden size differs from the target's, `fc` is mis-shaped, or a tap is not the
 *   drafter's.
 */
export function loadDFlashProjection(
  source: DrafterSource,
  config: DFlashConfig,
  options: ProjectionLoadOptions,
  method = 'dflash',
): TapProjection {
  const where = `${method}: ${source.dir}`;
  if (config.hiddenSize !== options.hiddenSize)
    throw new DrafterError(
      `${where}: hidden_size ${config.hiddenSize} differs from the target's ${options.hiddenSize}`,
    );
  const r = new WeightReader(source.weights, {
    makeError: (m) => new DrafterError(`${where}: ${m}`),
    ...(source.sanity === undefined ? {} : { sanity: source.sanity }),
  });
  return TapProjection.read(r, 'fc.weight', config.hiddenSize, config.taps, where, options.taps, options.format);
}

/** A loaded DFlash drafter bound to one target stage. */
export class DFlashDrafter extends DrafterBase implements DraftContextTransfer, DraftContextFeatures {
  readonly method = 'dflash';
  readonly maxDraftTokens: number;
  /** The draft model's `max_position_embeddings` (the engine stops drafting before a block would reach it). */
  readonly maxPosition?: number;
  /** Draft KV (see the module comment). */
  readonly kv: DraftKvCache;
  /** Query heads, KV heads and intermediate width this rank computes (the whole model's without tensor parallelism). */
  private readonly heads: number;
  private readonly kvHeads: number;
  private readonly inter: number;
  /** The dense block's intermediates, kept between draft blocks (core's `keptScratch`). */
  private readonly blockScratch = keptScratch();
  /** Whether proposals carry per-draft `confidence` (the setting `confidence`, default true; the module comment). */
  confidence = true;

  constructor(
    readonly config: DFlashConfig,
    private readonly target: StageModel,
    /** fc's column blocks, one per tap: the context projection (core's accumulate-by-tap {@link TapProjection}). */
    private projection: TapProjection,
    private readonly hiddenNorm: Float32Array,
    /** The final `norm`; undefined when loaded context-KV-only. */
    private readonly finalNorm: Float32Array | undefined,
    private layers: DraftLayerWeights[],
    numPages: number,
    /** The rank's tensor-parallel group and blocks; undefined = the whole draft model on this thread. */
    readonly tp?: DraftShard,
    /** The draft head (the target's lm_head, or FR-Spec's reduced vocabulary); undefined when context-KV-only. */
    private head?: DraftHead,
    /** Keep each context row's projected feature for PD (`DrafterLoadOptions.pdFeatures`). */
    pdFeatures = false,
  ) {
    const kvHeads = tp?.kvHeads ?? config.numKvHeads;
    const kv = new DraftKvCache({
      numLayers: config.layerTypes.length,
      numKvHeads: kvHeads,
      totalKvHeads: config.numKvHeads,
      headDim: config.headDim,
      numPages,
      ...(pdFeatures ? { featureWidth: config.hiddenSize } : {}),
    });
    super(kv);
    const c = config;
    this.kv = kv;
    this.maxDraftTokens = c.blockSize - 1;
    if (c.maxPositionEmbeddings !== undefined) this.maxPosition = c.maxPositionEmbeddings;
    this.heads = tp?.heads ?? c.numHeads;
    this.kvHeads = kvHeads;
    this.inter = tp?.intermediate ?? c.intermediateSize;
  }

  /** The draft KV pages (block tables, token offsets, K/V stores). */
  get pool(): PagedKvPool {
    return this.kv.pool;
  }

  /**
   * Whether only the projection and the draft KV path are loaded ({@link DFlashLoadParts.contextOnly}): no block
   * forward.
   */
  get contextOnly(): boolean {
    return this.finalNorm === undefined;
  }

  override captureSetter(target: StageInfo): readonly number[] {
    return dflashTaps(this.config, target);
  }

  /** The context projection's weight format (its `weights` setting's: see {@link DFlashLoadParts.weights}). */
  get projectionFormat(): ProjectionFormat {
    return this.projection.format;
  }

  override projectTargetHiddenPartial(
    stageTaps: ReadonlyMap<number, Float32Array>,
    numTokens: number,
    accumulator?: Float32Array,
  ): Float32Array {
    return this.projection.projectTargetHiddenPartial(stageTaps, numTokens, accumulator);
  }

  override writeProjectedContextKV(sum: Float32Array, spans: readonly ContextSpan[]): void {
    const c = this.config;
    const n = spans.reduce((a, s) => a + s.numTokens, 0);
    if (sum.length !== n * c.hiddenSize)
      throw new DrafterError(
        `dflash: writeProjectedContextKV: sum: expected [${n}, ${c.hiddenSize}] f32, got length ${sum.length}`,
      );
    if (n === 0) return;
    for (const s of spans) this.checkContextPosition(s, 'writeProjectedContextKV');
    const positions = new Int32Array(n);
    let at = 0;
    for (const s of spans) for (let i = 0; i < s.numTokens; i++) positions[at++] = s.position + i;
    this.kv.extendAll(spans);
    if (this.kv.features !== undefined) this.kv.writeFeatures(spans, sum);
    this.writeContextRows(sum, positions, this.kv.slots(spans));
  }

  /** Each draft layer's K/V of context rows from their projected features `sum` `[n, D]` at `positions`, `slots`. */
  private writeContextRows(sum: Float32Array, positions: Int32Array, slots: Int32Array): void {
    const f = rmsNorm(sum, this.hiddenNorm, this.config.rmsNormEps);
    this.layers.forEach((w, j) => {
      const [k, v] = this.keysValues(w, f, positions);
      this.kv.write(j, k, v, slots);
    });
  }

  propose(batch: DraftBatch): DraftProposal[] {
    const c = this.config;
    const B = c.blockSize;
    const seqs = batch.sequences;
    const S = seqs.length;
    const head = this.head;
    if (this.contextOnly)
      throw new DrafterError(
        'dflash: propose: this drafter was loaded in context-KV-only mode (projection and draft KV only, ' +
          'for a prefill-only producer); load it without contextOnly to draft',
      );
    if (head === undefined) throw new DrafterError('dflash: propose: the drafter is disposed');
    if (S === 0) return [];
    seqs.forEach((s, i) => {
      this.checkMaxDrafts(s, i, B - 1);
    });
    // slots 1 … k of every block (already final-normed; the last layer runs for them only) → the draft head: the
    // target's lm_head, or its rows of the draft vocabulary (under tensor parallelism a collective: every rank
    // passes the same rows to its target shard's vocab-parallel lmHead)
    const rowsOf = seqs.map((s) => s.maxDrafts);
    const R = rowsOf.reduce((a, b) => a + b, 0);
    // x and the logits are consumed here (the proposals keep only tokens and fresh q rows): kept buffers
    const x = this.runBlocks(seqs, { first: 1, counts: rowsOf }); // [R, D]
    const logits = head.logits(x, R, this.blockScratch('dflash.logits', R * head.size)); // [R, Vd]
    let at = 0;
    if (this.tp !== undefined && !this.tp.isRoot) return []; // sampling is rank 0's
    const Vd = head.size;
    const out: DraftProposal[] = [];
    at = 0;
    for (const s of seqs) {
      const k = s.maxDrafts;
      const d = head.drafts(logits.subarray(at * Vd, (at + k) * Vd), k, s.sampling, s.rng, this.confidence);
      at += k;
      const p: DraftProposal =
        d.probs === undefined
          ? { id: s.id, tokens: d.tokens }
          : {
              id: s.id,
              tokens: d.tokens,
              probs: d.probs,
              ...(d.probsIds === undefined ? {} : { probsIds: d.probsIds }),
            };
      out.push(d.confidence === undefined ? p : { ...p, confidence: d.confidence });
    }
    return out;
  }

  /**
   * Runs one draft block per sequence — [lastToken, MASK × (B − 1)] at positions p … p + B − 1
   * against the sequence's draft context — and returns the hidden states of every slot after the
   * final `norm`, `[S · B, D]` f32 (sequence-major). The block's KV is discarded afterwards. The
   * shared backbone of DFlash and of block drafters built on it (e.g. DSpark).
   *
   * With `keep`, only slots `keep.first … keep.first + keep.counts[i] − 1` of sequence i come back,
   * `[Σ counts, D]` f32 (sequence-major), and the last layer computes only what they need: its K/V for every
   * slot (the block's attention is bidirectional, so every slot's key is seen), its queries, attention, o_proj,
   * MLP and the final norm for the kept slots only. The same bits as those rows of the whole block: every step
   * is row-wise (the GEMMs' row invariance, RMSNorm, RoPE) or per query (the paged attention's batch
   * invariance: a query's output does not depend on which other queries run). A last layer with a sliding window
   * (its mask depends on the query's position in the block) runs whole. A DFlash step drafting k of 15 saves
   * 15 − k rows of the last layer's MLP, o_proj and attention.
   * @throws {DrafterError} if a sequence's position is not its draft context length, or `keep` names slots
   *   outside the block or has a count per sequence missing.
   */
  runBlocks(
    seqs: readonly { readonly id: SequenceId; readonly position: number; readonly lastToken: number }[],
    keep?: { readonly first: number; readonly counts: readonly number[] },
  ): Float32Array {
    const c = this.config;
    const B = c.blockSize;
    const H = this.heads;
    const hd = c.headDim;
    const S = seqs.length;
    const N = S * B;
    seqs.forEach((s, i) => {
      this.checkProposePosition(s, i);
    });
    const finalNorm = this.finalNorm;
    if (finalNorm === undefined)
      throw new DrafterError('dflash: runBlocks: this drafter was loaded in context-KV-only mode (no block forward)');
    if (keep !== undefined) this.checkKeep(keep, S, B);
    if (S === 0) return new Float32Array(0);
    const tokens = new Int32Array(N).fill(c.maskTokenId);
    const positions = new Int32Array(N);
    seqs.forEach((s, i) => {
      tokens[i * B] = s.lastToken;
      for (let j = 0; j < B; j++) positions[i * B + j] = s.position + j;
    });
    // the block's rows are temporary: written after the context, dropped afterwards
    const blockRows = seqs.map((s) => ({ id: s.id, position: s.position, numTokens: B }));
    return this.kv.withRows(blockRows, () => {
      const slots = this.kv.slots(blockRows);
      const attnBatch = makePagedBatch(
        seqs.map((s) => ({ qLen: B, kvLen: s.position + B, pages: this.pool.blockTable(s.id) })),
      );
      const h =
        this.tp === undefined ? this.target.embedTokens!(tokens) : this.tp.embed(this.target, tokens, c.hiddenSize);
      // without tensor parallelism no reduce: core's dense block then adds o_proj and down_proj into h in one call each
      const block = {
        eps: c.rmsNormEps,
        intermediate: this.inter,
        scratch: this.blockScratch,
        ...(this.tp === undefined ? {} : { reduce: (x: Float32Array) => this.reduce(x) }),
      };
      const Q = H * hd;
      const W = this.kvHeads * hd;
      // the block's q (all N rows, q/k norms and RoPE applied) and its K/V written after the context; → q
      const queries = (j: number, w: DraftLayerWeights, x: Float32Array): Float32Array => {
        const b = w.block!;
        // one GEMM for the block's q | k | v
        const qkv = applyBlockLinear(b.qkv, x, N, this.blockScratch('dflash.qkv', N * (Q + 2 * W)));
        const q = sliceColumns(qkv, N, Q + 2 * W, 0, Q, this.blockScratch('dflash.q', N * Q));
        rmsNormPerHead(q, H, b.qNorm, c.rmsNormEps, undefined, q);
        applyRope(q, positions, { heads: H, headDim: hd, theta: c.ropeTheta, style: 'neox' }, q);
        const [k, v] = this.normRopeKeys(w, qkv, Q, positions);
        this.kv.write(j, k, v, slots);
        return q;
      };
      const attentionOptions = (b: DraftLayerBlockWeights) => ({
        numHeads: H,
        scale: 1 / Math.sqrt(hd),
        mask: b.sliding ? ('causal' as const) : ('non-causal' as const),
        slidingWindow: b.sliding ? c.slidingWindow : 0,
      });
      const L = this.layers.length;
      const last = this.layers[L - 1]!;
      const R = keep === undefined ? N : keep.counts.reduce((a, n) => a + n, 0);
      // the last layer for the kept slots only (doc above): not when it is whole anyway or slides
      const prune = keep !== undefined && R < N && !last.block!.sliding;
      for (const [j, w] of this.layers.entries()) {
        if (prune && j === L - 1) break;
        const b = w.block!; // present whenever finalNorm is
        // core's dense block around DFlash's attention: q/k norms, RoPE, the block's K/V after the context
        denseBlock(
          h,
          N,
          b,
          (x) => {
            const q = queries(j, w, x);
            const out = this.blockScratch('dflash.attn', N * Q);
            return pagedAttention(
              q,
              this.kv.keys(j),
              this.kv.values(j),
              this.kv.layout,
              attnBatch,
              attentionOptions(b),
              out,
            );
          },
          block,
        );
      }
      if (keep === undefined) return rmsNorm(h, finalNorm, c.rmsNormEps);
      // the kept slots' rows of [S·B, ·] f32 `src` (width cols) → [R, cols]
      const gather = (src: Float32Array, cols: number, out: Float32Array): Float32Array => {
        let at = 0;
        seqs.forEach((_, i) => {
          const n = keep.counts[i]!;
          const from = i * B + keep.first;
          out.set(src.subarray(from * cols, (from + n) * cols), at * cols);
          at += n;
        });
        return out;
      };
      const D = c.hiddenSize;
      if (R === 0) return new Float32Array(0);
      if (!prune) return gather(rmsNorm(h, finalNorm, c.rmsNormEps), D, this.blockScratch('dflash.kept', R * D));
      const b = last.block!;
      const q = gather(
        queries(L - 1, last, rmsNorm(h, b.inputNorm, c.rmsNormEps, this.blockScratch('block.xn', N * D))),
        Q,
        this.blockScratch('dflash.qKept', R * Q),
      );
      const keptBatch = makePagedBatch(
        seqs.flatMap((s, i) =>
          keep.counts[i]! === 0
            ? []
            : [{ qLen: keep.counts[i]!, kvLen: s.position + B, pages: this.pool.blockTable(s.id) }],
        ),
      );
      const a = pagedAttention(
        q,
        this.kv.keys(L - 1),
        this.kv.values(L - 1),
        this.kv.layout,
        keptBatch,
        attentionOptions(b),
        this.blockScratch('dflash.attn', R * Q),
      );
      const hKept = denseBlockOutput(gather(h, D, this.blockScratch('dflash.kept', R * D)), a, R, b, block);
      return rmsNorm(hKept, finalNorm, c.rmsNormEps, hKept);
    });
  }

  /** @throws {DrafterError} unless `keep` names slots inside a block of B, one count ≥ 0 per sequence. */
  private checkKeep(keep: { readonly first: number; readonly counts: readonly number[] }, S: number, B: number): void {
    const { first, counts } = keep;
    if (!Number.isInteger(first) || first < 0 || first >= B)
      throw new DrafterError(`dflash: runBlocks: keep.first must be an integer in [0, ${B}), got ${first}`);
    if (counts.length !== S)
      throw new DrafterError(
        `dflash: runBlocks: keep.counts must have one count per sequence (${S}), got ${counts.length}`,
      );
    counts.forEach((n, i) => {
      if (!Number.isInteger(n) || n < 0 || first + n > B)
        throw new DrafterError(
          `dflash: runBlocks: keep.counts[${i}] must be an integer in [0, ${B - first}] (slots from ${first} in a ` +
            `block of ${B}), got ${n}`,
        );
    });
  }

  /** PD: the K and V page stores of every draft layer (core's helper over the draft KV cache). */
  pdRegions(): readonly MemoryRegion[] {
    return [...this.draftKvRegions(), ...this.draftFeatureRegions()];
  }

  /** PD: floats per projected feature (the hidden size) when loaded with `pdFeatures`, else 0. */
  get pdFeatureWidth(): number {
    return this.kv.features === undefined ? 0 : this.config.hiddenSize;
  }

  /** PD: the feature pages of the rows D rebuilds (every row unless every layer slides; core's helper). */
  pdFeatureEntries(id: SequenceId): readonly LocalEntry[] {
    return this.draftFeatureEntries(id, (j) => this.slidingWindow(j));
  }

  /**
   * PD (decode side), once the features arrived: each layer's K/V of rows [first sent row, L) rebuilt from them by
   * the path P wrote them with (hidden_norm, k_proj / v_proj, k_norm, RoPE: row by row, so the same bits).
   */
  pdRebuildFromFeatures(id: SequenceId): number {
    if (this.kv.features === undefined)
      throw new DrafterError('dflash: pdRebuildFromFeatures: the drafter was loaded without features (pdFeatures)');
    const from = this.featureRowsFrom(id, (j) => this.slidingWindow(j));
    const to = this.kv.contextLength(id);
    if (to === from) return 0;
    const positions = Int32Array.from({ length: to - from }, (_, i) => from + i);
    const rows = [{ id, position: from, numTokens: to - from }];
    this.writeContextRows(this.kv.readFeatures(id, from, to), positions, this.kv.slots(rows));
    return to - from;
  }

  /**
   * The attention window of draft layer `layer`, positions: `sliding_window` for a `sliding_attention` layer, 0 for a
   * full one (config `layer_types`).
   */
  slidingWindow(layer: number): number {
    return this.config.layerTypes[layer] === 'sliding_attention' ? this.config.slidingWindow : 0;
  }

  /**
   * PD: the sequence's draft KV pages, `'draft-kv'` layer j part `'k'` / `'v'` — DFlash's whole context, except
   * that a sliding layer sends only the pages of its window's last rows (core's `draftKvEntries`).
   */
  pdContextEntries(id: SequenceId): readonly LocalEntry[] {
    return this.draftKvEntries(id, (j) => this.slidingWindow(j));
  }

  /** PD (decode side): allocates the pages of a `length`-row draft context for the transfer to fill. */
  pdReserveContext(id: SequenceId, length: number): void {
    this.reserveDraftContext(id, length);
  }

  /** The draft head: its vocabulary ({@link DraftHead.ids}) and logits (shared with block drafters on DFlash). */
  get draftHead(): DraftHead | undefined {
    return this.head;
  }

  override dispose(): void {
    this.layers = [];
    this.head?.dispose();
    this.head = undefined;
    this.projection.dispose();
    super.dispose();
  }

  /** The rank's row-parallel partial summed over the ranks (identity without tensor parallelism). */
  private reduce(x: Float32Array): Float32Array {
    return this.tp === undefined ? x : this.tp.reduce(x);
  }

  /**
   * K = RoPE(k_norm(k_proj x)), V = v_proj x for rows x `[n, D]` at `positions [n]` → `[n, KV, hd]` f32 each
   * (KV = the rank's KV heads).
   */
  private keysValues(w: DraftLayerKvWeights, x: Float32Array, positions: Int32Array): [Float32Array, Float32Array] {
    return this.normRopeKeys(w, applyBlockLinear(w.kv, x, positions.length), 0, positions);
  }

  /**
   * K = RoPE(k_norm(k)), V = v from projected rows `proj [n, from + 2·KV·hd]` whose columns [from, from + KV·hd)
   * are k_proj's and the next KV·hd v_proj's → `[n, KV, hd]` f32 each.
   */
  private normRopeKeys(
    w: DraftLayerKvWeights,
    proj: Float32Array,
    from: number,
    positions: Int32Array,
  ): [Float32Array, Float32Array] {
    const c = this.config;
    const n = positions.length;
    const W = this.kvHeads * c.headDim;
    const width = n === 0 ? from + 2 * W : proj.length / n;
    const k = sliceColumns(proj, n, width, from, W);
    const v = sliceColumns(proj, n, width, from + W, W);
    rmsNormPerHead(k, this.kvHeads, w.kNorm, c.rmsNormEps, undefined, k);
    applyRope(k, positions, { heads: this.kvHeads, headDim: c.headDim, theta: c.ropeTheta, style: 'neox' }, k);
    return [k, v];
  }
}
