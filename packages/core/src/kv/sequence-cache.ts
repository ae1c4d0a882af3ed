/**
 * The caches of one model stage for all its sequences: a {@link PagedKvPool} for the attention
 * layers and a {@link StateSlotPool} for the linear-attention layers, sized from the model's
 * {@link CacheGeometry}. Lifecycle per sequence: `add` → model forwards (which `extend` the KV) →
 * optional `checkpoint` / `rollback` around a verify step → `finish` or `abort` (both free
 * everything the sequence holds).
 */

import { CacheError, PagedKvPool, type SequenceId } from './paged-kv-pool.js';
import { StateSlotPool, type StateSnapshot } from './state-slot-pool.js';

/** Paged-KV part of a model's cache geometry. */
export interface PagedKvGeometry {
  /** Absolute layer ids with paged KV. */
  readonly layers: readonly number[];
  /** f32 values per token per layer. */
  readonly floatsPerToken: number;
  /**
   * How a token's row splits under tensor parallelism (prefill/decode transfers plan by it): present = the row
   * is `kvHeads × (floatsPerToken / kvHeads)`, one block per KV head, each rank holding its heads (GQA);
   * absent = the row is one block replicated whole on every rank (MLA's latent + k_pe).
   */
  readonly kvHeads?: number;
}

/** Linear-attention-state part of a model's cache geometry. */
export interface LinearStateGeometry {
  /** Absolute layer ids with recurrent state. */
  readonly layers: readonly number[];
  readonly heads: number;
  readonly keyDim: number;
  readonly valueDim: number;
  readonly convStates: number;
  readonly convChannels: number;
  readonly convWidth: number;
}

/** What a stage model caches per sequence (either part may list no layers). */
export interface CacheGeometry {
  readonly pagedKv: PagedKvGeometry;
  readonly linearState: LinearStateGeometry;
}

/** Capacity of a {@link SequenceCache}. */
export interface SequenceCacheOptions {
  /** Tokens per KV page (default 16). */
  readonly pageSize?: number;
  /** KV pages in the pool. */
  readonly numPages: number;
  /** State slots (maximum concurrent sequences). */
  readonly numSlots: number;
  /**
   * Tokens one sequence may hold (the engine's `maxTokensPerSequence`; absent: up to the pool): a stage that sizes
   * per-sequence device structures (a GPU stage's block tables) reads it in `createCache`.
   */
  readonly maxSequenceLength?: number;
  /** Where the paged K/V live ({@link PagedKvPoolOptions.storage}; default `'host'`). */
  readonly kvStorage?: 'host' | 'device';
}

/** A saved point of one sequence (KV length + linear state), for rollback after verification. */
export interface SequenceCheckpoint {
  /** KV tokens at the checkpoint. */
  readonly length: number;
  /** Linear state at the checkpoint (undefined if the stage has no linear layers). */
  readonly state: StateSnapshot | undefined;
}

/** Per-stage caches of all sequences. */
export class SequenceCache {
  readonly kv: PagedKvPool | undefined;
  readonly state: StateSlotPool | undefined;
  private readonly lengths = new Map<SequenceId, number>();

  constructor(
    readonly geometry: CacheGeometry,
    options: SequenceCacheOptions,
  ) {
    const g = geometry;
    this.kv =
      g.pagedKv.layers.length === 0
        ? undefined
        : new PagedKvPool({
            layers: g.pagedKv.layers,
            floatsPerToken: g.pagedKv.floatsPerToken,
            pageSize: options.pageSize ?? 16,
            numPages: options.numPages,
            ...(options.kvStorage === undefined ? {} : { storage: options.kvStorage }),
          });
    this.state =
      g.linearState.layers.length === 0
        ? undefined
        : new StateSlotPool({ ...g.linearState, numSlots: options.numSlots });
  }

  /** Sequences registered. */
  get numSequences(): number {
    return this.lengths.size;
  }

  /** KV pages in use (0 without paged layers). */
  get pagesInUse(): number {
    return this.kv?.pagesInUse ?? 0;
  }

  /** State slots in use (0 without linear layers). */
  get slotsInUse(): number {
    return this.state?.slotsInUse ?? 0;
  }

  /** True if `id` is registered. */
  has(id: SequenceId): boolean {
    return this.lengths.has(id);
  }

  /**
   * Registers a sequence: an empty block table and a zeroed state slot.
   * @throws {CacheError} `duplicate-sequence`, or `full` if no state slot is free.
   */
  add(id: SequenceId): void {
    if (this.lengths.has(id))
      throw new CacheError('duplicate-sequence', `SequenceCache: sequence ${String(id)} already exists`);
    this.state?.allocate(id);
    this.kv?.addSequence(id);
    this.lengths.set(id, 0);
  }

  /** Tokens processed for `id` (its next position). @throws {CacheError} `unknown-sequence`. */
  length(id: SequenceId): number {
    const n = this.lengths.get(id);
    if (n === undefined) throw new CacheError('unknown-sequence', `SequenceCache: unknown sequence ${String(id)}`);
    return n;
  }

  /**
   * Grows `id` to `newLength` tokens (allocates KV pages; called by the model before writing).
   * @throws {CacheError} `full` (nothing allocated), `range`, `unknown-sequence`.
   */
  extend(id: SequenceId, newLength: number): void {
    const n = this.length(id);
    if (!Number.isSafeInteger(newLength) || newLength < n)
      throw new CacheError('range', `SequenceCache.extend: newLength: expected >= ${n}, got ${newLength}`);
    this.kv?.extend(id, newLength);
    this.lengths.set(id, newLength);
  }

  /**
   * Grows every sequence of a forward batch by its new tokens, all or nothing: on an error the
   * sequences already grown go back to their `position`.
   * @param seqs `position` = the sequence's length now, `numNew` = tokens to add.
   * @throws {CacheError} as {@link extend} (nothing is left allocated).
   */
  extendAll(seqs: readonly { readonly id: SequenceId; readonly position: number; readonly numNew: number }[]): void {
    const done: (typeof seqs)[number][] = [];
    try {
      for (const s of seqs) {
        this.extend(s.id, s.position + s.numNew);
        done.push(s);
      }
    } catch (err) {
      for (const s of done) this.rollback(s.id, { length: s.position, state: undefined });
      throw err;
    }
  }

  /** Saves `id`'s KV length and linear state (before a verify forward). */
  checkpoint(id: SequenceId): SequenceCheckpoint {
    return { length: this.length(id), state: this.state?.snapshot(id) };
  }

  /**
   * Returns `id` to a checkpoint: truncates KV (freeing pages) and restores the linear state.
   * To commit `n` accepted tokens, roll back and run them again (replay), see the model plugin.
   * @throws {CacheError} `range` if the sequence is now shorter than the checkpoint.
   */
  rollback(id: SequenceId, cp: SequenceCheckpoint): void {
    if (this.length(id) < cp.length)
      throw new CacheError(
        'range',
        `SequenceCache.rollback: sequence is shorter (${this.length(id)}) than the checkpoint (${cp.length})`,
      );
    this.kv?.truncate(id, cp.length);
    if (cp.state !== undefined) this.state?.restore(id, cp.state);
    this.lengths.set(id, cp.length);
  }

  /** The sequence completed: frees its pages and slot. Idempotent. */
  finish(id: SequenceId): void {
    this.release(id);
  }

  /** The sequence was aborted (client gone, error, timeout): frees its pages and slot. Idempotent. */
  abort(id: SequenceId): void {
    this.release(id);
  }

  private release(id: SequenceId): void {
    this.kv?.free(id);
    this.state?.free(id);
    this.lengths.delete(id);
  }
}
