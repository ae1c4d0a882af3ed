/**
 * The EAGLE-3 drafter, chain drafting (SafeAILab/EAGLE, arXiv 2503.01840; REFERENCE.md §5). Oracle:
 * tools/reference/specd_ref/eagle3.py (`Eagle3Draft.qkv`, `finish`, `logits`; the module docstring
 * pins the semantics) and tools/reference/eval_tau.py (`Proposer._eagle`, the inference chain).
 *
 * - Context entry of anchor t (every committed row, `writeProjectedContextKV`): g_t = fc(concat taps
 *   at t) = Σ_i h_i · fc_iᵀ, accumulated in fp32 per stage (`projectTargetHiddenPartial`; no norm after
 *   the sum); x = [input_layernorm(embed(x_{t+1})); hidden_norm(g_t)] (2H, `embed` = the target's
 *   embedding, x_{t+1} = `span.nextTokens`); K = RoPE_neox(k_proj x) at position t (no k-norm), V =
 *   v_proj x, written into the draft KV pages. The fc output of each sequence's last row is kept:
 *   propose needs g of anchor p − 1.
 * - propose at `position` p (= draft context length; `lastToken` = x_p), steps j = 1 … k, batched over
 *   sequences (one GEMM per weight per step):
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
 *
 * Draft KV: one core {@link PagedKvPool} with "layers" 0 (K) and 1 (V), `numKvHeads · headDim` f32 per
 * token, NHD pages — the layout of @specd/native's `pagedAttention`.
 */

import {
  DrafterError, PagedKvPool, WeightReader, sampleFromProbs, samplingProbs,
  type ContextSpan, type DraftBatch, type Drafter, type DrafterLoadOptions, type DrafterSource, type DraftProposal,
  type SequenceId, type StageInfo, type StageModel,
} from '@specd/core';
import {
  applyRope, argmax, gemmBf16, makePagedBatch, packBf16Weights, pagedAttention, rmsNorm, swigluFused, writeKvPages,
  type KvPageLayout, type PackedBf16Weights,
} from '@specd/native';

import { EAGLE3_DEFAULT_DRAFT_TOKENS, parseEagle3Settings, type Eagle3Config } from './config.js';

/** Tokens per draft KV page. */
const DRAFT_PAGE_SIZE = 16;

/** Target layer kinds that are (softmax) attention: a tree could be verified with a tree mask. */
const ATTENTION_LAYER_KINDS: readonly string[] = Object.freeze(['mla', 'attention', 'full_attention', 'sliding_attention', 'mha', 'gqa', 'mqa']);

/** Weight-name prefixes of the decoder layer: EAGLE-3 layout, then the speculators layout. */
export const EAGLE3_LAYER_PREFIXES: readonly string[] = Object.freeze(['midlayer.', 'layers.0.']);

/** The packed weights of the draft (one decoder layer + head). */
interface Eagle3Weights {
  /** fc column block of each tap (checkpoint order), `[D, D]` packed. */
  readonly fcBlocks: PackedBf16Weights[];
  readonly inputNorm: Float32Array;
  readonly hiddenNorm: Float32Array;
  readonly postNorm: Float32Array;
  readonly finalNorm: Float32Array;
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
  readonly lmHead: PackedBf16Weights;
  /** Target id of each draft id (`draft_id + d2t[draft_id]`), `[draftVocab]` i32. */
  readonly draftToTarget: Int32Array;
}

/** Copies columns [col, col + width) of `src [rows, srcWidth]` into a new `[rows, width]` array. */
function sliceColumns<T extends Float32Array | Uint16Array>(src: T, rows: number, srcWidth: number, col: number, width: number, make: (n: number) => T): T {
  const out = make(rows * width);
  for (let r = 0; r < rows; r++) out.set(src.subarray(r * srcWidth + col, r * srcWidth + col + width), r * width);
  return out;
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

/**
 * The "tree needs per-branch state" refusal: a tree can be verified in one target forward only with
 * a tree attention mask, which recurrent (linear-attention) layers cannot apply without one state per branch.
 * On an all-attention target: tree verification itself is not implemented yet.
 */
function treeRefusal(info: StageInfo): DrafterError {
  const byKind = new Map<string, number[]>();
  info.layerKinds.forEach((k, i) => {
    if (ATTENTION_LAYER_KINDS.includes(k)) return;
    let l = byKind.get(k);
    if (l === undefined) byKind.set(k, l = []);
    l.push(i);
  });
  if (byKind.size === 0) return new DrafterError('eagle3: tree verification is not implemented yet (chain drafting only); omit `tree`');
  const what = [...byKind].map(([k, ls]) => `${k === 'kda' ? 'KDA' : `"${k}"`} layers (layers ${ls.join(', ')})`).join(', ');
  return new DrafterError(`eagle3: EAGLE-3 tree drafting needs per-branch linear-attention state, which targets with ${what} do not have; use chain drafting (omit \`tree\`)`);
}

/**
 * Loads an EAGLE-3 checkpoint (EAGLE-3 or speculators layout) for `options.target` (validated against
 * it) and packs its weights. `options.settings` (the config's `drafter` branch) may set
 * `num_draft_tokens` (the chain length; default the checkpoint's `speculative_tokens`, else 6) and `tree`.
 * Weight names: `fc.weight`, `<prefix>{input_layernorm, hidden_norm, post_attention_layernorm,
 * self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj}.weight` with prefix `midlayer.` or `layers.0.`,
 * `norm.weight`, `lm_head.weight`, `d2t` (I64 or I32; required unless draft_vocab_size = vocab_size,
 * then the identity); `t2d` and `embed_tokens.weight` are not read (the target's embedding is used).
 * @throws {DrafterError} if `tree` is set (layer kinds named), hidden or vocabulary sizes differ from
 *   the target's, `fc` is not `[hidden, taps × hidden]`, a tap is beyond the target's layers, the
 *   target lacks `embedTokens`, `d2t` is missing or maps outside the target vocabulary, or a tensor
 *   is missing / mis-shaped.
 */
export function loadEagle3Drafter(source: DrafterSource, config: Eagle3Config, options: DrafterLoadOptions): Eagle3Drafter {
  const c = config;
  const t = options.target;
  const info = t.info;
  const where = `eagle3: ${source.dir}`;
  const settings = parseEagle3Settings(options.settings);
  if (settings.tree !== undefined) throw treeRefusal(info);
  if (c.hiddenSize !== info.hiddenSize) throw new DrafterError(`${where}: hidden_size ${c.hiddenSize} differs from the target's ${info.hiddenSize}`);
  if (c.vocabSize !== info.vocabSize) throw new DrafterError(`${where}: vocab_size ${c.vocabSize} differs from the target's ${info.vocabSize}`);
  if (c.draftVocabSize > c.vocabSize) throw new DrafterError(`${where}: draft_vocab_size ${c.draftVocabSize} exceeds vocab_size ${c.vocabSize}`);
  const r = new WeightReader(source.weights, { makeError: (m) => new DrafterError(`${where}: ${m}`) });
  const D = c.hiddenSize;
  const nT = c.taps.length;
  const fcShape = r.shape('fc.weight');
  if (fcShape.length !== 2 || fcShape[0] !== D || fcShape[1] !== nT * D) {
    throw new DrafterError(`${where}: fc.weight is [${fcShape.join(', ')}], expected [${D}, ${nT * D}] (hidden ${D}, taps × hidden = ${nT} × ${D})`);
  }
  const bad = c.taps.filter((tap) => tap > info.numLayers);
  if (bad.length > 0) {
    throw new DrafterError(`${where}: eagle_aux_hidden_state_layer_ids [${c.taps.join(', ')}] name taps [${bad.join(', ')}] the target does not have (it has taps 0..${info.numLayers}, ${info.numLayers} layers)`);
  }
  if (t.embedTokens === undefined) throw new DrafterError(`${where}: the target stage exposes no embedTokens (EAGLE-3 reuses the target's embedding)`);
  const Vd = c.draftVocabSize;
  let draftToTarget: Int32Array;
  if (source.weights.has('d2t')) {
    const ti = source.weights.info('d2t');
    const n = ti.shape.reduce((a, b) => a * b, 1);
    if (n !== Vd) throw new DrafterError(`${where}: d2t is [${ti.shape.join(', ')}], expected [${Vd}] (draft_vocab_size)`);
    const raw = source.weights.read('d2t').data;
    draftToTarget = new Int32Array(Vd);
    for (let i = 0; i < Vd; i++) {
      let off: number;
      if (raw instanceof BigInt64Array) off = Number(raw[i]!);
      else if (raw instanceof Int32Array) off = raw[i]!;
      else throw new DrafterError(`${where}: d2t: expected dtype I64 or I32, got ${ti.dtype}`);
      const id = i + off;
      if (!(id >= 0 && id < info.vocabSize)) throw new DrafterError(`${where}: d2t[${i}] = ${off} maps draft id ${i} to ${id}, outside the target vocabulary [0, ${info.vocabSize})`);
      draftToTarget[i] = id;
    }
  } else if (Vd === c.vocabSize) {
    draftToTarget = Int32Array.from({ length: Vd }, (_, i) => i);
  } else {
    throw new DrafterError(`${where}: checkpoint has no tensor "d2t" (the draft → target vocabulary map), required since draft_vocab_size ${Vd} < vocab_size ${c.vocabSize}`);
  }
  const p = EAGLE3_LAYER_PREFIXES.find((x) => r.has(`${x}self_attn.q_proj.weight`));
  if (p === undefined) throw new DrafterError(`${where}: checkpoint has no decoder layer (neither "midlayer.self_attn.q_proj.weight" nor "layers.0.self_attn.q_proj.weight")`);
  const H = c.numHeads;
  const KV = c.numKvHeads;
  const hd = c.headDim;
  const I = c.intermediateSize;
  const fc = r.bf16('fc.weight', [D, nT * D]);
  const qkvNames = ['q_proj', 'k_proj', 'v_proj'].map((n) => `${p}self_attn.${n}.weight`);
  const w: Eagle3Weights = {
    fcBlocks: c.taps.map((_, i) => packBf16Weights(sliceColumns(fc, D, nT * D, i * D, D, (n) => new Uint16Array(n)), D, D)),
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
  const maxDraftTokens = settings.numDraftTokens ?? c.speculativeTokens ?? EAGLE3_DEFAULT_DRAFT_TOKENS;
  const pagesPerSeq = Math.ceil((options.maxTokensPerSequence + maxDraftTokens) / DRAFT_PAGE_SIZE) + 1;
  return new Eagle3Drafter(c, t, w, maxDraftTokens, options.maxSequences * pagesPerSeq);
}

/** A loaded EAGLE-3 drafter bound to one target stage (chain drafting). */
export class Eagle3Drafter implements Drafter {
  readonly method = 'eagle3';
  /** Chain length: drafts per step at most. */
  readonly maxDraftTokens: number;
  /** Draft KV (see the module comment). */
  readonly pool: PagedKvPool;
  private readonly layout: KvPageLayout;
  /** fc output g of each sequence's last context row, `[D]` f32. */
  private readonly lastG = new Map<SequenceId, Float32Array>();

  constructor(
    readonly config: Eagle3Config,
    private readonly target: StageModel,
    private w: Eagle3Weights | undefined,
    maxDraftTokens: number,
    numPages: number,
  ) {
    const c = config;
    this.maxDraftTokens = maxDraftTokens;
    this.pool = new PagedKvPool({ layers: [0, 1], floatsPerToken: c.numKvHeads * c.headDim, pageSize: DRAFT_PAGE_SIZE, numPages });
    this.layout = Object.freeze({ numPages, pageSize: DRAFT_PAGE_SIZE, numKvHeads: c.numKvHeads, headDim: c.headDim, kvLayout: 'NHD' });
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
    if (bad.length > 0) throw new DrafterError(`eagle3: captureSetter: taps [${bad.join(', ')}] are beyond the target's ${target.numLayers} layers`);
    return this.config.taps;
  }

  projectTargetHiddenPartial(stageTaps: ReadonlyMap<number, Float32Array>, numTokens: number, accumulator?: Float32Array): Float32Array {
    const D = this.config.hiddenSize;
    const w = this.weights();
    const acc = accumulator ?? new Float32Array(numTokens * D);
    if (acc.length !== numTokens * D) throw new DrafterError(`eagle3: projectTargetHiddenPartial: accumulator: expected [${numTokens}, ${D}] f32, got length ${acc.length}`);
    for (const [tap, h] of stageTaps) {
      const i = this.config.taps.indexOf(tap);
      if (i < 0) throw new DrafterError(`eagle3: projectTargetHiddenPartial: stageTaps: tap ${tap} is not one of [${this.config.taps.join(', ')}]`);
      if (h.length !== numTokens * D) throw new DrafterError(`eagle3: projectTargetHiddenPartial: tap ${tap}: expected [${numTokens}, ${D}] f32, got length ${h.length}`);
      const y = gemmBf16(h, numTokens, w.fcBlocks[i]!);
      for (let e = 0; e < acc.length; e++) acc[e] = acc[e]! + y[e]!;
    }
    return acc;
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
    if (sum.length !== n * D) throw new DrafterError(`eagle3: writeProjectedContextKV: sum: expected [${n}, ${D}] f32, got length ${sum.length}`);
    for (const s of spans) {
      const have = this.pool.length(s.id);
      if (s.position !== have) throw new DrafterError(`eagle3: writeProjectedContextKV: sequence ${String(s.id)}: position ${s.position} is not the draft context length ${have}`);
      if (s.nextTokens === undefined) {
        throw new DrafterError(`eagle3: writeProjectedContextKV: sequence ${String(s.id)}: nextTokens is missing (EAGLE-3's context entry of position t reads the token x_{t+1})`);
      }
      if (s.nextTokens.length !== s.numTokens) throw new DrafterError(`eagle3: writeProjectedContextKV: sequence ${String(s.id)}: nextTokens: expected [${s.numTokens}] i32, got length ${s.nextTokens.length}`);
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
    const x = this.layerInput(this.target.embedTokens!(next), sum, n);
    const [k, v] = this.keysValues(gemmBf16(x, n, w.kv), positions, 0);
    writeKvPages(this.layout, k, v, this.pool.layerStore(0), this.pool.layerStore(1), this.slotsOf(spans.map((s) => ({ id: s.id, start: s.position, n: s.numTokens }))));
    at = 0;
    for (const s of spans) {
      at += s.numTokens;
      if (s.numTokens > 0) this.lastG.set(s.id, sum.slice((at - 1) * D, at * D));
    }
  }

  /**
   * Chain drafts for every sequence (module comment): `maxDrafts` steps each, batched per step.
   * @throws {DrafterError} if maxDrafts is outside [1, maxDraftTokens], a position is not the draft
   *   context length, or a sequence has no context yet (position 0).
   */
  propose(batch: DraftBatch): DraftProposal[] {
    const c = this.config;
    const D = c.hiddenSize;
    const H = c.numHeads;
    const hd = c.headDim;
    const W = c.numKvHeads * hd;
    const Vd = c.draftVocabSize;
    const V = this.target.info.vocabSize;
    const w = this.weights();
    const seqs = batch.sequences;
    const S = seqs.length;
    seqs.forEach((s, i) => {
      if (!(s.maxDrafts >= 1 && s.maxDrafts <= this.maxDraftTokens)) throw new DrafterError(`eagle3: propose: sequences[${i}].maxDrafts: expected [1, ${this.maxDraftTokens}], got ${s.maxDrafts}`);
      const have = this.pool.length(s.id);
      if (s.position !== have) throw new DrafterError(`eagle3: propose: sequences[${i}] (${String(s.id)}): position ${s.position} is not the draft context length ${have}`);
      if (s.position < 1 || !this.lastG.has(s.id)) throw new DrafterError(`eagle3: propose: sequences[${i}] (${String(s.id)}): no draft context yet (EAGLE-3 drafts from the last context entry)`);
    });
    if (S === 0) return [];
    const kMax = seqs.reduce((m, s) => Math.max(m, s.maxDrafts), 0);
    const tokens = seqs.map((s) => new Int32Array(s.maxDrafts));
    const probs = seqs.map((s) => (s.sampling.temperature > 0 ? new Float32Array(s.maxDrafts * V) : undefined));
    // per active sequence: g (the step's residual input) and the step's input token
    let active = seqs.map((_, i) => i);
    let g = new Float32Array(S * D);
    seqs.forEach((s, i) => g.set(this.lastG.get(s.id)!, i * D));
    let tok = Int32Array.from(seqs, (s) => s.lastToken);
    const grown: SequenceId[] = [];
    try {
      for (let j = 1; j <= kMax; j++) {
        const n = active.length;
        const x = this.layerInput(this.target.embedTokens!(tok), g, n);
        let q: Float32Array;
        if (j === 1) {
          // the query of anchor p − 1; its K/V are already the last context entry
          q = gemmBf16(x, n, w.q);
          applyRope(q, Int32Array.from(active, (i) => seqs[i]!.position - 1), { heads: H, headDim: hd, theta: c.ropeTheta, style: 'neox' }, q);
        } else {
          const pos = Int32Array.from(active, (i) => seqs[i]!.position + j - 2);
          const qkv = gemmBf16(x, n, w.qkv);
          q = sliceColumns(qkv, n, H * hd + 2 * W, 0, H * hd, (m) => new Float32Array(m));
          applyRope(q, pos, { heads: H, headDim: hd, theta: c.ropeTheta, style: 'neox' }, q);
          const [k, v] = this.keysValues(qkv, pos, H * hd);
          for (const i of active) {
            const s = seqs[i]!;
            if (j === 2) grown.push(s.id);
            this.pool.extend(s.id, s.position + j - 1);
          }
          writeKvPages(this.layout, k, v, this.pool.layerStore(0), this.pool.layerStore(1), this.slotsOf(active.map((i) => ({ id: seqs[i]!.id, start: seqs[i]!.position + j - 2, n: 1 }))));
        }
        const attnBatch = makePagedBatch(active.map((i) => ({ qLen: 1, kvLen: seqs[i]!.position + j - 1, pages: this.pool.blockTable(seqs[i]!.id) })));
        const a = pagedAttention(q, this.pool.layerStore(0), this.pool.layerStore(1), this.layout, attnBatch, { numHeads: H, scale: 1 / Math.sqrt(hd), mask: 'causal' });
        const h = this.finish(g, a, n);
        const logits = gemmBf16(rmsNorm(h, w.finalNorm, c.rmsNormEps), n, w.lmHead);
        const greedy = argmax(logits, Vd);
        const nextActive: number[] = [];
        const nextRows: number[] = [];
        active.forEach((i, row) => {
          const s = seqs[i]!;
          const lg = logits.subarray(row * Vd, (row + 1) * Vd);
          let d: number;
          const qRow = probs[i];
          if (qRow === undefined) {
            d = greedy[row]!;
          } else {
            const qd = samplingProbs(lg, Vd, s.sampling);
            d = sampleFromProbs(qd, s.rng);
            const full = qRow.subarray((j - 1) * V, j * V);
            for (let e = 0; e < Vd; e++) full[w.draftToTarget[e]!] = qd[e]!;
          }
          tokens[i]![j - 1] = w.draftToTarget[d]!;
          if (s.maxDrafts > j) {
            nextActive.push(i);
            nextRows.push(row);
          }
        });
        const ng = new Float32Array(nextRows.length * D);
        nextRows.forEach((row, r) => ng.set(h.subarray(row * D, (row + 1) * D), r * D));
        tok = Int32Array.from(nextActive, (i) => tokens[i]![j - 1]!);
        g = ng;
        active = nextActive;
      }
    } finally {
      for (const id of grown) this.pool.truncate(id, seqs.find((s) => s.id === id)!.position);
    }
    return seqs.map((s, i) => (probs[i] === undefined ? { id: s.id, tokens: tokens[i]! } : { id: s.id, tokens: tokens[i]!, probs: probs[i]! }));
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
    const o = gemmBf16(a, n, w.o);
    for (let e = 0; e < h.length; e++) h[e] = h[e]! + o[e]!;
    const xm = rmsNorm(h, w.postNorm, c.rmsNormEps);
    const m = gemmBf16(swigluFused(gemmBf16(xm, n, w.gateUp), c.intermediateSize), n, w.down);
    for (let e = 0; e < h.length; e++) h[e] = h[e]! + m[e]!;
    return h;
  }

  /** From projected rows `y [n, width]` whose columns [col, col + 2W) are k ; v: K = RoPE(k) at `positions`, V = v → `[n, KV, hd]` f32 each. */
  private keysValues(y: Float32Array, positions: Int32Array, col: number): [Float32Array, Float32Array] {
    const c = this.config;
    const n = positions.length;
    const W = c.numKvHeads * c.headDim;
    const width = y.length / n;
    const k = sliceColumns(y, n, width, col, W, (m) => new Float32Array(m));
    const v = sliceColumns(y, n, width, col + W, W, (m) => new Float32Array(m));
    applyRope(k, positions, { heads: c.numKvHeads, headDim: c.headDim, theta: c.ropeTheta, style: 'neox' }, k);
    return [k, v];
  }

  /** Pool slots (page · pageSize + offset) of tokens [start, start + n) of each sequence, concatenated. */
  private slotsOf(ranges: readonly { id: SequenceId; start: number; n: number }[]): Int32Array {
    const total = ranges.reduce((a, r) => a + r.n, 0);
    const slots = new Int32Array(total);
    const F = this.pool.floatsPerToken;
    let at = 0;
    for (const r of ranges) for (let i = 0; i < r.n; i++) slots[at++] = this.pool.tokenOffset(r.id, r.start + i) / F;
    return slots;
  }
}
