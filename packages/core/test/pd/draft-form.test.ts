// The decode instance's per-request choice of the draft context's form (pd/draft-form.ts): "kv" and "features"
// are fixed; "auto" never picks a form that is not fewer bytes, picks features while nothing is measured, then
// compares the time the saved bytes take at the measured transfer rate with the measured rebuild cost.
import { describe, expect, it } from 'vitest';

import { DraftFormChooser } from '../../dist/pd/draft-form.js';

describe('DraftFormChooser', () => {
  it('"kv" and "features" are what they say, whatever the bytes', () => {
    expect(new DraftFormChooser('kv').choose(100, 10, 5)).toBe('kv');
    expect(new DraftFormChooser('features').choose(10, 100, 5)).toBe('features');
  });

  it('"auto": the fewer bytes until measured, then saved bytes / rate against rows × rebuild cost', () => {
    const c = new DraftFormChooser('auto');
    expect(c.choose(100, 100, 5)).toBe('kv'); // not fewer bytes: never features
    expect(c.choose(1000, 400, 10)).toBe('features'); // nothing measured
    c.observeTransfer(1000, 0); // a wait of 0 (data before the announcement) says nothing
    c.observeRebuild(0, 5); // nor a rebuild of no rows
    expect(c.measured).toEqual({});
    c.observeTransfer(1000, 10); // 100 bytes/ms
    expect(c.choose(1000, 400, 10)).toBe('features'); // the rebuild is not measured yet
    c.observeRebuild(10, 1); // 0.1 ms per row
    expect(c.measured).toEqual({ bytesPerMs: 100, rebuildMsPerRow: 0.1 });
    // 600 bytes saved = 6 ms against 10 rows × 0.1 ms = 1 ms: features; 100 rows × 0.1 = 10 ms: kv
    expect(c.choose(1000, 400, 10)).toBe('features');
    expect(c.choose(1000, 400, 100)).toBe('kv');
    // moving averages: a faster link (1000 bytes/ms) moves the rate a quarter of the way: 325 bytes/ms
    c.observeTransfer(1000, 1);
    expect(c.measured.bytesPerMs).toBeCloseTo(325, 9);
    // 600 bytes at 325 bytes/ms ≈ 1.85 ms against 20 rows × 0.1 ms = 2 ms: kv
    expect(c.choose(1000, 400, 20)).toBe('kv');
    expect(c.choose(1000, 400, 18)).toBe('features');
  });
});
