/**
 * Loading an EAGLE-3 checkpoint (EAGLE-3 or vLLM speculators layout; eagle3.ts, module comment): the
 * checks against the target, the packed weights of the whole draft model or of one tensor-parallel
 * rank's shard, and one pipeline stage's share of the context projection.
 */

import {
  DrafterError,
  DraftKvCache,
  DraftShard,
  TapProjection,
  WeightReader,
  draftShardLayout,
  hasTreeCommit,
  packLinear,
  projectionFormatOf,
  isQ8_0Format,
  q8_0Blocker,
  type BlockLinear,
  type DrafterLoadOptions,
  type DrafterShardLoadOptions,
  type DrafterSource,
  type ProjectionLoadOptions,
  type ShardPart,
} from '@specd/core';

import { EAGLE3_DEFAULT_DRAFT_TOKENS, parseEagle3Settings, type Eagle3Config } from './config.js';
import { Eagle3Drafter } from './eagle3.js';
import { Eagle3CudaDrafter, cudaDeviceOf, type CudaTargetDevice } from './eagle3-cuda.js';
import type { Eagle3Weights } from './eagle3-model.js';

/** Weight-name prefixes of the decoder layer: EAGLE-3 layout, then the speculators layout. */
export const EAGLE3_LAYER_PREFIXES: readonly string[] = Object.freeze(['midlayer.', 'layers.0.']);

/**
 * One pipeline stage's share of an EAGLE-3 checkpoint's context projection
 * (`DrafterPlugin.loadProjection`, REFERENCE.md §8): the `[D, D]` column blocks of `fc.weight` for
 * `options.taps` only — bit for bit the blocks {@link loadEagle3Drafter} packs.
 * @throws {DrafterError} if the hidden size differs from the target's, `fc` is mis-shaped, or a tap is not
 *   the drafter's.
 */
export function loadEagle3Projection(
  source: DrafterSource,
  config: Eagle3Config,
  options: ProjectionLoadOptions,
): TapProjection {
  const where = `eagle3: ${source.dir}`;
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

/**
 * Checks the draft → target map against itself and against `t2d` (checkpoint sanity): `d2t` must be one-to-one
 * (two draft ids for one target id would split its probability), and `t2d` — when present, `[vocab_size]`
 * BOOL / U8 / I32 / I64, nonzero where a target id is in the draft vocabulary (EAGLE-3's `t2d`) — must mark
 * exactly the ids `d2t` reaches.
 * @param draftToTarget `[draft_vocab_size]` target ids (d2t applied: `i + d2t[i]`).
 * @throws {DrafterError} naming the first draft id mapped twice, or the first id where the two maps disagree.
 */
export function checkVocabularyMaps(
  source: DrafterSource,
  where: string,
  draftToTarget: Int32Array,
  vocabSize: number,
): void {
  const reached = new Int32Array(vocabSize).fill(-1);
  for (let i = 0; i < draftToTarget.length; i++) {
    const id = draftToTarget[i]!;
    if (reached[id] !== -1)
      throw new DrafterError(
        `${where}: d2t maps draft ids ${reached[id]} and ${i} both to target id ${id} (the map must be one-to-one)`,
      );
    reached[id] = i;
  }
  if (!source.weights.has('t2d')) return;
  const ti = source.weights.info('t2d');
  if (ti.shape.length !== 1 || ti.shape[0] !== vocabSize)
    throw new DrafterError(`${where}: t2d is [${ti.shape.join(', ')}], expected [${vocabSize}] (vocab_size)`);
  if (!['BOOL', 'U8', 'I32', 'I64'].includes(ti.dtype))
    throw new DrafterError(`${where}: t2d: expected dtype BOOL, U8, I32 or I64, got ${ti.dtype}`);
  const raw = source.weights.read('t2d').data;
  for (let id = 0; id < vocabSize; id++) {
    const marked = raw instanceof BigInt64Array ? raw[id] !== 0n : raw[id] !== 0;
    if (marked !== (reached[id] !== -1))
      throw new DrafterError(
        marked
          ? `${where}: t2d marks target id ${id} as in the draft vocabulary, but no d2t entry maps to it`
          : `${where}: d2t maps draft id ${reached[id]} to target id ${id}, which t2d does not mark`,
      );
  }
}

/**
 * Loads an EAGLE-3 checkpoint for `options.target` where the deployment config's `drafter.device` puts it
 * (`options.settings.device`): `"auto"` (default) — on the target's GPU when the target stage runs on one
 * ({@link cudaDeviceOf}: the CUDA Llama stage, `--device cuda`), else on the CPU; `"cpu"`; `"cuda"`. `tree` and
 * `weights: "q8_0"` keep `"auto"` on the CPU. The plugin's `load`.
 * @throws {DrafterError} for `device` `"cuda"` with a target that is not on a GPU, `"cuda"` with `tree` or with
 *   `weights` `"q8_0"` (both CPU only), and as {@link loadEagle3Drafter}.
 */
export function loadEagle3(
  source: DrafterSource,
  config: Eagle3Config,
  options: DrafterLoadOptions,
): Eagle3Drafter | Eagle3CudaDrafter {
  const settings = parseEagle3Settings(options.settings);
  const device = settings.device ?? 'auto';
  const cuda = device === 'cpu' ? undefined : cudaDeviceOf(options.target);
  if (device === 'cuda' && cuda === undefined)
    throw new DrafterError(
      `eagle3: ${source.dir}: drafter.device "cuda": the target stage does not run on a GPU ` +
        '(run the target with --device cuda, or set drafter.device to "auto" or "cpu")',
    );
  if (cuda !== undefined && settings.tree !== undefined) {
    if (device === 'cuda')
      throw new DrafterError(
        `eagle3: ${source.dir}: drafter.device "cuda": tree drafting runs on the CPU only; use chain drafting ` +
          '(omit `tree`) or drafter.device "cpu"',
      );
    return buildEagle3(source, config, options, undefined).drafter as Eagle3Drafter;
  }
  if (cuda !== undefined && isQ8_0Format(settings.weights)) {
    if (device === 'cuda')
      throw new DrafterError(
        `eagle3: ${source.dir}: drafter.device "cuda": drafter.weights "${settings.weights}" runs on the CPU ` +
          'only; use drafter.weights "bf16" or drafter.device "cpu"',
      );
    return buildEagle3(source, config, options, undefined).drafter as Eagle3Drafter;
  }
  return buildEagle3(source, config, options, undefined, cuda).drafter;
}

/**
 * Loads an EAGLE-3 checkpoint (EAGLE-3 or speculators layout) for `options.target` (validated against
 * it) and packs its weights for the CPU drafter, whatever the target runs on (the `device` setting is not read:
 * {@link loadEagle3} chooses the device). `options.settings` (the config's `drafter` branch) may set
 * `num_draft_tokens` (the chain length; default the checkpoint's `speculative_tokens`, else 6), `tree` and `weights`
 * (`"q8_0"`: the decoder layer's projections and the lm_head quantized to Q8_0, core's `q8_0Linear`).
 * Weight names: `fc.weight`, `<prefix>{input_layernorm, hidden_norm, post_attention_layernorm,
 * self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj}.weight` with prefix `midlayer.` or `layers.0.`,
 * `norm.weight`, `lm_head.weight`, `d2t` (I64 or I32; required unless draft_vocab_size = vocab_size,
 * then the identity; one-to-one); `t2d`, when present, must agree with `d2t` ({@link checkVocabularyMaps});
 * `embed_tokens.weight` is not read (the target's embedding is used; the runtime warns that it is ignored).
 * With `tree` (all-attention targets only), `maxDraftTokens` = `tree.total_tokens` (`num_draft_tokens`
 * is then not used).
 * @throws {DrafterError} if `weights` is `"q8_0"` and a projection's input width is not a multiple of 32, if `tree`
 *   is set on a target that cannot verify trees (its
 *   `StageInfo.treeVerificationBlocker`, named; or no `TreeCommit` capability), hidden or vocabulary sizes differ from
 *   the target's, `fc` is not `[hidden, taps × hidden]`, a tap is beyond the target's layers, the
 *   target lacks `embedTokens`, `d2t` is missing or maps outside the target vocabulary, or a tensor
 *   is missing / mis-shaped.
 */
export function loadEagle3Drafter(
  source: DrafterSource,
  config: Eagle3Config,
  options: DrafterLoadOptions,
): Eagle3Drafter {
  return buildEagle3(source, config, options, undefined).drafter as Eagle3Drafter;
}

/**
 * Loads rank `options.comm.rank`'s shard of an EAGLE-3 checkpoint (module comment, "Tensor
 * parallelism"): SPMD — `writeProjectedContextKV` and `propose` run the group's collectives (call
 * them on every rank at once; rank 0's results are the real ones, other ranks' `propose` returns
 * `[]`); `projectTargetHiddenPartial` works on rank 0 only. Reports its reads through `options.onReads`.
 * @throws {DrafterError} when tp does not fit the heads / KV heads / intermediate width (counts
 *   named), for `tree` with tp > 1 (trees need a target without linear-attention layers, and only Kimi
 *   has `loadShard`), for `weights` `"q8_0"` with tp > 1, and as {@link loadEagle3Drafter} (target checks on rank 0
 *   only).
 */
export function loadEagle3Shard(
  source: DrafterSource,
  config: Eagle3Config,
  options: DrafterShardLoadOptions,
): Eagle3Drafter {
  const where = `eagle3: ${source.dir}`;
  if (options.comm.size > 1 && parseEagle3Settings(options.settings).tree !== undefined) {
    throw new DrafterError(
      `${where}: tree drafting is not supported under tensor parallelism (tp = ${options.comm.size}); ` +
        'use chain drafting (omit `tree`)',
    );
  }
  const layout = draftShardLayout(
    { heads: config.numHeads, kvHeads: config.numKvHeads, intermediate: config.intermediateSize },
    options.comm,
    where,
  );
  const { drafter, reads } = buildEagle3(source, config, options, new DraftShard(options.comm, layout));
  options.onReads?.(reads);
  return drafter as Eagle3Drafter;
}

/**
 * The checks against the target and the weights, then the CPU drafter (`cuda` undefined; the rank's shard under
 * `tp`) or the GPU drafter on `cuda` (whole model, chains only: the caller refuses `tree` and `tp` with it).
 */
function buildEagle3(
  source: DrafterSource,
  config: Eagle3Config,
  options: DrafterLoadOptions,
  tp: DraftShard | undefined,
  cuda?: CudaTargetDevice,
): { drafter: Eagle3Drafter | Eagle3CudaDrafter; reads: WeightReader['reads'] } {
  const c = config;
  const t = options.target;
  const info = t.info;
  const root = tp === undefined || tp.isRoot;
  const where = `eagle3: ${source.dir}`;
  const settings = parseEagle3Settings(options.settings);
  const tree = settings.tree;
  // a tree is verified in one target forward with a tree attention mask: ask the target whether it can
  if (tree !== undefined && info.treeVerificationBlocker !== undefined)
    throw new DrafterError(
      `eagle3: EAGLE-3 tree drafting needs per-branch linear-attention state, which targets with ` +
        `${info.treeVerificationBlocker} do not have; use chain drafting (omit \`tree\`)`,
    );
  // fail closed: a target that does not declare the TreeCommit capability cannot commit a tree path
  if (tree !== undefined && !hasTreeCommit(t))
    throw new DrafterError(
      `eagle3: EAGLE-3 tree drafting needs a target that verifies token trees (the TreeCommit capability, ` +
        `\`commitTreePath\`); this target (${info.numLayers} layers) has none; use chain drafting (omit \`tree\`)`,
    );
  if (c.hiddenSize !== info.hiddenSize)
    throw new DrafterError(`${where}: hidden_size ${c.hiddenSize} differs from the target's ${info.hiddenSize}`);
  if (c.vocabSize !== info.vocabSize)
    throw new DrafterError(`${where}: vocab_size ${c.vocabSize} differs from the target's ${info.vocabSize}`);
  if (c.draftVocabSize > c.vocabSize)
    throw new DrafterError(`${where}: draft_vocab_size ${c.draftVocabSize} exceeds vocab_size ${c.vocabSize}`);
  const r = new WeightReader(source.weights, {
    makeError: (m) => new DrafterError(`${where}: ${m}`),
    ...(source.sanity === undefined ? {} : { sanity: source.sanity }),
  });
  const D = c.hiddenSize;
  // the GPU drafter reads fc whole below (the CPU drafter's TapProjection.read checks it the same way)
  if (cuda !== undefined) {
    const shape = r.shape('fc.weight');
    if (shape.length !== 2 || shape[0] !== D || shape[1] !== c.taps.length * D)
      throw new DrafterError(
        `${where}: fc.weight is [${shape.join(', ')}], expected [${D}, ${c.taps.length * D}] ` +
          `(hidden ${D}, taps × hidden = ${c.taps.length} × ${D})`,
      );
  }
  const bad = c.taps.filter((tap) => tap > info.numLayers);
  if (bad.length > 0) {
    throw new DrafterError(
      `${where}: eagle_aux_hidden_state_layer_ids [${c.taps.join(', ')}] name taps [${bad.join(', ')}] ` +
        `the target does not have (it has taps 0..${info.numLayers}, ${info.numLayers} layers)`,
    );
  }
  if (root && t.embedTokens === undefined)
    throw new DrafterError(`${where}: the target stage exposes no embedTokens (EAGLE-3 reuses the target's embedding)`);
  const Vd = c.draftVocabSize;
  let draftToTarget: Int32Array;
  if (!root) {
    draftToTarget = new Int32Array(0); // the drafts are rank 0's
  } else if (source.weights.has('d2t')) {
    const ti = source.weights.info('d2t');
    const n = ti.shape.reduce((a, b) => a * b, 1);
    if (n !== Vd)
      throw new DrafterError(`${where}: d2t is [${ti.shape.join(', ')}], expected [${Vd}] (draft_vocab_size)`);
    const raw = source.weights.read('d2t').data;
    draftToTarget = new Int32Array(Vd);
    for (let i = 0; i < Vd; i++) {
      let off: number;
      if (raw instanceof BigInt64Array) off = Number(raw[i]!);
      else if (raw instanceof Int32Array) off = raw[i]!;
      else throw new DrafterError(`${where}: d2t: expected dtype I64 or I32, got ${ti.dtype}`);
      const id = i + off;
      if (!(id >= 0 && id < info.vocabSize))
        throw new DrafterError(
          `${where}: d2t[${i}] = ${off} maps draft id ${i} to ${id}, ` +
            `outside the target vocabulary [0, ${info.vocabSize})`,
        );
      draftToTarget[i] = id;
    }
    checkVocabularyMaps(source, where, draftToTarget, c.vocabSize);
  } else if (Vd === c.vocabSize) {
    draftToTarget = Int32Array.from({ length: Vd }, (_, i) => i);
  } else {
    throw new DrafterError(
      `${where}: checkpoint has no tensor "d2t" (the draft → target vocabulary map), ` +
        `required since draft_vocab_size ${Vd} < vocab_size ${c.vocabSize}`,
    );
  }
  const p = EAGLE3_LAYER_PREFIXES.find((x) => r.has(`${x}self_attn.q_proj.weight`));
  if (p === undefined)
    throw new DrafterError(
      `${where}: checkpoint has no decoder layer ` +
        '(neither "midlayer.self_attn.q_proj.weight" nor "layers.0.self_attn.q_proj.weight")',
    );
  const H = c.numHeads;
  const KV = c.numKvHeads;
  const hd = c.headDim;
  const I = c.intermediateSize;
  const [q, k, v] = ['q_proj', 'k_proj', 'v_proj'].map((n) => `${p}self_attn.${n}.weight`) as [string, string, string];
  const maxDraftTokens =
    tree?.totalTokens ?? settings.numDraftTokens ?? c.speculativeTokens ?? EAGLE3_DEFAULT_DRAFT_TOKENS;
  if (cuda !== undefined) {
    // row-major bf16 as the device runner takes them (q|k|v and gate|up stacked by rows)
    const drafter = Eagle3CudaDrafter.create(
      c,
      cuda,
      {
        fc: r.bf16('fc.weight', [D, c.taps.length * D]),
        qkv: r.bf16Rows([q, k, v], [H * hd, KV * hd, KV * hd], 2 * D),
        o: r.bf16(`${p}self_attn.o_proj.weight`, [D, H * hd]),
        gateUp: r.bf16Rows([`${p}mlp.gate_proj.weight`, `${p}mlp.up_proj.weight`], [I, I], D),
        down: r.bf16(`${p}mlp.down_proj.weight`, [D, I]),
        lmHead: r.bf16('lm_head.weight', [Vd, D]),
        inputNorm: r.f32(`${p}input_layernorm.weight`, [D]),
        hiddenNorm: r.f32(`${p}hidden_norm.weight`, [D]),
        postNorm: r.f32(`${p}post_attention_layernorm.weight`, [D]),
        finalNorm: r.f32('norm.weight', [D]),
        draftToTarget,
      },
      { maxDraftTokens, maxSequences: options.maxSequences, maxTokensPerSequence: options.maxTokensPerSequence },
    );
    return { drafter, reads: r.reads };
  }
  // whole matrices, or the rank's blocks under tensor parallelism; fc, norm and lm_head on rank 0 only
  const shard = tp === undefined ? undefined : { layout: tp.layout, headDim: hd };
  const qPart: ShardPart = { name: q, n: H * hd, k: 2 * D, split: 'heads' };
  const kPart: ShardPart = { name: k, n: KV * hd, k: 2 * D, split: 'kvHeads' };
  const vPart: ShardPart = { name: v, n: KV * hd, k: 2 * D, split: 'kvHeads' };
  const oPart: ShardPart = { name: `${p}self_attn.o_proj.weight`, n: D, k: H * hd, split: 'headsIn' };
  const gatePart: ShardPart = { name: `${p}mlp.gate_proj.weight`, n: I, k: D, split: 'intermediate' };
  const upPart: ShardPart = { name: `${p}mlp.up_proj.weight`, n: I, k: D, split: 'intermediate' };
  const downPart: ShardPart = { name: `${p}mlp.down_proj.weight`, n: D, k: I, split: 'intermediateIn' };
  // the `weights` setting: whole matrices quantized to Q8_0 (the default for a whole draft model whose input widths
  // are multiples of 32), or packed bf16 (the default for a shard: the rank's blocks under tensor parallelism)
  const blocker = q8_0Blocker([2 * D, H * hd, D, I], tp?.comm.size ?? 1);
  if (isQ8_0Format(settings.weights) && blocker !== undefined)
    throw new DrafterError(`${where}: drafter.weights "${settings.weights}" ${blocker}; use "bf16"`);
  const format = settings.weights ?? (tp !== undefined || blocker !== undefined ? 'bf16' : 'q8_0');
  // fc (the context projection) on rank 0 only under tensor parallelism: core projects there; in the layers' format
  const fcFormat = projectionFormatOf(format);
  const projection = TapProjection.read(r, 'fc.weight', D, c.taps, where, root ? c.taps : [], fcFormat);
  /** Row blocks `parts` stacked (one `k`), as one linear map (a default Q8_0 keeps a non-finite matrix bf16). */
  const linear = (parts: readonly ShardPart[], sh = shard): BlockLinear =>
    packLinear(r, parts, sh, format, settings.weights === undefined);
  const w: Eagle3Weights = {
    projection,
    inputNorm: r.f32(`${p}input_layernorm.weight`, [D]),
    hiddenNorm: r.f32(`${p}hidden_norm.weight`, [D]),
    postNorm: r.f32(`${p}post_attention_layernorm.weight`, [D]),
    ...(root ? { finalNorm: r.f32('norm.weight', [D]) } : {}),
    q: linear([qPart]),
    qkv: linear([qPart, kPart, vPart]),
    kv: linear([kPart, vPart]),
    o: linear([oPart]),
    gateUp: linear([gatePart, upPart]),
    down: linear([downPart]),
    ...(root
      ? {
          // whole on rank 0 (never sharded)
          lmHead: linear([{ name: 'lm_head.weight', n: Vd, k: D, split: 'replicated' }], undefined),
        }
      : {}),
    draftToTarget,
  };
  // temporary entries per propose: a chain's k − 1, a tree's frontier width × (depth − 1) at most
  const temp =
    tree === undefined
      ? maxDraftTokens
      : Math.max(
          maxDraftTokens,
          Math.min(tree.topK, Vd, tree.totalTokens) * (Math.min(tree.depth, tree.totalTokens) - 1),
        );
  const numPages = DraftKvCache.pagesFor(options.maxSequences, options.maxTokensPerSequence + temp);
  return {
    drafter: Object.assign(new Eagle3Drafter(c, t, w, maxDraftTokens, numPages, options.maxSequences, tree, tp), {
      confidence: settings.confidence === true,
    }),
    reads: r.reads,
  };
}
