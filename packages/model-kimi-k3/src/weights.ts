/**
 * Reading Kimi weights: core's {@link WeightReader} (bf16 matrices packed for `gemmBf16`, norms and
 * fp32 parameters as f32, BF16 or F32 accepted) throwing {@link KimiWeightError}.
 */

import { WeightReader, type CheckpointSanity, type SafetensorsCheckpoint } from '@specd/core';

/** Thrown for a missing tensor or one with a wrong shape / dtype; names the tensor. */
export class KimiWeightError extends Error {
  override readonly name = 'KimiWeightError';
}

export { WeightReader };

/**
 * A reader over `ckpt` that counts `total` tensors for progress, throws {@link KimiWeightError} and reports
 * non-finite values through `sanity` (absent: refused).
 */
export function kimiWeightReader(
  ckpt: SafetensorsCheckpoint,
  total: number,
  onTensor?: (done: number, total: number, name: string) => void,
  sanity?: CheckpointSanity,
): WeightReader {
  return new WeightReader(ckpt, {
    total,
    onTensor,
    makeError: (m) => new KimiWeightError(m),
    ...(sanity === undefined ? {} : { sanity }),
  });
}
