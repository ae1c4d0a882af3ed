/**
 * The wire pieces of the ZeroMQ transfer engine (zmq-transfer.ts has the protocol): message headers, a send
 * queue per socket, and the allowed-range check a receiver applies to every descriptor.
 */

import type { PdError, RegionRange } from './types.js';

/** A message's header (its first frame, JSON); the protocol is described in zmq-transfer.ts. */
export type Header =
  | { t: 'data'; req: string; seq: number; d: [string, number, number][]; f?: number[] }
  | { t: 'notify'; req: string; batches: number; descriptors: number; bytes: number; payload?: unknown }
  | { t: 'done'; req: string; ok: true }
  | { t: 'done'; req: string; ok: false; code: PdError['code']; message: string }
  | { t: 'abort'; req: string; reason: string };

export function encodeHeader(h: Header): Buffer {
  return Buffer.from(JSON.stringify(h));
}

export function decodeHeader(frame: Buffer | undefined): Header | undefined {
  if (frame === undefined) return undefined;
  try {
    const h = JSON.parse(frame.toString('utf8')) as Header;
    return typeof h === 'object' && h !== null && typeof h.req === 'string' && typeof h.t === 'string' ? h : undefined;
  } catch {
    return undefined;
  }
}

/** Serialises sends on one zeromq socket (zeromq allows one pending send per socket), in call order. */
export class SendQueue {
  private tail: Promise<void> = Promise.resolve();

  constructor(private readonly sock: { readonly closed: boolean; send(parts: Buffer[]): Promise<void> }) {}

  /** Resolves when the message was handed to ZeroMQ; rejects when the send failed (the socket closed). */
  send(parts: Buffer[]): Promise<void> {
    const sent = this.tail.then(() => {
      if (this.sock.closed) throw new Error('socket closed');
      return this.sock.send(parts);
    });
    this.tail = sent.then(
      () => {},
      () => {},
    );
    return sent;
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
