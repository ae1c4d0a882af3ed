/**
 * Shared-memory collectives for tensor-parallel ranks that are threads of one process
 * (docs/ARCHITECTURE.md "Tensor parallelism").
 *
 * Layout of the control words (`Int32Array` over a SharedArrayBuffer):
 *   [0] barrier arrivals, [1] barrier generation, [2] abort flag,
 *   [4 + 2k] requests posted to rank k, [5 + 2k] replies posted by rank k,
 *   [4 + 2·size + k] the length (floats) of rank k's piece in the current all-gather.
 * The data buffer is `[size, capacity]` f32 (one row per rank), also shared.
 *
 * allReduce(x): in pieces of `capacity` floats, every rank writes its piece into its row, waits at a
 * barrier, sums the rows in rank order (row 0 + row 1 + …: the same bits on every rank and every
 * run), and waits at a second barrier before the rows are reused. Waiting is a short spin, then
 * `Atomics.wait` (futex) in slices that re-check the abort flag: a rank that fails calls
 * {@link SharedComm.abort}, and every rank waiting in a barrier throws {@link TpAbortError}.
 *
 * broadcast(x): in pieces of `capacity` floats, rank 0 writes its piece into row 0, barrier, every
 * other rank copies row 0, barrier (Megatron's / NCCL's broadcast from root 0, over shared memory).
 *
 * allGather(x): every rank passes its own piece (lengths may differ by rank) and gets the pieces of
 * ranks 0, 1, …, size − 1 concatenated (NCCL's all-gather, generalised to uneven pieces as
 * `torch.distributed.all_gather` with per-rank sizes; Megatron-LM / vLLM gather the vocab-parallel
 * logits this way). Round 0: every rank writes its length into its control word and the first
 * `capacity` floats of its piece into its row, barrier; every rank reads all lengths (so all agree on
 * the number of rounds, ⌈max length / capacity⌉, at least 1) and copies every row's chunk to its
 * place in the output, barrier. Later rounds move the next `capacity` floats of each piece the same way.
 */

import { receiveMessageOnPort, type MessagePort } from 'node:worker_threads';

import type { TpComm } from '../plugin/model-plugin.js';

/** A collective was abandoned because another rank failed (or the group was disposed). */
export class TpAbortError extends Error {
  override readonly name = 'TpAbortError';
}

const COUNT = 0;
const GEN = 1;
const ABORT = 2;
/** Control words for a group of `size` ranks. */
export function controlWords(size: number): number {
  return 4 + 3 * size;
}
/** Index of rank k's request counter. */
export function requestWord(k: number): number {
  return 4 + 2 * k;
}
/** Index of rank k's reply counter. */
export function replyWord(k: number): number {
  return 5 + 2 * k;
}

/** Index of the word holding the length of rank k's all-gather piece in a group of `size` ranks. */
export function gatherLengthWord(size: number, k: number): number {
  return 4 + 2 * size + k;
}

/** The shared buffers of a group (passed to worker threads in `workerData`). */
export interface CommBuffers {
  readonly size: number;
  readonly control: SharedArrayBuffer;
  readonly data: SharedArrayBuffer;
  /** Floats per rank row of `data`. */
  readonly capacity: number;
}

/** Allocates the buffers of a group of `size` ranks with all-reduce pieces of `capacity` floats. */
export function createCommBuffers(size: number, capacity: number): CommBuffers {
  return {
    size,
    capacity,
    control: new SharedArrayBuffer(4 * controlWords(size)),
    data: new SharedArrayBuffer(4 * size * capacity),
  };
}

/** Spins on `ctrl[i] === value` for a while, then sleeps until it changes; throws on abort. */
export function waitWhile(ctrl: Int32Array, i: number, value: number, checkAbort = true): void {
  for (let s = 0; s < 2000; s++) {
    if (Atomics.load(ctrl, i) !== value) return;
  }
  while (Atomics.load(ctrl, i) === value) {
    if (checkAbort && Atomics.load(ctrl, ABORT) !== 0)
      throw new TpAbortError('tensor parallel: another rank failed; collective abandoned');
    Atomics.wait(ctrl, i, value, 50);
  }
}

/** One rank's view of the group: barrier and all-reduce over shared memory. */
export class SharedComm implements TpComm {
  readonly size: number;
  readonly ctrl: Int32Array;
  private readonly rows: Float32Array[];
  private readonly capacity: number;
  /** All-reduce calls so far (tests, statistics). */
  allReduces = 0;
  /** Broadcast calls so far (tests, statistics). */
  broadcasts = 0;
  /** All-gather calls so far (tests, statistics). */
  allGathers = 0;

  constructor(
    readonly rank: number,
    buffers: CommBuffers,
  ) {
    this.size = buffers.size;
    this.capacity = buffers.capacity;
    this.ctrl = new Int32Array(buffers.control);
    this.rows = Array.from(
      { length: this.size },
      (_, r) => new Float32Array(buffers.data, 4 * r * this.capacity, this.capacity),
    );
  }

  /** Waits until every rank has arrived. @throws {TpAbortError} if the group was aborted. */
  barrier(): void {
    const ctrl = this.ctrl;
    if (Atomics.load(ctrl, ABORT) !== 0)
      throw new TpAbortError('tensor parallel: another rank failed; collective abandoned');
    const gen = Atomics.load(ctrl, GEN);
    if (Atomics.add(ctrl, COUNT, 1) === this.size - 1) {
      Atomics.store(ctrl, COUNT, 0);
      Atomics.add(ctrl, GEN, 1);
      Atomics.notify(ctrl, GEN);
      return;
    }
    waitWhile(ctrl, GEN, gen);
  }

  allReduce(x: Float32Array): Float32Array {
    this.allReduces++;
    if (this.size === 1) return x.slice();
    const out = new Float32Array(x.length);
    const mine = this.rows[this.rank]!;
    for (let off = 0; off < x.length; off += this.capacity) {
      const len = Math.min(this.capacity, x.length - off);
      mine.set(x.subarray(off, off + len));
      this.barrier();
      const o = out.subarray(off, off + len);
      o.set(this.rows[0]!.subarray(0, len));
      for (let r = 1; r < this.size; r++) {
        const row = this.rows[r]!;
        for (let i = 0; i < len; i++) o[i] = o[i]! + row[i]!;
      }
      this.barrier();
    }
    return out;
  }

  /**
   * Rank 0's `x` on every rank (a copy): every rank passes an array of the same length (the other
   * ranks' values are ignored; pass zeros). Two barriers per piece of `capacity` floats.
   * @throws {TpAbortError} if the group was aborted.
   */
  broadcast(x: Float32Array): Float32Array {
    this.broadcasts++;
    if (this.size === 1) return x.slice();
    const out = this.rank === 0 ? x.slice() : new Float32Array(x.length);
    const row0 = this.rows[0]!;
    for (let off = 0; off < x.length; off += this.capacity) {
      const len = Math.min(this.capacity, x.length - off);
      if (this.rank === 0) row0.set(x.subarray(off, off + len));
      this.barrier();
      if (this.rank !== 0) out.set(row0.subarray(0, len), off);
      this.barrier();
    }
    return out;
  }

  /**
   * The pieces of every rank, concatenated in rank order (a new array, the same bits on every rank):
   * `x` is this rank's piece, `[L_r]` f32; lengths may differ by rank (0 allowed); the result is
   * `[L_0 + … + L_{size−1}]`. Two barriers per round of `capacity` floats per rank (module comment).
   * @throws {TpAbortError} if the group was aborted.
   */
  allGather(x: Float32Array): Float32Array {
    this.allGathers++;
    if (this.size === 1) return x.slice();
    const ctrl = this.ctrl;
    const mine = this.rows[this.rank]!;
    const lengths = new Int32Array(this.size);
    const offsets = new Int32Array(this.size + 1);
    let out: Float32Array | undefined;
    let rounds = 1;
    for (let round = 0; round < rounds; round++) {
      const off = round * this.capacity;
      if (round === 0) Atomics.store(ctrl, gatherLengthWord(this.size, this.rank), x.length);
      mine.set(x.subarray(Math.min(off, x.length), Math.min(off + this.capacity, x.length)));
      this.barrier();
      if (round === 0) {
        for (let r = 0; r < this.size; r++) {
          lengths[r] = Atomics.load(ctrl, gatherLengthWord(this.size, r));
          offsets[r + 1] = offsets[r]! + lengths[r]!;
        }
        rounds = Math.max(1, Math.ceil(Math.max(...lengths) / this.capacity));
        out = new Float32Array(offsets[this.size]!);
      }
      for (let r = 0; r < this.size; r++) {
        const len = Math.min(this.capacity, lengths[r]! - off);
        if (len > 0) out!.set(this.rows[r]!.subarray(0, len), offsets[r]! + off);
      }
      this.barrier();
    }
    return out!;
  }

  /** Marks the group aborted and wakes every waiting rank (they throw {@link TpAbortError}). */
  abort(): void {
    Atomics.store(this.ctrl, ABORT, 1);
    Atomics.notify(this.ctrl, GEN);
  }

  /** Clears the abort flag and the barrier (driver only, while no rank is inside a collective). */
  reset(): void {
    Atomics.store(this.ctrl, ABORT, 0);
    Atomics.store(this.ctrl, COUNT, 0);
  }

  get aborted(): boolean {
    return Atomics.load(this.ctrl, ABORT) !== 0;
  }
}

/**
 * Takes the next message of `port`, which the sender posted before signalling: waits (1 ms slices,
 * up to `timeoutMs`) in the unlikely case it is not visible yet. Undefined after the timeout.
 */
export function takeMessage(port: MessagePort, timeoutMs = 10_000): unknown {
  const cell = new Int32Array(new SharedArrayBuffer(4));
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const m = receiveMessageOnPort(port);
    if (m !== undefined) return m.message;
    if (Date.now() > deadline) return undefined;
    Atomics.wait(cell, 0, 0, 1);
  }
}
