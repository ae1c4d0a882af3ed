// Absorbed MLA over a paged latent cache vs the NON-absorbed float64 formula of kimi.py
// MLAAttention (k = [W_UK c ; k_pe], v = W_UV c, standard causal attention); batch invariance bit
// for bit (alone vs block vs batch vs thread count); async == sync; bf16 kv_b_proj; errors. Both paths.
import { afterAll, describe, expect, it } from 'vitest';
import {
  createMlaPool,
  f32ToBf16,
  isa,
  makePagedBatch,
  mlaAttention,
  mlaAttentionAsync,
  prepareMlaWeights,
  setIsa,
  setNumThreads,
  writeMlaCache,
  type MlaDims,
  type MlaWeights,
  type PagedBatch,
} from '@specd/native';
import {
  bf16Value,
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

interface Case {
  name: string;
  dims: MlaDims;
  pageSize: number;
  seqs: Array<{ kvLen: number; qLen: number }>;
}

interface Setup {
  kvBProj: Float32Array;
  weights: MlaWeights;
  pool: Float32Array;
  latent: Float32Array[]; // per sequence [kvLen, r]
  kPe: Float32Array[]; // per sequence [kvLen, rope]
  pages: number[][];
}

function setup(c: Case, next: () => number): Setup {
  const { kvLoraRank: r, qkRopeHeadDim: rope, numHeads: H, qkNopeHeadDim: nope, vHeadDim: v } = c.dims;
  const need = c.seqs.map((s) => Math.ceil(s.kvLen / c.pageSize));
  const numPages = need.reduce((a, b) => a + b, 0) + 2;
  const ids = Array.from({ length: numPages }, (_, i) => i);
  for (let i = numPages - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    [ids[i], ids[j]] = [ids[j]!, ids[i]!];
  }
  const kvBProj = randomF32(H * (nope + v) * r, next, 1 / Math.sqrt(r));
  const pool = createMlaPool(numPages, c.pageSize, c.dims);
  const s: Setup = { kvBProj, weights: prepareMlaWeights(kvBProj, c.dims), pool, latent: [], kPe: [], pages: [] };
  let used = 0;
  c.seqs.forEach(({ kvLen }, i) => {
    const pages = ids.slice(used, used + need[i]!);
    used += need[i]!;
    const latent = randomF32(kvLen * r, next);
    const kPe = randomF32(kvLen * rope, next);
    const slots = Int32Array.from(
      { length: kvLen },
      (_, j) => pages[Math.floor(j / c.pageSize)]! * c.pageSize + (j % c.pageSize),
    );
    writeMlaCache(latent, kPe, pool, c.pageSize, c.dims, slots);
    s.latent.push(latent);
    s.kPe.push(kPe);
    s.pages.push(pages);
  });
  return s;
}

/** float64, non-absorbed (kimi.py MLAAttention with mla_use_nope): out [totalQ, H, v]. */
function reference(
  c: Case,
  s: Setup,
  q: Float32Array,
  scale: number,
  positions: number[][],
  w = s.kvBProj,
): Float64Array {
  const { kvLoraRank: r, qkRopeHeadDim: rope, numHeads: H, qkNopeHeadDim: nope, vHeadDim: v } = c.dims;
  const qd = nope + rope;
  const totalQ = positions.reduce((a, p) => a + p.length, 0);
  const out = new Float64Array(totalQ * H * v);
  let t = 0;
  c.seqs.forEach(({ kvLen }, si) => {
    // Expanded per-head keys and values: k[j][h] = [W_UK c_j ; k_pe_j], v[j][h] = W_UV c_j.
    const K = new Float64Array(kvLen * H * qd);
    const V = new Float64Array(kvLen * H * v);
    for (let j = 0; j < kvLen; j++)
      for (let h = 0; h < H; h++) {
        for (let o = 0; o < nope + v; o++) {
          let acc = 0;
          for (let cc = 0; cc < r; cc++) acc += w[(h * (nope + v) + o) * r + cc]! * s.latent[si]![j * r + cc]!;
          if (o < nope) K[(j * H + h) * qd + o] = acc;
          else V[(j * H + h) * v + o - nope] = acc;
        }
        for (let i = 0; i < rope; i++) K[(j * H + h) * qd + nope + i] = s.kPe[si]![j * rope + i]!;
      }
    for (const p of positions[si]!) {
      for (let h = 0; h < H; h++) {
        const n = Math.min(kvLen, p + 1);
        const sc: number[] = [];
        for (let j = 0; j < n; j++) {
          let dot = 0;
          for (let d = 0; d < qd; d++) dot += q[(t * H + h) * qd + d]! * K[(j * H + h) * qd + d]!;
          sc.push(dot * scale);
        }
        if (n === 0) continue;
        const m = Math.max(...sc);
        const e = sc.map((x) => Math.exp(x - m));
        const sum = e.reduce((a, b) => a + b, 0);
        for (let d = 0; d < v; d++) {
          let acc = 0;
          for (let j = 0; j < n; j++) acc += e[j]! * V[(j * H + h) * v + d]!;
          out[(t * H + h) * v + d] = acc / sum;
        }
      }
      t++;
    }
  });
  return out;
}

const cases: Case[] = [
  {
    name: 'H=3 nope=16 rope=8 v=24 r=40, page 16, decode + verify',
    dims: { numHeads: 3, qkNopeHeadDim: 16, qkRopeHeadDim: 8, vHeadDim: 24, kvLoraRank: 40 },
    pageSize: 16,
    seqs: [
      { kvLen: 37, qLen: 1 },
      { kvLen: 21, qLen: 16 },
      { kvLen: 5, qLen: 5 },
    ],
  },
  {
    name: 'H=4 nope=32 rope=0 v=20 r=64, page 7 (no k_pe)',
    dims: { numHeads: 4, qkNopeHeadDim: 32, qkRopeHeadDim: 0, vHeadDim: 20, kvLoraRank: 64 },
    pageSize: 7,
    seqs: [
      { kvLen: 30, qLen: 4 },
      { kvLen: 9, qLen: 1 },
    ],
  },
  {
    name: 'Kimi-like head: H=2 nope=128 rope=64 v=128 r=512, page 64',
    dims: { numHeads: 2, qkNopeHeadDim: 128, qkRopeHeadDim: 64, vHeadDim: 128, kvLoraRank: 512 },
    pageSize: 64,
    seqs: [
      { kvLen: 90, qLen: 3 },
      { kvLen: 17, qLen: 17 },
    ],
  },
];

const tail = (kvLen: number, qLen: number) => Array.from({ length: qLen }, (_, i) => kvLen - qLen + i);
const batchOf = (s: Setup, c: Case, ids: number[], pos: number[][]): PagedBatch =>
  makePagedBatch(
    ids.map((si, i) => ({ qLen: pos[i]!.length, kvLen: c.seqs[si]!.kvLen, pages: s.pages[si]!, positions: pos[i]! })),
  );

/** Three f32 stages (absorb over nope, attention over r+rope and keys, up-projection over r): ~sqrt(terms) ulp each
 *  (measured ≤ 4.3e-7 on both paths, r = 512). */
const tolMla = (c: Case) =>
  2 *
    2 ** -24 *
    Math.sqrt(
      c.dims.qkNopeHeadDim + c.dims.kvLoraRank + c.dims.qkRopeHeadDim + Math.max(...c.seqs.map((s) => s.kvLen)),
    ) +
  2e-7;

afterAll(() => {
  setIsa('auto');
  setNumThreads(isa().threads);
});

describe.each(isaPaths())('mlaAttention on the %s path', (path) => {
  it.each(cases.map((c) => [c.name, c] as const))('matches the non-absorbed float64 reference: %s', (_, c) => {
    const seed = freshSeed();
    const next = rng(seed);
    const s = setup(c, next);
    const { numHeads: H, qkNopeHeadDim: nope, qkRopeHeadDim: rope, vHeadDim: v } = c.dims;
    const pos = c.seqs.map((x) => tail(x.kvLen, x.qLen));
    const totalQ = c.seqs.reduce((a, x) => a + x.qLen, 0);
    const q = randomF32(totalQ * H * (nope + rope), next, 2);
    const scale = (nope + rope) ** -0.5;
    const y = withIsa(path, () =>
      mlaAttention(
        q,
        s.pool,
        c.pageSize,
        s.weights,
        batchOf(
          s,
          c,
          c.seqs.map((_, i) => i),
          pos,
        ),
        { scale },
        poisoned(totalQ * H * v),
      ),
    );
    const ref = reference(c, s, q, scale, pos);
    const err = relError(y, ref);
    if (process.env.SPECD_TEST_VERBOSE) console.log(path, c.name, err, tolMla(c));
    expect(err, `seed ${seed}: rel err ${err}; ${firstMismatches(y, ref, 1e-4)}`).toBeLessThan(tolMla(c));
  });

  it.each(cases.map((c) => [c.name, c] as const))(
    'is batch invariant bit for bit (alone, permuted batch, 1-3 threads): %s',
    (_, c) => {
      const seed = freshSeed();
      const next = rng(seed);
      const s = setup(c, next);
      const { numHeads: H, qkNopeHeadDim: nope, qkRopeHeadDim: rope, vHeadDim: v } = c.dims;
      const qd = H * (nope + rope);
      const per = H * v;
      const pos = c.seqs.map((x) => tail(x.kvLen, x.qLen));
      const offsets = c.seqs.map((_, i) => c.seqs.slice(0, i).reduce((a, x) => a + x.qLen, 0));
      const totalQ = c.seqs.reduce((a, x) => a + x.qLen, 0);
      const q = randomF32(totalQ * qd, next, 2);
      const scale = (nope + rope) ** -0.5;
      withIsa(path, () => {
        setNumThreads(2);
        const full = mlaAttention(
          q,
          s.pool,
          c.pageSize,
          s.weights,
          batchOf(
            s,
            c,
            c.seqs.map((_, i) => i),
            pos,
          ),
          { scale },
        );
        for (const threads of [1, 3]) {
          setNumThreads(threads);
          c.seqs.forEach((_x, si) => {
            pos[si]!.forEach((p, i) => {
              const t = offsets[si]! + i;
              const y = mlaAttention(
                q.slice(t * qd, (t + 1) * qd),
                s.pool,
                c.pageSize,
                s.weights,
                batchOf(s, c, [si], [[p]]),
                { scale },
              );
              const diff = firstBitDifference(y, full.subarray(t * per, (t + 1) * per));
              expect(diff, `seed ${seed}: ${threads} threads: seq ${si} query ${i} alone differs at ${diff}`).toBe(-1);
            });
          });
        }
        setNumThreads(2);
        // Reverse sequence order, each block without its first query.
        const order = c.seqs
          .map((_, i) => i)
          .reverse()
          .filter((i) => c.seqs[i]!.qLen > 1);
        const parts = order.map((si) => q.slice((offsets[si]! + 1) * qd, (offsets[si]! + c.seqs[si]!.qLen) * qd));
        const qq = new Float32Array(parts.reduce((a, p) => a + p.length, 0));
        parts.reduce((o, p) => {
          qq.set(p, o);
          return o + p.length;
        }, 0);
        const y = mlaAttention(
          qq,
          s.pool,
          c.pageSize,
          s.weights,
          batchOf(
            s,
            c,
            order,
            order.map((si) => pos[si]!.slice(1)),
          ),
          { scale },
        );
        let r = 0;
        for (const si of order)
          for (let i = 1; i < c.seqs[si]!.qLen; i++, r++) {
            const t = offsets[si]! + i;
            const diff = firstBitDifference(y.subarray(r * per, (r + 1) * per), full.subarray(t * per, (t + 1) * per));
            expect(diff, `seed ${seed}: permuted batch: seq ${si} query ${i} differs at ${diff}`).toBe(-1);
          }
      });
    },
  );

  it('async equals sync bit for bit', async () => {
    const c = cases[0]!;
    const seed = freshSeed();
    const next = rng(seed);
    const s = setup(c, next);
    const { numHeads: H, qkNopeHeadDim: nope, qkRopeHeadDim: rope, vHeadDim: v } = c.dims;
    const totalQ = c.seqs.reduce((a, x) => a + x.qLen, 0);
    const q = randomF32(totalQ * H * (nope + rope), next, 2);
    const batch = batchOf(
      s,
      c,
      c.seqs.map((_, i) => i),
      c.seqs.map((x) => tail(x.kvLen, x.qLen)),
    );
    setIsa(path);
    try {
      const sync = mlaAttention(q, s.pool, c.pageSize, s.weights, batch, { scale: 0.1 }, poisoned(totalQ * H * v));
      const async = await mlaAttentionAsync(
        q,
        s.pool,
        c.pageSize,
        s.weights,
        batch,
        { scale: 0.1 },
        poisoned(totalQ * H * v),
      );
      expect(firstBitDifference(async, sync), `seed ${seed}`).toBe(-1);
    } finally {
      setIsa('auto');
    }
  });
});

describe('MLA weights and errors', () => {
  it('prepareMlaWeights accepts bf16 kv_b_proj bits (same result as their f32 values)', () => {
    const c = cases[0]!;
    const seed = freshSeed();
    const next = rng(seed);
    const s = setup(c, next);
    const bits = f32ToBf16(s.kvBProj);
    const wb = prepareMlaWeights(bits, c.dims);
    const wf = prepareMlaWeights(
      Float32Array.from(bits, (b) => bf16Value(b)),
      c.dims,
    );
    expect(firstBitDifference(wb.wUk, wf.wUk)).toBe(-1);
    expect(firstBitDifference(wb.wUvT, wf.wUvT)).toBe(-1);
    const { numHeads: H, qkNopeHeadDim: nope, vHeadDim: v, kvLoraRank: r } = c.dims;
    // wUvT[h][c][e] = kv_b_proj[h*(nope+v) + nope + e][c]
    expect(wf.wUvT[(1 * r + 3) * v + 5]).toBe(bf16Value(bits[(1 * (nope + v) + nope + 5) * r + 3]!));
    expect(wf.wUk[(2 * nope + 4) * r + 7]).toBe(bf16Value(bits[(2 * (nope + v) + 4) * r + 7]!));
    expect(H).toBe(3);
  });

  it('names the bad parameter', () => {
    const c = cases[0]!;
    const s = setup(c, rng(1));
    const q = new Float32Array(3 * 24);
    expect(() =>
      mlaAttention(q, s.pool, 16, s.weights, makePagedBatch([{ qLen: 1, kvLen: 40, pages: [0, 1] }]), { scale: 1 }),
    ).toThrow(/mlaAttention: kvLens/);
    expect(() =>
      mlaAttention(q, s.pool, 16, s.weights, makePagedBatch([{ qLen: 2, kvLen: 4, pages: [0] }]), { scale: 1 }),
    ).toThrow(/mlaAttention: q: expected Float32Array of length 144/);
    expect(() =>
      mlaAttention(q, s.pool, 15, s.weights, makePagedBatch([{ qLen: 1, kvLen: 4, pages: [0] }]), { scale: 1 }),
    ).toThrow(/mlaAttention: pool/);
    expect(() => prepareMlaWeights(new Float32Array(5), c.dims)).toThrow(/prepareMlaWeights: kvBProj/);
  });
});
