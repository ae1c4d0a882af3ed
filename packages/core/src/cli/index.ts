/** @specd/core cli: the `specd` command line and plain generation. */
export { main, buildProgram, type CliIo } from './main.js';
export { generateTokens, loadTarget, PREFILL_CHUNK_TOKENS, type GenerateOptions, type GenerateResult, type LoadedTarget } from './generate.js';
export { greedyToken, nextToken, sampleToken, SeededRandom, type SamplingParams } from './sampling.js';
export { CliConfigError, readCliConfig, type CliConfig, type GenerateSettings } from './config-file.js';
export { defaultModelDir, DEFAULT_MODEL_RELATIVE } from './paths.js';
