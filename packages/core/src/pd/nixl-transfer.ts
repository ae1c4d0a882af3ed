/**
 * The NIXL {@link TransferEngine} (ai-dynamo/nixl, the engine vLLM and Dynamo use): one NIXL agent with a UCX
 * backend per engine; the bytes move as one-sided NIXL WRITEs from P's registered memory into D's, each carrying a
 * NIXL notification that D receives after the data. On one host UCX uses shared memory / TCP (`UCX_TLS`, see
 * {@link NixlTransferEngineOptions.ucxTls}); on a cluster the same code moves bytes over RDMA.
 *
 * Memory: `registerRegions` registers each region with the agent once (at startup: the KV page pools and the
 * state slots); a write names ranges of registered regions, so nothing is registered per request.
 *
 * Control (a small TCP socket per engine: its `address`, `nixl://host:port`; JSON frames with a 4-byte length):
 * - D → P on connect `hello`: `{t: 'hello', agent, md, v}`: D's agent name, its NIXL metadata (base64: UCX worker
 *   address and the registered memory's keys) and the metadata's version (bumped by every (de)registration).
 * - P → D `req`: `{t: 'req', req, agent, d: [[region, offset, length], …], bytes}`: the request's coalesced remote
 *   runs. D checks each against the request's `allowed` ranges and its regions (as the ZeroMQ engine checks each
 *   write) and answers `go` `{t: 'go', req, a: [address, …], v, md?}` (the runs' addresses in D's memory; `md` when P
 *   holds an older version) or `done` not ok (refused: 'layout'; not expected or aborted: 'abort'). So nothing lands
 *   outside `allowed`: P learns D's addresses only for ranges D accepted.
 * - P posts ONE NIXL WRITE request for all the runs (one batched descriptor list, contiguous pages coalesced by
 *   {@link coalesceDescriptors}), its notification `{req, seq, descriptors, bytes, last: true, payload}`.
 *   (The pause test hook posts the first N runs as a first request whose notification has `last: false`.)
 * - A partial write (WriteOptions.partial) is a `req` with `part: true` and a notification with `part: true`: D
 *   checks its counts and answers `done`, keeps the expect pending and accepts the same sender's next `req`.
 * - D, on the notification (polled: `getNotifs` at every event-loop turn for {@link SPIN_MS} ms after a `go`, then
 *   every {@link POLL_MS} ms while an expect is pending), checks the
 *   counts against the `req` message, resolves `expect` with `payload` and sends `done` `{t: 'done', req, ok: true}`
 *   (or not ok, code 'peer', when the counts disagree); P's write resolves on it.
 * - either way `abort` `{t: 'abort', req, reason}`: the other side rejects its pending promise ('abort'); P releases
 *   the NIXL request (NIXL aborts a transfer in progress) before it sends its abort, and answers D's with
 *   `{t: 'released', req}`: a one-sided write cannot be recalled by D, so D's expect (whose rejection lets D reuse
 *   the pages) settles only once P released it, P's connection closed, or {@link RELEASE_GRACE_MS} passed.
 *
 * Dead peers: a control connection that closes fails its side's pending requests at once ('peer', naming the
 * peer); a peer that stays connected but silent runs into `timeoutMs` ('timeout'). A write to an address nobody
 * listens on rejects 'peer' (connection refused) without waiting.
 *
 * Stats: `messages` counts the NIXL write requests posted (each with its notification; 0 for a write without
 * descriptors, whose `req` message carries the notification), `descriptors` the coalesced runs, `bytes` the payload.
 */

import { randomBytes } from 'node:crypto';
import * as net from 'node:net';
import * as os from 'node:os';

import type { NixlApi, NixlHandle } from '@specd/native';

import { loadNixl } from './nixl-library.js';
import {
  abortedError,
  alreadyPending,
  AllowedRanges,
  checkAllowed,
  checkTestHooks,
  checkCall,
  closeAtExit,
  closedError,
  countInflight,
  expectTimeoutError,
  openPending,
  type Pending,
  prepareWrite,
  refusal,
  refusedMessage,
  Tombstones,
  type TransferTestHooks,
  openPendingWrite,
  type PendingWrite as PendingWriteBase,
} from './transfer-common.js';
import {
  describeRange,
  type TransferDescriptor,
  type TransferEngine,
  type TransferRun,
  type TransferStats,
  type WriteOptions,
} from './transfer-engine.js';
import { PdError, type MemoryRegion, type RegionRange } from './types.js';

/** How often a pending expect polls NIXL's notifications and a pending write its transfer status (ms). */
export const POLL_MS = 1;
/** After D accepts a transfer it polls at every event-loop turn for this long (ms): a small payload lands sooner. */
const SPIN_MS = 2;
/**
 * NIXL's progress thread waits for UCX events at most this long per poll() (µs, rounded up to ms by NIXL). It
 * should wake on events at once, but measured here it also relies on the timeout (1 MB took 2.5× longer at 10 ms
 * than at 1 ms); an idle engine costs ~2.7 % of a core at 1 ms, 0.4 % at 10 ms. NIXL's default (0) spins a core.
 */
export const DEFAULT_PROGRESS_DELAY_US = 1000;
/**
 * How long D waits, after aborting a request whose transfer it accepted, for P to confirm that it released its NIXL
 * write (ms): a one-sided write cannot be recalled from D, so the request's pages stay D's until P stopped writing
 * into them (or its connection closed); after this D gives them up anyway.
 */
const RELEASE_GRACE_MS = 1000;
/** A control frame larger than this is refused (the connection is dropped): 64 MiB. */
const MAX_FRAME = 64 << 20;

export interface NixlTransferEngineOptions {
  /** The interface to bind and advertise for the control socket (default `'127.0.0.1'`). */
  readonly host?: string;
  /** The control socket's TCP port (default 0: the system picks one; `address` reports it). */
  readonly port?: number;
  /**
   * UCX transports for this engine's backend (`UCX_TLS`, read when the backend is created), e.g. `'tcp'` or
   * `'sm,self'`; default: the process's `UCX_TLS`, else UCX's own choice (shared memory and TCP on one host).
   */
  readonly ucxTls?: string;
  /**
   * Run NIXL's own progress thread (default false). Without it UCX progresses only inside this engine's NIXL calls
   * on the event-loop thread, which polls while a transfer is pending (every {@link POLL_MS} ms); with it, NIXL
   * 1.5.1's progress thread runs beside those calls, and here about one run of the transfer suite in twenty then
   * died of a corrupted heap (SIGSEGV in malloc; docs/BENCHMARKS.md, "PD transfer engines"). UCX's memory hooks,
   * found later to corrupt the heap on their own (pd/nixl-library.ts), may have been that crash's cause too.
   */
  readonly progressThread?: boolean;
  /** NIXL's progress thread's poll() timeout, µs (default {@link DEFAULT_PROGRESS_DELAY_US}; with `progressThread`). */
  readonly progressDelayUs?: number;
  /**
   * Fault points for tests only (transfer-common.ts): the sender posts only the first `pauseAfterDescriptors`
   * coalesced runs; `onApplied` is called for each notification of a request applied.
   */
  readonly testHooks?: TransferTestHooks;
}

type Msg =
  | { t: 'hello'; agent: string; md: string; v: number }
  | {
      t: 'req';
      req: string;
      agent: string;
      d: [string, number, number][];
      bytes: number;
      payload?: unknown;
      part?: true;
    }
  | { t: 'go'; req: string; a: number[]; v: number; md?: string }
  | { t: 'done'; req: string; ok: true }
  | { t: 'done'; req: string; ok: false; code: PdError['code']; message: string }
  | { t: 'abort'; req: string; reason: string }
  | { t: 'released'; req: string };

/** A control connection: length-prefixed JSON frames. */
class Control {
  private pending: Buffer = Buffer.alloc(0);
  closed = false;
  /** Receiver side: the version of this agent's metadata the peer holds (sent in hello, or in a later go). */
  version = -1;
  /** Receiver side: requests aborted here whose sender has not yet released its NIXL write → settle the expect. */
  readonly releasing = new Map<string, () => void>();

  constructor(
    readonly sock: net.Socket,
    onMessage: (m: Msg) => void,
    onClose: (why: string) => void,
  ) {
    sock.setNoDelay(true);
    sock.on('data', (chunk: Buffer) => {
      this.pending = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk]);
      while (this.pending.length >= 4) {
        const n = this.pending.readUInt32BE(0);
        if (n > MAX_FRAME) {
          sock.destroy();
          return;
        }
        if (this.pending.length < 4 + n) break;
        const body = this.pending.subarray(4, 4 + n);
        this.pending = this.pending.subarray(4 + n);
        let m: Msg | undefined;
        try {
          m = JSON.parse(body.toString('utf8')) as Msg;
        } catch {
          m = undefined;
        }
        if (m !== undefined && typeof m === 'object' && m !== null && typeof m.t === 'string') onMessage(m);
      }
    });
    let why = 'the connection closed';
    sock.on('error', (err) => {
      why = err.message;
    });
    sock.on('close', () => {
      this.closed = true;
      onClose(why);
    });
  }

  send(m: Msg): void {
    if (this.closed || this.sock.destroyed) return;
    const body = Buffer.from(JSON.stringify(m));
    const head = Buffer.allocUnsafe(4);
    head.writeUInt32BE(body.length, 0);
    this.sock.write(Buffer.concat([head, body]));
  }
}

interface Region {
  readonly bytes: Uint8Array;
  readonly addr: number;
  /** Registered with NIXL (empty regions are not). */
  readonly registered: boolean;
}

interface PendingExpect extends Pending<unknown> {
  readonly allowed: AllowedRanges;
  /** The sender's control connection and NIXL agent, once its `req` arrived. */
  sender?: Control;
  agent?: string;
  /** What the `req` announced. */
  announced?: { descriptors: number; bytes: number };
  descriptors: number;
  bytes: number;
}

interface PeerLink {
  readonly peer: string;
  readonly control: Control;
  /** Resolves with D's agent name once its hello arrived and its metadata is loaded. */
  readonly ready: Promise<void>;
  agent?: string;
  /** The version of D's metadata this agent holds. */
  version: number;
  connected: boolean;
  readonly requests: Set<string>;
}

interface PendingWrite extends PendingWriteBase<PeerLink> {
  readonly runs: TransferRun[];
  readonly notifyPayload: string | undefined;
  /** One part of the request (WriteOptions.partial): D keeps its expect pending after it. */
  readonly partial: boolean;
  /** The NIXL write request in flight. */
  xfer?: NixlHandle;
  /** The runs the request in flight covers (end index) and whether it is the last. */
  xferEnd: number;
}

/** `nixl://host:port` → [host, port], or undefined. */
function parseAddress(address: string): [string, number] | undefined {
  const m = /^nixl:\/\/(\[[^\]]+\]|[^:/]+):(\d+)$/.exec(address);
  if (m === null) return undefined;
  const port = Number(m[2]);
  return port > 0 && port < 65536 ? [(m[1] as string).replace(/^\[|\]$/g, ''), port] : undefined;
}

class NixlTransferEngine implements TransferEngine {
  private readonly regions = new Map<string, Region>();
  private readonly expects = new Map<string, PendingExpect>();
  private readonly tombstones = new Tombstones();
  private readonly links = new Map<string, PeerLink>();
  private readonly writes = new Map<string, PendingWrite>();
  private readonly accepted = new Set<Control>();
  /** The version of this agent's metadata (bumped by every (de)registration). */
  private version = 0;
  private polling: NodeJS.Timeout | NodeJS.Immediate | undefined;
  /** Poll at every event-loop turn until then (performance.now() ms). */
  private spinUntil = 0;
  private closed = false;
  /** Forgets this engine's exit hook (NIXL's and UCX's threads must stop before the process ends). */
  forgetAtExit: () => void = () => {};

  constructor(
    private readonly api: NixlApi,
    private readonly agent: NixlHandle,
    private readonly backend: NixlHandle,
    readonly agentName: string,
    private readonly server: net.Server,
    readonly address: string,
    private readonly hooks: NonNullable<NixlTransferEngineOptions['testHooks']>,
  ) {
    server.on('connection', (sock) => this.accept(sock));
  }

  get inflight(): number {
    return countInflight(this.expects, this.writes.keys());
  }

  registerRegions(regions: readonly MemoryRegion[]): void {
    if (this.closed) throw new Error(`registerRegions: the transfer engine at ${this.address} is closed`);
    for (const r of regions) {
      this.deregister(r.id);
      const registered = r.bytes.byteLength > 0;
      const addr = registered
        ? this.api.nixlRegister(this.agent, this.backend, r.bytes)
        : this.api.nixlAddress(r.bytes);
      this.regions.set(r.id, { bytes: r.bytes, addr, registered });
    }
    this.version++;
  }

  deregisterRegions(ids: readonly string[]): void {
    for (const id of ids) this.deregister(id);
    this.version++;
  }

  private deregister(id: string): void {
    const old = this.regions.get(id);
    if (old === undefined) return;
    this.regions.delete(id);
    if (old.registered && !this.closed)
      this.api.nixlDeregister(this.agent, this.backend, old.addr, old.bytes.byteLength);
  }

  // ---- D: the receiver ----

  expect(requestId: string, allowed: readonly RegionRange[], options: { timeoutMs: number }): Promise<unknown> {
    const refused = checkCall('expect', this.address, this.closed, requestId, options.timeoutMs);
    if (refused !== undefined) return Promise.reject(refused);
    if (this.expects.has(requestId)) return Promise.reject(alreadyPending('expect', requestId, this.address));
    const bad = checkAllowed(requestId, allowed, (id) => this.regions.get(id)?.bytes.byteLength);
    if (bad !== undefined) return Promise.reject(bad);
    this.tombstones.delete(requestId);
    const { done } = openPending<unknown, PendingExpect>(
      this.expects,
      requestId,
      options.timeoutMs,
      (base) => ({ ...base, allowed: new AllowedRanges(allowed), descriptors: 0, bytes: 0 }),
      (e) => {
        const applied = e.sender === undefined ? undefined : e;
        const err = expectTimeoutError(requestId, this.address, options.timeoutMs, applied);
        this.failExpect(e, err, `timed out at the receiver ${this.address}`);
      },
    );
    this.schedulePoll();
    return done;
  }

  private accept(sock: net.Socket): void {
    if (this.closed) {
      sock.destroy();
      return;
    }
    const control: Control = new Control(
      sock,
      (m) => this.onInbound(control, m),
      () => this.onSenderGone(control),
    );
    this.accepted.add(control);
    control.version = this.version;
    control.send({
      t: 'hello',
      agent: this.agentName,
      md: this.api.nixlLocalMetadata(this.agent).toString('base64'),
      v: this.version,
    });
  }

  private onInbound(control: Control, m: Msg): void {
    if (m.t === 'released') {
      control.releasing.get(m.req)?.();
      return;
    }
    if (m.t === 'abort') {
      const e = this.expects.get(m.req);
      if (e !== undefined && e.sender === control)
        this.failExpect(e, new PdError('abort', `request ${m.req} aborted by the sender: ${m.reason}`), undefined);
      return;
    }
    if (m.t !== 'req') return;
    const e = this.expects.get(m.req);
    if (e === undefined) {
      const message = this.tombstones.notExpected(m.req, this.address);
      control.send({ t: 'done', req: m.req, ok: false, code: 'abort', message });
      return;
    }
    // a request's parts come one after the other from one sender (WriteOptions.partial)
    if (e.sender !== undefined && (e.sender !== control || e.announced !== undefined)) {
      this.refuse(control, e, 'peer', `request ${e.requestId}: a second transfer request arrived`);
      return;
    }
    e.sender = control;
    e.agent = m.agent;
    const addrs: number[] = [];
    let descriptors = 0;
    let bytes = 0;
    for (const d of Array.isArray(m.d) ? m.d : []) {
      const [region, offset, length] = Array.isArray(d) ? d : [];
      const r = typeof region === 'string' ? this.regions.get(region) : undefined;
      let why: string | undefined;
      if (
        !Number.isSafeInteger(offset) ||
        !Number.isSafeInteger(length) ||
        (offset as number) < 0 ||
        (length as number) <= 0
      )
        why = 'not a valid range';
      else why = refusal(region as string, offset as number, length as number, r?.bytes.byteLength, e.allowed);
      if (why !== undefined) {
        this.refuse(control, e, 'layout', refusedMessage(e.requestId, [region, offset, length], this.address, why));
        return;
      }
      addrs.push((r as Region).addr + (offset as number));
      descriptors++;
      bytes += length as number;
    }
    if (!Array.isArray(m.d) || bytes !== m.bytes) {
      this.refuse(control, e, 'peer', `request ${e.requestId}: malformed transfer request`);
      return;
    }
    e.announced = { descriptors, bytes };
    if (descriptors === 0 && m.part === true) {
      e.announced = undefined; // an empty part: nothing to wait for
      control.send({ t: 'done', req: e.requestId, ok: true });
      return;
    }
    if (descriptors === 0) {
      // nothing to move: the request message carries the notification
      this.endExpect(e, 'already complete');
      control.send({ t: 'done', req: e.requestId, ok: true });
      e.resolve(m.payload);
      return;
    }
    const stale = control.version !== this.version;
    control.version = this.version;
    control.send({
      t: 'go',
      req: e.requestId,
      a: addrs,
      v: this.version,
      ...(stale ? { md: this.api.nixlLocalMetadata(this.agent).toString('base64') } : {}),
    });
    this.spinUntil = performance.now() + SPIN_MS;
    this.schedulePoll();
  }

  /** Applies NIXL notifications: `{req, seq, descriptors, bytes, last, payload}` (running totals). */
  private onNotification(agent: string, raw: Buffer): void {
    let n: { req?: unknown; descriptors?: unknown; bytes?: unknown; last?: unknown; payload?: unknown; part?: unknown };
    try {
      n = JSON.parse(raw.toString('utf8'));
    } catch {
      return;
    }
    if (typeof n.req !== 'string') return;
    const e = this.expects.get(n.req);
    if (e === undefined || e.agent !== agent || e.sender === undefined || e.announced === undefined) return;
    e.descriptors = Number(n.descriptors);
    e.bytes = Number(n.bytes);
    this.hooks.onApplied?.(e.requestId, { descriptors: e.descriptors, bytes: e.bytes });
    if (n.last !== true) return;
    if (e.descriptors !== e.announced.descriptors || e.bytes !== e.announced.bytes) {
      this.refuse(
        e.sender,
        e,
        'peer',
        `request ${e.requestId}: the sender announced ${e.announced.descriptors} descriptors / ` +
          `${e.announced.bytes} bytes, its notification ${e.descriptors} / ${e.bytes}`,
      );
      return;
    }
    e.sender.send({ t: 'done', req: e.requestId, ok: true });
    if (n.part === true) {
      // one part of the request landed: the sender's next `req` continues it, the expect stays pending
      e.announced = undefined;
      e.descriptors = 0;
      e.bytes = 0;
      return;
    }
    this.endExpect(e, 'already complete');
    e.resolve(n.payload);
  }

  private onSenderGone(control: Control): void {
    this.accepted.delete(control);
    for (const settle of [...control.releasing.values()]) settle();
    for (const e of [...this.expects.values()])
      if (e.sender === control)
        this.failExpect(
          e,
          new PdError(
            'peer',
            `request ${e.requestId}: the sender's connection to ${this.address} closed ` +
              `(${e.descriptors} descriptors, ${e.bytes} bytes applied; the sender may be dead)`,
          ),
          undefined,
        );
  }

  private refuse(control: Control, e: PendingExpect, code: 'layout' | 'peer', message: string): void {
    this.endExpect(e, `refused: ${message}`);
    control.send({ t: 'done', req: e.requestId, ok: false, code, message });
    e.reject(new PdError(code, message));
  }

  /**
   * Rejects a pending expect; `tell` (when given) is sent to its sender as an abort reason. When the sender was
   * told and its write may still be landing (D accepted the transfer, no final notification yet), the rejection
   * waits until the sender confirms it released the write, its connection closes, or {@link RELEASE_GRACE_MS}.
   */
  private failExpect(e: PendingExpect, err: PdError, tell: string | undefined): void {
    this.endExpect(e, err.message);
    const sender = e.sender;
    if (tell === undefined || sender === undefined) {
      e.reject(err);
      return;
    }
    sender.send({ t: 'abort', req: e.requestId, reason: tell });
    if (e.announced === undefined || sender.closed) {
      e.reject(err);
      return;
    }
    const settle = (): void => {
      clearTimeout(timer);
      sender.releasing.delete(e.requestId);
      e.reject(err);
    };
    const timer = setTimeout(settle, RELEASE_GRACE_MS);
    sender.releasing.set(e.requestId, settle);
  }

  private endExpect(e: PendingExpect, why: string): void {
    clearTimeout(e.timer);
    this.expects.delete(e.requestId);
    this.tombstones.set(e.requestId, why);
  }

  // ---- P: the sender ----

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
    if (this.writes.has(requestId)) return Promise.reject(alreadyPending('write', requestId, this.address));
    let runs: TransferRun[];
    let notifyPayload: string | undefined;
    try {
      ({ runs, notifyPayload } = prepareWrite(
        requestId,
        local,
        remote,
        notification,
        Number.MAX_SAFE_INTEGER,
        (id) => this.regions.get(id)?.bytes.byteLength,
      ));
    } catch (err) {
      return Promise.reject(err);
    }
    const target = parseAddress(peer);
    if (target === undefined)
      return Promise.reject(new PdError('peer', `write ${requestId}: ${peer} is not a nixl://host:port address`));
    const link = this.link(peer, target);
    const { record: w, done } = openPendingWrite<PeerLink, PendingWrite>(
      this.writes,
      requestId,
      peer,
      link,
      runs.length,
      options.timeoutMs,
      (base) => ({ ...base, runs, notifyPayload, partial: options.partial === true, xferEnd: 0 }),
      (w, err, tell) => this.failWrite(w, err, tell),
    );
    link.ready.then(
      () => {
        if (w.settled) return;
        link.control.send({
          t: 'req',
          req: requestId,
          agent: this.agentName,
          d: runs.map((r) => [r.remote.region, r.remote.offset, r.remote.length]),
          bytes: runs.reduce((s, r) => s + r.local.length, 0),
          // no runs: this message is the notification
          ...(runs.length === 0 ? { payload: notification } : {}),
          ...(options.partial === true ? { part: true } : {}),
        });
      },
      () => {},
    );
    return done;
  }

  private link(peer: string, [host, port]: [string, number]): PeerLink {
    const existing = this.links.get(peer);
    if (existing !== undefined) return existing;
    const sock = net.connect({ host, port });
    let ready!: { resolve: () => void; reject: (e: Error) => void };
    const readyPromise = new Promise<void>((resolve, reject) => {
      ready = { resolve, reject };
    });
    readyPromise.catch(() => {});
    const link: PeerLink = {
      peer,
      control: new Control(
        sock,
        (m) => {
          if (m.t === 'hello') {
            try {
              this.loadPeerMetadata(link, m.agent, m.md, m.v);
              ready.resolve();
            } catch (err) {
              this.linkFailed(link, `cannot load its NIXL metadata: ${(err as Error).message}`);
            }
          } else this.onReply(link, m);
        },
        (why) => this.linkFailed(link, why),
      ),
      ready: readyPromise,
      version: -1,
      connected: false,
      requests: new Set(),
    };
    sock.on('connect', () => {
      link.connected = true;
    });
    this.links.set(peer, link);
    return link;
  }

  private loadPeerMetadata(link: PeerLink, agent: string, md: string, version: number): void {
    if (link.agent !== undefined) this.api.nixlInvalidateRemote(this.agent, link.agent);
    link.agent = this.api.nixlLoadRemoteMetadata(this.agent, Buffer.from(md, 'base64'));
    if (link.agent !== agent) throw new Error(`the metadata names agent ${link.agent}, the peer said ${agent}`);
    link.version = version;
  }

  /** The link's connection closed or failed: its writes reject 'peer'; the next write connects anew. */
  private linkFailed(link: PeerLink, why: string): void {
    if (this.links.get(link.peer) === link) this.links.delete(link.peer);
    if (!link.control.sock.destroyed) link.control.sock.destroy();
    if (link.agent !== undefined && !this.closed) {
      try {
        this.api.nixlInvalidateRemote(this.agent, link.agent);
      } catch {
        // already forgotten
      }
    }
    for (const id of [...link.requests]) {
      const w = this.writes.get(id);
      if (w === undefined) continue;
      const err = link.connected
        ? new PdError(
            'peer',
            `request ${id}: peer ${link.peer} closed the connection (${w.stats.descriptors} of ${w.runs.length} ` +
              `descriptors sent; the peer may be dead): ${why}`,
          )
        : new PdError('peer', `request ${id}: peer ${link.peer} unreachable: ${why}`);
      this.failWrite(w, err, undefined);
    }
  }

  private onReply(link: PeerLink, m: Msg): void {
    if (m.t === 'hello' || m.t === 'released') return;
    const w = this.writes.get(m.req);
    if (m.t === 'abort') {
      if (w !== undefined && w.link === link)
        this.failWrite(w, new PdError('abort', `request ${m.req} aborted by the receiver ${link.peer}: ${m.reason}`));
      link.control.send({ t: 'released', req: m.req }); // nothing of the request is in flight from here any more
      return;
    }
    if (w === undefined || w.link !== link) return;
    if (m.t === 'done' && m.ok) {
      this.endWrite(w);
      w.resolve({ ...w.stats });
    } else if (m.t === 'done') {
      this.failWrite(w, new PdError(m.code, `request ${m.req}: refused by ${link.peer}: ${m.message}`));
    } else if (m.t === 'go') {
      try {
        if (m.md !== undefined && link.agent !== undefined) this.loadPeerMetadata(link, link.agent, m.md, m.v);
        if (m.v !== link.version) throw new Error(`its metadata version ${m.v} is not the one held (${link.version})`);
        if (!Array.isArray(m.a) || m.a.length !== w.runs.length) throw new Error('malformed go message');
        const pause = this.hooks.pauseAfterDescriptors;
        const end = pause === undefined ? w.runs.length : Math.min(pause, w.runs.length);
        if (end === 0)
          this.hooks.onPause?.(w.requestId); // the test hook paused before the first descriptor
        else this.post(w, m.a, end);
      } catch (err) {
        this.failWrite(
          w,
          new PdError('peer', `write ${w.requestId} to ${link.peer}: ${(err as Error).message}`),
          'failed',
        );
      }
    }
  }

  /** Posts one NIXL WRITE of runs [w.xferEnd, end) (all of them unless the pause hook cuts it). */
  private post(w: PendingWrite, remoteAddrs: readonly number[], end: number): void {
    const start = w.xferEnd;
    const n = end - start;
    const local = new Float64Array(2 * n);
    const far = new Float64Array(2 * n);
    let bytes = 0;
    for (let i = 0; i < n; i++) {
      const r = w.runs[start + i] as TransferRun;
      const region = this.regions.get(r.local.region);
      if (region === undefined) throw new Error(`local ${describeRange(r.local)} was deregistered`);
      local[2 * i] = region.addr + r.local.offset;
      local[2 * i + 1] = r.local.length;
      far[2 * i] = remoteAddrs[start + i] as number;
      far[2 * i + 1] = r.local.length;
      bytes += r.local.length;
    }
    const last = end === w.runs.length;
    const notif =
      `{"req":${JSON.stringify(w.requestId)},"seq":${w.stats.messages},"descriptors":${w.stats.descriptors + n},` +
      `"bytes":${w.stats.bytes + bytes},"last":${last}` +
      `${last && w.notifyPayload !== undefined ? `,"payload":${w.notifyPayload}` : ''}` +
      `${last && w.partial ? ',"part":true' : ''}}`;
    w.xfer = this.api.nixlPostWrite(this.agent, this.backend, w.link.agent as string, local, far, Buffer.from(notif));
    w.xferEnd = end;
    w.stats.messages++;
    w.stats.descriptors += n;
    w.stats.bytes += bytes;
    this.schedulePoll();
  }

  /** One poll: D's notifications, P's transfers in flight; reschedules itself while anything is pending. */
  private poll(): void {
    this.polling = undefined;
    if (this.closed) return;
    if (this.expects.size > 0) {
      let notifs: [string, Buffer][] = [];
      try {
        notifs = this.api.nixlGetNotifs(this.agent);
      } catch {
        // a failed poll is retried at the next tick
      }
      for (const [agent, msg] of notifs) this.onNotification(agent, msg);
    }
    for (const w of [...this.writes.values()]) {
      if (w.xfer === undefined || w.settled) continue;
      const status = this.api.nixlXferStatus(this.agent, w.xfer);
      if (status === 1) continue;
      this.releaseXfer(w);
      if (status < 0) {
        this.failWrite(
          w,
          new PdError('peer', `request ${w.requestId}: the NIXL write to ${w.link.peer} failed (status ${status})`),
          'the NIXL write failed',
        );
      } else if (w.xferEnd < w.runs.length) {
        this.hooks.onPause?.(w.requestId);
      }
    }
    this.schedulePoll();
  }

  private schedulePoll(): void {
    if (this.polling !== undefined || this.closed) return;
    let active = this.expects.size > 0;
    for (const w of this.writes.values()) if (w.xfer !== undefined) active = true;
    if (!active) return;
    this.polling =
      performance.now() < this.spinUntil ? setImmediate(() => this.poll()) : setTimeout(() => this.poll(), POLL_MS);
  }

  private releaseXfer(w: PendingWrite): void {
    const x = w.xfer;
    w.xfer = undefined;
    if (x === undefined || this.closed) return;
    try {
      this.api.nixlReleaseXfer(this.agent, x);
    } catch {
      // NIXL could not abort it; the request handle stays NIXL's until the agent is destroyed
    }
  }

  private failWrite(w: PendingWrite, err: PdError, tell?: string): void {
    if (w.settled) return;
    this.endWrite(w);
    if (tell !== undefined) w.link.control.send({ t: 'abort', req: w.requestId, reason: tell });
    w.reject(err);
  }

  private endWrite(w: PendingWrite): void {
    w.settled = true;
    clearTimeout(w.timer);
    this.releaseXfer(w);
    this.writes.delete(w.requestId);
    w.link.requests.delete(w.requestId);
  }

  abort(requestId: string, reason: string): void {
    const e = this.expects.get(requestId);
    if (e !== undefined) this.failExpect(e, abortedError(requestId, this.address, reason), reason);
    const w = this.writes.get(requestId);
    if (w !== undefined) this.failWrite(w, abortedError(requestId, this.address, reason), reason);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    for (const e of [...this.expects.values()]) {
      this.endExpect(e, 'the engine closed');
      e.reject(this.closedError(e.requestId));
    }
    for (const w of [...this.writes.values()]) {
      this.endWrite(w);
      w.reject(this.closedError(w.requestId));
    }
    this.closed = true;
    this.forgetAtExit();
    if (this.polling !== undefined) {
      clearTimeout(this.polling as NodeJS.Timeout);
      clearImmediate(this.polling as NodeJS.Immediate);
    }
    this.destroy();
  }

  /** Closes the sockets and frees the NIXL agent (synchronously; also at process exit). */
  destroy(): void {
    for (const link of this.links.values()) link.control.sock.destroy();
    this.links.clear();
    for (const c of this.accepted) c.sock.destroy();
    this.accepted.clear();
    this.server.close();
    for (const r of this.regions.values())
      if (r.registered) this.api.nixlDeregister(this.agent, this.backend, r.addr, r.bytes.byteLength);
    this.regions.clear();
    this.api.nixlDestroyBackend(this.backend);
    this.api.nixlDestroyAgent(this.agent);
  }

  private closedError(requestId: string): PdError {
    return closedError(requestId, this.address);
  }
}

/**
 * Creates a NIXL transfer engine: a NIXL agent (unique name) with a UCX backend, and its control socket bound on
 * `host:port` (default `127.0.0.1`, port 0; the engine's `address`, `nixl://host:port`, names the port bound).
 * @throws Error code `ERR_SPECD_NIXL_MISSING` when the library was not fetched (`npm run nixl:fetch`); an Error
 *   naming the C API call when NIXL or UCX cannot start; an Error naming the endpoint when the bind fails.
 */
export async function createNixlTransferEngine(options: NixlTransferEngineOptions = {}): Promise<TransferEngine> {
  const host = options.host ?? '127.0.0.1';
  const port = options.port ?? 0;
  checkTestHooks('createNixlTransferEngine', options.testHooks);
  const api = loadNixl();
  const name = `specd-${os.hostname()}-${process.pid}-${randomBytes(6).toString('hex')}`;
  const delay = options.progressDelayUs ?? DEFAULT_PROGRESS_DELAY_US;
  if (!Number.isSafeInteger(delay) || delay < 1 || delay > 1_000_000)
    throw new RangeError(`createNixlTransferEngine: progressDelayUs must be an integer in [1, 1e6], got ${delay}`);
  const agent = api.nixlCreateAgent(name, options.progressThread === true ? delay : 0);
  let backend: NixlHandle;
  const savedTls = process.env.UCX_TLS;
  try {
    if (options.ucxTls !== undefined) process.env.UCX_TLS = options.ucxTls;
    backend = api.nixlCreateBackend(agent, 'UCX');
  } catch (err) {
    api.nixlDestroyAgent(agent);
    throw new Error(`createNixlTransferEngine: cannot create the UCX backend: ${(err as Error).message}`);
  } finally {
    if (options.ucxTls !== undefined) {
      if (savedTls === undefined) delete process.env.UCX_TLS;
      else process.env.UCX_TLS = savedTls;
    }
  }
  const server = net.createServer();
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => {
        server.off('error', reject);
        resolve();
      });
    });
  } catch (err) {
    api.nixlDestroyBackend(backend);
    api.nixlDestroyAgent(agent);
    throw new Error(`createNixlTransferEngine: cannot bind ${host}:${port}: ${(err as Error).message}`);
  }
  const bound = (server.address() as net.AddressInfo).port;
  const shown = host.includes(':') ? `[${host}]` : host;
  const engine = new NixlTransferEngine(
    api,
    agent,
    backend,
    name,
    server,
    `nixl://${shown}:${bound}`,
    options.testHooks ?? {},
  );
  engine.forgetAtExit = closeAtExit(() => engine.destroy());
  return engine;
}
