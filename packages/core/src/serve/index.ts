/** @specd/core serve: the OpenAI-compatible HTTP server, its engine loop and metrics. */
export { ChatTemplate, ChatTemplateError, type ChatMessage } from './chat-template.js';
export {
  EngineLoop,
  OverloadedError,
  type EngineLoopOptions,
  type LoopListener,
  type LoopRequest,
} from './engine-loop.js';
export { ApiError } from './errors.js';
export {
  API_KEY_ENV,
  apiKeyFrom,
  BindError,
  checkBind,
  MAX_JSON_DEPTH,
  type AccessPolicy,
} from './http-guard.js';
export {
  checkServerContextLength,
  ContextLengthError,
  modelContextLength,
  resolveMaxTokens,
  type ModelContextLength,
} from './limits.js';
export {
  acceptanceRate,
  perPositionRate,
  ServerMetrics,
  type ServerGaugeSource,
  type SpecDecodeTotals,
  tauPerDraftStep,
  tauPerVerifyStep,
} from './metrics.js';
export {
  parseChatRequest,
  parseCompletionRequest,
  type ChatRequest,
  type CompletionRequest,
  type GenerationParams,
  type SamplingDefaults,
} from './protocol.js';
export { loadPromptBuilder, PromptBuilder, type BuiltPrompt, type PromptKind, type PromptLimits } from './prompt.js';
export { PromptEncoder } from './prompt-encoder.js';
export { SpecdServer, type SchedulerSettings, type SpecdServerOptions } from './server.js';
export { type StatsLine, StatsLogger, type StatsSink, type StatsSource } from './stats-log.js';
export { StopTextBuffer } from './stop-text.js';
