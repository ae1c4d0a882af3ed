#!/usr/bin/env node
// Fails when a tracked source line is longer than 120 columns (`npm run lint:lines`, part of `npm run lint`).
//
// Checks every file `git ls-files` lists with a .ts/.mts/.cts/.js/.mjs/.cjs/.cc/.h extension, except generated or
// vendored data (EXCLUDED below). A column is one Unicode code point (the sources hold no tabs). Files named in
// scripts/line-length-allowlist.txt (one repository path per line, `#` starts a comment) are skipped; an entry
// whose file has no long line left, or is no longer tracked, is printed as a warning so that it gets deleted.
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
const allowlistPath = join(root, 'scripts', 'line-length-allowlist.txt');

const tracked = execFileSync('git', ['ls-files', '-z'], { cwd: root, encoding: 'utf8', maxBuffer: 64 << 20 })
  .split('\0')
  .filter((path) => EXTENSIONS.test(path) && !EXCLUDED.some((re) => re.test(path)));

const allowlist = new Set(
  existsSync(allowlistPath)
    ? readFileSync(allowlistPath, 'utf8')
        .split('\n')
        .map((line) => line.replace(/#.*/, '').trim())
        .filter((line) => line.length > 0)
    : [],
);

const problems = [];
const stale = [];
let longInAllowed = 0;
const trackedSet = new Set(tracked);
for (const path of tracked) {
  if (!existsSync(join(root, path))) continue; // deleted in the work tree, not yet committed
  const lines = readFileSync(join(root, path), 'utf8').split('\n');
  let longLines = 0;
  lines.forEach((line, index) => {
    const columns = [...line.replace(/\r$/, '')].length;
    if (columns <= MAX_COLUMNS) return;
    longLines++;
    if (!allowlist.has(path)) problems.push(`${path}:${index + 1}: ${columns} columns`);
  });
  if (allowlist.has(path)) {
    if (longLines === 0) stale.push(`${path}: listed in scripts/line-length-allowlist.txt but has no long line`);
    longInAllowed += longLines;
  }
}
for (const path of allowlist) {
  if (!trackedSet.has(path)) stale.push(`${path}: listed in scripts/line-length-allowlist.txt but not tracked`);
}

for (const entry of stale) console.warn(`warning: ${entry}: delete the entry`);
if (problems.length > 0) {
  for (const problem of problems) console.error(problem);
  console.error(`${problems.length} problem(s): lines must be at most ${MAX_COLUMNS} columns`);
  process.exit(1);
}
const allowed = allowlist.size > 0 ? `; ${longInAllowed} long lines in ${allowlist.size} allowlisted files` : '';
console.log(`line length: ${tracked.length} files within ${MAX_COLUMNS} columns${allowed}`);
