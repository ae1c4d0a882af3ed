/**
 * The draft context the engine writes from the target's taps: `projectTargetHiddenPartial` →
 * `writeProjectedContextKV` for the committed tokens of every verify step, and the deferral of that
 * write while a sequence does not draft (prefill chunks and k = 0 steps keep their taps per sequence
 * until it first drafts: a sequence that never drafts again never pays the projection).
 *
 * A forward's inputs to the draft context are a typed {@link ContextRows} record: the taps, and the
 * fp32 partial projection of the taps earlier pipeline stages projected ({@link ForwardResult.projection}),
 * passed as the accumulator of `projectTargetHiddenPartial` for the remaining taps.
 */

import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { ContextSpan, Drafter } from '../plugin/drafter-plugin.js';
import type { ForwardResult } from '../plugin/model-plugin.js';
import { EngineError } from './types.js';

/** Tap bytes a sequence may hold for its deferred draft context before it is written (8 MiB). */
export const PENDING_TAP_BYTES = 8 << 20;

/**
 * Inputs to the draft context of `n` rows: per tap id `[n, hiddenSize]` f32, and the partial
 * projection `[n, hiddenSize]` f32 of the taps already projected (pipeline stages), if any.
 */
export interface ContextRows {
  readonly taps: ReadonlyMap<number, Float32Array>;
  readonly projection?: Float32Array;
}

/**
 * Float32Arrays of one length kept for reuse, up to `maxBytes` in all: the chunks of every sequence's deferred draft
 * context ({@link RowBuffer}).
 */
export class FloatPool {
  private readonly free: Float32Array[] = [];

  /**
   * @param length elements of every array; @param maxBytes the most bytes kept for reuse (default 64 MiB); beyond
   *   it a given array is dropped.
   */
  constructor(
    readonly length: number,
    private readonly maxBytes = 64 << 20,
  ) {}

  /** An array of {@link length} elements (reused, its contents stale, or new). */
  take(): Float32Array {
    return this.free.pop() ?? new Float32Array(this.length);
  }

  /** Keeps `a` (of {@link length} elements) for reuse; the caller no longer reads or writes it. */
  give(a: Float32Array): void {
    if ((this.free.length + 1) * this.length * 4 <= this.maxBytes) this.free.push(a);
  }
}

/** Rows per chunk of a {@link RowBuffer}. */
export const ROW_CHUNK = 64;

/**
 * Rows `[rows, width]` f32 appended in place, in chunks of {@link ROW_CHUNK} rows taken from and given back to a
 * {@link FloatPool}: no copy per step (a `slice` per tap per step before) and no copy on growth. Why: the deferred
 * draft context of a sequence that does not draft is held until it drafts or finishes, and holding it in arrays
 * that were allocated per step, or grown by doubling, kept V8 in a mark-compact about every 100 ms (kimi-k3-tiny +
 * DSpark at 8 sequences, drafter attached with k = 0: 230–245 mark-compacts against 2 for plain decoding, the
 * garbage collector 0.6 → 2.9–3.6 s of a 3 × 64-request CPU profile); in chunks of one size from a pool, 74, and
 * the run as fast as plain decoding (docs/BENCHMARKS.md, "kimi-k3-tiny on every prompt").
 */
export class RowBuffer {
  private readonly chunks: Float32Array[] = [];
  /** Rows held. */
  rows = 0;

  /** @param width floats per row; @param pool of arrays of {@link ROW_CHUNK} × `width` elements. */
  constructor(
    readonly width: number,
    private readonly pool: FloatPool,
  ) {
    if (pool.length !== ROW_CHUNK * width)
      throw new RangeError(`RowBuffer: pool: arrays of ${pool.length} elements, expected ${ROW_CHUNK * width}`);
  }

  /** Appends rows `[n, width]` f32 (a copy). */
  append(src: Float32Array): void {
    const w = this.width;
    const n = src.length / w;
    for (let done = 0; done < n; ) {
      const at = this.rows % ROW_CHUNK;
      if (at === 0) this.chunks.push(this.pool.take());
      const m = Math.min(ROW_CHUNK - at, n - done);
      this.chunks[this.chunks.length - 1]!.set(src.subarray(done * w, (done + m) * w), at * w);
      done += m;
      this.rows += m;
    }
  }

  /** Copies the rows into `into` from element `at`; @returns the element after them. */
  copyTo(into: Float32Array, at: number): number {
    let left = this.rows * this.width;
    let offset = at;
    for (const c of this.chunks) {
      const m = Math.min(c.length, left);
      into.set(m === c.length ? c : c.subarray(0, m), offset);
      offset += m;
      left -= m;
    }
    return offset;
  }

  /** The rows, `[rows, width]` f32: a view while they fit one chunk, else a copy. */
  rowsArray(): Float32Array {
    if (this.chunks.length === 1) return this.chunks[0]!.subarray(0, this.rows * this.width);
    const out = new Float32Array(this.rows * this.width);
    this.copyTo(out, 0);
    return out;
  }

  /** Gives the chunks back to the pool; the buffer is not used again. */
  release(): void {
    for (const c of this.chunks) this.pool.give(c);
    this.chunks.length = 0;
    this.rows = 0;
  }
}

/**
 * Committed tokens of one sequence whose draft context is not written yet: positions
 * [position, position + numTokens). `taps`: per tap id, the rows `[numTokens, hidden]` f32 in position
 * order; `projection`: the rows of `ForwardResult.projection` (taps already projected by
 * pipeline stages), in the same order.
 */
export interface PendingContext {
  readonly position: number;
  numTokens: number;
  readonly taps: Map<number, RowBuffer>;
  projection?: RowBuffer;
}

/** A sequence as the deferral sees it: its id, its tokens (the token after each row) and what it keeps. */
export interface ContextOwner {
  readonly id: SequenceId;
  /** Prompt + committed tokens, `[≥ historyLength]` i32. */
  readonly history: Int32Array;
  readonly historyLength: number;
  pending?: PendingContext;
}

/** Projects context inputs of `n` rows: Σ over the taps added into the projected rows. */
function project(drafter: Drafter, inputs: ContextRows, n: number): Float32Array {
  return drafter.projectTargetHiddenPartial(inputs.taps, n, inputs.projection);
}

/** Writes the draft context of a forward's results and defers it per sequence. Bound to one drafter. */
export class DraftContextWriter {
  /** The chunks of every sequence's deferred rows, recycled ({@link RowBuffer}). */
  private readonly pool: FloatPool;

  /** @param hiddenSize the target's hidden size (rows of taps and projection). */
  constructor(
    private readonly drafter: Drafter,
    private readonly hiddenSize: number,
  ) {
    this.pool = new FloatPool(ROW_CHUNK * hiddenSize);
  }

  /** Drops `seq`'s deferred draft context unwritten (the sequence finished or left), its memory recycled. */
  discard(seq: ContextOwner): void {
    const pending = seq.pending;
    if (pending === undefined) return;
    for (const rows of pending.taps.values()) rows.release();
    pending.projection?.release();
    seq.pending = undefined;
  }

  /**
   * Projects the taps of rows `rows[s]` (`[spans[s].numTokens]`, batch rows of `res`) and writes
   * them as draft context.
   */
  write(spans: readonly ContextSpan[], res: ForwardResult, rows: readonly Int32Array[]): void {
    let n = 0;
    for (const s of spans) n += s.numTokens;
    if (n === 0) return;
    const D = this.hiddenSize;
    // the rows in order are one run [first, first + n) (a single chain's committed prefix, or whole blocks): the
    // taps are passed as views of the forward's (projections read them, never keep or change them)
    const first = rows[0]?.[0] ?? 0;
    let run = true;
    let at = 0;
    for (let i = 0; i < spans.length && run; i++) {
      const r = rows[i]!;
      for (let j = 0; j < spans[i]!.numTokens && run; j++) run = r[j] === first + at++;
    }
    const gather = (h: Float32Array): Float32Array => {
      if (run) return h.subarray(first * D, (first + n) * D);
      const g = new Float32Array(n * D);
      let to = 0;
      for (let i = 0; i < spans.length; i++) {
        const r = rows[i]!;
        for (let j = 0; j < spans[i]!.numTokens; j++, to += D) g.set(h.subarray(r[j]! * D, (r[j]! + 1) * D), to);
      }
      return g;
    };
    const taps = new Map<number, Float32Array>();
    for (const [tap, h] of res.taps) taps.set(tap, gather(h));
    // the partial projection is the accumulator the drafter adds into: always a copy
    const projection = res.projection === undefined ? undefined : gather(res.projection);
    const inputs: ContextRows =
      projection === undefined ? { taps } : { taps, projection: run ? projection.slice() : projection };
    this.drafter.writeProjectedContextKV(project(this.drafter, inputs, n), spans);
  }

  /**
   * Keeps the taps of `n` committed rows from `row` of `res` (positions from `position`) for the
   * sequence's draft context, to write before the sequence next drafts (a sequence that never
   * drafts again never pays the projection). Written at once when the kept taps pass
   * {@link PENDING_TAP_BYTES}.
   */
  defer(seq: ContextOwner, res: ForwardResult, row: number, position: number, n: number): void {
    const D = this.hiddenSize;
    const pending: PendingContext = seq.pending ?? { position, numTokens: 0, taps: new Map() };
    seq.pending = pending;
    for (const [tap, h] of res.taps) {
      let rows = pending.taps.get(tap);
      if (rows === undefined) {
        rows = new RowBuffer(D, this.pool);
        pending.taps.set(tap, rows);
      }
      rows.append(h.subarray(row * D, (row + n) * D));
    }
    if (res.projection !== undefined) {
      pending.projection ??= new RowBuffer(D, this.pool);
      pending.projection.append(res.projection.subarray(row * D, (row + n) * D));
    }
    pending.numTokens += n;
    const inputs = res.taps.size + (res.projection === undefined ? 0 : 1);
    // Flush early only when the token after every kept row is known (not at the last prefill chunk,
    // whose last row is followed by the first generated token): the bound is then one chunk over.
    const known = seq.historyLength > pending.position + pending.numTokens;
    if (known && pending.numTokens * inputs * D * 4 > PENDING_TAP_BYTES) this.flush([seq]);
  }

  /**
   * Writes the deferred draft context of `seqs` (one projection call for all of them; a sequence
   * with nothing deferred is skipped).
   */
  flush(seqs: readonly ContextOwner[]): void {
    const owners = seqs.flatMap((s) => (s.pending === undefined ? [] : [{ s, pending: s.pending }]));
    const first = owners[0]?.pending;
    if (first === undefined) return;
    const D = this.hiddenSize;
    const n = owners.reduce((a, o) => a + o.pending.numTokens, 0);
    const taps = new Map<number, Float32Array>();
    for (const tap of first.taps.keys()) {
      // one sequence: its own rows are the inputs (the projection reads the taps, never keeps or changes them)
      if (owners.length === 1) {
        taps.set(tap, first.taps.get(tap)!.rowsArray());
        continue;
      }
      const g = new Float32Array(n * D);
      let at = 0;
      for (const o of owners) {
        const rows = o.pending.taps.get(tap);
        // every forward carries the drafter's taps (set once by captureSetter), so every owner kept each of them
        if (rows === undefined)
          throw new EngineError(`draft context: internal error: sequence ${String(o.s.id)} kept no tap ${tap}`);
        at = rows.copyTo(g, at);
      }
      taps.set(tap, g);
    }
    let projection: Float32Array | undefined;
    // (the projection is the accumulator the drafter adds into: always a fresh copy, the pending one stays intact
    // should the write throw)
    if (first.projection !== undefined) {
      projection = new Float32Array(n * D);
      let at = 0;
      // every forward of a pipeline with a distributed projection carries one
      for (const o of owners) {
        if (o.pending.projection === undefined)
          throw new EngineError(`draft context: internal error: sequence ${String(o.s.id)} kept no projection`);
        at = o.pending.projection.copyTo(projection, at);
      }
    }
    const spans = owners.map(({ s, pending: { position, numTokens } }) => {
      return { id: s.id, position, numTokens, nextTokens: s.history.slice(position + 1, position + 1 + numTokens) };
    });
    const inputs: ContextRows = projection === undefined ? { taps } : { taps, projection };
    this.drafter.writeProjectedContextKV(project(this.drafter, inputs, n), spans);
    for (const o of owners) this.discard(o.s);
  }
}
