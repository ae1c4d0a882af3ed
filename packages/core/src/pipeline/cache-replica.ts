/**
 * A replica of the driver's sequence caches in another process (a pipeline stage) or thread (a TP
 * rank): the driver records its cache operations ({@link CacheOp}, mirrored-cache.ts) and ships them
 * with the next forward; the replica applies them in order to its own caches (its layers' KV pages
 * and linear-state slots), so every stage and rank keeps the same sequences at the same lengths.
 * Commits ({@link PrefixCommit}, {@link TreeCommit}) apply to the replica's last forward result on that cache.
 */

import { SequenceCache, type SequenceCheckpoint } from '../kv/sequence-cache.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { ForwardResult, StageModel } from '../plugin/model-plugin.js';
import { hasPrefixCommit, hasTreeCommit, type PrefixCommit, type TreeCommit } from '../plugin/stage-capabilities.js';
import type { CacheOp } from './stage-worker.js';

/** Caches by driver cache id, their checkpoints, and the last forward (for commits). */
export class CacheReplica {
  private readonly caches = new Map<number, SequenceCache>();
  private readonly checkpoints = new Map<number, Map<SequenceId, SequenceCheckpoint>>();
  /** The last forward's result and the cache it ran on (a commit refers to it). */
  protected last: { cache: number; result: ForwardResult } | undefined;

  /** @param label names the replica in errors (`'stage'`, `'tensor-parallel rank'`). */
  constructor(
    protected readonly model: StageModel,
    private readonly label: string,
  ) {}

  /** Cache `id`. @throws {Error} for an unknown id. */
  cache(id: number): SequenceCache {
    const c = this.caches.get(id);
    if (c === undefined) throw new Error(`${this.label}: unknown cache ${id}`);
    return c;
  }

  /** Pages and state slots held over every cache (a gauge: what the driver freed is free here too). */
  held(): { pagesInUse: number; slotsInUse: number } {
    let pagesInUse = 0;
    let slotsInUse = 0;
    for (const c of this.caches.values()) {
      pagesInUse += c.pagesInUse;
      slotsInUse += c.slotsInUse;
    }
    return { pagesInUse, slotsInUse };
  }

  /** Checkpoints of cache `id` (kept exactly while the cache exists). @throws {Error} for an unknown id. */
  private checkpointsOf(id: number): Map<SequenceId, SequenceCheckpoint> {
    const c = this.checkpoints.get(id);
    if (c === undefined) throw new Error(`${this.label}: unknown cache ${id}`);
    return c;
  }

  private lastResult(cache: number): ForwardResult {
    if (this.last === undefined || this.last.cache !== cache)
      throw new Error(`${this.label}: commit without a forward on this cache`);
    return this.last.result;
  }

  /** Runs `forward` on cache `id` and keeps its result for the commits that follow. */
  protected runForward(cache: number, forward: (c: SequenceCache) => ForwardResult): ForwardResult {
    const c = this.cache(cache);
    this.last = undefined;
    const result = forward(c);
    this.last = { cache, result };
    return result;
  }

  /**
   * Applies one recorded operation.
   * @throws {Error} for a rollback without a checkpoint, an unknown cache, or a commit the stage cannot do
   *   (the driver records only the commits its last stage has: every stage runs the same plugin).
   */
  apply(op: CacheOp): void {
    switch (op.op) {
      case 'cache':
        // a TP group's cache mirrors these operations to its worker ranks
        this.caches.set(
          op.cache,
          this.model.createCache?.(op.options) ?? new SequenceCache(this.model.cacheGeometry, op.options),
        );
        this.checkpoints.set(op.cache, new Map());
        return;
      case 'drop':
        this.caches.delete(op.cache);
        this.checkpoints.delete(op.cache);
        if (this.last?.cache === op.cache) this.last = undefined;
        return;
      case 'add':
        this.cache(op.cache).add(op.id);
        return;
      case 'finish':
        this.cache(op.cache).finish(op.id);
        this.checkpointsOf(op.cache).delete(op.id);
        return;
      case 'extend':
        this.cache(op.cache).extend(op.id, op.length);
        return;
      case 'checkpoint': {
        const cache = this.cache(op.cache);
        this.checkpointsOf(op.cache).set(op.id, cache.checkpoint(op.id));
        return;
      }
      case 'rollback': {
        const cache = this.cache(op.cache);
        const checkpoints = this.checkpointsOf(op.cache);
        const cp = checkpoints.get(op.id);
        if (cp === undefined) throw new Error(`${this.label}: rollback of ${String(op.id)} without a checkpoint`);
        cache.rollback(op.id, cp);
        checkpoints.delete(op.id);
        return;
      }
      case 'commitPrefix':
        if (!hasPrefixCommit(this.model)) throw new Error(`${this.label}: commitPrefix on a stage without it`);
        this.model.commitPrefix(this.cache(op.cache), this.lastResult(op.cache), op.id, op.committed);
        return;
      case 'commitTreePath':
        if (!hasTreeCommit(this.model)) throw new Error(`${this.label}: commitTreePath on a stage without it`);
        this.model.commitTreePath(this.cache(op.cache), this.lastResult(op.cache), op.id, op.rows);
        return;
    }
  }
}
