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
export { loadPromptBuilder, PromptBuilder, type BuiltPrompt, type PromptKind } from './prompt.js';
export { SpecdServer, type SchedulerSettings, type SpecdServerOptions } from './server.js';
export { type StatsLine, StatsLogger, type StatsSink, type StatsSource } from './stats-log.js';
export { StopTextBuffer } from './stop-text.js';
