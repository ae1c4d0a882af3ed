/** Pipeline parallelism: stages as processes (pipeline-model.ts), partitions, the stage transports (ZeroMQ, FIFOs). */
export { defaultPartition, partitionRanges, PartitionError } from './partition.js';
export {
  liveStagePids,
  PipelineModel,
  PipelineStageError,
  RemoteStage,
  startPipeline,
  STAGE_WORKER_SCRIPT,
  type PipelineCache,
  type PipelineOptions,
  type StageReport,
  type StageTransport,
} from './pipeline-model.js';
export { MirroredCache, MirroredCacheError } from './mirrored-cache.js';
export { loadStage, numHiddenLayers, type LoadedStage, type StageSpec } from './stage-loader.js';
export {
  decodeMessage,
  encodeMessage,
  FifoChannel,
  PeerGoneError,
  type Frame,
  type Message,
  type SyncChannel,
} from './transport.js';
export { processAlive, ZmqChannel, type ZmqChannelOptions } from './zmq-channel.js';
export type { CacheOp, StageInit, WireSequence } from './stage-worker.js';
