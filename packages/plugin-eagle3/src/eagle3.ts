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
 * - Confidence (`DraftProposal.confidence`, chains only, with `drafter.confidence: true`): c_j = max_x q_j(x), the
 *   largest probability of step j's draft distribution — softmax(logits_j) for a greedy draft (its own probability,
 *   EAGLE-2's confidence score: Li et al., arXiv 2406.16858, §4, drafts of higher draft probability are accepted
 *   more often), the sampling distribution's for a sampled one. c_j is a function of q_j, fixed before d_j is drawn,
 *   so the engine's verify budgets (a stopping rule on c_1 … c_j) keep rejection sampling exact. It predicts well
 *   (SmolLM2, 64 prompts, greedy chains of 6: c < 0.2 accepted 0.20, c ∈ [0.5, 0.6) 0.73, c ≥ 0.95 0.99), but off by
 *   default: cutting proposals by it made SmolLM2 + EAGLE-3 no faster at one sequence (bench/spec-steps.mjs: ×1.665
 *   either way) and, under load, made the cost policy draft where plain decoding was faster (its rule prices a
 *   proposal as verified whole: at 4 sequences it predicted 10.4 committed tokens in 10.7 ms for steps that gave 7.1
 *   in 8.6; ×0.84 of plain) — docs/BENCHMARKS.md, "EAGLE-3 confidences…".
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
 * Draft KV: core's {@link DraftKvCache} of one draft layer (pool "layers" 0 = K, 1 = V), `numKvHeads ·
 * headDim` f32 per token, NHD pages — the layout of @specd/native's `pagedAttention`.
 *
 * Last feature g: each sequence holds a slot of a fixed pool `[maxSequences, hiddenSize]` f32 (given at
 * addSequence, zeroed, returned at freeSequence) where g of its last context row is kept.
 *
 * Prefill/decode disaggregation ({@link DraftContextTransfer}): the context is the draft KV pages
 * (`'draft-kv'` layer 0 part `'k'` / `'v'`) AND g (`'draft-state'` layer 0 part `'last-feature'`, the
 * sequence's slot of region `draft-state/last-feature`): step 1 of every chain reads g of anchor p − 1, so a
 * decode side without it would draft from a zero feature. The pool is one region registered once (a transfer
 * engine registers memory at startup, as NIXL does; a region per sequence would be registered per request).
 *
 * Files: eagle3-load.ts (checkpoint checks and packing, TP shards, pipeline projection shares),
 * eagle3-model.ts (the draft layer's step math), eagle3-chain.ts (chains), eagle3-tree.ts (trees), this
 * file (the drafter: context entries, propose).
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
  CacheError,
  applyBlockLinear,
  DrafterBase,
  DrafterError,
  DraftKvCache,
  f32Region,
  sampleFromSupport,
  samplingProbs,
  sharedFloat32,
  supportOf,
  type ContextSpan,
  type DraftBatch,
  type DraftProposal,
  type DraftContextTransfer,
  type DraftSequence,
  type DraftShard,
  type LocalEntry,
  type MemoryRegion,
  type PagedKvPool,
  type SequenceId,
  type ProjectionFormat,
  type StageInfo,
  type StageModel,
} from '@specd/core';

import { eagle3Taps, type Eagle3Config, type Eagle3TreeSettings } from './config.js';
import { runChain } from './eagle3-chain.js';
import { Eagle3Model, type Eagle3Weights } from './eagle3-model.js';
import { proposeTree } from './eagle3-tree.js';

/** Region of the g slots (module comment, "Last feature g"). */
const LAST_FEATURE_REGION = 'draft-state/last-feature';

/** A sampled chain step's q support ({@link samplingProbs}), reused step after step. */
let chainSupport = new Int32Array(0);
const chainCount = new Int32Array(1);

/**
 * A loaded EAGLE-3 drafter bound to one target stage (chain drafting, or greedy dynamic trees). Sequence
 * bookkeeping (add / context length / pages in use) is core's {@link DrafterBase} over its {@link DraftKvCache}.
 */
export class Eagle3Drafter extends DrafterBase implements DraftContextTransfer {
  readonly method = 'eagle3';
  /** Drafts per step at most: the chain length, or `tree.totalTokens` in tree mode. */
  readonly maxDraftTokens: number;
  /** Draft KV (see the module comment): one draft layer, its K and V. */
  readonly kv: DraftKvCache;
  /** The draft model's step math (weights, tensor-parallel plumbing). */
  private readonly model: Eagle3Model;
  /**
   * fc output g of each sequence's last context row, `[D]` f32: a view of the sequence's slot of
   * {@link gStore}, present once a context row was written (or reserved for a transfer).
   */
  private readonly lastG = new Map<SequenceId, Float32Array>();
  /** The g slots, `[maxSequences, D]` f32 (module comment, "Last feature g"). */
  private gStore: Float32Array;
  /** Free g slots (popped from the end). */
  private readonly freeGSlots: number[] = [];
  /** The g slot of each added sequence. */
  private readonly gSlots = new Map<SequenceId, number>();

  /** Whether chain proposals carry `confidence` (the deployment config's `drafter.confidence`; module comment). */
  confidence = false;

  constructor(
    readonly config: Eagle3Config,
    private readonly target: StageModel,
    w: Eagle3Weights | undefined,
    maxDraftTokens: number,
    numPages: number,
    /** Sequences at once, at most (g slots). */
    maxSequences: number,
    /** Dynamic-tree settings (greedy sequences draft trees); undefined = chain drafting. */
    readonly tree?: Eagle3TreeSettings,
    /** The rank's tensor-parallel group and blocks; undefined = the whole draft model on this thread. */
    readonly tp?: DraftShard,
  ) {
    const kv = new DraftKvCache({
      numLayers: 1,
      numKvHeads: tp?.kvHeads ?? config.numKvHeads,
      totalKvHeads: config.numKvHeads,
      headDim: config.headDim,
      numPages,
    });
    super(kv);
    this.kv = kv;
    this.maxDraftTokens = maxDraftTokens;
    this.model = new Eagle3Model(config, target, w, tp);
    if (!(Number.isSafeInteger(maxSequences) && maxSequences >= 1))
      throw new DrafterError(`eagle3: maxSequences: expected an integer >= 1, got ${maxSequences}`);
    // shared memory: under tensor parallelism a PD transfer on the driver's thread reads / writes every rank's g
    this.gStore = sharedFloat32(maxSequences * config.hiddenSize);
    for (let s = maxSequences - 1; s >= 0; s--) this.freeGSlots.push(s);
  }

  /** The draft KV pages (block tables, token offsets, K/V stores). */
  get pool(): PagedKvPool {
    return this.kv.pool;
  }

  /** Target id of each draft-vocabulary id, `[draftVocab]` i32. */
  get draftToTarget(): Int32Array {
    return this.model.weights().draftToTarget;
  }

  override captureSetter(target: StageInfo): readonly number[] {
    return eagle3Taps(this.config, target);
  }

  /** The context projection's weight format (the `weights` setting's: Q8_0 by default on the CPU). */
  get projectionFormat(): ProjectionFormat {
    return this.model.weights().projection.format;
  }

  override projectTargetHiddenPartial(
    stageTaps: ReadonlyMap<number, Float32Array>,
    numTokens: number,
    accumulator?: Float32Array,
  ): Float32Array {
    return this.model.weights().projection.projectTargetHiddenPartial(stageTaps, numTokens, accumulator);
  }

  /**
   * Context entries of the spans' rows: K/V of [input_layernorm(embed(nextTokens)); hidden_norm(sum)]
   * at the rows' absolute positions (module comment); keeps each span's last row of `sum` as g.
   * @param sum `[Σ numTokens, hiddenSize]` f32, fc(taps) of the rows.
   * @throws {DrafterError} if a span lacks `nextTokens` (or it is not `[numTokens]`), a position is
   *   not the sequence's draft context length, or `sum` has the wrong length.
   */
  override writeProjectedContextKV(sum: Float32Array, spans: readonly ContextSpan[]): void {
    const c = this.config;
    const D = c.hiddenSize;
    const w = this.model.weights();
    const n = spans.reduce((a, s) => a + s.numTokens, 0);
    if (sum.length !== n * D)
      throw new DrafterError(
        `eagle3: writeProjectedContextKV: sum: expected [${n}, ${D}] f32, got length ${sum.length}`,
      );
    for (const s of spans) {
      this.checkContextPosition(s, 'writeProjectedContextKV');
      if (s.nextTokens === undefined) {
        throw new DrafterError(
          `eagle3: writeProjectedContextKV: sequence ${String(s.id)}: nextTokens is missing ` +
            "(EAGLE-3's context entry of position t reads the token x_{t+1})",
        );
      }
      if (s.nextTokens.length !== s.numTokens)
        throw new DrafterError(
          `eagle3: writeProjectedContextKV: sequence ${String(s.id)}: nextTokens: expected [${s.numTokens}] i32, ` +
            `got length ${s.nextTokens.length}`,
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
    this.kv.extendAll(spans);
    const x = this.model.layerInput(this.model.embed(next), sum, n);
    const [k, v] = this.model.keysValues(applyBlockLinear(w.kv, x, n), positions, 0);
    this.kv.write(0, k, v, this.kv.slots(spans));
    at = 0;
    for (const s of spans) {
      at += s.numTokens;
      if (s.numTokens === 0) continue;
      const g = this.gOf(s.id);
      g.set(sum.subarray((at - 1) * D, at * D));
      this.lastG.set(s.id, g);
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
    const w = this.model.weights();
    const seqs = batch.sequences;
    seqs.forEach((s, i) => {
      this.checkMaxDrafts(s, i, this.maxDraftTokens);
      this.checkProposePosition(s, i);
      if (s.position < 1 || !this.lastG.has(s.id))
        throw new DrafterError(
          `eagle3: propose: sequences[${i}] (${String(s.id)}): no draft context yet ` +
            '(EAGLE-3 drafts from the last context entry)',
        );
    });
    if (seqs.length === 0) return [];
    if (!this.model.root) {
      // a worker rank of a tensor-parallel group: the same chain steps, no logits (chains only: trees are
      // refused under TP)
      runChain(
        this.model,
        this.kv,
        this.lastG,
        seqs,
        seqs.map((s) => s.maxDrafts),
        () => 0,
      );
      return [];
    }
    const tree = this.tree;
    const out = new Array<DraftProposal>(seqs.length);
    const chainAt: { i: number; s: DraftSequence }[] = [];
    const treeAt: { i: number; s: DraftSequence }[] = [];
    seqs.forEach((s, i) => {
      (tree !== undefined && !(s.sampling.temperature > 0) ? treeAt : chainAt).push({ i, s });
    });
    if (chainAt.length > 0) {
      const cs = chainAt.map(({ s }) => s);
      const lengths = cs.map((s) => (tree === undefined ? s.maxDrafts : Math.min(tree.depth, s.maxDrafts)));
      // q rows over the draft vocabulary [k, Vd] (the proposal's probsIds: draftToTarget names their token ids)
      const Vd = w.draftToTarget.length;
      const probs = cs.map((s, r) => (s.sampling.temperature > 0 ? new Float32Array(lengths[r]! * Vd) : undefined));
      if (probs.some((q) => q !== undefined) && chainSupport.length < Vd) chainSupport = new Int32Array(Vd);
      const support = { ids: chainSupport.subarray(0, Vd), counts: chainCount };
      // confidence c_j: the greedy draft's probability, or a sampled draft's distribution's largest (module
      // comment "Confidence"); written by runChain, a sampled step's overwritten by its pick
      const confidence = this.confidence ? lengths.map((k) => new Float32Array(k)) : undefined;
      const drafts = runChain(
        this.model,
        this.kv,
        this.lastG,
        cs,
        lengths,
        (r, j, lg, greedy) => {
          const qRow = probs[r];
          if (qRow === undefined) return greedy;
          const s = cs[r]!;
          // q's support (its kept tokens, few at the usual top-p): the confidence and the draw read only those
          const qd = samplingProbs(lg, lg.length, s.sampling, qRow.subarray((j - 1) * Vd, j * Vd), support);
          const kept = supportOf(support, 0, Vd); // undefined: a NaN row, which the draw throws on
          if (confidence !== undefined && kept !== undefined) {
            let top = 0;
            for (const v of kept) if (qd[v]! > top) top = qd[v]!;
            confidence[r]![j - 1] = top;
          }
          return sampleFromSupport(qd, kept, s.rng);
        },
        confidence,
      );
      chainAt.forEach(({ i, s }, r) => {
        const tokens = Int32Array.from(drafts[r]!, (d) => w.draftToTarget[d]!);
        const q = probs[r];
        const c = confidence?.[r];
        const p: DraftProposal =
          q === undefined ? { id: s.id, tokens } : { id: s.id, tokens, probs: q, probsIds: w.draftToTarget };
        out[i] = c === undefined ? p : { ...p, confidence: c };
      });
    }
    // (only with a tree are sequences put in treeAt)
    if (tree !== undefined && treeAt.length > 0) {
      const props = proposeTree(
        this.model,
        this.kv,
        this.lastG,
        treeAt.map(({ s }) => s),
        tree,
      );
      treeAt.forEach(({ i }, r) => {
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
    const have = this.contextLength(seq.id);
    if (seq.position !== have || seq.position < 1 || !this.lastG.has(seq.id)) {
      throw new DrafterError(
        `eagle3: forcedChainLogits: sequence ${String(seq.id)}: position ${seq.position} is not a drafting ` +
          `position (draft context length ${have})`,
      );
    }
    const out = new Float32Array((forced.length + 1) * Vd);
    runChain(this.model, this.kv, this.lastG, [seq], [forced.length + 1], (_r, j, lg) => {
      out.set(lg, (j - 1) * Vd);
      return j <= forced.length ? forced[j - 1]! : 0;
    });
    return out;
  }

  /**
   * add: registers `id` with an empty draft context and a zeroed g slot.
   * @throws `CacheError` `duplicate-sequence`, or `full` when every g slot is taken (maxSequences in use).
   */
  override addSequence(id: SequenceId): void {
    super.addSequence(id);
    const slot = this.freeGSlots.pop();
    if (slot === undefined) {
      super.freeSequence(id);
      throw new CacheError('full', `eagle3: addSequence: no free g slot (${this.gSlots.size} sequences in use)`);
    }
    this.gSlots.set(id, slot);
    this.gOf(id).fill(0);
  }

  /** free: drops the sequence's pages and its last context row g (its slot returns to the pool). Idempotent. */
  override freeSequence(id: SequenceId): void {
    super.freeSequence(id);
    this.lastG.delete(id);
    const slot = this.gSlots.get(id);
    if (slot === undefined) return;
    this.gSlots.delete(id);
    this.freeGSlots.push(slot);
  }

  /** PD: the draft KV page stores and the g pool (`draft-state/last-feature`, `[maxSequences, D]` f32). */
  pdRegions(): readonly MemoryRegion[] {
    return [...this.draftKvRegions(), f32Region(LAST_FEATURE_REGION, this.gStore)];
  }

  /**
   * PD: the sequence's draft KV pages (`'draft-kv'` layer 0 part `'k'` / `'v'`), then its g slot
   * (`'draft-state'` layer 0 part `'last-feature'`, hiddenSize · 4 bytes).
   * @throws `CacheError` `unknown-sequence`.
   */
  pdContextEntries(id: SequenceId): readonly LocalEntry[] {
    const kv = this.draftKvEntries(id);
    const bytes = this.config.hiddenSize * 4;
    const slot = this.gSlotOf(id);
    return [
      ...kv,
      {
        key: { kind: 'draft-state', layer: 0, part: 'last-feature', rank: 0 },
        ranges: [{ region: LAST_FEATURE_REGION, offset: slot * bytes, length: bytes }],
      },
    ];
  }

  /**
   * PD (decode side): allocates the pages of a `length`-row draft context and marks the sequence's g as
   * present (length > 0), for the transfer to fill both.
   * @throws as DrafterBase's `reserveDraftContext`.
   */
  pdReserveContext(id: SequenceId, length: number): void {
    this.reserveDraftContext(id, length);
    if (length > 0) this.lastG.set(id, this.gOf(id));
  }

  /** dispose: drops the weights (later proposals throw), every g and the draft KV. */
  override dispose(): void {
    this.model.dispose();
    this.lastG.clear();
    this.gSlots.clear();
    this.gStore = new Float32Array(0);
    super.dispose();
  }

  /** The g slot of `id`. @throws `CacheError` `unknown-sequence`. */
  private gSlotOf(id: SequenceId): number {
    const slot = this.gSlots.get(id);
    if (slot === undefined) throw new CacheError('unknown-sequence', `eagle3: unknown sequence ${String(id)}`);
    return slot;
  }

  /** A view of `id`'s g slot, `[D]` f32. @throws `CacheError` `unknown-sequence`. */
  private gOf(id: SequenceId): Float32Array {
    const D = this.config.hiddenSize;
    const slot = this.gSlotOf(id);
    return this.gStore.subarray(slot * D, (slot + 1) * D);
  }
}
