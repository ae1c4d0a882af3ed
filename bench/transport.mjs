#!/usr/bin/env node
// The pipeline's stage transports (packages/core/src/pipeline): ZeroMQ (the default; the
// driver's synchronous ZmqChannel over a bridge thread, the peer's async serveZmq loop, ipc://) vs
// the FIFO pair (FifoChannel both ends), between this process (the driver) and a forked peer process
// (a stage's end that does no work).
//
//   npm run bench:transport          (root; run `npm run build` first; ~20 s)
//   node bench/transport.mjs --n 2000 --big 30 [--no-decode]
//
// Measured per transport, medians (and means for the small round trip):
//   small: round trip of a request (JSON header + 4 int32) and its echo;
//   4 MB up: the driver sends one 4 MB Float32Array frame, the peer answers a small ack;
//   4 MB down: the driver sends a small request, the peer answers one 4 MB frame.
// And how soon a driver blocked in receive() learns that its ZeroMQ peer died (PeerGoneError; the test suite
// checks that it does, packages/core/test/pipeline/zmq-channel.test.ts), median of 5.
// Then what it costs a real pipeline: plain greedy decode tokens/s of the shipped tiny target
// (models/kimi-k3-tiny) at pp = 1, 2, 3 (default split) per transport, 64 tokens, median of 4.
import { execFileSync, fork } from 'node:child_process';
import * as fs from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import {
  BUILTIN_PLUGIN_PACKAGES,
  FifoChannel,
  loadPipelineTarget,
  loadTarget,
  PeerGoneError,
  processAlive,
  SpecEngine,
  ZmqChannel,
} from '@specd/core';
import { median } from './stats.mjs';

const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const BIG = new Float32Array(1 << 20); // 4 MiB
for (let i = 0; i < BIG.length; i++) BIG[i] = i;

function answer(msg) {
  const t = msg.header.type;
  if (t === 'exit') return 'exit';
  if (t === 'die') process.kill(process.pid, 'SIGKILL'); // unanswered
  if (t === 'up') return { header: { type: 'ack' }, frames: [] };
  if (t === 'down') return { header: { type: 'big' }, frames: [BIG] };
  return msg;
}

if (argv[0] === '--peer') {
  const [, mode, a, b] = argv;
  if (mode === 'zmq') {
    const { serveZmq } = await import(new URL('../packages/core/dist/pipeline/zmq-stage.js', import.meta.url).href);
    await serveZmq(a, answer);
  } else {
    const writeFd = fs.openSync(b, 'w'); // as stage-worker.ts: the response FIFO first
    const ch = new FifoChannel(fs.openSync(a, 'r'), writeFd, 5);
    for (;;) {
      const r = answer(ch.receive());
      if (r === 'exit') break;
      ch.send(r);
    }
    ch.close();
  }
  process.exit(0);
}

const N = Number(arg('n', '2000'));
const NBIG = Number(arg('big', '30'));
const self = fileURLToPath(import.meta.url);
const tmp = fs.mkdtempSync(path.join(tmpdir(), 'specd-bench-transport-'));
const cell = new Int32Array(new SharedArrayBuffer(4));

function open(mode, name = 'peer') {
  if (mode === 'zmq') {
    let pid;
    const ch = ZmqChannel.bind(`ipc://${path.join(tmp, `${name}.zmq`)}`, { isPeerAlive: () => processAlive(pid) });
    const child = fork(self, ['--peer', 'zmq', ch.endpoint], { stdio: 'inherit' });
    pid = child.pid;
    ch.receive(); // the stage's hello
    return { ch, child };
  }
  const req = path.join(tmp, 'req');
  const resp = path.join(tmp, 'resp');
  execFileSync('mkfifo', [req, resp]);
  // the driver's ends non-blocking, as startPipeline opens them
  const readFd = fs.openSync(resp, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  const child = fork(self, ['--peer', 'fifo', req, resp], { stdio: 'inherit' });
  let writeFd;
  while (writeFd === undefined) {
    try {
      writeFd = fs.openSync(req, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK);
    } catch {
      Atomics.wait(cell, 0, 0, 2);
    }
  }
  return { ch: new FifoChannel(readFd, writeFd), child };
}

function time(ch, msg, n) {
  const ts = [];
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint();
    ch.send(msg);
    ch.receive();
    ts.push(Number(process.hrtime.bigint() - t0) / 1000);
  }
  return ts;
}

console.log(
  `load ${loadavg()
    .map((x) => x.toFixed(2))
    .join(' ')}; small n = ${N}, 4 MB n = ${NBIG}`,
);
console.log(
  '| transport | small round trip, median µs | mean µs | 4 MB driver ' +
    '→ stage (+ ack), median ms | 4 MB stage → driver, median ms |',
);
console.log('| --- | ---: | ---: | ---: | ---: |');
for (const mode of ['zmq', 'fifo']) {
  const { ch, child } = open(mode);
  const small = { header: { type: 'ping' }, frames: [new Int32Array([1, 2, 3, 4])] };
  time(ch, small, 200);
  const s = time(ch, small, N);
  const up = { header: { type: 'up' }, frames: [BIG] };
  time(ch, up, 3);
  const u = time(ch, up, NBIG);
  const down = { header: { type: 'down' }, frames: [] };
  time(ch, down, 3);
  const d = time(ch, down, NBIG);
  ch.send({ header: { type: 'exit' }, frames: [] });
  ch.close();
  await new Promise((resolve) => (child.exitCode !== null ? resolve() : child.once('exit', resolve)));
  fs.rmSync(path.join(tmp, 'req'), { force: true });
  fs.rmSync(path.join(tmp, 'resp'), { force: true });
  const mean = s.reduce((a, x) => a + x, 0) / s.length;
  console.log(
    `| ${mode} | ${median(s).toFixed(0)} | ${mean.toFixed(0)} | ` +
      `${(median(u) / 1000).toFixed(2)} | ${(median(d) / 1000).toFixed(2)} |`,
  );
}
const deathMs = [];
for (let rep = 0; rep < 5; rep++) {
  const { ch } = open('zmq', `dies${rep}`);
  ch.send({ header: { type: 'ping' }, frames: [] });
  ch.receive(); // connected
  const t0 = performance.now();
  ch.send({ header: { type: 'die' }, frames: [] });
  try {
    ch.receive();
    throw new Error('zmq: receive() returned after the peer was killed');
  } catch (err) {
    if (!(err instanceof PeerGoneError)) throw err;
  }
  deathMs.push(performance.now() - t0);
  ch.close();
}
console.log(
  '\nzmq: a peer killed while the driver waits in receive() is a PeerGoneError after ' +
    `${median(deathMs).toFixed(0)} ms (median of 5)`,
);
fs.rmSync(tmp, { recursive: true, force: true });

if (!argv.includes('--no-decode')) {
  const TARGET = fileURLToPath(new URL('../models/kimi-k3-tiny', import.meta.url));
  const NEW = 64;
  const decode = async (pp, transport) => {
    const t =
      pp === 1
        ? await loadTarget(TARGET, BUILTIN_PLUGIN_PACKAGES)
        : await loadPipelineTarget(TARGET, BUILTIN_PLUGIN_PACKAGES, { pp, transport });
    const promptIds = t.tokenizer.encode('The history of the city begins with', { addSpecialTokens: false });
    const ts = [];
    for (let rep = 0; rep < 4; rep++) {
      const engine = new SpecEngine(t.model, undefined, {
        maxSequences: 1,
        maxTokensPerSequence: 256,
        draftPolicy: 'max',
        prefillChunk: 64,
      });
      const t0 = performance.now();
      engine.run([{ id: 'r', promptIds, maxTokens: NEW, sampling: { temperature: 0 }, seed: 1, ignoreEos: true }]);
      ts.push(performance.now() - t0);
    }
    t.model.dispose();
    return NEW / (median(ts) / 1000);
  };
  const one = await decode(1);
  console.log(`\nkimi-k3-tiny, plain greedy, ${NEW} tokens (median of 4): pp 1 ${one.toFixed(0)} tok/s`);
  console.log('| pp | zmq tok/s | fifo tok/s | zmq ms per stage hop | fifo ms per stage hop |');
  console.log('| ---: | ---: | ---: | ---: | ---: |');
  for (const pp of [2, 3]) {
    const z = await decode(pp, 'zmq');
    const f = await decode(pp, 'fifo');
    const hop = (r) => ((1000 / r - 1000 / one) / (pp - 1)).toFixed(2);
    console.log(`| ${pp} | ${z.toFixed(0)} | ${f.toFixed(0)} | ${hop(z)} | ${hop(f)} |`);
  }
}
