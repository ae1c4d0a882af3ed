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
  /** P got a layout from a peer it has no accepted hello from (P restarted on the same address): hello again. */
  | { readonly type: 'hello-required'; readonly room: string }
  | {
      readonly type: 'layout';
      readonly room: string;
      readonly requestId: string;
      /** D's transfer agent (TransferEngine.address). */
      readonly agent: string;
      /** Digest of the request as D parsed it (prompt ids, sampling, limits): P refuses another request's state. */
      readonly request: string;
      readonly entries: readonly LayoutEntry[];
    }
  | {
      readonly type: 'finished';
      readonly room: string;
      readonly tokenIds: readonly number[];
      readonly finishReason: string;
      /** The first token's logprob and the prompt's, when the request asks (pd/logprobs-wire.ts; D checks them). */
      readonly firstLogprob?: unknown;
      readonly promptLogprobs?: unknown;
    }
  | { readonly type: 'failed'; readonly room: string; readonly status: number; readonly message: string }
  /** P starts writing the room's state now (D's transfer wait starts when this arrives: pd/waterfall.ts). */
  | { readonly type: 'sending'; readonly room: string }
  | { readonly type: 'abort'; readonly room: string; readonly reason: string };

/** Longest control frame accepted (bytes): a layout lists every entry's ranges, far below this. */
const MAX_FRAME = 64 << 20;

const isString = (v: unknown): v is string => typeof v === 'string' && v.length > 0 && v.length <= 4096;
const isCount = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;

/** Whether `v` is a list of entries with ranges (shape only; D's entries are checked against its memory). */
function isLayoutEntries(v: unknown): v is LayoutEntry[] {
  if (!Array.isArray(v)) return false;
  return v.every((e: unknown) => {
    const o = e as { key?: Record<string, unknown>; ranges?: unknown } | null;
    const k = o?.key;
    return (
      k !== undefined &&
      typeof k.kind === 'string' &&
      isCount(k.layer) &&
      typeof k.part === 'string' &&
      isCount(k.rank) &&
      Array.isArray(o?.ranges) &&
      (o.ranges as unknown[]).every((r) => {
        const x = r as Record<string, unknown> | null;
        return x !== null && typeof x === 'object' && isString(x.region) && isCount(x.offset) && isCount(x.length);
      })
    );
  });
}

/**
 * Parses and checks a control frame: the type and the types of every field it uses, so that a malformed message
 * from a buggy or hostile peer is dropped here and never reaches the roles.
 * @throws {PdError} `'peer'` naming what is wrong.
 */
export function decodeControl(frame: Buffer): ControlMessage {
  if (frame.length > MAX_FRAME) throw new PdError('peer', `control plane: a frame of ${frame.length} bytes`);
  let msg: Record<string, unknown>;
  try {
    msg = JSON.parse(frame.toString('utf8')) as Record<string, unknown>;
  } catch {
    throw new PdError('peer', 'control plane: a frame that is not JSON');
  }
  if (msg === null || typeof msg !== 'object')
    throw new PdError('peer', 'control plane: a frame that is not an object');
  const bad = (what: string): never => {
    throw new PdError('peer', `control plane: ${String(msg.type)}: ${what}`);
  };
  switch (msg.type) {
    case 'hello': {
      const d = msg.digest;
      if (d === null || typeof d !== 'object' || Array.isArray(d)) bad('digest: expected an object');
      for (const v of Object.values(d as object)) if (typeof v !== 'string') bad('digest: expected string fields');
      break;
    }
    case 'hello-ok':
      if (msg.stages !== undefined && !Array.isArray(msg.stages)) bad('stages: expected an array');
      break;
    case 'hello-refused':
    case 'hello-required':
      if (typeof msg.message !== 'string' && msg.type === 'hello-refused') bad('message: expected a string');
      if (msg.type === 'hello-required' && !isString(msg.room)) bad('room: expected a string');
      break;
    case 'layout':
      if (!isString(msg.room) || !isString(msg.requestId) || !isString(msg.agent)) bad('room, requestId, agent');
      if (msg.request !== undefined && typeof msg.request !== 'string') bad('request: expected a string');
      if (!isLayoutEntries(msg.entries)) bad('entries: expected [{key: {kind, layer, part, rank}, ranges}]');
      break;
    case 'finished':
      if (!isString(msg.room)) bad('room: expected a string');
      if (!Array.isArray(msg.tokenIds) || !msg.tokenIds.every(isCount)) bad('tokenIds: expected token ids');
      if (typeof msg.finishReason !== 'string') bad('finishReason: expected a string');
      break;
    case 'failed':
      if (!isString(msg.room) || typeof msg.message !== 'string' || !isCount(msg.status)) bad('room, status, message');
      break;
    case 'abort':
      if (!isString(msg.room) || typeof msg.reason !== 'string') bad('room, reason');
      break;
    case 'sending':
      if (!isString(msg.room)) bad('room: expected a string');
      break;
    default:
      bad('unknown type');
  }
  return msg as unknown as ControlMessage;
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
        } catch (err) {
          // a malformed hello or layout is answered, so that the peer fails now rather than at its timeout
          void this.refuse(peer, frame, (err as Error).message);
          continue;
        }
        try {
          this.onMessage(peer, msg);
        } catch {
          // a handler that failed on it: dropped; the socket keeps serving
        }
      }
    } catch {
      // the socket was closed
    }
  }

  /** Answers a malformed `hello` with `hello-refused` and a malformed `layout` naming a room with `abort`. */
  private async refuse(peer: Buffer, frame: Buffer, reason: string): Promise<void> {
    let raw: { type?: unknown; room?: unknown } | undefined;
    try {
      raw = JSON.parse(frame.toString('utf8')) as typeof raw;
    } catch {
      return;
    }
    if (raw?.type === 'hello') await this.send(peer, { type: 'hello-refused', message: reason });
    else if (raw?.type === 'layout' && isString(raw.room))
      await this.send(peer, { type: 'abort', room: raw.room, reason });
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

  /** @throws {PdError} `'peer'` when ZeroMQ refuses the address. */
  constructor(
    readonly address: string,
    private readonly onMessage: (msg: ControlMessage) => void,
  ) {
    try {
      this.sock.connect(address);
    } catch (err) {
      this.sock.close();
      throw new PdError('peer', `control plane: cannot connect to ${address}: ${(err as Error).message}`);
    }
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
        try {
          this.onMessage(decodeControl(frame));
        } catch {
          // a malformed message, or a handler that failed on it: dropped; the socket keeps serving
        }
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
