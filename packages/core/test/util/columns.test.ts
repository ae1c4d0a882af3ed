// sliceColumns: a column block of a row-major [rows, srcWidth] array, into a new array or a given `out`.
import { describe, expect, it } from 'vitest';

import { sliceColumns } from '../../src/util/columns.js';

describe('sliceColumns', () => {
  // [3, 5]: element (r, c) = 10 r + c
  const src = Float32Array.from({ length: 15 }, (_, i) => 10 * Math.floor(i / 5) + (i % 5));

  it('copies columns [col, col + width) of every row, into a new array or into out', () => {
    const fresh = sliceColumns(src, 3, 5, 1, 3);
    expect(Array.from(fresh)).toEqual([1, 2, 3, 11, 12, 13, 21, 22, 23]);
    const out = new Float32Array(6).fill(-1);
    expect(sliceColumns(src, 3, 5, 3, 2, out)).toBe(out);
    expect(Array.from(out)).toEqual([3, 4, 13, 14, 23, 24]);
  });

  it('refuses columns outside the row, a src of the wrong shape and an out of the wrong length', () => {
    expect(() => sliceColumns(src, 3, 5, 4, 2)).toThrow(/columns \[4, 6\) outside \[0, 5\)/);
    expect(() => sliceColumns(src, 2, 5, 0, 1)).toThrow(/expected \[2, 5\]/);
    expect(() => sliceColumns(src, 3, 5, 0, 2, new Float32Array(5))).toThrow(/out: expected 6 elements, got 5/);
  });
});
