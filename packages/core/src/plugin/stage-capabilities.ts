/**
 * What a stage can do beyond the core {@link StageModel} contract (forward, cache geometry, dispose),
 * as small capability interfaces a stage implements and callers ask for with a type guard
 * (`hasTreeCommit(model)`) instead of probing optional hooks:
 * - {@link PrefixCommit}: commit an accepted prefix of a verify forward from state snapshots;
 * - {@link TreeCommit}: verify token trees and commit one root-to-node path;
 * - {@link DistributedStage}: a model spread over ranks or processes that loads a drafter its own way;
 * - {@link ProjectionDistribution}: a model split into stages whose stages project their own taps.
 * A guard tests that the method is there; a class declares the capability with `implements`. A wrapper
 * whose capability depends on what it wraps (a pipeline forwards its last stage's commits, a tensor-parallel
 * model its rank 0 shard's) declares it as `Partial<…>` and sets the method only when the wrapped stage has it.
 */

import type { TensorRead } from '../io/weight-reader.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { SequenceCache } from '../kv/sequence-cache.js';
import type { Drafter, DrafterLoadOptions } from './drafter-plugin.js';
import type { ForwardResult, ProjectionSpec, StageModel } from './model-plugin.js';

/** A stage that commits an accepted prefix of a verify forward without a replay. */
export interface PrefixCommit {
  /**
   * commit: keeps the first `committed` tokens (≥ 1) of `id`'s rows of a forward run
   * with `{ stateSnapshots: true }` (linear state after token `committed − 1`, KV truncated).
   * Stages without it are committed by checkpoint + replay.
   */
  commitPrefix(cache: SequenceCache, result: ForwardResult, id: SequenceId, committed: number): void;
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
