#!/usr/bin/env node
// Installs llama.cpp built for this machine, for bench:peer only: llama-cpp-python (pinned below) from
// PyPI into a venv in the git-ignored .cache/peer/llama-cpp-python/ (or $SPECD_LLAMA_CPP_PYTHON_DIR),
// compiled from its source distribution (`--no-binary llama-cpp-python`) with CMAKE_ARGS (BUILD_FLAGS
// below): GGML_NATIVE=ON gives its bundled llama.cpp -march=native (AVX512-VNNI/BF16, AMX where the CPU has
// them); LLAVA_BUILD=OFF skips the multimodal library the bench never loads; scripts/llama-cpp-amx-fix.h is
// forced into every file, since with GCC 12 llama.cpp's AMX kernels fault (SIGILL) without it (the header
// says why; it does nothing without AMX or with another compiler). The build takes 10–40 minutes on 2 shared
// cores (2 parallel jobs, niced); a later call finds the pinned version built with the same flags (build.json)
// and does nothing. `npm test` never calls this; bench/peer.mjs does (alone: `npm run bench:peer:install`).
// Needs python3 (with venv), a C/C++ compiler and cmake (pip brings cmake if absent).
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The pinned version: bench:peer's figures name it. */
export const LLAMA_CPP_PYTHON_VERSION = '0.3.36';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
/** The venv's folder (under the git-ignored .cache/ unless SPECD_LLAMA_CPP_PYTHON_DIR names another). */
export const LLAMA_CPP_PYTHON_DIR =
  process.env.SPECD_LLAMA_CPP_PYTHON_DIR ?? path.join(ROOT, '.cache/peer/llama-cpp-python');
/** The header forced into llama.cpp's build (GCC 12's AMX tile-configuration bug). */
const AMX_FIX = path.join(ROOT, 'scripts/llama-cpp-amx-fix.h');
/**
 * The build's environment: CMAKE_ARGS, and CFLAGS/CXXFLAGS (CMake's initial C/C++ flags) forcing the AMX fix
 * in. build.json records them; a build made with others is rebuilt.
 */
export const BUILD_ENV = {
  CMAKE_ARGS: '-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF',
  CFLAGS: `-include ${AMX_FIX}`,
  CXXFLAGS: `-include ${AMX_FIX}`,
};
const buildId = () => ({
  version: LLAMA_CPP_PYTHON_VERSION,
  env: BUILD_ENV,
  amxFixBytes: fs.readFileSync(AMX_FIX, 'utf8').length,
});

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
  const marker = path.join(LLAMA_CPP_PYTHON_DIR, 'build.json');
  const want = JSON.stringify(buildId());
  const built = fs.existsSync(marker) ? fs.readFileSync(marker, 'utf8').trim() : undefined;
  if (built === want && installedVersion(python) === LLAMA_CPP_PYTHON_VERSION)
    return { python, version: LLAMA_CPP_PYTHON_VERSION };
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
    if (installedVersion(python) !== undefined)
      // built before with other flags
      execFileSync(python, ['-m', 'pip', 'uninstall', '-y', 'llama-cpp-python'], { stdio: ['ignore', fd, fd] });
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
        env: { ...process.env, ...BUILD_ENV, CMAKE_BUILD_PARALLEL_LEVEL: '2' },
      },
    );
  } catch (e) {
    throw new Error(`install-llama-cpp-python: pip install failed (${e.message}); see ${logFile}`);
  } finally {
    fs.closeSync(fd);
  }
  const version = installedVersion(python);
  if (version === LLAMA_CPP_PYTHON_VERSION) fs.writeFileSync(marker, `${want}\n`);
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
