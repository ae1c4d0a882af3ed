// Paged GQA attention: accuracy vs a float64 reference (causal, non-causal, sliding windows, odd
// shapes, page sizes that do not divide the lengths), batch invariance bit for bit (alone vs block
// vs batch vs other thread counts), async == sync, page writes and copies, argument errors. Both
// ISA paths.
import { afterAll, describe, expect, it } from 'vitest';
import {
  copyPages,
  prefetchPages,
  createKvPool,
  isa,
  kvPageElements,
  makePagedBatch,
  pagedAttention,
  pagedAttentionAsync,
  setIsa,
  setNumThreads,
  writeKvPages,
  type AttentionMask,
  type KvLayout,
  type KvPageLayout,
  type PagedBatch,
} from '@specd/native';
import {
  firstBitDifference,
  firstMismatches,
  freshSeed,
  isaPaths,
  poisoned,
  randomF32,
  relError,
  rng,
  withIsa,
} from './reference.js';

/** One sequence of a test case: keys in its cache and the positions of its queries. */
interface SeqCase {
  kvLen: number;
  positions: number[];
}

interface Case {
  name: string;
  seqs: SeqCase[];
  pageSize: number;
  numKvHeads: number;
  numHeads: number;
  headDim: number;
  mask: AttentionMask;
  window?: number;
  kvLayout?: KvLayout;
}

/** A filled cache: logical K/V per sequence [kvLen, kvH, hd], written into shuffled pages. */
interface Cache {
  layout: KvPageLayout;
  kPool: Float32Array;
  vPool: Float32Array;
  k: Float32Array[];
  v: Float32Array[];
  pages: number[][];
}

function shuffled(n: number, next: () => number): number[] {
  const a = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    [a[i], a[j]] = [a[j]!, a[i]!];
  }
  return a;
}

function buildCache(c: Case, next: () => number): Cache {
  const need = c.seqs.map((s) => Math.ceil(s.kvLen / c.pageSize));
  const numPages = need.reduce((a, b) => a + b, 0) + 3; // spare pages stay zero (never read)
  const layout: KvPageLayout = {
    numPages,
    pageSize: c.pageSize,
    numKvHeads: c.numKvHeads,
    headDim: c.headDim,
    kvLayout: c.kvLayout,
  };
  const kPool = createKvPool(layout);
  const vPool = createKvPool(layout);
  const ids = shuffled(numPages, next);
  const row = c.numKvHeads * c.headDim;
  const cache: Cache = { layout, kPool, vPool, k: [], v: [], pages: [] };
  let used = 0;
  for (let s = 0; s < c.seqs.length; s++) {
    const { kvLen } = c.seqs[s]!;
    const pages = ids.slice(used, used + need[s]!);
    used += need[s]!;
    const k = randomF32(kvLen * row, next);
    const v = randomF32(kvLen * row, next);
    const slots = Int32Array.from(
      { length: kvLen },
      (_, j) => pages[Math.floor(j / c.pageSize)]! * c.pageSize + (j % c.pageSize),
    );
    writeKvPages(layout, k, v, kPool, vPool, slots);
    cache.k.push(k);
    cache.v.push(v);
    cache.pages.push(pages);
  }
  return cache;
}

function batchOf(c: Case, cache: Cache, seqIds: number[], positions: number[][]): PagedBatch {
  return makePagedBatch(
    seqIds.map((s, i) => ({
      qLen: positions[i]!.length,
      kvLen: c.seqs[s]!.kvLen,
      pages: cache.pages[s]!,
      positions: positions[i]!,
    })),
  );
}

function visible(c: Case, kvLen: number, p: number, j: number): boolean {
  if (j >= kvLen) return false;
  if (c.mask === 'causal' && j > p) return false;
  if (c.window) {
    if (p - j >= c.window) return false;
    if (c.mask === 'non-causal' && j - p >= c.window) return false;
  }
  return true;
}

/** float64 reference over the logical (unpaged) K/V: [totalQ, H, hd]. */
function reference(c: Case, cache: Cache, q: Float32Array, scale: number): Float64Array {
  const { numHeads: H, numKvHeads: KV, headDim: D } = c;
  const g = H / KV;
  const totalQ = c.seqs.reduce((a, s) => a + s.positions.length, 0);
  const out = new Float64Array(totalQ * H * D);
  let t = 0;
  c.seqs.forEach((s, si) => {
    const k = cache.k[si]!;
    const v = cache.v[si]!;
    for (const p of s.positions) {
      for (let h = 0; h < H; h++) {
        const kvh = Math.floor(h / g);
        const scores: number[] = [];
        const keys: number[] = [];
        for (let j = 0; j < s.kvLen; j++) {
          if (!visible(c, s.kvLen, p, j)) continue;
          let dot = 0;
          for (let d = 0; d < D; d++) dot += q[(t * H + h) * D + d]! * k[(j * KV + kvh) * D + d]!;
          scores.push(dot * scale);
          keys.push(j);
        }
        if (keys.length === 0) continue;
        const m = Math.max(...scores);
        const w = scores.map((x) => Math.exp(x - m));
        const sum = w.reduce((a, b) => a + b, 0);
        for (let d = 0; d < D; d++) {
          let acc = 0;
          keys.forEach((j, i) => {
            acc += w[i]! * v[(j * KV + kvh) * D + d]!;
          });
          out[(t * H + h) * D + d] = acc / sum;
        }
      }
      t++;
    }
  });
  return out;
}

/** Last qLen tokens of a cache of kvLen keys, as a block (verification / prefill chunk). */
const tail = (kvLen: number, qLen: number) => Array.from({ length: qLen }, (_, i) => kvLen - qLen + i);

const cases: Case[] = [
  {
    name: 'decode, H=3 kvH=1 hd=40, page 16',
    seqs: [
      { kvLen: 37, positions: [36] },
      { kvLen: 5, positions: [4] },
    ],
    pageSize: 16,
    numKvHeads: 1,
    numHeads: 3,
    headDim: 40,
    mask: 'causal',
  },
  {
    name: 'causal verify blocks, GQA 8/2 hd=64',
    seqs: [
      { kvLen: 53, positions: tail(53, 16) },
      { kvLen: 16, positions: tail(16, 16) },
      { kvLen: 1, positions: [0] },
    ],
    pageSize: 16,
    numKvHeads: 2,
    numHeads: 8,
    headDim: 64,
    mask: 'causal',
  },
  {
    name: 'causal prefill, hd=128, page 5',
    seqs: [{ kvLen: 70, positions: tail(70, 70) }],
    pageSize: 5,
    numKvHeads: 2,
    numHeads: 4,
    headDim: 128,
    mask: 'causal',
  },
  {
    name: 'non-causal draft block (context + block keys), hd=40',
    seqs: [
      { kvLen: 45, positions: tail(45, 8) },
      { kvLen: 9, positions: tail(9, 8) },
    ],
    pageSize: 16,
    numKvHeads: 1,
    numHeads: 3,
    headDim: 40,
    mask: 'non-causal',
  },
  {
    name: 'causal sliding window 7, hd=33',
    seqs: [
      { kvLen: 41, positions: tail(41, 6) },
      { kvLen: 3, positions: [2] },
    ],
    pageSize: 16,
    numKvHeads: 3,
    numHeads: 6,
    headDim: 33,
    mask: 'causal',
    window: 7,
  },
  {
    name: 'causal sliding window 23 spanning chunks, block of 12',
    seqs: [
      { kvLen: 64, positions: tail(64, 12) },
      { kvLen: 40, positions: tail(40, 3) },
    ],
    pageSize: 16,
    numKvHeads: 1,
    numHeads: 2,
    headDim: 24,
    mask: 'causal',
    window: 23,
  },
  {
    name: 'non-causal sliding window 5',
    seqs: [{ kvLen: 30, positions: tail(30, 7) }],
    pageSize: 4,
    numKvHeads: 1,
    numHeads: 2,
    headDim: 16,
    mask: 'non-causal',
    window: 5,
  },
  {
    name: 'empty block, empty cache, queries beyond the cache',
    seqs: [
      { kvLen: 20, positions: [] },
      { kvLen: 0, positions: [0, 1] },
      { kvLen: 18, positions: [25, 40] },
    ],
    pageSize: 16,
    numKvHeads: 1,
    numHeads: 2,
    headDim: 17,
    mask: 'causal',
    window: 20,
  },
  {
    name: 'one head per KV head, hd=256',
    seqs: [{ kvLen: 100, positions: tail(100, 3) }],
    pageSize: 32,
    numKvHeads: 2,
    numHeads: 2,
    headDim: 256,
    mask: 'causal',
  },
];

/** f32 attention vs float64 (relative L2): dot over hd plus a softmax-weighted sum over the keys, ~sqrt(terms) ulp
 *  (measured 0.8e-7..2.2e-7 on both paths, tolerance 1.2e-6..2.4e-6). */
const tolAttention = (c: Case) => 2 * 2 ** -24 * Math.sqrt(c.headDim + Math.max(...c.seqs.map((s) => s.kvLen))) + 1e-7;

function run(c: Case, cache: Cache, batch: PagedBatch, q: Float32Array, scale: number): Float32Array {
  const out = poisoned(q.length);
  return pagedAttention(
    q,
    cache.kPool,
    cache.vPool,
    cache.layout,
    batch,
    { numHeads: c.numHeads, scale, mask: c.mask, slidingWindow: c.window },
    out,
  );
}

afterAll(() => {
  setIsa('auto');
  setNumThreads(isa().threads);
});

const paths = isaPaths().flatMap((p) => (['NHD', 'HND'] as const).map((l) => [p, l] as const));

describe.each(paths)('pagedAttention on the %s path, %s pages', (path, kvLayout) => {
  it.each(cases.map((c) => [c.name, { ...c, kvLayout }] as const))('matches float64: %s', (_, c) => {
    const seed = freshSeed();
    const next = rng(seed);
    const cache = buildCache(c, next);
    const totalQ = c.seqs.reduce((a, s) => a + s.positions.length, 0);
    const q = randomF32(totalQ * c.numHeads * c.headDim, next, 3);
    const scale = c.headDim ** -0.5;
    const batch = batchOf(
      c,
      cache,
      c.seqs.map((_, i) => i),
      c.seqs.map((s) => s.positions),
    );
    const y = withIsa(path, () => run(c, cache, batch, q, scale));
    const ref = reference(c, cache, q, scale);
    const err = relError(y, ref);
    if (process.env.SPECD_TEST_VERBOSE) console.log(path, c.name, err, tolAttention(c));
    expect(err, `seed ${seed}: rel err ${err}; ${firstMismatches(y, ref, 1e-4)}`).toBeLessThan(tolAttention(c));
  });

  it.each(cases.map((c) => [c.name, { ...c, kvLayout }] as const))(
    'is batch invariant (alone, sub-blocks, permuted batch, 1-3 threads), bit for bit: %s',
    (_, c) => {
      const seed = freshSeed();
      const next = rng(seed);
      const cache = buildCache(c, next);
      const per = c.numHeads * c.headDim;
      const totalQ = c.seqs.reduce((a, s) => a + s.positions.length, 0);
      const q = randomF32(totalQ * per, next, 3);
      const scale = c.headDim ** -0.5;
      const offsets = c.seqs.map((_, s) => c.seqs.slice(0, s).reduce((a, x) => a + x.positions.length, 0));
      withIsa(path, () => {
        setNumThreads(2);
        const full = run(
          c,
          cache,
          batchOf(
            c,
            cache,
            c.seqs.map((_, i) => i),
            c.seqs.map((s) => s.positions),
          ),
          q,
          scale,
        );
        const check = (y: Float32Array, rows: Array<[seq: number, i: number]>, what: string) => {
          rows.forEach(([s, i], r) => {
            const t = offsets[s]! + i;
            const diff = firstBitDifference(y.subarray(r * per, (r + 1) * per), full.subarray(t * per, (t + 1) * per));
            expect(diff, `seed ${seed}: ${what}: seq ${s} query ${i} differs at ${diff}`).toBe(-1);
          });
        };
        // Every query alone (qLen 1), on 1 and 3 threads.
        for (const threads of [1, 3]) {
          setNumThreads(threads);
          c.seqs.forEach((s, si) => {
            s.positions.forEach((p, i) => {
              const y = run(
                c,
                cache,
                batchOf(c, cache, [si], [[p]]),
                q.slice((offsets[si]! + i) * per, (offsets[si]! + i + 1) * per),
                scale,
              );
              check(y, [[si, i]], `alone, ${threads} threads`);
            });
          });
        }
        setNumThreads(2);
        // Sub-blocks of each sequence's block, batched in reverse sequence order.
        const order = c.seqs.map((_, i) => i).reverse();
        const rows: Array<[number, number]> = [];
        const pos: number[][] = [];
        const parts: Float32Array[] = [];
        for (const s of order) {
          const n = c.seqs[s]!.positions.length;
          const b = Math.floor(n / 3);
          const e = Math.max(b, n - 1);
          pos.push(c.seqs[s]!.positions.slice(b, e));
          for (let i = b; i < e; i++) rows.push([s, i]);
          parts.push(q.slice((offsets[s]! + b) * per, (offsets[s]! + e) * per));
        }
        const qq = new Float32Array(parts.reduce((a, p) => a + p.length, 0));
        let o = 0;
        for (const p of parts) {
          qq.set(p, o);
          o += p.length;
        }
        check(run(c, cache, batchOf(c, cache, order, pos), qq, scale), rows, 'sub-blocks, permuted batch');
      });
    },
  );

  it('async equals sync bit for bit', async () => {
    const c = { ...cases[1]!, kvLayout };
    const seed = freshSeed();
    const next = rng(seed);
    const cache = buildCache(c, next);
    const totalQ = c.seqs.reduce((a, s) => a + s.positions.length, 0);
    const q = randomF32(totalQ * c.numHeads * c.headDim, next, 3);
    const batch = batchOf(
      c,
      cache,
      c.seqs.map((_, i) => i),
      c.seqs.map((s) => s.positions),
    );
    const options = { numHeads: c.numHeads, scale: 0.125, mask: c.mask };
    setIsa(path);
    try {
      const sync = pagedAttention(q, cache.kPool, cache.vPool, cache.layout, batch, options, poisoned(q.length));
      const async = await pagedAttentionAsync(
        q,
        cache.kPool,
        cache.vPool,
        cache.layout,
        batch,
        options,
        poisoned(q.length),
      );
      expect(firstBitDifference(async, sync), `seed ${seed}`).toBe(-1);
    } finally {
      setIsa('auto');
    }
  });
});

describe('KV pages', () => {
  it('prefetchPages leaves the pool as it was and names a page outside it', () => {
    const pool = new Float32Array(5 * 48).map((_, i) => Math.sin(i));
    const copy = Float32Array.from(pool);
    prefetchPages(pool, 48, Int32Array.of(4, 0, 2, 2));
    expect(firstBitDifference(pool, copy)).toBe(-1);
    expect(() => prefetchPages(pool, 48, Int32Array.of(1, 5))).toThrow(
      /prefetchPages: pages: expected page ids in \[0, 5\), got pages\[1\] = 5/,
    );
    expect(() => prefetchPages(pool, 0, Int32Array.of(0))).toThrow(/prefetchPages: pageElements/);
    // K and V in one call: both untouched; a page id is checked against the smaller pool
    const pool2 = new Float32Array(3 * 48).map((_, i) => Math.cos(i));
    const copy2 = Float32Array.from(pool2);
    prefetchPages(pool, 48, Int32Array.of(2, 0, 1), pool2);
    expect(firstBitDifference(pool, copy)).toBe(-1);
    expect(firstBitDifference(pool2, copy2)).toBe(-1);
    expect(() => prefetchPages(pool, 48, Int32Array.of(0, 4), pool2)).toThrow(
      /prefetchPages: pages: expected page ids in \[0, 3\), got pages\[1\] = 4/,
    );
    expect(() => prefetchPages(pool, 48, Int32Array.of(0), new Float64Array(48) as never)).toThrow(
      /prefetchPages: pool2/,
    );
  });

  it('copyPages moves whole pages (same pool and another pool); attention on the copy is identical', () => {
    const c = cases[1]!;
    const seed = freshSeed();
    const next = rng(seed);
    const cache = buildCache(c, next);
    const totalQ = c.seqs.reduce((a, s) => a + s.positions.length, 0);
    const q = randomF32(totalQ * c.numHeads * c.headDim, next, 3);
    const before = run(
      c,
      cache,
      batchOf(
        c,
        cache,
        c.seqs.map((_, i) => i),
        c.seqs.map((s) => s.positions),
      ),
      q,
      0.2,
    );
    // Into a second pool with a different page order (PD hand-over).
    const layout2 = { ...cache.layout, numPages: cache.layout.numPages + 4 };
    const k2 = createKvPool(layout2);
    const v2 = createKvPool(layout2);
    const src = cache.pages.flat();
    const dst = shuffled(layout2.numPages, next).slice(0, src.length);
    const el = kvPageElements(cache.layout);
    copyPages(cache.kPool, k2, el, Int32Array.from(src), Int32Array.from(dst));
    copyPages(cache.vPool, v2, el, Int32Array.from(src), Int32Array.from(dst));
    const remap = new Map(src.map((p, i) => [p, dst[i]!]));
    const cache2: Cache = {
      ...cache,
      layout: layout2,
      kPool: k2,
      vPool: v2,
      pages: cache.pages.map((ps) => ps.map((p) => remap.get(p)!)),
    };
    const after = run(
      c,
      cache2,
      batchOf(
        c,
        cache2,
        c.seqs.map((_, i) => i),
        c.seqs.map((s) => s.positions),
      ),
      q,
      0.2,
    );
    expect(firstBitDifference(after, before), `seed ${seed}`).toBe(-1);
    // Within one pool: page 0's contents copied to the spare page.
    const spare = cache.layout.numPages - 1;
    copyPages(cache.kPool, cache.kPool, el, Int32Array.of(src[0]!), Int32Array.of(spare));
    expect(cache.kPool.subarray(spare * el, (spare + 1) * el)).toEqual(
      cache.kPool.subarray(src[0]! * el, (src[0]! + 1) * el),
    );
    expect(() => copyPages(cache.kPool, cache.kPool, el, Int32Array.of(0, 1), Int32Array.of(1, 2))).toThrow(/srcPages/);
    expect(() => copyPages(cache.kPool, k2, el, Int32Array.of(0, 1), Int32Array.of(3, 3))).toThrow(/distinct/);
    expect(() => copyPages(cache.kPool, k2, el, Int32Array.of(cache.layout.numPages), Int32Array.of(0))).toThrow(
      /srcPages/,
    );
  });

  it('writeKvPages skips slot -1 and writes rows at page*pageSize+offset', () => {
    const layout = { numPages: 3, pageSize: 4, numKvHeads: 2, headDim: 3 };
    const k = createKvPool(layout);
    const v = createKvPool(layout);
    const rowsK = Float32Array.from({ length: 12 }, (_, i) => i + 1);
    const rowsV = rowsK.map((x) => -x);
    writeKvPages(layout, rowsK, rowsV, k, v, Int32Array.of(9, -1));
    expect(Array.from(k.subarray(9 * 6, 10 * 6))).toEqual([1, 2, 3, 4, 5, 6]);
    expect(Array.from(v.subarray(9 * 6, 10 * 6))).toEqual([-1, -2, -3, -4, -5, -6]);
    expect(k.reduce((a, x) => a + x, 0)).toBe(21);
    expect(() => writeKvPages(layout, rowsK, rowsV, k, v, Int32Array.of(12, 0))).toThrow(/slots/);
  });

  it('HND pages put head h, slot o at (h*pageSize + o)*headDim inside the page', () => {
    const layout = { numPages: 3, pageSize: 4, numKvHeads: 2, headDim: 3, kvLayout: 'HND' as const };
    const k = createKvPool(layout);
    const v = createKvPool(layout);
    const rows = Float32Array.from({ length: 6 }, (_, i) => i + 1); // one token: head 0 [1,2,3], head 1 [4,5,6]
    writeKvPages(layout, rows, rows, k, v, Int32Array.of(2 * 4 + 1)); // page 2, slot 1
    const page = k.subarray(2 * 24, 3 * 24);
    expect(Array.from(page.subarray(1 * 3, 2 * 3))).toEqual([1, 2, 3]);
    expect(Array.from(page.subarray((4 + 1) * 3, (4 + 2) * 3))).toEqual([4, 5, 6]);
    expect(k.reduce((a, x) => a + x, 0)).toBe(21);
  });
});

describe('pagedAttention argument errors', () => {
  const layout = { numPages: 2, pageSize: 4, numKvHeads: 1, headDim: 8 };
  const k = createKvPool(layout);
  const v = createKvPool(layout);
  const q = new Float32Array(2 * 8);
  const opts = { numHeads: 2, scale: 1, mask: 'causal' as const };
  it('names the parameter', () => {
    expect(() => pagedAttention(q, k, v, layout, makePagedBatch([{ qLen: 1, kvLen: 5, pages: [0, 2] }]), opts)).toThrow(
      /pagedAttention: blockTables: expected page ids in \[0, numPages = 2\)/,
    );
    expect(() => pagedAttention(q, k, v, layout, makePagedBatch([{ qLen: 1, kvLen: 9, pages: [0, 1] }]), opts)).toThrow(
      /kvLens/,
    );
    expect(() =>
      pagedAttention(q, k, v, layout, makePagedBatch([{ qLen: 1, kvLen: 3, pages: [0] }]), { ...opts, numHeads: 3 }),
    ).toThrow(/numHeads/);
    expect(() =>
      pagedAttention(q, k, v, layout, makePagedBatch([{ qLen: 1, kvLen: 3, pages: [0], positions: [-1] }]), opts),
    ).toThrow(/positions/);
    expect(() => pagedAttention(q, k, v, layout, makePagedBatch([{ qLen: 2, kvLen: 3, pages: [0] }]), opts)).toThrow(
      /q: expected Float32Array of length 32/,
    );
    expect(() =>
      pagedAttention(q, k, v, layout, makePagedBatch([{ qLen: 1, kvLen: 3, pages: [0] }]), {
        ...opts,
        mask: 'full' as never,
      }),
    ).toThrow(/options.mask/);
    expect(() =>
      pagedAttention(
        q,
        k,
        v,
        { ...layout, kvLayout: 'NDH' as never },
        makePagedBatch([{ qLen: 1, kvLen: 3, pages: [0] }]),
        opts,
      ),
    ).toThrow(/layout.kvLayout/);
    // Native content checks carry the same code as the TypeScript ones.
    let caught: unknown;
    try {
      pagedAttention(q, k, v, layout, makePagedBatch([{ qLen: 1, kvLen: 3, pages: [7] }]), opts);
    } catch (e) {
      caught = e;
    }
    expect((caught as { code?: string }).code).toBe('ERR_SPECD_INVALID_ARG');
  });
});
