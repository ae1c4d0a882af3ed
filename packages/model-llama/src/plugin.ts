/**
 * The Llama {@link ModelPlugin}: HF safetensors folders (`model_type` "llama", `LlamaForCausalLM`)
 * and GGUF files with `general.architecture` "llama" (quantized projections kept as blocks unless
 * `SPECD_GGUF_WEIGHTS=bf16` asks for bf16 panels at load; docs/BENCHMARKS.md "Quantized GEMM"; `SPECD_GGUF_ACT`
 * picks int16 (default), f32 or int8 activations for the quantized projections).
 */
import type { GgufFile, ModelPlugin, ModelSource, StageLoadOptions, StageModel } from '@specd/core';
import type { QuantActivation } from '@specd/native';

import { LLAMA_ARCHITECTURES, LLAMA_MODEL_TYPES, parseLlamaConfig } from './config.js';
import { loadLlamaCudaStage, type CudaStageOptions } from './cuda-stage.js';
import { ggufSource, parseGgufLlamaConfig, type GgufWeightMode } from './gguf.js';
import { loadLlamaStageAsync, type LlamaLoadOptions } from './model.js';
import { safetensorsSource } from './weights.js';

function rangeOf(options: StageLoadOptions | undefined): LlamaLoadOptions {
  return {
    ...(options?.layerStart === undefined ? {} : { layerStart: options.layerStart }),
    ...(options?.layerEnd === undefined ? {} : { layerEnd: options.layerEnd }),
  };
}

function progress(options: StageLoadOptions | undefined, total: number): ((tensor: string) => void) | undefined {
  const onProgress = options?.onProgress;
  let done = 0;
  return onProgress === undefined ? undefined : (tensor) => onProgress({ done: ++done, total, tensor });
}

/** `SPECD_GGUF_WEIGHTS`: `quant` (default) or `bf16`. @throws {RangeError} for another value. */
function ggufWeightMode(): GgufWeightMode {
  const v = process.env.SPECD_GGUF_WEIGHTS;
  if (v === undefined || v === '' || v === 'quant') return 'quant';
  if (v === 'bf16') return 'bf16';
  throw new RangeError(`SPECD_GGUF_WEIGHTS: expected "quant" or "bf16", got ${JSON.stringify(v)}`);
}

/**
 * `SPECD_GGUF_ACT`: activations of the quantized GGUF projections, `int16` (default), `f32` or `int8`
 * (docs/BENCHMARKS.md "Quantized GEMM: int8 activations", "int16 activations"). int16 is the default because
 * it is within 2.3e-4 of fp32 activations at every layer of the goldens (the reduced-precision bar is 1e-2),
 * greedy continuations and drafter τ equal the reference's, and it decodes, verifies and prefills faster than
 * fp32 activations; `f32` is the reference path (the goldens at 1e-4), `int8` the fastest and least exact.
 * @throws {RangeError} for another value.
 */
function ggufActivation(): QuantActivation {
  const v = process.env.SPECD_GGUF_ACT;
  if (v === undefined || v === '' || v === 'int16') return 'int16';
  if (v === 'f32' || v === 'int8') return v;
  throw new RangeError(`SPECD_GGUF_ACT: expected "f32", "int8" or "int16", got ${JSON.stringify(v)}`);
}

/**
 * The CUDA stage's options from a load's: the whole model only (a layer range is refused), `maxTokens` passed on,
 * CUDA graphs unless `SPECD_CUDA_GRAPHS=0`.
 * @throws {RangeError} for a layer range.
 */
function cudaOptions(options: StageLoadOptions): CudaStageOptions {
  if (options.layerStart !== undefined || options.layerEnd !== undefined)
    throw new RangeError('llama: device "cuda" loads the whole model: a layer range (pipeline stage) is not supported');
  return {
    ...(options.maxTokens === undefined ? {} : { maxTokens: options.maxTokens }),
    graphs: process.env.SPECD_CUDA_GRAPHS !== '0',
  };
}

export const llamaPlugin: ModelPlugin = Object.freeze({
  // the plugin API version (core's PLUGIN_API_VERSION) this plugin is built for
  apiVersion: 1,
  name: 'llama',
  modelTypes: LLAMA_MODEL_TYPES,
  architectures: LLAMA_ARCHITECTURES,
  ggufArchitectures: Object.freeze(['llama']),
  devices: Object.freeze(['cpu', 'cuda'] as const),
  load(source: ModelSource, options?: StageLoadOptions): Promise<StageModel> {
    const c = parseLlamaConfig(source.config, 'neox');
    if (options?.device === 'cuda')
      return loadLlamaCudaStage(
        c,
        safetensorsSource(source.dir, source.weights, progress(options, 3 + 6 * c.numLayers), source.sanity),
        cudaOptions(options),
      );
    return loadLlamaStageAsync(
      c,
      safetensorsSource(source.dir, source.weights, progress(options, 3 + 6 * c.numLayers), source.sanity),
      rangeOf(options),
    );
  },
  loadGguf(file: GgufFile, options?: StageLoadOptions): Promise<StageModel> {
    const c = parseGgufLlamaConfig(file);
    if (options?.device === 'cuda')
      return loadLlamaCudaStage(
        c,
        ggufSource(file, 'bf16', progress(options, 3 + 9 * c.numLayers), options.sanity),
        cudaOptions(options),
      );
    return loadLlamaStageAsync(
      c,
      ggufSource(file, ggufWeightMode(), progress(options, 3 + 9 * c.numLayers), options?.sanity, ggufActivation()),
      rangeOf(options),
    );
  },
});
