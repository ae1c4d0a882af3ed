/**
 * Where the NIXL library lives and how it is loaded: `npm run nixl:fetch` unpacks the PyPI wheel nixl-cu12==1.5.1
 * into `<repo>/.cache/nixl/nixl-cu12-1.5.1/` (or set `SPECD_NIXL_DIR` to such a folder). Loading sets
 * `NIXL_PLUGIN_DIR` to the wheel's plugin folder (unless already set) before the first agent exists; the
 * libraries' RPATH ($ORIGIN/../nixl_cu12.libs) finds the bundled UCX, grpc, etc., and UCX finds its transport
 * modules next to libucs (nixl_cu12.libs/ucx), so no LD_LIBRARY_PATH is needed.
 *
 * On a host without RDMA devices (no /sys/class/infiniband entries) loading also sets `UCX_MODULES=^ib,rdmacm,cuda`
 * unless `UCX_MODULES` is set: those UCX modules have nothing to drive there, and the InfiniBand one pulls in the
 * wheel's libnl-route, whose destructor (rtnl_tc_unregister) crashes the process at exit (SIGSEGV in _dl_fini,
 * seen with gdb, whether or not the agent was destroyed). With them left out UCX uses CMA / shared memory / TCP.
 *
 * On such a host loading also turns UCX's memory hooks off, each variable unless set: `UCX_MEM_MALLOC_HOOKS=no`,
 * `UCX_MEM_MMAP_HOOK_MODE=none`, `UCX_MEM_EVENTS=no`. Otherwise libucm replaces malloc and patches mmap/munmap in
 * the live process (its registration cache for RDMA needs those events; CMA, shared memory and TCP do not), beside
 * the threads of V8 and the compute pool; about one NIXL process in 60 then died of SIGSEGV on a corrupted heap: at
 * start (in malloc), mid-request (likely CI's prefill instance at pp 2 gone between two requests), or in V8's heap
 * teardown at exit (gdb on the core: `MemoryAllocator::RecordNormalPageDestroyed` following a corrupt pointer).
 * `npm run bench:nixl-starts` counts such deaths over repeated starts and stops (`--ucx-hooks` keeps UCX's
 * defaults); on 2 vCPUs, 4 processes at a time: 8 of 600 died with the hooks, 0 of 960 without (docs/BENCHMARKS.md).
 */

import { existsSync, readdirSync } from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { nixlLoad, type NixlApi } from '@specd/native';

/** The wheel's folder of NIXL's own libraries (libnixl_capi.so, plugins/). */
const LIB_FOLDER = '.nixl_cu12.mesonpy.libs';

/** The unpacked wheel: `SPECD_NIXL_DIR`, else `<repo>/.cache/nixl/nixl-cu12-1.5.1`. */
export function nixlDir(): string {
  const env = process.env.SPECD_NIXL_DIR;
  if (env !== undefined && env !== '') return path.resolve(env);
  // packages/core/dist/pd/nixl-library.js → the repository root is four folders up
  const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..', '..');
  return path.join(root, '.cache', 'nixl', 'nixl-cu12-1.5.1');
}

/** Paths of the C API library and the plugin folder inside {@link nixlDir}. */
export function nixlPaths(dir = nixlDir()): { capi: string; plugins: string } {
  return { capi: path.join(dir, LIB_FOLDER, 'libnixl_capi.so'), plugins: path.join(dir, LIB_FOLDER, 'plugins') };
}

/** Whether the NIXL library has been fetched (tests and benches use it to say why they cannot run). */
export function nixlAvailable(dir = nixlDir()): boolean {
  return existsSync(nixlPaths(dir).capi);
}

/** Whether the host has an RDMA device (an entry in /sys/class/infiniband). */
function hasRdmaDevice(): boolean {
  try {
    return readdirSync('/sys/class/infiniband').length > 0;
  } catch {
    return false;
  }
}

/** UCX settings on a host without RDMA devices (module comment), each applied only where the variable is unset. */
const NO_RDMA_UCX_ENV: Readonly<Record<string, string>> = {
  UCX_MODULES: '^ib,rdmacm,cuda',
  UCX_MEM_MALLOC_HOOKS: 'no',
  UCX_MEM_MMAP_HOOK_MODE: 'none',
  UCX_MEM_EVENTS: 'no',
};

let loaded: NixlApi | undefined;

/**
 * Loads the NIXL C API once per process (see the module comment).
 * @throws Error with code `ERR_SPECD_NIXL_MISSING`: "the NIXL library is not at …: run `npm run nixl:fetch`" when
 *   it was not fetched, or naming dlopen's error when it cannot be loaded.
 */
export function loadNixl(): NixlApi {
  if (loaded !== undefined) return loaded;
  const dir = nixlDir();
  const { capi, plugins } = nixlPaths(dir);
  if (!existsSync(capi)) {
    const e = new Error(
      `the NIXL library is not at ${capi}: run \`npm run nixl:fetch\` (it unpacks the PyPI wheel nixl-cu12==1.5.1 ` +
        'into .cache/nixl/), or set SPECD_NIXL_DIR to an unpacked copy; or use pd.transfer "zmq"',
    );
    (e as Error & { code: string }).code = 'ERR_SPECD_NIXL_MISSING';
    throw e;
  }
  if (process.env.NIXL_PLUGIN_DIR === undefined) process.env.NIXL_PLUGIN_DIR = plugins;
  if (!hasRdmaDevice()) for (const [k, v] of Object.entries(NO_RDMA_UCX_ENV)) process.env[k] ??= v;
  loaded = nixlLoad(capi);
  return loaded;
}
