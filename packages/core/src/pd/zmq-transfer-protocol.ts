/**
 * The wire pieces of the ZeroMQ transfer engine (zmq-transfer.ts has the protocol): message headers and a send
 * queue per socket (the allowed-range check a receiver applies to every descriptor is transfer-common.ts's).
 */

import type { PdError } from './types.js';

/** A message's header (its first frame, JSON); the protocol is described in zmq-transfer.ts. */
export type Header =
  | { t: 'data'; req: string; seq: number; d: [string, number, number][]; f?: number[] }
  | { t: 'notify'; req: string; batches: number; descriptors: number; bytes: number; payload?: unknown; part?: true }
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
