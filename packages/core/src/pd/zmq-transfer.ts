/**
 * The ZeroMQ/TCP {@link TransferEngine}: the PD data plane until a NIXL engine lands.
 *
 * Sockets: each engine binds one ROUTER (its `address`) that receives writes and answers them, and opens one
 * DEALER per peer it writes to (connected to the peer's ROUTER, `immediate`: nothing is queued before the
 * connection exists). Everything runs on the caller's event loop (zeromq's promises); sends on a socket are
 * serialised (zeromq allows one pending send per socket).
 *
 * Messages (frame 0 is a JSON header; ROUTER prepends / takes the sender's identity):
 * - P → D `data`: `{t: 'data', req, seq, d: [[region, offset, length], …]}` + one frame per descriptor. The
 *   frames are `Buffer` views of P's registered memory (zeromq sends frames over 128 bytes without copying);
 *   D checks every descriptor of the message against the request's `allowed` ranges and its regions before
 *   it writes any, then copies each frame into its region at the offset.
 * - P → D `notify`: `{t: 'notify', req, batches, descriptors, bytes, payload}` after the last batch; D checks
 *   the counts against what it applied (a lost message fails the request), resolves `expect` with `payload`.
 * - D → P `done`: `{t: 'done', req, ok}` or `{…, ok: false, code, message}` (a refused write: 'layout'; a request
 *   D does not expect or aborted: 'abort'; a count mismatch: 'peer'). D answers every message of a request it
 *   does not (or no longer) expect, so a sender fails fast.
 * - either way `abort`: `{t: 'abort', req, reason}`; the receiver of it rejects its pending promise ('abort').
 *
 * Batching: the descriptor pairs are coalesced ({@link coalesceDescriptors}, runs capped at `maxBatchBytes`)
 * and grouped into messages of at most `maxBatchBytes` payload bytes and {@link MAX_DESCRIPTORS_PER_MESSAGE}
 * descriptors. Messages of one request travel on one connection, in order (`seq` catches a gap).
 *
 * Dead peers: ZeroMQ hides connection loss (it reconnects), so every pending promise has a deadline
 * (`timeoutMs`): a write whose peer never connected rejects 'peer' (unreachable), one whose peer went silent
 * 'timeout', naming the peer; an expect whose sender went silent 'timeout'. A DEALER whose write failed that
 * way is retired (the next write to that peer connects anew) and closed once no write uses it (what it still
 * queues is dropped). Late or out-of-order messages
 * of a finished, aborted or unknown request are never written.
 */

import type * as Zmq from 'zeromq';

import {
  coalesceDescriptors,
  describeRange,
  type TransferDescriptor,
  type TransferEngine,
  type TransferRun,
  type TransferStats,
} from './transfer-engine.js';
import { PdError, type MemoryRegion, type RegionRange } from './types.js';
import { AllowedRanges, decodeHeader, encodeHeader, SendQueue, type Header } from './zmq-transfer-protocol.js';

/** The default batch size (bytes of payload per message). */
export const DEFAULT_MAX_BATCH_BYTES = 4 << 20;
/** At most this many descriptors per message (bounds the header). */
export const MAX_DESCRIPTORS_PER_MESSAGE = 1024;
/** How many finished / aborted request ids a receiver remembers (to answer their late messages). */
const TOMBSTONES = 4096;
/** How long a failed write's abort notice may wait to be handed to ZeroMQ before its unused link closes (ms). */
const NOTICE_WAIT_MS = 1000;
/** How long a closed DEALER may still deliver what it queued (ms). */
const LINGER_MS = 200;

export interface ZmqTransferEngineOptions {
  /** The interface to bind and advertise (default `'127.0.0.1'`). */
  readonly host?: string;
  /** The TCP port (default 0: the system picks one; `address` reports it). */
  readonly port?: number;
  /** Payload bytes per message at most (default {@link DEFAULT_MAX_BATCH_BYTES}); also caps a coalesced run. */
  readonly maxBatchBytes?: number;
  /** Fault points for tests only. */
  readonly testHooks?: ZmqTransferTestHooks;
}

export interface ZmqTransferTestHooks {
  /**
   * Sender: after this many descriptors (after coalescing) of a request were handed to ZeroMQ, call
   * `onPause(requestId)` and send nothing more for that request (it stays pending until abort / timeout /
   * close).
   */
  readonly pauseAfterDescriptors?: number;
  readonly onPause?: (requestId: string) => void;
  /** Receiver: called after each data message of a request was applied, with the request's running totals. */
  readonly onApplied?: (requestId: string, applied: { descriptors: number; bytes: number }) => void;
}

/** A connection to one peer's ROUTER (a DEALER) and the writes that use it. */
interface PeerLink {
  readonly peer: string;
  readonly sock: Zmq.Dealer;
  readonly queue: SendQueue;
  /** Set once a send went through (`immediate`: the connection existed) or the peer answered. */
  connected: boolean;
  /** Requests with a pending write on this link. */
  readonly requests: Set<string>;
  /** Set when the peer never connected or went silent: later writes open a new link, this one closes when done. */
  retired: boolean;
  /** Abort notices not yet handed to ZeroMQ (bounded wait). */
  notices: number;
}

interface PendingWrite {
  readonly requestId: string;
  readonly link: PeerLink;
  readonly timer: NodeJS.Timeout;
  readonly stats: { bytes: number; descriptors: number; messages: number };
  readonly total: { bytes: number; descriptors: number };
  readonly resolve: (s: TransferStats) => void;
  readonly reject: (e: PdError) => void;
  settled: boolean;
}

interface PendingExpect {
  readonly requestId: string;
  readonly allowed: AllowedRanges;
  readonly timer: NodeJS.Timeout;
  readonly resolve: (payload: unknown) => void;
  readonly reject: (e: PdError) => void;
  /** The identities (ROUTER routing ids) of the senders seen, by hex. */
  readonly senders: Map<string, Buffer>;
  /** Data messages applied. */
  batches: number;
  descriptors: number;
  bytes: number;
}

/** A RangeError for a `timeoutMs` that is not a positive finite number of ms, else undefined. */
function checkTimeout(method: string, timeoutMs: number): RangeError | undefined {
  if (Number.isFinite(timeoutMs) && timeoutMs > 0) return undefined;
  return new RangeError(`${method}: options.timeoutMs must be a positive number of ms, got ${timeoutMs}`);
}

/** Engines still open, closed at process exit (a zeromq socket left open then can abort the process). */
const openEngines = new Set<ZmqTransferEngine>();
let exitHandlerInstalled = false;

class ZmqTransferEngine implements TransferEngine {
  readonly address: string;
  private readonly regions = new Map<string, Uint8Array>();
  /** The current link per peer address. */
  private readonly links = new Map<string, PeerLink>();
  /** Every open link (the current ones and retired ones still draining). */
  private readonly allLinks = new Set<PeerLink>();
  private readonly writes = new Map<string, PendingWrite>();
  private readonly expects = new Map<string, PendingExpect>();
  /** Finished or aborted receiving requests → why (answers their late messages); insertion-ordered, bounded. */
  private readonly tombstones = new Map<string, string>();
  private readonly routerQueue: SendQueue;
  private closed = false;

  constructor(
    private readonly zmq: typeof Zmq,
    private readonly router: Zmq.Router,
    address: string,
    private readonly maxBatchBytes: number,
    private readonly hooks: ZmqTransferTestHooks,
  ) {
    this.address = address;
    this.routerQueue = new SendQueue(router);
    void this.receiveLoop();
  }

  get inflight(): number {
    let n = this.expects.size;
    for (const id of this.writes.keys()) if (!this.expects.has(id)) n++;
    return n;
  }

  registerRegions(regions: readonly MemoryRegion[]): void {
    if (this.closed) throw new Error(`registerRegions: the transfer engine at ${this.address} is closed`);
    for (const r of regions) this.regions.set(r.id, r.bytes);
  }

  deregisterRegions(ids: readonly string[]): void {
    for (const id of ids) this.regions.delete(id);
  }

  // ---- receiver ----

  expect(requestId: string, allowed: readonly RegionRange[], options: { timeoutMs: number }): Promise<unknown> {
    if (this.closed) return Promise.reject(this.closedError(requestId));
    const badTimeout = checkTimeout('expect', options.timeoutMs);
    if (badTimeout !== undefined) return Promise.reject(badTimeout);
    if (this.expects.has(requestId))
      return Promise.reject(new Error(`expect: request ${requestId} is already expected at ${this.address}`));
    for (const r of allowed) {
      const bytes = this.regions.get(r.region);
      const ok =
        bytes !== undefined &&
        Number.isSafeInteger(r.offset) &&
        Number.isSafeInteger(r.length) &&
        r.offset >= 0 &&
        r.length >= 0 &&
        r.offset + r.length <= bytes.byteLength;
      if (!ok) {
        const why = bytes === undefined ? 'not a registered region' : `outside the region's ${bytes.byteLength} bytes`;
        return Promise.reject(new PdError('layout', `expect ${requestId}: allowed ${describeRange(r)}: ${why}`));
      }
    }
    this.tombstones.delete(requestId);
    return new Promise<unknown>((resolve, reject) => {
      const timer = setTimeout(() => {
        const e = this.expects.get(requestId);
        if (e === undefined) return;
        const from = e.senders.size === 0 ? 'no sender seen' : `${e.descriptors} descriptors, ${e.bytes} bytes applied`;
        this.failExpect(
          e,
          new PdError(
            'timeout',
            `request ${requestId}: transfer to ${this.address} not complete within ` +
              `${options.timeoutMs} ms (${from})`,
          ),
          `timed out at the receiver ${this.address}`,
        );
      }, options.timeoutMs);
      this.expects.set(requestId, {
        requestId,
        allowed: new AllowedRanges(allowed),
        timer,
        resolve,
        reject,
        senders: new Map(),
        batches: 0,
        descriptors: 0,
        bytes: 0,
      });
    });
  }

  private async receiveLoop(): Promise<void> {
    for (;;) {
      let parts: Buffer[];
      try {
        parts = await this.router.receive();
      } catch {
        return; // closed
      }
      const identity = parts[0];
      const header = decodeHeader(parts[1]);
      if (identity === undefined || header === undefined) continue;
      try {
        this.onInbound(identity, header, parts.slice(2));
      } catch {
        // a malformed message (not from a specd engine): dropped
      }
    }
  }

  private reply(identity: Buffer, h: Header): void {
    this.routerQueue.send([identity, encodeHeader(h)]).catch(() => {
      // the sender is gone or we closed: nothing to tell
    });
  }

  private onInbound(identity: Buffer, h: Header, frames: Buffer[]): void {
    if (h.t === 'abort') {
      const e = this.expects.get(h.req);
      if (e !== undefined) {
        e.senders.delete(identity.toString('hex'));
        this.failExpect(e, new PdError('abort', `request ${h.req} aborted by the sender: ${h.reason}`), undefined);
      }
      return;
    }
    if (h.t !== 'data' && h.t !== 'notify') return;
    const e = this.expects.get(h.req);
    if (e === undefined) {
      const why = this.tombstones.get(h.req) ?? 'not expected (unknown request)';
      this.reply(identity, {
        t: 'done',
        req: h.req,
        ok: false,
        code: 'abort',
        message: `request ${h.req} at ${this.address}: ${why}`,
      });
      return;
    }
    e.senders.set(identity.toString('hex'), identity);
    if (h.t === 'data') this.applyData(identity, e, h, frames);
    else this.applyNotify(identity, e, h);
  }

  private applyData(identity: Buffer, e: PendingExpect, h: Extract<Header, { t: 'data' }>, frames: Buffer[]): void {
    if (h.seq !== e.batches) {
      this.refuse(identity, e, 'peer', `request ${e.requestId}: data message ${h.seq} arrived, expected ${e.batches}`);
      return;
    }
    if (!Array.isArray(h.d) || h.d.length !== frames.length) {
      this.refuse(identity, e, 'peer', `request ${e.requestId}: malformed data message ${h.seq}`);
      return;
    }
    // check every descriptor before writing any
    for (const [i, d] of h.d.entries()) {
      const [region, offset, length] = d;
      const frame = frames[i] as Buffer;
      const bytes = this.regions.get(region);
      const range = `region '${region}' offset ${offset} length ${length}`;
      let why: string | undefined;
      if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0)
        why = 'not a valid range';
      else if (frame.byteLength !== length) why = `its frame has ${frame.byteLength} bytes`;
      else if (bytes === undefined) why = 'not a registered region';
      else if (offset + length > bytes.byteLength) why = `outside the region's ${bytes.byteLength} bytes`;
      else if (!e.allowed.covers(region, offset, offset + length)) why = 'outside the ranges allowed';
      if (why !== undefined) {
        this.refuse(
          identity,
          e,
          'layout',
          `request ${e.requestId}: write to ${range} refused at ${this.address}: ${why}`,
        );
        return;
      }
    }
    for (const [i, d] of h.d.entries()) {
      (this.regions.get(d[0]) as Uint8Array).set(frames[i] as Buffer, d[1]);
      e.descriptors++;
      e.bytes += d[2];
    }
    e.batches++;
    this.hooks.onApplied?.(e.requestId, { descriptors: e.descriptors, bytes: e.bytes });
  }

  private applyNotify(identity: Buffer, e: PendingExpect, h: Extract<Header, { t: 'notify' }>): void {
    if (h.batches !== e.batches || h.descriptors !== e.descriptors || h.bytes !== e.bytes) {
      this.refuse(
        identity,
        e,
        'peer',
        `request ${e.requestId}: the sender sent ${h.batches} data messages / ${h.descriptors} descriptors / ` +
          `${h.bytes} bytes, ${this.address} applied ${e.batches} / ${e.descriptors} / ${e.bytes}`,
      );
      return;
    }
    this.endExpect(e, 'already complete');
    this.reply(identity, { t: 'done', req: e.requestId, ok: true });
    e.resolve(h.payload);
  }

  /** Fails the request on both sides: the expect rejects with `code`, the sender is answered with the same. */
  private refuse(identity: Buffer, e: PendingExpect, code: 'layout' | 'peer', message: string): void {
    this.endExpect(e, `refused: ${message}`);
    this.reply(identity, { t: 'done', req: e.requestId, ok: false, code, message });
    e.reject(new PdError(code, message));
  }

  /** Rejects a pending expect; `tell` (when given) is sent to its known senders as an abort reason. */
  private failExpect(e: PendingExpect, err: PdError, tell: string | undefined): void {
    this.endExpect(e, err.message);
    if (tell !== undefined)
      for (const id of e.senders.values()) this.reply(id, { t: 'abort', req: e.requestId, reason: tell });
    e.reject(err);
  }

  private endExpect(e: PendingExpect, why: string): void {
    clearTimeout(e.timer);
    this.expects.delete(e.requestId);
    this.tombstones.set(e.requestId, why);
    if (this.tombstones.size > TOMBSTONES) {
      const oldest = this.tombstones.keys().next().value as string;
      this.tombstones.delete(oldest);
    }
  }

  // ---- sender ----

  write(
    peer: string,
    requestId: string,
    local: readonly TransferDescriptor[],
    remote: readonly TransferDescriptor[],
    notification: unknown,
    options: { timeoutMs: number },
  ): Promise<TransferStats> {
    if (this.closed) return Promise.reject(this.closedError(requestId));
    const badTimeout = checkTimeout('write', options.timeoutMs);
    if (badTimeout !== undefined) return Promise.reject(badTimeout);
    if (this.writes.has(requestId))
      return Promise.reject(new Error(`write: request ${requestId} already has a pending write from ${this.address}`));
    let runs: TransferRun[];
    let notifyPayload: string | undefined;
    try {
      runs = coalesceDescriptors(local, remote, this.maxBatchBytes, (id) => this.regions.get(id)?.byteLength);
      notifyPayload = JSON.stringify(notification);
    } catch (err) {
      if (err instanceof PdError) return Promise.reject(new PdError(err.code, `write ${requestId}: ${err.message}`));
      return Promise.reject(err);
    }
    let link: PeerLink;
    try {
      link = this.link(peer);
    } catch (err) {
      return Promise.reject(
        new PdError('peer', `write ${requestId}: cannot connect to ${peer}: ${(err as Error).message}`),
      );
    }
    const total = { bytes: 0, descriptors: runs.length };
    for (const r of runs) total.bytes += r.local.length;
    const done = new Promise<TransferStats>((resolve, reject) => {
      const timer = setTimeout(() => {
        const w = this.writes.get(requestId);
        if (w === undefined || w.link !== link) return;
        const err = link.connected
          ? new PdError(
              'timeout',
              `request ${requestId}: peer ${peer} did not confirm the transfer within ${options.timeoutMs} ms ` +
                `(${w.stats.descriptors} of ${total.descriptors} descriptors sent; the peer may be dead)`,
            )
          : new PdError(
              'peer',
              `request ${requestId}: peer ${peer} unreachable (no connection within ${options.timeoutMs} ms)`,
            );
        this.failWrite(w, err, 'timed out at the sender');
      }, options.timeoutMs);
      const w: PendingWrite = {
        requestId,
        link,
        timer,
        stats: { bytes: 0, descriptors: 0, messages: 0 },
        total,
        resolve,
        reject,
        settled: false,
      };
      this.writes.set(requestId, w);
      link.requests.add(requestId);
    });
    void this.sendAll(this.writes.get(requestId) as PendingWrite, runs, notifyPayload);
    return done;
  }

  /** Sends the batches, then the notification, unless the write settles (or the test hook pauses it) first. */
  private async sendAll(w: PendingWrite, runs: TransferRun[], notifyPayload: string | undefined): Promise<void> {
    const pauseAt = this.hooks.pauseAfterDescriptors;
    let at = 0;
    try {
      while (at < runs.length) {
        if (w.settled) return;
        if (pauseAt !== undefined && w.stats.descriptors >= pauseAt) break;
        const limit = pauseAt === undefined ? runs.length : Math.min(runs.length, pauseAt);
        const batch: TransferRun[] = [];
        let bytes = 0;
        while (at < limit && batch.length < MAX_DESCRIPTORS_PER_MESSAGE) {
          const run = runs[at] as TransferRun;
          if (batch.length > 0 && bytes + run.local.length > this.maxBatchBytes) break;
          batch.push(run);
          bytes += run.local.length;
          at++;
        }
        const frames: Buffer[] = [
          encodeHeader({
            t: 'data',
            req: w.requestId,
            seq: w.stats.messages,
            d: batch.map((r) => [r.remote.region, r.remote.offset, r.remote.length]),
          }),
        ];
        for (const r of batch) {
          const mem = this.regions.get(r.local.region);
          if (mem === undefined) {
            this.failWrite(
              w,
              new PdError('layout', `write ${w.requestId}: local ${describeRange(r.local)} was deregistered`),
            );
            return;
          }
          frames.push(Buffer.from(mem.buffer, mem.byteOffset + r.local.offset, r.local.length));
        }
        await w.link.queue.send(frames);
        w.link.connected = true;
        w.stats.messages++;
        w.stats.descriptors += batch.length;
        w.stats.bytes += bytes;
      }
      if (w.settled) return;
      if (pauseAt !== undefined && w.stats.descriptors >= pauseAt && w.stats.descriptors < runs.length) {
        this.hooks.onPause?.(w.requestId);
        return;
      }
      const notify =
        `{"t":"notify","req":${JSON.stringify(w.requestId)},"batches":${w.stats.messages},` +
        `"descriptors":${w.stats.descriptors},"bytes":${w.stats.bytes}` +
        `${notifyPayload === undefined ? '' : `,"payload":${notifyPayload}`}}`;
      w.stats.messages++;
      await w.link.queue.send([Buffer.from(notify)]);
      w.link.connected = true;
    } catch (err) {
      if (!w.settled)
        this.failWrite(
          w,
          new PdError('peer', `write ${w.requestId} to ${w.link.peer}: send failed: ${(err as Error).message}`),
        );
    }
  }

  private link(peer: string): PeerLink {
    const existing = this.links.get(peer);
    if (existing !== undefined) return existing;
    const sock = new this.zmq.Dealer({ linger: LINGER_MS, immediate: true });
    sock.connect(peer);
    const link: PeerLink = {
      peer,
      sock,
      queue: new SendQueue(sock),
      connected: false,
      requests: new Set(),
      retired: false,
      notices: 0,
    };
    this.links.set(peer, link);
    this.allLinks.add(link);
    void this.linkLoop(link);
    return link;
  }

  private async linkLoop(link: PeerLink): Promise<void> {
    for (;;) {
      let parts: Buffer[];
      try {
        parts = await link.sock.receive();
      } catch {
        return; // closed
      }
      link.connected = true;
      const h = decodeHeader(parts[0]);
      if (h === undefined) continue;
      this.onReply(link, h);
    }
  }

  private onReply(link: PeerLink, h: Header): void {
    const w = this.writes.get(h.req);
    if (w === undefined || w.link !== link) return; // late answer for a finished write
    if (h.t === 'abort') {
      this.failWrite(w, new PdError('abort', `request ${h.req} aborted by the receiver ${link.peer}: ${h.reason}`));
    } else if (h.t === 'done' && h.ok) {
      // the notification (the last message) was applied
      this.endWrite(w);
      w.resolve({ ...w.stats });
    } else if (h.t === 'done') {
      this.failWrite(w, new PdError(h.code, `request ${h.req}: refused by ${link.peer}: ${h.message}`));
    }
  }

  /**
   * Rejects a pending write; `tell` (when given) is sent to the peer as an abort reason. A link whose peer never
   * connected or went silent ('peer' / 'timeout') is retired: later writes to that peer open a new one, and it
   * closes (dropping what it still queues) once its writes ended and the notice was handed over (or
   * {@link NOTICE_WAIT_MS} passed: a send to a dead peer may never be).
   */
  private failWrite(w: PendingWrite, err: PdError, tell?: string): void {
    if (w.settled) return;
    this.endWrite(w);
    const link = w.link;
    if (!link.connected || err.code === 'peer' || err.code === 'timeout') {
      if (this.links.get(link.peer) === link) this.links.delete(link.peer);
      link.retired = true;
    }
    if (tell !== undefined && link.connected && !link.sock.closed) {
      link.notices++;
      let timer: NodeJS.Timeout | undefined;
      const waited = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, NOTICE_WAIT_MS).unref();
      });
      const sent = link.queue.send([encodeHeader({ t: 'abort', req: w.requestId, reason: tell })]).catch(() => {});
      void Promise.race([sent, waited]).then(() => {
        clearTimeout(timer);
        link.notices--;
        this.closeIfDone(link);
      });
    }
    this.closeIfDone(link);
    w.reject(err);
  }

  private endWrite(w: PendingWrite): void {
    w.settled = true;
    clearTimeout(w.timer);
    this.writes.delete(w.requestId);
    w.link.requests.delete(w.requestId);
    this.closeIfDone(w.link);
  }

  /** Closes a retired link once no write uses it and no abort notice waits on it. */
  private closeIfDone(link: PeerLink): void {
    if (link.retired && link.requests.size === 0 && link.notices === 0) this.closeLink(link);
  }

  private closeLink(link: PeerLink): void {
    if (this.links.get(link.peer) === link) this.links.delete(link.peer);
    this.allLinks.delete(link);
    if (!link.sock.closed) link.sock.close();
  }

  // ---- both ----

  abort(requestId: string, reason: string): void {
    const e = this.expects.get(requestId);
    if (e !== undefined)
      this.failExpect(e, new PdError('abort', `request ${requestId} aborted at ${this.address}: ${reason}`), reason);
    const w = this.writes.get(requestId);
    if (w !== undefined)
      this.failWrite(w, new PdError('abort', `request ${requestId} aborted at ${this.address}: ${reason}`), reason);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    openEngines.delete(this);
    for (const e of [...this.expects.values()]) {
      this.endExpect(e, 'the engine closed');
      e.reject(this.closedError(e.requestId));
    }
    for (const w of [...this.writes.values()]) {
      this.endWrite(w);
      w.reject(this.closedError(w.requestId));
    }
    this.closeSockets();
  }

  /** Closes every socket synchronously (also used at process exit). */
  closeSockets(): void {
    for (const link of [...this.allLinks]) this.closeLink(link);
    if (!this.router.closed) this.router.close();
  }

  private closedError(requestId: string): PdError {
    return new PdError('abort', `request ${requestId}: the transfer engine at ${this.address} is closed`);
  }
}

/** The zeromq package, loaded on first use (only a process that opens an engine needs the addon). */
let zmqModule: Promise<typeof Zmq> | undefined;
function loadZmq(): Promise<typeof Zmq> {
  zmqModule ??= import('zeromq').catch((err: Error) => {
    zmqModule = undefined;
    throw new Error(`createZmqTransferEngine: cannot load the zeromq package (${err.message})`);
  });
  return zmqModule;
}

/**
 * Binds a ZeroMQ/TCP transfer engine on `host:port` (default `127.0.0.1`, port 0: the system picks; the
 * engine's `address` names the port bound). Throws when the bind fails (naming the endpoint).
 */
export async function createZmqTransferEngine(options: ZmqTransferEngineOptions = {}): Promise<TransferEngine> {
  const host = options.host ?? '127.0.0.1';
  const port = options.port ?? 0;
  const maxBatchBytes = options.maxBatchBytes ?? DEFAULT_MAX_BATCH_BYTES;
  if (!Number.isSafeInteger(maxBatchBytes) || maxBatchBytes <= 0)
    throw new RangeError(`createZmqTransferEngine: maxBatchBytes must be a positive integer, got ${maxBatchBytes}`);
  const pause = options.testHooks?.pauseAfterDescriptors;
  if (pause !== undefined && (!Number.isSafeInteger(pause) || pause < 0))
    throw new RangeError(`createZmqTransferEngine: testHooks.pauseAfterDescriptors must be ≥ 0, got ${pause}`);
  const endpoint = `tcp://${host}:${port === 0 ? '*' : port}`;
  const zmq = await loadZmq();
  const router = new zmq.Router({ linger: 0 });
  try {
    await router.bind(endpoint);
  } catch (err) {
    router.close();
    throw new Error(`createZmqTransferEngine: cannot bind ${endpoint}: ${(err as Error).message}`);
  }
  const engine = new ZmqTransferEngine(
    zmq,
    router,
    router.lastEndpoint ?? endpoint,
    maxBatchBytes,
    options.testHooks ?? {},
  );
  if (!exitHandlerInstalled) {
    exitHandlerInstalled = true;
    process.on('exit', () => {
      for (const e of [...openEngines]) e.closeSockets();
    });
  }
  openEngines.add(engine);
  return engine;
}
