// @specd/native-cuda on a machine without its addon (CI: no GPU, no nvcc, nothing CUDA built): loading the CUDA
// backend fails with one message saying what is missing and how to build it; nothing else in specd loads it.
import * as fs from 'node:fs';

import { describe, expect, it } from 'vitest';

// a plain ES module (no declarations; vitest transpiles without type-checking)
import { addonPath, loadCuda } from '../packages/native-cuda/index.js';

describe.skipIf(fs.existsSync(addonPath))('the CUDA backend where it is not built', () => {
  it('loadCuda() throws one message naming the addon and npm run build:cuda', () => {
    const why = /the CUDA backend is not available here: .*specd_cuda\.node is not built or does not load .*/;
    expect(() => loadCuda()).toThrow(why);
    expect(() => loadCuda()).toThrow(/build it with `npm run build:cuda` on a machine with an NVIDIA GPU/);
  });
});
