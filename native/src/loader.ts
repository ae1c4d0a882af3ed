/**
 * The only module that loads the compiled addon (`build/Release/specd_native.node`). Everything
 * else goes through the typed wrappers re-exported by `native/index.ts`.
 *
 * @throws Error with code `ERR_SPECD_NATIVE_MISSING` when the addon has not been built, telling
 *   how to build it; the addon's own load error (e.g. a malformed `SPECD_ISA` or
 *   `SPECD_NUM_THREADS`, code `ERR_SPECD_INIT`) is rethrown unchanged.
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

/** Raw addon surface; argument order mirrors the C++ bindings (see native/src/*.cc headers). */
export interface RawAddon {
  isa(): { isa: 'avx512' | 'portable'; avx512Available: boolean; amxAvailable: boolean; threads: number };
  setIsa(name: string): void;
  setNumThreads(threads: number): void;
  parallelCopy(dst: Float32Array, src: Float32Array): void;
  guardedFloat32Array(n: number): Float32Array;
  f32ToBf16(src: Float32Array, dst: Uint16Array): void;
  bf16ToF32(src: Uint16Array, dst: Float32Array): void;
  packBf16(w: Uint16Array, n: number, k: number, out: Uint16Array): void;
  gemmBf16(
    x: Float32Array,
    m: number,
    k: number,
    packed: Uint16Array,
    n: number,
    y: Float32Array,
    activations: 'f32' | 'bf16',
    accumulate?: boolean,
  ): void;
  gemmBf16Async(
    x: Float32Array,
    m: number,
    k: number,
    packed: Uint16Array,
    n: number,
    y: Float32Array,
    activations: 'f32' | 'bf16',
  ): Promise<void>;
  rmsNorm(
    x: Float32Array,
    weight: Float32Array,
    rows: number,
    dim: number,
    eps: number,
    out: Float32Array,
    gate: Float32Array | null,
    gateKind: 'none' | 'sigmoid' | 'silu',
  ): void;
  rope(
    x: Float32Array,
    positions: Int32Array,
    tokens: number,
    heads: number,
    headDim: number,
    rotaryDim: number,
    theta: number,
    style: 'neox' | 'interleaved',
    out: Float32Array,
  ): void;
  silu(x: Float32Array, out: Float32Array): void;
  swiglu(gate: Float32Array, up: Float32Array, out: Float32Array): void;
  swigluFused(gateUp: Float32Array, rows: number, inter: number, out: Float32Array): void;
  softmax(x: Float32Array, rows: number, cols: number, temperature: number, out: Float32Array): void;
  argmax(x: Float32Array, rows: number, cols: number, out: Int32Array): void;
  topKMask(logits: Float32Array, rows: number, cols: number, k: number, out: Float32Array): void;
  topPMask(logits: Float32Array, rows: number, cols: number, p: number, out: Float32Array): void;
  quantPack(src: Uint8Array, type: 'q4_0' | 'q4_1' | 'q8_0', n: number, k: number, out: Uint8Array): void;
  gemmQuant(
    x: Float32Array,
    m: number,
    k: number,
    packed: Uint8Array,
    type: 'q4_0' | 'q4_1' | 'q8_0',
    n: number,
    y: Float32Array,
  ): void;
  gemmQuantAsync(
    x: Float32Array,
    m: number,
    k: number,
    packed: Uint8Array,
    type: 'q4_0' | 'q4_1' | 'q8_0',
    n: number,
    y: Float32Array,
  ): Promise<void>;
  quantDequantBf16(packed: Uint8Array, type: 'q4_0' | 'q4_1' | 'q8_0', n: number, k: number, out: Uint16Array): void;
}

/** Absolute path of the addon this package loads. */
export const addonPath: string = fileURLToPath(new URL('../../build/Release/specd_native.node', import.meta.url));

function load(): RawAddon {
  if (!existsSync(addonPath)) {
    const error = new Error(
      `@specd/native: native addon not found at ${addonPath}. Build it from the repository root with ` +
        '`npm run build:native` (cmake >= 3.15 and a C++17 compiler; no network needed), or `npm run build`.',
    );
    (error as Error & { code: string }).code = 'ERR_SPECD_NATIVE_MISSING';
    throw error;
  }
  const require = createRequire(import.meta.url);
  return require(addonPath) as RawAddon;
}

/** The loaded addon (loaded once, when this module is first imported). */
export const addon: RawAddon = load();
