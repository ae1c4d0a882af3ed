// bench/spec-bound.mjs, the physical bound on drafting's speed-up (issue 16), on hand-made work: the floors
// (compute and memory overlapped), τ(k) from the per-position acceptance, the verdicts of a compute-bound and a
// memory-bound plain step, and the counting of kernel calls (paths, weights read once a step, KDA state traffic).
import { describe, expect, it } from 'vitest';

// a plain ES module of the benches (no declarations; vitest transpiles without type-checking)
import * as sb from '../bench/spec-bound.mjs';

const rates = { fma: 100e9, bf16: 200e9, int8: 400e9, amxBf16: null };
/** Work of `fma` multiply-adds and `bytes` bytes. */
const work = (fma: number, bytes: number) => {
  const w = sb.emptyWork();
  w.macs.fma = fma;
  w.bytes = bytes;
  return w;
};
/** A fixed bandwidth of 100 GB/s whatever the size. */
const bw = () => ({ bytesPerS: 100e9, mib: 4 });

describe('speculationBound', () => {
  it('a compute-bound plain step: a verify row costs a plain row, so no k reaches 1 even at a_j = 1', () => {
    // 8 rows × 1e6 MACs = 80 µs of compute against 10 µs of memory; drafting adds 0.1e6 MACs a draft
    const row = 1e6;
    const plain = work(8 * row, 1e6);
    const spec = new Map([1, 2, 3].map((k) => [k, work(8 * (k + 1) * row + 8 * k * 0.1e6, 1.2e6)]));
    const b = sb.speculationBound(plain, spec, [0.8, 0.6, 0.4], rates, bw);
    expect(b.plain.computeS).toBeCloseTo(80e-6, 12);
    expect(b.plain.memoryS).toBeCloseTo(10e-6, 12);
    for (const r of b.perK) {
      // (k + 1) plain rows' 80 µs a step against the verify's 80·(k + 1) µs and the drafts' 8·k µs
      expect(r.boundPerfect).toBeCloseTo(((r.k + 1) * 80) / (80 * (r.k + 1) + 8 * r.k), 9);
      expect(r.boundPerfect).toBeLessThan(1);
    }
    // τ(2) = 1 + 0.8 + 0.6
    expect(b.perK[1]!.tau).toBeCloseTo(2.4, 12);
    expect(b.best.k).toBe(1);
  });

  it('a memory-bound plain step: verify rows ride on the weight reads up to m*', () => {
    // 1 row: 10 µs of compute, 100 µs of memory; k drafts add k rows and a little memory
    const plain = work(1e6, 10e6);
    const spec = new Map([1, 3, 15].map((k) => [k, work((k + 1) * 1e6, 10.1e6)]));
    const b = sb.speculationBound(plain, spec, new Array(15).fill(1), rates, bw);
    const byK = new Map(b.perK.map((r) => [r.k, r]));
    // k = 1, 3: memory-bound still (101 µs): bound = (k + 1) · 100 / 101
    expect(byK.get(1)!.bound).toBeCloseTo((2 * 100) / 101, 9);
    expect(byK.get(3)!.bound).toBeCloseTo((4 * 100) / 101, 9);
    // k = 15: 16 rows = 160 µs of compute, past m* = 10 rows
    expect(byK.get(15)!.computeS).toBeCloseTo(160e-6, 12);
    expect(byK.get(15)!.bound).toBeCloseTo((16 * 100) / 160, 9);
    expect(b.best.k).toBe(15);
  });
});

describe('speculationBound, the commit and the measured plain step', () => {
  it('every draft accepted: the commit replays left out; against the measured plain step: its wall time', () => {
    // memory-bound plain: 100 µs of memory, 10 µs compute, a measured step of 500 µs
    const plain = { ...work(1e6, 10e6), wallS: 500e-6 };
    // k = 1: 2 rows of compute; the step reads 12 MB, of which the commit's replays 2 MB
    const spec = new Map([[1, { ...work(2e6, 12e6), commit: { macs: { ...sb.emptyWork().macs }, bytes: 2e6 } }]]);
    const b = sb.speculationBound(plain, spec, [0.5], rates, bw);
    const r = b.perK[0]!;
    expect(r.bound).toBeCloseTo((1.5 * 100) / 120, 9);
    expect(r.boundPerfect).toBeCloseTo((2 * 100) / 100, 9);
    expect(r.boundMeasured).toBeCloseTo((1.5 * 500) / 120, 9);
  });
});

describe('computeSeconds', () => {
  it('charges each path at its rate: int16 two int8 products, split bf16 on AMX two tile products', () => {
    const w = sb.emptyWork();
    w.macs.fma = 100e9;
    w.macs.int8 = 400e9;
    w.macs.int16 = 400e9;
    expect(sb.computeSeconds(w, rates)).toBeCloseTo(1 + 1 + 2, 12);
    const amx = sb.emptyWork();
    amx.macs.amxSplit = 1000e9;
    expect(sb.computeSeconds(amx, { ...rates, amxBf16: 2000e9 })).toBeCloseTo(1, 12);
    const tiles = sb.emptyWork();
    tiles.macs.amxInt8 = 3000e9;
    expect(sb.computeSeconds(tiles, { ...rates, amxInt8: 1500e9 })).toBeCloseTo(2, 12);
    // a machine that measured no AMX-INT8 rate charges the tiles at the VNNI rate
    expect(sb.computeSeconds(tiles, { ...rates, amxInt8: null })).toBeCloseTo(3000 / 400, 12);
  });

  it('refuses a machine without a measured fp32 FMA rate', () => {
    expect(() => sb.computeSeconds(sb.emptyWork(), { ...rates, fma: null })).toThrow(/no fp32 FMA rate/);
  });
});

describe('countCall', () => {
  const packed = (n: number, k: number) => ({ n, k, data: new Uint16Array(n * k) });

  it('GEMMs: multiply-adds by path, each weight matrix read once a step', () => {
    const w = sb.emptyWork();
    const seen = new Set();
    const a = packed(16, 32);
    sb.countCall('gemmBf16', [new Float32Array(4 * 32), 4, a, undefined, 'f32'], w, seen, false);
    sb.countCall('gemmBf16', [new Float32Array(2 * 32), 2, a, undefined, 'bf16x2'], w, seen, true);
    sb.countCall(
      'gemmQuant',
      [new Float32Array(32), 1, { n: 8, k: 32, data: new Uint8Array(272) }, undefined, 'int16'],
      w,
      seen,
      false,
    );
    expect(w.macs.fma).toBe(4 * 16 * 32);
    // two rows in split bf16 fill 4 of a tile's 16 rows: charged as 16 tile rows, i.e. 8 rows of multiply-adds
    expect(w.macs.amxSplit).toBe(8 * 16 * 32);
    expect(w.macs.int16).toBe(8 * 32);
    expect(w.bytes).toBe(16 * 32 * 2 + 272);
  });

  it("quantized GEMMs take AMX-INT8 tiles from the addon's row thresholds, a tile's 16 rows charged whole", () => {
    expect(sb.amxQuantMinRows({})).toEqual({ int16: 16, int8: 96 });
    expect(sb.amxQuantMinRows({ SPECD_QUANT_AMX_MIN_ROWS_WIDE: '8', SPECD_QUANT_AMX_MIN_ROWS: 'x' })).toEqual({
      int16: 8,
      int8: 96,
    });
    const q = (m: number, act: string, amx: boolean) => {
      const w = sb.emptyWork();
      const qw = { n: 8, k: 32, data: new Uint8Array(272) };
      sb.countCall('gemmQuant', [new Float32Array(m * 32), m, qw, undefined, act], w, new Set(), amx);
      return w.macs;
    };
    // int16 from 16 rows: two int8 planes, two tile products; 17 rows fill two tiles
    expect(q(17, 'int16', true)).toMatchObject({ amxInt8: 2 * 32 * 8 * 32, int16: 0 });
    expect(q(15, 'int16', true)).toMatchObject({ amxInt8: 0, int16: 15 * 8 * 32 });
    expect(q(17, 'int16', false)).toMatchObject({ amxInt8: 0, int16: 17 * 8 * 32 });
    // int8 only from 96 rows
    expect(q(95, 'int8', true)).toMatchObject({ amxInt8: 0, int8: 95 * 8 * 32 });
    expect(q(96, 'int8', true)).toMatchObject({ amxInt8: 96 * 8 * 32, int8: 0 });
    expect(q(96, 'f32', true)).toMatchObject({ amxInt8: 0, fma: 96 * 8 * 32 });
  });

  it('MoE: the routed experts and the shared one, each read once', () => {
    const w = sb.emptyWork();
    const seen = new Set();
    const ex = {
      hidden: 8,
      inter: 4,
      sharedInter: 4,
      w13: [0, 1, 2].map(() => new Uint16Array(64)),
      w2: [0, 1, 2].map(() => new Uint16Array(32)),
      sharedW13: new Uint16Array(64),
      sharedW2: new Uint16Array(32),
    };
    // 2 tokens, top-2: experts {0, 2} and {2, 0}
    const routing = { topK: 2, ids: Int32Array.of(0, 2, 2, 0), weights: new Float32Array(4) };
    sb.countCall('moeExperts', [new Float32Array(16), 2, ex, routing], w, seen, false);
    expect(w.macs.fma).toBe(2 * 2 * 3 * 8 * 4 + 2 * 3 * 8 * 4);
    expect(w.bytes).toBe(3 * (64 + 32) * 2);
  });

  it('KDA recurrence: each running sequence’s state read and written, the kept copy written', () => {
    const w = sb.emptyWork();
    const shape = { heads: 2, headDim: 4 };
    const slot = 4 * (2 * 16 + 9 * 2 * 4);
    const batch = { seqLens: Int32Array.of(2, 0, 1), slots: Int32Array.of(0, 1, 2) };
    const keepBefore = { state: new Float32Array(0), conv: new Float32Array(0), rows: Int32Array.of(0, -1, -1) };
    sb.countCall(
      'kdaRecurrent',
      [{ convWeight: new Float32Array(96) }, batch, {}, shape, { keepBefore }],
      w,
      new Set(),
      false,
    );
    expect(w.macs.fma).toBe(4 * 3 * 2 * 16);
    expect(w.bytes).toBe(2 * 2 * slot + slot + 96 * 4);
  });
});
