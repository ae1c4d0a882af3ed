// DraftKvCache: a drafter's draft context — lengths, pages of K/V per draft layer, all-or-nothing
// extendAll with rollback, temporary rows, a context without KV, dispose, and the projected-feature pages kept for
// prefill/decode (`featureWidth`).
import { describe, expect, it } from 'vitest';

import { CacheError, DRAFT_PAGE_SIZE, DraftKvCache } from '../../src/kv/index.js';

const geometry = { numLayers: 2, numKvHeads: 2, headDim: 4, pageSize: 4, numPages: 6 };

describe('DraftKvCache', () => {
  it('registers sequences, grows them page by page and frees them (idempotent)', () => {
    const c = new DraftKvCache(geometry);
    expect(c.hasKv).toBe(true);
    expect(c.pool.layers).toEqual([0, 1, 2, 3]);
    expect(c.pool.floatsPerToken).toBe(8);
    expect(c.layout).toEqual({ numPages: 6, pageSize: 4, numKvHeads: 2, headDim: 4, kvLayout: 'NHD' });
    c.add('a');
    c.add('b');
    expect(c.contextLength('a')).toBe(0);
    c.extendAll([
      { id: 'a', position: 0, numTokens: 5 },
      { id: 'b', position: 0, numTokens: 4 },
    ]);
    expect(c.contextLength('a')).toBe(5);
    expect(c.contextLength('b')).toBe(4);
    expect(c.pagesInUse).toBe(3);
    expect(c.keys(1)).toBe(c.pool.layerStore(2));
    expect(c.values(1)).toBe(c.pool.layerStore(3));
    c.free('a');
    c.free('a');
    c.free('nobody');
    expect(c.has('a')).toBe(false);
    expect(c.pagesInUse).toBe(1);
    expect(() => c.contextLength('a')).toThrow(CacheError);
    expect(() => c.add('b')).toThrow(/sequence b already exists/);
  });

  it('extendAll is all or nothing: a full pool rolls every grown sequence back', () => {
    const c = new DraftKvCache(geometry);
    for (const id of ['a', 'b', 'c']) c.add(id);
    c.extendAll([{ id: 'a', position: 0, numTokens: 2 }]);
    const before = c.pool.blockTable('a');
    let err: unknown;
    try {
      c.extendAll([
        { id: 'a', position: 2, numTokens: 10 }, // 3 pages
        { id: 'b', position: 0, numTokens: 8 }, // 2 pages
        { id: 'c', position: 0, numTokens: 8 }, // 2 more: only 1 left
      ]);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(CacheError);
    expect((err as CacheError).code).toBe('full');
    expect(c.contextLength('a')).toBe(2);
    expect(c.contextLength('b')).toBe(0);
    expect(c.contextLength('c')).toBe(0);
    expect(c.pool.blockTable('a')).toEqual(before);
    expect(c.pagesInUse).toBe(1);
  });

  it('extendAll checks every position first and names the sequence', () => {
    const c = new DraftKvCache(geometry);
    c.add('a');
    c.add('b');
    expect(() =>
      c.extendAll([
        { id: 'a', position: 0, numTokens: 1 },
        { id: 'b', position: 3, numTokens: 1 },
      ]),
    ).toThrow(
      'DraftKvCache.extendAll: sequence b: expected position 0 and numTokens >= 0, got position 3, numTokens 1',
    );
    expect(c.contextLength('a')).toBe(0);
    expect(() => c.extendAll([{ id: 'z', position: 0, numTokens: 1 }])).toThrow(/unknown sequence z/);
  });

  it('withRows grows for the body and truncates back, also when the body throws', () => {
    const c = new DraftKvCache(geometry);
    c.add('a');
    c.extendAll([{ id: 'a', position: 0, numTokens: 3 }]);
    const rows = [{ id: 'a', position: 3, numTokens: 4 }];
    const seen = c.withRows(rows, () => {
      const slots = c.slots(rows);
      expect(slots).toHaveLength(4);
      return c.contextLength('a');
    });
    expect(seen).toBe(7);
    expect(c.contextLength('a')).toBe(3);
    expect(c.pagesInUse).toBe(1);
    expect(() =>
      c.withRows(rows, () => {
        throw new Error('boom');
      }),
    ).toThrow('boom');
    expect(c.contextLength('a')).toBe(3);
    expect(c.pagesInUse).toBe(1);
  });

  it('write puts K and V rows at their slots (NHD)', () => {
    const c = new DraftKvCache(geometry);
    c.add('a');
    const rows = [{ id: 'a', position: 0, numTokens: 2 }];
    c.extendAll(rows);
    const k = Float32Array.from({ length: 16 }, (_, i) => i + 1);
    const v = Float32Array.from({ length: 16 }, (_, i) => -(i + 1));
    c.write(1, k, v, c.slots(rows));
    const off = c.pool.tokenOffset('a', 1);
    expect([...c.keys(1).subarray(off, off + 8)]).toEqual([...k.subarray(8)]);
    expect([...c.values(1).subarray(off, off + 8)]).toEqual([...v.subarray(8)]);
    expect(c.keys(0).every((x) => x === 0)).toBe(true);
  });

  it('without a geometry it counts context lengths and holds no pages', () => {
    const c = new DraftKvCache();
    expect(c.hasKv).toBe(false);
    c.add(1);
    c.extendAll([{ id: 1, position: 0, numTokens: 9 }]);
    expect(c.contextLength(1)).toBe(9);
    expect(c.pagesInUse).toBe(0);
    expect(() => c.pool).toThrow('DraftKvCache: keeps no KV (created without a geometry)');
    c.truncateAll([{ id: 1, position: 4, numTokens: 5 }]);
    expect(c.contextLength(1)).toBe(4);
  });

  it('pagesFor sizes a pool; bad sizes are named; dispose frees everything', () => {
    expect(DraftKvCache.pagesFor(2, 33)).toBe(2 * (Math.ceil(33 / DRAFT_PAGE_SIZE) + 1));
    expect(DraftKvCache.pagesFor(3, 8, 4)).toBe(9);
    expect(() => new DraftKvCache({ ...geometry, numKvHeads: 0 })).toThrow(
      'DraftKvCache: numKvHeads: expected an integer >= 1, got 0',
    );
    const c = new DraftKvCache(geometry);
    c.add('a');
    c.extendAll([{ id: 'a', position: 0, numTokens: 9 }]);
    c.dispose();
    expect(c.pagesInUse).toBe(0);
    expect(c.numSequences).toBe(0);
    c.free('a');
    expect(() => c.add('b')).toThrow('DraftKvCache: disposed');
    expect(() => c.pool).toThrow('DraftKvCache: disposed');
  });

  it('featureWidth: feature pages grow, shrink and free with the KV; rows written come back in order', () => {
    expect(() => new DraftKvCache({ ...geometry, featureWidth: 0 })).toThrow(/featureWidth: expected an integer >= 1/);
    expect(new DraftKvCache(geometry).features).toBeUndefined();
    const c = new DraftKvCache({ ...geometry, featureWidth: 3 });
    const f = c.features!;
    expect([f.layers, f.floatsPerToken, f.pageSize, f.numPages]).toEqual([[0], 3, 4, 6]);
    c.add('a');
    c.add('b');
    c.extendAll([
      { id: 'a', position: 0, numTokens: 2 },
      { id: 'b', position: 0, numTokens: 5 },
    ]);
    expect([f.pagesInUse, c.pagesInUse]).toEqual([3, 3]);
    // rows 2 … 5 of a (a second page), written after b's: read back in position order
    c.extendAll([{ id: 'a', position: 2, numTokens: 4 }]);
    const rows = Float32Array.from({ length: 6 * 3 }, (_, i) => i);
    c.writeFeatures([{ id: 'a', position: 0, numTokens: 6 }], rows);
    expect(Array.from(c.readFeatures('a', 1, 6))).toEqual(Array.from(rows.subarray(3)));
    expect(() => c.writeFeatures([{ id: 'a', position: 0, numTokens: 2 }], rows)).toThrow(
      /features: expected \[2, 3\] f32, got length 18/,
    );
    expect(() => c.readFeatures('a', 4, 7)).toThrow(CacheError);
    // all or nothing: the pools run out together, and nothing stays allocated in either
    expect(() => c.extendAll([{ id: 'b', position: 5, numTokens: 12 }])).toThrow(CacheError);
    expect([f.pagesInUse, c.pagesInUse, c.contextLength('b')]).toEqual([4, 4, 5]);
    c.truncateAll([{ id: 'a', position: 1, numTokens: 0 }]);
    c.free('b');
    expect([f.pagesInUse, c.pagesInUse]).toEqual([1, 1]);
    c.dispose();
    expect(c.features).toBeUndefined();
    expect(() => c.readFeatures('a', 0, 1)).toThrow(/keeps no features/);
  });
});
