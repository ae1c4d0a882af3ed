/**
 * The bridge worker thread of {@link ZmqChannel} (`dist/pipeline/zmq-bridge.js`): it owns the driver's
 * ZeroMQ PAIR sockets, whose Node API (zeromq v6) is promise-only, so that the driver's thread can
 * block synchronously (zmq-channel.ts has the protocol). Per channel:
 *
 * - caller → bridge, on `toBridge`: an `ArrayBuffer` (one encoded message, transferred: no copy), or
 *   `{ t: 'close' }`. Messages are sent in order.
 * - bridge → caller, on `toCaller`: `{ t: 'ready', endpoint }` (for a `tcp://…:*` bind, the port chosen), an
 *   `ArrayBuffer` (a received message, copied once out of ZeroMQ's buffer, transferred), `{ t: 'error', message }`,
 *   `{ t: 'closed' }`. After each
 *   post the bridge bumps `ctl[0]` and notifies it (the caller waits on it with `Atomics.wait` and
 *   reads the port with `receiveMessageOnPort`).
 *
 * One bridge thread per process hosts every channel of that process and is never ended (zeromq.js
 * sockets created in a new worker thread after an earlier worker's sockets closed stopped delivering
 * messages — branch wip/zmq-transport), and it uses no socket monitor (closing a zeromq.js event
 * observer broke the thread's later sockets; one left open aborts the process when the thread is torn
 * down). Peer death is the caller's business (process liveness, zmq-channel.ts). Every socket has a
 * bounded linger, so the ZeroMQ context's termination when the thread ends (process exit) never
 * waits long for a peer that is gone.
 */

import { parentPort, type MessagePort } from 'node:worker_threads';

// loaded here, not at module level of the driver: only a process that opens a channel needs the addon
let zmq: typeof import('zeromq') | undefined;
let loadError: string | undefined;
try {
  zmq = await import('zeromq');
} catch (err) {
  loadError =
    `cannot load the zeromq package (${(err as Error).message}); ` +
    'set parallelism.transport to "fifo" or see README, "Libraries we chose"';
}

/** What {@link ZmqChannel} passes to the bridge with `open`. @internal */
export interface BridgeData {
  readonly ctl: SharedArrayBuffer;
  readonly toBridge: MessagePort;
  readonly toCaller: MessagePort;
  readonly endpoint: string;
  readonly mode: 'bind' | 'connect';
  /** Socket linger on close (ms): how long queued messages may still be delivered. */
  readonly lingerMs: number;
}

function openChannel(data: BridgeData): void {
  const ctl = new Int32Array(data.ctl);
  const { toBridge, toCaller } = data;
  let ended = false;
  function post(msg: unknown, transfer: ArrayBuffer[] = []): void {
    if (ended) return;
    toCaller.postMessage(msg, transfer);
    Atomics.add(ctl, 0, 1);
    Atomics.notify(ctl, 0);
  }

  if (zmq === undefined) {
    post({ t: 'error', message: loadError! });
    ended = true;
    toBridge.close();
    toCaller.close();
    return;
  }
  const sock = new zmq.Pair({ linger: data.lingerMs });
  let closing = false;
  function end(): void {
    if (closing) return;
    closing = true;
    if (!sock.closed) sock.close();
    post({ t: 'closed' });
    ended = true;
    toBridge.close();
    toCaller.close();
  }

  async function receiveLoop(): Promise<void> {
    for (;;) {
      let parts: Buffer[];
      try {
        parts = await sock.receive();
      } catch (err) {
        if (!closing) post({ t: 'error', message: `zmq receive: ${(err as Error).message}` });
        return;
      }
      const n = parts.reduce((a, p) => a + p.length, 0);
      const ab = new ArrayBuffer(n);
      const u8 = new Uint8Array(ab);
      let at = 0;
      for (const p of parts) {
        u8.set(p, at);
        at += p.length;
      }
      post(ab, [ab]);
    }
  }

  // sends in order; a send waits while the peer is not (yet) connected
  let sending: Promise<void> = Promise.resolve();
  toBridge.on('message', (m: ArrayBuffer | { t: 'close' }) => {
    if (m instanceof ArrayBuffer) {
      const buf = Buffer.from(m);
      sending = sending.then(async () => {
        if (closing) return;
        try {
          await sock.send(buf);
        } catch (err) {
          if (!closing) post({ t: 'error', message: `zmq send: ${(err as Error).message}` });
        }
      });
      return;
    }
    if (m.t === 'close') {
      // hand the queued sends to ZeroMQ first (bounded: a PAIR send waits for a peer that may be gone);
      // the socket's linger then bounds their delivery
      const timer = new Promise<void>((resolve) => setTimeout(resolve, data.lingerMs));
      void Promise.race([sending, timer]).then(end);
    }
  });

  try {
    if (data.mode === 'bind') {
      // (zeromq.js refuses a receive while a bind is in progress)
      sock.bind(data.endpoint).then(
        () => {
          post({ t: 'ready', endpoint: sock.lastEndpoint ?? data.endpoint });
          void receiveLoop();
        },
        (err: Error) => {
          post({ t: 'error', message: `zmq bind ${data.endpoint}: ${err.message}` });
        },
      );
    } else {
      sock.connect(data.endpoint);
      post({ t: 'ready', endpoint: data.endpoint });
      void receiveLoop();
    }
  } catch (err) {
    post({ t: 'error', message: `zmq ${data.mode} ${data.endpoint}: ${(err as Error).message}` });
  }
}

parentPort!.on('message', (m: { t: 'open'; data: BridgeData }) => {
  if (m.t === 'open') openChannel(m.data);
});
