/** Shared helpers for the Kimi model tests: paths, model loading, comparisons. */
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { HfConfig, SafetensorsCheckpoint, SequenceCache } from '@specd/core';

import { loadKimiStage, type KimiKernelChoice, type KimiStageModel } from '../src/index.js';

/** Kernel sets every model test runs with. */
export const KERNELS: readonly KimiKernelChoice[] = ['native', 'ts'];

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export const TINY_DIR = path.join(REPO_ROOT, 'models/kimi-k3-tiny');
export const GOLDENS_DIR = path.join(REPO_ROOT, 'test/goldens');

/** Loads a stage of a checkpoint directory. */
export function loadStage(
  dir: string,
  kernels: KimiKernelChoice,
  layerStart?: number,
  layerEnd?: number,
): KimiStageModel {
  const weights = SafetensorsCheckpoint.open(dir);
  try {
    return loadKimiStage({ dir, config: HfConfig.read(dir), weights }, { layerStart, layerEnd, kernels });
  } finally {
    weights.close();
  }
}

/** A cache for a stage with room for `numSlots` sequences of `maxTokens`. */
export function cacheFor(stage: KimiStageModel, numSlots = 4, maxTokens = 1024, pageSize = 16): SequenceCache {
  return new SequenceCache(stage.cacheGeometry, {
    pageSize,
    numPages: numSlots * Math.ceil(maxTokens / pageSize),
    numSlots,
  });
}

/** max |a − b| / max |b| (relative to the reference's largest magnitude). */
export function relError(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`relError: lengths differ (${a.length} vs ${b.length})`);
  let num = 0;
  let den = 0;
  for (let i = 0; i < a.length; i++) {
    num = Math.max(num, Math.abs(a[i]! - b[i]!));
    den = Math.max(den, Math.abs(b[i]!));
  }
  return den === 0 ? num : num / den;
}

/** True if two f32 arrays are bitwise identical. */
export function bitwiseEqual(a: Float32Array, b: Float32Array): boolean {
  if (a.length !== b.length) return false;
  const x = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const y = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return false;
  return true;
}

/** Row-wise argmax of `[rows, vocab]`. */
export function argmaxRows(x: Float32Array, vocab: number): number[] {
  const out: number[] = [];
  for (let r = 0; r < x.length / vocab; r++) {
    let best = 0;
    for (let i = 1; i < vocab; i++) if (x[r * vocab + i]! > x[r * vocab + best]!) best = i;
    out.push(best);
  }
  return out;
}
