/** @specd/core engine: the spec-decode loop (propose → verify → accept → commit), verification and metrics. */
export { SpecEngine } from './engine.js';
export {
  DEFAULT_DRAFT_POLICY,
  EngineError,
  SequenceError,
  type FinishReason,
  type SequencePhase,
  type SamplingParams,
  type SpecEngineOptions,
  type SpecRequest,
  type SpecResult,
} from './types.js';
export {
  acceptGreedy,
  acceptSampled,
  acceptSampledRows,
  acceptTreeGreedy,
  type AcceptResult,
  type TargetProbsRow,
} from './accept.js';
export { fullDraftProbs } from './spec-step.js';
export {
  checkLogitsRow,
  greedyToken,
  nextToken,
  NonFiniteLogitsError,
  type ProbsSupport,
  sampleFromProbs,
  sampleFromSupport,
  sampleToken,
  samplingProbs,
  supportOf,
} from './probs.js';
export { MAX_TEMPERATURE, normalizeSampling, SAMPLING_EPS, samplingProblem } from './sampling-params.js';
export { SeededRandom } from './random.js';
export { MAX_TOP_LOGPROBS, tokenLogprob, type TokenLogprob, type TopLogprob } from './logprobs.js';
export { hasLogitsProcessing, LogitsProcessor, logitsProcessingProblem } from './logits-processors.js';
export { RequestMetrics, RunMetrics } from './metrics.js';
export { adaptiveDraftLength, type AdaptiveDraftLengthOptions } from './draft-length.js';
export {
  AcceptanceEstimator,
  CostDraftPolicy,
  fixedDraftPolicy,
  survivalBudget,
  type AcceptanceEstimatorOptions,
  type BudgetItem,
  type CostDraftPolicyOptions,
  type CostPolicyTraceEvent,
  OverheadModel,
  type OverheadShape,
  type DraftCandidate,
  type DraftPolicy,
} from './draft-policy.js';
export { ConfidenceCalibration } from './confidence-model.js';
export {
  chooseBatchDraftLengths,
  type BatchDraftChoice,
  type BatchDraftItem,
  type BatchShape,
} from './batch-draft-lengths.js';
export {
  StepCosts,
  calibrateStepCosts,
  costBuckets,
  costDraftLengths,
  isotonic,
  lowerMedian,
  partialDrafts,
  pointMs,
  recheckJumps,
  type BucketCosts,
  type CalibrateOptions,
  type VerifyPoint,
} from './step-costs.js';
