/**
 * The ZeroMQ/TCP {@link TransferEngine}: the PD data plane until a NIXL engine lands.
 *
 * Sockets: each engine binds one ROUTER (its `address`) that receives writes and answers them, and opens one
 * DEALER per peer it writes to (connected to the peer's ROUTER, `immediate`: nothing is queued before the
 * connection exists). Everything runs on the caller's event loop (zeromq's promises); sends on a socket are
 * serialised (zeromq allows one pending send per socket).
 *
 * Messages (frame 0 is a JSON header; ROUTER prepends / takes the sender's identity):
 * - P → D `data`: `{t: 'data', req, seq, d: [[region, offset, length], …], f?: [n, …]}` + frames. A large
 *   descriptor is one frame, a `Buffer` view of P's registered memory (zeromq sends frames over 128 bytes without
 *   copying); consecutive small ones (under {@link PACK_BELOW} bytes: the per-head rows of a TP re-split) are copied
 *   into one frame, since a frame costs tens of µs however small. `f[i]` is how many descriptors frame i holds, in
 *   order (absent: one each). D checks every descriptor of the message against the request's `allowed` ranges and
 *   its regions before it writes any, then copies each descriptor's bytes into its region at the offset.
 * - P → D `notify`: `{t: 'notify', req, batches, descriptors, bytes, payload}` after the last batch; D checks
 *   the counts against what it applied (a lost message fails the request), resolves `expect` with `payload`.
 *   A partial write's (`part: true`) counts only its own messages: D checks them, answers `done` and counts the
 *   next write's messages from 0, its `expect` still pending.
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
 * queues is dropped). Late or out-of-order messages of a finished, aborted or unknown request are never written.
 *
 * Files: this one (options, the engine, its creation), zmq-transfer-receiver.ts (D's half: the ROUTER and the
 * pending expects), zmq-transfer-sender.ts (P's half: the DEALER links and the pending writes),
 * zmq-transfer-protocol.ts (headers, the send queue); what it shares with the NIXL engine (argument and range
 * checks, the allowed ranges, pending-request timeouts and their errors, tombstones) is transfer-common.ts.
 */

import type * as Zmq from 'zeromq';

import {
  checkTestHooks,
  checkCall,
  closeAtExit,
  closedError,
  countInflight,
  type TransferTestHooks,
} from './transfer-common.js';
import type { TransferDescriptor, TransferEngine, TransferStats, WriteOptions } from './transfer-engine.js';
import type { MemoryRegion, PdError, RegionRange } from './types.js';
import { ZmqReceiver } from './zmq-transfer-receiver.js';
import { ZmqSender } from './zmq-transfer-sender.js';

export { MAX_DESCRIPTORS_PER_MESSAGE } from './zmq-transfer-sender.js';

/** The default batch size (bytes of payload per message). */
export const DEFAULT_MAX_BATCH_BYTES = 4 << 20;

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

/**
 * The test hooks (transfer-common.ts): a descriptor counts as sent once handed to ZeroMQ; `onApplied` is called
 * after each data message.
 */
export type ZmqTransferTestHooks = TransferTestHooks;

/** The engine: its registered regions, a receiver (D's half) and a sender (P's half). */
class ZmqTransferEngine implements TransferEngine {
  private readonly regions = new Map<string, Uint8Array>();
  private readonly receiver: ZmqReceiver;
  private readonly sender: ZmqSender;
  private closed = false;
  /** Forgets this engine's exit hook (a zeromq socket left open at exit can abort the process). */
  forgetAtExit: () => void = () => {};

  constructor(
    zmq: typeof Zmq,
    router: Zmq.Router,
    readonly address: string,
    maxBatchBytes: number,
    hooks: ZmqTransferTestHooks,
  ) {
    this.receiver = new ZmqReceiver(router, address, this.regions, hooks.onApplied);
    this.sender = new ZmqSender(zmq, address, this.regions, maxBatchBytes, hooks);
  }

  get inflight(): number {
    return countInflight(this.receiver, this.sender.requests());
  }

  registerRegions(regions: readonly MemoryRegion[]): void {
    if (this.closed) throw new Error(`registerRegions: the transfer engine at ${this.address} is closed`);
    for (const r of regions) this.regions.set(r.id, r.bytes);
  }

  deregisterRegions(ids: readonly string[]): void {
    for (const id of ids) this.regions.delete(id);
  }

  expect(requestId: string, allowed: readonly RegionRange[], options: { timeoutMs: number }): Promise<unknown> {
    const refused = checkCall('expect', this.address, this.closed, requestId, options.timeoutMs);
    if (refused !== undefined) return Promise.reject(refused);
    return this.receiver.expect(requestId, allowed, options);
  }

  write(
    peer: string,
    requestId: string,
    local: readonly TransferDescriptor[],
    remote: readonly TransferDescriptor[],
    notification: unknown,
    options: WriteOptions,
  ): Promise<TransferStats> {
    const refused = checkCall('write', this.address, this.closed, requestId, options.timeoutMs);
    if (refused !== undefined) return Promise.reject(refused);
    return this.sender.write(peer, requestId, local, remote, notification, options);
  }

  abort(requestId: string, reason: string): void {
    this.receiver.abort(requestId, reason);
    this.sender.abort(requestId, reason);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.forgetAtExit();
    this.receiver.close((id) => this.closedError(id));
    this.sender.close((id) => this.closedError(id));
  }

  /** Closes every socket synchronously (at process exit). */
  closeSockets(): void {
    this.sender.closeSockets();
    this.receiver.closeSocket();
  }

  private closedError(requestId: string): PdError {
    return closedError(requestId, this.address);
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
  checkTestHooks('createZmqTransferEngine', options.testHooks);
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
  engine.forgetAtExit = closeAtExit(() => engine.closeSockets());
  return engine;
}
