/**
 * The EAGLE-3 drafter, chain drafting and greedy EAGLE-2-style dynamic trees (SafeAILab/EAGLE, arXiv
 * 2503.01840; REFERENCE.md §5). Oracle: tools/reference/specd_ref/eagle3.py (`Eagle3Draft.qkv`,
 * `finish`, `logits`; the module docstring pins the semantics) and tools/reference/eval_tau.py
 * (`Proposer._eagle`, the inference chain).
 *
 * - Context entry of anchor t (every committed row, `writeProjectedContextKV`): g_t = fc(concat taps
 *   at t) = Σ_i h_i · fc_iᵀ, accumulated in fp32 per stage (`projectTargetHiddenPartial`; no norm after
 *   the sum); x = [input_layernorm(embed(x_{t+1})); hidden_norm(g_t)] (2H, `embed` = the target's
 *   embedding, x_{t+1} = `span.nextTokens`); K = RoPE_neox(k_proj x) at position t (no k-norm), V =
 *   v_proj x, written into the draft KV pages. The fc output of each sequence's last row is kept:
 *   propose needs g of anchor p − 1.
 * - Chain, propose at `position` p (= draft context length; `lastToken` = x_p), steps j = 1 … k, batched
 *   over sequences (one GEMM per weight per step):
 *   step 1: query from [input_layernorm(embed(x_p)); hidden_norm(g_{p−1})] at position p − 1 (its K/V
 *   are the context entry of anchor p − 1), attention over context entries 0 … p − 1;
 *   step j > 1: g = the previous step's layer output h (before `norm`), token = the previous draft,
 *   position p + j − 2; its K/V are appended to the pages (slot p + j − 2, temporarily) and the query
 *   attends over the context and the chain entries so far, itself included.
 *   Each step: h = r + o_proj(attn) with r = g (or hidden_norm(g) when `norm_before_residual`);
 *   h = h + down(silu(gate(x)) · up(x)), x = post_attention_layernorm(h); draft-vocabulary logits =
 *   lm_head(norm(h)); the draft is their argmax (temperature 0) or a sample of q = samplingProbs(logits)
 *   — temperature / top-k / top-p applied over the draft vocabulary, i.e. to the drafter's own support —
 *   and maps to the target vocabulary as target_id = draft_id + d2t[draft_id]. q is returned in the
 *   target vocabulary ([k, vocab], exactly 0 outside the draft vocabulary), so rejection sampling
 *   (u·q(x) < p(x)) stays lossless. The chain's KV is discarded after propose.
 * - Tree (`tree: {top_k, depth, total_tokens}`, accepted only on all-attention targets: verifying a
 *   tree needs a tree attention mask, which linear-attention / KDA layers cannot apply without
 *   per-branch state). Trees are greedy-only: at temperature > 0 a tree falls back to a chain of
 *   `depth` drafts (min(depth, maxDrafts)); the engine verifies trees greedily only. A greedy
 *   sequence drafts a tree of N = min(total_tokens, maxDrafts) nodes:
 *   depth 1 = chain step 1; its draft-vocabulary log-softmax gives the root's top_k children
 *   (cumulative log-prob = their log-prob). Depth d = 2 … depth: the frontier is the top_k nodes of
 *   depth d − 1 by cumulative log-prob; expanding node n (token t_n, layer output h_n of the step that
 *   produced it) is exactly the chain step over n's ancestor path: input (embed(t_n), g = h_n) at
 *   position p + d − 2, its K/V entry written at a temporary slot after the context, its query
 *   attending over the context entries 0 … p − 1, then the entries of n's ancestors and its own, in
 *   depth order; its logits give n's top_k children (cumulative = n's + log-prob). Children are the
 *   top_k logits (ties: lower draft id; top_k 1 = argmax, so top_k 1 is the greedy chain). The tree is
 *   the N nodes with the highest cumulative log-prob (ties: lower depth, then generation order) — a
 *   child never outranks its parent, so it is ancestor-closed — emitted by depth, then by that rank,
 *   with `parents` (index into the emitted drafts, −1 = the last verified token). Nodes that cannot
 *   enter the N best are not generated (children beyond rank N, depths beyond N); this does not change
 *   the tree. Each depth level is one set of GEMMs and one `pagedAttention` call over every frontier
 *   node of every sequence; the attention reads the same pool viewed with pageSize 1 (every token slot
 *   its own page), each node an entry whose block table lists the global slots it sees — keys at
 *   consecutive indices, so the result equals the chain's bit for bit. Temporary entries are dropped
 *   (pool truncated to the context) after propose.
 *
 * Draft KV: one core {@link PagedKvPool} with "layers" 0 (K) and 1 (V), `numKvHeads · headDim` f32 per
 * token, NHD pages — the layout of @specd/native's `pagedAttention`.
 *
 * Tensor parallelism ({@link loadEagle3Shard}; Megatron-LM layout, core's `draftShardLayout`): rank r
 * holds q_proj rows of its heads, k/v_proj rows of its KV heads (one replicated head when tp exceeds
 * the KV heads), o_proj columns, gate/up rows and down columns of its I/tp; the three norms
 * replicated; fc, norm, lm_head and d2t on rank 0 only, its pool its KV heads only. Every rank
 * computes its KV heads' rows of each context entry and of each chain step, and h = r +
 * allReduce(o_r(attn_r)), h += allReduce(down_r(…)); rank 0 embeds the step's tokens (broadcast),
 * computes the logits and picks the drafts. The chain's shape (steps, which sequences continue) follows
 * from `maxDrafts` alone, so every rank runs the same steps. Trees are refused under tensor parallelism.
 */

import {
  DrafterError,
  DraftShard,
  PagedKvPool,
  TapProjection,
  WeightReader,
  draftShardLayout,
  sampleFromProbs,
  samplingProbs,
  sliceColumns,
  type ContextSpan,
  type DraftBatch,
  type Drafter,
  type DrafterLoadOptions,
  type DrafterShardLoadOptions,
  type DrafterSource,
  type DraftProposal,
  type ProjectionLoadOptions,
  type DraftSequence,
  type SequenceId,
  type StageInfo,
  type StageModel,
} from '@specd/core';
import {
  applyRope,
  argmax,
  gemmBf16,
  makePagedBatch,
  pagedAttention,
  rmsNorm,
  swigluFused,
  writeKvPages,
  type KvPageLayout,
  type PackedBf16Weights,
} from '@specd/native';

import {
  EAGLE3_DEFAULT_DRAFT_TOKENS,
  parseEagle3Settings,
  type Eagle3Config,
  type Eagle3TreeSettings,
} from './config.js';

/** Tokens per draft KV page. */
const DRAFT_PAGE_SIZE = 16;

/** Target layer kinds that are (softmax) attention: a tree could be verified with a tree mask. */
const ATTENTION_LAYER_KINDS: readonly string[] = Object.freeze([
  'mla',
  'attention',
  'full_attention',
  'sliding_attention',
  'mha',
  'gqa',
  'mqa',
]);

/** Weight-name prefixes of the decoder layer: EAGLE-3 layout, then the speculators layout. */
export const EAGLE3_LAYER_PREFIXES: readonly string[] = Object.freeze(['midlayer.', 'layers.0.']);

/** The packed weights of the draft (one decoder layer + head). */
interface Eagle3Weights {
  /** fc's column blocks, one per tap: the context projection (core's accumulate-by-tap {@link TapProjection}). */
  readonly projection: TapProjection;
  readonly inputNorm: Float32Array;
  readonly hiddenNorm: Float32Array;
  readonly postNorm: Float32Array;
  /** `norm` (rank 0 only under tensor parallelism). */
  readonly finalNorm?: Float32Array;
  /** q_proj `[H·hd, 2D]` (step 1: the query of the last context entry). */
  readonly q: PackedBf16Weights;
  /** q_proj ; k_proj ; v_proj stacked: `[(H + 2·KV)·hd, 2D]`. */
  readonly qkv: PackedBf16Weights;
  /** k_proj ; v_proj stacked: `[2·KV·hd, 2D]` (context entries need no query). */
  readonly kv: PackedBf16Weights;
  /** o_proj `[D, H·hd]`. */
  readonly o: PackedBf16Weights;
  /** gate_proj ; up_proj stacked `[2·I, D]`. */
  readonly gateUp: PackedBf16Weights;
  /** down_proj `[D, I]`. */
  readonly down: PackedBf16Weights;
  /** lm_head `[draftVocab, D]`. */
  readonly lmHead?: PackedBf16Weights;
  /** Target id of each draft id (`draft_id + d2t[draft_id]`), `[draftVocab]` i32 (`[0]` off rank 0 under tensor parallelism). */
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

/** A node of a dynamic draft tree (draft-vocabulary token, parent node index or −1 for the root). */
interface TreeNode {
  readonly draft: number;
  readonly depth: number;
  readonly parent: number;
  /** Cumulative log-prob: the parent's + this token's log-softmax under the parent's step. */
  readonly cum: number;
  /** Layer output h of the step that produced this node (its expansion's g), `[D]`. */
  readonly h: Float32Array;
  /** Global pool slot of its expansion's K/V entry; −1 until expanded. */
  slot: number;
}

/** Tree rank order: higher cumulative log-prob first; ties: lower depth, then generation order (index). */
function compareNodes(nodes: readonly TreeNode[], a: number, b: number): number {
  const x = nodes[a]!;
  const y = nodes[b]!;
  if (x.cum !== y.cum) return x.cum > y.cum ? -1 : 1;
  return x.depth - y.depth || a - b;
}

/** log Σ exp(x) over a row, in f64 (NaN entries skipped). */
function logSumExp(x: Float32Array): number {
  let m = -Infinity;
  for (let e = 0; e < x.length; e++) if (x[e]! > m) m = x[e]!;
  if (m === -Infinity) return m;
  let s = 0;
  for (let e = 0; e < x.length; e++) if (x[e]! >= -Infinity) s += Math.exp(x[e]! - m);
  return m + Math.log(s);
}

/** Indices of the k largest values, largest first; ties: lower index first; NaN never chosen (k = 1: `argmax`). */
function topIndices(x: Float32Array, k: number): number[] {
  const best: number[] = [];
  for (let e = 0; e < x.length; e++) {
    const v = x[e]!;
    if (!(v >= -Infinity)) continue;
    if (best.length === k) {
      if (!(v > x[best[k - 1]!]!)) continue;
      best.pop();
    }
    let at = best.length;
    best.push(e);
    while (at > 0 && v > x[best[at - 1]!]!) {
      best[at] = best[at - 1]!;
      at--;
    }
    best[at] = e;
  }
  return best;
}

/**
 * The "tree needs per-branch state" refusal: a tree can be verified in one target forward only with
 * a tree attention mask, which recurrent (linear-attention) layers cannot apply without one state per branch.
 * Undefined on an all-attention target (trees are accepted there).
 */
function treeRefusal(info: StageInfo): DrafterError | undefined {
  const byKind = new Map<string, number[]>();
  info.layerKinds.forEach((k, i) => {
    if (ATTENTION_LAYER_KINDS.includes(k)) return;
    let l = byKind.get(k);
    if (l === undefined) {
      l = [];
      byKind.set(k, l);
    }
    l.push(i);
  });
  if (byKind.size === 0) return undefined;
  const what = [...byKind]
    .map(([k, ls]) => `${k === 'kda' ? 'KDA' : `"${k}"`} layers (layers ${ls.join(', ')})`)
    .join(', ');
  return new DrafterError(
    `eagle3: EAGLE-3 tree drafting needs per-branch linear-attention state, which targets with ${what} do not have; use chain drafting (omit \`tree\`)`,
  );
}

/**
 * One pipeline stage's share of an EAGLE-3 checkpoint's context projection
 * (`DrafterPlugin.loadProjection`, REFERENCE.md §8): the `[D, D]` column blocks of `fc.weight` for
 * `options.taps` only — bit for bit the blocks {@link loadEagle3Drafter} packs.
 * @throws {DrafterError} if the hidden size differs from the target's, `fc` is mis-shaped, or a tap is not the drafter's.
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
  const r = new WeightReader(source.weights, { makeError: (m) => new DrafterError(`${where}: ${m}`) });
  return TapProjection.read(r, 'fc.weight', config.hiddenSize, config.taps, where, options.taps);
}

/**
 * Loads an EAGLE-3 checkpoint (EAGLE-3 or speculators layout) for `options.target` (validated against
 * it) and packs its weights. `options.settings` (the config's `drafter` branch) may set
 * `num_draft_tokens` (the chain length; default the checkpoint's `speculative_tokens`, else 6) and `tree`.
 * Weight names: `fc.weight`, `<prefix>{input_layernorm, hidden_norm, post_attention_layernorm,
 * self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj}.weight` with prefix `midlayer.` or `layers.0.`,
 * `norm.weight`, `lm_head.weight`, `d2t` (I64 or I32; required unless draft_vocab_size = vocab_size,
 * then the identity); `t2d` and `embed_tokens.weight` are not read (the target's embedding is used).
 * With `tree` (all-attention targets only), `maxDraftTokens` = `tree.total_tokens` (`num_draft_tokens`
 * is then not used).
 * @throws {DrafterError} if `tree` is set on a target with non-attention layers (kinds named), hidden or vocabulary sizes differ from
 *   the target's, `fc` is not `[hidden, taps × hidden]`, a tap is beyond the target's layers, the
 *   target lacks `embedTokens`, `d2t` is missing or maps outside the target vocabulary, or a tensor
 *   is missing / mis-shaped.
 */
export function loadEagle3Drafter(
  source: DrafterSource,
  config: Eagle3Config,
  options: DrafterLoadOptions,
): Eagle3Drafter {
  return buildEagle3(source, config, options, undefined).drafter;
}

/**
 * Loads rank `options.comm.rank`'s shard of an EAGLE-3 checkpoint (module comment, "Tensor
 * parallelism"): SPMD — `writeProjectedContextKV` and `propose` run the group's collectives (call
 * them on every rank at once; rank 0's results are the real ones, other ranks' `propose` returns
 * `[]`); `projectTargetHiddenPartial` works on rank 0 only. Reports its reads through `options.onReads`.
 * @throws {DrafterError} when tp does not fit the heads / KV heads / intermediate width (counts
 *   named), for `tree` with tp > 1 (trees need a target without linear-attention layers, and only Kimi
 *   has `loadShard`), and as {@link loadEagle3Drafter} (target checks on rank 0 only).
 */
export function loadEagle3Shard(
  source: DrafterSource,
  config: Eagle3Config,
  options: DrafterShardLoadOptions,
): Eagle3Drafter {
  const where = `eagle3: ${source.dir}`;
  if (options.comm.size > 1 && parseEagle3Settings(options.settings).tree !== undefined) {
    throw new DrafterError(
      `${where}: tree drafting is not supported under tensor parallelism (tp = ${options.comm.size}); use chain drafting (omit \`tree\`)`,
    );
  }
  const layout = draftShardLayout(
    { heads: config.numHeads, kvHeads: config.numKvHeads, intermediate: config.intermediateSize },
    options.comm,
    where,
  );
  const { drafter, reads } = buildEagle3(source, config, options, new DraftShard(options.comm, layout));
  options.onReads?.(reads);
  return drafter;
}

function buildEagle3(
  source: DrafterSource,
  config: Eagle3Config,
  options: DrafterLoadOptions,
  tp: DraftShard | undefined,
): { drafter: Eagle3Drafter; reads: WeightReader['reads'] } {
  const c = config;
  const t = options.target;
  const info = t.info;
  const root = tp === undefined || tp.isRoot;
  const where = `eagle3: ${source.dir}`;
  const settings = parseEagle3Settings(options.settings);
  const tree = settings.tree;
  if (tree !== undefined) {
    const refusal = treeRefusal(info);
    if (refusal !== undefined) throw refusal;
  }
  if (c.hiddenSize !== info.hiddenSize)
    throw new DrafterError(`${where}: hidden_size ${c.hiddenSize} differs from the target's ${info.hiddenSize}`);
  if (c.vocabSize !== info.vocabSize)
    throw new DrafterError(`${where}: vocab_size ${c.vocabSize} differs from the target's ${info.vocabSize}`);
  if (c.draftVocabSize > c.vocabSize)
    throw new DrafterError(`${where}: draft_vocab_size ${c.draftVocabSize} exceeds vocab_size ${c.vocabSize}`);
  const r = new WeightReader(source.weights, { makeError: (m) => new DrafterError(`${where}: ${m}`) });
  const D = c.hiddenSize;
  // fc (the context projection) on rank 0 only under tensor parallelism: core projects there
  const projection = TapProjection.read(r, 'fc.weight', D, c.taps, where, root ? c.taps : []);
  const bad = c.taps.filter((tap) => tap > info.numLayers);
  if (bad.length > 0) {
    throw new DrafterError(
      `${where}: eagle_aux_hidden_state_layer_ids [${c.taps.join(', ')}] name taps [${bad.join(', ')}] the target does not have (it has taps 0..${info.numLayers}, ${info.numLayers} layers)`,
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
          `${where}: d2t[${i}] = ${off} maps draft id ${i} to ${id}, outside the target vocabulary [0, ${info.vocabSize})`,
        );
      draftToTarget[i] = id;
    }
  } else if (Vd === c.vocabSize) {
    draftToTarget = Int32Array.from({ length: Vd }, (_, i) => i);
  } else {
    throw new DrafterError(
      `${where}: checkpoint has no tensor "d2t" (the draft → target vocabulary map), required since draft_vocab_size ${Vd} < vocab_size ${c.vocabSize}`,
    );
  }
  const p = EAGLE3_LAYER_PREFIXES.find((x) => r.has(`${x}self_attn.q_proj.weight`));
  if (p === undefined)
    throw new DrafterError(
      `${where}: checkpoint has no decoder layer (neither "midlayer.self_attn.q_proj.weight" nor "layers.0.self_attn.q_proj.weight")`,
    );
  const H = c.numHeads;
  const KV = c.numKvHeads;
  const hd = c.headDim;
  const I = c.intermediateSize;
  const qkvNames = ['q_proj', 'k_proj', 'v_proj'].map((n) => `${p}self_attn.${n}.weight`);
  let w: Eagle3Weights;
  if (tp === undefined) {
    w = {
      projection,
      inputNorm: r.f32(`${p}input_layernorm.weight`, [D]),
      hiddenNorm: r.f32(`${p}hidden_norm.weight`, [D]),
      postNorm: r.f32(`${p}post_attention_layernorm.weight`, [D]),
      finalNorm: r.f32('norm.weight', [D]),
      q: r.packedRows(qkvNames.slice(0, 1), [H * hd], 2 * D),
      qkv: r.packedRows(qkvNames, [H * hd, KV * hd, KV * hd], 2 * D),
      kv: r.packedRows(qkvNames.slice(1), [KV * hd, KV * hd], 2 * D),
      o: r.packedRows([`${p}self_attn.o_proj.weight`], [D], H * hd),
      gateUp: r.packedRows([`${p}mlp.gate_proj.weight`, `${p}mlp.up_proj.weight`], [I, I], D),
      down: r.packedRows([`${p}mlp.down_proj.weight`], [D], I),
      lmHead: r.packedRows(['lm_head.weight'], [Vd], D),
      draftToTarget,
    };
  } else {
    // the rank's blocks; fc, norm and lm_head on rank 0 only
    const L = tp.layout;
    const qBlock = {
      name: qkvNames[0]!,
      n: H * hd,
      k: 2 * D,
      block: { rows: [L.heads[0] * hd, L.heads[1] * hd] as const },
    };
    const kvBlock = (name: string) => ({
      name,
      n: KV * hd,
      k: 2 * D,
      block: { rows: [L.kvHeads[0] * hd, L.kvHeads[1] * hd] as const },
    });
    w = {
      projection,
      inputNorm: r.f32(`${p}input_layernorm.weight`, [D]),
      hiddenNorm: r.f32(`${p}hidden_norm.weight`, [D]),
      postNorm: r.f32(`${p}post_attention_layernorm.weight`, [D]),
      ...(root ? { finalNorm: r.f32('norm.weight', [D]) } : {}),
      q: r.packedBlocks([qBlock]),
      qkv: r.packedBlocks([qBlock, kvBlock(qkvNames[1]!), kvBlock(qkvNames[2]!)]),
      kv: r.packedBlocks([kvBlock(qkvNames[1]!), kvBlock(qkvNames[2]!)]),
      o: r.packedBlocks([
        {
          name: `${p}self_attn.o_proj.weight`,
          n: D,
          k: H * hd,
          block: { cols: [L.heads[0] * hd, L.heads[1] * hd] as const },
        },
      ]),
      gateUp: r.packedBlocks(
        [`${p}mlp.gate_proj.weight`, `${p}mlp.up_proj.weight`].map((name) => ({
          name,
          n: I,
          k: D,
          block: { rows: L.intermediate },
        })),
      ),
      down: r.packedBlocks([{ name: `${p}mlp.down_proj.weight`, n: D, k: I, block: { cols: L.intermediate } }]),
      ...(root ? { lmHead: r.packedRows(['lm_head.weight'], [Vd], D) } : {}),
      draftToTarget,
    };
  }
  const maxDraftTokens =
    tree?.totalTokens ?? settings.numDraftTokens ?? c.speculativeTokens ?? EAGLE3_DEFAULT_DRAFT_TOKENS;
  // temporary entries per propose: a chain's k − 1, a tree's frontier width × (depth − 1) at most
  const temp =
    tree === undefined
      ? maxDraftTokens
      : Math.max(
          maxDraftTokens,
          Math.min(tree.topK, Vd, tree.totalTokens) * (Math.min(tree.depth, tree.totalTokens) - 1),
        );
  const pagesPerSeq = Math.ceil((options.maxTokensPerSequence + temp) / DRAFT_PAGE_SIZE) + 1;
  return {
    drafter: new Eagle3Drafter(c, t, w, maxDraftTokens, options.maxSequences * pagesPerSeq, tree, tp),
    reads: r.reads,
  };
}

/** A loaded EAGLE-3 drafter bound to one target stage (chain drafting, or greedy dynamic trees). */
export class Eagle3Drafter implements Drafter {
  readonly method = 'eagle3';
  /** Drafts per step at most: the chain length, or `tree.totalTokens` in tree mode. */
  readonly maxDraftTokens: number;
  /** Draft KV (see the module comment). */
  readonly pool: PagedKvPool;
  private readonly layout: KvPageLayout;
  /** fc output g of each sequence's last context row, `[D]` f32. */
  private readonly lastG = new Map<SequenceId, Float32Array>();
  /** Query heads, KV heads and intermediate width this rank computes (the whole model's without tensor parallelism). */
  private readonly heads: number;
  private readonly kvHeads: number;
  private readonly inter: number;

  constructor(
    readonly config: Eagle3Config,
    private readonly target: StageModel,
    private w: Eagle3Weights | undefined,
    maxDraftTokens: number,
    numPages: number,
    /** Dynamic-tree settings (greedy sequences draft trees); undefined = chain drafting. */
    readonly tree?: Eagle3TreeSettings,
    /** The rank's tensor-parallel group and blocks; undefined = the whole draft model on this thread. */
    readonly tp?: DraftShard,
  ) {
    const c = config;
    this.maxDraftTokens = maxDraftTokens;
    this.heads = tp?.heads ?? c.numHeads;
    this.kvHeads = tp?.kvHeads ?? c.numKvHeads;
    this.inter = tp?.intermediate ?? c.intermediateSize;
    this.pool = new PagedKvPool({
      layers: [0, 1],
      floatsPerToken: this.kvHeads * c.headDim,
      pageSize: DRAFT_PAGE_SIZE,
      numPages,
    });
    this.layout = Object.freeze({
      numPages,
      pageSize: DRAFT_PAGE_SIZE,
      numKvHeads: this.kvHeads,
      headDim: c.headDim,
      kvLayout: 'NHD',
    });
  }

  /** Whether this rank embeds, computes logits and picks drafts (always without tensor parallelism). */
  private get root(): boolean {
    return this.tp === undefined || this.tp.isRoot;
  }

  /** Token embeddings `[tokens.length, D]` f32: the target's, or under tensor parallelism rank 0's broadcast. */
  private embed(tokens: Int32Array): Float32Array {
    return this.tp === undefined
      ? this.target.embedTokens!(tokens)
      : this.tp.embed(this.target, tokens, this.config.hiddenSize);
  }

  /** The rank's row-parallel partial summed over the ranks (identity without tensor parallelism). */
  private reduce(x: Float32Array): Float32Array {
    return this.tp === undefined ? x : this.tp.reduce(x);
  }

  get pagesInUse(): number {
    return this.pool.pagesInUse;
  }

  /** Target id of each draft-vocabulary id, `[draftVocab]` i32. */
  get draftToTarget(): Int32Array {
    return this.weights().draftToTarget;
  }

  captureSetter(target: StageInfo): readonly number[] {
    const bad = this.config.taps.filter((t) => t > target.numLayers);
    if (bad.length > 0)
      throw new DrafterError(
        `eagle3: captureSetter: taps [${bad.join(', ')}] are beyond the target's ${target.numLayers} layers`,
      );
    return this.config.taps;
  }

  projectTargetHiddenPartial(
    stageTaps: ReadonlyMap<number, Float32Array>,
    numTokens: number,
    accumulator?: Float32Array,
  ): Float32Array {
    return this.weights().projection.projectTargetHiddenPartial(stageTaps, numTokens, accumulator);
  }

  /**
   * Context entries of the spans' rows: K/V of [input_layernorm(embed(nextTokens)); hidden_norm(sum)]
   * at the rows' absolute positions (module comment); keeps each span's last row of `sum` as g.
   * @param sum `[Σ numTokens, hiddenSize]` f32, fc(taps) of the rows.
   * @throws {DrafterError} if a span lacks `nextTokens` (or it is not `[numTokens]`), a position is
   *   not the sequence's draft context length, or `sum` has the wrong length.
   */
  writeProjectedContextKV(sum: Float32Array, spans: readonly ContextSpan[]): void {
    const c = this.config;
    const D = c.hiddenSize;
    const w = this.weights();
    const n = spans.reduce((a, s) => a + s.numTokens, 0);
    if (sum.length !== n * D)
      throw new DrafterError(
        `eagle3: writeProjectedContextKV: sum: expected [${n}, ${D}] f32, got length ${sum.length}`,
      );
    for (const s of spans) {
      const have = this.pool.length(s.id);
      if (s.position !== have)
        throw new DrafterError(
          `eagle3: writeProjectedContextKV: sequence ${String(s.id)}: position ${s.position} is not the draft context length ${have}`,
        );
      if (s.nextTokens === undefined) {
        throw new DrafterError(
          `eagle3: writeProjectedContextKV: sequence ${String(s.id)}: nextTokens is missing (EAGLE-3's context entry of position t reads the token x_{t+1})`,
        );
      }
      if (s.nextTokens.length !== s.numTokens)
        throw new DrafterError(
          `eagle3: writeProjectedContextKV: sequence ${String(s.id)}: nextTokens: expected [${s.numTokens}] i32, got length ${s.nextTokens.length}`,
        );
    }
    if (n === 0) return;
    const positions = new Int32Array(n);
    const next = new Int32Array(n);
    let at = 0;
    for (const s of spans) {
      next.set(s.nextTokens!, at);
      for (let i = 0; i < s.numTokens; i++) positions[at++] = s.position + i;
    }
    const grown: ContextSpan[] = [];
    try {
      for (const s of spans) {
        this.pool.extend(s.id, s.position + s.numTokens);
        grown.push(s);
      }
    } catch (err) {
      for (const s of grown) this.pool.truncate(s.id, s.position);
      throw err;
    }
    const x = this.layerInput(this.embed(next), sum, n);
    const [k, v] = this.keysValues(gemmBf16(x, n, w.kv), positions, 0);
    writeKvPages(
      this.layout,
      k,
      v,
      this.pool.layerStore(0),
      this.pool.layerStore(1),
      this.pool.tokenSlots(spans.map((s) => ({ id: s.id, start: s.position, n: s.numTokens }))),
    );
    at = 0;
    for (const s of spans) {
      at += s.numTokens;
      if (s.numTokens > 0) this.lastG.set(s.id, sum.slice((at - 1) * D, at * D));
    }
  }

  /**
   * Drafts for every sequence (module comment): a chain of `maxDrafts` (no `tree`), or, with `tree`,
   * a dynamic tree of at most min(total_tokens, maxDrafts) nodes for greedy sequences and a chain of
   * min(depth, maxDrafts) drafts for sampled ones (temperature > 0). Batched per step / depth level.
   * @throws {DrafterError} if maxDrafts is outside [1, maxDraftTokens], a position is not the draft
   *   context length, or a sequence has no context yet (position 0).
   */
  propose(batch: DraftBatch): DraftProposal[] {
    const V = this.target.info.vocabSize;
    const w = this.weights();
    const seqs = batch.sequences;
    seqs.forEach((s, i) => {
      if (!(s.maxDrafts >= 1 && s.maxDrafts <= this.maxDraftTokens))
        throw new DrafterError(
          `eagle3: propose: sequences[${i}].maxDrafts: expected [1, ${this.maxDraftTokens}], got ${s.maxDrafts}`,
        );
      const have = this.pool.length(s.id);
      if (s.position !== have)
        throw new DrafterError(
          `eagle3: propose: sequences[${i}] (${String(s.id)}): position ${s.position} is not the draft context length ${have}`,
        );
      if (s.position < 1 || !this.lastG.has(s.id))
        throw new DrafterError(
          `eagle3: propose: sequences[${i}] (${String(s.id)}): no draft context yet (EAGLE-3 drafts from the last context entry)`,
        );
    });
    if (seqs.length === 0) return [];
    if (!this.root) {
      // a worker rank of a tensor-parallel group: the same chain steps, no logits (chains only: trees are refused under TP)
      this.runChain(
        seqs,
        seqs.map((s) => s.maxDrafts),
        () => 0,
      );
      return [];
    }
    const tree = this.tree;
    const out = new Array<DraftProposal>(seqs.length);
    const chainAt: number[] = [];
    const treeAt: number[] = [];
    seqs.forEach((s, i) => {
      (tree !== undefined && !(s.sampling.temperature > 0) ? treeAt : chainAt).push(i);
    });
    if (chainAt.length > 0) {
      const cs = chainAt.map((i) => seqs[i]!);
      const lengths = cs.map((s) => (tree === undefined ? s.maxDrafts : Math.min(tree.depth, s.maxDrafts)));
      const probs = cs.map((s, r) => (s.sampling.temperature > 0 ? new Float32Array(lengths[r]! * V) : undefined));
      const drafts = this.runChain(cs, lengths, (r, j, lg, greedy) => {
        const qRow = probs[r];
        if (qRow === undefined) return greedy;
        const s = cs[r]!;
        const qd = samplingProbs(lg, lg.length, s.sampling);
        const full = qRow.subarray((j - 1) * V, j * V);
        for (let e = 0; e < qd.length; e++) full[w.draftToTarget[e]!] = qd[e]!;
        return sampleFromProbs(qd, s.rng);
      });
      chainAt.forEach((i, r) => {
        const tokens = Int32Array.from(drafts[r]!, (d) => w.draftToTarget[d]!);
        out[i] = probs[r] === undefined ? { id: seqs[i]!.id, tokens } : { id: seqs[i]!.id, tokens, probs: probs[r]! };
      });
    }
    if (treeAt.length > 0) {
      const props = this.proposeTree(
        treeAt.map((i) => seqs[i]!),
        tree!,
      );
      treeAt.forEach((i, r) => {
        out[i] = props[r]!;
      });
    }
    return out;
  }

  /**
   * Test hook (internal): the draft-vocabulary logits `[forced.length + 1, draftVocab]` of the greedy
   * chain steps 1 … forced.length + 1 of `seq` when the chain's drafts are forced to the draft ids
   * `forced` (step j > 1 is fed forced[j − 2]); the same code path as chain drafting. Leaves the
   * draft context unchanged.
   * @internal
   */
  forcedChainLogits(seq: DraftSequence, forced: ArrayLike<number>): Float32Array {
    const Vd = this.config.draftVocabSize;
    if (seq.position !== this.pool.length(seq.id) || seq.position < 1 || !this.lastG.has(seq.id)) {
      throw new DrafterError(
        `eagle3: forcedChainLogits: sequence ${String(seq.id)}: position ${seq.position} is not a drafting position (draft context length ${this.pool.length(seq.id)})`,
      );
    }
    const out = new Float32Array((forced.length + 1) * Vd);
    this.runChain([seq], [forced.length + 1], (_r, j, lg) => {
      out.set(lg, (j - 1) * Vd);
      return j <= forced.length ? forced[j - 1]! : 0;
    });
    return out;
  }

  /**
   * The chain (module comment) of `lengths[r]` steps for each of `seqs`, batched per step; `pick`
   * chooses step j's draft id of sequence r from its draft-vocabulary logits (`greedy` = their argmax).
   * Returns the draft ids; the chain's temporary KV is discarded.
   */
  private runChain(
    seqs: readonly DraftSequence[],
    lengths: readonly number[],
    pick: (r: number, j: number, logits: Float32Array, greedy: number) => number,
  ): Int32Array[] {
    const c = this.config;
    const D = c.hiddenSize;
    const H = this.heads;
    const hd = c.headDim;
    const W = this.kvHeads * hd;
    const Vd = c.draftVocabSize;
    const w = this.weights();
    const root = this.root;
    const S = seqs.length;
    const kMax = lengths.reduce((m, k) => Math.max(m, k), 0);
    const drafts = lengths.map((k) => new Int32Array(k));
    // per active sequence: g (the step's residual input) and the step's input token
    let active = seqs.map((_, i) => i);
    let g = new Float32Array(S * D);
    seqs.forEach((s, i) => {
      g.set(this.lastG.get(s.id)!, i * D);
    });
    let tok = Int32Array.from(seqs, (s) => s.lastToken);
    const grown: SequenceId[] = [];
    try {
      for (let j = 1; j <= kMax; j++) {
        const n = active.length;
        const x = this.layerInput(this.embed(tok), g, n);
        let q: Float32Array;
        if (j === 1) {
          q = this.firstQuery(
            x,
            active.map((i) => seqs[i]!),
          );
        } else {
          const pos = Int32Array.from(active, (i) => seqs[i]!.position + j - 2);
          const qkv = gemmBf16(x, n, w.qkv);
          q = sliceColumns(qkv, n, H * hd + 2 * W, 0, H * hd);
          applyRope(q, pos, { heads: H, headDim: hd, theta: c.ropeTheta, style: 'neox' }, q);
          const [k, v] = this.keysValues(qkv, pos, H * hd);
          for (const i of active) {
            const s = seqs[i]!;
            if (j === 2) grown.push(s.id);
            this.pool.extend(s.id, s.position + j - 1);
          }
          writeKvPages(
            this.layout,
            k,
            v,
            this.pool.layerStore(0),
            this.pool.layerStore(1),
            this.pool.tokenSlots(active.map((i) => ({ id: seqs[i]!.id, start: seqs[i]!.position + j - 2, n: 1 }))),
          );
        }
        const attnBatch = makePagedBatch(
          active.map((i) => ({ qLen: 1, kvLen: seqs[i]!.position + j - 1, pages: this.pool.blockTable(seqs[i]!.id) })),
        );
        const a = pagedAttention(q, this.pool.layerStore(0), this.pool.layerStore(1), this.layout, attnBatch, {
          numHeads: H,
          scale: 1 / Math.sqrt(hd),
          mask: 'causal',
        });
        const h = this.finish(g, a, n);
        // logits and the pick on rank 0 only (the other ranks' drafts stay 0: their embeddings are rank 0's)
        const logits = root ? gemmBf16(rmsNorm(h, w.finalNorm!, c.rmsNormEps), n, w.lmHead!) : undefined;
        const greedy = logits === undefined ? undefined : argmax(logits, Vd);
        const nextActive: number[] = [];
        const nextRows: number[] = [];
        active.forEach((i, row) => {
          const d = logits === undefined ? 0 : pick(i, j, logits.subarray(row * Vd, (row + 1) * Vd), greedy![row]!);
          drafts[i]![j - 1] = d;
          if (lengths[i]! > j) {
            nextActive.push(i);
            nextRows.push(row);
          }
        });
        const ng = new Float32Array(nextRows.length * D);
        nextRows.forEach((row, r) => {
          ng.set(h.subarray(row * D, (row + 1) * D), r * D);
        });
        tok = Int32Array.from(nextActive, (i) => (root ? w.draftToTarget[drafts[i]![j - 1]!]! : 0));
        g = ng;
        active = nextActive;
      }
    } finally {
      for (const id of grown) this.pool.truncate(id, seqs.find((s) => s.id === id)!.position);
    }
    return drafts;
  }

  /** Step 1's query: the query of anchor p − 1 from `x` (`[n, 2D]`), RoPE at p − 1; its K/V are already the last context entry. */
  private firstQuery(x: Float32Array, seqs: readonly DraftSequence[]): Float32Array {
    const c = this.config;
    const q = gemmBf16(x, seqs.length, this.weights().q);
    applyRope(
      q,
      Int32Array.from(seqs, (s) => s.position - 1),
      { heads: this.heads, headDim: c.headDim, theta: c.ropeTheta, style: 'neox' },
      q,
    );
    return q;
  }

  /**
   * Greedy dynamic trees (module comment), one per sequence, batched per depth level: one set of
   * GEMMs and one `pagedAttention` call (over the pool viewed with pageSize 1) per level.
   */
  private proposeTree(seqs: readonly DraftSequence[], tree: Eagle3TreeSettings): DraftProposal[] {
    const c = this.config;
    const D = c.hiddenSize;
    const H = this.heads;
    const hd = c.headDim;
    const W = this.kvHeads * hd;
    const Vd = c.draftVocabSize;
    const w = this.weights();
    const F = this.pool.floatsPerToken;
    const S = seqs.length;
    const attn = { numHeads: H, scale: 1 / Math.sqrt(hd), mask: 'causal' } as const;
    const budget = seqs.map((s) => Math.min(tree.totalTokens, s.maxDrafts));
    // children per node: a child ranked below `budget` among its siblings can never be selected
    const width = budget.map((b) => Math.min(tree.topK, Vd, b));
    const nodes: TreeNode[][] = seqs.map(() => []);
    const addChildren = (i: number, parent: number, depth: number, lg: Float32Array, h: Float32Array): void => {
      const base = parent < 0 ? 0 : nodes[i]![parent]!.cum;
      const lse = logSumExp(lg);
      for (const d of topIndices(lg, width[i]!))
        nodes[i]!.push({ draft: d, depth, parent, cum: base + (lg[d]! - lse), h, slot: -1 });
    };
    // depth 1: chain step 1
    {
      const g = new Float32Array(S * D);
      seqs.forEach((s, i) => {
        g.set(this.lastG.get(s.id)!, i * D);
      });
      const x = this.layerInput(this.embed(Int32Array.from(seqs, (s) => s.lastToken)), g, S);
      const q = this.firstQuery(x, seqs);
      const a = pagedAttention(
        q,
        this.pool.layerStore(0),
        this.pool.layerStore(1),
        this.layout,
        makePagedBatch(seqs.map((s) => ({ qLen: 1, kvLen: s.position, pages: this.pool.blockTable(s.id) }))),
        attn,
      );
      const h = this.finish(g, a, S);
      const logits = gemmBf16(rmsNorm(h, w.finalNorm!, c.rmsNormEps), S, w.lmHead!);
      seqs.forEach((_, i) => {
        addChildren(i, -1, 1, logits.subarray(i * Vd, (i + 1) * Vd), h.slice(i * D, (i + 1) * D));
      });
    }
    // deeper levels: every token slot its own "page"
    const layout1: KvPageLayout = Object.freeze({
      ...this.layout,
      numPages: this.layout.numPages * this.layout.pageSize,
      pageSize: 1,
    });
    const used = seqs.map(() => 0);
    let ctxSlots: Int32Array[] | undefined;
    try {
      for (let d = 2; d <= tree.depth; d++) {
        // frontier: the top `width` nodes of depth d − 1 by cumulative log-prob, of each sequence
        const rows: { i: number; n: number }[] = [];
        seqs.forEach((_, i) => {
          if (d > budget[i]!) return; // an ancestor-closed tree of budget nodes is at most budget deep
          const level: number[] = [];
          nodes[i]!.forEach((nd, n) => {
            if (nd.depth === d - 1) level.push(n);
          });
          level.sort((a, b) => compareNodes(nodes[i]!, a, b));
          for (const n of level.slice(0, width[i]!)) rows.push({ i, n });
        });
        const R = rows.length;
        if (R === 0) break;
        ctxSlots ??= seqs.map((s) => this.pool.tokenSlots([{ id: s.id, start: 0, n: s.position }]));
        const g = new Float32Array(R * D);
        rows.forEach(({ i, n }, r) => {
          g.set(nodes[i]![n]!.h, r * D);
        });
        const tok = Int32Array.from(rows, ({ i, n }) => w.draftToTarget[nodes[i]![n]!.draft]!);
        const x = this.layerInput(this.embed(tok), g, R);
        const pos = Int32Array.from(rows, ({ i }) => seqs[i]!.position + d - 2);
        const qkv = gemmBf16(x, R, w.qkv);
        const q = sliceColumns(qkv, R, H * hd + 2 * W, 0, H * hd);
        applyRope(q, pos, { heads: H, headDim: hd, theta: c.ropeTheta, style: 'neox' }, q);
        const [k, v] = this.keysValues(qkv, pos, H * hd);
        // temporary entry slots after each sequence's context
        const counts = seqs.map(() => 0);
        for (const { i } of rows) counts[i]!++;
        seqs.forEach((s, i) => {
          if (counts[i]! === 0) return;
          this.pool.extend(s.id, s.position + used[i]! + counts[i]!);
          used[i]! += counts[i]!;
        });
        const slots = new Int32Array(R);
        const next = seqs.map((s, i) => s.position + used[i]! - counts[i]!);
        rows.forEach(({ i, n }, r) => {
          slots[r] = this.pool.tokenOffset(seqs[i]!.id, next[i]!++) / F;
          nodes[i]![n]!.slot = slots[r]!;
        });
        writeKvPages(this.layout, k, v, this.pool.layerStore(0), this.pool.layerStore(1), slots);
        // each node sees the context, its ancestors' entries (depth order) and its own entry
        const attnBatch = makePagedBatch(
          rows.map(({ i, n }) => {
            const p = seqs[i]!.position;
            const pages = new Int32Array(p + d - 1);
            pages.set(ctxSlots![i]!);
            for (let a = n, at = p + d - 2; a >= 0; a = nodes[i]![a]!.parent) pages[at--] = nodes[i]![a]!.slot;
            return { qLen: 1, kvLen: p + d - 1, pages };
          }),
        );
        const a = pagedAttention(q, this.pool.layerStore(0), this.pool.layerStore(1), layout1, attnBatch, attn);
        const h = this.finish(g, a, R);
        const logits = gemmBf16(rmsNorm(h, w.finalNorm!, c.rmsNormEps), R, w.lmHead!);
        rows.forEach(({ i, n }, r) => {
          addChildren(i, n, d, logits.subarray(r * Vd, (r + 1) * Vd), h.slice(r * D, (r + 1) * D));
        });
      }
    } finally {
      seqs.forEach((s, i) => {
        if (used[i]! > 0) this.pool.truncate(s.id, s.position);
      });
    }
    // the budget best nodes (ancestor-closed: a child ranks after its parent), by depth then rank
    return seqs.map((s, i) => {
      const all = nodes[i]!;
      const ranked = all
        .map((_, n) => n)
        .sort((a, b) => compareNodes(all, a, b))
        .slice(0, budget[i]!);
      const rank = new Map(ranked.map((n, r) => [n, r]));
      const order = [...ranked].sort((a, b) => all[a]!.depth - all[b]!.depth || rank.get(a)! - rank.get(b)!);
      const at = new Map(order.map((n, e) => [n, e]));
      const tokens = new Int32Array(order.length);
      const parents = new Int32Array(order.length);
      order.forEach((n, e) => {
        const nd = all[n]!;
        tokens[e] = w.draftToTarget[nd.draft]!;
        const pe = nd.parent < 0 ? -1 : at.get(nd.parent);
        if (pe === undefined)
          throw new DrafterError(
            `eagle3: propose: internal error: tree node ${n} of sequence ${String(s.id)} selected without its parent`,
          );
        parents[e] = pe;
      });
      return { id: s.id, tokens, parents };
    });
  }

  buildPDInput(id: SequenceId): unknown {
    throw new DrafterError(`eagle3: buildPDInput(${String(id)}): prefill/decode hand-over is not supported yet`);
  }

  acceptPDInput(_payload: unknown): void {
    throw new DrafterError('eagle3: acceptPDInput: prefill/decode hand-over is not supported yet');
  }

  addSequence(id: SequenceId): void {
    this.pool.addSequence(id);
  }

  contextLength(id: SequenceId): number {
    return this.pool.length(id);
  }

  freeSequence(id: SequenceId): void {
    this.pool.free(id);
    this.lastG.delete(id);
  }

  dispose(): void {
    this.w = undefined;
    this.lastG.clear();
  }

  private weights(): Eagle3Weights {
    if (this.w === undefined) throw new DrafterError('eagle3: the drafter was disposed');
    return this.w;
  }

  /** `[input_layernorm(emb); hidden_norm(g)]` for `n` rows → `[n, 2D]` f32. */
  private layerInput(emb: Float32Array, g: Float32Array, n: number): Float32Array {
    const c = this.config;
    const w = this.weights();
    return concatRows(rmsNorm(emb, w.inputNorm, c.rmsNormEps), rmsNorm(g, w.hiddenNorm, c.rmsNormEps), n, c.hiddenSize);
  }

  /** After attention: h = r + o_proj(a) (r = g, or hidden_norm(g)); h + mlp(post_attention_layernorm(h)) → `[n, D]`. */
  private finish(g: Float32Array, a: Float32Array, n: number): Float32Array {
    const c = this.config;
    const w = this.weights();
    const h = c.normBeforeResidual ? rmsNorm(g, w.hiddenNorm, c.rmsNormEps) : Float32Array.from(g);
    const o = this.reduce(gemmBf16(a, n, w.o));
    for (let e = 0; e < h.length; e++) h[e] = h[e]! + o[e]!;
    const xm = rmsNorm(h, w.postNorm, c.rmsNormEps);
    const m = this.reduce(gemmBf16(swigluFused(gemmBf16(xm, n, w.gateUp), this.inter), n, w.down));
    for (let e = 0; e < h.length; e++) h[e] = h[e]! + m[e]!;
    return h;
  }

  /** From projected rows `y [n, width]` whose columns [col, col + 2W) are k ; v: K = RoPE(k) at `positions`, V = v → `[n, KV, hd]` f32 each. */
  private keysValues(y: Float32Array, positions: Int32Array, col: number): [Float32Array, Float32Array] {
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
