// Vocab-parallel lm_head helpers (packages/core/src/tensor-parallel/vocab-parallel.ts): the slices of
// an uneven split (V = 10 over 3 ranks) cover [0, V) in rank order, and gathering each rank's
// `[rows, V_r]` slice lays out the whole `[rows, V]` on every rank. The all-gather itself is
// comm.test.ts's; here a stand-in returns the concatenated pieces as SharedComm would.
import { describe, expect, it } from 'vitest';

import type { TpComm } from '../../src/plugin/model-plugin.js';
import { gatherVocabParallel, vocabShardRange, VocabParallelError } from '../../src/tensor-parallel/vocab-parallel.js';

describe('vocab-parallel lm_head', () => {
  it('vocabShardRange: ⌊r·V/N⌋ … ⌊(r+1)·V/N⌋, even and uneven', () => {
    expect([0, 1, 2].map((r) => vocabShardRange(10, r, 3))).toEqual([
      [0, 3],
      [3, 6],
      [6, 10],
    ]);
    expect([0, 1].map((r) => vocabShardRange(8192, r, 2))).toEqual([
      [0, 4096],
      [4096, 8192],
    ]);
    expect(vocabShardRange(5, 0, 1)).toEqual([0, 5]);
    expect(() => vocabShardRange(10, 3, 3)).toThrow(VocabParallelError);
    expect(() => vocabShardRange(2, 0, 3)).toThrow(/vocabSize: expected an integer >= size \(3\), got 2/);
  });

  it("gatherVocabParallel: each rank's [rows, V_r] slice → the whole [rows, V] on every rank", () => {
    const V = 10;
    const size = 3;
    const rows = 2;
    const whole = Float32Array.from({ length: rows * V }, (_, i) => 100 * Math.floor(i / V) + (i % V));
    const pieces = [0, 1, 2].map((r) => {
      const [v0, v1] = vocabShardRange(V, r, size);
      const p = new Float32Array(rows * (v1 - v0));
      for (let i = 0; i < rows; i++) p.set(whole.subarray(i * V + v0, i * V + v1), i * (v1 - v0));
      return p;
    });
    const concat = Float32Array.from(pieces.flatMap((p) => Array.from(p)));
    for (let rank = 0; rank < size; rank++) {
      const comm: TpComm = {
        rank,
        size,
        allReduce: () => {
          throw new Error('unused');
        },
        broadcast: () => {
          throw new Error('unused');
        },
        allGather: (x) => {
          expect(Array.from(x)).toEqual(Array.from(pieces[rank]!));
          return concat.slice();
        },
      };
      expect(Array.from(gatherVocabParallel(comm, pieces[rank]!, rows, V))).toEqual(Array.from(whole));
      expect(() => gatherVocabParallel(comm, new Float32Array(1), rows, V)).toThrow(/local: expected \[2, \d\] f32/);
    }
  });
});
