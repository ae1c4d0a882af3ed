/**
 * State slots for linear-attention layers (Kimi Delta Attention, REFERENCE.md §7): per sequence one
 * slot holding, for every linear layer, the recurrent state `[heads, dK, dV]` f32 and the short-conv
 * states `convStates × [channels, convWidth]` f32 (the last `kernel − 1` inputs of each causal
 * depthwise conv; KDA has three: q, k, v).
 *
 * Layout, f32: recurrent store of a layer `[numSlots, heads·dK·dV]`; conv store of a layer
 * `[numSlots, convStates, channels, convWidth]`. A slot is zeroed when allocated (a fresh sequence
 * starts from the zero state, as the reference).
 */

import { CacheError, type SequenceId, sharedFloat32 } from './paged-kv-pool.js';

/** Shape of a {@link StateSlotPool}. */
export interface StateSlotPoolOptions {
  /** Absolute layer ids with linear-attention state (e.g. the KDA layers), each distinct. */
  readonly layers: readonly number[];
  /** Heads per layer. */
  readonly heads: number;
  /** Key dimension per head (rows of the state). */
  readonly keyDim: number;
  /** Value dimension per head (columns of the state). */
  readonly valueDim: number;
  /** Conv states per layer (KDA: 3, for q, k, v); 0 for none. */
  readonly convStates: number;
  /** Channels per conv state (KDA: heads · headDim). */
  readonly convChannels: number;
  /** Columns kept per channel (`short_conv_kernel_size − 1`). */
  readonly convWidth: number;
  /** Slots in the pool (maximum concurrent sequences). */
  readonly numSlots: number;
}

/** A copy of one slot's state (all layers), for rollback ({@link StateSlotPool.snapshot}). */
export interface StateSnapshot {
  /** Per layer (pool order): recurrent `[heads·dK·dV]` f32. */
  readonly recurrent: readonly Float32Array[];
  /** Per layer (pool order): conv `[convStates·channels·convWidth]` f32. */
  readonly conv: readonly Float32Array[];
}

/** A pool of linear-attention state slots. Not thread-safe; one per stage (or per TP rank). */
export class StateSlotPool {
  readonly layers: readonly number[];
  readonly numSlots: number;
  /** f32 per slot per layer, recurrent state. */
  readonly recurrentFloats: number;
  /** f32 per slot per layer, all conv states. */
  readonly convFloats: number;
  private readonly recurrentStores = new Map<number, Float32Array>();
  private readonly convStores = new Map<number, Float32Array>();
  private readonly freeSlots: number[] = [];
  private readonly slotOfSeq = new Map<SequenceId, number>();

  /** @throws {RangeError} on a non-positive size or a repeated layer id. */
  constructor(readonly options: StateSlotPoolOptions) {
    const { layers, heads, keyDim, valueDim, convStates, convChannels, convWidth, numSlots } = options;
    for (const [name, v, min] of [
      ['heads', heads, 1],
      ['keyDim', keyDim, 1],
      ['valueDim', valueDim, 1],
      ['convStates', convStates, 0],
      ['convChannels', convChannels, 0],
      ['convWidth', convWidth, 0],
      ['numSlots', numSlots, 1],
    ] as const) {
      if (!Number.isSafeInteger(v) || v < min)
        throw new RangeError(`StateSlotPool: ${name}: expected an integer >= ${min}, got ${v}`);
    }
    if (new Set(layers).size !== layers.length)
      throw new RangeError(`StateSlotPool: layers: expected distinct ids, got [${layers.join(', ')}]`);
    this.layers = Object.freeze([...layers]);
    this.numSlots = numSlots;
    this.recurrentFloats = heads * keyDim * valueDim;
    this.convFloats = convStates * convChannels * convWidth;
    for (const l of layers) {
      this.recurrentStores.set(l, sharedFloat32(numSlots * this.recurrentFloats));
      this.convStores.set(l, sharedFloat32(numSlots * this.convFloats));
    }
    for (let s = numSlots - 1; s >= 0; s--) this.freeSlots.push(s);
  }

  /** Slots owned by some sequence. */
  get slotsInUse(): number {
    return this.numSlots - this.freeSlots.length;
  }

  /** Slots free. */
  get slotsFree(): number {
    return this.freeSlots.length;
  }

  /** True if `id` holds a slot. */
  has(id: SequenceId): boolean {
    return this.slotOfSeq.has(id);
  }

  /**
   * Gives `id` a zeroed slot.
   * @returns the slot index.
   * @throws {CacheError} `full` if none is free; `duplicate-sequence` if `id` already has one.
   */
  allocate(id: SequenceId): number {
    if (this.slotOfSeq.has(id))
      throw new CacheError('duplicate-sequence', `StateSlotPool: sequence ${String(id)} already has a slot`);
    const slot = this.freeSlots.pop();
    if (slot === undefined) throw new CacheError('full', `StateSlotPool: no free slot (${this.numSlots} in use)`);
    this.slotOfSeq.set(id, slot);
    for (const l of this.layers) {
      this.recurrentStores.get(l)!.fill(0, slot * this.recurrentFloats, (slot + 1) * this.recurrentFloats);
      this.convStores.get(l)!.fill(0, slot * this.convFloats, (slot + 1) * this.convFloats);
    }
    return slot;
  }

  /** Frees the slot of `id`. Idempotent (unknown ids are ignored). */
  free(id: SequenceId): void {
    const slot = this.slotOfSeq.get(id);
    if (slot === undefined) return;
    this.slotOfSeq.delete(id);
    this.freeSlots.push(slot);
  }

  /** Slot index of `id`. @throws {CacheError} `unknown-sequence`. */
  slotOf(id: SequenceId): number {
    const slot = this.slotOfSeq.get(id);
    if (slot === undefined)
      throw new CacheError('unknown-sequence', `StateSlotPool: sequence ${String(id)} has no slot`);
    return slot;
  }

  /** Recurrent state of `id` at `layer`: a view `[heads, dK, dV]` f32 into the pool (no copy). */
  recurrent(id: SequenceId, layer: number): Float32Array {
    const slot = this.slotOf(id);
    return this.store(this.recurrentStores, layer).subarray(
      slot * this.recurrentFloats,
      (slot + 1) * this.recurrentFloats,
    );
  }

  /** Conv states of `id` at `layer`: a view `[convStates, channels, convWidth]` f32 (no copy). */
  conv(id: SequenceId, layer: number): Float32Array {
    const slot = this.slotOf(id);
    return this.store(this.convStores, layer).subarray(slot * this.convFloats, (slot + 1) * this.convFloats);
  }

  /** The whole recurrent store of `layer`, `[numSlots, heads, dK, dV]` f32 (for kernels that index by slot). */
  recurrentStore(layer: number): Float32Array {
    return this.store(this.recurrentStores, layer);
  }

  /** The whole conv store of `layer`, `[numSlots, convStates·channels, convWidth]` f32. */
  convStore(layer: number): Float32Array {
    return this.store(this.convStores, layer);
  }

  /** Copies the state of `id` (all layers). */
  snapshot(id: SequenceId): StateSnapshot {
    return {
      recurrent: this.layers.map((l) => this.recurrent(id, l).slice()),
      conv: this.layers.map((l) => this.conv(id, l).slice()),
    };
  }

  /** Writes a {@link snapshot} back into the slot of `id`. @throws {RangeError} on a snapshot of another pool shape. */
  restore(id: SequenceId, snap: StateSnapshot): void {
    if (snap.recurrent.length !== this.layers.length || snap.conv.length !== this.layers.length) {
      throw new RangeError(
        `StateSlotPool.restore: snapshot has ${snap.recurrent.length} layers, pool has ${this.layers.length}`,
      );
    }
    this.layers.forEach((l, i) => {
      this.recurrent(id, l).set(snap.recurrent[i]!);
      this.conv(id, l).set(snap.conv[i]!);
    });
  }

  private store(stores: Map<number, Float32Array>, layer: number): Float32Array {
    const s = stores.get(layer);
    if (s === undefined)
      throw new RangeError(`StateSlotPool: layer ${layer} keeps no linear state (layers [${this.layers.join(', ')}])`);
    return s;
  }
}
