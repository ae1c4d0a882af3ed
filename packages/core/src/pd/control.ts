/**
 * The PD control plane (bootstrap, layouts, acknowledgements, aborts) over ZeroMQ: the prefill instance
 * binds a ROUTER socket on its bootstrap port; each decode instance connects one DEALER to it. Messages are
 * single JSON frames ({@link ControlMessage}). The data itself moves over the {@link TransferEngine}
 * (transfer-engine.ts), never here.
 *
 * Sequence (docs/ARCHITECTURE.md "Prefill/decode disaggregation"): D → P `hello` (the digest, compared at
 * connection time: a mismatch is refused naming the field) → P → D `hello` (ok with P's pipeline stages, or the
 * refusal); per request
 * D → P `layout` (the room, D's transfer agent, the entries D expects with the ranges they go to);
 * P → D `finished` when the request ended on its first token (nothing to transfer) or `failed` when P could
 * not prefill it; either side → the other `abort`.
 */

import * as zmq from 'zeromq';

import type { PdStageLayout } from './stages.js';
import type { PdEntryKey, RegionRange } from './types.js';
import { PdError } from './types.js';

/** An entry D expects, with the ranges of D's memory it is written into (in order). */
export interface LayoutEntry {
  readonly key: PdEntryKey;
  readonly ranges: readonly RegionRange[];
}

/** The control messages. */
export type ControlMessage =
  | { readonly type: 'hello'; readonly digest: Readonly<Record<string, string>> }
  | {
      readonly type: 'hello-ok';
      /** P's pipeline stages, in order (pd/stages.ts); absent: one stage (an older P). */
      readonly stages?: readonly PdStageLayout[];
    }
  | { readonly type: 'hello-refused'; readonly message: string }
  | {
      readonly type: 'layout';
      readonly room: string;
      readonly requestId: string;
      /** D's transfer agent (TransferEngine.address). */
      readonly agent: string;
      readonly entries: readonly LayoutEntry[];
    }
  | {
      readonly type: 'finished';
      readonly room: string;
      readonly tokenIds: readonly number[];
      readonly finishReason: string;
    }
  | { readonly type: 'failed'; readonly room: string; readonly status: number; readonly message: string }
  | { readonly type: 'abort'; readonly room: string; readonly reason: string };

/** Parses a control frame. @throws {PdError} `'peer'` for a frame that is not a control message. */
export function decodeControl(frame: Buffer): ControlMessage {
  let msg: unknown;
  try {
    msg = JSON.parse(frame.toString('utf8'));
  } catch {
    throw new PdError('peer', 'control plane: a frame that is not JSON');
  }
  const type = (msg as { type?: unknown } | null)?.type;
  if (typeof type !== 'string') throw new PdError('peer', 'control plane: a message without a type');
  return msg as ControlMessage;
}

/** Sends frames one at a time (a zeromq.js socket refuses a send while one is in progress). */
class SendQueue {
  private tail: Promise<void> = Promise.resolve();
  constructor(private readonly sock: zmq.Router | zmq.Dealer) {}
  send(frames: Buffer[]): Promise<void> {
    const next = this.tail.then(() => this.sock.send(frames));
    this.tail = next.catch(() => undefined);
    return next;
  }
}

/** P's end: a ROUTER bound on the bootstrap port. Peers are named by their routing id. */
export class ControlServer {
  private readonly sock = new zmq.Router({ linger: 0 });
  private readonly queue = new SendQueue(this.sock);
  private closed = false;
  /** The bound address, e.g. `tcp://127.0.0.1:5555`. */
  address = '';

  /** @param onMessage called for each message with the sender's routing id (a peer's bad frame is dropped). */
  constructor(private readonly onMessage: (peer: Buffer, msg: ControlMessage) => void) {}

  /** Binds `tcp://host:port` (port 0: ephemeral) and starts receiving. @returns the bound address. */
  async bind(host: string, port: number): Promise<string> {
    await this.sock.bind(`tcp://${host}:${port}`);
    this.address = this.sock.lastEndpoint ?? `tcp://${host}:${port}`;
    void this.receive();
    return this.address;
  }

  /** Sends `msg` to `peer`; a closed socket or a gone peer is ignored (the request's timeout reports it). */
  async send(peer: Buffer, msg: ControlMessage): Promise<void> {
    if (this.closed) return;
    try {
      await this.queue.send([peer, Buffer.from(JSON.stringify(msg))]);
    } catch {
      // a peer that is gone: ROUTER drops the message; the request's own timeout reports it
    }
  }

  private async receive(): Promise<void> {
    try {
      for await (const [peer, frame] of this.sock) {
        if (peer === undefined || frame === undefined) continue;
        let msg: ControlMessage;
        try {
          msg = decodeControl(frame);
        } catch {
          continue;
        }
        this.onMessage(peer, msg);
      }
    } catch {
      // the socket was closed
    }
  }

  close(): void {
    this.closed = true;
    this.sock.close();
  }
}

/** D's end towards one prefill instance: a DEALER connected to its bootstrap address. */
export class ControlClient {
  private readonly sock = new zmq.Dealer({ linger: 0 });
  private readonly queue = new SendQueue(this.sock);
  private closed = false;

  constructor(
    readonly address: string,
    private readonly onMessage: (msg: ControlMessage) => void,
  ) {
    this.sock.connect(address);
    void this.receive();
  }

  /** Sends `msg` (queued while the connection is being made). */
  async send(msg: ControlMessage): Promise<void> {
    if (this.closed) throw new PdError('peer', `control plane: connection to ${this.address} is closed`);
    await this.queue.send([Buffer.from(JSON.stringify(msg))]);
  }

  private async receive(): Promise<void> {
    try {
      for await (const [frame] of this.sock) {
        if (frame === undefined) continue;
        let msg: ControlMessage;
        try {
          msg = decodeControl(frame);
        } catch {
          continue;
        }
        this.onMessage(msg);
      }
    } catch {
      // the socket was closed
    }
  }

  close(): void {
    this.closed = true;
    this.sock.close();
  }
}

/** A promise with its resolve / reject, settled once. */
export interface Deferred<T> {
  readonly promise: Promise<T>;
  resolve(value: T): void;
  reject(err: Error): void;
  readonly settled: boolean;
}

/** A {@link Deferred} whose promise never raises an unhandled rejection (a caller may not be waiting yet). */
export function deferred<T>(): Deferred<T> {
  let res!: (v: T) => void;
  let rej!: (e: Error) => void;
  let settled = false;
  const promise = new Promise<T>((a, b) => {
    res = a;
    rej = b;
  });
  promise.catch(() => undefined);
  return {
    promise,
    resolve: (v) => {
      if (settled) return;
      settled = true;
      res(v);
    },
    reject: (e) => {
      if (settled) return;
      settled = true;
      rej(e);
    },
    get settled() {
      return settled;
    },
  };
}

/**
 * Rejects with PdError `'timeout'` (`what` in the message) unless `p` settles within `ms`.
 * The timer never keeps the process alive.
 */
export function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new PdError('timeout', `${what}: no answer within ${ms} ms`)), ms);
    timer.unref();
  });
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}
