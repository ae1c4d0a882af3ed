// Suites that need model or data files outside the source: `describe.skipIf(skipWithoutFiles(...))`.
// Every workspace imports it by relative path (e.g. `../../../test/require-files.js` from packages/x/test/).
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** True under CI (`CI` set, and not '', 'false' or '0'), where a missing model file is an error, not a skip. */
export function isCi(): boolean {
  const ci = process.env.CI;
  return ci !== undefined && ci !== '' && ci !== 'false' && ci !== '0';
}

/**
 * Whether a suite must skip because some of `files` (absolute paths) are absent. All present: false (run it).
 * Some absent outside CI: prints one loud warning naming the suite, the missing paths (relative to the repository)
 * and the command that brings them (`fetch`, default `npm run models:fetch`), and returns true (skip it).
 * Throws an Error with the same message under CI ({@link isCi}), so a test file whose files are missing fails
 * instead of skipping silently.
 */
export function skipWithoutFiles(suite: string, files: readonly string[], fetch = 'npm run models:fetch'): boolean {
  const missing = files.filter((file) => !fs.existsSync(file)).map((file) => path.relative(ROOT, file));
  if (missing.length === 0) return false;
  const verb = missing.length === 1 ? 'is' : 'are';
  const message = `"${suite}" needs ${missing.join(', ')}, which ${verb} missing; run \`${fetch}\``;
  if (isCi()) throw new Error(`${message} (CI: a missing file fails the suite instead of skipping it)`);
  console.warn(`\n!!! SKIPPED ${message}\n`);
  return true;
}

/**
 * `value`, read from a reference file that is present; a present file that lacks the entry is a defect of the
 * repository, never a reason to skip: throws an Error naming the file (relative to the repository) and `what`.
 */
export function requireEntry<T>(value: T | undefined, file: string, what: string): T {
  if (value === undefined) throw new Error(`${path.relative(ROOT, file)} has no ${what}`);
  return value;
}
