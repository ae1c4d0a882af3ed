#!/usr/bin/env node
// The PD data plane's transfer engines (packages/core/src/pd): ZeroMQ/TCP vs NIXL/UCX (config `pd.transfer`),
// between this process (P, the sender) and a forked receiver process (D), on this host.
//
//   npm run bench:pd-transfer        (root; run `npm run build` and `npm run nixl:fetch` first; ~1 min)
//   node bench/pd-transfer.mjs --reps 5 --sizes 1,4,16,64
//   node bench/pd-transfer.mjs --netns   (root: P and D on two hosts, network namespaces joined by a veth pair;
//                                         `nixl` may still take CMA there, same kernel: `nixl tcp` is the network)
//
// Per payload size (MB = 2^20 bytes) and layout, GB/s (1e9 bytes/s) = payload / the time from write() until P
// holds D's acknowledgement (D applied everything; includes the notification round trip), median of --reps:
//   contiguous: one range (one coalesced run: the engines' bandwidth);
//   pages:      16 KiB pages scattered on D (every other page: one descriptor per page, as a KV page list).
// Engines: zmq; nixl (UCX's own transport choice: shared memory / CMA on one host); nixl tcp (UCX_TLS=tcp);
// nixl thread (NIXL's own progress thread, option progressThread: off by default, see nixl-transfer.ts).
// The variants alternate within each round (the machine is shared: ratios of one run are what to compare).
import { fork, spawn, spawnSync } from 'node:child_process';
import { cpus, loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';

import { createNixlTransferEngine, createZmqTransferEngine, nixlAvailable, nixlDir } from '@specd/core';
import { median } from './stats.mjs';

const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const MB = 1 << 20;
const PAGE = 16 << 10;

/** `--netns`: the namespaces of the two hosts and their addresses (set in the child run inside host A). */
const NETNS = process.env.SPECD_BENCH_NETNS === undefined ? undefined : JSON.parse(process.env.SPECD_BENCH_NETNS);
/** The address this process's engines bind: its host's in `--netns` runs (the peer passes its own). */
const HOST = argv[0] === '--peer' ? argv[3] : (NETNS?.a.address ?? '127.0.0.1');

async function makeEngine(kind) {
  const host = { host: HOST };
  if (kind === 'zmq') return createZmqTransferEngine(host);
  if (kind === 'nixl thread') return createNixlTransferEngine({ ...host, progressThread: true });
  return createNixlTransferEngine(kind === 'nixl tcp' ? { ...host, ucxTls: 'tcp' } : host);
}

if (argv.includes('--netns') && NETNS === undefined) process.exit(twoHosts());

/**
 * Makes two network namespaces joined by a veth pair (10.88.0.1 ↔ 10.88.0.2, private, inside them only), runs this
 * bench again in the first with its receivers in the second, and removes both. Needs root. @returns its exit code.
 */
function twoHosts() {
  const base = `specdb${process.pid}`;
  const a = { ns: `${base}-a`, address: '10.88.0.1' };
  const b = { ns: `${base}-b`, address: '10.88.0.2' };
  const ip = (...args) => {
    const r = spawnSync('ip', args, { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`bench:pd-transfer --netns: ip ${args.join(' ')}: ${r.stderr}`);
  };
  try {
    for (const h of [a, b]) {
      ip('netns', 'add', h.ns);
      ip('-n', h.ns, 'link', 'set', 'lo', 'up');
    }
    ip('-n', a.ns, 'link', 'add', 'v0', 'type', 'veth', 'peer', 'name', 'v0', 'netns', b.ns);
    for (const h of [a, b]) {
      ip('-n', h.ns, 'addr', 'add', `${h.address}/24`, 'dev', 'v0');
      ip('-n', h.ns, 'link', 'set', 'v0', 'up');
    }
    const rest = argv.filter((x) => x !== '--netns');
    const r = spawnSync('ip', ['netns', 'exec', a.ns, process.execPath, fileURLToPath(import.meta.url), ...rest], {
      stdio: 'inherit',
      env: { ...process.env, SPECD_BENCH_NETNS: JSON.stringify({ a, b }) },
    });
    return r.status ?? 1;
  } finally {
    for (const h of [a, b]) spawnSync('ip', ['netns', 'del', h.ns]);
  }
}

if (argv[0] === '--peer') {
  // the receiver: one engine, region 'dst' of the given bytes; {expect} → {expecting}, then {settled}
  const engine = await makeEngine(argv[1]);
  engine.registerRegions([{ id: 'dst', bytes: new Uint8Array(Number(argv[2])) }]);
  process.on('message', (m) => {
    if (m.exit) {
      void engine.close().then(() => process.exit(0));
      return;
    }
    engine.expect(m.req, m.allowed, { timeoutMs: 60_000 }).then(
      () => process.send({ settled: m.req }),
      (e) => process.send({ settled: m.req, error: e.message }),
    );
    process.send({ expecting: m.req });
  });
  process.send({ address: engine.address });
} else {
  const sizes = arg('sizes', '1,4,16,64')
    .split(',')
    .map((s) => Number(s) * MB);
  const reps = Number(arg('reps', '5'));
  const kinds = nixlAvailable() ? ['zmq', 'nixl', 'nixl tcp', 'nixl thread'] : ['zmq'];
  if (kinds.length === 1) console.warn(`NIXL not at ${nixlDir()}: run \`npm run nixl:fetch\`; measuring zmq only`);
  const maxBytes = Math.max(...sizes);
  const self = fileURLToPath(import.meta.url);
  const src = new Uint8Array(2 * maxBytes);
  for (let i = 0; i < src.length; i += 4096) src[i] = i & 255;

  const peers = new Map();
  for (const kind of kinds) {
    const peerArgs = ['--peer', kind, String(2 * maxBytes), NETNS?.b.address ?? '127.0.0.1'];
    // on the second host under --netns (`ip netns exec` keeps the IPC channel's descriptor)
    const child =
      NETNS === undefined
        ? fork(self, peerArgs, { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
        : spawn('ip', ['netns', 'exec', NETNS.b.ns, process.execPath, self, ...peerArgs], {
            stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
          });
    const waiters = [];
    child.on('message', (m) => {
      const i = waiters.findIndex((w) => w.pick(m));
      if (i >= 0) waiters.splice(i, 1)[0].resolve(m);
    });
    const next = (pick) => new Promise((resolve) => waiters.push({ pick, resolve }));
    const { address } = await next((m) => m.address !== undefined);
    const engine = await makeEngine(kind);
    engine.registerRegions([{ id: 'src', bytes: src }]);
    peers.set(kind, { child, next, address, engine });
  }

  /** Local and remote descriptors of `bytes` in `layout`. */
  function layoutOf(bytes, layout) {
    if (layout === 'contiguous')
      return {
        local: [{ region: 'src', offset: 0, length: bytes }],
        remote: [{ region: 'dst', offset: 0, length: bytes }],
      };
    const n = bytes / PAGE;
    const local = [];
    const remote = [];
    for (let i = 0; i < n; i++) {
      local.push({ region: 'src', offset: i * PAGE, length: PAGE });
      remote.push({ region: 'dst', offset: 2 * i * PAGE, length: PAGE });
    }
    return { local, remote };
  }

  let seq = 0;
  async function once(kind, bytes, layout) {
    const p = peers.get(kind);
    const { local, remote } = layoutOf(bytes, layout);
    const req = `b${seq++}`;
    const expecting = p.next((m) => m.expecting === req);
    const settled = p.next((m) => m.settled === req);
    p.child.send({ req, allowed: remote });
    await expecting;
    const t0 = process.hrtime.bigint();
    const stats = await p.engine.write(p.address, req, local, remote, null, { timeoutMs: 60_000 });
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    const end = await settled;
    if (end.error !== undefined) throw new Error(`${kind}: ${end.error}`);
    if (stats.bytes !== bytes) throw new Error(`${kind}: ${stats.bytes} bytes moved, ${bytes} asked`);
    return { gbs: bytes / s / 1e9, descriptors: stats.descriptors };
  }

  console.log(`CPU: ${cpus()[0]?.model} (${cpus().length} vCPUs); load average before: ${loadavg()[0].toFixed(2)}`);
  const where =
    NETNS === undefined ? '' : ` on another host (network namespaces ${NETNS.a.address} → ${NETNS.b.address}, veth)`;
  console.log(
    `GB/s (1e9 B/s), median of ${reps}; write() → D's acknowledgement; receiver in another process${where}\n`,
  );
  console.log(
    `| payload | layout | descriptors | ${kinds.join(' | ')} | ${kinds
      .slice(1)
      .map((k) => `${k} / zmq`)
      .join(' | ')} |`,
  );
  console.log(
    `|---|---|---|${kinds.map(() => '---|').join('')}${kinds
      .slice(1)
      .map(() => '---|')
      .join('')}`,
  );
  for (const layout of ['contiguous', 'pages']) {
    for (const bytes of sizes) {
      const got = new Map(kinds.map((k) => [k, []]));
      let descriptors = 0;
      await Promise.all(kinds.map((k) => once(k, bytes, layout).catch(() => undefined))); // warm-up, not counted
      for (let r = 0; r < reps; r++)
        for (const k of r % 2 === 0 ? kinds : [...kinds].reverse()) {
          const x = await once(k, bytes, layout);
          got.get(k).push(x.gbs);
          descriptors = x.descriptors;
        }
      const med = kinds.map((k) => median(got.get(k)));
      const ratios = med.slice(1).map((g) => `${(g / (med[0] ?? 1)).toFixed(2)}×`);
      const cells = [`${bytes / MB} MB`, layout, descriptors, ...med.map((g) => g.toFixed(2)), ...ratios];
      console.log(`| ${cells.join(' | ')} |`);
    }
  }
  console.log(`\nload average after: ${loadavg()[0].toFixed(2)}`);
  for (const p of peers.values()) {
    p.child.send({ exit: true });
    await p.engine.close();
  }
  process.exit(0);
}
