/**
 * A {@link SequenceCache} that records the caller's cache operations for copies of the cache held
 * elsewhere (pipeline stage processes, tensor-parallel worker ranks): `add`, `extend`, `finish` / `abort`,
 * `checkpoint`, `rollback`, plus the commits the owners record themselves. Each owner — a
 * {@link PipelineModel}, a {@link TensorParallelModel} — attaches one mirror (a queue per remote copy);
 * the queues travel with that copy's next forward request. Several owners can mirror one cache: under
 * TP × PP the driver's last stage is a TP group, so the engine's cache is rank 0's cache of the last
 * stage, mirrored to the earlier stage processes AND to the last stage's worker ranks.
 *
 * While an owner runs its local model (the last stage, rank 0) it pauses its mirror (`local`): the
 * cache calls that model makes inside its own forward / commit are not the caller's, and every copy
 * makes its own.
 */

import {
  SequenceCache,
  type CacheGeometry,
  type SequenceCacheOptions,
  type SequenceCheckpoint,
} from '../kv/sequence-cache.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { CacheOp } from './stage-worker.js';

/** A mirrored cache was used wrongly (not created by the model, or an older checkpoint restored). */
export class MirroredCacheError extends Error {
  override readonly name = 'MirroredCacheError';
}

interface Mirror {
  readonly queues: CacheOp[][];
  paused: boolean;
}

let nextCacheId = 1;

/** See the file comment. */
export class MirroredCache extends SequenceCache {
  /** The id the remote copies know this cache by (unique in the process). */
  readonly cacheId = nextCacheId++;
  private readonly mirrors = new Map<object, Mirror>();
  private readonly checkpoints = new Map<SequenceId, SequenceCheckpoint>();

  constructor(
    geometry: CacheGeometry,
    private readonly cacheOptions: SequenceCacheOptions,
  ) {
    super(geometry, cacheOptions);
  }

  /**
   * Starts mirroring for `owner`: each of `queues` gets the `cache` (create) operation now and every operation from
   * now on.
   */
  attach(owner: object, queues: CacheOp[][]): void {
    if (this.mirrors.has(owner))
      throw new MirroredCacheError('MirroredCache.attach: this owner mirrors the cache already');
    this.mirrors.set(owner, { queues, paused: false });
    for (const q of queues) q.push({ op: 'cache', cache: this.cacheId, options: this.cacheOptions });
  }

  /** True when `owner` mirrors this cache. */
  mirroredBy(owner: object): boolean {
    return this.mirrors.has(owner);
  }

  /** Queues `op` for `owner`'s queue `k` (or all its queues), paused or not (commits). */
  recordFor(owner: object, op: CacheOp, k?: number): void {
    const m = this.mirrors.get(owner);
    if (m === undefined) throw new MirroredCacheError('MirroredCache.recordFor: not a mirror of this cache');
    if (k === undefined) for (const q of m.queues) q.push(op);
    else m.queues[k]!.push(op);
  }

  /** Runs `f` with `owner`'s mirror paused (its local model's own cache calls). */
  local<T>(owner: object, f: () => T): T {
    const m = this.mirrors.get(owner);
    if (m === undefined) throw new MirroredCacheError('MirroredCache.local: not a mirror of this cache');
    const was = m.paused;
    m.paused = true;
    try {
      return f();
    } finally {
      m.paused = was;
    }
  }

  /** True when some mirror records (the call is the caller's, not a local model's). */
  private get recording(): boolean {
    for (const m of this.mirrors.values()) if (!m.paused) return true;
    return false;
  }

  private record(op: CacheOp): void {
    for (const m of this.mirrors.values()) {
      if (!m.paused) for (const q of m.queues) q.push(op);
    }
  }

  override add(id: SequenceId): void {
    super.add(id);
    this.record({ op: 'add', cache: this.cacheId, id });
  }

  override finish(id: SequenceId): void {
    const had = this.has(id);
    super.finish(id);
    this.checkpoints.delete(id);
    if (had) this.record({ op: 'finish', cache: this.cacheId, id });
  }

  override abort(id: SequenceId): void {
    const had = this.has(id);
    super.abort(id);
    this.checkpoints.delete(id);
    if (had) this.record({ op: 'finish', cache: this.cacheId, id });
  }

  /**
   * Grows `id` to `newLength` tokens. Recorded when the caller grows it (the decode role's reservation); a local
   * model's forward grows its own copy, as every copy does in its forward.
   */
  override extend(id: SequenceId, newLength: number): void {
    super.extend(id, newLength);
    this.record({ op: 'extend', cache: this.cacheId, id, length: newLength });
  }

  override checkpoint(id: SequenceId): SequenceCheckpoint {
    const cp = super.checkpoint(id);
    if (this.recording) {
      this.checkpoints.set(id, cp);
      this.record({ op: 'checkpoint', cache: this.cacheId, id });
    }
    return cp;
  }

  override rollback(id: SequenceId, cp: SequenceCheckpoint): void {
    const recording = this.recording;
    if (recording) {
      // the copies keep the sequence's latest checkpoint only
      if (this.checkpoints.get(id) !== cp)
        throw new MirroredCacheError(
          `MirroredCache.rollback: ${String(id)}: only the sequence's latest checkpoint can be restored ` +
            'under pipeline / tensor parallelism',
        );
      this.checkpoints.delete(id);
    }
    super.rollback(id, cp);
    if (recording) this.record({ op: 'rollback', cache: this.cacheId, id });
  }
}
