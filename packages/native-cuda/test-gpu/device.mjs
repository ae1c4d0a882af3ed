// The device of the kernel tests (kernels.test.mjs, sampling.test.mjs): the addon, the skip option every case takes
// (loadCuda()'s message when there is no GPU or no addon), and device buffers made from host arrays.
import { loadCuda } from '../index.js';

export let cuda;
let why;
try {
  cuda = loadCuda();
  console.log(
    `device: ${cuda.info.name}, sm ${cuda.info.computeCapability}, ${(cuda.info.totalBytes / 2 ** 30).toFixed(1)} GiB`,
  );
} catch (err) {
  why = err.message;
  console.log(`GPU tests skipped: ${why}`);
}
/** node:test options: skipped, with why, when the device is not usable. */
export const gpu = { skip: why };

/** A device buffer holding `a` (any typed array). */
export const devBuf = (a) => {
  const b = cuda.alloc(a.byteLength);
  cuda.upload(b, a);
  return b;
};
