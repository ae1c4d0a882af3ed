// The shared transfer suite: every TransferEngine (ZeroMQ/TCP and NIXL/UCX) passes the same cases over real
// sockets on 127.0.0.1: integrity (page digests), coalescing, ordering of requests that reuse pages, concurrent
// requests, refusals, abort mid-transfer (the sender paused by its test hook), timeouts, close, and a peer process
// killed mid-request (fixtures/transfer-peer.mjs). Runs against dist/ (`npm run build:ts`). The NIXL engine needs
// `npm run nixl:fetch` (npm test runs it); without it the NIXL cases fail under CI=true and are skipped loudly
// elsewhere. Engine-specific wire details (ZeroMQ batches, raw peers) stay in zmq-transfer.test.ts.
import { execFileSync, fork, type ChildProcess } from 'node:child_process';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, afterEach, describe, expect, it } from 'vitest';

import { checksumRanges } from '../../dist/pd/checksum.js';
import { nixlAvailable, nixlDir } from '../../dist/pd/nixl-library.js';
import { createNixlTransferEngine } from '../../dist/pd/nixl-transfer.js';
import type { TransferDescriptor, TransferEngine } from '../../dist/pd/transfer-engine.js';
import { PdError, type RegionRange } from '../../dist/pd/types.js';
import { createZmqTransferEngine } from '../../dist/pd/zmq-transfer.js';
import { prng, randomBytes } from '../io/helpers.js';

const PEER = path.join(path.dirname(fileURLToPath(import.meta.url)), 'fixtures/transfer-peer.mjs');

type Hooks = {
  pauseAfterDescriptors?: number;
  onPause?: (requestId: string) => void;
  onApplied?: (requestId: string, applied: { descriptors: number; bytes: number }) => void;
};

interface Kind {
  readonly name: 'zmq' | 'nixl';
  readonly create: (hooks?: Hooks) => Promise<TransferEngine>;
  readonly address: RegExp;
  /** How a receiver reports a sender killed mid-request, and a sender a receiver killed between requests. */
  readonly senderDeath: 'timeout' | 'peer';
  readonly receiverDeath: 'timeout' | 'peer';
}

const KINDS: Kind[] = [
  {
    name: 'zmq',
    create: (testHooks) => createZmqTransferEngine(testHooks === undefined ? {} : { testHooks }),
    address: /^tcp:\/\/127\.0\.0\.1:\d+$/,
    // ZeroMQ hides connection loss: only the deadline tells
    senderDeath: 'timeout',
    receiverDeath: 'timeout',
  },
  {
    name: 'nixl',
    create: (testHooks) => createNixlTransferEngine(testHooks === undefined ? {} : { testHooks }),
    address: /^nixl:\/\/127\.0\.0\.1:\d+$/,
    // the control connection's close is seen at once
    senderDeath: 'peer',
    receiverDeath: 'peer',
  },
];

const haveNixl = nixlAvailable();
if (!haveNixl) {
  const why = `the NIXL library is not at ${nixlDir()}: run \`npm run nixl:fetch\``;
  if (process.env.CI === 'true') throw new Error(`transfer-engines.test.ts: ${why}`);
  console.warn(`transfer-engines.test.ts: SKIPPING the NIXL engine's cases: ${why}`);
}

const engines: TransferEngine[] = [];
const children: ChildProcess[] = [];
afterEach(async () => {
  for (const e of engines.splice(0)) await e.close();
});
afterAll(() => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

function pagePairs(
  pages: readonly (readonly [number, number])[],
  pageBytes: number,
): { local: TransferDescriptor[]; remote: TransferDescriptor[] } {
  return {
    local: pages.map(([s]) => ({ region: 'src', offset: s * pageBytes, length: pageBytes })),
    remote: pages.map(([, d]) => ({ region: 'dst', offset: d * pageBytes, length: pageBytes })),
  };
}

function pageRanges(pages: readonly number[], pageBytes: number): RegionRange[] {
  return pages.map((p) => ({ region: 'dst', offset: p * pageBytes, length: pageBytes }));
}

function firstDiff(a: Uint8Array, b: Uint8Array): number {
  if (a.length !== b.length) return Math.min(a.length, b.length);
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return i;
  return -1;
}

function expectedAfter(
  before: Uint8Array,
  src: Uint8Array,
  pages: readonly (readonly [number, number])[],
  pageBytes: number,
): Uint8Array {
  const out = before.slice();
  for (const [s, d] of pages) out.set(src.subarray(s * pageBytes, (s + 1) * pageBytes), d * pageBytes);
  return out;
}

async function rejection(p: Promise<unknown>): Promise<PdError> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(PdError);
    return err as PdError;
  }
  throw new Error('expected a rejection, the promise resolved');
}

function appliedWatch() {
  const seen = new Map<string, { descriptors: number; bytes: number }>();
  const waiters: { req: string; n: number; resolve: (a: { descriptors: number; bytes: number }) => void }[] = [];
  return {
    onApplied(req: string, a: { descriptors: number; bytes: number }) {
      seen.set(req, { ...a });
      for (const w of [...waiters])
        if (w.req === req && a.descriptors >= w.n) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve({ ...a });
        }
    },
    reached(req: string, n: number): Promise<{ descriptors: number; bytes: number }> {
      const a = seen.get(req);
      if (a !== undefined && a.descriptors >= n) return Promise.resolve(a);
      return new Promise((resolve) => waiters.push({ req, n, resolve }));
    },
  };
}

describe.each(KINDS)('transfer engine $name: the shared suite', (kind) => {
  const PAGE = 1024;
  const run = kind.name === 'nixl' && !haveNixl ? it.skip : it;

  async function engine(hooks?: Hooks): Promise<TransferEngine> {
    const e = await kind.create(hooks);
    engines.push(e);
    return e;
  }

  async function pair(hooks: { a?: Hooks; b?: Hooks } = {}, pages = 64) {
    const a = await engine(hooks.a);
    const b = await engine(hooks.b);
    const next = prng(kind.name === 'zmq' ? 31 : 32);
    const src = randomBytes(pages * PAGE, next);
    const dst = randomBytes(pages * PAGE, next);
    a.registerRegions([{ id: 'src', bytes: src }]);
    b.registerRegions([{ id: 'dst', bytes: dst }]);
    return { a, b, src, dst, before: dst.slice() };
  }

  run('reports its address', async () => {
    expect((await engine()).address).toMatch(kind.address);
  });

  run('integrity: contiguous and scattered runs land exactly; the digest matches; runs are coalesced', async () => {
    const { a, b, src, dst, before } = await pair();
    const pages: [number, number][] = [];
    for (let i = 0; i < 10; i++) pages.push([i, 20 + i]); // one run of 10 pages
    for (let i = 0; i < 5; i++) pages.push([10 + i, 5 + 2 * i]); // 5 scattered pages
    for (let i = 0; i < 10; i++) pages.push([30 + i, 40 + i]); // a second run
    const { local, remote } = pagePairs(pages, PAGE);
    const manifest = { rows: [{ entry: 'target-kv layer 0', checksum: checksumRanges(() => src, local) }] };
    const allowed = pageRanges(
      pages.map(([, d]) => d),
      PAGE,
    );
    const got = b.expect('req-1', allowed, { timeoutMs: 10_000 });
    const stats = await a.write(b.address, 'req-1', local, remote, manifest, { timeoutMs: 10_000 });
    expect(await got).toEqual(manifest);
    expect([stats.bytes, stats.descriptors]).toEqual([25 * PAGE, 1 + 5 + 1]);
    expect(firstDiff(dst, expectedAfter(before, src, pages, PAGE))).toBe(-1);
    expect(checksumRanges(() => dst, remote)).toBe(manifest.rows[0]?.checksum);
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
  });

  run('integrity: a random page mapping of 2048 small pages', async () => {
    const seed = 20261202;
    const next = prng(seed);
    const small = 256;
    const n = 2048;
    const a = await engine();
    const b = await engine();
    const src = randomBytes(n * small, next);
    const dst = randomBytes(n * small, next);
    const before = dst.slice();
    a.registerRegions([{ id: 'src', bytes: src }]);
    b.registerRegions([{ id: 'dst', bytes: dst }]);
    const order = Array.from({ length: n }, (_, i) => i);
    for (let i = n - 1; i > 0; i--) {
      const j = Math.floor(next() * (i + 1));
      [order[i], order[j]] = [order[j] as number, order[i] as number];
    }
    const pages: [number, number][] = order.slice(0, n / 2).map((d, s) => [s, d]);
    const { local, remote } = pagePairs(pages, small);
    const got = b.expect('rand', pageRanges(order.slice(0, n / 2), small), { timeoutMs: 10_000 });
    const stats = await a.write(b.address, 'rand', local, remote, { seed }, { timeoutMs: 10_000 });
    expect(await got).toEqual({ seed });
    expect(stats.bytes).toBe((n / 2) * small);
    expect(firstDiff(dst, expectedAfter(before, src, pages, small)), `seed ${seed}`).toBe(-1);
  });

  run('ordering: requests that reuse the same pages, one after the other, leave the last one', async () => {
    const { a, b, src, dst, before } = await pair();
    let want = before;
    for (let k = 0; k < 6; k++) {
      const pages: [number, number][] = [0, 1, 2, 3].map((i) => [8 * k + i, i]); // always dst pages 0..3
      const { local, remote } = pagePairs(pages, PAGE);
      const got = b.expect(`o${k}`, pageRanges([0, 1, 2, 3], PAGE), { timeoutMs: 10_000 });
      await a.write(b.address, `o${k}`, local, remote, k, { timeoutMs: 10_000 });
      expect(await got).toBe(k);
      want = expectedAfter(want, src, pages, PAGE);
      expect(firstDiff(dst, want), `after request ${k}`).toBe(-1);
    }
  });

  run('runs several requests at once from two senders to two receivers', async () => {
    const next = prng(16);
    const [p1, p2, d1, d2] = [await engine(), await engine(), await engine(), await engine()];
    const src1 = randomBytes(32 * PAGE, next);
    const src2 = randomBytes(32 * PAGE, next);
    p1.registerRegions([{ id: 'src', bytes: src1 }]);
    p2.registerRegions([{ id: 'src', bytes: src2 }]);
    const dst1 = new Uint8Array(64 * PAGE);
    const dst2 = new Uint8Array(64 * PAGE);
    d1.registerRegions([{ id: 'dst', bytes: dst1 }]);
    d2.registerRegions([{ id: 'dst', bytes: dst2 }]);
    const reqs = Array.from({ length: 8 }, (_, k) => {
      const pages: [number, number][] = [0, 1, 2, 3].map((i) => [(4 * k + i) % 32, 8 * k + i]);
      return { k, pages, p: k < 6 ? p1 : p2, d: k % 2 === 0 ? d1 : d2, src: k < 6 ? src1 : src2 };
    });
    const expects = reqs.map((r) =>
      r.d.expect(
        `r${r.k}`,
        pageRanges(
          r.pages.map(([, d]) => d),
          PAGE,
        ),
        { timeoutMs: 10_000 },
      ),
    );
    expect([d1.inflight, d2.inflight]).toEqual([4, 4]);
    const writes = reqs.map((r) => {
      const { local, remote } = pagePairs(r.pages, PAGE);
      return r.p.write(r.d.address, `r${r.k}`, local, remote, { k: r.k }, { timeoutMs: 10_000 });
    });
    expect([p1.inflight, p2.inflight]).toEqual([6, 2]);
    for (const s of await Promise.all(writes)) expect([s.bytes, s.descriptors]).toEqual([4 * PAGE, 1]);
    expect(await Promise.all(expects)).toEqual(reqs.map((r) => ({ k: r.k })));
    let want1 = new Uint8Array(64 * PAGE);
    let want2 = new Uint8Array(64 * PAGE);
    for (const r of reqs) {
      if (r.d === d1) want1 = expectedAfter(want1, r.src, r.pages, PAGE);
      else want2 = expectedAfter(want2, r.src, r.pages, PAGE);
    }
    expect([firstDiff(dst1, want1), firstDiff(dst2, want2)]).toEqual([-1, -1]);
    expect([p1.inflight, p2.inflight, d1.inflight, d2.inflight]).toEqual([0, 0, 0, 0]);
  });

  run('a region registered after a first request is written by the next (the peer learns it)', async () => {
    const { a, b, src } = await pair();
    const first = pagePairs([[0, 0]], PAGE);
    const got = b.expect('before', pageRanges([0], PAGE), { timeoutMs: 10_000 });
    await a.write(b.address, 'before', first.local, first.remote, 1, { timeoutMs: 10_000 });
    expect(await got).toBe(1);
    const later = new Uint8Array(4 * PAGE);
    b.registerRegions([{ id: 'later', bytes: later }]);
    const local = [{ region: 'src', offset: 5 * PAGE, length: 2 * PAGE }];
    const remote = [{ region: 'later', offset: PAGE, length: 2 * PAGE }];
    const got2 = b.expect('after', remote, { timeoutMs: 10_000 });
    await a.write(b.address, 'after', local, remote, 2, { timeoutMs: 10_000 });
    expect(await got2).toBe(2);
    const want = new Uint8Array(4 * PAGE);
    want.set(src.subarray(5 * PAGE, 7 * PAGE), PAGE);
    expect(firstDiff(later, want)).toBe(-1);
  });

  run('delivers a notification alone (no descriptors)', async () => {
    const [a, b] = [await engine(), await engine()];
    const got = b.expect('empty', [], { timeoutMs: 10_000 });
    const stats = await a.write(b.address, 'empty', [], [], { first: 42 }, { timeoutMs: 10_000 });
    expect([stats.bytes, stats.descriptors]).toEqual([0, 0]);
    expect(await got).toEqual({ first: 42 });
  });

  run('refuses a write outside the allowed ranges: nothing is written, both sides fail with layout', async () => {
    const { a, b, dst, before } = await pair();
    const got = rejection(b.expect('out', pageRanges([0, 1, 2, 3], PAGE), { timeoutMs: 10_000 }));
    const { local, remote } = pagePairs(
      [
        [0, 2],
        [1, 3],
        [2, 4],
      ],
      PAGE,
    );
    const w = await rejection(a.write(b.address, 'out', local, remote, null, { timeoutMs: 10_000 }));
    const e = await got;
    expect([w.code, e.code]).toEqual(['layout', 'layout']);
    expect(e.message).toContain(`offset ${2 * PAGE} length ${3 * PAGE}`);
    expect(e.message).toContain('outside the ranges allowed');
    expect(firstDiff(dst, before)).toBe(-1);
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
  });

  run('answers a write of a request not expected, or aborted, with abort: nothing is written', async () => {
    const { a, b, dst, before } = await pair();
    const { local, remote } = pagePairs([[0, 0]], PAGE);
    const unknown = await rejection(a.write(b.address, 'never', local, remote, null, { timeoutMs: 10_000 }));
    expect(unknown.code).toBe('abort');
    expect(unknown.message).toContain('not expected');
    const got = rejection(b.expect('gone', pageRanges([0], PAGE), { timeoutMs: 10_000 }));
    b.abort('gone', 'client went away');
    expect((await got).message).toBe(`request gone aborted at ${b.address}: client went away`);
    const late = await rejection(a.write(b.address, 'gone', local, remote, null, { timeoutMs: 10_000 }));
    expect([late.code, late.message.includes('client went away')]).toEqual(['abort', true]);
    expect(firstDiff(dst, before)).toBe(-1);
  });

  run('abort mid-transfer: the sender paused after 3 descriptors; exactly those landed; both sides end', async () => {
    const watch = appliedWatch();
    const paused: string[] = [];
    const { a, b, src, dst, before } = await pair({
      a: { pauseAfterDescriptors: 3, onPause: (r) => paused.push(r) },
      b: { onApplied: watch.onApplied },
    });
    const pages: [number, number][] = [0, 1, 2, 3, 4, 5].map((i) => [i, 2 * i]); // 6 descriptors
    const { local, remote } = pagePairs(pages, PAGE);
    const allowed = pageRanges(
      pages.map(([, d]) => d),
      PAGE,
    );
    const got = rejection(b.expect('p', allowed, { timeoutMs: 60_000 }));
    const w = rejection(a.write(b.address, 'p', local, remote, null, { timeoutMs: 60_000 }));
    expect(await watch.reached('p', 3)).toEqual({ descriptors: 3, bytes: 3 * PAGE });
    await vi_waitFor(() => paused.length === 1);
    expect(paused).toEqual(['p']);
    expect([a.inflight, b.inflight]).toEqual([1, 1]);
    a.abort('p', 'test abort');
    const [we, ee] = [await w, await got];
    expect([we.code, ee.code]).toEqual(['abort', 'abort']);
    expect(ee.message).toBe('request p aborted by the sender: test abort');
    expect(firstDiff(dst, expectedAfter(before, src, pages.slice(0, 3), PAGE))).toBe(-1);
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
  });

  run('an abort at the receiver reaches the sender', async () => {
    const watch = appliedWatch();
    const { a, b } = await pair({ a: { pauseAfterDescriptors: 1 }, b: { onApplied: watch.onApplied } });
    const { local, remote } = pagePairs(
      [
        [0, 0],
        [2, 2],
      ],
      PAGE,
    );
    const got = rejection(b.expect('q', pageRanges([0, 2], PAGE), { timeoutMs: 60_000 }));
    const w = rejection(a.write(b.address, 'q', local, remote, null, { timeoutMs: 60_000 }));
    await watch.reached('q', 1);
    b.abort('q', 'decode gave up');
    const we = await w;
    expect([we.code, we.message]).toEqual(['abort', `request q aborted by the receiver ${b.address}: decode gave up`]);
    expect((await got).code).toBe('abort');
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
  });

  run('timeouts: an expect nothing completes; a write to an address nobody listens on', { timeout: 5000 }, async () => {
    const b = await engine();
    b.registerRegions([{ id: 'dst', bytes: new Uint8Array(PAGE) }]);
    const e = await rejection(b.expect('idle', pageRanges([0], PAGE), { timeoutMs: 200 }));
    expect([e.code, e.message]).toEqual([
      'timeout',
      `request idle: transfer to ${b.address} not complete within 200 ms (no sender seen)`,
    ]);
    const gone = await kind.create();
    const address = gone.address;
    await gone.close();
    const a = await engine();
    a.registerRegions([{ id: 'src', bytes: new Uint8Array(PAGE) }]);
    const one = [{ region: 'src', offset: 0, length: PAGE }];
    const w = await rejection(a.write(address, 'lost', one, one, 1, { timeoutMs: 300 }));
    expect(w.code).toBe('peer');
    expect(w.message).toContain(`request lost: peer ${address} unreachable`);
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
  });

  run('close() rejects every pending expect and write, and later calls', async () => {
    const { a, b } = await pair({ a: { pauseAfterDescriptors: 0 } });
    const { local, remote } = pagePairs([[0, 0]], PAGE);
    const e1 = rejection(b.expect('c1', pageRanges([0], PAGE), { timeoutMs: 60_000 }));
    const w1 = rejection(a.write(b.address, 'c1', local, remote, null, { timeoutMs: 60_000 }));
    await b.close();
    await a.close();
    // both close before either sees the other's socket close (no I/O turn in between): both end as closed
    expect([(await e1).code, (await w1).code]).toEqual(['abort', 'abort']);
    expect((await e1).message).toBe(`request c1: the transfer engine at ${b.address} is closed`);
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
    expect((await rejection(b.expect('c3', [], { timeoutMs: 10 }))).code).toBe('abort');
    expect((await rejection(a.write(b.address, 'c3', [], [], null, { timeoutMs: 10 }))).code).toBe('abort');
    await a.close();
  });

  describe('a peer process killed mid-request', () => {
    const BYTES = 64 * 1024;

    function spawnPeer(args: string[]): Promise<{ child: ChildProcess; address: string }> {
      const child = fork(PEER, args, {
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
        env: { ...process.env, SPECD_TEST_TRANSFER: kind.name },
      });
      children.push(child);
      return new Promise((resolve, reject) => {
        child.on('message', (m: { address?: string }) => {
          if (m.address !== undefined) resolve({ child, address: m.address });
        });
        child.once('exit', (code) => reject(new Error(`transfer peer exited (${code}) before reporting its address`)));
      });
    }

    function nextMessage<T>(child: ChildProcess, pick: (m: T) => boolean): Promise<T> {
      return new Promise((resolve) => {
        const on = (m: T) => {
          if (pick(m)) {
            child.off('message', on);
            resolve(m);
          }
        };
        child.on('message', on);
      });
    }

    function killed(child: ChildProcess): Promise<void> {
      return new Promise((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve();
        child.once('exit', () => resolve());
        child.kill('SIGKILL');
      });
    }

    run(
      'a sender killed after 2 descriptors: exactly those landed; the receiver fails',
      { timeout: 20_000 },
      async () => {
        const watch = appliedWatch();
        const d = await engine({ onApplied: watch.onApplied });
        const dst = new Uint8Array(BYTES);
        d.registerRegions([{ id: 'dst', bytes: dst }]);
        const { child } = await spawnPeer(['sender', String(BYTES), '2']);
        const page = 1024;
        const pages: [number, number][] = [0, 1, 2, 3, 4].map((i) => [3 * i, i]);
        const { local, remote } = pagePairs(pages, page);
        const got = rejection(d.expect('killed-p', pageRanges([0, 1, 2, 3, 4], page), { timeoutMs: 1000 }));
        const paused = nextMessage<{ paused?: string }>(child, (m) => m.paused !== undefined);
        child.send({ write: { peer: d.address, req: 'killed-p', local, remote, timeoutMs: 60_000 } });
        expect(await paused).toEqual({ paused: 'killed-p' });
        expect(await watch.reached('killed-p', 2)).toEqual({ descriptors: 2, bytes: 2 * page });
        await killed(child);
        const e = await got;
        expect(e.code).toBe(kind.senderDeath);
        expect(e.message).toContain(`(2 descriptors, ${2 * page} bytes applied`);
        const src = new Uint8Array(BYTES);
        for (let i = 0; i < src.length; i++) src[i] = (i * 7 + 3) & 255; // the fixture's fill
        expect(firstDiff(dst, expectedAfter(new Uint8Array(BYTES), src, pages.slice(0, 2), page))).toBe(-1);
        expect(d.inflight).toBe(0);
      },
    );

    run(
      'a receiver killed between requests: the next write names the peer and rejects in time',
      {
        timeout: 20_000,
      },
      async () => {
        const p = await engine();
        p.registerRegions([{ id: 'src', bytes: randomBytes(BYTES, prng(22)) }]);
        const { child, address } = await spawnPeer(['receiver', String(BYTES)]);
        const desc = [{ region: 'src', offset: 0, length: 4096 }];
        const target = [{ region: 'dst', offset: 0, length: 4096 }];
        const settled = nextMessage<{ settled?: string }>(child, (m) => m.settled === 'one');
        const expecting = nextMessage<{ expecting?: string }>(child, (m) => m.expecting === 'one');
        child.send({ expect: { req: 'one', allowed: target, timeoutMs: 10_000 } });
        await expecting;
        const stats = await p.write(address, 'one', desc, target, null, { timeoutMs: 10_000 });
        expect(await settled).toEqual({ settled: 'one', payload: null });
        expect(stats.bytes).toBe(4096);
        await killed(child);
        const e = await rejection(p.write(address, 'two', desc, target, null, { timeoutMs: 500 }));
        expect(e.code).toBe(kind.receiverDeath);
        expect(e.message).toContain(`request two: peer ${address}`);
        expect(p.inflight).toBe(0);
      },
    );
  });
});

describe('the NIXL library missing', () => {
  it('creating a NIXL engine fails with one message saying npm run nixl:fetch', () => {
    // a child process: this one may have loaded the library already (it is loaded once per process)
    const dist = new URL('../../dist/pd/nixl-transfer.js', import.meta.url).href;
    const script =
      `import(${JSON.stringify(dist)}).then((m) => m.createNixlTransferEngine())` +
      '.then(() => console.log("created"), (e) => console.log(JSON.stringify([e.code, e.message])))';
    const out = execFileSync(process.execPath, ['-e', script], {
      env: { ...process.env, SPECD_NIXL_DIR: '/nonexistent/nixl' },
      encoding: 'utf8',
    });
    expect(JSON.parse(out)).toEqual([
      'ERR_SPECD_NIXL_MISSING',
      'the NIXL library is not at /nonexistent/nixl/.nixl_cu12.mesonpy.libs/libnixl_capi.so: ' +
        'run `npm run nixl:fetch` (it unpacks the PyPI wheel nixl-cu12==1.5.1 into .cache/nixl/), ' +
        'or set SPECD_NIXL_DIR to an unpacked copy; or use pd.transfer "zmq"',
    ]);
  });
});

/** Polls `cond` every 5 ms (the pause hook fires from the sender's poll loop, after the first batch completed). */
async function vi_waitFor(cond: () => boolean): Promise<void> {
  while (!cond()) await new Promise((r) => setTimeout(r, 5));
}
