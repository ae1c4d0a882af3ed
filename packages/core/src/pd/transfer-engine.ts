/**
 * The PD data plane: a {@link TransferEngine} moves a request's bytes from P's registered memory into D's,
 * then delivers a completion notification keyed by the request. Its shape follows NIXL's (NVIDIA Inference
 * Xfer Library: register memory → batched descriptor lists → write → notification per request), so that a
 * NIXL engine can replace the ZeroMQ/TCP one (pd/zmq-transfer.ts) behind the same interface.
 *
 * A request's life on each side:
 * - D (receiver): `registerRegions` once, then per request `expect(requestId, allowed)`: only writes inside
 *   `allowed` land; the promise resolves with P's notification once every write of the request was applied.
 * - P (sender): `registerRegions` once, then per request `write(peer, requestId, local, remote, notification)`:
 *   the pairs are coalesced ({@link coalesceDescriptors}), batched, sent, then the notification; resolves
 *   when D acknowledged that it applied everything.
 *   A request's bytes may go in several writes (`partial: true` on all but the last, one at a time: each resolves
 *   once D applied it, and the request stays open on both sides); only the last one's notification completes D's
 *   `expect` (pd/overlap.ts sends the prompt's finished pages while P is still prefilling).
 * - Either side may `abort(requestId)`; the other is told when it is known.
 */

import { PdError, type MemoryRegion, type RegionRange } from './types.js';

/** A byte range of a registered region, named for a transfer (local or remote). */
export interface TransferDescriptor {
  readonly region: string;
  /** Bytes from the region's start. */
  readonly offset: number;
  /** Bytes. */
  readonly length: number;
}

/** What one {@link TransferEngine.write} moved. */
export interface TransferStats {
  /** Payload bytes written. */
  readonly bytes: number;
  /** Descriptors sent, after coalescing contiguous runs (and splitting runs larger than a batch). */
  readonly descriptors: number;
  /** Transport messages sent for the request (data batches and the notification). */
  readonly messages: number;
}

/** Options of {@link TransferEngine.write}. */
export interface WriteOptions {
  /** How long the write may take until the peer confirmed it (ms). */
  readonly timeoutMs: number;
  /** One part of the request: more writes of it follow (see {@link TransferEngine.write}). */
  readonly partial?: boolean;
}

/** The data plane of prefill/decode disaggregation (see the module comment for the life of a request). */
export interface TransferEngine {
  /** Where peers reach this agent, e.g. `'tcp://127.0.0.1:41234'` (bound on port 0 when asked for it). */
  readonly address: string;
  /** Registers local memory; re-registering an id replaces it. */
  registerRegions(regions: readonly MemoryRegion[]): void;
  /** Forgets local regions (unknown ids are ignored); later writes into them are refused ('layout'). */
  deregisterRegions(ids: readonly string[]): void;
  /**
   * Receiver (D): accepts writes for `requestId` only inside `allowed` (ranges of registered regions); resolves
   * with the notification payload (a JSON value) once every write and the notification arrived and were
   * applied. Must be called before the sender writes (writes of a request not expected are refused).
   * Rejects {@link PdError}: `'timeout'` (nothing complete within `timeoutMs`), `'abort'` (local abort or the
   * peer's), `'layout'` (`allowed` outside a registered region, or a write outside `allowed` or outside a
   * registered region: nothing outside is written, the sender's write() rejects too, naming
   * region / offset / length), `'peer'` (the sender's data and its notification disagree: lost messages).
   */
  expect(requestId: string, allowed: readonly RegionRange[], options: { timeoutMs: number }): Promise<unknown>;
  /**
   * Sender (P): writes `local[i]` → `remote[i]` (equal lengths pairwise) to the agent at `peer`, batched, then
   * the notification (any JSON value); resolves when the peer confirmed it applied all of it.
   * With `options.partial` the write is one part of the request: the peer applies the data and confirms it, its
   * `expect` stays pending and the notification is not delivered (pass `undefined`); a later write of the same
   * request (after this one resolved) continues it, and the last one (without `partial`) completes it.
   * Rejects {@link PdError}: `'peer'` (peer unreachable or dead: within `timeoutMs`, never hangs), `'timeout'`,
   * `'abort'`, `'layout'` (a local range outside its registered region, unequal pairs, or refused by the peer).
   */
  write(
    peer: string,
    requestId: string,
    local: readonly TransferDescriptor[],
    remote: readonly TransferDescriptor[],
    notification: unknown,
    options: WriteOptions,
  ): Promise<TransferStats>;
  /** Aborts a request on this side (pending expect/write reject with 'abort'; the peer is told when known). */
  abort(requestId: string, reason: string): void;
  /** Requests with a pending expect() or write() (a gauge: `specd_pd_transfers_inflight`). */
  readonly inflight: number;
  /** Rejects every pending expect/write ('abort') and closes the sockets. Idempotent. */
  close(): Promise<void>;
}

/** One coalesced copy: `length` bytes from a local region to a remote one. */
export interface TransferRun {
  readonly local: TransferDescriptor;
  readonly remote: TransferDescriptor;
}

/** Whether `r` is a valid range of a buffer of `size` bytes (non-negative integers, end ≤ size). */
function inside(r: TransferDescriptor, size: number): boolean {
  return (
    Number.isSafeInteger(r.offset) &&
    Number.isSafeInteger(r.length) &&
    r.offset >= 0 &&
    r.length >= 0 &&
    r.offset + r.length <= size
  );
}

/** `'region 'kv/3' offset 4096 length 512'`: a range named for error messages. */
export function describeRange(r: TransferDescriptor): string {
  return `region '${r.region}' offset ${r.offset} length ${r.length}`;
}

/**
 * Coalesces descriptor pairs into runs: pair `i + 1` joins the run of pair `i` when its local range starts
 * where the run's local range ends in the same region AND its remote range does the same (so page runs that
 * are contiguous on both sides become one copy); runs longer than `maxRunBytes` are split into pieces of at
 * most `maxRunBytes`; zero-length pairs are dropped. Order is kept.
 *
 * `localSize(region)` is a local region's size in bytes (undefined: not registered).
 * Throws {@link PdError} `'layout'` naming the pair for unequal list lengths, unequal pair lengths, a local
 * range outside its registered region, or a remote range that is not non-negative integers.
 */
export function coalesceDescriptors(
  local: readonly TransferDescriptor[],
  remote: readonly TransferDescriptor[],
  maxRunBytes: number,
  localSize: (region: string) => number | undefined,
): TransferRun[] {
  if (local.length !== remote.length)
    throw new PdError('layout', `${local.length} local descriptors but ${remote.length} remote ones`);
  if (!Number.isSafeInteger(maxRunBytes) || maxRunBytes <= 0)
    throw new RangeError(`coalesceDescriptors: maxRunBytes must be a positive integer, got ${maxRunBytes}`);
  const merged: { lr: string; lo: number; rr: string; ro: number; length: number }[] = [];
  for (let i = 0; i < local.length; i++) {
    const l = local[i] as TransferDescriptor;
    const r = remote[i] as TransferDescriptor;
    const size = localSize(l.region);
    if (size === undefined) throw new PdError('layout', `local descriptor ${i}: ${describeRange(l)} is not registered`);
    if (!inside(l, size))
      throw new PdError('layout', `local descriptor ${i}: ${describeRange(l)} is outside the region's ${size} bytes`);
    if (!inside(r, Number.MAX_SAFE_INTEGER))
      throw new PdError('layout', `remote descriptor ${i}: ${describeRange(r)} is not a valid range`);
    if (l.length !== r.length)
      throw new PdError('layout', `descriptor ${i}: local length ${l.length} differs from remote length ${r.length}`);
    if (l.length === 0) continue;
    const last = merged[merged.length - 1];
    if (
      last !== undefined &&
      last.lr === l.region &&
      last.rr === r.region &&
      last.lo + last.length === l.offset &&
      last.ro + last.length === r.offset
    ) {
      last.length += l.length;
    } else {
      merged.push({ lr: l.region, lo: l.offset, rr: r.region, ro: r.offset, length: l.length });
    }
  }
  const runs: TransferRun[] = [];
  for (const m of merged) {
    for (let at = 0; at < m.length; at += maxRunBytes) {
      const length = Math.min(maxRunBytes, m.length - at);
      runs.push({
        local: { region: m.lr, offset: m.lo + at, length },
        remote: { region: m.rr, offset: m.ro + at, length },
      });
    }
  }
  return runs;
}
