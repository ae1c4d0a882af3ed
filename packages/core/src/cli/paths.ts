/** Locating the repository's shipped models from the installed CLI. */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The default target, relative to the repository root. */
export const DEFAULT_MODEL_RELATIVE = 'models/kimi-k3-tiny';
/** The default drafter of the default target (DFlash), relative to the repository root. */
export const DEFAULT_DRAFTER_RELATIVE = 'models/kimi-k3-tiny-dflash';

/**
 * The default config of `specd serve` (no --config, no --model), relative to the repository root: SmolLM2-135M-
 * Instruct (`npm run models:fetch`) with the drafter bench:peer measured fastest on CPU (docs/BENCHMARKS.md).
 */
export const DEFAULT_SERVE_CONFIG_RELATIVE = 'configs/default.json';

/**
 * The default model directory: `models/kimi-k3-tiny` in the first ancestor of this module (the
 * repository holding packages/core) or of the working directory that has it; else the path
 * relative to the working directory (so the error names where it looked).
 */
export function defaultModelDir(cwd: string = process.cwd()): string {
  return findShipped(DEFAULT_MODEL_RELATIVE, cwd);
}

/** The default drafter directory (`models/kimi-k3-tiny-dflash`), located like {@link defaultModelDir}. */
export function defaultDrafterDir(cwd: string = process.cwd()): string {
  return findShipped(DEFAULT_DRAFTER_RELATIVE, cwd);
}

/** `configs/default.json` of the repository, located like {@link defaultModelDir} (the file itself must exist). */
export function defaultServeConfig(cwd: string = process.cwd()): string {
  return findShipped(DEFAULT_SERVE_CONFIG_RELATIVE, cwd, '');
}

/** `relative` under the first ancestor of this module, else of `cwd`, that holds `relative/marker`. */
function findShipped(relative: string, cwd: string, marker = 'config.json'): string {
  const here = path.dirname(fileURLToPath(import.meta.url));
  for (const start of [here, cwd]) {
    let dir = start;
    for (;;) {
      const candidate = path.join(dir, relative);
      if (fs.existsSync(path.join(candidate, marker))) return candidate;
      const up = path.dirname(dir);
      if (up === dir) break;
      dir = up;
    }
  }
  return path.resolve(cwd, relative);
}
