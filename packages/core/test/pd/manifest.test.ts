// The transfer manifest: the target's entries and regions from a SequenceCache (pages coalesced, slot ranges of
// the linear state), a drafter's from DrafterBase's helpers over its DraftKvCache, D's check of P's rows
// (missing / extra / duplicated / mis-sized entries named) and the refusal of a drafter without the capability.
import { describe, expect, it } from 'vitest';

import { CacheError, DraftKvCache, SequenceCache, type CacheGeometry, type SequenceId } from '../../src/kv/index.js';
import {
  allEntries,
  allRegions,
  checkManifest,
  checkPdDrafter,
  coalesceRanges,
  drafterEntries,
  entryByteLength,
  hasDraftContextTransfer,
  manifestRows,
  PdError,
  regionLookup,
  targetEntries,
  targetRegions,
  type DraftContextTransfer,
  type LocalEntry,
  type ManifestRow,
  type MemoryRegion,
  type RegionRange,
} from '../../src/pd/index.js';
import { DrafterBase, DrafterError, type DraftBatch, type DraftProposal } from '../../src/plugin/index.js';
import { TensorParallelDrafter, type TensorParallelModel } from '../../src/tensor-parallel/index.js';

const geometry: CacheGeometry = {
  pagedKv: { layers: [3, 7], floatsPerToken: 10 },
  linearState: { layers: [0, 1, 2], heads: 2, keyDim: 4, valueDim: 4, convStates: 3, convChannels: 8, convWidth: 3 },
};
const PAGE_BYTES = 4 * 10 * 4; // pageSize 4 × 10 f32
const RECURRENT_BYTES = 2 * 4 * 4 * 4;
const CONV_BYTES = 3 * 8 * 3 * 4;

/** A cache where sequence 'a' holds pages [0, 1, 3] (9 tokens) and 'b' page 2 (3 tokens). */
function cacheWithTwo(): SequenceCache {
  const cache = new SequenceCache(geometry, { pageSize: 4, numPages: 8, numSlots: 3 });
  cache.add('a');
  cache.extend('a', 5);
  cache.add('b');
  cache.extend('b', 3);
  cache.extend('a', 9);
  return cache;
}

/** A checksum over ranges for the tests: the hex of the byte sum and count (order-insensitive, enough here). */
function sumChecksum(regionBytes: (id: string) => Uint8Array, ranges: readonly RegionRange[]): string {
  let sum = 0;
  let n = 0;
  for (const r of ranges) {
    const bytes = regionBytes(r.region).subarray(r.offset, r.offset + r.length);
    for (const b of bytes) sum = (sum + b) % 0xffffffff;
    n += r.length;
  }
  return `${sum.toString(16)}/${n}`;
}

/** A drafter with draft KV (2 layers) that declares the capability through DrafterBase's helpers. */
class KvDrafter extends DrafterBase implements DraftContextTransfer {
  readonly method = 'kv-test';
  readonly maxDraftTokens = 2;
  readonly kv: DraftKvCache;
  /** @param kv default: 2 layers of 2 KV heads × 4, pages of 4 tokens. */
  constructor(numPages = 6, kv = new DraftKvCache({ numLayers: 2, numKvHeads: 2, headDim: 4, pageSize: 4, numPages })) {
    super(kv);
    this.kv = kv;
  }
  propose(batch: DraftBatch): DraftProposal[] {
    return batch.sequences.map((s) => ({ id: s.id, tokens: new Int32Array(0) }));
  }
  pdRegions(): readonly MemoryRegion[] {
    return this.draftKvRegions();
  }
  pdContextEntries(id: SequenceId): readonly LocalEntry[] {
    return this.draftKvEntries(id);
  }
  pdReserveContext(id: SequenceId, length: number): void {
    this.reserveDraftContext(id, length);
  }
}

/** The same drafter without the capability (as a new drafter package that did not declare it). */
class PlainDrafter extends DrafterBase {
  readonly method = 'plain-test';
  readonly maxDraftTokens = 2;
  constructor() {
    super(new DraftKvCache({ numLayers: 1, numKvHeads: 1, headDim: 4, pageSize: 4, numPages: 4 }));
  }
  propose(batch: DraftBatch): DraftProposal[] {
    return batch.sequences.map((s) => ({ id: s.id, tokens: new Int32Array(0) }));
  }
}

describe('the target part', () => {
  it('names every store of the cache as a byte view of it', () => {
    const cache = cacheWithTwo();
    const regions = targetRegions(cache);
    expect(regions.map((r) => r.id)).toEqual([
      'target-kv/3',
      'target-kv/7',
      'linear-state/0',
      'conv-state/0',
      'linear-state/1',
      'conv-state/1',
      'linear-state/2',
      'conv-state/2',
    ]);
    const kv = regions[0]!;
    expect(kv.bytes.byteLength).toBe(8 * PAGE_BYTES);
    // a write through the region lands in the store
    new Float32Array(kv.bytes.buffer, kv.bytes.byteOffset, 1)[0] = 1.5;
    expect(cache.kv!.layerStore(3)[0]).toBe(1.5);
  });

  it("gives a sequence's pages per paged layer, coalesced, and its slot's linear and conv state", () => {
    const cache = cacheWithTwo();
    expect(Array.from(cache.kv!.blockTable('a'))).toEqual([0, 1, 3]);
    const entries = targetEntries(cache, 'a', 2);
    expect(entries.map((e) => `${e.key.kind}/${e.key.layer}/${e.key.rank}`)).toEqual([
      'target-kv/3/2',
      'target-kv/7/2',
      'linear-state/0/2',
      'conv-state/0/2',
      'linear-state/1/2',
      'conv-state/1/2',
      'linear-state/2/2',
      'conv-state/2/2',
    ]);
    expect(entries[1]!.ranges).toEqual([
      { region: 'target-kv/7', offset: 0, length: 2 * PAGE_BYTES },
      { region: 'target-kv/7', offset: 3 * PAGE_BYTES, length: PAGE_BYTES },
    ]);
    const slot = cache.state!.slotOf('a');
    expect(entries[4]!.ranges).toEqual([
      { region: 'linear-state/1', offset: slot * RECURRENT_BYTES, length: RECURRENT_BYTES },
    ]);
    expect(entryByteLength(entries[5]!)).toBe(CONV_BYTES);
    // the ranges point at the sequence's own state
    cache.state!.recurrent('a', 1).fill(7);
    cache.state!.recurrent('b', 1).fill(9);
    const bytes = regionLookup(targetRegions(cache));
    const r = entries[4]!.ranges[0]!;
    const view = bytes(r.region).subarray(r.offset, r.offset + r.length);
    expect(Array.from(new Float32Array(view.slice().buffer))).toEqual(new Array(32).fill(7));
    expect(() => targetEntries(cache, 'zz')).toThrow(CacheError);
  });

  it('coalesces only adjacent ranges of one region, in order', () => {
    expect(
      coalesceRanges([
        { region: 'x', offset: 0, length: 4 },
        { region: 'x', offset: 4, length: 4 },
        { region: 'y', offset: 8, length: 4 },
        { region: 'x', offset: 8, length: 4 },
        { region: 'x', offset: 16, length: 4 },
        { region: 'x', offset: 12, length: 4 },
      ]),
    ).toEqual([
      { region: 'x', offset: 0, length: 8 },
      { region: 'y', offset: 8, length: 4 },
      { region: 'x', offset: 8, length: 4 },
      { region: 'x', offset: 16, length: 4 },
      { region: 'x', offset: 12, length: 4 },
    ]);
  });
});

describe('checkManifest', () => {
  const cache = cacheWithTwo();
  const expected = targetEntries(cache, 'a');
  const bytes = regionLookup(targetRegions(cache));
  const rows = manifestRows(expected, bytes, sumChecksum);

  it('accepts the rows of the same entries', () => {
    expect(rows.map((r) => r.byteLength)).toEqual(expected.map(entryByteLength));
    expect(rows[0]!.byteLength).toBe(3 * PAGE_BYTES);
    expect(() => checkManifest(expected, rows)).not.toThrow();
  });

  it("names a withheld KDA 'linear-state' entry", () => {
    const withheld = rows.filter((r) => !(r.key.kind === 'linear-state' && r.key.layer === 1));
    expect(() => checkManifest(expected, withheld)).toThrow(PdError);
    try {
      checkManifest(expected, withheld);
    } catch (err) {
      expect((err as PdError).code).toBe('manifest');
      expect((err as PdError).message).toBe(
        `manifest: linear-state layer 1 rank 0 (${RECURRENT_BYTES} bytes) is missing`,
      );
    }
  });

  it('names a wrong length, an extra entry and a duplicate', () => {
    const bad: ManifestRow[] = rows.map((r) =>
      r.key.kind === 'target-kv' && r.key.layer === 7 ? { ...r, byteLength: 2 * PAGE_BYTES } : r,
    );
    bad.push({ key: { kind: 'draft-kv', layer: 0, part: 'k', rank: 0 }, byteLength: 8, checksum: '0' });
    bad.push(rows[0]!);
    let message = '';
    try {
      checkManifest(expected, bad);
    } catch (err) {
      expect(err).toBeInstanceOf(PdError);
      message = (err as PdError).message;
    }
    expect(message).toContain(`target-kv layer 7 rank 0: ${2 * PAGE_BYTES} bytes sent, ${3 * PAGE_BYTES} expected`);
    expect(message).toContain('draft-kv layer 0 (k) rank 0 (8 bytes) is not expected');
    expect(message).toContain('target-kv layer 3 rank 0 sent twice');
  });

  it('checksums each entry over its ranges and refuses a range outside its region', () => {
    const other = targetEntries(cache, 'b');
    const rowsB = manifestRows(other, bytes, sumChecksum);
    cache.state!.conv('a', 2).fill(3);
    cache.state!.conv('b', 2).fill(4);
    const conv = (rs: ManifestRow[]) => rs.find((r) => r.key.kind === 'conv-state' && r.key.layer === 2)!.checksum;
    expect(conv(manifestRows(expected, bytes, sumChecksum))).not.toBe(conv(manifestRows(other, bytes, sumChecksum)));
    expect(rowsB[0]!.byteLength).toBe(PAGE_BYTES);
    const outside: LocalEntry = {
      key: { kind: 'target-kv', layer: 3, part: '', rank: 0 },
      ranges: [{ region: 'target-kv/3', offset: 7 * PAGE_BYTES, length: 2 * PAGE_BYTES }],
    };
    expect(() => manifestRows([outside], bytes, sumChecksum)).toThrow(
      /target-kv layer 3 rank 0: range \[1120, 1440\) is outside region "target-kv\/3" \(1280 bytes\)/,
    );
    expect(() => bytes('nope')).toThrow(/unknown region "nope"/);
    expect(() => regionLookup([...targetRegions(cache), ...targetRegions(cache)])).toThrow(/registered twice/);
  });
});

describe('the drafter part', () => {
  it('refuses a drafter without DraftContextTransfer, naming its method', () => {
    const plain = new PlainDrafter();
    plain.addSequence(1);
    expect(hasDraftContextTransfer(plain)).toBe(false);
    expect(() => checkPdDrafter(plain)).toThrow(PdError);
    expect(() => checkPdDrafter(plain)).toThrow(/^plain-test: no prefill\/decode transfer \(/);
    expect(() => drafterEntries(plain, 1)).toThrow(/plain-test: no prefill\/decode transfer/);
    try {
      checkPdDrafter(plain);
    } catch (err) {
      expect((err as PdError).code).toBe('unsupported');
    }
    const kv = new KvDrafter();
    expect(hasDraftContextTransfer(kv)).toBe(true);
    expect(() => checkPdDrafter(kv)).not.toThrow();
  });

  it('a drafter spread over tensor-parallel ranks declares the capability exactly when its rank 0 shard does', () => {
    // the wrapper's constructor only stores its arguments: no ranks are started here
    const spread = new TensorParallelDrafter({} as TensorParallelModel, 1, new KvDrafter(), []);
    expect(hasDraftContextTransfer(spread.rank0)).toBe(true);
    expect(hasDraftContextTransfer(spread)).toBe(true);
    expect(spread.pdRegions?.().map((r) => r.id)).toEqual(
      spread.rank0 instanceof KvDrafter ? spread.rank0.pdRegions().map((r) => r.id) : [],
    );
    const plain = new TensorParallelDrafter({} as TensorParallelModel, 2, new PlainDrafter(), []);
    expect(hasDraftContextTransfer(plain)).toBe(false);
    expect(() => checkPdDrafter(plain)).toThrow(/^plain-test: no prefill\/decode transfer \(/);
  });

  it("declares each draft layer's K and V pages, coalesced, from DrafterBase's helpers", () => {
    const d = new KvDrafter();
    expect(d.pdRegions().map((r) => r.id)).toEqual(['draft-kv/0/k', 'draft-kv/0/v', 'draft-kv/1/k', 'draft-kv/1/v']);
    d.addSequence('x');
    d.addSequence('y');
    d.writeProjectedContextKV(new Float32Array(0), [{ id: 'x', position: 0, numTokens: 3 }]);
    d.writeProjectedContextKV(new Float32Array(0), [{ id: 'y', position: 0, numTokens: 2 }]);
    d.writeProjectedContextKV(new Float32Array(0), [{ id: 'x', position: 3, numTokens: 3 }]);
    const pageBytes = 4 * 8 * 4;
    expect(Array.from(d.kv.pool.blockTable('x'))).toEqual([0, 2]);
    const entries = d.pdContextEntries('x');
    expect(entries.map((e) => `${e.key.kind}/${e.key.layer}/${e.key.part}`)).toEqual([
      'draft-kv/0/k',
      'draft-kv/0/v',
      'draft-kv/1/k',
      'draft-kv/1/v',
    ]);
    expect(entries[3]!.ranges).toEqual([
      { region: 'draft-kv/1/v', offset: 0, length: pageBytes },
      { region: 'draft-kv/1/v', offset: 2 * pageBytes, length: pageBytes },
    ]);
    // the target and the drafter together, stamped with the rank
    const cache = cacheWithTwo();
    cache.add('x');
    cache.extend('x', 6);
    const all = allEntries(cache, d, 'x', 1);
    expect(all.length).toBe(8 + 4);
    expect(all.every((e) => e.key.rank === 1)).toBe(true);
    expect(allRegions(cache, d).length).toBe(8 + 4);
    expect(allEntries(cache, undefined, 'x').length).toBe(8);
  });

  it('reserves a decode-side context all or nothing, only on a fresh sequence', () => {
    const d = new KvDrafter(3);
    d.addSequence('big');
    expect(() => d.pdReserveContext('big', 13)).toThrow(CacheError);
    expect(d.contextLength('big')).toBe(0);
    expect(d.pagesInUse).toBe(0);
    d.pdReserveContext('big', 9);
    expect(d.contextLength('big')).toBe(9);
    expect(d.pagesInUse).toBe(3);
    expect(d.pdContextEntries('big').map(entryByteLength)).toEqual(new Array(4).fill(3 * 4 * 8 * 4));
    expect(() => d.pdReserveContext('big', 9)).toThrow(DrafterError);
    expect(() => d.pdReserveContext('big', 9)).toThrow(/kv-test: pdReserveContext: sequence big: .* 9 rows/);
    d.addSequence('neg');
    expect(() => d.pdReserveContext('neg', -1)).toThrow(/length: expected an integer >= 0, got -1/);
    expect(() => d.pdReserveContext('unknown', 1)).toThrow(CacheError);
    d.freeSequence('big');
    expect(d.pagesInUse).toBe(0);
  });

  it('declares an empty context for a drafter without draft KV', () => {
    const d = new KvDrafter(0, new DraftKvCache());
    d.addSequence(5);
    d.pdReserveContext(5, 12);
    expect(d.contextLength(5)).toBe(12);
    expect(d.pdRegions()).toEqual([]);
    expect(d.pdContextEntries(5)).toEqual([]);
    expect(() => d.pdContextEntries(6)).toThrow(CacheError);
  });
});
