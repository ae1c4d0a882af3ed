/**
 * A Kimi-K3 / Kimi-Linear stage: layers [layerStart, layerEnd) of the target, plus the embedding
 * when layerStart = 0 and the final norm + lm_head when layerEnd = num_hidden_layers (under tensor
 * parallelism the lm_head is vocab-parallel: each rank its vocabulary slice, core's `gatherVocabParallel`).
 *
 * Decoder layer (kimi.py `DecoderLayer`): h += mixer(RMSNorm(h)); h += ffn(RMSNorm(h)), with the
 * mixer KDA or MLA by `linear_attn_config` and the ffn dense for layers < first_k_dense_replace,
 * else MoE. One residual stream (no separate `residual`), so tap i = h entering layer i
 * (residual semantics, REFERENCE.md §2).
 */

import type {
  CacheGeometry,
  ForwardBatch,
  ForwardOptions,
  ForwardResult,
  ModelSource,
  PrefixCommit,
  PrefixCommitItem,
  SequenceCache,
  SequenceId,
  StageInfo,
  StageLoadOptions,
  StageModel,
  TpComm,
  TreeCommit,
} from '@specd/core';
import {
  forwardPrologue,
  gatherVocabParallel,
  HfConfig,
  SafetensorsCheckpoint,
  TensorParallelUnsupportedError,
  vocabShardRange,
} from '@specd/core';
import { addF32, bf16ToF32, gemmBf16, isa, rmsNorm, type GemmActivations, type PackedBf16Weights } from '@specd/native';

import { parseKimiConfig, type KimiConfig } from './config.js';
import {
  KDA_TENSORS_PER_LAYER,
  kdaForward,
  loadKdaWeights,
  type KdaCommitMode,
  type KdaLayerSnapshots,
  type KdaWeights,
} from './kda.js';
import { swigluForward, tsKernels, type KimiKernels, type SwigluWeights } from './kernels.js';
import { nativeKernels } from './kernels-native.js';
import type { SeqSpan, ShardRank } from './layout.js';
import {
  loadMlaWeights,
  MLA_TENSORS_PER_LAYER,
  mlaBatch,
  mlaFloatsPerToken,
  mlaForward,
  type MlaWeights,
} from './mla.js';
import { loadMoeWeights, loadSwiglu, moeForward, moeTensorCount, type MoeWeights, type RouterChoice } from './moe.js';
import { commitFromSnapshotsBatch } from './rollback.js';
import { keptScratch, type Scratch } from '@specd/core';
import { kimiWeightReader, type WeightReader } from './weights.js';
import type { TensorRead } from '@specd/core';

/** Thrown for a malformed forward call (names the argument). */
export class KimiForwardError extends Error {
  override readonly name = 'KimiForwardError';
}

interface LayerWeights {
  readonly kind: 'kda' | 'mla';
  readonly inputNorm: Float32Array;
  readonly postNorm: Float32Array;
  readonly kda?: KdaWeights;
  readonly mla?: MlaWeights;
  readonly dense?: SwigluWeights;
  readonly moe?: MoeWeights;
}

/** Kimi forward options: the core ones plus per-token KDA snapshots. */
export interface KimiForwardOptions extends ForwardOptions {
  /**
   * Keep what commits an accepted prefix later with {@link commitFromSnapshots} (verify steps): each KDA
   * layer's core inputs and each sequence's state before the forward ({@link KdaLayerSnapshots}); the
   * commit re-runs only the KDA recurrence of the accepted tokens. Forces the recurrent form.
   */
  readonly kdaSnapshots?: boolean;
}

/**
 * What commits a prefix of a forward ({@link KdaLayerSnapshots}), by absolute layer id, plus where each
 * sequence's rows are.
 */
export interface KdaSnapshotSet {
  readonly spans: readonly SeqSpan[];
  readonly layers: ReadonlyMap<number, KdaLayerSnapshots>;
  /**
   * Set when two later snapshotted forwards of the stage have reused its state buffers (the stage keeps two sets,
   * alternately: a fresh 3 MB of states a verify cost kimi-k3-tiny ~0.35 ms at 8 sequences in page faults and
   * zeroing); a commit from it then throws. A commit right after its forward, as the engine makes, never meets it.
   */
  recycled?: boolean;
}

/** A Kimi forward's result: the core one plus the snapshots when asked for. */
export interface KimiForwardResult extends ForwardResult {
  readonly kdaSnapshots?: KdaSnapshotSet;
}

/** Debug hooks of {@link KimiStageModel.forward} (tests). */
export interface KimiDebugHooks {
  /** Router decisions of MoE layer `layer` for the batch. */
  onRoute?(layer: number, r: RouterChoice): void;
}

/**
 * A loaded stage. Create with {@link loadKimiStage}. It commits accepted prefixes from KDA state snapshots
 * ({@link PrefixCommit}); it has no {@link TreeCommit} while it has KDA layers (`info.treeVerificationBlocker`).
 */
export class KimiStageModel implements StageModel, PrefixCommit {
  readonly info: StageInfo;
  readonly cacheGeometry: CacheGeometry;
  /** Test hooks; undefined in normal runs. */
  debug: KimiDebugHooks | undefined;
  /**
   * KDA form for sequences marked `phase: 'prefill'`: `'chunked'` (WY form, default; not bitwise
   * equal to decode) or `'recurrent'`. Decode and verify always use the recurrent form.
   */
  kdaPrefill: 'chunked' | 'recurrent' = 'chunked';
  /**
   * How {@link commitPrefix} gets a verify's KDA state after the last accepted token ({@link KdaCommitMode}):
   * `'replay'` (default; the verify copies one state per sequence and layer, the commit re-runs the accepted
   * tokens' recurrence) or `'copy'` (the verify writes the state after every token, the commit copies one).
   * Bitwise the same state; set between forwards (benches), never between a verify and its commit.
   */
  kdaCommit: KdaCommitMode = 'replay';
  /**
   * Activation precision of the dense bf16-weight GEMMs (KDA and MLA projections, dense MLPs,
   * lm_head; `gemmBf16`'s): `'f32'`, `'bf16'` (X rounded to bf16; AMX tiles where present) or
   * `'bf16x2'` (split bf16: X = hi + lo, both on AMX; near-fp32 results). The router and the
   * routed / shared experts stay fp32. On every variant each GEMM row equals the GEMV of that row
   * bit for bit, so decode, verify and batched forwards agree (greedy speculation stays lossless);
   * the variants differ from each other by rounding. Set at load ({@link KimiLoadOptions.activations});
   * changing it between forwards is allowed (benches), never inside a request.
   */
  gemmActivations: GemmActivations;
  /**
   * The latest forward's snapshot set (undefined when it kept none, or threw) with its cache and the sequences of
   * it committed partially since: a sequence not among them whose cache still ends where the forward's block ended
   * holds the state after the block's last token, so {@link commitPrefix} of the whole block has nothing to redo.
   */
  private lastSnapshots:
    | { readonly set: KdaSnapshotSet; readonly cache: SequenceCache; readonly partial: Set<SequenceId> }
    | undefined;
  /** Buffers of the forward's intermediates, kept from one forward to the next ({@link keptScratch}). */
  private readonly scratch: Scratch = keptScratch();
  /** The snapshot sets whose states are in kept buffer set 0 and 1, and the set the next snapshotted forward uses. */
  private readonly snapshotSets: (KdaSnapshotSet | undefined)[] = [undefined, undefined];
  private snapshotParity = 0;

  constructor(
    readonly config: KimiConfig,
    /** Inner kernels the weights were prepared for. */
    readonly kernels: KimiKernels,
    layerStart: number,
    layerEnd: number,
    private embed: Uint16Array | undefined,
    private layers: LayerWeights[],
    private finalNorm: Float32Array | undefined,
    /** lm_head rows `[V_r, D]`: this rank's vocabulary slice (`vocabShardRange`), all V rows without TP. */
    private lmHeadWeights: PackedBf16Weights | undefined,
    /** Tensor-parallel rank (its config is the shard's: its heads); undefined for the whole model. */
    readonly comm?: TpComm,
    activations: GemmActivations = 'f32',
  ) {
    this.gemmActivations = activations;
    const c = config;
    const kdaLayers = c.layerKinds.flatMap((k, i) => (k === 'kda' ? [i] : []));
    this.info = Object.freeze({
      numLayers: c.numLayers,
      layerStart,
      layerEnd,
      hiddenSize: c.hiddenSize,
      vocabSize: c.vocabSize,
      isFirst: layerStart === 0,
      isLast: layerEnd === c.numLayers,
      layerKinds: c.layerKinds,
      // KDA layers keep recurrent state: a token tree would need one state per branch
      ...(kdaLayers.length === 0 ? {} : { treeVerificationBlocker: `KDA layers (layers ${kdaLayers.join(', ')})` }),
    });
    const own = (kind: string) =>
      c.layerKinds.flatMap((k, i) => (k === kind && i >= layerStart && i < layerEnd ? [i] : []));
    this.cacheGeometry = Object.freeze({
      // MLA: a row (latent + k_pe) is one block, whole on every tensor-parallel rank: no kvHeads
      pagedKv: { layers: own('mla'), floatsPerToken: mlaFloatsPerToken(c) },
      linearState: {
        layers: own('kda'),
        heads: c.kdaHeads,
        keyDim: c.kdaHeadDim,
        valueDim: c.kdaHeadDim,
        convStates: 3,
        convChannels: c.kdaHeads * c.kdaHeadDim,
        convWidth: c.convKernel - 1,
      },
    });
  }

  /**
   * Runs the stage. Every sequence must be registered in `cache` with `cache.length(id) ===
   * position`; the cache is extended by its new tokens (all sequences or none).
   * @throws {KimiForwardError} on an empty batch, a sequence listed twice, a bad token id, a position that
   *   disagrees with the cache, a missing/mis-sized `batch.hidden`, or a tap outside [layerStart, layerEnd].
   * @throws {CacheError} `full` when the KV pool has no room (nothing was extended).
   */
  forward(batch: ForwardBatch, cache: SequenceCache, options: KimiForwardOptions = {}): KimiForwardResult {
    const c = this.config;
    const D = c.hiddenSize;
    const { layerStart, isLast } = this.info;
    // every forward (also one that throws) may advance the state: a commit after it replays
    this.lastSnapshots = undefined;
    // batch checks, spans, taps, embeddings or the previous stage's hidden, cache extension, tap layerStart
    const prologue = forwardPrologue(batch, cache, options, {
      info: this.info,
      error: (message) => new KimiForwardError(message),
      span: (s, _i, row): SeqSpan => ({ id: s.id, tokenStart: row, numNew: s.tokens.length, position: s.position }),
      embedRow: (id, out) => bf16ToF32(this.embed!.subarray(id * D, (id + 1) * D), out),
      hiddenOnFirstStage: 'use',
    });
    const { spans, numTokens: N, hidden: h, captured, capture } = prologue;
    // tensor parallelism: a layer's mixer and ffn outputs are this rank's partial sums
    const comm = this.comm;
    const reduce = comm === undefined ? (x: Float32Array) => x : (x: Float32Array) => comm.allReduce(x);
    const wantSnapshots = options.kdaSnapshots === true || options.stateSnapshots === true;
    const chunked = batch.sequences.map(
      (s) => s.phase === 'prefill' && this.kdaPrefill === 'chunked' && !wantSnapshots,
    );
    const snapshots = wantSnapshots ? new Map<number, KdaLayerSnapshots>() : undefined;
    const keep = (l: number) => (snapshots === undefined ? undefined : (s: KdaLayerSnapshots) => snapshots.set(l, s));
    // the states from before the forward in one of two kept buffer sets, alternately; the set that used it before
    // (two snapshotted forwards ago) is recycled
    const parity = this.snapshotParity;
    if (wantSnapshots) {
      this.snapshotParity ^= 1;
      const old = this.snapshotSets[parity];
      if (old !== undefined) old.recycled = true;
      this.snapshotSets[parity] = undefined;
    }
    const before: Scratch = (name, n) => this.scratch(`kda.before.${parity}.${name}`, n);
    const paged = this.cacheGeometry.pagedKv.layers.length > 0 ? mlaBatch(spans, cache) : undefined;
    const act = this.gemmActivations;
    // the intermediates of the layers live in the stage's kept scratch (each consumed before its name is reused)
    const buf = this.scratch;
    for (let li = 0; li < this.layers.length; li++) {
      const l = layerStart + li;
      const w = this.layers[li]!;
      const xn = rmsNorm(h, w.inputNorm, c.rmsNormEps, buf('xn', h.length));
      const a = reduce(
        w.kind === 'kda'
          ? kdaForward(
              w.kda!,
              c,
              l,
              xn,
              spans,
              N,
              cache,
              this.kernels,
              chunked,
              keep(l),
              act,
              this.kdaCommit,
              buf,
              before,
            )
          : mlaForward(w.mla!, c, l, xn, spans, N, cache, this.kernels, paged!, act, buf),
      );
      // h += a in f32 (one rounding per element: the bits of the scalar loop)
      addF32(h, a, h);
      const xm = rmsNorm(h, w.postNorm, c.rmsNormEps, buf('xm', h.length));
      const debug = this.debug;
      const onRoute = debug?.onRoute ? (r: RouterChoice) => debug.onRoute!(l, r) : undefined;
      const f = reduce(
        w.dense !== undefined
          ? swigluForward(w.dense, xm, N, act, buf)
          : moeForward(w.moe!, c, xm, N, this.kernels, onRoute, buf),
      );
      addF32(h, f, h);
      capture(l + 1);
    }
    const logitRowStart = new Int32Array(spans.length + 1);
    let logits: Float32Array | undefined;
    if (isLast && this.lmHeadWeights !== undefined) {
      const rows: number[] = [];
      batch.sequences.forEach((s, i) => {
        const sp = spans[i]!;
        if (s.logits === 'all') for (let t = 0; t < sp.numNew; t++) rows.push(sp.tokenStart + t);
        else if (s.logits === 'last') rows.push(sp.tokenStart + sp.numNew - 1);
        logitRowStart[i + 1] = rows.length;
      });
      if (rows.length > 0) {
        const x = buf('head.x', rows.length * D);
        rows.forEach((r, i) => {
          x.set(h.subarray(r * D, (r + 1) * D), i * D);
        });
        // under tensor parallelism a collective: every rank gets the same logits requests
        const xNormed = rmsNorm(x, this.finalNorm!, c.rmsNormEps, buf('head.xn', x.length));
        logits = this.vocabLogits(xNormed, rows.length);
      } else {
        logits = new Float32Array(0);
      }
    }
    const snapshotSet =
      snapshots === undefined ? undefined : { spans: spans.map((s) => ({ ...s })), layers: snapshots };
    if (snapshotSet !== undefined) {
      this.lastSnapshots = { set: snapshotSet, cache, partial: new Set() };
      this.snapshotSets[parity] = snapshotSet;
    }
    return {
      logits,
      logitRowStart,
      hidden: h,
      taps: captured,
      ...(snapshotSet === undefined ? {} : { kdaSnapshots: snapshotSet, stateSnapshots: snapshotSet }),
    };
  }

  /**
   * {@link PrefixCommit}: {@link commitFromSnapshots} on a result of a forward run with
   * `{ stateSnapshots: true }` (or `kdaSnapshots`). The whole block of a sequence committed right after that
   * forward (the latest of this stage, on `cache`; the sequence not committed partially since and its cache still
   * ending with the block) needs nothing: the forward left the state after the block's last token and its KV, the
   * bits a replay would write. Anything else replays (a commit after a later forward, a second commit after a
   * partial one).
   * @throws {KimiForwardError} if the result carries no snapshots; RangeError as commitFromSnapshots.
   */
  commitPrefix(cache: SequenceCache, result: ForwardResult, id: SequenceId, committed: number): void {
    this.commitSnapshotted(cache, result, [{ id, committed }]);
  }

  /**
   * {@link PrefixCommit.commitPrefixes}: {@link commitPrefix} for several sequences of one forward, the replays in
   * one recurrent kernel call per KDA layer ({@link commitFromSnapshotsBatch}). Each whole block committed right
   * after the forward still needs nothing.
   * @throws {KimiForwardError} if the result carries no snapshots; RangeError as commitFromSnapshotsBatch.
   */
  commitPrefixes(cache: SequenceCache, result: ForwardResult, commits: readonly PrefixCommitItem[]): void {
    this.commitSnapshotted(cache, result, commits);
  }

  /** What {@link commitPrefix} and {@link commitPrefixes} do (neither calls the other: either may be wrapped). */
  private commitSnapshotted(cache: SequenceCache, result: ForwardResult, commits: readonly PrefixCommitItem[]): void {
    const snaps = (result as KimiForwardResult).kdaSnapshots;
    if (snaps === undefined)
      throw new KimiForwardError('commitPrefix: result: the forward was not run with { stateSnapshots: true }');
    const last = this.lastSnapshots;
    const replay =
      last === undefined || last.set !== snaps || last.cache !== cache
        ? commits
        : commits.filter(({ id, committed }) => {
            if (last.partial.has(id)) return true;
            const span = snaps.spans.find((s) => s.id === id);
            if (span !== undefined && committed === span.numNew && cache.length(id) === span.position + span.numNew)
              return false;
            last.partial.add(id);
            return true;
          });
    if (replay.length > 0) commitFromSnapshotsBatch(cache, snaps, replay);
  }

  /**
   * The target's token embeddings (first stage, or a stage loaded with `embedding: true`):
   * `[tokens.length, hiddenSize]` f32.
   * @throws {KimiForwardError} on a non-first stage or an id outside the vocabulary.
   */
  embedTokens(tokens: Int32Array): Float32Array {
    const D = this.config.hiddenSize;
    if (this.embed === undefined)
      throw new KimiForwardError('embedTokens: this stage has no embedding (not the first stage, or disposed)');
    const out = new Float32Array(tokens.length * D);
    tokens.forEach((id, i) => {
      if (!(id >= 0 && id < this.config.vocabSize))
        throw new KimiForwardError(`embedTokens: tokens[${i}]: id ${id} outside [0, ${this.config.vocabSize})`);
      bf16ToF32(this.embed!.subarray(id * D, (id + 1) * D), out.subarray(i * D, (i + 1) * D));
    });
    return out;
  }

  /**
   * The lm_head alone (last stage only; the caller normalises): `x [rows, hiddenSize]` f32 → `[rows, vocabSize]` f32.
   * On a tensor-parallel shard a collective (vocab-parallel, {@link vocabLogits}): every rank of the
   * group calls it at once with the same `rows`, and every rank gets the whole `[rows, vocabSize]`.
   * @throws {KimiForwardError} on a non-last stage or a mis-sized x (before any collective).
   */
  lmHead(x: Float32Array, rows: number): Float32Array {
    if (this.lmHeadWeights === undefined)
      throw new KimiForwardError('lmHead: this stage has no lm_head (not the last stage, or disposed)');
    if (x.length !== rows * this.config.hiddenSize)
      throw new KimiForwardError(
        `lmHead: x: expected [${rows}, ${this.config.hiddenSize}] f32, got length ${x.length}`,
      );
    return this.vocabLogits(x, rows);
  }

  /**
   * The lm_head of this rank's vocabulary slice, gathered: `x [rows, hiddenSize]` f32 (normed) →
   * `[rows, vocabSize]` f32. Without tensor parallelism one GEMM over all V rows; on rank r of N the
   * GEMM over its rows [⌊r·V/N⌋, ⌊(r+1)·V/N⌋) (`[rows, V_r]`), then core's `gatherVocabParallel`
   * (all-gather, pieces laid out by vocabulary id; vLLM `ParallelLMHead`). Each logit is the same
   * dot product over D either way (the GEMM computes every output column independently).
   */
  private vocabLogits(x: Float32Array, rows: number): Float32Array {
    const local = gemmBf16(x, rows, this.lmHeadWeights!, undefined, this.gemmActivations);
    const comm = this.comm;
    return comm === undefined || comm.size === 1
      ? local
      : gatherVocabParallel(comm, local, rows, this.config.vocabSize);
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
 * Loads a stage from a checkpoint (weights prepared for the chosen kernels): validates the config
 * ({@link parseKimiConfig}) and reads only the tensors the stage needs. Blocks until done; see
 * {@link loadKimiStageAsync} to let the event loop run (progress bars) between layers.
 * @throws {HfConfigError} for a bad config; {@link KimiWeightError} for a missing / mis-shaped
 *   tensor; RangeError for a bad layer range or kernel choice.
 */
export function loadKimiStage(source: ModelSource, options: KimiLoadOptions = {}): KimiStageModel {
  const steps = buildStage(source, options);
  for (;;) {
    const next = steps.next();
    if (next.done === true) return next.value;
  }
}

/** {@link loadKimiStage}, yielding to the event loop after each layer. Same errors (as rejections). */
export async function loadKimiStageAsync(source: ModelSource, options: KimiLoadOptions = {}): Promise<KimiStageModel> {
  const steps = buildStage(source, options);
  for (;;) {
    const next = steps.next();
    if (next.done === true) return next.value;
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
}

/** The loader as steps: yields after the embedding and after each layer. */
function* buildStage(
  source: ModelSource,
  options: KimiLoadOptions,
  comm?: TpComm,
  onReader?: (r: WeightReader) => void,
): Generator<void, KimiStageModel, void> {
  const full = parseKimiConfig(source.config);
  const shard: ShardRank = comm === undefined ? { rank: 0, size: 1 } : { rank: comm.rank, size: comm.size };
  const c = comm === undefined ? full : kimiShardConfig(full, comm.size);
  const kernels = selectKernels(options.kernels);
  const activations = selectActivations(options.activations);
  const start = options.layerStart ?? 0;
  const end = options.layerEnd ?? c.numLayers;
  if (!(Number.isInteger(start) && Number.isInteger(end) && start >= 0 && start < end && end <= c.numLayers)) {
    throw new RangeError(`loadKimiStage: layer range [${start}, ${end}) is not inside [0, ${c.numLayers}) or is empty`);
  }
  const withEmbedding = (start === 0 || options.embedding === true) && shard.rank === 0;
  let total = (withEmbedding ? 1 : 0) + (end === c.numLayers ? 2 : 0);
  for (let l = start; l < end; l++) {
    total +=
      2 +
      (c.layerKinds[l] === 'kda' ? KDA_TENSORS_PER_LAYER : MLA_TENSORS_PER_LAYER) +
      (l < c.firstKDenseReplace ? 3 : moeTensorCount(c));
  }
  const onProgress = options.onProgress;
  const r = kimiWeightReader(
    source.weights,
    total,
    onProgress ? (done, tot, tensor) => onProgress({ done, total: tot, tensor }) : undefined,
    source.sanity,
  );
  onReader?.(r);
  const D = c.hiddenSize;
  const embed = withEmbedding ? r.bf16('model.embed_tokens.weight', [c.vocabSize, D]) : undefined;
  yield;
  const layers: LayerWeights[] = [];
  for (let l = start; l < end; l++) {
    const p = `model.layers.${l}.`;
    const kind = c.layerKinds[l]!;
    layers.push({
      kind,
      inputNorm: r.f32(`${p}input_layernorm.weight`, [D]),
      postNorm: r.f32(`${p}post_attention_layernorm.weight`, [D]),
      ...(kind === 'kda' ? { kda: loadKdaWeights(r, c, l, shard) } : { mla: loadMlaWeights(r, c, l, kernels, shard) }),
      ...(l < c.firstKDenseReplace
        ? { dense: loadSwiglu(r, `${p}mlp.`, ['gate_proj', 'up_proj', 'down_proj'], D, full.intermediateSize, shard) }
        : { moe: loadMoeWeights(r, c, l, kernels, shard) }),
    });
    yield;
  }
  // under TP: the final norm on every rank of the last stage, the lm_head vocab-parallel (rank r its
  // rows [⌊r·V/N⌋, ⌊(r+1)·V/N⌋); the forward and lmHead all-gather the slices)
  const isLast = end === c.numLayers;
  const finalNorm = isLast ? r.f32('model.norm.weight', [D]) : undefined;
  const lmHead = isLast
    ? r.packedBlocks([
        {
          name: c.tieWordEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight',
          n: c.vocabSize,
          k: D,
          block: { rows: vocabShardRange(c.vocabSize, shard.rank, shard.size) },
        },
      ])
    : undefined;
  return new KimiStageModel(c, kernels, start, end, embed, layers, finalNorm, lmHead, comm, activations);
}

/**
 * Thrown when a tensor-parallel size does not fit the model; names every count it does not divide.
 * Core's {@link TensorParallelUnsupportedError}, so the runtime reports it as a bad `--tp`.
 */
export class KimiTensorParallelError extends TensorParallelUnsupportedError {
  override readonly name = 'KimiTensorParallelError';
}

/**
 * The config of one rank of `tp`: `numHeads` (MLA) and `kdaHeads` = the rank's heads, the rest as
 * the model's (the dense MLP and shared expert widths are split by the loaders).
 * @throws {KimiTensorParallelError} when tp does not divide num_attention_heads, linear_attn_config.num_heads,
 *   num_experts, intermediate_size or the shared experts' width.
 */
export function kimiShardConfig(c: KimiConfig, tp: number): KimiConfig {
  const counts: [string, number][] = [
    ['num_attention_heads (MLA heads)', c.numHeads],
    ['linear_attn_config.num_heads (KDA heads)', c.kdaHeads],
    ['num_experts', c.numExperts],
    ['intermediate_size', c.intermediateSize],
    ['moe_intermediate_size × num_shared_experts', c.moeIntermediateSize * c.numSharedExperts],
  ];
  if (!Number.isInteger(tp) || tp < 1)
    throw new KimiTensorParallelError(`tensor parallelism: tp must be an integer >= 1, got ${tp}`);
  const bad = counts.filter(([, n]) => n % tp !== 0);
  if (bad.length > 0) {
    throw new KimiTensorParallelError(
      `tensor parallelism: tp = ${tp} does not divide ${bad.map(([k, n]) => `${k} = ${n}`).join(', ')}; ` +
        `use a tp that divides ${c.numHeads} MLA heads, ${c.kdaHeads} KDA heads and ${c.numExperts} experts`,
    );
  }
  return Object.freeze({ ...c, numHeads: c.numHeads / tp, kdaHeads: c.kdaHeads / tp });
}

/**
 * Loads rank `comm.rank`'s shard of the whole model — or of the layer range `options.layerStart` …
 * `layerEnd` (a pipeline stage under TP × PP) — (core's `ModelPlugin.loadShard`): the rank's heads of
 * every KDA and MLA layer, its block of the dense MLP and shared expert, its experts; the router and
 * norms whole; the embedding (first stage, or `options.embedding`) on rank 0 only; on the last
 * stage the final norm on every rank and the lm_head rows [⌊r·V/N⌋, ⌊(r+1)·V/N⌋) of its vocabulary
 * slice (vocab-parallel; V need not divide by N). Its forward all-reduces each mixer and ffn output
 * over `comm`; its logits (forward, `lmHead`) are all-gathered, so every rank must get the same
 * logits requests.
 * @returns the stage and every tensor (block) it read.
 * @throws {KimiTensorParallelError} for a tp that does not fit; as {@link loadKimiStage}.
 */
export async function loadKimiShard(
  source: ModelSource,
  comm: TpComm,
  options: KimiLoadOptions = {},
): Promise<{ model: KimiStageModel; reads: readonly TensorRead[] }> {
  kimiShardConfig(parseKimiConfig(source.config), comm.size);
  let reader: WeightReader | undefined;
  const steps = buildStage(source, options, comm, (r) => (reader = r));
  for (;;) {
    const next = steps.next();
    if (next.done === true) return { model: next.value, reads: reader!.reads };
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
}

/** Which inner kernels a stage uses: `'native'` (@specd/native, default) or `'ts'` (TypeScript reference). */
export type KimiKernelChoice = 'native' | 'ts';

/** {@link loadKimiStage} options: the core ones plus the kernel choice. */
export interface KimiLoadOptions extends StageLoadOptions {
  /** Default: `SPECD_KIMI_KERNELS` if set, else `'native'`. */
  readonly kernels?: KimiKernelChoice;
  /**
   * Activation precision of the dense GEMMs ({@link KimiStageModel.gemmActivations}). Default:
   * `SPECD_KIMI_ACTIVATIONS` if set, else {@link defaultKimiActivations}.
   */
  readonly activations?: GemmActivations;
}

/**
 * The default activation precision: `'bf16x2'` where the CPU has AMX and the avx512 path is active
 * (split bf16 on AMX tiles: the goldens within 1e-2 at every layer, the greedy continuations token for
 * token, a 16-token verify forward faster than fp32: docs/BENCHMARKS.md, "bf16 activations"), else
 * `'f32'` (without AMX the bf16 variants only round X and run the fp32 kernels: the same cost, less
 * precision). Plain `'bf16'` is never the default: on kimi-k3-tiny it flips MoE routes and misses
 * 1e-2 at some layers. Override with {@link KimiLoadOptions.activations} or `SPECD_KIMI_ACTIVATIONS`.
 */
export function defaultKimiActivations(): GemmActivations {
  const info = isa();
  return info.isa === 'avx512' && info.amxAvailable ? 'bf16x2' : 'f32';
}

function selectActivations(choice: GemmActivations | undefined): GemmActivations {
  const env = process.env.SPECD_KIMI_ACTIVATIONS;
  const pick = choice ?? (env === undefined || env === '' ? defaultKimiActivations() : env);
  if (pick === 'f32' || pick === 'bf16' || pick === 'bf16x2') return pick;
  throw new RangeError(
    'loadKimiStage: activations: expected "f32", "bf16" or "bf16x2" (option or SPECD_KIMI_ACTIVATIONS), ' +
      `got ${JSON.stringify(pick)}`,
  );
}

function selectKernels(choice: KimiKernelChoice | undefined): KimiKernels {
  const env = process.env.SPECD_KIMI_KERNELS;
  const pick = choice ?? (env === undefined || env === '' ? 'native' : env);
  if (pick === 'native') return nativeKernels;
  if (pick === 'ts') return tsKernels;
  throw new RangeError(
    `loadKimiStage: kernels: expected "native" or "ts" (option or SPECD_KIMI_KERNELS), got ${JSON.stringify(pick)}`,
  );
}

/**
 * Loads a Kimi checkpoint folder (config.json + safetensors) as one stage: opens the checkpoint,
 * reads and validates the config, loads the layer range of `options` (default: the whole model) and
 * closes the files. @throws as {@link loadKimiStage}, or when the folder is not a checkpoint.
 */
export function loadKimiFromDir(dir: string, options: KimiLoadOptions = {}): KimiStageModel {
  const weights = SafetensorsCheckpoint.open(dir);
  try {
    return loadKimiStage({ dir, config: HfConfig.read(dir), weights }, options);
  } finally {
    weights.close();
  }
}
