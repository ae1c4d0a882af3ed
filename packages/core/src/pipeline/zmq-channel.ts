/**
 * The driver's end of the ZeroMQ stage transport (stage processes connected by ZeroMQ):
 * a **synchronous** {@link SyncChannel} over a ZeroMQ PAIR socket. zeromq v6's Node API is
 * promise-only while {@link StageModel.forward} must block, so the socket lives in a bridge worker
 * thread (zmq-bridge.ts, one per process) and the caller blocks with `Atomics.wait`:
 *
 * - `send(msg)` encodes the message into a fresh `ArrayBuffer` ({@link encodeMessage}: the one copy),
 *   transfers it to the bridge (no copy) and returns; the bridge sends messages in order. Like a pipe
 *   write, returning means "handed over"; a peer already known gone throws {@link PeerGoneError}.
 * - `receive()` blocks until the bridge has a whole message: the bridge copies it once out of
 *   ZeroMQ's buffer into a fresh `ArrayBuffer`, transfers it, bumps a shared counter and notifies;
 *   the caller, woken from `Atomics.wait`, takes it with `receiveMessageOnPort` and returns frames as
 *   views of that buffer ({@link decodeMessage}).
 *
 * The stage's end needs no bridge: a stage process is a receive → compute → send loop, so it uses
 * zeromq's promises on its own event loop (zmq-stage.ts).
 *
 * Topology: PAIR, 1:1; the driver **binds** (an `ipc://` path in the pipeline's temp dir), the stage
 * connects. Peer death: ZeroMQ hides it (it would wait for a reconnect), so `receive()` polls
 * `isPeerAlive` (the stage process's liveness, {@link processAlive}: works while the driver's event
 * loop is blocked) every `pollMs`; a reply already in flight gets one more interval. `close()` hands
 * queued sends over (the socket lingers at most `lingerMs` to deliver them) and closes the socket;
 * the bridge thread stays, unref'd (it never keeps the process alive).
 */

import * as fs from 'node:fs';
import { MessageChannel, receiveMessageOnPort, Worker, type MessagePort } from 'node:worker_threads';

import { decodeMessage, encodeMessage, PeerGoneError, type Message, type SyncChannel } from './transport.js';
import type { BridgeData } from './zmq-bridge.js';

/** The compiled bridge worker (next to this file in dist/). */
export const ZMQ_BRIDGE_SCRIPT = new URL('./zmq-bridge.js', import.meta.url);

export interface ZmqChannelOptions {
  /** Polled every `pollMs` while `receive()` waits; returning false ends the wait with {@link PeerGoneError}. */
  readonly isPeerAlive?: () => boolean;
  /** How often `isPeerAlive` is polled (ms, default 20). */
  readonly pollMs?: number;
  /** How long queued messages may still be delivered after `close()` (ms, default 200). */
  readonly lingerMs?: number;
  /** How long opening waits for the bridge to bind / connect (ms, default 10 000). */
  readonly readyTimeoutMs?: number;
}

type BridgeEvent = ArrayBuffer | { t: 'ready'; endpoint: string } | { t: 'error'; message: string } | { t: 'closed' };

/**
 * Whether process `pid` is alive — usable while the event loop is blocked (reads `/proc/<pid>/stat`
 * on Linux, so an unreaped zombie counts as dead; elsewhere `kill(pid, 0)`).
 */
export function processAlive(pid: number | undefined): boolean {
  if (pid === undefined) return false;
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    return state !== 'Z' && state !== 'X';
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT' && fs.existsSync('/proc/self/stat')) return false;
  }
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/**
 * The process's one bridge thread: created on first use and never ended (see zmq-bridge.ts), unref'd,
 * so it never keeps the process alive by itself. Channels still open when the process exits are
 * closed in an `exit` handler, while the bridge thread still runs: a zeromq.js socket left open
 * when its thread is torn down aborts the process ("terminate called after throwing an instance of
 * 'Napi::Error'", SIGABRT — test/pipeline/zmq-channel.test.ts).
 */
let bridge: Worker | undefined;
let bridgeFailure: string | undefined;
const openChannels = new Set<ZmqChannel>();
function bridgeWorker(): Worker {
  if (bridge === undefined) {
    process.on('exit', () => {
      for (const ch of [...openChannels]) ch.close();
    });
    bridge = new Worker(ZMQ_BRIDGE_SCRIPT, { execArgv: [], stdout: false, stderr: false });
    bridge.unref();
    bridge.on('error', (err) => {
      bridgeFailure ??= `zmq bridge thread failed: ${err.message}`;
    });
    bridge.on('exit', (code) => {
      bridgeFailure ??= `zmq bridge thread exited (code ${code})`;
    });
  }
  return bridge;
}

/** A {@link SyncChannel} over a ZeroMQ PAIR socket owned by the process's bridge worker thread. */
export class ZmqChannel implements SyncChannel {
  /** The endpoint bound / connected (for a `tcp://…:*` bind, with the port chosen). */
  readonly endpoint: string;
  private readonly ctl: Int32Array;
  private readonly toBridge: MessagePort;
  private readonly fromBridge: MessagePort;
  private readonly inbox: ArrayBuffer[] = [];
  private error: string | undefined;
  private gone: string | undefined;
  private bridgeClosed = false;
  private closed = false;
  private readonly pollMs: number;
  private readonly lingerMs: number;

  /** Binds `endpoint` (`ipc:///path` or `tcp://host:port`) and blocks until bound. The driver's end. */
  static bind(endpoint: string, options: ZmqChannelOptions = {}): ZmqChannel {
    return new ZmqChannel(endpoint, 'bind', options);
  }

  /** Connects to `endpoint` (ZeroMQ retries until the binder is there). */
  static connect(endpoint: string, options: ZmqChannelOptions = {}): ZmqChannel {
    return new ZmqChannel(endpoint, 'connect', options);
  }

  constructor(
    endpoint: string,
    mode: 'bind' | 'connect',
    private readonly options: ZmqChannelOptions = {},
  ) {
    this.pollMs = options.pollMs ?? 20;
    this.lingerMs = options.lingerMs ?? 200;
    const sab = new SharedArrayBuffer(4);
    this.ctl = new Int32Array(sab);
    const a = new MessageChannel();
    const b = new MessageChannel();
    this.toBridge = a.port1;
    this.fromBridge = b.port1;
    openChannels.add(this);
    const data: BridgeData = {
      ctl: sab,
      toBridge: a.port2,
      toCaller: b.port2,
      endpoint,
      mode,
      lingerMs: this.lingerMs,
    };
    bridgeWorker().postMessage({ t: 'open', data }, [a.port2, b.port2]);
    // wait (synchronously) for 'ready'
    const timeout = options.readyTimeoutMs ?? 10_000;
    const deadline = Date.now() + timeout;
    let ready: string | undefined;
    for (;;) {
      const seq = Atomics.load(this.ctl, 0);
      for (let ev = this.take(); ev !== undefined; ev = this.take()) {
        if (ev instanceof ArrayBuffer) this.inbox.push(ev);
        else if (ev.t === 'ready') ready = ev.endpoint;
        else this.apply(ev);
      }
      if (ready !== undefined) break;
      const failed =
        this.error ??
        bridgeFailure ??
        (Date.now() > deadline
          ? `zmq channel: the bridge did not ${mode} ${endpoint} within ${timeout} ms`
          : undefined);
      if (failed !== undefined) {
        this.close();
        throw new Error(failed);
      }
      Atomics.wait(this.ctl, 0, seq, 50);
    }
    this.endpoint = ready;
  }

  send(msg: Message): void {
    this.drain();
    this.check();
    const ab = encodeMessage(msg);
    this.toBridge.postMessage(ab, [ab]);
  }

  receive(): Message {
    let deadAt: number | undefined;
    for (;;) {
      const seq = Atomics.load(this.ctl, 0);
      this.drain();
      const ab = this.inbox.shift();
      if (ab !== undefined) return decodeMessage(new Uint8Array(ab));
      this.check();
      if (deadAt !== undefined && Date.now() - deadAt > this.pollMs) {
        this.gone = 'the peer process is not alive';
        this.check();
      }
      if (Atomics.wait(this.ctl, 0, seq, this.pollMs) === 'timed-out' && deadAt === undefined) {
        if (bridgeFailure !== undefined) this.error ??= bridgeFailure;
        // the peer's liveness: a reply still in flight gets one more poll interval
        if (this.options.isPeerAlive !== undefined && !this.options.isPeerAlive()) deadAt = Date.now();
      }
    }
  }

  /** Closes the socket (queued sends linger at most `lingerMs`); blocks until the bridge has closed it (bounded). */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    openChannels.delete(this);
    this.toBridge.postMessage({ t: 'close' });
    const deadline = Date.now() + this.lingerMs + 2000;
    while (!this.bridgeClosed && bridgeFailure === undefined && Date.now() < deadline) {
      const seq = Atomics.load(this.ctl, 0);
      this.drain();
      if (this.bridgeClosed) break;
      Atomics.wait(this.ctl, 0, seq, 50);
    }
    this.toBridge.close();
    this.fromBridge.close();
    this.inbox.length = 0;
  }

  private take(): BridgeEvent | undefined {
    return receiveMessageOnPort(this.fromBridge)?.message as BridgeEvent | undefined;
  }

  private drain(): void {
    for (let ev = this.take(); ev !== undefined; ev = this.take()) {
      if (ev instanceof ArrayBuffer) this.inbox.push(ev);
      else this.apply(ev);
    }
  }

  private apply(ev: Exclude<BridgeEvent, ArrayBuffer>): void {
    if (ev.t === 'error') this.error ??= ev.message;
    else if (ev.t === 'closed') this.bridgeClosed = true;
  }

  private check(): void {
    if (this.closed) throw new PeerGoneError('channel closed');
    if (this.gone !== undefined) throw new PeerGoneError(`peer closed the channel (${this.gone})`);
    if (this.error !== undefined) throw new Error(this.error);
  }
}
