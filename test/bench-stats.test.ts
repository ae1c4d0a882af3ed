// bench/stats.mjs: the benches' median (bench:load's ratios over two repetitions read the larger one before).
import { describe, expect, it } from 'vitest';

// a plain ES module of the benches (no declarations; vitest transpiles without type-checking)
import { median } from '../bench/stats.mjs';

describe('median', () => {
  it('is the middle value of an odd count, whatever the order', () => {
    expect(median([3, 1, 2])).toBe(2);
    expect(median([0.94])).toBe(0.94);
    expect(median([5, -1, 4, 4, 9])).toBe(4);
  });

  it('is the mean of the two middle values of an even count: two repetitions give their mean', () => {
    expect(median([1.17, 0.94])).toBeCloseTo(1.055, 12);
    expect(median([4, 1, 3, 2])).toBe(2.5);
  });

  it('leaves its argument unsorted and refuses an empty list', () => {
    const xs = [3, 1, 2];
    median(xs);
    expect(xs).toEqual([3, 1, 2]);
    expect(() => median([])).toThrow(/at least one value/);
  });
});
