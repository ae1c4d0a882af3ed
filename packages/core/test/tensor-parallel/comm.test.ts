// The shared-memory collectives of tensor-parallel ranks (packages/core/src/tensor-parallel/comm.ts):
// a group of 3 ranks (rank 0 this thread, ranks 1 and 2 worker threads), pieces of 5 floats for
// 13-float inputs (so every collective runs in 3 pieces). broadcast gives rank 0's values on every
// rank and leaves each rank's input alone; allReduce after it still sums in rank order; allGather
// concatenates pieces of different lengths per rank (empty ones, and pieces longer than the buffer
// row, so the ranks run different numbers of non-empty rounds) in rank order on every rank.
import { Worker } from 'node:worker_threads';

import { describe, expect, it } from 'vitest';

import { createCommBuffers, SharedComm } from '../../src/tensor-parallel/comm.js';

describe('SharedComm', () => {
  it("broadcast: rank 0's array on every rank, in pieces; then allReduce sums in rank order", async () => {
    const size = 3;
    const length = 13;
    const buffers = createCommBuffers(size, 5);
    // per all-gather call, the piece length of ranks 0, 1, 2 (capacity 5)
    const gatherLengths = [
      [4, 4, 4],
      [13, 2, 7],
      [0, 11, 0],
      [0, 0, 0],
      [5, 10, 1],
    ];
    const workers = [1, 2].map(
      (rank) =>
        new Worker(new URL('./comm-rank.mjs', import.meta.url), {
          workerData: { rank, buffers, length, gatherLengths },
        }),
    );
    const replies = workers.map(
      (w) =>
        new Promise<{ b: Float32Array; s: Float32Array; g: Float32Array[]; mineAfter: Float32Array }>(
          (resolve, reject) => {
            w.once('message', resolve);
            w.once('error', reject);
          },
        ),
    );
    const comm = new SharedComm(0, buffers);
    const mine = Float32Array.from({ length }, (_, i) => 1000 + i);
    const b0 = comm.broadcast(mine);
    const s0 = comm.allReduce(mine);
    const g0 = gatherLengths.map((n) => comm.allGather(Float32Array.from({ length: n[0]! }, (_, i) => 1000 + i)));
    const [r1, r2] = await Promise.all(replies);
    await Promise.all(workers.map((w) => w.terminate()));
    const expectSum = Float32Array.from({ length }, (_, i) => 1000 + i + (2000 + i) + (3000 + i));
    for (const b of [b0, r1!.b, r2!.b]) expect(Array.from(b)).toEqual(Array.from(mine));
    for (const s of [s0, r1!.s, r2!.s]) expect(Array.from(s)).toEqual(Array.from(expectSum));
    expect(b0).not.toBe(mine);
    expect(Array.from(r1!.mineAfter)).toEqual(Array.from({ length }, (_, i) => 2000 + i));
    expect(comm.broadcasts).toBe(1);
    gatherLengths.forEach((n, call) => {
      const expected = n.flatMap((len, r) => Array.from({ length: len }, (_, i) => (r + 1) * 1000 + i));
      for (const g of [g0[call]!, r1!.g[call]!, r2!.g[call]!])
        expect(Array.from(g), `allGather call ${call}`).toEqual(expected);
    });
    expect(comm.allGathers).toBe(gatherLengths.length);
  });

  it('a group of one: broadcast and allGather return a copy', () => {
    const comm = new SharedComm(0, createCommBuffers(1, 4));
    const x = Float32Array.of(1, 2, 3);
    const y = comm.broadcast(x);
    expect(Array.from(y)).toEqual([1, 2, 3]);
    expect(y).not.toBe(x);
    const g = comm.allGather(x);
    expect(Array.from(g)).toEqual([1, 2, 3]);
    expect(g).not.toBe(x);
  });
});
