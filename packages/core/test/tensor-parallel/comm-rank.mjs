// A worker rank of comm.test.ts: joins the group, runs the same collectives as rank 0, posts its results.
import { parentPort, workerData } from 'node:worker_threads';

import { SharedComm } from '../../dist/tensor-parallel/comm.js';

const { rank, buffers, length } = workerData;
const comm = new SharedComm(rank, buffers);
// every rank passes its own values; broadcast returns rank 0's, allReduce the sum
const mine = Float32Array.from({ length }, (_, i) => (rank + 1) * 1000 + i);
const b = comm.broadcast(mine);
const s = comm.allReduce(mine);
parentPort.postMessage({ b, s, mineAfter: mine });
