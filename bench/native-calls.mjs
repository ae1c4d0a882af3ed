// '@specd/native' with every synchronous kernel call counted and timed, for bench/decode-calls.mjs (per-step
// native calls of a decode step). Like bench/native-timing.mjs (bench/decode.mjs's profile), but per function
// name and covering every kernel that crosses into the addon (GGUF gemmQuant, RoPE, paged attention, KV
// writes, sampling, …), not only the Kimi families. Load-time calls (packing, quantizedWeights) and the
// async variants are not wrapped. Counting is off until `nativeCalls.enabled = true`.
import * as real from '@specd/native';

export * from '@specd/native';

/** Per function name: calls and ms spent inside the call (JS facade's argument checks included). */
export const nativeCalls = {
  enabled: false,
  /** @type {Map<string, { ms: number, calls: number }>} */
  totals: new Map(),
  reset() {
    this.totals.clear();
  },
};

function counted(name, fn) {
  return (...args) => {
    if (!nativeCalls.enabled) return fn(...args);
    const t0 = performance.now();
    try {
      return fn(...args);
    } finally {
      const ms = performance.now() - t0;
      const e = nativeCalls.totals.get(name) ?? { ms: 0, calls: 0 };
      e.ms += ms;
      e.calls++;
      nativeCalls.totals.set(name, e);
    }
  };
}

export const silu = counted('silu', real.silu);
export const swiglu = counted('swiglu', real.swiglu);
export const swigluFused = counted('swigluFused', real.swigluFused);
export const pagedAttention = counted('pagedAttention', real.pagedAttention);
export const writePagedRows = counted('writePagedRows', real.writePagedRows);
export const writeKvPages = counted('writeKvPages', real.writeKvPages);
export const copyPages = counted('copyPages', real.copyPages);
export const f32ToBf16 = counted('f32ToBf16', real.f32ToBf16);
export const bf16ToF32 = counted('bf16ToF32', real.bf16ToF32);
export const gemmBf16 = counted('gemmBf16', real.gemmBf16);
export const gemmBf16Accumulate = counted('gemmBf16Accumulate', real.gemmBf16Accumulate);
export const kdaRecurrent = counted('kdaRecurrent', real.kdaRecurrent);
export const kdaChunked = counted('kdaChunked', real.kdaChunked);
export const writeMlaCache = counted('writeMlaCache', real.writeMlaCache);
export const mlaAttention = counted('mlaAttention', real.mlaAttention);
export const moeRoute = counted('moeRoute', real.moeRoute);
export const moeExperts = counted('moeExperts', real.moeExperts);
export const rmsNorm = counted('rmsNorm', real.rmsNorm);
export const gatedRmsNorm = counted('gatedRmsNorm', real.gatedRmsNorm);
export const rmsNormPerHead = counted('rmsNormPerHead', real.rmsNormPerHead);
export const gemmQuant = counted('gemmQuant', real.gemmQuant);
export const dequantizeToBf16 = counted('dequantizeToBf16', real.dequantizeToBf16);
export const applyRope = counted('applyRope', real.applyRope);
export const softmax = counted('softmax', real.softmax);
export const argmax = counted('argmax', real.argmax);
export const topKMask = counted('topKMask', real.topKMask);
export const topPMask = counted('topPMask', real.topPMask);
