/**
 * The model's inner kernels (KDA core, MLA attention, MoE routing + experts) behind one small
 * interface, with two implementations: TypeScript ({@link tsKernels}, the reference math of
 * tools/reference/specd_ref/kimi.py, fp32 storage with double-precision sums) and @specd/native
 * (kernels-native.ts). Layouts are the native ones, so the pools of `@specd/core` kv feed both.
 *
 * Determinism contract of every implementation: a token's result depends only on its own sequence
 * (cache, state, earlier tokens), never on the other sequences of the batch, their order or the
 * thread count; the recurrent KDA over a block of T tokens equals T single-token calls bit for bit.
 */

import { gemmBf16, packBf16Weights, swigluFused, type GemmActivations, type PackedBf16Weights } from '@specd/native';

import type { KimiConfig } from './config.js';
import { freshScratch, type Scratch } from '@specd/core';

/** KDA core inputs for a batch (C = heads·headDim; T = Σ seqLens). */
export interface KdaCall {
  /** Pre-conv q | k | v `[T, 3C]` f32. */
  readonly qkv: Float32Array;
  /** Log decay `[T, heads, headDim]` f32 (≤ 0). */
  readonly g: Float32Array;
  /** β after sigmoid `[T, heads]` f32. */
  readonly beta: Float32Array;
  /** q_conv1d | k_conv1d | v_conv1d weights `[3C, kernel]` f32. */
  readonly convWeight: Float32Array;
  /** Rows per sequence `[B]` i32, in row order. */
  readonly seqLens: Int32Array;
  /** State slot per sequence `[B]` i32 (distinct). */
  readonly slots: Int32Array;
  /** Recurrent pool `[numSlots, heads, headDim, headDim]` f32, updated in place. */
  readonly state: Float32Array;
  /** Conv pool `[numSlots, 3C, kernel − 1]` f32 (oldest first), updated in place. */
  readonly conv: Float32Array;
  readonly heads: number;
  readonly headDim: number;
  /** Output o `[T, heads, headDim]` f32. */
  readonly out: Float32Array;
  /**
   * Optional per-token snapshots (recurrent mode only): row r receives the state `[heads, headDim,
   * headDim]` and conv state `[3C, kernel − 1]` of row r's sequence right after token r.
   */
  readonly snapshots?: { readonly state: Float32Array; readonly conv: Float32Array };
  /**
   * Optional initial states (recurrent mode only; every `seqLens[b] ≥ 1`): sequence b's slot is set to row `rows[b]`
   * (default b) of `state` `[R, heads, headDim, headDim]` f32 and `conv` `[R, 3C, kernel − 1]` f32 before its tokens
   * run (a replay from a kept state, without a separate restore pass).
   */
  readonly initial?: { readonly state: Float32Array; readonly conv: Float32Array; readonly rows?: Int32Array };
  /**
   * Optional (recurrent mode only): sequence b's state and conv state before its tokens (after `initial`) written to
   * row `rows[b]` of `state` `[R, heads, headDim, headDim]` f32 and `conv` `[R, 3C, kernel − 1]` f32 (−1: not
   * written) — a verify's pre-block state for a later replay.
   */
  readonly keepBefore?: { readonly state: Float32Array; readonly conv: Float32Array; readonly rows: Int32Array };
}

/** Paged batch description (the native `PagedBatch`). */
export interface MlaBatch {
  /** `[numSeqs + 1]` i32: queries of sequence s are rows [cu[s], cu[s+1]). */
  readonly cuSeqlensQ: Int32Array;
  /** `[numSeqs]` i32: cached tokens per sequence (this step's included). */
  readonly kvLens: Int32Array;
  /** `[numSeqs, maxBlocks]` i32 page ids. */
  readonly blockTables: Int32Array;
  /** `[totalQ]` i32 absolute positions (causal: query at p sees keys 0..p). */
  readonly positions: Int32Array;
}

/** Opaque per-layer MLA weights prepared by a kernel set. */
export type MlaPrepared = { readonly kind: string };
/** Opaque per-layer expert weights prepared by a kernel set. */
export type MoePrepared = { readonly kind: string };

/** A SwiGLU MLP: `gateUp [2·inter, hidden]` (gate rows then up rows), `down [hidden, inter]`. */
export interface SwigluWeights {
  readonly inter: number;
  readonly gateUp: PackedBf16Weights;
  readonly down: PackedBf16Weights;
}

/** Router output: `[N, k]` ids (selection order, descending choice score) and weights. */
export interface Routing {
  readonly topK: number;
  readonly ids: Int32Array;
  readonly weights: Float32Array;
}

/** Inner kernels of a Kimi forward. */
export interface KimiKernels {
  /** `'ts'` or `'native'`. */
  readonly name: string;
  /**
   * KDA core (kimi.py `KDAAttention` after the projections): causal depthwise conv (no bias) + SiLU
   * on q, k, v; q, k L2-normalised per head (x / sqrt(Σx² + 1e−6)); q · headDim^−½; then per token
   * S' = diag(exp g)·S; S = S' + β k (v − S'ᵀk)ᵀ; o = Sᵀ q. `'chunked'` may use the WY form
   * (prefill only: equal within fp32 tolerance, not bitwise); `'recurrent'` is token by token.
   */
  kda(call: KdaCall, mode: 'recurrent' | 'chunked'): void;
  /**
   * KDA gates of T tokens: `g [T, H·d] = negA[h] · softplus(f + dtBias)` (softplus threshold 20) and
   * `beta [T, H] = sigmoid(b[bOffset + t·bStride + h])`: in double, stored fp32 (TypeScript), or in fp32
   * with a vectorised exp/log1p (native `kdaGate`, within 4 ulp). Elementwise (batch invariant).
   * `f [T, H·d]` is f_b_proj's output, `b` holds β's logits (a column range of the in-projection).
   */
  kdaGate(
    f: Float32Array,
    dtBias: Float32Array,
    negA: Float32Array,
    b: Float32Array,
    bOffset: number,
    bStride: number,
    heads: number,
    headDim: number,
  ): { g: Float32Array; beta: Float32Array };
  /** Prepares one layer's MLA absorption weights from kv_b_proj `[H·(nope+v), r]` bf16 bits. */
  prepareMla(kvB: Uint16Array, c: KimiConfig): MlaPrepared;
  /**
   * Absorbed MLA attention (NoPE): q `[T, H, nope + rope]` f32 over the latent pool
   * `[numPages, pageSize, r + rope]` f32 (this step's rows already written) → `[T, H, v]` f32.
   */
  mla(
    q: Float32Array,
    pool: Float32Array,
    pageSize: number,
    w: MlaPrepared,
    batch: MlaBatch,
    scale: number,
    c: KimiConfig,
  ): Float32Array;
  /**
   * Router from logits `[N, E]` f32: sigmoid scores; top-k by score + bias (ties to the lower id);
   * weights = chosen scores / (Σ + 1e−20) (if renormalize) · routed_scaling_factor.
   */
  route(logits: Float32Array, n: number, bias: Float32Array, c: KimiConfig): Routing;
  /** Prepares one layer's routed experts (+ shared). */
  prepareMoe(experts: readonly SwigluWeights[], shared: SwigluWeights | undefined): MoePrepared;
  /**
   * Σ_j w_j · expert_{id_j}(x) in ascending expert id, + shared(x) last; `x [N, hidden]` → `[N, hidden]` f32,
   * written into `out` `[N, hidden]` when given (its old contents ignored; a kernel may return a new array instead).
   */
  moe(x: Float32Array, n: number, w: MoePrepared, r: Routing, out?: Float32Array): Float32Array;
}

// ---------------------------------------------------------------------------------------------
// TypeScript implementation
// ---------------------------------------------------------------------------------------------

const L2_EPS = 1e-6;

/** Causal depthwise conv + SiLU of `n` rows (conv i of 3 in `qkv`), in place on `state [C, ks−1]`. */
function convSilu(
  qkv: Float32Array,
  C: number,
  i: number,
  row0: number,
  n: number,
  w: Float32Array,
  ks: number,
  state: Float32Array,
  out: Float32Array,
): void {
  const keep = ks - 1;
  const width = 3 * C;
  for (let c = 0; c < C; c++) {
    const sb = c * keep;
    const wb = (i * C + c) * ks;
    for (let t = 0; t < n; t++) {
      const xt = qkv[(row0 + t) * width + i * C + c]!;
      let y = 0;
      for (let j = 0; j < keep; j++) y += w[wb + j]! * state[sb + j]!;
      y += w[wb + keep]! * xt;
      for (let j = 0; j + 1 < keep; j++) state[sb + j] = state[sb + j + 1]!;
      if (keep > 0) state[sb + keep - 1] = xt;
      const yf = Math.fround(y);
      out[(row0 + t) * C + c] = yf / (1 + Math.exp(-yf));
    }
  }
}

/** L2-normalises each `[d]` vector of `x` rows [row0, row0 + n) (·H heads) in place, times `scale`. */
function l2norm(x: Float32Array, from: number, to: number, d: number, scale: number): void {
  for (let b = from; b < to; b += d) {
    let ss = 0;
    for (let i = 0; i < d; i++) ss += x[b + i]! * x[b + i]!;
    const inv = 1 / Math.sqrt(Math.fround(ss) + L2_EPS);
    for (let i = 0; i < d; i++) x[b + i] = Math.fround(x[b + i]! * inv) * scale;
  }
}

/** One sequence's recurrent steps on `S [H, d, d]` (rows [row0, row0 + n)). */
function recurrent(
  S: Float32Array,
  q: Float32Array,
  k: Float32Array,
  v: Float32Array,
  g: Float32Array,
  beta: Float32Array,
  out: Float32Array,
  row0: number,
  n: number,
  H: number,
  d: number,
  snap?: Float32Array,
): void {
  const alpha = new Float64Array(d);
  const u = new Float64Array(d);
  const acc = new Float64Array(d);
  for (let t = row0; t < row0 + n; t++) {
    for (let h = 0; h < H; h++) {
      const base = (t * H + h) * d;
      const S0 = h * d * d;
      for (let i = 0; i < d; i++) alpha[i] = Math.exp(g[base + i]!);
      u.fill(0);
      for (let i = 0; i < d; i++) {
        const a = alpha[i]!;
        const ki = k[base + i]!;
        const row = S0 + i * d;
        for (let j = 0; j < d; j++) {
          const s = Math.fround(S[row + j]! * a);
          S[row + j] = s;
          u[j] = u[j]! + ki * s;
        }
      }
      const b = beta[t * H + h]!;
      for (let j = 0; j < d; j++) u[j] = b * (v[base + j]! - Math.fround(u[j]!));
      acc.fill(0);
      for (let i = 0; i < d; i++) {
        const ki = k[base + i]!;
        const qi = q[base + i]!;
        const row = S0 + i * d;
        for (let j = 0; j < d; j++) {
          const s = Math.fround(S[row + j]! + ki * u[j]!);
          S[row + j] = s;
          acc[j] = acc[j]! + qi * s;
        }
      }
      for (let j = 0; j < d; j++) out[base + j] = acc[j]!;
    }
    if (snap !== undefined) snap.set(S, t * H * d * d);
  }
}

/**
 * Conv states after each of `n` rows (before `state` is advanced): row r's snapshot `[3C, ks−1]`
 * is the last ks−1 pre-conv inputs per channel up to and including row r.
 */
function convSnapshots(
  qkv: Float32Array,
  C: number,
  row0: number,
  n: number,
  ks: number,
  state: Float32Array,
  snap: Float32Array,
): void {
  const keep = ks - 1;
  const per = 3 * C * keep;
  for (let t = 0; t < n; t++) {
    const base = (row0 + t) * per;
    for (let ch = 0; ch < 3 * C; ch++) {
      for (let j = 0; j < keep; j++) {
        const src = t - (keep - 1 - j); // input index within the sequence's new rows (negative: from the old state)
        snap[base + ch * keep + j] = src >= 0 ? qkv[(row0 + src) * 3 * C + ch]! : state[ch * keep + keep + src]!;
      }
    }
  }
}

interface TsMla extends MlaPrepared {
  readonly kind: 'ts';
  /** Per head W_ukᵀ `[r, nope]` packed (q_lat = q_nope · W_uk). */
  readonly ukT: readonly PackedBf16Weights[];
  /** Per head W_uv `[v, r]` packed. */
  readonly uv: readonly PackedBf16Weights[];
}

interface TsMoe extends MoePrepared {
  readonly kind: 'ts';
  readonly experts: readonly SwigluWeights[];
  readonly shared: SwigluWeights | undefined;
}

/**
 * SwiGLU MLP forward: `x [m, hidden]` → `[m, hidden]` f32 (packed GEMMs, batch invariant rows);
 * `act` is both GEMMs' activation precision (`gemmBf16`'s, default `'f32'`). `buf`: where the intermediates and
 * the result go ({@link Scratch}; default fresh arrays; a kept scratch's result is overwritten by the next layer).
 */
export function swigluForward(
  w: SwigluWeights,
  x: Float32Array,
  m: number,
  act: GemmActivations = 'f32',
  buf: Scratch = freshScratch,
): Float32Array {
  const gateUp = gemmBf16(x, m, w.gateUp, buf('mlp.gateUp', m * w.gateUp.n), act);
  const inner = swigluFused(gateUp, w.inter, buf('mlp.inner', m * w.inter));
  return gemmBf16(inner, m, w.down, buf('ffn.out', m * w.down.n), act);
}

/** torch.nn.functional.softplus (beta 1, threshold 20). */
function softplus(x: number): number {
  return x > 20 ? x : Math.log1p(Math.exp(x));
}

/** TypeScript kernels (reference math; `'chunked'` runs the recurrent form). */
export const tsKernels: KimiKernels = Object.freeze<KimiKernels>({
  name: 'ts',
  kdaGate(f, dtBias, negA, b, bOffset, bStride, H, d) {
    const C = H * d;
    const T = f.length / C;
    const g = new Float32Array(T * C);
    const beta = new Float32Array(T * H);
    for (let t = 0; t < T; t++) {
      for (let h = 0; h < H; h++) {
        const a = negA[h]!;
        for (let i = 0; i < d; i++) {
          const ch = h * d + i;
          g[t * C + ch] = a * Math.fround(softplus(Math.fround(f[t * C + ch]! + dtBias[ch]!)));
        }
        beta[t * H + h] = 1 / (1 + Math.exp(-b[bOffset + t * bStride + h]!));
      }
    }
    return { g, beta };
  },
  kda(call) {
    const { qkv, g, beta, convWeight, seqLens, slots, state, conv, heads: H, headDim: d, out } = call;
    const C = H * d;
    const ks = convWeight.length / (3 * C);
    const T = qkv.length / (3 * C);
    const q = new Float32Array(T * C);
    const k = new Float32Array(T * C);
    const v = new Float32Array(T * C);
    const convSlot = 3 * C * (ks - 1);
    let row0 = 0;
    for (let b = 0; b < seqLens.length; b++) {
      const n = seqLens[b]!;
      const slot = slots[b]!;
      if (call.initial !== undefined) {
        const r = call.initial.rows?.[b] ?? b;
        state.set(call.initial.state.subarray(r * H * d * d, (r + 1) * H * d * d), slot * H * d * d);
        conv.set(call.initial.conv.subarray(r * convSlot, (r + 1) * convSlot), slot * convSlot);
      }
      const keepRow = call.keepBefore?.rows[b] ?? -1;
      if (keepRow >= 0) {
        call.keepBefore!.state.set(state.subarray(slot * H * d * d, (slot + 1) * H * d * d), keepRow * H * d * d);
        call.keepBefore!.conv.set(conv.subarray(slot * convSlot, (slot + 1) * convSlot), keepRow * convSlot);
      }
      const cs = conv.subarray(slot * convSlot, (slot + 1) * convSlot);
      if (call.snapshots !== undefined) convSnapshots(qkv, C, row0, n, ks, cs, call.snapshots.conv);
      [q, k, v].forEach((dst, i) => {
        convSilu(qkv, C, i, row0, n, convWeight, ks, cs.subarray(i * C * (ks - 1), (i + 1) * C * (ks - 1)), dst);
      });
      l2norm(q, row0 * C, (row0 + n) * C, d, 1 / Math.sqrt(d));
      l2norm(k, row0 * C, (row0 + n) * C, d, 1);
      recurrent(
        state.subarray(slot * H * d * d, (slot + 1) * H * d * d),
        q,
        k,
        v,
        g,
        beta,
        out,
        row0,
        n,
        H,
        d,
        call.snapshots?.state,
      );
      row0 += n;
    }
  },
  prepareMla(kvB, c) {
    const { numHeads: H, qkNopeHeadDim: nope, vHeadDim: vd, kvLoraRank: r } = c;
    const ukT: PackedBf16Weights[] = [];
    const uv: PackedBf16Weights[] = [];
    for (let h = 0; h < H; h++) {
      const base = h * (nope + vd) * r;
      const t = new Uint16Array(r * nope);
      for (let n = 0; n < nope; n++) for (let j = 0; j < r; j++) t[j * nope + n] = kvB[base + n * r + j]!;
      ukT.push(packBf16Weights(t, r, nope));
      uv.push(packBf16Weights(kvB.slice(base + nope * r, base + (nope + vd) * r), vd, r));
    }
    return { kind: 'ts', ukT, uv } as TsMla;
  },
  mla(q, pool, pageSize, prepared, batch, scale, c) {
    const w = prepared as TsMla;
    const { numHeads: H, qkNopeHeadDim: nope, qkRopeHeadDim: rope, vHeadDim: vd, kvLoraRank: r } = c;
    const qw = nope + rope;
    const row = r + rope;
    const T = q.length / (H * qw);
    // qCat [T, H, r + rope] = [q_nope · W_uk | q_pe]
    const qCat = new Float32Array(T * H * row);
    const qn = new Float32Array(T * nope);
    for (let h = 0; h < H; h++) {
      for (let t = 0; t < T; t++) qn.set(q.subarray((t * H + h) * qw, (t * H + h) * qw + nope), t * nope);
      const qLat = gemmBf16(qn, T, w.ukT[h]!);
      for (let t = 0; t < T; t++) {
        qCat.set(qLat.subarray(t * r, (t + 1) * r), (t * H + h) * row);
        qCat.set(q.subarray((t * H + h) * qw + nope, (t * H + h + 1) * qw), (t * H + h) * row + r);
      }
    }
    const oLat = new Float32Array(T * H * r);
    const numSeqs = batch.kvLens.length;
    const maxBlocks = numSeqs === 0 ? 0 : batch.blockTables.length / numSeqs;
    const p = new Float64Array(Math.max(1, ...batch.kvLens));
    const acc = new Float64Array(r);
    for (let s = 0; s < numSeqs; s++) {
      const offsets = new Int32Array(batch.kvLens[s]!);
      for (let j = 0; j < offsets.length; j++) {
        offsets[j] = (batch.blockTables[s * maxBlocks + Math.floor(j / pageSize)]! * pageSize + (j % pageSize)) * row;
      }
      for (let t = batch.cuSeqlensQ[s]!; t < batch.cuSeqlensQ[s + 1]!; t++) {
        const rows = batch.positions[t]! + 1;
        for (let h = 0; h < H; h++) {
          const qb = (t * H + h) * row;
          let max = -Infinity;
          for (let j = 0; j < rows; j++) {
            const rb = offsets[j]!;
            let dot = 0;
            for (let x = 0; x < row; x++) dot += qCat[qb + x]! * pool[rb + x]!;
            const sc = Math.fround(dot * scale);
            p[j] = sc;
            if (sc > max) max = sc;
          }
          let sum = 0;
          for (let j = 0; j < rows; j++) {
            const e = Math.exp(p[j]! - max);
            p[j] = e;
            sum += e;
          }
          acc.fill(0);
          for (let j = 0; j < rows; j++) {
            const pj = p[j]! / sum;
            const rb = offsets[j]!;
            for (let x = 0; x < r; x++) acc[x] = acc[x]! + pj * pool[rb + x]!;
          }
          for (let x = 0; x < r; x++) oLat[(t * H + h) * r + x] = acc[x]!;
        }
      }
    }
    const o = new Float32Array(T * H * vd);
    const ol = new Float32Array(T * r);
    for (let h = 0; h < H; h++) {
      for (let t = 0; t < T; t++) ol.set(oLat.subarray((t * H + h) * r, (t * H + h + 1) * r), t * r);
      const oh = gemmBf16(ol, T, w.uv[h]!);
      for (let t = 0; t < T; t++) o.set(oh.subarray(t * vd, (t + 1) * vd), (t * H + h) * vd);
    }
    return o;
  },
  route(logits, n, bias, c) {
    const E = c.numExperts;
    const K = c.expertsPerToken;
    const ids = new Int32Array(n * K);
    const weights = new Float32Array(n * K);
    const scores = new Float32Array(E);
    const choice = new Float32Array(E);
    const taken = new Uint8Array(E);
    for (let t = 0; t < n; t++) {
      for (let e = 0; e < E; e++) {
        scores[e] = 1 / (1 + Math.exp(-logits[t * E + e]!));
        choice[e] = scores[e]! + bias[e]!;
      }
      taken.fill(0);
      let sum = 0;
      for (let j = 0; j < K; j++) {
        let best = -1;
        for (let e = 0; e < E; e++) if (!taken[e] && (best < 0 || choice[e]! > choice[best]!)) best = e;
        taken[best] = 1;
        ids[t * K + j] = best;
        sum = Math.fround(sum + scores[best]!);
      }
      for (let j = 0; j < K; j++) {
        const s = scores[ids[t * K + j]!]!;
        weights[t * K + j] = (c.moeRenormalize ? Math.fround(s / Math.fround(sum + 1e-20)) : s) * c.routedScalingFactor;
      }
    }
    return { topK: K, ids, weights };
  },
  prepareMoe(experts, shared) {
    return { kind: 'ts', experts, shared } as TsMoe;
  },
  moe(x, n, prepared, r) {
    const w = prepared as TsMoe;
    const D = x.length / n;
    const K = r.topK;
    const out = new Float32Array(n * D);
    for (let e = 0; e < w.experts.length; e++) {
      const rows: number[] = [];
      const wts: number[] = [];
      for (let t = 0; t < n; t++) {
        for (let j = 0; j < K; j++) {
          if (r.ids[t * K + j] === e) {
            rows.push(t);
            wts.push(r.weights[t * K + j]!);
          }
        }
      }
      if (rows.length === 0) continue;
      const xe = new Float32Array(rows.length * D);
      rows.forEach((t, i) => {
        xe.set(x.subarray(t * D, (t + 1) * D), i * D);
      });
      const ye = swigluForward(w.experts[e]!, xe, rows.length);
      rows.forEach((t, i) => {
        const wt = wts[i]!;
        for (let j = 0; j < D; j++) out[t * D + j] = out[t * D + j]! + Math.fround(ye[i * D + j]! * wt);
      });
    }
    if (w.shared !== undefined) {
      const ys = swigluForward(w.shared, x, n);
      for (let i = 0; i < n * D; i++) out[i] = out[i]! + ys[i]!;
    }
    return out;
  },
});
