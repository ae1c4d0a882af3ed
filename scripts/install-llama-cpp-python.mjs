#!/usr/bin/env node
// Installs llama.cpp built for this machine, for bench:peer only: llama-cpp-python (pinned below) from
// PyPI into a venv in the git-ignored .cache/peer/llama-cpp-python/, compiled from its source
// distribution (`--no-binary llama-cpp-python`) with CMAKE_ARGS="-DGGML_NATIVE=ON": its bundled
// llama.cpp gets -march=native (AVX512-VNNI/BF16, AMX where the CPU has them). The build takes minutes
// (2 parallel jobs, niced); a later call with the pinned version installed does nothing. `npm test`
// never calls this; bench/peer.mjs does (or run it alone: `node scripts/install-llama-cpp-python.mjs`).
// Needs python3 (with venv), a C++ compiler and cmake (pip brings cmake if absent).
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The pinned version: bench:peer's figures name it. */
export const LLAMA_CPP_PYTHON_VERSION = '0.3.36';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
/** The venv's folder (under the git-ignored .cache/). */
export const LLAMA_CPP_PYTHON_DIR = path.join(ROOT, '.cache/peer/llama-cpp-python');

/** Version of llama_cpp importable by the venv's python, or undefined (not installed / broken). */
function installedVersion(python) {
  if (!fs.existsSync(python)) return undefined;
  try {
    return execFileSync(python, ['-c', 'import llama_cpp; print(llama_cpp.__version__)'], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }).trim();
  } catch {
    return undefined;
  }
}

/**
 * Makes sure the venv holds llama-cpp-python {@link LLAMA_CPP_PYTHON_VERSION}, building it when absent.
 * @param log progress lines (default console.log).
 * @returns `{ python, version }`: the venv's python executable and the installed version.
 * @throws Error naming the step (venv, pip install) and the log file when a step fails or the version
 *   installed is not the pinned one.
 */
export function ensureLlamaCppPython(log = console.log) {
  const venv = path.join(LLAMA_CPP_PYTHON_DIR, 'venv');
  const python = path.join(venv, 'bin/python');
  if (installedVersion(python) === LLAMA_CPP_PYTHON_VERSION) return { python, version: LLAMA_CPP_PYTHON_VERSION };
  fs.mkdirSync(LLAMA_CPP_PYTHON_DIR, { recursive: true });
  const logFile = path.join(LLAMA_CPP_PYTHON_DIR, 'build.log');
  if (!fs.existsSync(python)) {
    log(`install-llama-cpp-python: creating the venv ${path.relative(ROOT, venv)}/`);
    try {
      execFileSync('python3', ['-m', 'venv', venv], { stdio: 'inherit' });
    } catch (e) {
      throw new Error(`install-llama-cpp-python: \`python3 -m venv ${venv}\` failed: ${e.message}`);
    }
  }
  log(
    `install-llama-cpp-python: building llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION} with native CPU flags ` +
      `(several minutes on 2 cores; log: ${path.relative(ROOT, logFile)})…`,
  );
  const fd = fs.openSync(logFile, 'w');
  try {
    execFileSync(
      'nice',
      [
        '-n',
        '10',
        python,
        '-m',
        'pip',
        'install',
        '--no-cache-dir',
        '--no-binary',
        'llama-cpp-python',
        `llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}`,
      ],
      {
        stdio: ['ignore', fd, fd],
        env: { ...process.env, CMAKE_ARGS: '-DGGML_NATIVE=ON', CMAKE_BUILD_PARALLEL_LEVEL: '2' },
      },
    );
  } catch (e) {
    throw new Error(`install-llama-cpp-python: pip install failed (${e.message}); see ${logFile}`);
  } finally {
    fs.closeSync(fd);
  }
  const version = installedVersion(python);
  if (version !== LLAMA_CPP_PYTHON_VERSION)
    throw new Error(
      `install-llama-cpp-python: expected llama_cpp ${LLAMA_CPP_PYTHON_VERSION} in ${venv}, found ${version ?? 'none'}`,
    );
  return { python, version };
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const { python, version } = ensureLlamaCppPython();
  console.log(`llama-cpp-python ${version}: ${python}`);
}
