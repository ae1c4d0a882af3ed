/** Tensor parallelism: ranks as worker threads, shared-memory all-reduce (tp-model.ts, comm.ts). */
export { createCommBuffers, SharedComm, TpAbortError, type CommBuffers } from './comm.js';
export {
  startTensorParallel, TensorParallelError, TensorParallelModel, TP_WORKER_SCRIPT, type RankReply, type RankReport, type TpCache, type TensorParallelOptions,
} from './tp-model.js';
export { draftShardLayout, DraftShard, type DraftShardCounts, type DraftShardLayout } from './draft-shard.js';
export { loadTensorParallelDrafter, TensorParallelDrafter } from './tp-drafter.js';
