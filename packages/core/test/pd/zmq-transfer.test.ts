// The ZeroMQ/TCP transfer engine over real sockets on 127.0.0.1 (port 0): engines in this process, and a
// peer in a child process (fixtures/transfer-peer.mjs) where a test kills one side. Runs against dist/
// (`npm run build:ts`). Timeouts are asserted by their error; each such test has a hang guard (the vitest
// timeout) at 10x or more of the configured timeout.
import { fork, type ChildProcess } from 'node:child_process';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, afterEach, describe, expect, it } from 'vitest';
import * as zmq from 'zeromq';

import { checksumRanges } from '../../dist/pd/checksum.js';
import { coalesceDescriptors, type TransferDescriptor, type TransferEngine } from '../../dist/pd/transfer-engine.js';
import { PdError, type RegionRange } from '../../dist/pd/types.js';
import { createZmqTransferEngine, type ZmqTransferEngineOptions } from '../../dist/pd/zmq-transfer.js';
import { prng, randomBytes } from '../io/helpers.js';

const PEER = path.join(path.dirname(fileURLToPath(import.meta.url)), 'fixtures/transfer-peer.mjs');

const engines: TransferEngine[] = [];
const children: ChildProcess[] = [];

afterEach(async () => {
  for (const e of engines.splice(0)) await e.close();
});
afterAll(() => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

async function engine(options: ZmqTransferEngineOptions = {}): Promise<TransferEngine> {
  const e = await createZmqTransferEngine(options);
  engines.push(e);
  return e;
}

/** mulberry32: a small seeded PRNG (the seed is printed on failure through the test name). */
/** Page-granular descriptor pairs: `pages[i] = [srcPage, dstPage]` of `pageBytes` each. */
function pagePairs(
  pages: readonly (readonly [number, number])[],
  pageBytes: number,
  src = 'src',
  dst = 'dst',
): { local: TransferDescriptor[]; remote: TransferDescriptor[] } {
  return {
    local: pages.map(([s]) => ({ region: src, offset: s * pageBytes, length: pageBytes })),
    remote: pages.map(([, d]) => ({ region: dst, offset: d * pageBytes, length: pageBytes })),
  };
}

function pageRanges(pages: readonly number[], pageBytes: number, region = 'dst'): RegionRange[] {
  return pages.map((p) => ({ region, offset: p * pageBytes, length: pageBytes }));
}

/** The first byte index where `a` and `b` differ, or -1. */
function firstDiff(a: Uint8Array, b: Uint8Array): number {
  if (a.length !== b.length) return Math.min(a.length, b.length);
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return i;
  return -1;
}

/** `dst` after copying `pages` of `src` into `before`: what the receiver must hold. */
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

/** Resolves when the receiver's onApplied hook reports `descriptors` applied for `req`. */
function appliedWatch(): {
  onApplied: (req: string, a: { descriptors: number; bytes: number }) => void;
  reached: (req: string, descriptors: number) => Promise<{ descriptors: number; bytes: number }>;
} {
  const seen = new Map<string, { descriptors: number; bytes: number }>();
  const waiters: { req: string; n: number; resolve: (a: { descriptors: number; bytes: number }) => void }[] = [];
  return {
    onApplied(req, a) {
      seen.set(req, { ...a });
      for (const w of [...waiters])
        if (w.req === req && a.descriptors >= w.n) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve({ ...a });
        }
    },
    reached(req, n) {
      const a = seen.get(req);
      if (a !== undefined && a.descriptors >= n) return Promise.resolve(a);
      return new Promise((resolve) => waiters.push({ req, n, resolve }));
    },
  };
}

describe('coalesceDescriptors', () => {
  const size = () => 1 << 20;
  it('merges runs contiguous on both sides only, splits at the cap, drops empty pairs', () => {
    // src 0..3 → dst 8..11 (one run), src 4 → dst 20 (dst not contiguous), src 5 → dst 21 (contiguous again)
    const { local, remote } = pagePairs(
      [
        [0, 8],
        [1, 9],
        [2, 10],
        [3, 11],
        [4, 20],
        [5, 21],
      ],
      100,
    );
    const runs = coalesceDescriptors(local, remote, 1000, size);
    expect(runs.map((r) => [r.local.offset, r.remote.offset, r.local.length])).toEqual([
      [0, 800, 400],
      [400, 2000, 200],
    ]);
    const capped = coalesceDescriptors(local, remote, 150, size);
    expect(capped.map((r) => [r.local.offset, r.remote.offset, r.local.length])).toEqual([
      [0, 800, 150],
      [150, 950, 150],
      [300, 1100, 100],
      [400, 2000, 150],
      [550, 2150, 50],
    ]);
    const withEmpty = coalesceDescriptors(
      [{ region: 'a', offset: 0, length: 0 }, ...local.slice(0, 1)],
      [{ region: 'b', offset: 5, length: 0 }, ...remote.slice(0, 1)],
      1000,
      size,
    );
    expect(withEmpty).toHaveLength(1);
  });

  it('does not merge across regions', () => {
    const local = [
      { region: 'a', offset: 0, length: 10 },
      { region: 'b', offset: 10, length: 10 },
    ];
    const remote = [
      { region: 'x', offset: 0, length: 10 },
      { region: 'x', offset: 10, length: 10 },
    ];
    expect(coalesceDescriptors(local, remote, 1000, size)).toHaveLength(2);
  });

  it('refuses unequal pairs and ranges outside the local region, naming the pair', () => {
    const l = [{ region: 'a', offset: 0, length: 10 }];
    expect(() => coalesceDescriptors(l, [], 100, size)).toThrow(/1 local descriptors but 0 remote/);
    expect(() => coalesceDescriptors(l, [{ region: 'x', offset: 0, length: 11 }], 100, size)).toThrow(
      /descriptor 0: local length 10 differs from remote length 11/,
    );
    expect(() =>
      coalesceDescriptors(
        [{ region: 'a', offset: 1 << 20, length: 1 }],
        [{ region: 'x', offset: 0, length: 1 }],
        100,
        size,
      ),
    ).toThrow(/local descriptor 0: region 'a' offset 1048576 length 1 is outside the region's 1048576 bytes/);
    expect(() => coalesceDescriptors(l, [{ region: 'x', offset: -1, length: 10 }], 100, () => undefined)).toThrow(
      /local descriptor 0: region 'a' offset 0 length 10 is not registered/,
    );
    expect(() => coalesceDescriptors(l, [{ region: 'x', offset: -1, length: 10 }], 100, size)).toThrow(
      /remote descriptor 0: region 'x' offset -1 length 10 is not a valid range/,
    );
  });
});

describe('ZeroMQ transfer engine: bytes land', () => {
  const PAGE = 1024;

  it('binds 127.0.0.1 on port 0 and reports the port', async () => {
    const a = await engine();
    expect(a.address).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    expect(Number(a.address.split(':')[2])).toBeGreaterThan(0);
  });

  it('copies contiguous and scattered page runs exactly, coalescing runs contiguous on both sides', async () => {
    const next = prng(14);
    const a = await engine();
    const b = await engine();
    const src = randomBytes(64 * PAGE, next);
    const dst = randomBytes(64 * PAGE, next);
    const before = dst.slice();
    a.registerRegions([{ id: 'src', bytes: src }]);
    b.registerRegions([{ id: 'dst', bytes: dst }]);
    const pages: [number, number][] = [];
    for (let i = 0; i < 10; i++) pages.push([i, 20 + i]); // one run of 10 pages
    for (let i = 0; i < 5; i++) pages.push([10 + i, 5 + 2 * i]); // 5 scattered pages (dst 5, 7, …, 13)
    for (let i = 0; i < 10; i++) pages.push([30 + i, 40 + i]); // src 30 is not after src 14: a new run of 10
    const { local, remote } = pagePairs(pages, PAGE);
    const manifest = { rows: [{ entry: 'target-kv layer 0 rank 0', checksum: checksumRanges(() => src, local) }] };
    const got = b.expect(
      'req-1',
      pageRanges(
        pages.map(([, d]) => d),
        PAGE,
      ),
      { timeoutMs: 10_000 },
    );
    const stats = await a.write(b.address, 'req-1', local, remote, manifest, { timeoutMs: 10_000 });
    expect(await got).toEqual(manifest);
    expect(stats).toEqual({ bytes: 25 * PAGE, descriptors: 1 + 5 + 1, messages: 2 });
    expect(firstDiff(dst, expectedAfter(before, src, pages, PAGE))).toBe(-1);
    expect(checksumRanges(() => dst, remote)).toBe(manifest.rows[0]?.checksum);
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
  });

  it('batches into messages of at most maxBatchBytes, splitting longer runs', async () => {
    const next = prng(15);
    const a = await engine({ maxBatchBytes: 4 * PAGE });
    const b = await engine();
    const src = randomBytes(64 * PAGE, next);
    const dst = new Uint8Array(64 * PAGE);
    a.registerRegions([{ id: 'src', bytes: src }]);
    b.registerRegions([{ id: 'dst', bytes: dst }]);
    const pages: [number, number][] = [];
    for (let i = 0; i < 10; i++) pages.push([i, 20 + i]);
    for (let i = 0; i < 5; i++) pages.push([10 + i, 5 + 2 * i]);
    for (let i = 0; i < 10; i++) pages.push([30 + i, 40 + i]);
    const { local, remote } = pagePairs(pages, PAGE);
    const got = b.expect('req-2', [{ region: 'dst', offset: 0, length: dst.length }], { timeoutMs: 10_000 });
    const stats = await a.write(b.address, 'req-2', local, remote, null, { timeoutMs: 10_000 });
    expect(await got).toBeNull();
    // runs in pages: 4 4 2 | 1 1 1 1 1 | 4 4 2 → messages [4] [4] [2 1 1] [1 1 1] [4] [4] [2] + the notification
    expect(stats).toEqual({ bytes: 25 * PAGE, descriptors: 11, messages: 8 });
    expect(firstDiff(dst, expectedAfter(new Uint8Array(64 * PAGE), src, pages, PAGE))).toBe(-1);
  });

  it('copies a random page mapping across two region pairs (many pages)', async () => {
    const seed = 20261202;
    const next = prng(seed);
    const small = 256;
    const n = 2048;
    const a = await engine({ maxBatchBytes: 64 * 1024 });
    const b = await engine();
    const src = [randomBytes(n * small, next), randomBytes(n * small, next)];
    const dst = [randomBytes(n * small, next), randomBytes(n * small, next)];
    const before = dst.map((d) => d.slice());
    a.registerRegions(src.map((bytes, i) => ({ id: `src${i}`, bytes })));
    b.registerRegions(dst.map((bytes, i) => ({ id: `dst${i}`, bytes })));
    // dst pages cut into blocks of 1..8 pages, shuffled; each block goes to a random region pair and takes the
    // next pages of that pair's src: consecutive blocks of one pair merge when their dst pages are adjacent
    const blocks: [number, number][] = [];
    for (let at = 0; at < n; ) {
      const len = Math.min(1 + Math.floor(next() * 8), n - at);
      blocks.push([at, len]);
      at += len;
    }
    for (let i = blocks.length - 1; i > 0; i--) {
      const j = Math.floor(next() * (i + 1));
      [blocks[i], blocks[j]] = [blocks[j] as [number, number], blocks[i] as [number, number]];
    }
    const l2: TransferDescriptor[] = [];
    const r2: TransferDescriptor[] = [];
    const cursor = [0, 0];
    for (const [start, len] of blocks) {
      const r = next() < 0.5 ? 0 : 1;
      for (let k = 0; k < len; k++) {
        l2.push({ region: `src${r}`, offset: ((cursor[r] as number) + k) * small, length: small });
        r2.push({ region: `dst${r}`, offset: (start + k) * small, length: small });
      }
      cursor[r] = (cursor[r] as number) + len;
    }
    let runs = 0; // the reference count: a pair starts a run unless it continues the previous one on both sides
    for (let i = 0; i < l2.length; i++) {
      const [pl, pr, cl, cr] = [l2[i - 1], r2[i - 1], l2[i] as TransferDescriptor, r2[i] as TransferDescriptor];
      const continues =
        pl !== undefined &&
        pr !== undefined &&
        pl.region === cl.region &&
        pr.region === cr.region &&
        pl.offset + pl.length === cl.offset &&
        pr.offset + pr.length === cr.offset;
      if (!continues) runs++;
    }
    expect(runs).toBeLessThan(l2.length); // some runs merged (the mapping has them)
    const allowed = r2.map((r) => ({ region: r.region, offset: r.offset, length: r.length }));
    const got = b.expect('rand', allowed, { timeoutMs: 10_000 });
    const stats = await a.write(b.address, 'rand', l2, r2, { seed }, { timeoutMs: 10_000 });
    expect(await got).toEqual({ seed });
    expect(stats.descriptors).toBe(runs);
    expect(stats.bytes).toBe(l2.length * small);
    for (const r of [0, 1]) {
      const want = (before[r] as Uint8Array).slice();
      for (let i = 0; i < l2.length; i++) {
        const [l, d] = [l2[i] as TransferDescriptor, r2[i] as TransferDescriptor];
        if (l.region !== `src${r}`) continue;
        want.set((src[r] as Uint8Array).subarray(l.offset, l.offset + l.length), d.offset);
      }
      expect(firstDiff(dst[r] as Uint8Array, want), `region dst${r}, seed ${seed}`).toBe(-1);
    }
  });

  it('runs several requests at once to one and to two receivers', async () => {
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
    // request k copies src pages 4k..4k+3 (of p1 for k < 6, else of p2) to d1 (even k) or d2 (odd k), pages 8k…
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
    const stats = await Promise.all(writes);
    expect(await Promise.all(expects)).toEqual(reqs.map((r) => ({ k: r.k })));
    for (const s of stats) expect(s).toEqual({ bytes: 4 * PAGE, descriptors: 1, messages: 2 });
    let want1 = new Uint8Array(64 * PAGE);
    let want2 = new Uint8Array(64 * PAGE);
    for (const r of reqs) {
      if (r.d === d1) want1 = expectedAfter(want1, r.src, r.pages, PAGE);
      else want2 = expectedAfter(want2, r.src, r.pages, PAGE);
    }
    expect([firstDiff(dst1, want1), firstDiff(dst2, want2)]).toEqual([-1, -1]);
    expect([p1.inflight, p2.inflight, d1.inflight, d2.inflight]).toEqual([0, 0, 0, 0]);
  });

  it('delivers a notification alone (a write without descriptors)', async () => {
    const [a, b] = [await engine(), await engine()];
    const got = b.expect('empty', [], { timeoutMs: 10_000 });
    const stats = await a.write(b.address, 'empty', [], [], { first: 42 }, { timeoutMs: 10_000 });
    expect(stats).toEqual({ bytes: 0, descriptors: 0, messages: 1 });
    expect(await got).toEqual({ first: 42 });
  });

  it('writes to itself (loopback) like to a peer', async () => {
    const a = await engine();
    const src = randomBytes(4 * PAGE, prng(17));
    const dst = new Uint8Array(4 * PAGE);
    a.registerRegions([
      { id: 'src', bytes: src },
      { id: 'dst', bytes: dst },
    ]);
    const { local, remote } = pagePairs(
      [
        [0, 3],
        [1, 2],
      ],
      PAGE,
    );
    const got = a.expect('self', pageRanges([2, 3], PAGE), { timeoutMs: 10_000 });
    expect(a.inflight).toBe(1);
    const w = a.write(a.address, 'self', local, remote, 'hi', { timeoutMs: 10_000 });
    expect(a.inflight).toBe(1); // one request, pending on both sides
    await w;
    expect(await got).toBe('hi');
    expect(
      firstDiff(
        dst,
        expectedAfter(
          new Uint8Array(4 * PAGE),
          src,
          [
            [0, 3],
            [1, 2],
          ],
          PAGE,
        ),
      ),
    ).toBe(-1);
    expect(a.inflight).toBe(0);
  });
});

describe('ZeroMQ transfer engine: refusals', () => {
  const PAGE = 512;

  async function pair(options: ZmqTransferEngineOptions = {}) {
    const a = await engine(options);
    const b = await engine();
    const src = randomBytes(16 * PAGE, prng(18));
    const dst = randomBytes(16 * PAGE, prng(19));
    a.registerRegions([{ id: 'src', bytes: src }]);
    b.registerRegions([{ id: 'dst', bytes: dst }]);
    return { a, b, src, dst, before: dst.slice() };
  }

  it('refuses a write outside the allowed ranges: the message is dropped, both sides fail naming it', async () => {
    const { a, b, dst, before } = await pair();
    // allowed: dst pages 0..3; the write's pages 2..5 coalesce into one run that leaves the allowed ranges
    const got = rejection(b.expect('out', pageRanges([0, 1, 2, 3], PAGE), { timeoutMs: 10_000 }));
    const { local, remote } = pagePairs(
      [
        [0, 2],
        [1, 3],
        [2, 4],
        [3, 5],
      ],
      PAGE,
    );
    const w = await rejection(a.write(b.address, 'out', local, remote, null, { timeoutMs: 10_000 }));
    expect(w.code).toBe('layout');
    expect(w.message).toContain(`region 'dst' offset ${2 * PAGE} length ${4 * PAGE}`);
    expect(w.message).toContain('outside the ranges allowed');
    expect(w.message).toContain(b.address);
    const e = await got;
    expect(e.code).toBe('layout');
    expect(e.message).toContain(`region 'dst' offset ${2 * PAGE} length ${4 * PAGE}`);
    expect(firstDiff(dst, before)).toBe(-1); // nothing written, not even the allowed pages 2 and 3
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
  });

  it('refuses a write into a region the receiver did not register, and past a region end', async () => {
    const { a, b, dst, before } = await pair();
    const got = rejection(b.expect('nope', pageRanges([0], PAGE), { timeoutMs: 10_000 }));
    const w = await rejection(
      a.write(
        b.address,
        'nope',
        [{ region: 'src', offset: 0, length: 8 }],
        [{ region: 'ghost', offset: 0, length: 8 }],
        1,
        {
          timeoutMs: 10_000,
        },
      ),
    );
    expect([w.code, (await got).code]).toEqual(['layout', 'layout']);
    expect(w.message).toContain("region 'ghost' offset 0 length 8");
    expect(w.message).toContain('not a registered region');

    const got2 = rejection(b.expect('end', pageRanges([15], PAGE), { timeoutMs: 10_000 }));
    const past = { region: 'dst', offset: 16 * PAGE - 4, length: 8 };
    const w2 = await rejection(
      a.write(b.address, 'end', [{ region: 'src', offset: 0, length: 8 }], [past], 1, {
        timeoutMs: 10_000,
      }),
    );
    expect(w2.message).toContain(`outside the region's ${16 * PAGE} bytes`);
    expect((await got2).code).toBe('layout');
    expect(firstDiff(dst, before)).toBe(-1);
  });

  it('refuses an allowed range outside a registered region at expect()', async () => {
    const { b } = await pair();
    const e = await rejection(b.expect('bad', [{ region: 'dst', offset: 16 * PAGE, length: 1 }], { timeoutMs: 100 }));
    expect(e.code).toBe('layout');
    expect(e.message).toContain(`allowed region 'dst' offset ${16 * PAGE} length 1`);
    expect(b.inflight).toBe(0);
  });

  it('refuses a timeout that is not a positive number of ms', async () => {
    const { a, b } = await pair();
    await expect(b.expect('t', [], { timeoutMs: 0 })).rejects.toThrow(
      'expect: options.timeoutMs must be a positive number of ms, got 0',
    );
    await expect(a.write(b.address, 't', [], [], null, { timeoutMs: Number.NaN })).rejects.toThrow(
      'write: options.timeoutMs must be a positive number of ms, got NaN',
    );
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
  });

  it('refuses local layout errors before sending anything', async () => {
    const { a, b } = await pair();
    const e = await rejection(
      a.write(b.address, 'x', [{ region: 'src', offset: 0, length: 8 }], [{ region: 'dst', offset: 0, length: 4 }], 1, {
        timeoutMs: 100,
      }),
    );
    expect(e.code).toBe('layout');
    expect(e.message).toMatch(/^write x: descriptor 0: local length 8 differs from remote length 4/);
    expect(a.inflight).toBe(0);
  });

  it('answers a write of a request not expected, or aborted, with abort: nothing is written', async () => {
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
    expect(late.code).toBe('abort');
    expect(late.message).toContain('client went away');
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

  it('refuses, without writing, out-of-order data and a notification whose counts disagree (a raw peer)', async () => {
    const b = await engine();
    const dst = new Uint8Array(4 * PAGE);
    b.registerRegions([{ id: 'dst', bytes: dst }]);
    const raw = new zmq.Dealer({ linger: 0 });
    raw.connect(b.address);
    try {
      const header = (h: object) => Buffer.from(JSON.stringify(h));
      const page = Buffer.alloc(PAGE, 7);
      // data message 1 before 0: a gap
      const gap = rejection(b.expect('gap', pageRanges([0, 1], PAGE), { timeoutMs: 10_000 }));
      await raw.send([header({ t: 'data', req: 'gap', seq: 1, d: [['dst', 0, PAGE]] }), page]);
      const [answer] = await raw.receive();
      const e = await gap;
      expect([e.code, e.message]).toEqual(['peer', 'request gap: data message 1 arrived, expected 0']);
      expect(JSON.parse(String(answer))).toEqual({
        t: 'done',
        req: 'gap',
        ok: false,
        code: 'peer',
        message: e.message,
      });
      // a notification announcing a data message that never came
      const lost = rejection(b.expect('lost', pageRanges([0, 1], PAGE), { timeoutMs: 10_000 }));
      await raw.send(header({ t: 'notify', req: 'lost', batches: 1, descriptors: 1, bytes: PAGE }));
      const l = await lost;
      expect([l.code, l.message]).toEqual([
        'peer',
        `request lost: the sender sent 1 data messages / 1 descriptors / ${PAGE} bytes, ${b.address} applied 0 / 0 / 0`,
      ]);
      // packed frames (f): counts that do not cut the frame exactly are malformed, nothing is written
      const badPack = rejection(b.expect('pack', pageRanges([0, 1], PAGE), { timeoutMs: 10_000 }));
      await raw.send([
        header({
          t: 'data',
          req: 'pack',
          seq: 0,
          d: [
            ['dst', 0, 100],
            ['dst', 100, 100],
          ],
          f: [2],
        }),
        Buffer.alloc(150, 9),
      ]);
      await raw.receive();
      const p = await badPack;
      expect([p.code, p.message]).toEqual(['peer', 'request pack: malformed data message 0']);
      // a header that is not JSON is dropped; the engine still serves
      await raw.send([Buffer.from('not json'), page]);
      const ok = b.expect('ok', pageRanges([2, 3], PAGE), { timeoutMs: 10_000 });
      await raw.send([header({ t: 'data', req: 'ok', seq: 0, d: [['dst', 2 * PAGE, PAGE]] }), page]);
      // two descriptors packed in one frame (as the sender packs small ones): each lands at its own offset
      const packed = Buffer.concat([Buffer.alloc(PAGE / 2, 5), Buffer.alloc(PAGE / 2, 6)]);
      const halves = [
        ['dst', 3 * PAGE + PAGE / 2, PAGE / 2],
        ['dst', 3 * PAGE, PAGE / 2],
      ];
      await raw.send([header({ t: 'data', req: 'ok', seq: 1, d: halves, f: [2] }), packed]);
      await raw.send(header({ t: 'notify', req: 'ok', batches: 2, descriptors: 3, bytes: 2 * PAGE, payload: 'p' }));
      expect(await ok).toBe('p');
      const want = new Uint8Array(4 * PAGE);
      want.fill(7, 2 * PAGE, 3 * PAGE);
      want.fill(6, 3 * PAGE, 3 * PAGE + PAGE / 2);
      want.fill(5, 3 * PAGE + PAGE / 2, 4 * PAGE);
      expect(firstDiff(dst, want)).toBe(-1); // only the in-order, complete request landed
      expect(b.inflight).toBe(0);
    } finally {
      raw.close();
    }
  });
});

describe('ZeroMQ transfer engine: faults', () => {
  const PAGE = 256;

  it('rejects a write to an address nobody listens on with peer, within its timeout', { timeout: 3000 }, async () => {
    const gone = await createZmqTransferEngine({});
    const address = gone.address;
    await gone.close();
    const a = await engine();
    a.registerRegions([{ id: 'src', bytes: new Uint8Array(PAGE) }]);
    const e = await rejection(
      a.write(
        address,
        'lost',
        [{ region: 'src', offset: 0, length: PAGE }],
        [{ region: 'dst', offset: 0, length: PAGE }],
        1,
        {
          timeoutMs: 300,
        },
      ),
    );
    expect(e.code).toBe('peer');
    expect(e.message).toBe(`request lost: peer ${address} unreachable (no connection within 300 ms)`);
    expect(a.inflight).toBe(0);
  });

  it('rejects an expect that nothing completes with timeout', { timeout: 3000 }, async () => {
    const b = await engine();
    b.registerRegions([{ id: 'dst', bytes: new Uint8Array(PAGE) }]);
    const e = await rejection(b.expect('idle', pageRanges([0], PAGE), { timeoutMs: 200 }));
    expect(e.code).toBe('timeout');
    expect(e.message).toBe(`request idle: transfer to ${b.address} not complete within 200 ms (no sender seen)`);
    expect(b.inflight).toBe(0);
  });

  it('pauses the sender after N descriptors; the receiver applied exactly those; abort ends both sides', async () => {
    const watch = appliedWatch();
    const paused: string[] = [];
    const a = await engine({
      maxBatchBytes: 2 * PAGE,
      testHooks: { pauseAfterDescriptors: 3, onPause: (r) => paused.push(r) },
    });
    const b = await engine({ testHooks: { onApplied: watch.onApplied } });
    const src = randomBytes(16 * PAGE, prng(21));
    const dst = new Uint8Array(16 * PAGE);
    a.registerRegions([{ id: 'src', bytes: src }]);
    b.registerRegions([{ id: 'dst', bytes: dst }]);
    const pages: [number, number][] = [0, 1, 2, 3, 4, 5].map((i) => [i, 2 * i]); // 6 scattered pages = 6 descriptors
    const { local, remote } = pagePairs(pages, PAGE);
    const allowed = pageRanges(
      pages.map(([, d]) => d),
      PAGE,
    );
    const got = rejection(b.expect('p', allowed, { timeoutMs: 60_000 }));
    const w = rejection(a.write(b.address, 'p', local, remote, null, { timeoutMs: 60_000 }));
    const applied = await watch.reached('p', 3);
    expect(applied).toEqual({ descriptors: 3, bytes: 3 * PAGE });
    expect(paused).toEqual(['p']);
    expect([a.inflight, b.inflight]).toEqual([1, 1]);
    a.abort('p', 'test abort');
    const [we, ee] = [await w, await got];
    expect([we.code, ee.code]).toEqual(['abort', 'abort']);
    expect(ee.message).toBe('request p aborted by the sender: test abort');
    expect(firstDiff(dst, expectedAfter(new Uint8Array(16 * PAGE), src, pages.slice(0, 3), PAGE))).toBe(-1);
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
  });

  it('an abort at the receiver reaches a sender it has heard from', async () => {
    const watch = appliedWatch();
    const a = await engine({ testHooks: { pauseAfterDescriptors: 1 } });
    const b = await engine({ testHooks: { onApplied: watch.onApplied } });
    a.registerRegions([{ id: 'src', bytes: new Uint8Array(4 * PAGE) }]);
    b.registerRegions([{ id: 'dst', bytes: new Uint8Array(4 * PAGE) }]);
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

  it('close() rejects every pending expect and write, and later calls', async () => {
    const a = await engine({ testHooks: { pauseAfterDescriptors: 0 } });
    const b = await engine();
    a.registerRegions([{ id: 'src', bytes: new Uint8Array(PAGE) }]);
    b.registerRegions([{ id: 'dst', bytes: new Uint8Array(PAGE) }]);
    const { local, remote } = pagePairs([[0, 0]], PAGE);
    const e1 = rejection(b.expect('c1', pageRanges([0], PAGE), { timeoutMs: 60_000 }));
    const e2 = rejection(b.expect('c2', pageRanges([0], PAGE), { timeoutMs: 60_000 }));
    const w1 = rejection(a.write(b.address, 'c1', local, remote, null, { timeoutMs: 60_000 }));
    expect([a.inflight, b.inflight]).toEqual([1, 2]);
    await b.close();
    await a.close();
    for (const p of [e1, e2, w1]) {
      const err = await p;
      expect(err.code).toBe('abort');
      expect(err.message).toMatch(/the transfer engine at tcp:\/\/127\.0\.0\.1:\d+ is closed/);
    }
    expect([a.inflight, b.inflight]).toEqual([0, 0]);
    expect((await rejection(b.expect('c3', [], { timeoutMs: 10 }))).code).toBe('abort');
    expect((await rejection(a.write(b.address, 'c3', [], [], null, { timeoutMs: 10 }))).code).toBe('abort');
    await a.close(); // idempotent
  });
});

describe('ZeroMQ transfer engine: a peer process killed mid-request', () => {
  const BYTES = 64 * 1024;

  function spawnPeer(args: string[]): Promise<{ child: ChildProcess; address: string; messages: unknown[] }> {
    const child = fork(PEER, args, { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    children.push(child);
    const messages: unknown[] = [];
    return new Promise((resolve, reject) => {
      child.on('message', (m: { address?: string }) => {
        messages.push(m);
        if (m.address !== undefined) resolve({ child, address: m.address, messages });
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

  it('a sender killed after N descriptors: the receiver applied exactly those and times out', {
    timeout: 20_000,
  }, async () => {
    const watch = appliedWatch();
    const d = await engine({ testHooks: { onApplied: watch.onApplied } });
    const dst = new Uint8Array(BYTES);
    d.registerRegions([{ id: 'dst', bytes: dst }]);
    const { child } = await spawnPeer(['sender', String(BYTES), '2']);
    const page = 1024;
    const pages: [number, number][] = [0, 1, 2, 3, 4].map((i) => [3 * i, i]); // 5 descriptors (src scattered)
    const { local, remote } = pagePairs(pages, page);
    const got = rejection(d.expect('killed-p', pageRanges([0, 1, 2, 3, 4], page), { timeoutMs: 1000 }));
    const paused = nextMessage<{ paused?: string }>(child, (m) => m.paused !== undefined);
    child.send({ write: { peer: d.address, req: 'killed-p', local, remote, timeoutMs: 60_000 } });
    expect(await paused).toEqual({ paused: 'killed-p' });
    expect(await watch.reached('killed-p', 2)).toEqual({ descriptors: 2, bytes: 2 * page });
    await killed(child);
    const e = await got;
    expect(e.code).toBe('timeout');
    expect(e.message).toBe(
      `request killed-p: transfer to ${d.address} not complete within 1000 ms ` +
        `(2 descriptors, ${2 * page} bytes applied)`,
    );
    const src = new Uint8Array(BYTES);
    for (let i = 0; i < src.length; i++) src[i] = (i * 7 + 3) & 255; // the fixture's fill
    expect(firstDiff(dst, expectedAfter(new Uint8Array(BYTES), src, pages.slice(0, 2), page))).toBe(-1);
    expect(d.inflight).toBe(0);
  });

  it('a receiver killed between requests: the next write names the peer and rejects in time', {
    timeout: 20_000,
  }, async () => {
    const p = await engine();
    p.registerRegions([{ id: 'src', bytes: randomBytes(BYTES, prng(22)) }]);
    const { child, address } = await spawnPeer(['receiver', String(BYTES)]);
    const desc = [{ region: 'src', offset: 0, length: 4096 }];
    const target = [{ region: 'dst', offset: 0, length: 4096 }];
    // a first request completes: the connection exists
    const settled = nextMessage<{ settled?: string }>(child, (m) => m.settled === 'one');
    const expecting = nextMessage<{ expecting?: string }>(child, (m) => m.expecting === 'one');
    child.send({ expect: { req: 'one', allowed: target, timeoutMs: 10_000 } });
    await expecting;
    const stats = await p.write(address, 'one', desc, target, null, { timeoutMs: 10_000 });
    expect(await settled).toEqual({ settled: 'one', payload: null });
    expect(stats.bytes).toBe(4096);
    await killed(child);
    // the connection existed: the peer went silent
    const e = await rejection(p.write(address, 'two', desc, target, null, { timeoutMs: 500 }));
    expect([e.code, e.message]).toEqual([
      'timeout',
      `request two: peer ${address} did not confirm the transfer within 500 ms (0 of 1 descriptors sent; ` +
        'the peer may be dead)',
    ]);
    expect(p.inflight).toBe(0);
    // that connection was dropped; a new one never forms
    const e3 = await rejection(p.write(address, 'three', desc, target, null, { timeoutMs: 500 }));
    expect([e3.code, e3.message]).toEqual([
      'peer',
      `request three: peer ${address} unreachable (no connection within 500 ms)`,
    ]);
  });
});
