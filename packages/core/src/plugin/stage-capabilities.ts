/**
 * What a stage can do beyond the core {@link StageModel} contract (forward, cache geometry, dispose),
 * as small capability interfaces a stage implements and callers ask for with a type guard
 * (`hasTreeCommit(model)`) instead of probing optional hooks:
 * - {@link PrefixCommit}: commit an accepted prefix of a verify forward from state snapshots;
 * - {@link TreeCommit}: verify token trees and commit one root-to-node path;
 * - {@link DistributedStage}: a model spread over ranks or processes that loads a drafter its own way;
 * - {@link ProjectionDistribution}: a model split into stages whose stages project their own taps;
 * - {@link DeviceSampling}: sampling and rejection acceptance where the logits live (a GPU stage).
 * A guard tests that the method is there; a class declares the capability with `implements`. A wrapper
 * whose capability depends on what it wraps (a pipeline forwards its last stage's commits, a tensor-parallel
 * model its rank 0 shard's) declares it as `Partial<…>` and sets the method only when the wrapped stage has it.
 */

import type { TensorRead } from '../io/weight-reader.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { SequenceCache } from '../kv/sequence-cache.js';
import type { DeviceDraftProbs, Drafter, DrafterLoadOptions } from './drafter-plugin.js';
import type { ForwardResult, ProjectionSpec, StageModel } from './model-plugin.js';

/** A stage that commits an accepted prefix of a verify forward without a replay. */
export interface PrefixCommit {
  /**
   * commit: keeps the first `committed` tokens (≥ 1) of `id`'s rows of a forward run
   * with `{ stateSnapshots: true }` (linear state after token `committed − 1`, KV truncated).
   * Stages without it are committed by checkpoint + replay.
   */
  commitPrefix(cache: SequenceCache, result: ForwardResult, id: SequenceId, committed: number): void;
  /**
   * Optional: {@link commitPrefix} for several sequences of the same forward in one call (a stage with linear state
   * replays them together: one kernel call per layer, not one per sequence and layer). The engine uses it when
   * present; each sequence ends as its own `commitPrefix` would leave it. Throws as `commitPrefix` (the engine then
   * commits the sequences one by one, so that one bad commit fails its sequence alone).
   */
  commitPrefixes?(cache: SequenceCache, result: ForwardResult, commits: readonly PrefixCommitItem[]): void;
}

/** One sequence's commit of {@link PrefixCommit.commitPrefixes}: keep the first `committed` rows (≥ 1) of `id`. */
export interface PrefixCommitItem {
  readonly id: SequenceId;
  readonly committed: number;
}

/** A stage that verifies token trees (`ForwardSequence.tree`; attention-only targets). */
export interface TreeCommit {
  /**
   * commit a tree path: keeps the block rows `rows` of `id` in a forward run with a `tree` (a
   * root-to-node path: `rows[0] = 0`, each row the child of the previous) as the sequence's next tokens
   * — their KV moved to consecutive positions, the rest dropped. Stages with linear state leave it
   * absent: a tree would need per-branch state, and say why in `StageInfo.treeVerificationBlocker`.
   */
  commitTreePath(cache: SequenceCache, result: ForwardResult, id: SequenceId, rows: readonly number[]): void;
}

/** A model spread over tensor-parallel ranks or pipeline stages, which loads a drafter the way it is spread. */
export interface DistributedStage {
  /**
   * Loads a drafter the way this model is spread: a target spread over tensor-parallel
   * ranks (tensor-parallel/tp-model.ts) loads the drafter checkpoint `dir` spread over the same ranks
   * through the drafter plugin's `loadShard`; a pipeline delegates to its last stage, where the drafter
   * lives. Undefined when the claiming plugin cannot be spread (no `loadShard`): the caller then loads
   * the whole drafter on this thread with `target` = this model, as for a local target.
   * @throws {PluginError} when no plugin claims the checkpoint; the plugin's errors (a spread that does not fit it).
   */
  loadDrafter(
    dir: string,
    plugins: readonly string[],
    options: Omit<DrafterLoadOptions, 'target'>,
  ): Promise<Drafter | undefined>;
}

/** A model split into stages (a pipeline) whose stages can project their drafter taps where they are produced. */
export interface ProjectionDistribution {
  /**
   * Each stage that produces some of `spec.taps` loads its share of the drafter's projection
   * (`DrafterPlugin.loadProjection` of the drafter at `spec.dir`, resolved among the plugin packages
   * the model was started with) and from then on a forward asked for taps returns the fp32 partial
   * projection of the taps those stages produce in {@link ForwardResult.projection} instead of the
   * taps themselves (REFERENCE.md §8). `undefined` drops any loaded projection (the stages ship raw
   * taps again: a drafter whose plugin cannot split its projection). Returns what each stage loaded,
   * in stage order.
   * @throws the stage's error (a drafter plugin without `loadProjection`, a bad checkpoint).
   */
  distributeProjection(spec: ProjectionSpec | undefined): readonly (readonly TensorRead[])[];
}

/** One sequence's sampling request for {@link DeviceSampling.sampleOnDevice}. */
export interface DeviceSampleSpec {
  /** The request's sampling (temperature > 0; top-k 0 or absent: off; top-p absent: 1). */
  readonly temperature: number;
  readonly topK?: number;
  readonly topP?: number;
  /** The drafts `[k]` i32 verified by the sequence's k + 1 logit rows (empty: sample from its one row). */
  readonly drafts: Int32Array;
  /** The drafter's probabilities `[k, vocab]` f32 of those drafts, or undefined: point masses (argmax drafts). */
  readonly q: Float32Array | undefined;
  /**
   * Instead of q: the same `[k, vocab]` f32 rows in device memory (a GPU drafter's {@link DeviceDraftProbs}), given
   * only to a stage whose `acceptsDeviceProbs` accepted them.
   */
  readonly qDevice?: DeviceDraftProbs;
  /** `[k + 1]` draws in [0, 1) from the request's PRNG: one per draft, the last for the token drawn. */
  readonly uniforms: Float64Array;
}

/**
 * A stage that samples where its logits live (the GPU stage: only token ids come back). Same distribution as
 * the host path (probs.ts samplingProbs: temperature, top-k, top-p; rejection sampling as accept.ts
 * acceptSampled), not the same draws: seeded output is reproducible per device, not across devices.
 */
export interface DeviceSampling {
  /**
   * Rejection sampling over the logits of `result` — the stage's latest forward, run with `argmaxOnly` — for each
   * sequence s with `specs[s]` (its logit rows are its k + 1 verify rows, or its one last row when k = 0): draft j
   * is accepted when u_j · q_j(x_j) < p_j(x_j); at the first rejection a token is drawn from norm(max(0, p_j − q_j)),
   * else the bonus token from p_k (Leviathan et al., arXiv 2211.17192).
   * @returns `[2 · specs.length]` i32: per sequence the accepted drafts and the token drawn; the token is −1 when a
   *   row it used holds a NaN / +Infinity / no finite value (the accepted count then names that row); both −2 for
   *   a sequence without a spec.
   * @throws when `result` is not the latest forward, or a spec does not match its rows (a caller's bug).
   */
  sampleOnDevice(result: ForwardResult, specs: readonly (DeviceSampleSpec | undefined)[]): Int32Array;
  /**
   * Whether this stage reads a drafter's q where it lies (`DeviceSampleSpec.qDevice`): the same device. Absent: never
   * (q comes as host memory).
   */
  acceptsDeviceProbs?(probs: DeviceDraftProbs): boolean;
}

/** Whether `model` samples where its logits live ({@link DeviceSampling}). */
export function hasDeviceSampling<M extends StageModel>(model: M): model is M & DeviceSampling {
  return 'sampleOnDevice' in model && typeof model.sampleOnDevice === 'function';
}

/** Whether `model` commits accepted prefixes from state snapshots ({@link PrefixCommit}). */
export function hasPrefixCommit<M extends StageModel>(model: M): model is M & PrefixCommit {
  return 'commitPrefix' in model && typeof model.commitPrefix === 'function';
}

/** Whether `model` verifies token trees ({@link TreeCommit}). */
export function hasTreeCommit<M extends StageModel>(model: M): model is M & TreeCommit {
  return 'commitTreePath' in model && typeof model.commitTreePath === 'function';
}

/** Whether `model` is spread over ranks or stages and loads drafters its own way ({@link DistributedStage}). */
export function isDistributedStage<M extends StageModel>(model: M): model is M & DistributedStage {
  return 'loadDrafter' in model && typeof model.loadDrafter === 'function';
}

/** Whether `model`'s stages can project drafter taps where they are produced ({@link ProjectionDistribution}). */
export function hasProjectionDistribution<M extends StageModel>(model: M): model is M & ProjectionDistribution {
  return 'distributeProjection' in model && typeof model.distributeProjection === 'function';
}
