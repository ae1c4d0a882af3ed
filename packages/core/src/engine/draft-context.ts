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
 * Committed tokens of one sequence whose draft context is not written yet: positions
 * [position, position + numTokens). `taps`: per tap id, row blocks `[n_i, hidden]` f32 in position
 * order; `projection`: the row blocks of `ForwardResult.projection` (taps already projected by
 * pipeline stages), in the same order.
 */
export interface PendingContext {
  readonly position: number;
  numTokens: number;
  readonly taps: Map<number, Float32Array[]>;
  projection?: Float32Array[];
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

/** Copies row blocks (`[n_i, hidden]` f32 each) into `into` from element `at`; @returns the element after them. */
function concat(blocks: readonly Float32Array[], into: Float32Array, at: number): number {
  let offset = at;
  for (const block of blocks) {
    into.set(block, offset);
    offset += block.length;
  }
  return offset;
}

/** Writes the draft context of a forward's results and defers it per sequence. Bound to one drafter. */
export class DraftContextWriter {
  /** @param hiddenSize the target's hidden size (rows of taps and projection). */
  constructor(
    private readonly drafter: Drafter,
    private readonly hiddenSize: number,
  ) {}

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
      let list = pending.taps.get(tap);
      if (list === undefined) {
        list = [];
        pending.taps.set(tap, list);
      }
      list.push(h.slice(row * D, (row + n) * D));
    }
    if (res.projection !== undefined) {
      pending.projection ??= [];
      pending.projection.push(res.projection.slice(row * D, (row + n) * D));
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
    // one sequence that kept one block per input (a prompt of one chunk): its own copies are the inputs
    const one = owners.length === 1 && [...first.taps.values()].every((l) => l.length === 1);
    for (const tap of first.taps.keys()) {
      if (one) {
        taps.set(tap, first.taps.get(tap)![0]!);
        continue;
      }
      const g = new Float32Array(n * D);
      let at = 0;
      for (const o of owners) {
        const list = o.pending.taps.get(tap);
        // every forward carries the drafter's taps (set once by captureSetter), so every owner kept each of them
        if (list === undefined)
          throw new EngineError(`draft context: internal error: sequence ${String(o.s.id)} kept no tap ${tap}`);
        at = concat(list, g, at);
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
        at = concat(o.pending.projection, projection, at);
      }
    }
    const spans = owners.map(({ s, pending: { position, numTokens } }) => {
      return { id: s.id, position, numTokens, nextTokens: s.history.slice(position + 1, position + 1 + numTokens) };
    });
    const inputs: ContextRows = projection === undefined ? { taps } : { taps, projection };
    this.drafter.writeProjectedContextKV(project(this.drafter, inputs, n), spans);
    for (const o of owners) o.s.pending = undefined;
  }
}
