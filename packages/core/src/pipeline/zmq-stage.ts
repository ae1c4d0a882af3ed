/**
 * The stage's end of the ZeroMQ stage transport: a receive → handle → send loop over a PAIR socket
 * connected to the driver's ({@link ZmqChannel}), on the stage process's own event loop (zeromq's
 * promises; no bridge thread). Messages are {@link encodeMessage}'s; frames arrive as views of
 * ZeroMQ's receive buffer (valid while the handler runs; the handler's reply is encoded before the
 * next receive).
 *
 * The first message is the stage's `hello` (`{type: 'hello', pid}`): ZeroMQ connects in the
 * background and retries, so the driver waits for it to know the connection exists (after which the
 * `ipc://` socket file may go; before, a connect still pending would retry a deleted path forever).
 *
 * The loop ends (the promise resolves, the socket closed) when the handler returns `'exit'`; the
 * caller then exits the process. The driver's death is not visible on a PAIR socket (ZeroMQ waits for
 * a reconnect): the stage process watches its IPC channel to the driver instead (stage-worker.ts).
 * The socket's linger is bounded so that process exit never waits long for a driver that is gone.
 */

import * as zmq from 'zeromq';

import { decodeMessage, encodeMessage, type Message } from './transport.js';

/**
 * Serves `endpoint` until `handle` returns `'exit'`. Requests are handled one at a time; a handler may answer
 * with a promise (its work then runs on this event loop, as does anything it started between requests).
 */
export async function serveZmq(
  endpoint: string,
  handle: (msg: Message) => Message | 'exit' | Promise<Message | 'exit'>,
  lingerMs = 200,
): Promise<void> {
  const sock = new zmq.Pair({ linger: lingerMs });
  sock.connect(endpoint);
  try {
    await sock.send(Buffer.from(encodeMessage({ header: { type: 'hello', pid: process.pid }, frames: [] })));
    for (;;) {
      const parts = await sock.receive();
      // never shared memory
      const bytes = (parts.length === 1 ? parts[0]! : Buffer.concat(parts)) as Uint8Array<ArrayBuffer>;
      const reply = await handle(decodeMessage(bytes));
      if (reply === 'exit') return;
      await sock.send(Buffer.from(encodeMessage(reply)));
    }
  } finally {
    sock.close();
  }
}
