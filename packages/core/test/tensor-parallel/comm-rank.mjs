// A worker rank of comm.test.ts: joins the group, runs the same collectives as rank 0, posts its results.
import { parentPort, workerData } from 'node:worker_threads';

import { SharedComm } from '../../dist/tensor-parallel/comm.js';

const { rank, buffers, length, gatherLengths } = workerData;
const comm = new SharedComm(rank, buffers);
// every rank passes its own values; broadcast returns rank 0's, allReduce the sum
const mine = Float32Array.from({ length }, (_, i) => (rank + 1) * 1000 + i);
const b = comm.broadcast(mine);
const s = comm.allReduce(mine);
// all-gather: rank r's piece has gatherLengths[r] floats, values (r + 1) · 1000 + i
const g = gatherLengths.map((n) =>
  comm.allGather(Float32Array.from({ length: n[rank] }, (_, i) => (rank + 1) * 1000 + i)),
);
parentPort.postMessage({ b, s, g, mineAfter: mine });
