#!/usr/bin/env node
/**
 * `npm run nixl:fetch`: fetches the NIXL C API library (libnixl_capi.so), its UCX plugin and the libraries they
 * need into `.cache/nixl/nixl-cu12-1.5.1/` (git-ignored; never committed), for the NIXL transfer engine
 * (packages/core/src/pd/nixl-transfer.ts, which dlopen()s it through native/src/nixl.cc).
 *
 * Source: the PyPI wheel `nixl-cu12==1.5.1`, CPython 3.11 manylinux_2_28 x86_64 build (68.6 MB). The C libraries
 * in it do not depend on Python, so one wheel (one sha256) serves every host: pip is asked for that exact build
 * (`--only-binary :all: --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp --abi cp311`)
 * whatever the local Python is.
 *
 * What the wheel holds (`unzip -l`), and what is kept:
 * - `.nixl_cu12.mesonpy.libs/`: libnixl.so, libnixl_capi.so (the C API), libnixl_build/common/serdes/stream.so and
 *   `plugins/` (libplugin_UCX.so, POSIX, GDS, …): kept. RPATH `$ORIGIN/.:$ORIGIN/../nixl_cu12.libs`.
 * - `nixl_cu12.libs/`: the bundled (auditwheel) libraries: UCX (libucp/libucs/libuct/libucm + `ucx/` transport
 *   modules), grpc, etcd client, absl, protobuf, aws/azure SDKs, libibverbs/mlx5, libnuma, …: kept.
 * - `nixl_cu12/` (Python bindings), `nixl_ep_cu12/` (3 × 36 MB torch extensions), scripts, asio headers: skipped.
 * No CUDA library is linked by the core or the UCX plugin (CUDA is only loaded by UCX's cuda modules when present).
 *
 * Steps: the wheel: `--wheel FILE` / SPECD_NIXL_WHEEL, else the cached `.cache/nixl/<wheel>`, else pip download
 * (kept there afterwards) → check the sha256 → extract the two library folders into a temp folder next to the
 * destination (Python's zipfile) → rename into place (atomic) → write `.complete` (the wheel's sha256).
 * Cached: a complete destination prints "ok, cached" and does nothing (`--force` re-extracts from the cached wheel).
 * Exit status: 0 on success, 1 on any failure (the message says what failed and what to do).
 */

import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const PACKAGE = 'nixl-cu12';
const VERSION = '1.5.1';
const WHEEL_NAME = 'nixl_cu12-1.5.1-cp311-cp311-manylinux_2_28_x86_64.whl';
/** sha256 of the wheel as served by PyPI (68_631_568 bytes). */
const WHEEL_SHA256 = '341d0dfa499f941c054614252f1d8047d1380e33f29c87707372ff5ec7d3779a';
const KEEP = ['.nixl_cu12.mesonpy.libs/', 'nixl_cu12.libs/'];
/** The files the engine needs, checked after extraction. */
const REQUIRED = ['.nixl_cu12.mesonpy.libs/libnixl_capi.so', '.nixl_cu12.mesonpy.libs/plugins/libplugin_UCX.so'];

class FetchError extends Error {}

function fail(what, todo) {
  throw new FetchError(`nixl:fetch: ${what}\n  → ${todo}`);
}

function parseArgs(argv) {
  const usage = 'usage: npm run nixl:fetch -- [--wheel FILE] [--dest DIR] [--force]   (env SPECD_NIXL_WHEEL=FILE)';
  const opts = {
    wheel: process.env.SPECD_NIXL_WHEEL ? path.resolve(process.env.SPECD_NIXL_WHEEL) : undefined,
    dest: path.join(REPO_ROOT, '.cache', 'nixl', `${PACKAGE}-${VERSION}`),
    force: false,
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--wheel' || a === '--dest') {
      const v = argv[++i];
      if (v === undefined) fail(`${a} needs a value`, usage);
      opts[a.slice(2)] = path.resolve(v);
    } else if (a === '--force') opts.force = true;
    else if (a === '--help' || a === '-h') {
      console.log(usage);
      process.exit(0);
    } else fail(`unknown argument ${JSON.stringify(a)}`, usage);
  }
  return opts;
}

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

function python() {
  for (const exe of ['python3', 'python']) {
    const r = spawnSync(exe, ['-m', 'pip', '--version'], { encoding: 'utf8' });
    if (r.error === undefined && r.status === 0) return exe;
  }
  fail('python3 with pip is not available (needed to download and unzip the wheel)', 'install python3-pip');
}

function run(py, args, what, todo) {
  const r = spawnSync(py, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  if (r.error !== undefined || r.status !== 0) {
    const said = (r.stderr || r.stdout || String(r.error ?? '')).trim().split('\n').slice(-6);
    fail(`${what} failed (exit ${r.status ?? r.error?.message}):\n    ${said.join('\n    ')}`, todo);
  }
}

function main() {
  const opts = parseArgs(process.argv.slice(2));
  if (process.platform !== 'linux' || process.arch !== 'x64')
    fail(`NIXL's wheel is built for linux x64, this is ${process.platform} ${process.arch}`, 'use pd.transfer "zmq"');
  const stamp = path.join(opts.dest, '.complete');
  if (!opts.force && fs.existsSync(stamp) && fs.readFileSync(stamp, 'utf8').trim() === WHEEL_SHA256) {
    console.log(`nixl:fetch: ok, cached (${path.relative(REPO_ROOT, opts.dest)}, ${PACKAGE}==${VERSION})`);
    return;
  }
  const py = python();
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-nixl-'));
  try {
    let wheel = opts.wheel;
    const cachedWheel = path.join(path.dirname(opts.dest), WHEEL_NAME);
    if (wheel === undefined && fs.existsSync(cachedWheel) && sha256File(cachedWheel) === WHEEL_SHA256) {
      console.log(`nixl:fetch: using the cached ${path.relative(REPO_ROOT, cachedWheel)}`);
      wheel = cachedWheel;
    }
    if (wheel === undefined) {
      console.log(`nixl:fetch: downloading ${PACKAGE}==${VERSION} (${WHEEL_NAME}, ~69 MB) from PyPI …`);
      run(
        py,
        [
          '-m',
          'pip',
          'download',
          '--no-deps',
          '--no-cache-dir',
          '--disable-pip-version-check',
          '--only-binary',
          ':all:',
          '--platform',
          'manylinux_2_28_x86_64',
          '--python-version',
          '3.11',
          '--implementation',
          'cp',
          '--abi',
          'cp311',
          `${PACKAGE}==${VERSION}`,
          '-d',
          tmp,
        ],
        `pip download ${PACKAGE}==${VERSION}`,
        'check network access to pypi.org (proxy: HTTPS_PROXY / PIP_INDEX_URL), or pass --wheel FILE',
      );
      wheel = path.join(tmp, WHEEL_NAME);
      if (fs.existsSync(wheel) && sha256File(wheel) === WHEEL_SHA256) {
        fs.mkdirSync(path.dirname(cachedWheel), { recursive: true });
        fs.copyFileSync(wheel, `${cachedWheel}.part`);
        fs.renameSync(`${cachedWheel}.part`, cachedWheel);
      }
    }
    if (!fs.existsSync(wheel)) fail(`${wheel} does not exist`, 'pass --wheel FILE naming the downloaded wheel');
    const got = sha256File(wheel);
    if (got !== WHEEL_SHA256)
      fail(`${wheel} has sha256 ${got}, expected ${WHEEL_SHA256}`, 'delete it and run again (a damaged download?)');
    fs.mkdirSync(path.dirname(opts.dest), { recursive: true });
    const part = `${opts.dest}.part-${process.pid}`;
    fs.rmSync(part, { recursive: true, force: true });
    const script = [
      'import sys, zipfile',
      'z = zipfile.ZipFile(sys.argv[1])',
      'keep = tuple(sys.argv[3:])',
      'z.extractall(sys.argv[2], [m for m in z.namelist() if m.startswith(keep)])',
    ].join('\n');
    run(py, ['-c', script, wheel, part, ...KEEP], `extracting ${WHEEL_NAME}`, 'check the disk space and run again');
    for (const f of REQUIRED)
      if (!fs.existsSync(path.join(part, f))) fail(`the wheel lacks ${f}`, `report this (${PACKAGE}==${VERSION})`);
    fs.rmSync(opts.dest, { recursive: true, force: true });
    fs.renameSync(part, opts.dest);
    fs.writeFileSync(stamp, `${WHEEL_SHA256}\n`);
    console.log(`nixl:fetch: ok, ${PACKAGE}==${VERSION} unpacked into ${path.relative(REPO_ROOT, opts.dest)}`);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

try {
  main();
} catch (e) {
  if (!(e instanceof FetchError)) throw e;
  console.error(e.message);
  process.exit(1);
}
