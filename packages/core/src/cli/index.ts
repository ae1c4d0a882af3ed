/** @specd/core cli: the `specd` command line and plain generation. */
export { main, buildProgram, type CliIo } from './main.js';
export {
  generateSpeculative,
  generateTokens,
  PREFILL_CHUNK_TOKENS,
  type GenerateOptions,
  type GenerateResult,
  type SpecGenerateResult,
} from './generate.js';
export { checkModelPath, chooseDrafter, CliError } from './config-file.js';
export { startRouter, type RouterFlags, type StartedRouter } from './router.js';
export { checkPortFree, serveLogger, startServe, type ServeFlags, type StartedServer } from './serve.js';
export {
  defaultDrafterDir,
  defaultModelDir,
  defaultServeConfig,
  DEFAULT_DRAFTER_RELATIVE,
  DEFAULT_MODEL_RELATIVE,
  DEFAULT_SERVE_CONFIG_RELATIVE,
} from './paths.js';
