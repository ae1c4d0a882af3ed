/** Shared helpers for the DSpark tests: paths and loading the shipped target + drafter. */
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { HfConfig, SafetensorsCheckpoint, type StageModel } from '@specd/core';
import { loadKimiFromDir } from '@specd/model-kimi-k3';

import { dsparkPlugin, type DSparkDrafter } from '../src/index.js';

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export const TARGET_DIR = path.join(REPO_ROOT, 'models/kimi-k3-tiny');
export const DSPARK_DIR = path.join(REPO_ROOT, 'models/kimi-k3-tiny-dspark');
export const GOLDENS_DIR = path.join(REPO_ROOT, 'test/goldens');

/** The shipped target, whole model. */
export function loadTarget(): StageModel {
  return loadKimiFromDir(TARGET_DIR);
}

/** The shipped DSpark drafter bound to `target`; `settings`: the deployment config's drafter branch. */
export async function loadDrafter(
  target: StageModel,
  maxSequences = 4,
  maxTokensPerSequence = 1024,
  settings?: Record<string, unknown>,
): Promise<DSparkDrafter> {
  const weights = SafetensorsCheckpoint.open(DSPARK_DIR);
  try {
    return (await dsparkPlugin.load(
      { dir: DSPARK_DIR, config: HfConfig.read(DSPARK_DIR), weights },
      { target, maxSequences, maxTokensPerSequence, ...(settings === undefined ? {} : { settings }) },
    )) as DSparkDrafter;
  } finally {
    weights.close();
  }
}
