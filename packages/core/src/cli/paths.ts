/** Locating the repository's shipped models from the installed CLI. */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The default target, relative to the repository root. */
export const DEFAULT_MODEL_RELATIVE = 'models/kimi-k3-tiny';

/**
 * The default model directory: `models/kimi-k3-tiny` in the first ancestor of this module (the
 * repository holding packages/core) or of the working directory that has it; else the path
 * relative to the working directory (so the error names where it looked).
 */
export function defaultModelDir(cwd: string = process.cwd()): string {
  const here = path.dirname(fileURLToPath(import.meta.url));
  for (const start of [here, cwd]) {
    let dir = start;
    for (;;) {
      const candidate = path.join(dir, DEFAULT_MODEL_RELATIVE);
      if (fs.existsSync(path.join(candidate, 'config.json'))) return candidate;
      const up = path.dirname(dir);
      if (up === dir) break;
      dir = up;
    }
  }
  return path.resolve(cwd, DEFAULT_MODEL_RELATIVE);
}
