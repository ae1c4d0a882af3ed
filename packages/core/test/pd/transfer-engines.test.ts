// The shared transfer suite: every TransferEngine (ZeroMQ/TCP and NIXL/UCX) passes the same cases over real
// sockets on 127.0.0.1: integrity (page digests), coalescing, ordering of requests that reuse pages, concurrent
// requests, refusals, abort mid-transfer (the sender paused by its test hook), timeouts, close, and a peer process
// killed mid-request (fixtures/transfer-peer.mjs). Runs against dist/ (`npm run build:ts`). The NIXL engine needs
// `npm run nixl:fetch` (npm test runs it); without it the NIXL cases fail under CI=true and are skipped loudly
// elsewhere. Engine-specific wire details (ZeroMQ batches, raw peers) stay in zmq-transfer.test.ts.
import { execFileSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';

import { afterAll, afterEach, describe, expect, it } from 'vitest';

import { checksumRanges } from '../../dist/pd/checksum.js';
import { nixlAvailable, nixlDir } from '../../dist/pd/nixl-library.js';
import { createNixlTransferEngine } from '../../dist/pd/nixl-transfer.js';
import type { TransferEngine } from '../../dist/pd/transfer-engine.js';
import { createZmqTransferEngine } from '../../dist/pd/zmq-transfer.js';
import { prng, randomBytes } from '../io/helpers.js';
import {
  appliedWatch,
  expectedAfter,
  firstDiff,
  killed,
  nextMessage,
  pagePairs,
  pageRanges,
  rejection,
  spawnPeer,
  waitFor,
} from './transfer-helpers.js';

type Hooks = {
  pauseAfterDescriptors?: number;
  onPause?: (requestId: string) => void;
  onApplied?: (requestId: string, applied: { descriptors: number; bytes: number }) => void;
};

/** `s` as a regular expression matching it literally. */
const literal = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

interface Kind {
  readonly name: 'zmq' | 'nixl';
  readonly create: (hooks?: Hooks) => Promise<TransferEngine>;
  readonly address: RegExp;
  /** Transport messages of a write whose runs fit one batch: data (1 when it has descriptors) + this. */
  readonly notifyMessages: number;
  /** How a receiver reports a sender killed mid-request, and a sender a receiver killed between requests. */
  readonly senderDeath: 'timeout' | 'peer';
  readonly receiverDeath: 'timeout' | 'peer';
  /** The receiver's error when its sender died after `applied` (`'2 descriptors, 2048 bytes applied'`). */
  readonly senderDeathMessage: (req: string, receiver: string, timeoutMs: number, applied: string) => string;
  /** The sender's error for a write to a receiver that died after a first request completed. */
  readonly receiverDeathMessage: (req: string, peer: string, timeoutMs: number) => RegExp;
  /** The sender's error for a write to an address nobody listens on. */
  readonly unreachableMessage: (req: string, peer: string, timeoutMs: number) => RegExp;
}

const KINDS: Kind[] = [
  {
    name: 'zmq',
    create: (testHooks) => createZmqTransferEngine(testHooks === undefined ? {} : { testHooks }),
    address: /^tcp:\/\/127\.0\.0\.1:\d+$/,
    notifyMessages: 1, // the notification is a message of its own
    // ZeroMQ hides connection loss: only the deadline tells
    senderDeath: 'timeout',
    receiverDeath: 'timeout',
    senderDeathMessage: (req, receiver, timeoutMs, applied) =>
      `request ${req}: transfer to ${receiver} not complete within ${timeoutMs} ms (${applied})`,
    // 0 of 1 when ZeroMQ already saw the connection drop, 1 of 1 when it queued the descriptor first (load)
    receiverDeathMessage: (req, peer, timeoutMs) =>
      new RegExp(
        `^${literal(`request ${req}: peer ${peer} did not confirm the transfer within ${timeoutMs} ms `)}` +
          `\\([01]${literal(' of 1 descriptors sent; the peer may be dead)')}$`,
      ),
    unreachableMessage: (req, peer, timeoutMs) =>
      new RegExp(`^${literal(`request ${req}: peer ${peer} unreachable (no connection within ${timeoutMs} ms)`)}$`),
  },
  {
    name: 'nixl',
    create: (testHooks) => createNixlTransferEngine(testHooks === undefined ? {} : { testHooks }),
    address: /^nixl:\/\/127\.0\.0\.1:\d+$/,
    notifyMessages: 0, // the notification rides on the NIXL write (or on the request message without one)
    // the control connection's close is seen at once
    senderDeath: 'peer',
    receiverDeath: 'peer',
    senderDeathMessage: (req, receiver, _timeoutMs, applied) =>
      `request ${req}: the sender's connection to ${receiver} closed (${applied}; the sender may be dead)`,
    // the dead receiver's connection was dropped: the write connects anew and is refused — or, when the child's exit
    // reached the test before the socket's close reached the engine, the write goes out on the old connection and
    // its close fails it (seen once in 2 full runs of npm test on a loaded 2-vCPU machine)
    receiverDeathMessage: (req, peer) =>
      new RegExp(
        `^${literal(`request ${req}: peer ${peer} `)}(unreachable: .*ECONNREFUSED|` +
          `${literal('closed the connection (0 of 1 descriptors sent; the peer may be dead)')})`,
      ),
    unreachableMessage: (req, peer) =>
      new RegExp(`^${literal(`request ${req}: peer ${peer} unreachable: `)}.*ECONNREFUSED`),
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
    const a = await engine();
    expect(a.address).toMatch(kind.address);
    expect(Number(a.address.split(':')[2])).toBeGreaterThan(0); // port 0 asked: the port bound
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
    expect(stats).toEqual({ bytes: 25 * PAGE, descriptors: 1 + 5 + 1, messages: 1 + kind.notifyMessages });
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

  run('parts: a request written in partial writes completes only with its last write', async () => {
    const { a, b, src, dst, before } = await pair();
    const all: [number, number][] = Array.from({ length: 12 }, (_, i) => [i, 50 - 3 * i]);
    let settled = false;
    const got = b.expect(
      'parts',
      pageRanges(
        all.map(([, d]) => d),
        PAGE,
      ),
      { timeoutMs: 10_000 },
    );
    void got.then(() => {
      settled = true;
    });
    let want = before;
    // three parts (one of them empty), then the last write with the notification
    for (const [k, part] of [all.slice(0, 5), [], all.slice(5, 9)].entries()) {
      const { local, remote } = pagePairs(part, PAGE);
      const stats = await a.write(b.address, 'parts', local, remote, undefined, { timeoutMs: 10_000, partial: true });
      expect(stats.bytes, `part ${k}`).toBe(part.length * PAGE);
      want = expectedAfter(want, src, part, PAGE);
      expect(firstDiff(dst, want), `after part ${k}`).toBe(-1);
      await new Promise((r) => setTimeout(r, 20));
      expect(settled, `the expect is still pending after part ${k}`).toBe(false);
      expect(b.inflight).toBe(1);
    }
    const { local, remote } = pagePairs(all.slice(9), PAGE);
    await a.write(b.address, 'parts', local, remote, { last: true }, { timeoutMs: 10_000 });
    expect(await got).toEqual({ last: true });
    expect(firstDiff(dst, expectedAfter(before, src, all, PAGE))).toBe(-1);
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
    // a part outside the allowed ranges fails the request on both sides
    const bad = b.expect('parts-bad', pageRanges([0], PAGE), { timeoutMs: 10_000 });
    bad.catch(() => undefined);
    const ok = pagePairs([[0, 0]], PAGE);
    await a.write(b.address, 'parts-bad', ok.local, ok.remote, undefined, { timeoutMs: 10_000, partial: true });
    const out = pagePairs([[1, 1]], PAGE);
    await expect(a.write(b.address, 'parts-bad', out.local, out.remote, 1, { timeoutMs: 10_000 })).rejects.toThrow(
      /outside|allowed/,
    );
    await expect(bad).rejects.toMatchObject({ code: 'layout' });
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
    for (const s of await Promise.all(writes))
      expect(s).toEqual({ bytes: 4 * PAGE, descriptors: 1, messages: 1 + kind.notifyMessages });
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
    expect(stats).toEqual({ bytes: 0, descriptors: 0, messages: kind.notifyMessages });
    expect(await got).toEqual({ first: 42 });
  });

  run('refuses a write into a region the receiver did not register, and past a region end', async () => {
    const { a, b, dst, before } = await pair();
    const eight = [{ region: 'src', offset: 0, length: 8 }];
    const got = rejection(b.expect('nope', pageRanges([0], PAGE), { timeoutMs: 10_000 }));
    const ghost = [{ region: 'ghost', offset: 0, length: 8 }];
    const w = await rejection(a.write(b.address, 'nope', eight, ghost, 1, { timeoutMs: 10_000 }));
    expect([w.code, (await got).code]).toEqual(['layout', 'layout']);
    expect(w.message).toContain("region 'ghost' offset 0 length 8");
    expect(w.message).toContain('not a registered region');

    const got2 = rejection(b.expect('end', pageRanges([63], PAGE), { timeoutMs: 10_000 }));
    const past = [{ region: 'dst', offset: 64 * PAGE - 4, length: 8 }];
    const w2 = await rejection(a.write(b.address, 'end', eight, past, 1, { timeoutMs: 10_000 }));
    expect(w2.code).toBe('layout');
    expect(w2.message).toContain(`outside the region's ${64 * PAGE} bytes`);
    expect((await got2).code).toBe('layout');
    expect(firstDiff(dst, before)).toBe(-1);
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
  });

  run('refuses an allowed range outside a registered region at expect()', async () => {
    const { b } = await pair();
    const e = await rejection(b.expect('bad', [{ region: 'dst', offset: 64 * PAGE, length: 1 }], { timeoutMs: 100 }));
    expect([e.code, e.message]).toEqual([
      'layout',
      `expect bad: allowed region 'dst' offset ${64 * PAGE} length 1: outside the region's ${64 * PAGE} bytes`,
    ]);
    const ghost = await rejection(b.expect('bad', [{ region: 'ghost', offset: 0, length: 1 }], { timeoutMs: 100 }));
    expect(ghost.message).toBe("expect bad: allowed region 'ghost' offset 0 length 1: not a registered region");
    expect(b.inflight).toBe(0);
  });

  run('refuses a timeout that is not a positive number of ms', async () => {
    const { a, b } = await pair();
    await expect(b.expect('t', [], { timeoutMs: 0 })).rejects.toThrow(
      'expect: options.timeoutMs must be a positive number of ms, got 0',
    );
    await expect(a.write(b.address, 't', [], [], null, { timeoutMs: Number.NaN })).rejects.toThrow(
      'write: options.timeoutMs must be a positive number of ms, got NaN',
    );
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
  });

  run('refuses local layout errors before sending anything', async () => {
    const { a, b } = await pair();
    const local = [{ region: 'src', offset: 0, length: 8 }];
    const e = await rejection(
      a.write(b.address, 'x', local, [{ region: 'dst', offset: 0, length: 4 }], 1, { timeoutMs: 100 }),
    );
    expect(e.code).toBe('layout');
    expect(e.message).toMatch(/^write x: descriptor 0: local length 8 differs from remote length 4/);
    expect(a.inflight).toBe(0);
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
    // dst pages 2..4 coalesce into one run that leaves the allowed ranges: both sides name it and the receiver
    for (const m of [w.message, e.message]) {
      expect(m).toContain(`region 'dst' offset ${2 * PAGE} length ${3 * PAGE}`);
      expect(m).toContain('outside the ranges allowed');
      expect(m).toContain(b.address);
    }
    expect(firstDiff(dst, before)).toBe(-1); // nothing written, not even the allowed pages 2 and 3
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
    const e = await got;
    expect([e.code, e.message]).toEqual(['abort', `request gone aborted at ${b.address}: client went away`]);
    const late = await rejection(a.write(b.address, 'gone', local, remote, null, { timeoutMs: 10_000 }));
    expect([late.code, late.message.includes('client went away')]).toEqual(['abort', true]);
    expect(firstDiff(dst, before)).toBe(-1);

    // a request that completed: a second write under its id is answered, not written
    const done = b.expect('twice', pageRanges([1], PAGE), { timeoutMs: 10_000 });
    const once = pagePairs([[1, 1]], PAGE);
    await a.write(b.address, 'twice', once.local, once.remote, null, { timeoutMs: 10_000 });
    await done;
    const after = dst.slice();
    const again = pagePairs([[2, 1]], PAGE);
    const second = await rejection(a.write(b.address, 'twice', again.local, again.remote, null, { timeoutMs: 10_000 }));
    expect([second.code, second.message]).toEqual([
      'abort',
      `request twice: refused by ${b.address}: request twice at ${b.address}: already complete`,
    ]);
    expect(firstDiff(dst, after)).toBe(-1);
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
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
    await waitFor(() => paused.length === 1);
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
    // port 1 (tcpmux): never handed out as an ephemeral port, so no other process of a busy machine (nor this
    // sender) can be listening there — a port freed by a closed engine could be taken by any test running beside
    const a = await engine();
    const address = a.address.replace(/:\d+$/, ':1');
    a.registerRegions([{ id: 'src', bytes: new Uint8Array(PAGE) }]);
    const one = [{ region: 'src', offset: 0, length: PAGE }];
    const w = await rejection(a.write(address, 'lost', one, one, 1, { timeoutMs: 300 }));
    expect(w.code).toBe('peer');
    expect(w.message).toMatch(kind.unreachableMessage('lost', address, 300));
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
  });

  run('close() rejects every pending expect and write, and later calls', async () => {
    const { a, b } = await pair({ a: { pauseAfterDescriptors: 0 } });
    const { local, remote } = pagePairs([[0, 0]], PAGE);
    const e1 = rejection(b.expect('c1', pageRanges([0], PAGE), { timeoutMs: 60_000 }));
    const e2 = rejection(b.expect('c2', pageRanges([0], PAGE), { timeoutMs: 60_000 }));
    const w1 = rejection(a.write(b.address, 'c1', local, remote, null, { timeoutMs: 60_000 }));
    expect([a.inflight, b.inflight]).toEqual([1, 2]);
    await b.close();
    await a.close();
    // both close before either sees the other's socket close (no I/O turn in between): both end as closed
    expect([(await e1).code, (await e2).code, (await w1).code]).toEqual(['abort', 'abort', 'abort']);
    expect((await e1).message).toBe(`request c1: the transfer engine at ${b.address} is closed`);
    expect((await e2).message).toBe(`request c2: the transfer engine at ${b.address} is closed`);
    expect((await w1).message).toBe(`request c1: the transfer engine at ${a.address} is closed`);
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
    expect((await rejection(b.expect('c3', [], { timeoutMs: 10 }))).code).toBe('abort');
    expect((await rejection(a.write(b.address, 'c3', [], [], null, { timeoutMs: 10 }))).code).toBe('abort');
    await a.close(); // idempotent
  });

  // a peer is a spawned Node process: under a loaded CI machine its start-up alone has taken most of 20 s
  describe('a peer process killed mid-request', () => {
    const BYTES = 64 * 1024;

    run(
      'a sender killed after 2 descriptors: exactly those landed; the receiver fails',
      { timeout: 60_000 },
      async () => {
        const watch = appliedWatch();
        const d = await engine({ onApplied: watch.onApplied });
        const dst = new Uint8Array(BYTES);
        d.registerRegions([{ id: 'dst', bytes: dst }]);
        const { child } = await spawnPeer(['sender', String(BYTES), '2'], kind.name, children);
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
        expect(e.message).toBe(
          kind.senderDeathMessage('killed-p', d.address, 1000, `2 descriptors, ${2 * page} bytes applied`),
        );
        const src = new Uint8Array(BYTES);
        for (let i = 0; i < src.length; i++) src[i] = (i * 7 + 3) & 255; // the fixture's fill
        expect(firstDiff(dst, expectedAfter(new Uint8Array(BYTES), src, pages.slice(0, 2), page))).toBe(-1);
        expect(d.inflight).toBe(0);
      },
    );

    run(
      'a receiver killed between requests: the next write names the peer and rejects in time',
      {
        timeout: 60_000,
      },
      async () => {
        const p = await engine();
        p.registerRegions([{ id: 'src', bytes: randomBytes(BYTES, prng(22)) }]);
        const { child, address } = await spawnPeer(['receiver', String(BYTES)], kind.name, children);
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
        expect(e.message).toMatch(kind.receiverDeathMessage('two', address, 500));
        expect(p.inflight).toBe(0);
        // the connection to the dead peer was dropped; a new one never forms
        const e3 = await rejection(p.write(address, 'three', desc, target, null, { timeoutMs: 500 }));
        expect(e3.code).toBe('peer');
        expect(e3.message).toMatch(kind.unreachableMessage('three', address, 500));
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

describe.skipIf(!haveNixl)('loading NIXL', () => {
  it("sets UCX's settings for a host without RDMA devices, each only where the variable is unset", () => {
    // a child process: loading happens once per process, and it writes the process's environment
    const lib = new URL('../../dist/pd/nixl-library.js', import.meta.url).href;
    const names = ['UCX_MODULES', 'UCX_MEM_MALLOC_HOOKS', 'UCX_MEM_MMAP_HOOK_MODE', 'UCX_MEM_EVENTS'];
    const script =
      `import(${JSON.stringify(lib)}).then((m) => { m.loadNixl(); ` +
      `console.log(JSON.stringify(${JSON.stringify(names)}.map((k) => process.env[k] ?? null))); })`;
    const env: Record<string, string | undefined> = { ...process.env, UCX_MEM_EVENTS: 'yes' };
    for (const k of names.slice(0, 3)) delete env[k];
    const out = JSON.parse(execFileSync(process.execPath, ['-e', script], { env, encoding: 'utf8' }));
    let rdma = false;
    try {
      rdma = fs.readdirSync('/sys/class/infiniband').length > 0;
    } catch {}
    // with RDMA devices the hooks stay (its registration cache needs them) and every module loads
    expect(out).toEqual(rdma ? [null, null, null, 'yes'] : ['^ib,rdmacm,cuda', 'no', 'none', 'yes']);
  });
});
