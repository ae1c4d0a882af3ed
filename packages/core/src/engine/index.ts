/** @specd/core engine: the spec-decode loop (propose → verify → accept → commit), verification and metrics. */
export { EngineError, SpecEngine, type FinishReason, type SpecEngineOptions, type SpecRequest, type SpecResult } from './engine.js';
export { acceptGreedy, acceptSampled, type AcceptResult } from './accept.js';
export { sampleFromProbs, samplingProbs } from './probs.js';
export { RequestMetrics, RunMetrics } from './metrics.js';
export { adaptiveDraftLength, type AdaptiveDraftLengthOptions } from './draft-length.js';
