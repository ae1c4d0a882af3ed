// The deferred draft context's storage (engine/draft-context.ts): rows appended across chunk boundaries read back in
// order, chunks of one size recycled through the pool, the pool's byte cap.
import { describe, expect, it } from 'vitest';

import { FloatPool, ROW_CHUNK, RowBuffer } from '../../src/engine/draft-context.js';

/** Rows `[n, width]` f32 whose element i is `from + i`. */
const rowsFrom = (from: number, n: number, width: number): Float32Array =>
  Float32Array.from({ length: n * width }, (_, i) => from + i);

describe('RowBuffer', () => {
  it('keeps appended rows in order across chunks: a view within one chunk, a copy beyond', () => {
    const width = 3;
    const pool = new FloatPool(ROW_CHUNK * width);
    const b = new RowBuffer(width, pool);
    b.append(rowsFrom(0, 5, width));
    expect(b.rows).toBe(5);
    expect(Array.from(b.rowsArray())).toEqual(Array.from(rowsFrom(0, 5, width)));
    // a prompt's block crossing two chunk boundaries, then one row at a time
    b.append(rowsFrom(15, 2 * ROW_CHUNK, width));
    for (let i = 0; i < 7; i++) b.append(rowsFrom(15 + (2 * ROW_CHUNK + i) * width, 1, width));
    const n = 5 + 2 * ROW_CHUNK + 7;
    expect(b.rows).toBe(n);
    const want = Array.from(rowsFrom(0, n, width));
    expect(Array.from(b.rowsArray())).toEqual(want);
    const into = new Float32Array(n * width + 4).fill(-1);
    expect(b.copyTo(into, 2)).toBe(2 + n * width);
    expect(Array.from(into.subarray(2, 2 + n * width))).toEqual(want);
    expect([into[0], into[1], into[n * width + 2], into[n * width + 3]]).toEqual([-1, -1, -1, -1]);
  });

  it('gives its chunks back: the next buffer reuses them, new arrays only beyond what was given', () => {
    const width = 2;
    const pool = new FloatPool(ROW_CHUNK * width);
    const a = new RowBuffer(width, pool);
    a.append(rowsFrom(0, ROW_CHUNK + 1, width)); // two chunks
    const given: Float32Array[] = [];
    const taken: Float32Array[] = [];
    const [give, take] = [pool.give.bind(pool), pool.take.bind(pool)];
    pool.give = (c) => {
      given.push(c);
      give(c);
    };
    pool.take = () => {
      const c = take();
      taken.push(c);
      return c;
    };
    a.release();
    expect([a.rows, given.length]).toEqual([0, 2]);
    const b = new RowBuffer(width, pool);
    b.append(rowsFrom(100, 3 * ROW_CHUNK, width)); // three chunks: the two given back, then a new one
    expect(taken.length).toBe(3);
    expect(taken.filter((c) => given.includes(c)).length).toBe(2);
    expect(Array.from(b.rowsArray())).toEqual(Array.from(rowsFrom(100, 3 * ROW_CHUNK, width)));
  });

  it('a pool keeps at most maxBytes; a buffer refuses a pool of another chunk size', () => {
    const pool = new FloatPool(4, 40); // 16 bytes an array: two fit
    const arrays = [pool.take(), pool.take(), pool.take()];
    for (const a of arrays) pool.give(a);
    expect([pool.take(), pool.take()].every((a) => arrays.includes(a))).toBe(true);
    expect(arrays.includes(pool.take())).toBe(false); // the third was dropped
    expect(() => new RowBuffer(3, new FloatPool(ROW_CHUNK * 2))).toThrow(RangeError);
  });
});
