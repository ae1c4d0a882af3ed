// @specd/native-cuda: the CUDA backend's kernels (issue 18), loaded only when asked for (`loadCuda()`; nothing else
// in specd imports this package). Device memory is owned by the addon: `alloc(bytes)` returns an opaque handle.
// Built by `npm run build:cuda` on a machine with an NVIDIA GPU and the CUDA toolkit, never by `npm run build`.
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Where the addon is built. */
export const addonPath = join(dirname(fileURLToPath(import.meta.url)), 'build', 'specd_cuda.node');

/**
 * The CUDA addon, checked to see a device.
 * @returns the addon's functions (see src/binding.cc) and `info`, its deviceInfo() (name, computeCapability,
 *   totalBytes, freeBytes).
 * @throws {Error} one message saying what is missing: the addon not built (how to build it), or no usable device
 *   (the CUDA error).
 */
export function loadCuda() {
  let addon;
  try {
    addon = createRequire(import.meta.url)(addonPath);
  } catch (err) {
    throw new Error(
      `the CUDA backend is not available here: ${addonPath} is not built or does not load ` +
        `(${err.message.split('\n')[0]}); build it with \`npm run build:cuda\` on a machine with an NVIDIA GPU and ` +
        'the CUDA toolkit (CUDA 13, nvcc)',
    );
  }
  let info;
  try {
    info = addon.deviceInfo();
  } catch (err) {
    throw new Error(`the CUDA backend found no usable GPU: ${err.message}`);
  }
  return { ...addon, info };
}
