/**
 * Pipeline parallelism: stages as processes (pipeline-model.ts, remote-stage.ts, stage-process.ts,
 * start-pipeline.ts), partitions, the stage transports (ZeroMQ, FIFOs).
 */
export { defaultPartition, partitionRanges, PartitionError } from './partition.js';
export { PipelineModel, type PipelineCache } from './pipeline-model.js';
export { RemoteStage, type StageReport } from './remote-stage.js';
export { liveStagePids, PipelineStageError, STAGE_WORKER_SCRIPT } from './stage-process.js';
export { startPipeline, type PipelineOptions, type StageTransport } from './start-pipeline.js';
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
