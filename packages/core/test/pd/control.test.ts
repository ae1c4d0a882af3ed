// The control plane's answer to a malformed message (pd/control.ts): a hello or a layout that fails validation is
// answered at once — hello-refused naming the field, or an abort of the layout's room — so the decode instance fails
// now instead of at its bootstrap timeout; a well-formed message still reaches the handler afterwards.
import * as zmq from 'zeromq';
import { afterEach, describe, expect, it } from 'vitest';

import { type ControlMessage, ControlServer } from '../../src/pd/control.js';

let server: ControlServer | undefined;
let dealer: zmq.Dealer | undefined;
afterEach(() => {
  server?.close();
  dealer?.close();
});

async function connect(onMessage: (m: ControlMessage) => void) {
  server = new ControlServer((_peer, m) => onMessage(m));
  const address = await server.bind('127.0.0.1', 0);
  dealer = new zmq.Dealer({ linger: 0 });
  dealer.connect(address);
  const d = dealer;
  return {
    send: (body: unknown) => d.send([Buffer.from(JSON.stringify(body))]),
    next: async () => {
      const [frame] = await d.receive();
      return JSON.parse(frame!.toString('utf8')) as Record<string, unknown>;
    },
  };
}

describe('ControlServer and malformed messages', () => {
  it('answers a hello without a digest with hello-refused naming the field', async () => {
    const got: ControlMessage[] = [];
    const c = await connect((m) => got.push(m));
    await c.send({ type: 'hello' });
    expect(await c.next()).toEqual({
      type: 'hello-refused',
      message: 'control plane: hello: digest: expected an object',
    });
    expect(got).toEqual([]);
  });

  it('answers a layout with bad entries with an abort of its room; a good message still gets through', async () => {
    const got: ControlMessage[] = [];
    const c = await connect((m) => got.push(m));
    await c.send({ type: 'layout', room: '17', requestId: 'x', agent: 'tcp://127.0.0.1:1', entries: [{}] });
    expect(await c.next()).toEqual({
      type: 'abort',
      room: '17',
      reason: 'control plane: layout: entries: expected [{key: {kind, layer, part, rank}, ranges}]',
    });
    await c.send({ type: 'abort', room: '17', reason: 'done' });
    await expect.poll(() => got).toEqual([{ type: 'abort', room: '17', reason: 'done' }]);
  });
});
