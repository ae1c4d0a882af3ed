/** @specd/core config: the deployment config schema (core + plugin branches), validation, loading. */
export { buildConfigSchema, CONFIG_SCHEMA_ID, NO_DRAFTER_SCHEMA } from './schema.js';
export { compileConfigSchema, ConfigError, formatConfigErrors, jsonPath } from './validate.js';
export {
  configSchemaFor,
  loadConfig,
  loadPlugins,
  validateConfig,
  type DrafterConfig,
  type LoadedPlugins,
  type SpecdConfig,
} from './load.js';
export {
  describeSampling,
  modelFolder,
  OPENAI_SAMPLING_DEFAULTS,
  readModelSamplingDefaults,
  resolveSamplingDefaults,
  type ModelSamplingDefaults,
  type ResolvedSampling,
  type SamplingSource,
} from './generation-config.js';
