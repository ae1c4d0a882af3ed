/**
 * What the {@link TransferEngine}s (ZeroMQ/TCP: zmq-transfer.ts; NIXL/UCX: nixl-transfer.ts) share beyond the
 * interface: the checks of their arguments, the range a receiver accepts a write into, the errors of a pending
 * request that times out or of an engine that closed, the ids of ended requests a receiver remembers, and the exit
 * hook that closes what is still open. Each engine keeps its own transport, links and pending-request state.
 */

import {
  coalesceDescriptors,
  describeRange,
  type TransferDescriptor,
  type TransferRun,
  type TransferStats,
} from './transfer-engine.js';
import { PdError, type RegionRange } from './types.js';

/** Fault points for tests only (both engines take them). */
export interface TransferTestHooks {
  /**
   * Sender: after this many descriptors (after coalescing) of a request were sent, call `onPause(requestId)` and
   * send nothing more for that request (it stays pending until abort / timeout / close).
   */
  readonly pauseAfterDescriptors?: number;
  readonly onPause?: (requestId: string) => void;
  /** Receiver: called after each part of a request was applied, with the request's running totals. */
  readonly onApplied?: (requestId: string, applied: { descriptors: number; bytes: number }) => void;
}

/** A RangeError naming `creator` for a `testHooks.pauseAfterDescriptors` that is not an integer ≥ 0, else nothing. */
export function checkTestHooks(creator: string, hooks: TransferTestHooks | undefined): void {
  const pause = hooks?.pauseAfterDescriptors;
  if (pause !== undefined && (!Number.isSafeInteger(pause) || pause < 0))
    throw new RangeError(`${creator}: testHooks.pauseAfterDescriptors must be ≥ 0, got ${pause}`);
}

/** A RangeError for a `timeoutMs` that is not a positive finite number of ms, else undefined. */
export function checkTimeout(method: string, timeoutMs: number): RangeError | undefined {
  if (Number.isFinite(timeoutMs) && timeoutMs > 0) return undefined;
  return new RangeError(`${method}: options.timeoutMs must be a positive number of ms, got ${timeoutMs}`);
}

/**
 * What a call of `method` ('expect' or 'write') at the engine at `address` rejects with before it starts: the
 * engine is `closed` ({@link closedError}), or `timeoutMs` is not a positive number of ms ({@link checkTimeout});
 * undefined when the call may go on.
 */
export function checkCall(
  method: 'expect' | 'write',
  address: string,
  closed: boolean,
  requestId: string,
  timeoutMs: number,
): Error | undefined {
  return closed ? closedError(requestId, address) : checkTimeout(method, timeoutMs);
}

/** The Error of an expect / write of a request that already has one pending at the engine at `address`. */
export function alreadyPending(method: 'expect' | 'write', requestId: string, address: string): Error {
  return new Error(
    method === 'expect'
      ? `expect: request ${requestId} is already expected at ${address}`
      : `write: request ${requestId} already has a pending write from ${address}`,
  );
}

/** The 'abort' error of a request pending (or started) at an engine that is closed. */
export function closedError(requestId: string, address: string): PdError {
  return new PdError('abort', `request ${requestId}: the transfer engine at ${address} is closed`);
}

/** The 'abort' error of a request aborted locally (by `abort(requestId, reason)` at the engine at `address`). */
export function abortedError(requestId: string, address: string, reason: string): PdError {
  return new PdError('abort', `request ${requestId} aborted at ${address}: ${reason}`);
}

/**
 * Checks an expect's `allowed` ranges against the registered regions (`size(region)`: bytes, undefined when not
 * registered): a 'layout' PdError naming the first range that is not non-negative integers inside its region, else
 * undefined.
 */
export function checkAllowed(
  requestId: string,
  allowed: readonly RegionRange[],
  size: (region: string) => number | undefined,
): PdError | undefined {
  for (const r of allowed) {
    const bytes = size(r.region);
    const ok =
      bytes !== undefined &&
      Number.isSafeInteger(r.offset) &&
      Number.isSafeInteger(r.length) &&
      r.offset >= 0 &&
      r.length >= 0 &&
      r.offset + r.length <= bytes;
    if (!ok) {
      const why = bytes === undefined ? 'not a registered region' : `outside the region's ${bytes} bytes`;
      return new PdError('layout', `expect ${requestId}: allowed ${describeRange(r)}: ${why}`);
    }
  }
  return undefined;
}

/**
 * Why a receiver refuses a write of `[offset, offset + length)` of `region` (`size`: the region's bytes, undefined
 * when not registered), the range already known to be non-negative integers: not registered, outside the region, or
 * outside the request's `allowed` ranges; undefined when it may land.
 */
export function refusal(
  region: string,
  offset: number,
  length: number,
  size: number | undefined,
  allowed: AllowedRanges,
): string | undefined {
  if (size === undefined) return 'not a registered region';
  if (offset + length > size) return `outside the region's ${size} bytes`;
  if (!allowed.covers(region, offset, offset + length)) return 'outside the ranges allowed';
  return undefined;
}

/** The message of a write refused at the receiver `address` (`why` from {@link refusal} or the engine's checks). */
export function refusedMessage(
  requestId: string,
  range: readonly [unknown, unknown, unknown],
  address: string,
  why: string,
): string {
  const [region, offset, length] = range;
  return (
    `request ${requestId}: write to region '${region}' offset ${offset} length ${length} refused at ${address}: ` + why
  );
}

/**
 * The sender's first step: the descriptor pairs coalesced into runs of at most `maxRunBytes`
 * ({@link coalesceDescriptors}, `size(region)`: a local region's bytes) and the notification as JSON.
 * @throws PdError ('layout') naming the request and the pair; the notification's JSON.stringify error.
 */
export function prepareWrite(
  requestId: string,
  local: readonly TransferDescriptor[],
  remote: readonly TransferDescriptor[],
  notification: unknown,
  maxRunBytes: number,
  size: (region: string) => number | undefined,
): { runs: TransferRun[]; notifyPayload: string | undefined } {
  try {
    return {
      runs: coalesceDescriptors(local, remote, maxRunBytes, size),
      notifyPayload: JSON.stringify(notification),
    };
  } catch (err) {
    if (err instanceof PdError) throw new PdError(err.code, `write ${requestId}: ${err.message}`);
    throw err;
  }
}

/**
 * The error of an expect that nothing completed within `timeoutMs` at the receiver `address`: 'timeout', saying
 * what was applied (`applied`: undefined when no sender was seen).
 */
export function expectTimeoutError(
  requestId: string,
  address: string,
  timeoutMs: number,
  applied: { descriptors: number; bytes: number } | undefined,
): PdError {
  const from =
    applied === undefined ? 'no sender seen' : `${applied.descriptors} descriptors, ${applied.bytes} bytes applied`;
  return new PdError(
    'timeout',
    `request ${requestId}: transfer to ${address} not complete within ${timeoutMs} ms (${from})`,
  );
}

/**
 * The error of a write that `peer` did not confirm within `timeoutMs`: 'timeout' when the connection existed (`sent`
 * of `total` descriptors sent), 'peer' (unreachable) when it never formed.
 */
export function writeTimeoutError(
  requestId: string,
  peer: string,
  timeoutMs: number,
  connected: boolean,
  sent: number,
  total: number,
): PdError {
  return connected
    ? new PdError(
        'timeout',
        `request ${requestId}: peer ${peer} did not confirm the transfer within ${timeoutMs} ms ` +
          `(${sent} of ${total} descriptors sent; the peer may be dead)`,
      )
    : new PdError('peer', `request ${requestId}: peer ${peer} unreachable (no connection within ${timeoutMs} ms)`);
}

/** A write's running {@link TransferStats} (counted as it sends). */
export type WriteStats = { bytes: number; descriptors: number; messages: number };

/** What every pending expect or write holds: its id, its deadline and its promise's settle functions. */
export interface Pending<T> {
  readonly requestId: string;
  readonly timer: NodeJS.Timeout;
  readonly resolve: (value: T) => void;
  readonly reject: (e: PdError) => void;
}

/**
 * Opens a pending request: `make(base)` builds the engine's record of it from `base` (the id, a timer of
 * `timeoutMs` and the promise's settle functions), which is stored in `pending` under `requestId`. When the timer
 * fires while that record is still the one pending, it is handed to `onTimeout` (which must end it; ending a
 * record clears its timer). Returns the record and the promise the engine returns.
 */
export function openPending<T, P extends Pending<T>>(
  pending: Map<string, P>,
  requestId: string,
  timeoutMs: number,
  make: (base: Pending<T>) => P,
  onTimeout: (record: P) => void,
): { record: P; done: Promise<T> } {
  let record: P | undefined;
  const done = new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => {
      if (record !== undefined && pending.get(requestId) === record) onTimeout(record);
    }, timeoutMs);
    record = make({ requestId, timer, resolve, reject });
    pending.set(requestId, record);
  });
  return { record: record as P, done };
}

/** A sender's connection to one peer, as a pending write sees it. */
export interface WriteLink {
  /** Whether the connection formed (a timeout then means 'timeout', not 'peer' unreachable). */
  readonly connected: boolean;
  /** Requests with a pending write on this link. */
  readonly requests: Set<string>;
}

/** What every pending write holds: {@link Pending}, its link, its running stats, whether it settled. */
export interface PendingWrite<L extends WriteLink> extends Pending<TransferStats> {
  readonly link: L;
  readonly stats: WriteStats;
  settled: boolean;
}

/**
 * Opens a pending write of `runs` coalesced runs to `peer` over `link` ({@link openPending}; zeroed stats; the
 * request joins `link.requests`). When `timeoutMs` passes first, `fail(w, err, 'timed out at the sender')` gets
 * {@link writeTimeoutError}.
 */
export function openPendingWrite<L extends WriteLink, W extends PendingWrite<L>>(
  writes: Map<string, W>,
  requestId: string,
  peer: string,
  link: L,
  runs: number,
  timeoutMs: number,
  make: (base: PendingWrite<L>) => W,
  fail: (w: W, err: PdError, tell: string) => void,
): { record: W; done: Promise<TransferStats> } {
  const opened = openPending<TransferStats, W>(
    writes,
    requestId,
    timeoutMs,
    (base) => make({ ...base, link, stats: { bytes: 0, descriptors: 0, messages: 0 }, settled: false }),
    (w) =>
      fail(
        w,
        writeTimeoutError(requestId, peer, timeoutMs, link.connected, w.stats.descriptors, runs),
        'timed out at the sender',
      ),
  );
  link.requests.add(requestId);
  return opened;
}

/** How many finished / aborted request ids a receiver remembers (to answer their late messages). */
const TOMBSTONES = 4096;

/**
 * A receiver's memory of the requests that ended (finished, refused, aborted, timed out): id → why, the
 * {@link TOMBSTONES} latest, so that a late write of one is answered 'abort' with the reason, never written.
 */
export class Tombstones {
  private readonly why = new Map<string, string>();

  /** Records that `requestId` ended, and why (forgets the oldest beyond {@link TOMBSTONES}). */
  set(requestId: string, why: string): void {
    this.why.set(requestId, why);
    if (this.why.size > TOMBSTONES) this.why.delete(this.why.keys().next().value as string);
  }

  /** Forgets `requestId` (it is expected again). */
  delete(requestId: string): void {
    this.why.delete(requestId);
  }

  /** The message answering a write of `requestId`, which the receiver at `address` does not expect. */
  notExpected(requestId: string, address: string): string {
    return `request ${requestId} at ${address}: ${this.why.get(requestId) ?? 'not expected (unknown request)'}`;
  }
}

/**
 * The ranges a receiver accepts writes into for one request: per region, sorted and merged half-open
 * `[start, end)` byte intervals (adjacent ranges merge, so one coalesced write may span several of them).
 */
export class AllowedRanges {
  private readonly byRegion = new Map<string, [number, number][]>();

  constructor(ranges: readonly RegionRange[]) {
    for (const r of ranges) {
      if (r.length === 0) continue;
      const list = this.byRegion.get(r.region) ?? [];
      list.push([r.offset, r.offset + r.length]);
      this.byRegion.set(r.region, list);
    }
    for (const [region, list] of this.byRegion) {
      list.sort((a, b) => a[0] - b[0]);
      const merged: [number, number][] = [];
      for (const iv of list) {
        const last = merged[merged.length - 1];
        if (last !== undefined && iv[0] <= last[1]) last[1] = Math.max(last[1], iv[1]);
        else merged.push([iv[0], iv[1]]);
      }
      this.byRegion.set(region, merged);
    }
  }

  /** Whether bytes `[start, end)` of `region` lie inside the allowed ranges (binary search). */
  covers(region: string, start: number, end: number): boolean {
    const intervals = this.byRegion.get(region);
    if (intervals === undefined) return false;
    let lo = 0;
    let hi = intervals.length - 1;
    let found: [number, number] | undefined;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const iv = intervals[mid] as [number, number];
      if (iv[0] <= start) {
        found = iv;
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    return found !== undefined && found[1] >= end;
  }
}

/** Requests pending on an engine: its pending expects, plus its pending writes of requests it does not also expect. */
export function countInflight(expects: { has(id: string): boolean; readonly size: number }, writes: Iterable<string>) {
  let n = expects.size;
  for (const id of writes) if (!expects.has(id)) n++;
  return n;
}

/** Synchronous closers of the engines still open, run at process exit (sockets, NIXL's progress thread). */
const atExit = new Set<() => void>();
let exitHandlerInstalled = false;

/** Runs `closeSync` at process exit unless the returned function (call it on close) was called first. */
export function closeAtExit(closeSync: () => void): () => void {
  if (!exitHandlerInstalled) {
    exitHandlerInstalled = true;
    process.on('exit', () => {
      for (const close of [...atExit]) close();
    });
  }
  atExit.add(closeSync);
  return () => atExit.delete(closeSync);
}
