// The ZeroMQ stage transport: the driver's synchronous ZmqChannel (a PAIR socket owned by a
// bridge worker thread) against the stage's asynchronous serveZmq loop in a forked echo peer
// (fixtures/echo-stage.mjs). Runs against dist/ (`npm run build:ts`).
import { execFileSync, fork, spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, describe, expect, it } from 'vitest';

import {
  decodeMessage,
  encodeMessage,
  FifoChannel,
  PeerGoneError,
  type Message,
  type SyncChannel,
} from '../../dist/pipeline/transport.js';
import { processAlive, ZmqChannel } from '../../dist/pipeline/zmq-channel.js';

const ECHO = path.join(path.dirname(fileURLToPath(import.meta.url)), 'fixtures/echo-stage.mjs');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-zmq-test-'));
const children: ChildProcess[] = [];

afterAll(() => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  fs.rmSync(tmp, { recursive: true, force: true });
});

function exited(child: ChildProcess, ms: number): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  return new Promise((resolve, reject) => {
    if (child.exitCode !== null || child.signalCode !== null)
      return resolve({ code: child.exitCode, signal: child.signalCode });
    const t = setTimeout(() => reject(new Error(`child ${child.pid} still running after ${ms} ms`)), ms);
    child.once('exit', (code, signal) => {
      clearTimeout(t);
      resolve({ code, signal });
    });
  });
}

let seq = 0;
function zmqEcho(): { ch: ZmqChannel; child: ChildProcess } {
  let pid: number | undefined;
  const ch = ZmqChannel.bind(`ipc://${path.join(tmp, `echo${seq++}.zmq`)}`, { isPeerAlive: () => processAlive(pid) });
  const child = fork(ECHO, ['zmq', ch.endpoint], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  pid = child.pid;
  children.push(child);
  child.disconnect(); // only its socket may keep it alive
  expect(ch.receive().header).toEqual({ type: 'hello', pid: child.pid, frames: [] }); // serveZmq's first message
  return { ch, child };
}

function fifoEcho(): { ch: FifoChannel; child: ChildProcess } {
  const req = path.join(tmp, `req${seq}`);
  const resp = path.join(tmp, `resp${seq++}`);
  execFileSync('mkfifo', [req, resp]);
  const readFd = fs.openSync(resp, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  const child = fork(ECHO, ['fifo', req, resp], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  children.push(child);
  child.disconnect();
  let writeFd: number | undefined;
  const deadline = Date.now() + 10_000;
  const cell = new Int32Array(new SharedArrayBuffer(4));
  while (writeFd === undefined) {
    try {
      writeFd = fs.openSync(req, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENXIO' || Date.now() > deadline) throw err;
      Atomics.wait(cell, 0, 0, 2);
    }
  }
  return { ch: new FifoChannel(readFd, writeFd, 1), child };
}

/** Sends `n` small requests one at a time; returns the `k` of each echo, in the order received. */
function roundTrips(ch: SyncChannel, n: number): number[] {
  const frames = [new Int32Array([1, 2, 3, 4])];
  const ks: number[] = [];
  for (let i = 0; i < n; i++) {
    ch.send({ header: { type: 'ping', k: i }, frames });
    const r = ch.receive();
    expect(Array.from(r.frames[0] ?? [])).toEqual([1, 2, 3, 4]);
    ks.push(r.header.k as number);
  }
  return ks;
}

describe('ZeroMQ stage transport', () => {
  it('one buffer per message, frames 4-byte aligned; decoding gives views (or aligned copies)', () => {
    const ab = encodeMessage({
      header: { type: 'x', s: 'é' },
      frames: [new Float32Array([1.5, -2]), new Int32Array([7])],
    });
    const n = new DataView(ab).getUint32(0, true);
    expect((4 + n) % 4).toBe(0);
    const m = decodeMessage(new Uint8Array(ab));
    expect(m.header).toMatchObject({
      type: 'x',
      s: 'é',
      frames: [
        { dtype: 'f32', length: 2 },
        { dtype: 'i32', length: 1 },
      ],
    });
    expect(m.frames[0]!.buffer).toBe(ab);
    expect(Array.from(m.frames[0]!)).toEqual([1.5, -2]);
    expect(m.frames[1]).toBeInstanceOf(Int32Array);
    expect(Array.from(m.frames[1]!)).toEqual([7]);
    // the same bytes at an odd offset: frames are copied, still right
    const odd = new Uint8Array(ab.byteLength + 1);
    odd.set(new Uint8Array(ab), 1);
    expect(Array.from(decodeMessage(odd.subarray(1)).frames[0]!)).toEqual([1.5, -2]);
    expect(() => decodeMessage(new Uint8Array(ab, 0, ab.byteLength - 1))).toThrow(/truncated/);
  });

  it(
    'round-trips headers and Float32/Int32 frames (0, 1, 1e6 ' +
      'elements) intact and in order; the peer exits on `exit`',
    async () => {
      const { ch, child } = zmqEcho();
      const big = new Float32Array(1_000_000);
      for (let i = 0; i < big.length; i++) big[i] = Math.sin(i) * 1e3;
      const ints = new Int32Array(1_000_000);
      for (let i = 0; i < ints.length; i++) ints[i] = (i * 2654435761) | 0;
      const sent: Message[] = [
        { header: { type: 'echo', i: 0 }, frames: [] },
        {
          header: { type: 'echo', i: 1, nested: { a: [1, 2], s: 'ünïcode' } },
          frames: [new Float32Array(0), new Int32Array(0)],
        },
        { header: { type: 'echo', i: 2 }, frames: [new Float32Array([Math.PI]), new Int32Array([-5])] },
        { header: { type: 'echo', i: 3 }, frames: [big, new Int32Array([1, 2, 3]), ints] },
        { header: { type: 'echo', i: 4 }, frames: [big.subarray(3, 10)] }, // a view at an offset
      ];
      for (const m of sent) ch.send(m); // all sent before any is read: order must hold
      for (const m of sent) {
        const r = ch.receive();
        expect(r.header).toMatchObject(m.header);
        expect(r.frames.length).toBe(m.frames.length);
        r.frames.forEach((f, k) => {
          const want = m.frames[k]!;
          expect(f.constructor).toBe(want.constructor);
          expect(
            Buffer.from(f.buffer, f.byteOffset, f.byteLength).equals(
              Buffer.from(want.buffer, want.byteOffset, want.byteLength),
            ),
          ).toBe(true);
        });
      }
      ch.send({ header: { type: 'exit' }, frames: [] });
      ch.close();
      expect(await exited(child, 5000)).toEqual({ code: 0, signal: null });
    },
  );

  it('after the hello, the ipc:// socket file may go (startPipeline removes its temp dir)', async () => {
    const { ch, child } = zmqEcho();
    fs.rmSync(ch.endpoint.slice('ipc://'.length));
    ch.send({ header: { type: 'echo', n: 1 }, frames: [new Float32Array([3])] });
    expect(ch.receive().frames[0]![0]).toBe(3);
    ch.send({ header: { type: 'exit' }, frames: [] });
    ch.close();
    expect(await exited(child, 5000)).toEqual({ code: 0, signal: null });
  });

  it('channels opened one after another in one process all deliver (the bridge thread is shared)', async () => {
    for (let i = 0; i < 4; i++) {
      const { ch, child } = zmqEcho();
      ch.send({ header: { type: 'echo', i }, frames: [new Int32Array([i])] });
      expect(ch.receive().header.i).toBe(i);
      ch.send({ header: { type: 'exit' }, frames: [] });
      ch.close();
      expect(await exited(child, 5000)).toEqual({ code: 0, signal: null });
    }
  });

  // Their timings (zmq vs fifo, small and 4 MB messages): `npm run bench:transport`.
  it('small round trips: zmq and fifo each echo 500 requests in order', async () => {
    const want = Array.from({ length: 500 }, (_, i) => i);
    const z = zmqEcho();
    expect(roundTrips(z.ch, 500)).toEqual(want);
    z.ch.send({ header: { type: 'exit' }, frames: [] });
    z.ch.close();
    const f = fifoEcho();
    expect(roundTrips(f.ch, 500)).toEqual(want);
    f.ch.send({ header: { type: 'exit' }, frames: [] });
    f.ch.close();
    await Promise.all([exited(z.child, 5000), exited(f.child, 5000)]);
  });

  // How soon (about one pollMs): `npm run bench:transport`.
  it('a peer killed while the driver is blocked in receive() is a PeerGoneError', async () => {
    const { ch, child } = zmqEcho();
    ch.send({ header: { type: 'echo' }, frames: [] });
    ch.receive(); // connected
    ch.send({ header: { type: 'die' }, frames: [] }); // SIGKILLs itself, no answer
    expect(() => ch.receive()).toThrow(PeerGoneError);
    expect(() => ch.send({ header: {}, frames: [] })).toThrow(PeerGoneError);
    ch.close();
    expect((await exited(child, 5000)).signal).toBe('SIGKILL');
  });

  it('a peer that never connected and is killed by another process: receive() ends with PeerGoneError', () => {
    const child = fork(ECHO, ['zmq', `ipc://${path.join(tmp, 'nobody.zmq')}`], {
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    children.push(child);
    const ch = ZmqChannel.bind(`ipc://${path.join(tmp, 'lonely.zmq')}`, {
      isPeerAlive: () => processAlive(child.pid),
      pollMs: 20,
    });
    spawn('sh', ['-c', `sleep 0.3; kill -9 ${child.pid}`], { stdio: 'ignore' });
    expect(() => ch.receive()).toThrow(PeerGoneError);
    ch.close();
  });

  it.each([
    { how: 'closing them', extra: [] },
    { how: 'leaving them open', extra: ['noclose'] },
  ])('a driver process (3 channels in a row, $how) exits by itself', async ({ extra }) => {
    const dir = fs.mkdtempSync(path.join(tmp, 'd'));
    const child = fork(ECHO, ['driver', dir, ...extra], { stdio: ['ignore', 'pipe', 'inherit', 'ipc'] });
    children.push(child);
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    child.disconnect();
    expect(await exited(child, 10_000)).toEqual({ code: 0, signal: null });
    expect(out).toContain('driver ok');
  });
});
