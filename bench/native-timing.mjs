// '@specd/native' with every synchronous kernel a decode step calls wrapped by timers (bench/decode.mjs's "where
// the time goes", bench/spec.mjs's draft-cost split, bench/decode-calls.mjs's calls per step). Everything else is
// re-exported unchanged (`export *` never re-exports a name this module exports itself). Timing is off until
// `nativeTiming.enabled = true`; a call is then attributed to `nativeTiming.classify(name, args)` (default: the
// function name).
import * as real from '@specd/native';

export * from '@specd/native';

/** Totals by family: ms and calls. */
export const nativeTiming = {
  enabled: false,
  /** (functionName, args) → family label. */
  classify: (name) => name,
  /** @type {Map<string, { ms: number, calls: number }>} */
  totals: new Map(),
  /**
   * Called with (functionName, args) before every wrapped kernel call while set, timing on or off (bench/spec-bound.mjs
   * counts the multiply-adds and bytes of a step with it). @type {((name: string, args: unknown[]) => void) | null}
   */
  onCall: null,
  reset() {
    this.totals.clear();
  },
};

function timed(name, fn) {
  return (...args) => {
    if (nativeTiming.onCall !== null) nativeTiming.onCall(name, args);
    if (!nativeTiming.enabled) return fn(...args);
    const t0 = performance.now();
    try {
      return fn(...args);
    } finally {
      const ms = performance.now() - t0;
      const family = nativeTiming.classify(name, args);
      const e = nativeTiming.totals.get(family) ?? { ms: 0, calls: 0 };
      e.ms += ms;
      e.calls++;
      nativeTiming.totals.set(family, e);
    }
  };
}

export const gemmBf16 = timed('gemmBf16', real.gemmBf16);
export const rmsNorm = timed('rmsNorm', real.rmsNorm);
export const gatedRmsNorm = timed('gatedRmsNorm', real.gatedRmsNorm);
export const bf16ToF32 = timed('bf16ToF32', real.bf16ToF32);
export const swigluFused = timed('swigluFused', real.swigluFused);
export const addF32 = timed('addF32', real.addF32);
export const kdaRecurrent = timed('kdaRecurrent', real.kdaRecurrent);
export const kdaChunked = timed('kdaChunked', real.kdaChunked);
export const kdaGate = timed('kdaGate', real.kdaGate);
export const mlaAttention = timed('mlaAttention', real.mlaAttention);
export const moeRoute = timed('moeRoute', real.moeRoute);
export const moeExperts = timed('moeExperts', real.moeExperts);
export const argmax = timed('argmax', real.argmax);
export const argmaxProb = timed('argmaxProb', real.argmaxProb);
// the calls of a Llama-family forward and of a DFlash draft block (bench/spec.mjs's draft-cost split)
export const gemmQuant = timed('gemmQuant', real.gemmQuant);
export const gemmBf16Accumulate = timed('gemmBf16Accumulate', real.gemmBf16Accumulate);
export const pagedAttention = timed('pagedAttention', real.pagedAttention);
export const writeKvPages = timed('writeKvPages', real.writeKvPages);
export const rmsNormPerHead = timed('rmsNormPerHead', real.rmsNormPerHead);
export const applyRope = timed('applyRope', real.applyRope);
export const softmax = timed('softmax', real.softmax);
// the rest of a decode step's kernels (bench/decode-calls.mjs counts every call that crosses into the addon)
export const silu = timed('silu', real.silu);
export const swiglu = timed('swiglu', real.swiglu);
export const writePagedRows = timed('writePagedRows', real.writePagedRows);
export const copyPages = timed('copyPages', real.copyPages);
export const prefetchPages = timed('prefetchPages', real.prefetchPages);
export const f32ToBf16 = timed('f32ToBf16', real.f32ToBf16);
export const writeMlaCache = timed('writeMlaCache', real.writeMlaCache);
export const dequantizeToBf16 = timed('dequantizeToBf16', real.dequantizeToBf16);
export const topKMask = timed('topKMask', real.topKMask);
export const topPMask = timed('topPMask', real.topPMask);
export const samplingProbs = timed('samplingProbs', real.samplingProbs);
