/**
 * The GPU a target stage lends drafters that run their draft model beside it (the GPU drafters of EAGLE-3 and DFlash),
 * found by shape: a stage with a `cudaDevice()` method (the CUDA Llama stage) returns its loaded addon and its token
 * embedding. Core names no device capability of its own; a drafter plugin asks for the addon entry its runner needs, so
 * an addon built before that runner is treated as no device.
 */

import type { StageModel } from './model-plugin.js';

/** What a target stage on a CUDA GPU lends (its `cudaDevice()`). */
export interface LentCudaDevice<A> {
  /** The loaded CUDA addon (the stage's own; structural: the plugin never imports it). */
  readonly addon: A;
  /** The target's token embedding as bf16 bits, `[vocabSize, hiddenSize]`. */
  readonly embedding: Uint16Array;
}

/**
 * The CUDA device of `target` when it runs on one and its addon has the function `entry` (a runner's create
 * function, e.g. `'dflashCreate'`); undefined otherwise (a CPU stage, or an addon built before that runner).
 */
export function lentCudaDevice<A>(target: StageModel, entry: string): LentCudaDevice<A> | undefined {
  const t = target as StageModel & { cudaDevice?: () => LentCudaDevice<Record<string, unknown>> };
  if (typeof t.cudaDevice !== 'function') return undefined;
  const device = t.cudaDevice();
  return typeof device?.addon?.[entry] === 'function' && device.embedding instanceof Uint16Array
    ? (device as unknown as LentCudaDevice<A>)
    : undefined;
}
