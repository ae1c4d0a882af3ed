// Re-splitting a request's entries between different TP sizes (pd/ranks.ts `reshardEntries`), checked by moving
// real bytes: every P rank's region holds a by-head entry whose every byte encodes (unit, global head, byte), the
// descriptor lists planSend makes from the re-split entries are applied, and each D rank's region must then hold
// exactly its heads (the Megatron rule, replicas when tp > heads) — for TP sizes up, down, equal and replicated.
import { describe, expect, it } from 'vitest';

import { planSend } from '../../src/pd/pairing.js';
import { forEachRange, planTransfer } from '../../src/pd/planner.js';
import { gatherScattered, rankHeads, rankRegionId, reshardEntries } from '../../src/pd/ranks.js';
import { type LocalEntry, PdError, type PdEntryKey } from '../../src/pd/types.js';

const HEADS = 8;
const HEAD_BYTES = 6;
/** Units (page rows, conv states, …) of the entry. */
const UNITS = 5;

/** The byte a whole model holds at (unit, head, byte): distinct for every triple below 256 of them. */
function value(unit: number, head: number, b: number): number {
  return (unit * HEADS * HEAD_BYTES + head * HEAD_BYTES + b) % 251;
}

/** One side of `tp` ranks: per rank a region `rank<r>/kv` of its heads' bytes (filled or zero) at offset 16. */
function side(tp: number, fill: boolean) {
  const local = rankHeads(0, tp, HEADS)[1];
  const length = UNITS * local * HEAD_BYTES;
  const regions = new Map<string, Uint8Array>();
  const entries: LocalEntry[] = [];
  for (let r = 0; r < tp; r++) {
    const bytes = new Uint8Array(16 + length + 16);
    const [first] = rankHeads(r, tp, HEADS);
    if (fill)
      for (let u = 0; u < UNITS; u++)
        for (let h = 0; h < local; h++)
          for (let b = 0; b < HEAD_BYTES; b++) bytes[16 + (u * local + h) * HEAD_BYTES + b] = value(u, first + h, b);
    const region = rankRegionId(r, 'kv');
    regions.set(region, bytes);
    // two ranges, cut mid-row, so that slicing across range boundaries is exercised
    const cut = Math.floor(length / 3);
    entries.push({
      key: { kind: 'draft-kv', layer: 0, part: 'k', rank: r },
      ranges: [
        { region, offset: 16, length: cut },
        { region, offset: 16 + cut, length: length - cut },
      ],
      heads: { total: HEADS, bytes: HEAD_BYTES },
    });
    // an entry without heads: the same bytes on every rank
    const blob = rankRegionId(r, 'blob');
    regions.set(blob, fill ? Uint8Array.from({ length: 10 }, (_, i) => 100 + i) : new Uint8Array(10));
    entries.push({
      key: { kind: 'draft-state', layer: 0, part: 'last', rank: r },
      ranges: [{ region: blob, offset: 0, length: 10 }],
    });
  }
  return { regions, entries, local };
}

/** Moves P's bytes to D as planSend plans it; returns D's regions. */
function transfer(pTp: number, dTp: number) {
  const P = side(pTp, true);
  const D = side(dTp, false);
  const wanted = D.entries.map((e) => ({ key: e.key, ranges: e.ranges }));
  const lookup = (id: string) => P.regions.get(id)!;
  const plan = planSend(wanted, reshardEntries(P.entries, pTp, wanted, dTp), lookup, 'P');
  plan.local.forEach((l, i) => {
    const r = plan.remote[i]!;
    D.regions.get(r.region)!.set(lookup(l.region).subarray(l.offset, l.offset + l.length), r.offset);
  });
  return { D, plan };
}

describe('reshardEntries', () => {
  it.each([
    [1, 2],
    [2, 1],
    [2, 4],
    [4, 2],
    [1, 8],
    [8, 1],
    [2, 2],
    [2, 16],
    [16, 2],
    [4, 32],
    [32, 4],
  ])(
    'P tp %i → D tp %i: every D rank holds exactly its heads; unsplit entries arrive whole on every rank',
    (pTp, dTp) => {
      const { D } = transfer(pTp, dTp);
      for (let r = 0; r < dTp; r++) {
        const bytes = D.regions.get(rankRegionId(r, 'kv'))!;
        const [first, count] = rankHeads(r, dTp, HEADS);
        expect(count).toBe(D.local);
        const want = new Uint8Array(bytes.length);
        for (let u = 0; u < UNITS; u++)
          for (let h = 0; h < count; h++)
            for (let b = 0; b < HEAD_BYTES; b++) want[16 + (u * count + h) * HEAD_BYTES + b] = value(u, first + h, b);
        expect(bytes, `D rank ${r}`).toEqual(want);
        expect(Array.from(D.regions.get(rankRegionId(r, 'blob'))!)).toEqual(
          Array.from({ length: 10 }, (_, i) => 100 + i),
        );
      }
    },
  );

  it('the same TP keeps rank r → rank r with its ranges coalesced; a heads split reads each replica once', () => {
    const same = transfer(2, 2).plan;
    // per D rank: the kv entry's two ranges pair with D's two, plus the blob: 3 descriptors per rank
    expect(same.local).toHaveLength(6);
    // P tp 16 replicates 8 heads twice: D rank d reads replica d mod 2 (the planner's rule)
    const P = side(16, true);
    const D = side(2, false);
    const got = reshardEntries(P.entries, 16, D.entries, 2);
    const regionsOf = (k: PdEntryKey) =>
      new Set(got.find((e) => e.key.kind === k.kind && e.key.rank === k.rank)!.ranges.map((r) => r.region));
    expect([...regionsOf({ kind: 'draft-kv', layer: 0, part: 'k', rank: 0 })]).toEqual(
      [0, 2, 4, 6].map((r) => rankRegionId(r, 'kv')),
    );
    expect([...regionsOf({ kind: 'draft-kv', layer: 0, part: 'k', rank: 1 })]).toEqual(
      [9, 11, 13, 15].map((r) => rankRegionId(r, 'kv')),
    );
  });

  it.each([
    [1, 2],
    [2, 1],
    [4, 32],
    [16, 2],
  ])('P tp %i → D tp %i: the same bytes land where the pure planner (specd pd plan) puts them', (pTp, dTp) => {
    const { D } = transfer(pTp, dTp);
    const P = side(pTp, true);
    const viaPlanner = side(dTp, false);
    const spec = {
      name: 'kv',
      kind: 'draft-kv' as const,
      layers: [0],
      parts: [''],
      unit: 'page' as const,
      rowsPerUnit: 1,
      heads: HEADS,
      headBytes: HEAD_BYTES,
      split: 'heads' as const,
      drafter: true,
    };
    const layout = (tp: number) => ({ tp, numLayers: 1, baseAddress: 0, numUnits: { kv: UNITS } });
    const mapping = { kv: Array.from({ length: UNITS }, (_, u) => [u, u] as const) };
    for (const c of planTransfer([spec], layout(pTp), layout(dTp), mapping)) {
      const src = P.regions.get(rankRegionId(c.srcRank, 'kv'))!;
      const dst = viaPlanner.regions.get(rankRegionId(c.dstRank, 'kv'))!;
      // the regions above keep the entry's bytes from offset 16
      forEachRange(c, (s0, d0, n) => dst.set(src.subarray(16 + s0, 16 + s0 + n), 16 + d0));
    }
    for (let r = 0; r < dTp; r++)
      expect(D.regions.get(rankRegionId(r, 'kv')), `D rank ${r}`).toEqual(
        viaPlanner.regions.get(rankRegionId(r, 'kv')),
      );
  });

  it('gathering the re-split entries into staging buffers moves the same bytes in one range per entry', () => {
    const want = transfer(1, 2).D;
    const P = side(1, true);
    const D = side(2, false);
    const wanted = D.entries.map((e) => ({ key: e.key, ranges: e.ranges }));
    const lookup = (id: string) => P.regions.get(id)!;
    const resplit = reshardEntries(P.entries, 1, wanted, 2);
    const staged = gatherScattered(resplit, lookup, 'staging/7/', 2);
    // the by-head entries were cut into many pieces: each is now one staging range; the unsplit ones stay
    expect(resplit.filter((e) => e.ranges.length > 2)).toHaveLength(2);
    expect(staged.regions.map((r) => r.id)).toEqual(['staging/7/0', 'staging/7/1']);
    expect(staged.entries.every((e) => e.ranges.length <= 2)).toBe(true);
    const all = (id: string) => staged.regions.find((r) => r.id === id)?.bytes ?? lookup(id);
    const plan = planSend(wanted, staged.entries, all, 'P');
    plan.local.forEach((l, i) => {
      const r = plan.remote[i]!;
      D.regions.get(r.region)!.set(all(l.region).subarray(l.offset, l.offset + l.length), r.offset);
    });
    // the checksums are over the same bytes in the same order as without staging
    expect(plan.rows).toEqual(planSend(wanted, resplit, lookup, 'P').rows);
    for (const [id, bytes] of want.regions) expect(D.regions.get(id), id).toEqual(bytes);
  });

  it('refuses heads that do not split over a side, naming the entry and the side', () => {
    const P = side(2, true);
    const wanted = [{ key: { kind: 'draft-kv' as const, layer: 0, part: 'k', rank: 0 } }];
    const odd = P.entries.map((e) => (e.heads === undefined ? e : { ...e, heads: { total: 6, bytes: HEAD_BYTES } }));
    const err = (() => {
      try {
        reshardEntries(odd, 2, wanted, 4);
      } catch (e) {
        return e as PdError;
      }
      return undefined;
    })();
    expect(err).toBeInstanceOf(PdError);
    expect(err?.code).toBe('layout');
    expect(err?.message).toBe(
      "draft-kv layer 0 (k) rank 0: 6 heads do not split over the decode instance's tp = 4 " +
        '(tp must divide the heads, ' +
        'or be a multiple of them)',
    );
  });

  it('a D that expects another length fails by name in planSend (a row length taken from the wrong side)', () => {
    const P = side(1, true);
    const D = side(2, false);
    // D rank 1 claims one unit more than its heads hold
    const wanted = D.entries.map((e) =>
      e.key.rank === 1 && e.heads !== undefined
        ? {
            key: e.key,
            ranges: [{ ...e.ranges[0]!, length: e.ranges[0]!.length + D.local * HEAD_BYTES }, e.ranges[1]!],
          }
        : { key: e.key, ranges: e.ranges },
    );
    expect(() => planSend(wanted, reshardEntries(P.entries, 1, wanted, 2), (id) => P.regions.get(id)!, 'P')).toThrow(
      /^draft-kv layer 0 \(k\) rank 1: 120 bytes here, the decode side expects 144 bytes$/,
    );
  });
});
