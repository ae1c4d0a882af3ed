/**
 * Tensor parallelism: ranks as worker threads, shared-memory collectives, vocab-parallel lm_head (tp-model.ts,
 * comm.ts, vocab-parallel.ts).
 */
export { createCommBuffers, SharedComm, TpAbortError, type CommBuffers } from './comm.js';
export {
  startTensorParallel,
  TensorParallelError,
  TensorParallelModel,
  TP_WORKER_SCRIPT,
  type RankReply,
  type RankReport,
  type TpCache,
  type TensorParallelOptions,
} from './tp-model.js';
export { draftShardLayout, DraftShard, type DraftShardCounts, type DraftShardLayout } from './draft-shard.js';
export { loadTensorParallelDrafter, TensorParallelDrafter } from './tp-drafter.js';
export { gatherVocabParallel, vocabShardRange, VocabParallelError } from './vocab-parallel.js';
