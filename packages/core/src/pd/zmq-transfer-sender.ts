/**
 * The sending side (P) of the ZeroMQ transfer engine: one DEALER link per peer and the pending writes.
 * Protocol: zmq-transfer.ts.
 */

import type * as Zmq from 'zeromq';

import {
  abortedError,
  alreadyPending,
  openPendingWrite,
  type PendingWrite as PendingWriteBase,
  prepareWrite,
} from './transfer-common.js';
import {
  describeRange,
  type TransferDescriptor,
  type TransferRun,
  type TransferStats,
  type WriteOptions,
} from './transfer-engine.js';
import { PdError } from './types.js';
import { decodeHeader, encodeHeader, SendQueue, type Header } from './zmq-transfer-protocol.js';

/** At most this many descriptors per message (bounds the header). */
export const MAX_DESCRIPTORS_PER_MESSAGE = 1024;

/**
 * Descriptors shorter than this (bytes) are packed with their small neighbours into one frame (copied): a zeromq
 * frame costs tens of µs however small, and a TP re-split makes one descriptor per head per row (zmq-transfer.ts).
 */
export const PACK_BELOW = 16 << 10;
/** How long a failed write's abort notice may wait to be handed to ZeroMQ before its unused link closes (ms). */
const NOTICE_WAIT_MS = 1000;
/** How long a closed DEALER may still deliver what it queued (ms). */
const LINGER_MS = 200;

/** The sender's test hooks (see ZmqTransferTestHooks). */
export interface ZmqSenderHooks {
  readonly pauseAfterDescriptors?: number;
  readonly onPause?: (requestId: string) => void;
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

type PendingWrite = PendingWriteBase<PeerLink>;

/** P's half of a ZeroMQ transfer engine. */
export class ZmqSender {
  /** The current link per peer address. */
  private readonly links = new Map<string, PeerLink>();
  /** Every open link (the current ones and retired ones still draining). */
  private readonly allLinks = new Set<PeerLink>();
  private readonly writes = new Map<string, PendingWrite>();

  constructor(
    private readonly zmq: typeof Zmq,
    /** The engine's address (named in errors). */
    private readonly address: string,
    /** The engine's registered regions (shared, live). */
    private readonly regions: ReadonlyMap<string, Uint8Array>,
    private readonly maxBatchBytes: number,
    private readonly hooks: ZmqSenderHooks,
  ) {}

  /** The requests with a pending write. */
  requests(): IterableIterator<string> {
    return this.writes.keys();
  }

  /** See {@link TransferEngine.write} (the engine checked that it is open and the timeout). */
  write(
    peer: string,
    requestId: string,
    local: readonly TransferDescriptor[],
    remote: readonly TransferDescriptor[],
    notification: unknown,
    options: WriteOptions,
  ): Promise<TransferStats> {
    if (this.writes.has(requestId)) return Promise.reject(alreadyPending('write', requestId, this.address));
    let runs: TransferRun[];
    let notifyPayload: string | undefined;
    try {
      ({ runs, notifyPayload } = prepareWrite(
        requestId,
        local,
        remote,
        notification,
        this.maxBatchBytes,
        (id) => this.regions.get(id)?.byteLength,
      ));
    } catch (err) {
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
    const { record: w, done } = openPendingWrite<PeerLink, PendingWrite>(
      this.writes,
      requestId,
      peer,
      link,
      runs.length,
      options.timeoutMs,
      (base) => base,
      (w, err, tell) => this.failWrite(w, err, tell),
    );
    void this.sendAll(w, runs, notifyPayload, options.partial === true);
    return done;
  }

  /**
   * Sends the batches, then the notification (a part's when `partial`), unless the write settles (or the test hook
   * pauses it) first.
   */
  private async sendAll(
    w: PendingWrite,
    runs: TransferRun[],
    notifyPayload: string | undefined,
    partial: boolean,
  ): Promise<void> {
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
        // one frame per large descriptor (zero-copy); consecutive small ones copied into one frame
        const frames: Buffer[] = [];
        const perFrame: number[] = [];
        let small: Buffer[] = [];
        const flushSmall = (): void => {
          if (small.length === 0) return;
          frames.push(small.length === 1 ? (small[0] as Buffer) : Buffer.concat(small));
          perFrame.push(small.length);
          small = [];
        };
        for (const r of batch) {
          const mem = this.regions.get(r.local.region);
          if (mem === undefined) {
            this.failWrite(
              w,
              new PdError('layout', `write ${w.requestId}: local ${describeRange(r.local)} was deregistered`),
            );
            return;
          }
          const view = Buffer.from(mem.buffer, mem.byteOffset + r.local.offset, r.local.length);
          if (r.local.length < PACK_BELOW) small.push(view);
          else {
            flushSmall();
            frames.push(view);
            perFrame.push(1);
          }
        }
        flushSmall();
        const header = encodeHeader({
          t: 'data',
          req: w.requestId,
          seq: w.stats.messages,
          d: batch.map((r) => [r.remote.region, r.remote.offset, r.remote.length]),
          ...(perFrame.every((n) => n === 1) ? {} : { f: perFrame }),
        });
        await w.link.queue.send([header, ...frames]);
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
        `${notifyPayload === undefined ? '' : `,"payload":${notifyPayload}`}${partial ? ',"part":true' : ''}}`;
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

  /** Aborts a pending write (the peer is told when connected); false when there is none. */
  abort(requestId: string, reason: string): boolean {
    const w = this.writes.get(requestId);
    if (w === undefined) return false;
    this.failWrite(w, abortedError(requestId, this.address, reason), reason);
    return true;
  }

  /** Rejects every pending write with `error(requestId)` and closes every link. */
  close(error: (requestId: string) => PdError): void {
    for (const w of [...this.writes.values()]) {
      this.endWrite(w);
      w.reject(error(w.requestId));
    }
    this.closeSockets();
  }

  /** Closes every link's socket synchronously (also at process exit). */
  closeSockets(): void {
    for (const link of [...this.allLinks]) this.closeLink(link);
  }
}
