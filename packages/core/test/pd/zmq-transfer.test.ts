// The ZeroMQ/TCP transfer engine's own details over real sockets on 127.0.0.1 (port 0): the coalescing of descriptor
// pairs, batching into messages of at most maxBatchBytes, loopback writes, the wire format checked with a raw peer,
// and the pause hook across batches. Everything both engines must do (integrity, ordering, refusals, aborts,
// timeouts, close, a peer process killed mid-request) is the shared suite's, transfer-engines.test.ts. Runs against
// dist/ (`npm run build:ts`).
import { afterEach, describe, expect, it } from 'vitest';
import * as zmq from 'zeromq';

import { coalesceDescriptors, type TransferDescriptor, type TransferEngine } from '../../dist/pd/transfer-engine.js';
import { createZmqTransferEngine, type ZmqTransferEngineOptions } from '../../dist/pd/zmq-transfer.js';
import { prng, randomBytes } from '../io/helpers.js';
import { appliedWatch, expectedAfter, firstDiff, pagePairs, pageRanges, rejection } from './transfer-helpers.js';

const engines: TransferEngine[] = [];

afterEach(async () => {
  for (const e of engines.splice(0)) await e.close();
});

async function engine(options: ZmqTransferEngineOptions = {}): Promise<TransferEngine> {
  const e = await createZmqTransferEngine(options);
  engines.push(e);
  return e;
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

describe('ZeroMQ transfer engine: batches', () => {
  const PAGE = 1024;

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

describe('ZeroMQ transfer engine: the wire format (a raw peer)', () => {
  const PAGE = 512;

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

describe('ZeroMQ transfer engine: the pause hook across batches', () => {
  const PAGE = 256;

  // the shared suite pauses within one message; here messages of 2 descriptors: the pause falls after message 2
  it('pauses the sender after N descriptors across messages: exactly those applied; abort ends both', async () => {
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
});
