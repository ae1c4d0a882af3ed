/**
 * @specd/model-llama — Llama-family targets (LlamaForCausalLM; SmolLM2-135M-Instruct, REFERENCE.md §10).
 * Registration: `register(container)` puts {@link llamaPlugin} under core's MODEL_PLUGIN token.
 */
import { MODEL_PLUGIN } from '@specd/core';
import type { DependencyContainer } from 'tsyringe';

import { llamaPlugin } from './plugin.js';

/** Registers the plugin in a tsyringe container. */
export function register(container: DependencyContainer): void {
  container.register(MODEL_PLUGIN, { useValue: llamaPlugin });
}

export { llamaPlugin } from './plugin.js';
export {
  LLAMA_ARCHITECTURES,
  LLAMA_MODEL_TYPES,
  parseLlamaConfig,
  type LlamaConfig,
  type LlamaRopeStyle,
} from './config.js';
export {
  LlamaForwardError,
  LlamaStageModel,
  buildLlamaStage,
  loadLlamaStage,
  loadLlamaStageAsync,
  type LlamaForwardResult,
  type LlamaLoadOptions,
} from './model.js';
export {
  LlamaWeightError,
  bf16Embedding,
  bf16Linear,
  safetensorsSource,
  type EmbeddingTable,
  type LinearWeights,
  type LlamaTensorSource,
} from './weights.js';
export { CudaLlamaStageModel, loadLlamaCudaStage, type CudaStageOptions } from './cuda-stage.js';
export {
  checkGgufFinite,
  ggufLlamaConfig,
  ggufSource,
  ggufTensorName,
  parseGgufLlamaConfig,
  type GgufWeightMode,
} from './gguf.js';
