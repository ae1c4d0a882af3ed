/**
 * The transfer overlapped with prefill (`pd.overlap`, default on): while a handed-off request still prefills, P
 * sends the rows each prefill chunk finished — the target KV of every attention layer and the draft context of every
 * draft layer that attends the whole context (the entries with {@link LocalEntry.rowBytes}) — as partial writes of
 * the request ({@link WriteOptions.partial}), one at a time. At the handoff the last write carries only what is left
 * (the last chunk's rows, the linear-attention state, sliding layers' windows, per-sequence draft state) and the
 * notification with every entry's checksum over all of its bytes, so D checks the rows sent early as it checks the
 * others. The transfer wait (pd/waterfall.ts) is then the tail after the forward, not the whole payload.
 *
 * Chunk by chunk, not layer by layer: one target forward runs every layer of a chunk in one native call, so a chunk's
 * rows are final together. The engine writes a streamed request's draft context after every chunk instead of at the
 * handoff (SpecRequest.onPrefillChunk: the same rows, the same bits).
 *
 * Where it applies: P without pipeline stages and at tp 1, D at tp 1 — P's entries are then D's as they are.
 * A re-split between TP sizes gathers scattered pieces into staging copies, and stage processes send their own
 * layers: those requests send everything after the handoff, as without overlap.
 */

import { entryId, type LocalEntry, type PdEntryKey, type RegionRange } from './types.js';
import { pairRanges, rangeBytes, sliceRanges } from './pairing.js';
import type { TransferEngine } from './transfer-engine.js';

/**
 * A part goes once this many bytes are ready and unsent (or at the prompt's last chunk but one, whatever is ready):
 * each part costs P about a millisecond of CPU (its messages, D's acknowledgement), measured with kimi-k3-tiny's
 * 64-row chunks of ~80 KiB; at 1 Gbit/s 256 KiB is 2 ms of link.
 */
export const MIN_PART_BYTES = 256 << 10;

/** An entry D expects and where it goes (its layout entry). */
export interface WantedEntry {
  readonly key: PdEntryKey;
  readonly ranges: readonly RegionRange[];
}

/** Sends a prefilling request's finished rows as partial writes (module comment); one per request on P. */
export class OverlapSender {
  /** Entry id (types.ts `entryId`) → bytes of it sent from its start (what the last write skips). */
  private readonly sent = new Map<string, number>();
  /** Bytes sent while the prompt prefilled. */
  bytes = 0;
  /** Partial writes that landed. */
  writes = 0;
  private rows = 0;
  /** The prompt's last chunk is next: send whatever is ready. */
  private lastNext = false;
  private target: { readonly agent: string; readonly wanted: readonly WantedEntry[] } | undefined;
  private inflight: Promise<void> | undefined;
  private failed: Error | undefined;
  private closed = false;

  /**
   * @param requestId the request's transfer id (its room).
   * @param entries the request's entries on this side as they stand (pd/ranks.ts `RankedState.entries`).
   * @param timeoutMs how long one partial write may take (ms).
   * @param minPartBytes the least a part carries before the prompt's last chunk (bytes).
   */
  constructor(
    private readonly transfer: TransferEngine,
    private readonly requestId: string,
    private readonly entries: () => readonly LocalEntry[],
    private readonly timeoutMs: number,
    private readonly minPartBytes = MIN_PART_BYTES,
  ) {}

  /**
   * Prompt rows [0, rows) are done: their target KV final, their draft context written; `lastNext`: the next chunk is
   * the prompt's last (the rows ready go whatever their size).
   */
  progress(rows: number, lastNext = false): void {
    this.rows = Math.max(this.rows, rows);
    this.lastNext ||= lastNext;
    this.pump();
  }

  /** D's layout arrived (checked to be this request's): `agent` its transfer address, `wanted` its entries. */
  start(agent: string, wanted: readonly WantedEntry[]): void {
    this.target = { agent, wanted };
    this.pump();
  }

  /**
   * Stops sending parts and waits for the one in flight. @returns entry id → bytes sent from the entry's start
   * (planSend's `sentBefore`). @throws the error a part failed with (the request fails with it).
   */
  async finish(): Promise<ReadonlyMap<string, number>> {
    this.closed = true;
    await this.inflight;
    if (this.failed !== undefined) throw this.failed;
    return this.sent;
  }

  /** Stops sending parts (the request ended); a part in flight is the transfer engine's to abort. */
  close(): void {
    this.closed = true;
  }

  /** Starts the next partial write when none is in flight and rows are ready that were not sent. */
  private pump(): void {
    const target = this.target;
    if (this.closed || this.failed !== undefined || this.inflight !== undefined || target === undefined) return;
    if (this.rows === 0) return; // not admitted yet: the sequence has no entries
    let plan: ReturnType<OverlapSender['plan']>;
    try {
      plan = this.plan(target.wanted);
    } catch {
      // an entry of another length (or the sequence gone): no more parts; the last write sends the rest or fails
      // naming the entry
      this.closed = true;
      return;
    }
    if (plan === undefined || (plan.bytes < this.minPartBytes && !this.lastNext)) return;
    this.inflight = this.transfer
      .write(target.agent, this.requestId, plan.local, plan.remote, undefined, {
        timeoutMs: this.timeoutMs,
        partial: true,
      })
      .then(
        (stats) => {
          for (const [id, upTo] of plan.upTo) this.sent.set(id, upTo);
          this.bytes += stats.bytes;
          this.writes++;
        },
        (err: unknown) => {
          this.failed = err as Error;
        },
      )
      .finally(() => {
        this.inflight = undefined;
        this.pump();
      });
  }

  /** The descriptors of the rows ready and not sent, entry by entry in D's order; undefined when there are none. */
  private plan(
    wanted: readonly WantedEntry[],
  ): { local: RegionRange[]; remote: RegionRange[]; upTo: Map<string, number>; bytes: number } | undefined {
    const mine = new Map(this.entries().map((e) => [entryId(e.key), e]));
    const local: RegionRange[] = [];
    const remote: RegionRange[] = [];
    const upTo = new Map<string, number>();
    let bytes = 0;
    for (const want of wanted) {
      const id = entryId(want.key);
      const own = mine.get(id);
      if (own?.rowBytes === undefined) continue;
      const ready = Math.min(rangeBytes(want.ranges), this.rows * own.rowBytes, rangeBytes(own.ranges));
      const from = this.sent.get(id) ?? 0;
      if (ready <= from) continue;
      const pairs = pairRanges(want.key, sliceRanges(own.ranges, from, ready), sliceRanges(want.ranges, from, ready));
      local.push(...pairs.local);
      remote.push(...pairs.remote);
      upTo.set(id, ready);
      bytes += ready - from;
    }
    return local.length === 0 ? undefined : { local, remote, upTo, bytes };
  }
}
