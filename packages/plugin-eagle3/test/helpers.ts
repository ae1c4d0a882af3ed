/** Shared helpers for the EAGLE-3 tests: paths and loading the shipped target + drafter. */
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { HfConfig, SafetensorsCheckpoint, type StageModel } from '@specd/core';
import { loadKimiFromDir } from '@specd/model-kimi-k3';

import { eagle3Plugin, type Eagle3Drafter } from '../src/index.js';

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export const TARGET_DIR = path.join(REPO_ROOT, 'models/kimi-k3-tiny');
export const EAGLE3_DIR = path.join(REPO_ROOT, 'models/kimi-k3-tiny-eagle3');
export const GOLDENS_DIR = path.join(REPO_ROOT, 'test/goldens');

/** The shipped target, whole model. */
export function loadTarget(): StageModel {
  return loadKimiFromDir(TARGET_DIR);
}

/** Options of {@link loadDrafter}. */
export interface LoadDrafterOptions {
  /** config.json fields to override (shallow). */
  config?: Record<string, unknown>;
  /** The deployment config's drafter branch. */
  settings?: Record<string, unknown>;
  /** Checkpoint directory (default the shipped one). */
  dir?: string;
  /** Wraps the opened checkpoint (e.g. to hide a tensor). */
  wrapWeights?: (w: SafetensorsCheckpoint) => SafetensorsCheckpoint;
  maxSequences?: number;
  maxTokensPerSequence?: number;
}

/** The EAGLE-3 drafter bound to `target`. */
export async function loadDrafter(target: StageModel, o: LoadDrafterOptions = {}): Promise<Eagle3Drafter> {
  const dir = o.dir ?? EAGLE3_DIR;
  const weights = SafetensorsCheckpoint.open(dir);
  try {
    const base = HfConfig.read(dir).raw as Record<string, unknown>;
    const config = HfConfig.fromObject({ ...base, ...o.config }, path.join(dir, 'config.json'));
    return (await eagle3Plugin.load(
      { dir, config, weights: o.wrapWeights ? o.wrapWeights(weights) : weights },
      {
        target,
        maxSequences: o.maxSequences ?? 4,
        maxTokensPerSequence: o.maxTokensPerSequence ?? 1024,
        ...(o.settings ? { settings: o.settings } : {}),
      },
    )) as Eagle3Drafter;
  } finally {
    weights.close();
  }
}
