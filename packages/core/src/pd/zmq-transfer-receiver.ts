/**
 * The receiving side (D) of the ZeroMQ transfer engine: the engine's ROUTER socket, the pending `expect`s and
 * the ids of requests that ended (to answer their late messages). Protocol: zmq-transfer.ts.
 */

import type * as Zmq from 'zeromq';

import {
  abortedError,
  alreadyPending,
  AllowedRanges,
  checkAllowed,
  expectTimeoutError,
  openPending,
  type Pending,
  refusal,
  refusedMessage,
  Tombstones,
} from './transfer-common.js';
import { PdError, type RegionRange } from './types.js';
import { decodeHeader, encodeHeader, SendQueue, type Header } from './zmq-transfer-protocol.js';

interface PendingExpect extends Pending<unknown> {
  readonly allowed: AllowedRanges;
  /** The identities (ROUTER routing ids) of the senders seen, by hex. */
  readonly senders: Map<string, Buffer>;
  /** Data messages applied. */
  batches: number;
  descriptors: number;
  bytes: number;
}

/** D's half of a ZeroMQ transfer engine. */
export class ZmqReceiver {
  private readonly expects = new Map<string, PendingExpect>();
  /** Finished or aborted requests → why (answers their late messages); insertion-ordered, bounded. */
  private readonly tombstones = new Tombstones();
  private readonly routerQueue: SendQueue;

  constructor(
    private readonly router: Zmq.Router,
    /** The engine's address (named in errors). */
    private readonly address: string,
    /** The engine's registered regions (shared, live). */
    private readonly regions: ReadonlyMap<string, Uint8Array>,
    private readonly onApplied?: (requestId: string, applied: { descriptors: number; bytes: number }) => void,
  ) {
    this.routerQueue = new SendQueue(router);
    void this.receiveLoop();
  }

  /** Whether `requestId` has a pending expect. */
  has(requestId: string): boolean {
    return this.expects.has(requestId);
  }

  /** Pending expects. */
  get size(): number {
    return this.expects.size;
  }

  /** See {@link TransferEngine.expect} (the engine checked that it is open and the timeout). */
  expect(requestId: string, allowed: readonly RegionRange[], options: { timeoutMs: number }): Promise<unknown> {
    if (this.expects.has(requestId)) return Promise.reject(alreadyPending('expect', requestId, this.address));
    const bad = checkAllowed(requestId, allowed, (id) => this.regions.get(id)?.byteLength);
    if (bad !== undefined) return Promise.reject(bad);
    this.tombstones.delete(requestId);
    return openPending<unknown, PendingExpect>(
      this.expects,
      requestId,
      options.timeoutMs,
      (base) => ({
        ...base,
        allowed: new AllowedRanges(allowed),
        senders: new Map(),
        batches: 0,
        descriptors: 0,
        bytes: 0,
      }),
      (e) => {
        const applied = e.senders.size === 0 ? undefined : e;
        const err = expectTimeoutError(requestId, this.address, options.timeoutMs, applied);
        this.failExpect(e, err, `timed out at the receiver ${this.address}`);
      },
    ).done;
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
      const message = this.tombstones.notExpected(h.req, this.address);
      this.reply(identity, { t: 'done', req: h.req, ok: false, code: 'abort', message });
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
    // each descriptor's bytes: frame i holds f[i] descriptors back to back (one each without f)
    const pieces = Array.isArray(h.d) ? descriptorBytes(h.d, h.f, frames) : undefined;
    if (pieces === undefined || !Array.isArray(h.d)) {
      this.refuse(identity, e, 'peer', `request ${e.requestId}: malformed data message ${h.seq}`);
      return;
    }
    // check every descriptor before writing any
    for (const [i, d] of h.d.entries()) {
      const [region, offset, length] = d;
      const frame = pieces[i] as Buffer;
      let why: string | undefined;
      if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0)
        why = 'not a valid range';
      else if (frame.byteLength !== length) why = `its frame has ${frame.byteLength} bytes`;
      else why = refusal(region, offset, length, this.regions.get(region)?.byteLength, e.allowed);
      if (why !== undefined) {
        this.refuse(identity, e, 'layout', refusedMessage(e.requestId, d, this.address, why));
        return;
      }
    }
    for (const [i, d] of h.d.entries()) {
      (this.regions.get(d[0]) as Uint8Array).set(pieces[i] as Buffer, d[1]);
      e.descriptors++;
      e.bytes += d[2];
    }
    e.batches++;
    this.onApplied?.(e.requestId, { descriptors: e.descriptors, bytes: e.bytes });
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
    this.reply(identity, { t: 'done', req: e.requestId, ok: true });
    if (h.part === true) {
      // one part of the request applied: the next write counts its messages from 0; the expect stays pending
      e.batches = 0;
      e.descriptors = 0;
      e.bytes = 0;
      return;
    }
    this.endExpect(e, 'already complete');
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
  }

  /** Aborts a pending expect (its known senders are told); false when there is none. */
  abort(requestId: string, reason: string): boolean {
    const e = this.expects.get(requestId);
    if (e === undefined) return false;
    this.failExpect(e, abortedError(requestId, this.address, reason), reason);
    return true;
  }

  /** Rejects every pending expect with `error(requestId)` and closes the socket. */
  close(error: (requestId: string) => PdError): void {
    for (const e of [...this.expects.values()]) {
      this.endExpect(e, 'the engine closed');
      e.reject(error(e.requestId));
    }
    this.closeSocket();
  }

  /** Closes the socket synchronously (also at process exit). */
  closeSocket(): void {
    if (!this.router.closed) this.router.close();
  }
}

/**
 * The bytes of each descriptor of a data message: frame i holds `f[i]` descriptors back to back (`f` absent: one
 * each), cut by the descriptors' lengths. Undefined when the message is malformed: `f` not positive integers, the
 * counts not adding up to the descriptors or the frames, or a frame not exactly the sum of its descriptors' lengths.
 */
function descriptorBytes(d: readonly unknown[], f: unknown, frames: readonly Buffer[]): Buffer[] | undefined {
  if (f === undefined) return d.length === frames.length ? [...frames] : undefined;
  if (!Array.isArray(f) || f.length !== frames.length) return undefined;
  const out: Buffer[] = [];
  let k = 0;
  for (const [i, n] of f.entries()) {
    if (!Number.isSafeInteger(n) || (n as number) < 1 || k + (n as number) > d.length) return undefined;
    const frame = frames[i] as Buffer;
    let at = 0;
    for (let j = 0; j < (n as number); j++, k++) {
      const length = (d[k] as unknown[] | undefined)?.[2];
      if (!Number.isSafeInteger(length) || (length as number) < 0 || at + (length as number) > frame.byteLength)
        return undefined;
      out.push(frame.subarray(at, at + (length as number)));
      at += length as number;
    }
    if (at !== frame.byteLength) return undefined;
  }
  return k === d.length ? out : undefined;
}
