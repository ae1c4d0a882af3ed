#!/usr/bin/env node
// Fails when a tracked source line is longer than 120 columns (`npm run lint:lines`, part of `npm run lint`).
//
// Checks every file `git ls-files` lists with a .ts/.mts/.cts/.js/.mjs/.cjs/.cc/.h extension, except generated or
// vendored data (EXCLUDED below). A column is one Unicode code point (the sources hold no tabs). Biome and
// clang-format wrap code at 120 columns but leave comments and string literals alone: this check covers those.
// Prints `path:line: N columns` for each long line and exits 1; prints one summary line and exits 0 when clean.
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const MAX_COLUMNS = 120;
const EXTENSIONS = /\.(ts|mts|cts|js|mjs|cjs|cc|h)$/;
/** Generated or vendored paths: build outputs, fetched models, golden dumps and test fixtures. */
const EXCLUDED = [/(^|\/)dist\//, /(^|\/)build\//, /^models\//, /^test\/goldens/, /^test\/fixtures\//];

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const tracked = execFileSync('git', ['ls-files', '-z'], { cwd: root, encoding: 'utf8', maxBuffer: 64 << 20 })
  .split('\0')
  .filter((path) => EXTENSIONS.test(path) && !EXCLUDED.some((re) => re.test(path)));

const problems = [];
for (const path of tracked) {
  if (!existsSync(join(root, path))) continue; // deleted in the work tree, not yet committed
  const lines = readFileSync(join(root, path), 'utf8').split('\n');
  lines.forEach((line, index) => {
    const columns = [...line.replace(/\r$/, '')].length;
    if (columns > MAX_COLUMNS) problems.push(`${path}:${index + 1}: ${columns} columns`);
  });
}

if (problems.length > 0) {
  for (const problem of problems) console.error(problem);
  console.error(`${problems.length} problem(s): lines must be at most ${MAX_COLUMNS} columns`);
  process.exit(1);
}
console.log(`line length: ${tracked.length} files within ${MAX_COLUMNS} columns`);
