/**
 * The entry script of a tensor-parallel rank ≥ 1 (a worker thread started by
 * {@link startTensorParallel}; `dist/tensor-parallel/tp-worker.js`).
 *
 * workerData: {@link TpWorkerInit}. It loads its shard through the model plugin's `loadShard`,
 * posts `ready` (`{info, reads}`) or `error` on `parentPort`, then serves requests synchronously:
 * it sleeps on its request word (Atomics.wait), takes the request from its MessagePort with
 * `receiveMessageOnPort`, runs it (the forward's all-reduces meet the other ranks in shared
 * memory), posts the reply on the port and bumps its reply word.
 *   `forward`      — apply the queued cache operations (as the pipeline's stage processes do), then
 *                    run the shard on the embedded input; reply `{ok: true}` or `{ok: false, name, message}`;
 *   `drafter.load` — load this rank's drafter shard (the drafter plugin's `loadShard`, target = this
 *                    rank's model shard, comm = the group's); reply `{ok: true, reads}` or an error;
 *   `drafter.call` — run a method of a loaded drafter shard (its collectives meet the other ranks);
 *                    reply `{ok: true}` (rank 0's result is the one used) or an error;
 *   `lmHead`       — run this rank's shard's vocab-parallel lm_head on the request's rows (its
 *                    all-gather meets the other ranks); reply `{ok: true}` or an error;
 *   `sync`         — apply the queued cache operations now and reply `{ok: true, regions}`: the cache's
 *                    stores and the listed drafter shards' PD regions (shared memory, pd/ranks.ts);
 *   `exit`         — leave the loop.
 */

import { parentPort, workerData } from 'node:worker_threads';

import { replyWord, requestWord, SharedComm, takeMessage, TpAbortError, waitWhile } from './comm.js';
import type { Drafter, DraftSequence } from '../plugin/drafter-plugin.js';
import type { StageModel } from '../plugin/model-plugin.js';
import {
  loadDrafterShardOf,
  loadShardOf,
  RankCaches,
  type TpDrafterCallRequest,
  type TpDrafterLoadRequest,
  type TpForwardRequest,
  type TpLmHeadRequest,
  type TpSyncRequest,
  type TpWorkerInit,
} from './rank.js';
import { hasDraftContextTransfer } from '../plugin/drafter-plugin.js';
import { targetRegions } from '../pd/manifest.js';

type Request =
  | TpForwardRequest
  | TpDrafterLoadRequest
  | TpDrafterCallRequest
  | TpLmHeadRequest
  | TpSyncRequest
  | { type: 'exit' };

/** Worker ranks never sample: the propose sequences they get carry this instead of the request's PRNG. */
const NO_RNG = Object.freeze({
  next(): number {
    throw new Error("tensor parallel: a worker rank's drafter shard asked for random numbers (only rank 0 samples)");
  },
});

/** Runs a drafter call on this rank's shard (propose sequences get an empty history and no PRNG). */
function callDrafter(drafters: Map<number, Drafter>, req: TpDrafterCallRequest): void {
  const d = drafters.get(req.id);
  if (d === undefined) {
    if (req.name === 'dispose') return;
    throw new Error(`tensor parallel: no drafter shard ${req.id} on this rank`);
  }
  let args = req.args;
  if (req.name === 'propose') {
    const batch = args[0] as { sequences: Omit<DraftSequence, 'rng' | 'history'>[] };
    args = [{ sequences: batch.sequences.map((s) => ({ ...s, history: new Int32Array(0), rng: NO_RNG })) }];
  }
  const f = (d as unknown as Record<string, unknown>)[req.name];
  if (typeof f !== 'function') throw new Error(`tensor parallel: drafter shard ${req.id} has no method ${req.name}`);
  (f as (...a: unknown[]) => unknown).apply(d, args as unknown[]);
  if (req.name === 'dispose') drafters.delete(req.id);
}

async function serve(init: TpWorkerInit, comm: SharedComm, caches: RankCaches, model: StageModel): Promise<void> {
  const drafters = new Map<number, Drafter>();
  const ctrl = comm.ctrl;
  const rq = requestWord(init.rank);
  // requests are counted from 0 (only the driver increments; it may post before this loop starts)
  let seen = 0;
  for (;;) {
    waitWhile(ctrl, rq, seen, false);
    seen++;
    const msg = takeMessage(init.port) as Request | undefined;
    if (msg === undefined || msg.type === 'exit') break;
    let reply: Record<string, unknown>;
    try {
      if (msg.type === 'forward') {
        caches.forward(msg);
        reply = { ok: true };
      } else if (msg.type === 'drafter.load') {
        const loaded = await loadDrafterShardOf(msg.dir, msg.plugins, model, comm, msg.options);
        if (loaded === undefined)
          throw new Error(`tensor parallel: the drafter plugin of ${msg.dir} has no loadShard on rank ${init.rank}`);
        drafters.set(msg.id, loaded.drafter);
        reply = { ok: true, reads: loaded.reads };
      } else if (msg.type === 'sync') {
        const regions = targetRegions(caches.sync(msg.ops, msg.cache));
        for (const id of msg.drafters) {
          const d = drafters.get(id);
          if (d !== undefined && hasDraftContextTransfer(d)) regions.push(...d.pdRegions());
        }
        reply = { ok: true, regions };
      } else if (msg.type === 'lmHead') {
        if (model.lmHead === undefined) throw new Error(`tensor parallel: rank ${init.rank}'s shard has no lmHead`);
        model.lmHead(msg.x, msg.rows);
        reply = { ok: true };
      } else {
        callDrafter(drafters, msg);
        reply = { ok: true };
      }
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
  let model: StageModel;
  try {
    const { shard } = await loadShardOf(init.modelDir, init.plugins, comm, init.range);
    model = shard.model;
    caches = new RankCaches(shard.model);
    parentPort!.postMessage({ type: 'ready', info: shard.model.info, reads: shard.reads });
  } catch (err) {
    const e = err as Error;
    parentPort!.postMessage({ type: 'error', name: e.name, message: e.message });
    return;
  }
  await serve(init, comm, caches, model);
}

if (parentPort !== null && workerData !== null && typeof workerData === 'object' && 'buffers' in (workerData as object))
  void main();
