/**
 * The model-plugin contract: a package that owns a target architecture (e.g. Kimi-K3 /
 * Kimi-Linear) implements {@link ModelPlugin}; core and the engine know only these types.
 *
 * Lifecycle: `load` (one stage = a layer range, weights packed) → `forward` per step (prefill
 * chunk, decode, verify block) with a {@link SequenceCache} sized from `cacheGeometry` →
 * `dispose`. The drafter contract ({@link DrafterPlugin}) sits beside this file (drafter-plugin.ts).
 *
 * A loaded stage is a small core {@link StageModel} (info, cache geometry, forward, dispose, and a few
 * optional helpers drafters and the server use) plus the capabilities it declares with `implements`
 * (stage-capabilities.ts): {@link PrefixCommit} (commit an accepted prefix from state snapshots),
 * {@link TreeCommit} (verify token trees, commit one path), {@link DistributedStage} (spread over ranks or
 * processes, loads drafters its own way) and {@link ProjectionDistribution} (stages that project their own
 * taps). Callers ask for a capability with its guard (`hasPrefixCommit(model)`, `hasTreeCommit(model)`,
 * `isDistributedStage(model)`, `hasProjectionDistribution(model)`), never by probing a method.
 */

import type { GgufFile } from '../io/gguf.js';
import type { CheckpointSanity } from '../io/checkpoint-sanity.js';
import type { HfConfig } from '../io/hf-config.js';
import type { SafetensorsCheckpoint } from '../io/safetensors-checkpoint.js';
import type { TensorRead } from '../io/weight-reader.js';
import type { CacheGeometry, SequenceCache, SequenceCacheOptions } from '../kv/sequence-cache.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { DistributedStage, PrefixCommit, ProjectionDistribution, TreeCommit } from './stage-capabilities.js';
import type { Drafter, ProjectionFormat } from './drafter-plugin.js';

/** A checkpoint to load: its directory, parsed `config.json` and weights. */
export interface ModelSource {
  /** The HF checkpoint directory. */
  readonly dir: string;
  readonly config: HfConfig;
  readonly weights: SafetensorsCheckpoint;
  /**
   * The load's checkpoint sanity policy (io/checkpoint-sanity.ts): the plugin hands it to its `WeightReader`
   * and reports its own config and vocabulary findings through it. Absent: mode `'refuse'`.
   */
  readonly sanity?: CheckpointSanity;
}

/** Progress of a load, for progress bars. */
export interface LoadProgress {
  /** Tensors loaded so far. */
  readonly done: number;
  /** Tensors to load in total. */
  readonly total: number;
  /** Name of the tensor just loaded. */
  readonly tensor: string;
}

/** Options of {@link ModelPlugin.load}. */
export interface StageLoadOptions {
  /** First layer of the stage, inclusive (default 0). */
  readonly layerStart?: number;
  /** End of the stage, exclusive (default: num_hidden_layers). */
  readonly layerEnd?: number;
  /**
   * Also load the token embedding when layerStart > 0 (default false): the last pipeline stage of a
   * target whose drafter reuses the embedding (`embedTokens`). It does not make the stage embed its input.
   */
  readonly embedding?: boolean;
  /** Called after each tensor. */
  readonly onProgress?: (p: LoadProgress) => void;
  /**
   * The load's checkpoint sanity policy for {@link ModelPlugin.loadGguf} (a folder's is
   * {@link ModelSource.sanity}). Absent: mode `'refuse'`.
   */
  readonly sanity?: CheckpointSanity;
  /**
   * Where the model runs (default `'cpu'`): `'cuda'` asks for the plugin's GPU path (one NVIDIA GPU, the whole
   * model: no layer range). Core refuses it for a plugin whose {@link ModelPlugin.devices} lacks it.
   */
  readonly device?: Device;
  /** Rows of the largest forward, where a device allocates activations up front (the CUDA path; default 2048). */
  readonly maxTokens?: number;
}

/** Where a model runs. */
export type Device = 'cpu' | 'cuda';

/** Static facts about a loaded stage. */
export interface StageInfo {
  /** Layers of the whole model. */
  readonly numLayers: number;
  /** Stage layer range [layerStart, layerEnd). */
  readonly layerStart: number;
  readonly layerEnd: number;
  /** Residual width. */
  readonly hiddenSize: number;
  /** Logit width. */
  readonly vocabSize: number;
  /** True if the stage embeds tokens (layerStart = 0). */
  readonly isFirst: boolean;
  /** True if the stage produces logits (layerEnd = numLayers). */
  readonly isLast: boolean;
  /** Layer kinds of the whole model, by absolute layer id (e.g. `'kda'`, `'mla'`). */
  readonly layerKinds: readonly string[];
  /**
   * Why the whole model cannot verify a token tree in one forward ({@link ForwardSequence.tree}): its layers
   * with recurrent per-sequence state, which would need one state per branch, named for messages (e.g.
   * `'KDA layers (layers 0, 1, 2)'`). Absent when every layer can apply a tree attention mask (attention-only
   * models). Drafters that draft trees ask it at load instead of interpreting `layerKinds`.
   */
  readonly treeVerificationBlocker?: string;
}

/** Which logits a sequence of a batch wants. */
export type LogitsRequest = 'all' | 'last' | 'none';

/** One sequence of a forward batch. Immutable. */
export interface ForwardSequence {
  /** Cache identity (registered with `SequenceCache.add`). */
  readonly id: SequenceId;
  /** Position of the first new token = tokens already in the cache for this sequence. */
  readonly position: number;
  /** New token ids `[numNew]` i32 (numNew ≥ 1: a prefill chunk, 1 decode token, or a verify block). */
  readonly tokens: Int32Array;
  /** Logit rows wanted: every new token (verify), the last one (prefill / decode), or none. */
  readonly logits: LogitsRequest;
  /**
   * `'prefill'` lets the model use prefill-only kernels (e.g. chunked linear attention), equal to
   * the decode kernels within tolerance but not bitwise; absent = decode / verify kernels, whose
   * results are bitwise independent of how tokens are grouped into forwards.
   */
  readonly phase?: 'prefill';
  /**
   * A token tree instead of a chain (tree verification; only stages with {@link TreeCommit.commitTreePath}):
   * the parent row of each new token, `[tokens.length]` i32 — row 0 (the last verified token) has −1,
   * every other row a parent row before it. Row r sits at position `position + depth(r)` and attends
   * to the cached tokens and to its ancestors (itself included), so its logits equal those of its
   * root-to-r path decoded as a chain. Its KV is kept in block-row order until `commitTreePath`.
   */
  readonly tree?: Int32Array;
}

/** A forward batch. Tokens are concatenated in sequence order (`numTokens = Σ numNew`). */
export interface ForwardBatch {
  readonly sequences: readonly ForwardSequence[];
  /** Residual stream from the previous stage `[numTokens, hiddenSize]` f32; required iff the stage is not first. */
  readonly hidden?: Float32Array;
}

/** Options of {@link StageModel.forward}. */
export interface ForwardOptions {
  /**
   * Tap ids to capture. Tap `i` = residual stream entering layer `i` (0 = embeddings, numLayers =
   * after the last layer, before the final norm; REFERENCE.md §2). A stage may capture taps in
   * [layerStart, layerEnd]; others are an error.
   */
  readonly taps?: readonly number[];
  /**
   * Keep the linear-attention state after every token (verify steps), so that an accepted prefix
   * can be committed with {@link PrefixCommit.commitPrefix} instead of a replay. Ignored by stages
   * without `commitPrefix`.
   */
  readonly stateSnapshots?: boolean;
  /**
   * The caller needs only each logit row's argmax (greedy decoding or verification without logits processors or
   * logprobs): a stage that computes {@link ForwardResult.argmax} where its logits live (a GPU stage) may then leave
   * `logits` undefined and move token ids instead of `[rows, vocabSize]` f32. Stages without it ignore the flag.
   */
  readonly argmaxOnly?: boolean;
  /**
   * The caller reads the result's `logits` only until its next forward of this stage (the engine's verify steps): a
   * stage may return them in a buffer it reuses instead of a fresh `[rows, vocabSize]` f32 array each forward (a
   * sampled verify of 8 rows of SmolLM2 allocated 1.5 MB a step). Stages without it ignore the flag.
   */
  readonly logitsScratch?: boolean;
}

/** What a forward returns. */
export interface ForwardResult {
  /**
   * Logits `[numLogitRows, vocabSize]` f32 (last stage only; rows in batch order); undefined on a stage without
   * logits, or when {@link ForwardOptions.argmaxOnly} was asked of a stage that returns {@link argmax}.
   */
  readonly logits: Float32Array | undefined;
  /** Row ranges into `logits`: sequence `s` has rows [logitRowStart[s], logitRowStart[s+1]); `[numSeqs + 1]` i32. */
  readonly logitRowStart: Int32Array;
  /** Residual stream leaving the stage `[numTokens, hiddenSize]` f32 (for the next stage; also on the last stage). */
  readonly hidden: Float32Array;
  /** Captured taps: tap id → `[numTokens, hiddenSize]` f32. */
  readonly taps: ReadonlyMap<number, Float32Array>;
  /**
   * The drafter's context projection of taps already projected where they were produced,
   * `[numTokens, hiddenSize]` f32: Σ h_i·W_iᵀ over those taps, added tap by tap in ascending order
   * (a pipeline whose earlier stages loaded their share, {@link ProjectionDistribution}).
   * Those taps are then absent from `taps`; the caller passes this as the accumulator of
   * `Drafter.projectTargetHiddenPartial(taps, …)` for the rest. Absent: every requested tap is in `taps`.
   */
  readonly projection?: Float32Array;
  /**
   * Each logit row's argmax `[numLogitRows]` i32 (the lowest index among equal maxima; −1 for a row with a value
   * that is not finite), given by stages that compute it where the logits live. With
   * {@link ForwardOptions.argmaxOnly} such a stage may return it without `logits`.
   */
  readonly argmax?: Int32Array;
  /** Per-token linear states, when `stateSnapshots` was asked for (opaque; pass to `commitPrefix`). */
  readonly stateSnapshots?: unknown;
}

/**
 * A loaded stage of a target model: the core contract. What only some stages can do is a capability
 * (plugin/stage-capabilities.ts: {@link PrefixCommit}, {@link TreeCommit}, {@link DistributedStage},
 * {@link ProjectionDistribution}) that the stage's class declares with `implements`; callers ask for it
 * with its guard (`hasTreeCommit(model)`, …).
 */
export interface StageModel {
  readonly info: StageInfo;
  /** What the stage caches per sequence (size a {@link SequenceCache} from it). */
  readonly cacheGeometry: CacheGeometry;
  /**
   * forward: runs the stage on new tokens, appends their KV / advances linear state in `cache`.
   * Results of a token never depend on the other tokens of the batch (batch invariance).
   */
  forward(batch: ForwardBatch, cache: SequenceCache, options?: ForwardOptions): ForwardResult;
  /**
   * A cache for this stage (optional): callers that would build `new SequenceCache(cacheGeometry, options)`
   * call this when present. A pipeline (pipeline/pipeline-model.ts) returns a cache that mirrors the
   * caller's cache operations on its stage processes.
   */
  createCache?(options: SequenceCacheOptions): SequenceCache;
  /** Token embeddings (optional, first stage; drafters that reuse the target's): `[tokens.length, hiddenSize]` f32. */
  embedTokens?(tokens: Int32Array): Float32Array;
  /**
   * The output projection alone (optional, last stage; no final norm): `x [rows, hiddenSize]` f32 →
   * logits `[rows, vocabSize]` f32. Drafters that reuse the target's lm_head call it. On a
   * tensor-parallel shard it is a collective (each rank its vocabulary slice, then an all-gather):
   * every rank of the group calls it at once with the same `rows`.
   */
  lmHead?(x: Float32Array, rows: number): Float32Array;
  /**
   * Why the model can no longer run (optional): a model spread over processes or threads returns the
   * error that broke it — e.g. a pipeline stage process that died — and undefined while it is healthy.
   * Cheap (no round trip); `specd serve` asks it for `/health` and before taking a request.
   */
  failure?(): Error | undefined;
  /** dispose: drops the weights. */
  dispose(): void;
}

/** What {@link ProjectionDistribution.distributeProjection} loads on each stage. */
export interface ProjectionSpec {
  /** The drafter checkpoint directory. */
  readonly dir: string;
  /** The drafter's taps (`captureSetter`). */
  readonly taps: readonly number[];
  /** The drafter's {@link Drafter.projectionFormat} (default `'bf16'`): every stage loads its blocks in it. */
  readonly format?: ProjectionFormat;
}

/**
 * Collectives of a tensor-parallel group (tensor-parallel/comm.ts): ranks are threads of one
 * process sharing memory. Every rank calls every collective, in the same order.
 */
export interface TpComm {
  /** This rank, 0 … size − 1 (rank 0 is the driver's thread). */
  readonly rank: number;
  /** Ranks in the group (tp). */
  readonly size: number;
  /**
   * Element-wise sum of `x` over the ranks, in rank order ((x_0 + x_1) + x_2) + …: the same bits on
   * every rank and from run to run. `x` has the same length on every rank.
   */
  allReduce(x: Float32Array): Float32Array;
  /**
   * Rank 0's `x` on every rank (a new array): `x` has the same length on every rank; the values other
   * ranks pass are ignored (e.g. zeros). Used where rank 0 alone holds an input, such as the target's
   * token embedding that drafters reuse (tensor-parallel drafters, tp-drafter.ts).
   */
  broadcast(x: Float32Array): Float32Array;
  /**
   * Every rank's piece, concatenated in rank order (a new array, the same on every rank): `x` is this
   * rank's piece `[L_r]` f32, and lengths may differ by rank (0 allowed); the result is
   * `[L_0 + L_1 + … + L_{size−1}]` f32. Used to gather vocab-parallel logits (each rank's slice of the
   * vocabulary; Megatron-LM / vLLM `ParallelLMHead`). Collective: every rank calls it at once.
   */
  allGather(x: Float32Array): Float32Array;
}

/** Options of {@link ModelPlugin.loadShard}. */
export interface ShardLoadOptions {
  /** The rank's collectives (rank, size, all-reduce). */
  readonly comm: TpComm;
  /**
   * The layer range of the shard (default: the whole model) — a pipeline stage run by a TP group
   * (TP × PP): every rank loads its shard of these layers only; the embedding (stage 0, or `embedding`)
   * on rank 0 only; the last stage's final norm on every rank and its lm_head vocab-parallel (each
   * rank its slice of the vocabulary rows).
   */
  readonly layerStart?: number;
  readonly layerEnd?: number;
  /** As {@link StageLoadOptions.embedding} (rank 0 only). */
  readonly embedding?: boolean;
  /** Called after each tensor (or block of one) is read. */
  readonly onProgress?: (p: LoadProgress) => void;
}

/** A loaded tensor-parallel shard and what it read. */
export interface LoadedShard {
  /**
   * The rank's whole-model stage over its shard of the weights, with its own cache geometry (its
   * heads' state). Its `forward` runs the collectives of `comm`, so every rank must run the same
   * batch at once; it takes the embedded input as `batch.hidden` when given. Rank 0's model also
   * embeds (`embedTokens`). A last stage's `lmHead` (and the logits a forward is asked for) is a
   * collective: every rank computes its vocabulary slice and the slices are all-gathered, so every
   * rank must get the same logits requests (`ForwardSequence.logits`) and call `lmHead` together.
   * Rank 0's results are the ones used; other ranks' are used only for their cache effects.
   */
  readonly model: StageModel;
  /** Tensors (and blocks of tensors) read, in order. */
  readonly reads: readonly TensorRead[];
}

/**
 * A model's refusal of a tensor-parallel size that does not fit it (e.g. a tp that does not divide its
 * head counts), thrown by {@link ModelPlugin.loadShard} with a message naming the sizes. A model plugin
 * throws this class or a subclass of it (its own name, e.g. for its own API); the runtime reports it
 * as a bad `--tp` (runtime/parallel.ts) and passes other load errors through.
 */
export class TensorParallelUnsupportedError extends Error {
  override readonly name: string = 'TensorParallelUnsupportedError';
}

/** A target architecture. */
export interface ModelPlugin {
  /** The plugin API version it was built for: core's `PLUGIN_API_VERSION` (a mismatch is refused at load). */
  readonly apiVersion: number;
  /** Plugin name, e.g. `'kimi-k3'`. */
  readonly name: string;
  /** `config.json` `model_type` values it accepts. */
  readonly modelTypes: readonly string[];
  /** `config.json` `architectures` entries it accepts. */
  readonly architectures: readonly string[];
  /** load: validates the config and builds the stage for [layerStart, layerEnd). */
  load(source: ModelSource, options?: StageLoadOptions): Promise<StageModel>;
  /** GGUF `general.architecture` values it loads through {@link loadGguf} (e.g. `'llama'`); absent: no GGUF. */
  readonly ggufArchitectures?: readonly string[];
  /** load from a GGUF file (config from its metadata, quantized tensors as the plugin decides). */
  loadGguf?(file: GgufFile, options?: StageLoadOptions): Promise<StageModel>;
  /** Devices `load` / `loadGguf` run on ({@link StageLoadOptions.device}); absent: `['cpu']`. */
  readonly devices?: readonly Device[];
  /**
   * Loads rank `options.comm.rank`'s shard of the whole model for tensor parallelism (optional;
   * tensor-parallel/tp-model.ts).
   * @throws {TensorParallelUnsupportedError} (or a subclass) when `comm.size` does not fit the model (e.g. does
   *   not divide its head counts), with a message naming the sizes.
   */
  loadShard?(source: ModelSource, options: ShardLoadOptions): Promise<LoadedShard>;
}

/** Factory of a {@link ForwardSequence} for tests and callers (`logits` defaults to `'last'`). */
export function forwardSequence(
  id: SequenceId,
  position: number,
  tokens: ArrayLike<number>,
  logits: LogitsRequest = 'last',
  phase?: 'prefill',
): ForwardSequence {
  return Object.freeze({
    id,
    position,
    tokens: Int32Array.from(tokens),
    logits,
    ...(phase === undefined ? {} : { phase }),
  });
}
