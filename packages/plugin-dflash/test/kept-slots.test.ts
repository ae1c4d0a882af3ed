// `runBlocks(seqs, keep)`: only the kept slots of each block come back, and the last draft layer runs its queries,
// attention, o_proj and MLP for them only. Those rows must be the bits of the same rows of the whole block forward,
// for every weight format, with the last layer full-attention (pruned) or sliding (run whole), for sequences of
// different context lengths batched together; `keep` is validated.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { StageModel } from '@specd/core';

import type { DFlashDrafter } from '../src/index.js';
import { loadDrafter, loadTarget } from './helpers.js';

const D = 256; // kimi-k3-tiny's hidden size
const B = 16; // the drafter's block size

let target: StageModel;
beforeAll(() => {
  target = loadTarget();
});
afterAll(() => {
  target?.dispose();
});

/** Three sequences with 37, 150 and 5 rows of random projected context (the last past the 128-row window). */
function withContext(d: DFlashDrafter) {
  let seed = 99;
  const rand = () => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    return (seed / 2 ** 32) * 2 - 1;
  };
  const lens = [37, 150, 5];
  return lens.map((n, i) => {
    const id = `s${i}`;
    d.addSequence(id);
    d.writeProjectedContextKV(
      Float32Array.from({ length: n * D }, () => rand() * 4),
      [{ id, position: 0, numTokens: n }],
    );
    return { id, position: n, lastToken: 100 + 7 * i };
  });
}

/** The kept slots' rows of the whole forward's `[S·B, D]` output. */
function rowsOf(all: Float32Array, first: number, counts: readonly number[]): Float32Array {
  const out = new Float32Array(counts.reduce((a, n) => a + n, 0) * D);
  let at = 0;
  counts.forEach((n, i) => {
    out.set(all.subarray((i * B + first) * D, (i * B + first + n) * D), at * D);
    at += n;
  });
  return out;
}

const KEEPS = [
  { first: 1, counts: [2, 0, 15] },
  { first: 1, counts: [1, 1, 1] },
  { first: 0, counts: [7, 3, 16] },
  { first: 1, counts: [15, 15, 15] },
  { first: 5, counts: [0, 2, 11] },
  { first: 1, counts: [0, 0, 0] },
];

describe('DFlash runBlocks: the kept slots only', () => {
  for (const weights of ['bf16', 'q8_0', 'q8_0_int8']) {
    for (const last of ['full_attention', 'sliding_attention']) {
      it(`${weights}, last layer ${last}: the kept rows are the whole block's bits`, async () => {
        const config = { layer_types: ['full_attention', 'full_attention', last] };
        const d = await loadDrafter(target, config, 4, 1024, { method: 'dflash', path: 'x', weights });
        try {
          const seqs = withContext(d);
          const all = d.runBlocks(seqs);
          expect(all.length).toBe(seqs.length * B * D);
          for (const keep of KEEPS) {
            const got = d.runBlocks(seqs, keep);
            const want = rowsOf(all, keep.first, keep.counts);
            expect(got.length).toBe(want.length);
            // bit for bit (NaN-free: every value finite)
            expect(got.every(Number.isFinite)).toBe(true);
            expect(Buffer.from(got.buffer, got.byteOffset, got.byteLength)).toEqual(
              Buffer.from(want.buffer, want.byteOffset, want.byteLength),
            );
          }
          // the block's rows were temporary: the contexts are as written
          expect(seqs.map((s) => d.contextLength(s.id))).toEqual([37, 150, 5]);
        } finally {
          d.dispose();
        }
      });
    }
  }

  it('rejects a keep outside the block or without one count per sequence', async () => {
    const d = await loadDrafter(target);
    try {
      const seqs = withContext(d);
      expect(() => d.runBlocks(seqs, { first: 16, counts: [1, 1, 1] })).toThrow(
        /keep\.first must be an integer in \[0, 16\), got 16/,
      );
      expect(() => d.runBlocks(seqs, { first: 1, counts: [1, 1] })).toThrow(/one count per sequence \(3\), got 2/);
      expect(() => d.runBlocks(seqs, { first: 1, counts: [1, 16, 1] })).toThrow(
        /keep\.counts\[1\] must be an integer in \[0, 15\]/,
      );
      expect(() => d.runBlocks(seqs, { first: 0, counts: [1, -1, 1] })).toThrow(/keep\.counts\[1\]/);
    } finally {
      d.dispose();
    }
  });
});
