/**
 * The entry script of a tensor-parallel rank ≥ 1 (a worker thread started by
 * {@link startTensorParallel}; `dist/tensor-parallel/tp-worker.js`).
 *
 * workerData: {@link TpWorkerInit}. It loads its shard through the model plugin's `loadShard`,
 * posts `ready` (`{info, reads}`) or `error` on `parentPort`, then serves requests synchronously:
 * it sleeps on its request word (Atomics.wait), takes the request from its MessagePort with
 * `receiveMessageOnPort`, runs it (the forward's all-reduces meet the other ranks in shared
 * memory), posts the reply on the port and bumps its reply word.
 *   `forward` — apply the queued cache operations (as the pipeline's stage processes do), then run
 *               the shard on the embedded input; reply `{ok: true}` or `{ok: false, name, message}`;
 *   `exit`    — leave the loop.
 */

import { parentPort, workerData } from 'node:worker_threads';

import { replyWord, requestWord, SharedComm, takeMessage, TpAbortError, waitWhile } from './comm.js';
import { loadShardOf, RankCaches, type TpForwardRequest, type TpWorkerInit } from './rank.js';

function serve(init: TpWorkerInit, comm: SharedComm, caches: RankCaches): void {
  const ctrl = comm.ctrl;
  const rq = requestWord(init.rank);
  // requests are counted from 0 (only the driver increments; it may post before this loop starts)
  let seen = 0;
  for (;;) {
    waitWhile(ctrl, rq, seen, false);
    seen++;
    const msg = takeMessage(init.port) as TpForwardRequest | { type: 'exit' } | undefined;
    if (msg === undefined || msg.type === 'exit') break;
    let reply: Record<string, unknown>;
    try {
      caches.forward(msg);
      reply = { ok: true };
    } catch (err) {
      const e = err as Error;
      if (!(err instanceof TpAbortError)) comm.abort();
      reply = { ok: false, name: e.name, message: e.message };
    }
    init.port.postMessage(reply);
    Atomics.add(ctrl, replyWord(init.rank), 1);
    Atomics.notify(ctrl, replyWord(init.rank));
  }
  init.port.close();
}

async function main(): Promise<void> {
  const init = workerData as TpWorkerInit;
  const comm = new SharedComm(init.rank, init.buffers);
  let caches: RankCaches;
  try {
    const { shard } = await loadShardOf(init.modelDir, init.plugins, comm, init.range);
    caches = new RankCaches(shard.model);
    parentPort!.postMessage({ type: 'ready', info: shard.model.info, reads: shard.reads });
  } catch (err) {
    const e = err as Error;
    parentPort!.postMessage({ type: 'error', name: e.name, message: e.message });
    return;
  }
  serve(init, comm, caches);
}

if (parentPort !== null && workerData !== null && typeof workerData === 'object' && 'buffers' in (workerData as object)) void main();
