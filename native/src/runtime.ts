/** Runtime controls: which ISA path the kernels use and how many threads the pool has. */
import { addon } from './addon.js';
import { expectArray, expectInt, expectOneOf } from './validate.js';

/** Instruction-set path of the kernels. */
export type IsaName = 'avx512' | 'portable';

/** What the addon runs on. */
export interface IsaInfo {
  /** Path the kernels use now. */
  readonly isa: IsaName;
  /** Whether this build and CPU can run the AVX-512 (F/BW/VL/BF16/VNNI) path. */
  readonly avx512Available: boolean;
  /** Whether AMX-TILE/AMX-BF16 are usable (used only by `gemmBf16(..., 'bf16')` on the avx512 path). */
  readonly amxAvailable: boolean;
  /** Threads of the compute pool, caller included (SPECD_NUM_THREADS or the CPU affinity mask). */
  readonly threads: number;
  /** Work units a range of a native call must hold before the call is split ({@link setParallelMinWork}). */
  readonly parallelMinWork: number;
}

/**
 * Reports the chosen ISA path and thread count. At load the path is AVX-512 when available,
 * unless `SPECD_ISA=portable` (or `avx512` to demand it, `auto` to detect) is set.
 */
export function isa(): IsaInfo {
  return addon.isa();
}

/**
 * Switches the ISA path for all later calls, process-wide (tests use it to run both paths).
 * @param name "auto" (detect), "portable", or "avx512".
 * @throws SpecdArgumentError for another name; RangeError (code ERR_SPECD_INVALID_ARG) when
 *   "avx512" is asked on a CPU or build without it.
 */
export function setIsa(name: 'auto' | IsaName): void {
  addon.setIsa(expectOneOf('setIsa', 'name', name, ['auto', 'portable', 'avx512'] as const));
}

/**
 * Rebuilds the compute pool with `threads` threads (caller included). Results never depend on it
 * (kernels partition outputs statically); only speed does.
 * @throws SpecdArgumentError unless 1 <= threads <= 1024.
 */
export function setNumThreads(threads: number): void {
  addon.setNumThreads(expectInt('setNumThreads', 'threads', threads, 1, 1024));
}

/** The default of {@link setParallelMinWork}: 2¹⁴ work units. */
export const DEFAULT_PARALLEL_MIN_WORK = 16384;

/**
 * Sets how much work (units ≈ one f32 element read or written, or one multiply-add) each thread's range of a
 * native call must hold before the call is split over the pool; smaller calls run inline on the caller
 * (native/src/threadpool.h). Process-wide; results never depend on it, only speed does. Default
 * {@link DEFAULT_PARALLEL_MIN_WORK} (docs/BENCHMARKS.md, "Native dispatch: the split threshold lowered"); larger
 * values keep more small calls on one thread (a host whose second vCPU is busy), smaller ones split more.
 * @param units integer in [1, 2³⁰].
 * @throws SpecdArgumentError on a value outside that range.
 */
export function setParallelMinWork(units: number): void {
  addon.setParallelMinWork(expectInt('setParallelMinWork', 'units', units, 1, 2 ** 30));
}

/**
 * Copies `src` into `dst` with the compute pool (one memcpy per thread); used by the bandwidth
 * benchmark (STREAM "copy": bytes moved = 2 * 4 * length).
 * @param dst Float32Array [n]; @param src Float32Array [n].
 */
export function parallelCopy(dst: Float32Array, src: Float32Array): void {
  const s = expectArray('parallelCopy', 'src', src, Float32Array);
  addon.parallelCopy(expectArray('parallelCopy', 'dst', dst, Float32Array, s.length, 'src.length'), s);
}

/**
 * A zeroed Float32Array [n] whose last element ends exactly where an inaccessible (PROT_NONE) page
 * begins, so a kernel that reads even one float past its input faults at once instead of reading
 * garbage that happens to be mapped. For tests of the native kernels; the memory is unmapped when
 * the array is garbage collected.
 * @param n Elements, 0 <= n <= 2^28.
 * @throws SpecdArgumentError for a bad n; Error (code ERR_SPECD_ALLOC) when mmap fails.
 */
export function guardedFloat32Array(n: number): Float32Array {
  return addon.guardedFloat32Array(expectInt('guardedFloat32Array', 'n', n, 0, 2 ** 28));
}
