/** Shared helpers for the DFlash tests: paths and loading the shipped target + drafter. */
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { HfConfig, SafetensorsCheckpoint, type StageModel } from '@specd/core';
import { loadKimiFromDir } from '@specd/model-kimi-k3';

import { dflashPlugin, type DFlashDrafter } from '../src/index.js';

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export const TARGET_DIR = path.join(REPO_ROOT, 'models/kimi-k3-tiny');
export const DFLASH_DIR = path.join(REPO_ROOT, 'models/kimi-k3-tiny-dflash');
export const GOLDENS_DIR = path.join(REPO_ROOT, 'test/goldens');

/** The shipped target, whole model. */
export function loadTarget(): StageModel {
  return loadKimiFromDir(TARGET_DIR);
}

/**
 * The shipped DFlash drafter bound to `target`; `config` overrides config.json fields, `settings` is the deployment
 * config's drafter branch.
 */
export async function loadDrafter(
  target: StageModel,
  config: Record<string, unknown> = {},
  maxSequences = 4,
  maxTokensPerSequence = 1024,
  settings?: Record<string, unknown>,
): Promise<DFlashDrafter> {
  const weights = SafetensorsCheckpoint.open(DFLASH_DIR);
  try {
    const base = HfConfig.read(DFLASH_DIR).raw as Record<string, unknown>;
    const merged = HfConfig.fromObject({ ...base, ...config }, path.join(DFLASH_DIR, 'config.json'));
    return (await dflashPlugin.load(
      { dir: DFLASH_DIR, config: merged, weights },
      { target, maxSequences, maxTokensPerSequence, ...(settings === undefined ? {} : { settings }) },
    )) as DFlashDrafter;
  } finally {
    weights.close();
  }
}

/** max |a − b| / max |b|. */
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
