// Paged KV pool, state slots and SequenceCache: allocation, block tables, page descriptors,
// rollback, and that every page and slot is free after any mix of finish / abort.
import { describe, expect, it } from 'vitest';

import { CacheError, PagedKvPool, SequenceCache, StateSlotPool, type CacheGeometry } from '../../src/kv/index.js';
import { prng } from '../io/helpers.js';

const geometry: CacheGeometry = {
  pagedKv: { layers: [3, 7], floatsPerToken: 10 },
  linearState: { layers: [0, 1, 2], heads: 2, keyDim: 4, valueDim: 4, convStates: 3, convChannels: 8, convWidth: 3 },
};

describe('PagedKvPool', () => {
  it('allocates pages on extend, shares them across layers, truncates and frees', () => {
    const pool = new PagedKvPool({ layers: [3, 7], floatsPerToken: 10, pageSize: 4, numPages: 5 });
    pool.addSequence('a');
    pool.extend('a', 5);
    expect(pool.blockTable('a').length).toBe(2);
    expect(pool.pagesInUse).toBe(2);
    const [p0, p1] = pool.blockTable('a');
    expect(pool.tokenOffset('a', 0)).toBe(p0! * 40);
    expect(pool.tokenOffset('a', 5 - 1)).toBe(p1! * 40);
    expect(pool.tokenOffset('a', 3)).toBe((p0! * 4 + 3) * 10);
    expect(pool.describePages('a')).toEqual([
      { layer: 3, page: p0, byteOffset: p0! * 160, byteLength: 160 },
      { layer: 3, page: p1, byteOffset: p1! * 160, byteLength: 160 },
      { layer: 7, page: p0, byteOffset: p0! * 160, byteLength: 160 },
      { layer: 7, page: p1, byteOffset: p1! * 160, byteLength: 160 },
    ]);
    expect(pool.describePages('a', 4, 5).map((d) => d.page)).toEqual([p1, p1]);
    expect(pool.layerStore(7).length).toBe(5 * 4 * 10);
    pool.truncate('a', 4);
    expect(pool.blockTable('a').length).toBe(1);
    expect(pool.pagesInUse).toBe(1);
    pool.free('a');
    pool.free('a');
    expect(pool.pagesInUse).toBe(0);
  });

  it("tokenSlots lists each token's page · pageSize + offset across ranges, in order", () => {
    const pool = new PagedKvPool({ layers: [0], floatsPerToken: 3, pageSize: 4, numPages: 8 });
    pool.addSequence('a');
    pool.addSequence('b');
    pool.extend('a', 3);
    pool.extend('b', 6); // b takes pages after a's first
    pool.extend('a', 6);
    const slots = pool.tokenSlots([
      { id: 'a', start: 2, n: 3 },
      { id: 'b', start: 4, n: 2 },
    ]);
    const expected = [
      ...[2, 3, 4].map((t) => pool.tokenOffset('a', t) / 3),
      ...[4, 5].map((t) => pool.tokenOffset('b', t) / 3),
    ];
    expect(Array.from(slots)).toEqual(expected);
    expect(new Set(expected.map((x) => Math.floor(x / 4))).size).toBe(3); // a's two pages and b's second
    expect(() => pool.tokenSlots([{ id: 'a', start: 5, n: 2 }])).toThrow(CacheError);
  });

  it('is all-or-nothing when full and names the problem', () => {
    const pool = new PagedKvPool({ layers: [0], floatsPerToken: 1, pageSize: 4, numPages: 2 });
    pool.addSequence(1);
    pool.extend(1, 4);
    expect(() => pool.extend(1, 13)).toThrow(/needs 3 more page\(s\), 1 free of 2/);
    expect(pool.pagesInUse).toBe(1);
    expect(() => pool.addSequence(1)).toThrow(CacheError);
    expect(() => pool.length(2)).toThrow(/unknown sequence 2/);
    expect(() => pool.truncate(1, 5)).toThrow(/\[0, 4\]/);
    expect(() => pool.tokenOffset(1, 4)).toThrow(/\[0, 4\)/);
    expect(() => pool.layerStore(1)).toThrow(/layer 1 keeps no paged KV/);
    expect(() => new PagedKvPool({ layers: [0, 0], floatsPerToken: 1, pageSize: 4, numPages: 2 })).toThrow(/distinct/);
  });
});

describe('StateSlotPool', () => {
  it('zeroes a slot on allocation, snapshots and restores', () => {
    const pool = new StateSlotPool({ ...geometry.linearState, numSlots: 2 });
    pool.allocate('a');
    pool.recurrent('a', 1).fill(3);
    pool.conv('a', 2).fill(4);
    expect(pool.recurrent('a', 1).length).toBe(2 * 4 * 4);
    expect(pool.conv('a', 2).length).toBe(3 * 8 * 3);
    const snap = pool.snapshot('a');
    pool.recurrent('a', 1).fill(5);
    pool.restore('a', snap);
    expect(pool.recurrent('a', 1).every((v) => v === 3)).toBe(true);
    pool.free('a');
    pool.allocate('b');
    pool.allocate('c');
    expect(pool.recurrent('b', 1).every((v) => v === 0) && pool.recurrent('c', 1).every((v) => v === 0)).toBe(true);
    expect(() => pool.allocate('d')).toThrow(/no free slot/);
    expect(pool.slotsInUse).toBe(2);
  });
});

describe('SequenceCache', () => {
  it('extendAll grows every sequence or none: a full pool leaves the earlier ones at their length', () => {
    const cache = new SequenceCache(geometry, { pageSize: 4, numPages: 3, numSlots: 2 });
    cache.add('a');
    cache.add('b');
    expect(() =>
      cache.extendAll([
        { id: 'a', position: 0, numNew: 8 },
        { id: 'b', position: 0, numNew: 8 },
      ]),
    ).toThrow(CacheError);
    expect([cache.length('a'), cache.length('b'), cache.pagesInUse]).toEqual([0, 0, 0]);
    cache.extendAll([
      { id: 'a', position: 0, numNew: 5 },
      { id: 'b', position: 0, numNew: 3 },
    ]);
    expect([cache.length('a'), cache.length('b'), cache.pagesInUse]).toEqual([5, 3, 3]);
  });

  it('checkpoint / rollback frees the verify block pages and restores state', () => {
    const cache = new SequenceCache(geometry, { pageSize: 4, numPages: 8, numSlots: 2 });
    cache.add('a');
    cache.extend('a', 6);
    cache.state!.recurrent('a', 0).fill(1);
    const cp = cache.checkpoint('a');
    cache.extend('a', 15);
    cache.state!.recurrent('a', 0).fill(2);
    expect(cache.pagesInUse).toBe(4);
    cache.rollback('a', cp);
    expect(cache.length('a')).toBe(6);
    expect(cache.pagesInUse).toBe(2);
    expect(cache.state!.recurrent('a', 0).every((v) => v === 1)).toBe(true);
  });

  it('every page and slot is free after any mix of finish / abort (random schedule)', () => {
    const rand = prng(7);
    for (let trial = 0; trial < 20; trial++) {
      const cache = new SequenceCache(geometry, { pageSize: 4, numPages: 40, numSlots: 6 });
      const live = new Set<number>();
      let next = 0;
      for (let step = 0; step < 200; step++) {
        const r = rand();
        if (r < 0.3 && cache.slotsInUse < 6) {
          cache.add(next);
          live.add(next++);
        } else if (r < 0.7 && live.size > 0) {
          const id = [...live][Math.floor(rand() * live.size)]!;
          try {
            cache.extend(id, cache.length(id) + 1 + Math.floor(rand() * 9));
          } catch (err) {
            expect((err as CacheError).code).toBe('full');
          }
        } else if (r < 0.8 && live.size > 0) {
          const id = [...live][Math.floor(rand() * live.size)]!;
          const cp = { length: Math.floor(rand() * (cache.length(id) + 1)), state: undefined };
          cache.rollback(id, cp);
        } else if (live.size > 0) {
          const id = [...live][Math.floor(rand() * live.size)]!;
          if (rand() < 0.5) cache.finish(id);
          else cache.abort(id);
          live.delete(id);
        }
        let pages = 0;
        for (const id of live) pages += Math.ceil(cache.length(id) / 4);
        expect(cache.pagesInUse).toBe(pages);
        expect(cache.slotsInUse).toBe(live.size);
      }
      for (const id of live) rand() < 0.5 ? cache.finish(id) : cache.abort(id);
      expect(cache.pagesInUse).toBe(0);
      expect(cache.slotsInUse).toBe(0);
      expect(cache.kv!.pagesFree).toBe(40);
      expect(cache.state!.slotsFree).toBe(6);
      expect(cache.numSequences).toBe(0);
    }
  });

  it('a stage without paged or linear layers keeps no pool', () => {
    const cache = new SequenceCache(
      { pagedKv: { layers: [], floatsPerToken: 1 }, linearState: { ...geometry.linearState, layers: [] } },
      { numPages: 1, numSlots: 1 },
    );
    cache.add('x');
    cache.extend('x', 100);
    expect(cache.kv).toBeUndefined();
    expect(cache.state).toBeUndefined();
    expect(cache.length('x')).toBe(100);
    cache.abort('x');
    expect(cache.has('x')).toBe(false);
  });
});
