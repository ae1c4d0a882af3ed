/**
 * Multi-head latent attention (MLA; Kimi-Linear with `mla_use_nope`, so no RoPE anywhere) in the
 * ABSORBED form over a paged latent cache; reference: tools/reference/specd_ref/kimi.py
 * `MLAAttention`. The same kernel serves decode, verification blocks and prefill (there is no
 * separate non-absorbed prefill path).
 *
 * Latent cache of one layer (one shared "head"): Float32Array `[numPages, pageSize, r + rope]`,
 * row of token j = `[c_j | k_pe_j]` with c = kv_a_layernorm(latent) `[kvLoraRank]` and
 * k_pe `[qkRopeHeadDim]`; page p = bytes `[p·pageSize·(r+rope)·4, (p+1)·…)`; copy with `copyPages`.
 *
 * Weights (`prepareMlaWeights`, once at load, fp32): from kv_b_proj.weight `[H·(nope+v), r]` (per
 * head `nope` k-up rows then `v` v-up rows): `wUk [H, nope, r]` (W_UK per head, row-major as in the
 * checkpoint) and `wUvT [H, r, v]` (W_UV per head, transposed).
 *
 * Per query t, head h: `q_lat = W_UKᵀ q_nope`, `s_j = (q_lat·c_j + q_pe·k_pe_j)·scale`, online
 * softmax, `o_lat = Σ p_j c_j`, `out = W_UV o_lat` → `[H, v]`. Equal in exact arithmetic to kimi.py's
 * `k = [W_UK c ; k_pe]`, `v = W_UV c` attention. Masks as in `pagedAttention` (default causal).
 * Batch invariant (bit for bit) like `pagedAttention`; see native/src/mla.cc for the reduction order.
 */
import { addon } from './addon.js';
import { bf16ToF32 } from './convert.js';
import { checkBatch, checkMask, type AttentionMask, type PagedBatch } from './attention.js';
import { expectArray, expectInt, expectNumber, fail, outArray } from './validate.js';

/** MLA head geometry (config.json names: num_attention_heads, qk_nope_head_dim, …). */
export interface MlaDims {
  readonly numHeads: number;
  readonly qkNopeHeadDim: number;
  /** May be 0 (no k_pe slice). */
  readonly qkRopeHeadDim: number;
  readonly vHeadDim: number;
  readonly kvLoraRank: number;
}

declare const mlaWeightsBrand: unique symbol;

/** Absorption weights from `prepareMlaWeights` (immutable). */
export interface MlaWeights {
  readonly dims: MlaDims;
  /** Float32Array [H, nope, r]: wUk[h][i][c] = kv_b_proj[h·(nope+v) + i][c]. */
  readonly wUk: Float32Array;
  /** Float32Array [H, r, v]: wUvT[h][c][e] = kv_b_proj[h·(nope+v) + nope + e][c]. */
  readonly wUvT: Float32Array;
  readonly [mlaWeightsBrand]: true;
}

/** Options of `mlaAttention`. */
export interface MlaAttentionOptions {
  /** Softmax scale; kimi.py uses (qkNopeHeadDim + qkRopeHeadDim)^−0.5. */
  readonly scale: number;
  /** Default 'causal' (the target model). */
  readonly mask?: AttentionMask;
  /** Sliding window in positions (> 0), or undefined/0 for none. */
  readonly slidingWindow?: number;
}

function checkDims(call: string, d: MlaDims): MlaDims {
  if (typeof d !== 'object' || d === null) fail(call, 'dims', 'an MlaDims object', d);
  expectInt(call, 'dims.numHeads', d.numHeads, 1);
  expectInt(call, 'dims.qkNopeHeadDim', d.qkNopeHeadDim, 1);
  expectInt(call, 'dims.qkRopeHeadDim', d.qkRopeHeadDim, 0);
  expectInt(call, 'dims.vHeadDim', d.vHeadDim, 1);
  expectInt(call, 'dims.kvLoraRank', d.kvLoraRank, 1);
  return d;
}

/** Floats per cached token: kvLoraRank + qkRopeHeadDim. */
export function mlaRowElements(dims: MlaDims): number {
  checkDims('mlaRowElements', dims);
  return dims.kvLoraRank + dims.qkRopeHeadDim;
}

/** A zero-filled latent pool `[numPages, pageSize, r + rope]` f32. */
export function createMlaPool(numPages: number, pageSize: number, dims: MlaDims): Float32Array {
  expectInt('createMlaPool', 'numPages', numPages, 0);
  expectInt('createMlaPool', 'pageSize', pageSize, 1);
  return new Float32Array(numPages * pageSize * mlaRowElements(dims));
}

/**
 * Splits kv_b_proj into the absorption weights (once at load).
 * @param kvBProj kv_b_proj.weight [H·(nope+v), r]: Float32Array, or Uint16Array of bf16 bits.
 * @throws SpecdArgumentError on a wrong type or length.
 */
export function prepareMlaWeights(kvBProj: Float32Array | Uint16Array, dims: MlaDims): MlaWeights {
  const call = 'prepareMlaWeights';
  const { numHeads: H, qkNopeHeadDim: nope, vHeadDim: v, kvLoraRank: r } = checkDims(call, dims);
  const n = H * (nope + v) * r;
  const w =
    kvBProj instanceof Uint16Array
      ? bf16ToF32(expectArray(call, 'kvBProj', kvBProj, Uint16Array, n, 'numHeads*(qkNopeHeadDim+vHeadDim)*kvLoraRank'))
      : expectArray(call, 'kvBProj', kvBProj, Float32Array, n, 'numHeads*(qkNopeHeadDim+vHeadDim)*kvLoraRank');
  const wUk = new Float32Array(H * nope * r);
  const wUvT = new Float32Array(H * r * v);
  for (let h = 0; h < H; h++) {
    const base = h * (nope + v) * r;
    wUk.set(w.subarray(base, base + nope * r), h * nope * r);
    for (let e = 0; e < v; e++) {
      const src = base + (nope + e) * r;
      for (let c = 0; c < r; c++) wUvT[(h * r + c) * v + e] = w[src + c]!;
    }
  }
  return Object.freeze({ dims: Object.freeze({ ...dims }), wUk, wUvT }) as MlaWeights;
}

/**
 * Writes this step's latent rows into the pool: row `slots[t]` = [latent[t] | kPe[t]].
 * @param latent Float32Array [numTokens, kvLoraRank] (after kv_a_layernorm); @param kPe Float32Array [numTokens, rope].
 * @param pool Float32Array [numPages, pageSize, r + rope]; @param slots Int32Array [numTokens] (−1 = skip; distinct).
 */
export function writeMlaCache(
  latent: Float32Array,
  kPe: Float32Array,
  pool: Float32Array,
  pageSize: number,
  dims: MlaDims,
  slots: Int32Array,
): void {
  const call = 'writeMlaCache';
  checkDims(call, dims);
  expectInt(call, 'pageSize', pageSize, 1);
  const { kvLoraRank: r, qkRopeHeadDim: rope } = dims;
  const n = expectArray(call, 'slots', slots, Int32Array).length;
  expectArray(call, 'latent', latent, Float32Array, n * r, 'numTokens*kvLoraRank');
  expectArray(call, 'kPe', kPe, Float32Array, n * rope, 'numTokens*qkRopeHeadDim');
  const p = expectArray(call, 'pool', pool, Float32Array);
  if (p.length % (pageSize * (r + rope)) !== 0)
    fail(call, 'pool', `a length divisible by pageSize*(r+rope) = ${pageSize * (r + rope)}`, p);
  const pages = p.length / (pageSize * (r + rope));
  addon.writePagedRows(latent, n, r, p, pages, pageSize, r + rope, 0, slots);
  if (rope > 0) addon.writePagedRows(kPe, n, rope, p, pages, pageSize, r + rope, r, slots);
}

function mlaArgs(
  call: string,
  q: Float32Array,
  pool: Float32Array,
  pageSize: number,
  weights: MlaWeights,
  batch: PagedBatch,
  options: MlaAttentionOptions,
  out: Float32Array | undefined,
) {
  if (typeof weights !== 'object' || weights === null)
    fail(call, 'weights', 'MlaWeights from prepareMlaWeights', weights);
  const d = checkDims(call, weights.dims);
  const { numHeads: H, qkNopeHeadDim: nope, qkRopeHeadDim: rope, vHeadDim: v, kvLoraRank: r } = d;
  expectArray(call, 'weights.wUk', weights.wUk, Float32Array, H * nope * r, 'numHeads*qkNopeHeadDim*kvLoraRank');
  expectArray(call, 'weights.wUvT', weights.wUvT, Float32Array, H * r * v, 'numHeads*kvLoraRank*vHeadDim');
  expectInt(call, 'pageSize', pageSize, 1);
  const p = expectArray(call, 'pool', pool, Float32Array);
  if (p.length % (pageSize * (r + rope)) !== 0)
    fail(call, 'pool', `a length divisible by pageSize*(r+rope) = ${pageSize * (r + rope)}`, p);
  if (typeof options !== 'object' || options === null) fail(call, 'options', 'an MlaAttentionOptions object', options);
  const scale = expectNumber(call, 'options.scale', options.scale);
  const [mask, window] = checkMask(call, options.mask ?? 'causal', options.slidingWindow);
  const [totalQ, maxBlocks] = checkBatch(call, batch);
  expectArray(call, 'q', q, Float32Array, totalQ * H * (nope + rope), 'totalQ*numHeads*(qkNopeHeadDim+qkRopeHeadDim)');
  const y = outArray(call, out, Float32Array, totalQ * H * v, 'totalQ*numHeads*vHeadDim');
  return [
    q,
    p,
    weights.wUk,
    weights.wUvT,
    y,
    p.length / (pageSize * (r + rope)),
    pageSize,
    H,
    nope,
    rope,
    v,
    r,
    scale,
    batch.cuSeqlensQ,
    batch.kvLens,
    batch.blockTables,
    maxBlocks,
    batch.positions,
    mask,
    window,
  ] as const;
}

/**
 * Absorbed MLA attention, synchronous.
 * @param q Float32Array [totalQ, H, nope + rope] (q_proj output; nope part first, as in kimi.py).
 * @param pool Float32Array [numPages, pageSize, r + rope] latent cache (this step's rows written first).
 * @param pageSize tokens per page; @param weights from `prepareMlaWeights`; @param batch as for `pagedAttention`.
 * @param options scale, mask (default causal), slidingWindow.
 * @param out optional Float32Array [totalQ, H, v] (must not alias q).
 * @returns Float32Array [totalQ, H, v]: the attention output before o_proj.
 * @throws SpecdArgumentError on a wrong type, length or option; RangeError (code ERR_SPECD_INVALID_ARG)
 *   on bad batch contents.
 */
export function mlaAttention(
  q: Float32Array,
  pool: Float32Array,
  pageSize: number,
  weights: MlaWeights,
  batch: PagedBatch,
  options: MlaAttentionOptions,
  out?: Float32Array,
): Float32Array {
  const args = mlaArgs('mlaAttention', q, pool, pageSize, weights, batch, options, out);
  addon.mlaAttention(...args);
  return args[4];
}

/** `mlaAttention` on a libuv thread; do not touch the buffers until it resolves. */
export async function mlaAttentionAsync(
  q: Float32Array,
  pool: Float32Array,
  pageSize: number,
  weights: MlaWeights,
  batch: PagedBatch,
  options: MlaAttentionOptions,
  out?: Float32Array,
): Promise<Float32Array> {
  const args = mlaArgs('mlaAttentionAsync', q, pool, pageSize, weights, batch, options, out);
  await addon.mlaAttentionAsync(...args);
  return args[4];
}
