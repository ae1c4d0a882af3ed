/**
 * The NIXL C API (NVIDIA Inference Xfer Library, ai-dynamo/nixl), loaded at run time: native/src/nixl.cc dlopen()s
 * `libnixl_capi.so` from the PyPI wheel nixl-cu12 that `npm run nixl:fetch` unpacks (no link-time dependency, no
 * header: the prototypes are declared in nixl.cc). Used by the NIXL transfer engine of @specd/core
 * (packages/core/src/pd/nixl-transfer.ts); the functions are the addon's, one-to-one (see nixl.cc for each).
 */
import { addon, type NixlHandle, type RawAddon } from './addon.js';

export type { NixlHandle };

/** The NIXL functions of the addon (valid after {@link nixlLoad}). */
export type NixlApi = Pick<RawAddon, Extract<keyof RawAddon, `nixl${string}`>>;

/**
 * Loads `libnixl_capi.so` (once per process; later calls return at once) and returns the API.
 * @throws Error with code `ERR_SPECD_NIXL_MISSING` naming the path and dlerror() when it cannot be loaded.
 */
export function nixlLoad(capiPath: string): NixlApi {
  addon.nixlLoad(capiPath);
  return addon;
}
