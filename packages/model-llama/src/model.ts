/**
 * A Llama-family stage: layers [layerStart, layerEnd) of the target, plus the embedding when
 * layerStart = 0 and the final norm + lm_head when layerEnd = num_hidden_layers.
 *
 * Decoder layer (HF transformers `LlamaDecoderLayer`, core's shared `denseBlock`): h += o_proj(attn(RoPE(q),
 * RoPE(k), v)) of input_layernorm(h); h += down(silu(gate(x)) · up(x)) with x = post_attention_layernorm(h).
 * Causal GQA over paged KV (K of layer l in cache layer 2l, V in 2l + 1, `numKvHeads · headDim` f32 per
 * token, NHD pages: @specd/native `pagedAttention`). One residual stream, so tap i = h entering
 * layer i (REFERENCE.md §2). No linear state: committing a verified prefix truncates the KV.
 */

import { denseBlock, forwardPrologue, keptScratch, sliceColumns } from '@specd/core';
import type {
  CacheGeometry,
  ForwardBatch,
  ForwardOptions,
  ForwardResult,
  PrefixCommit,
  SequenceCache,
  SequenceId,
  StageInfo,
  StageModel,
  TreeCommit,
} from '@specd/core';
import {
  applyRope,
  argmaxChecked,
  makePagedBatch,
  pagedAttention,
  prefetchPages,
  rmsNorm,
  writeKvPages,
  type KvPageLayout,
} from '@specd/native';

import type { LlamaConfig } from './config.js';
import type { EmbeddingTable, LinearWeights, LlamaTensorSource } from './weights.js';

/** Forwards of at most this many rows (decode, verify blocks) prefetch each layer's K/V pages. */
const PREFETCH_MAX_ROWS = 16;

/** Thrown for a malformed forward call (names the argument). */
export class LlamaForwardError extends Error {
  override readonly name = 'LlamaForwardError';
}

interface LayerWeights {
  readonly inputNorm: Float32Array;
  readonly postNorm: Float32Array;
  /** q_proj ; k_proj ; v_proj stacked: `[(H + 2·KV)·hd, D]`. */
  readonly qkv: LinearWeights;
  /** o_proj `[D, H·hd]`. */
  readonly o: LinearWeights;
  /** gate_proj ; up_proj stacked: `[2·I, D]`. */
  readonly gateUp: LinearWeights;
  /** down_proj `[D, I]`. */
  readonly down: LinearWeights;
}

/** One sequence's rows in a forward. */
interface Span {
  readonly id: SequenceId;
  readonly row: number;
  readonly numNew: number;
  readonly position: number;
  /** Tree verification: parent row of each new row (row 0: −1); absent for a chain. */
  readonly tree?: Int32Array;
  /** Depth of each new row in its tree (tree only). */
  readonly depth?: Int32Array;
}

/**
 * Validates a verify tree and returns each row's depth.
 * @throws {LlamaForwardError} unless `parents[0] = −1` and `0 ≤ parents[r] < r` for r ≥ 1.
 */
function treeDepths(parents: Int32Array, numNew: number, where: string): Int32Array {
  if (parents.length !== numNew)
    throw new LlamaForwardError(`${where}.tree: expected [${numNew}] parents (one per token), got ${parents.length}`);
  const depth = new Int32Array(numNew);
  parents.forEach((p, r) => {
    if (r === 0 ? p !== -1 : !(Number.isInteger(p) && p >= 0 && p < r)) {
      throw new LlamaForwardError(
        `${where}.tree[${r}]: expected ${r === 0 ? '-1 (the root)' : `a parent row in [0, ${r})`}, got ${p}`,
      );
    }
    if (r > 0) depth[r] = depth[p]! + 1;
  });
  return depth;
}

/** A Llama forward's result: the core one plus where each sequence's rows are (for commitPrefix). */
export interface LlamaForwardResult extends ForwardResult {
  readonly spans: readonly Span[];
}

/**
 * A loaded stage. Create with {@link loadLlamaStage}. Attention only, so it commits accepted prefixes
 * ({@link PrefixCommit}: the KV truncated) and verifies token trees ({@link TreeCommit}).
 */
export class LlamaStageModel implements StageModel, PrefixCommit, TreeCommit {
  readonly info: StageInfo;
  readonly cacheGeometry: CacheGeometry;
  /** Buffers of the forward's intermediates, kept between forwards (core's `keptScratch`). */
  private readonly scratch = keptScratch();

  constructor(
    readonly config: LlamaConfig,
    layerStart: number,
    layerEnd: number,
    private embed: EmbeddingTable | undefined,
    private layers: LayerWeights[],
    private finalNorm: Float32Array | undefined,
    private lmHeadWeights: LinearWeights | undefined,
  ) {
    const c = config;
    this.info = Object.freeze({
      numLayers: c.numLayers,
      layerStart,
      layerEnd,
      hiddenSize: c.hiddenSize,
      vocabSize: c.vocabSize,
      isFirst: layerStart === 0,
      isLast: layerEnd === c.numLayers,
      layerKinds: Object.freeze(new Array<string>(c.numLayers).fill('attention')),
    });
    const own: number[] = [];
    for (let l = layerStart; l < layerEnd; l++) own.push(2 * l, 2 * l + 1);
    this.cacheGeometry = Object.freeze({
      // GQA: a row is numKvHeads blocks of headDim, split by KV head under tensor parallelism
      pagedKv: { layers: own, floatsPerToken: c.numKvHeads * c.headDim, kvHeads: c.numKvHeads },
      linearState: { layers: [], heads: 1, keyDim: 1, valueDim: 1, convStates: 0, convChannels: 0, convWidth: 0 },
    });
  }

  /**
   * Runs the stage over a batch (prefill chunks, decode tokens and verify blocks alike; the same
   * kernels for all, so a token's logits do not depend on how tokens are grouped). Every sequence
   * must be registered in `cache` with `cache.length(id) === position`; the cache is extended by
   * its new tokens (all sequences or none).
   * @param batch `hidden` `[N, hiddenSize]` f32 from the previous stage when this stage is not the first.
   * @returns logits `[rows, vocabSize]` f32 for the rows each sequence asked for, hidden `[N, hiddenSize]`,
   *   and the asked taps (tap t = residual entering layer t) `[N, hiddenSize]` f32 each. With
   *   `options.argmaxOnly` (a greedy caller): `argmax` `[rows]` i32 of the same rows (@specd/native
   *   `argmaxChecked`: −1 for a row with a NaN, +Infinity or no finite value) and no logits.
   * @throws {LlamaForwardError} on an empty batch, a sequence listed twice, a bad token id, a position
   *   that disagrees with the cache, a missing / mis-sized `batch.hidden`, or a tap outside the stage.
   * @throws {CacheError} `full` when the KV pool has no room (nothing was extended).
   */
  forward(batch: ForwardBatch, cache: SequenceCache, options: ForwardOptions = {}): LlamaForwardResult {
    const c = this.config;
    const D = c.hiddenSize;
    const { layerStart, isLast } = this.info;
    // batch checks, spans, taps, embeddings or the previous stage's hidden, cache extension, tap layerStart
    const prologue = forwardPrologue(batch, cache, options, {
      info: this.info,
      error: (message) => new LlamaForwardError(message),
      span: (s, i, row): Span => {
        const tree = s.tree;
        return {
          id: s.id,
          row,
          numNew: s.tokens.length,
          position: s.position,
          ...(tree === undefined ? {} : { tree, depth: treeDepths(tree, s.tokens.length, `forward: sequences[${i}]`) }),
        };
      },
      embedRow: (id, out) => this.embed!.row(id, out),
      hiddenOnFirstStage: 'ignore',
    });
    const { spans, numTokens: N, hidden: h, captured, capture } = prologue;
    const kv = cache.kv!;
    const H = c.numHeads;
    const KV = c.numKvHeads;
    const hd = c.headDim;
    const positions = new Int32Array(N);
    const slots = new Int32Array(N);
    slots.set(kv.tokenSlots(spans.map((s) => ({ id: s.id, start: s.position, n: s.numNew }))));
    for (const s of spans) {
      for (let t = 0; t < s.numNew; t++) positions[s.row + t] = s.position + (s.depth === undefined ? t : s.depth[t]!);
    }
    const { layout, attnBatch } = spans.some((s) => s.tree !== undefined)
      ? treeAttention(spans, kv, KV, hd, slots)
      : {
          layout: {
            numPages: kv.numPages,
            pageSize: kv.pageSize,
            numKvHeads: KV,
            headDim: hd,
            kvLayout: 'NHD',
          } as KvPageLayout,
          attnBatch: makePagedBatch(
            spans.map((s) => ({ qLen: s.numNew, kvLen: s.position + s.numNew, pages: kv.blockTable(s.id) })),
          ),
        };
    const rope = { theta: c.ropeTheta, style: c.ropeStyle, headDim: hd } as const;
    const qw = H * hd;
    const kw = KV * hd;
    // The layers' intermediates (qkv, q, k, v, the attention output, the dense block's norms and projections) go
    // into buffers this stage keeps between forwards: each is consumed before the next layer (or forward) writes
    // it, and none leaves the forward. A decode step then allocates no array per layer (~1.2 µs each).
    const scratch = this.scratch;
    const block = { eps: c.rmsNormEps, intermediate: c.intermediateSize, scratch };
    const q = scratch('llama.q', N * qw);
    const k = scratch('llama.k', N * kw);
    const v = scratch('llama.v', N * kw);
    const attnOut = scratch('llama.attn', N * qw);
    const qkvOut = scratch('llama.qkv', N * (qw + 2 * kw));
    // Decode and verify steps (few rows, no tree): each layer's K/V pages are prefetched before its q/k/v GEMM,
    // so that they arrive while it streams weights (@specd/native prefetchPages; prefill reads them warm anyway).
    const prefetch =
      N <= PREFETCH_MAX_ROWS && spans.every((s) => s.tree === undefined)
        ? Int32Array.from(spans.flatMap((s) => Array.from(kv.blockTable(s.id))))
        : undefined;
    const pageElements = kv.pageSize * KV * hd;
    const ropeQ = { ...rope, heads: H };
    const ropeK = { ...rope, heads: KV };
    const attnOptions = { numHeads: H, scale: 1 / Math.sqrt(hd), mask: 'causal' } as const;
    for (let li = 0; li < this.layers.length; li++) {
      const l = layerStart + li;
      const w = this.layers[li]!;
      // attention of layer l on the normed rows xn: qkv, RoPE, this forward's K/V written, paged attention
      const attention = (xn: Float32Array): Float32Array => {
        const qkv = w.qkv.apply(xn, N, qkvOut);
        sliceColumns(qkv, N, qw + 2 * kw, 0, qw, q);
        sliceColumns(qkv, N, qw + 2 * kw, qw, kw, k);
        sliceColumns(qkv, N, qw + 2 * kw, qw + kw, kw, v);
        applyRope(q, positions, ropeQ, q);
        applyRope(k, positions, ropeK, k);
        const kStore = kv.layerStore(2 * l);
        const vStore = kv.layerStore(2 * l + 1);
        writeKvPages(layout, k, v, kStore, vStore, slots);
        return pagedAttention(q, kStore, vStore, layout, attnBatch, attnOptions, attnOut);
      };
      if (prefetch !== undefined) prefetchPages(kv.layerStore(2 * l), pageElements, prefetch, kv.layerStore(2 * l + 1));
      denseBlock(h, N, w, attention, block);
      capture(l + 1);
    }
    const logitRowStart = new Int32Array(spans.length + 1);
    let logits: Float32Array | undefined;
    if (isLast) {
      const rows: number[] = [];
      batch.sequences.forEach((s, i) => {
        const sp = spans[i]!;
        if (s.logits === 'all') for (let t = 0; t < sp.numNew; t++) rows.push(sp.row + t);
        else if (s.logits === 'last') rows.push(sp.row + sp.numNew - 1);
        logitRowStart[i + 1] = rows.length;
      });
      if (rows.length > 0) {
        const x = scratch('llama.headRows', rows.length * D);
        rows.forEach((r, i) => {
          x.set(h.subarray(r * D, (r + 1) * D), i * D);
        });
        const xn = rmsNorm(x, this.finalNorm!, c.rmsNormEps, scratch('llama.headNorm', rows.length * D));
        // logits in a kept buffer when nobody reads them past the caller's next forward (argmaxOnly, logitsScratch):
        // no [rows, vocab] array per step (0.2–1.5 MB: allocation and zero-fill); else fresh
        const V = c.vocabSize;
        const kept = options.argmaxOnly === true || options.logitsScratch === true;
        logits = this.lmHeadWeights!.apply(
          xn,
          rows.length,
          kept ? scratch('llama.logits', rows.length * V) : undefined,
        );
        // greedy, nothing processed: each row's argmax (−1 for a row with a NaN, +Infinity or no finite value)
        if (options.argmaxOnly === true)
          return {
            logits: undefined,
            argmax: argmaxChecked(logits, V),
            logitRowStart,
            hidden: h,
            taps: captured,
            spans,
          };
      } else {
        logits = new Float32Array(0);
        if (options.argmaxOnly === true)
          return { logits, argmax: new Int32Array(0), logitRowStart, hidden: h, taps: captured, spans };
      }
    }
    return { logits, logitRowStart, hidden: h, taps: captured, spans };
  }

  /**
   * {@link PrefixCommit}: keeps the first `committed` tokens of `id`'s block in `result` and drops the
   * rest of its KV (no linear state to restore). Works on any forward result of this stage.
   * @throws {LlamaForwardError} if `id` was not in the forward or `committed` is outside [1, block].
   */
  commitPrefix(cache: SequenceCache, result: ForwardResult, id: SequenceId, committed: number): void {
    const s = (result as LlamaForwardResult).spans?.find((x) => x.id === id);
    if (s === undefined) throw new LlamaForwardError(`commitPrefix: sequence ${String(id)} was not in this forward`);
    if (!(Number.isInteger(committed) && committed >= 1 && committed <= s.numNew)) {
      throw new LlamaForwardError(`commitPrefix: committed: expected an integer in [1, ${s.numNew}], got ${committed}`);
    }
    cache.rollback(id, { length: s.position + committed, state: undefined });
  }

  /**
   * {@link TreeCommit}: keeps the block rows `rows` of `id` (a root-to-node path of the tree it
   * was verified with) as its next tokens — each kept row's K/V (every layer of the stage) copied to
   * position `position + j`, the rest of the block dropped.
   * @throws {LlamaForwardError} if `id` was not in the forward, was verified without a tree, or `rows`
   *   is not a path from row 0.
   */
  commitTreePath(cache: SequenceCache, result: ForwardResult, id: SequenceId, rows: readonly number[]): void {
    const s = (result as LlamaForwardResult).spans?.find((x) => x.id === id);
    if (s === undefined) throw new LlamaForwardError(`commitTreePath: sequence ${String(id)} was not in this forward`);
    if (s.tree === undefined)
      throw new LlamaForwardError(`commitTreePath: sequence ${String(id)} was verified as a chain (use commitPrefix)`);
    rows.forEach((r, j) => {
      const ok = j === 0 ? r === 0 : Number.isInteger(r) && r > 0 && r < s.numNew && s.tree![r] === rows[j - 1];
      if (!ok)
        throw new LlamaForwardError(
          `commitTreePath: rows[${j}] = ${r} is not ${j === 0 ? 'the root row 0' : `a child of row ${rows[j - 1]}`}`,
        );
    });
    const kv = cache.kv!;
    const F = kv.floatsPerToken;
    for (let j = 1; j < rows.length; j++) {
      if (rows[j] === j) continue;
      const src = kv.tokenOffset(id, s.position + rows[j]!);
      const dst = kv.tokenOffset(id, s.position + j);
      for (const layer of this.cacheGeometry.pagedKv.layers) {
        const store = kv.layerStore(layer);
        store.copyWithin(dst, src, src + F);
      }
    }
    cache.rollback(id, { length: s.position + rows.length, state: undefined });
  }

  /**
   * The target's token embeddings (first stage only): `[tokens.length, hiddenSize]` f32.
   * @throws {LlamaForwardError} on a non-first stage or an id outside the vocabulary.
   */
  embedTokens(tokens: Int32Array): Float32Array {
    const D = this.config.hiddenSize;
    if (this.embed === undefined)
      throw new LlamaForwardError('embedTokens: this stage has no embedding (not the first stage, or disposed)');
    const out = new Float32Array(tokens.length * D);
    tokens.forEach((id, i) => {
      if (!(id >= 0 && id < this.config.vocabSize))
        throw new LlamaForwardError(`embedTokens: tokens[${i}]: id ${id} outside [0, ${this.config.vocabSize})`);
      this.embed!.row(id, out.subarray(i * D, (i + 1) * D));
    });
    return out;
  }

  /**
   * The lm_head alone (last stage only; the caller normalises): `x [rows, hiddenSize]` f32 →
   * `[rows, vocabSize]` f32.
   * @throws {LlamaForwardError} on a non-last stage or a mis-sized x.
   */
  lmHead(x: Float32Array, rows: number): Float32Array {
    if (this.lmHeadWeights === undefined)
      throw new LlamaForwardError('lmHead: this stage has no lm_head (not the last stage, or disposed)');
    if (x.length !== rows * this.config.hiddenSize)
      throw new LlamaForwardError(
        `lmHead: x: expected [${rows}, ${this.config.hiddenSize}] f32, got length ${x.length}`,
      );
    return this.lmHeadWeights.apply(x, rows);
  }

  /** Drops the weights (the stage is unusable afterwards). */
  dispose(): void {
    this.layers = [];
    this.embed = undefined;
    this.finalNorm = undefined;
    this.lmHeadWeights = undefined;
  }
}

/**
 * The attention batch of a forward with token trees, over the same pages viewed one token per page
 * (`pageSize 1`: a block table lists token slots): a chain sequence is one entry over its slots
 * 0 … position + numNew − 1; a tree row r is its own entry (qLen 1) over the cached slots, then the
 * slots of its ancestors and itself in depth order — key j of the entry is the token at position j of
 * r's root-to-r path, exactly the keys (and order) of that path decoded as a chain, so its output is
 * bit for bit the chain's (the kernels reduce by key index, attention_kernels.h).
 */
function treeAttention(
  spans: readonly Span[],
  kv: NonNullable<SequenceCache['kv']>,
  KV: number,
  hd: number,
  slots: Int32Array,
): { layout: KvPageLayout; attnBatch: ReturnType<typeof makePagedBatch> } {
  const layout: KvPageLayout = {
    numPages: kv.numPages * kv.pageSize,
    pageSize: 1,
    numKvHeads: KV,
    headDim: hd,
    kvLayout: 'NHD',
  };
  const entries: { qLen: number; kvLen: number; pages: Int32Array }[] = [];
  for (const s of spans) {
    const cached = kv.tokenSlots([{ id: s.id, start: 0, n: s.position }]);
    if (s.tree === undefined) {
      const pages = new Int32Array(s.position + s.numNew);
      pages.set(cached);
      pages.set(slots.subarray(s.row, s.row + s.numNew), s.position);
      entries.push({ qLen: s.numNew, kvLen: pages.length, pages });
      continue;
    }
    for (let r = 0; r < s.numNew; r++) {
      const d = s.depth![r]!;
      const pages = new Int32Array(s.position + d + 1);
      pages.set(cached);
      for (let a = r, k = d; a >= 0; a = s.tree[a]!, k--) pages[s.position + k] = slots[s.row + a]!;
      entries.push({ qLen: 1, kvLen: pages.length, pages });
    }
  }
  return { layout, attnBatch: makePagedBatch(entries) };
}

/** Options of {@link loadLlamaStage}. */
export interface LlamaLoadOptions {
  /** First layer of the stage, inclusive (default 0). */
  readonly layerStart?: number;
  /** End of the stage, exclusive (default: num_hidden_layers). */
  readonly layerEnd?: number;
}

/**
 * Builds a stage from a tensor source (HF names; safetensors or GGUF behind it), reading only the
 * tensors the stage needs. Yields after the embedding and after each layer (the async loader lets
 * the event loop run there).
 * @throws {LlamaWeightError} for a missing / mis-shaped tensor; RangeError for a bad layer range.
 */
export function* buildLlamaStage(
  c: LlamaConfig,
  src: LlamaTensorSource,
  options: LlamaLoadOptions = {},
): Generator<void, LlamaStageModel, void> {
  const start = options.layerStart ?? 0;
  const end = options.layerEnd ?? c.numLayers;
  if (!(Number.isInteger(start) && Number.isInteger(end) && start >= 0 && start < end && end <= c.numLayers)) {
    throw new RangeError(
      `loadLlamaStage: layer range [${start}, ${end}) is not inside [0, ${c.numLayers}) or is empty`,
    );
  }
  const D = c.hiddenSize;
  const I = c.intermediateSize;
  const qw = c.numHeads * c.headDim;
  const kw = c.numKvHeads * c.headDim;
  const embed = start === 0 ? src.embedding('model.embed_tokens.weight', c.vocabSize, D) : undefined;
  yield;
  const layers: LayerWeights[] = [];
  for (let l = start; l < end; l++) {
    const p = `model.layers.${l}.`;
    layers.push({
      inputNorm: src.vector(`${p}input_layernorm.weight`, D),
      postNorm: src.vector(`${p}post_attention_layernorm.weight`, D),
      qkv: src.linear(
        [`${p}self_attn.q_proj.weight`, `${p}self_attn.k_proj.weight`, `${p}self_attn.v_proj.weight`],
        [qw, kw, kw],
        D,
      ),
      o: src.linear([`${p}self_attn.o_proj.weight`], [D], qw),
      gateUp: src.linear([`${p}mlp.gate_proj.weight`, `${p}mlp.up_proj.weight`], [I, I], D),
      down: src.linear([`${p}mlp.down_proj.weight`], [D], I),
    });
    yield;
  }
  const isLast = end === c.numLayers;
  const finalNorm = isLast ? src.vector('model.norm.weight', D) : undefined;
  const lmHead = isLast
    ? src.linear([c.tieWordEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight'], [c.vocabSize], D)
    : undefined;
  return new LlamaStageModel(c, start, end, embed, layers, finalNorm, lmHead);
}

/** {@link buildLlamaStage} run to the end. Same errors. */
export function loadLlamaStage(
  c: LlamaConfig,
  src: LlamaTensorSource,
  options: LlamaLoadOptions = {},
): LlamaStageModel {
  const steps = buildLlamaStage(c, src, options);
  for (;;) {
    const next = steps.next();
    if (next.done === true) return next.value;
  }
}

/** {@link buildLlamaStage}, yielding to the event loop after each layer. Same errors (as rejections). */
export async function loadLlamaStageAsync(
  c: LlamaConfig,
  src: LlamaTensorSource,
  options: LlamaLoadOptions = {},
): Promise<LlamaStageModel> {
  const steps = buildLlamaStage(c, src, options);
  for (;;) {
    const next = steps.next();
    if (next.done === true) return next.value;
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
}
