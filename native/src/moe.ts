/**
 * Mixture of experts (Kimi-Linear / DeepSeek-V3 style; REFERENCE.md §7, numerics oracle
 * tools/reference/specd_ref/kimi.py `MoEGate`, `SparseMoE`).
 *
 * Router (`moeRoute` on logits, or `moeRouter` = `gemmBf16` + `moeRoute`):
 *   scores = sigmoid(x·Wgᵀ) in fp32; the topK experts with the largest `score + bias`
 *   (e_score_correction_bias, used for the CHOICE only) are selected — ties go to the LOWEST expert
 *   id, a NaN key ranks last — and ids are listed in selection order (descending key);
 *   weights = chosen raw scores / (their sum + 1e-20) × routedScalingFactor (no division when
 *   `renormalize` is false, config `moe_renormalize`).
 *
 * Experts (`moeExperts`): out[t] = Σ_j weights[t][j] · w2_e(silu(w1_e x_t) ⊙ w3_e x_t) + shared(x_t),
 * e = ids[t][j], the shared expert unscaled. Tokens are gathered per expert and each expert runs
 * as one packed bf16 GEMM per weight (the kernels of `gemmBf16`, fp32 activations and
 * accumulation), all experts of a phase in one parallel pass; w1 and w3 are packed together as one
 * `[2·inter, hidden]` matrix (`packMoeExpert`), so each expert costs two GEMMs. The shared expert
 * runs in the same call (same kernels), so the TS side never adds it separately.
 *
 * Batch invariance: a token's output is bit-identical whatever other tokens are in the batch (and
 * their order) and whatever the thread count — each GEMM row equals the GEMV of that row, and each
 * token's contributions are summed in a fixed order: ascending expert id (then slot), the shared
 * expert last, from +0. Portable and AVX-512 paths differ by rounding only, like `gemmBf16`.
 */
import { addon, type MoeExpertsRawArgs, type PackedBf16Data } from './addon.js';
import { gemmBf16, packBf16Weights, packedBf16Length, type PackedBf16Weights } from './gemm.js';
import { expectArray, expectInt, expectNumber, fail, outArray } from './validate.js';

/** One SwiGLU expert, packed: `w13` = concat(w1, w3) `[2·inter, hidden]`, `w2` `[hidden, inter]`. */
export interface MoeExpertWeights {
  readonly w13: PackedBf16Weights;
  readonly w2: PackedBf16Weights;
}

declare const expertSetBrand: unique symbol;

/** The routed experts of one layer (+ optional shared expert), validated once at load. */
export interface MoeExpertSet {
  readonly numExperts: number;
  readonly hidden: number;
  /** moe_intermediate_size of a routed expert. */
  readonly inter: number;
  /** Intermediate size of the shared expert (moe_intermediate_size · num_shared_experts), 0 if none. */
  readonly sharedInter: number;
  readonly w13: readonly PackedBf16Data[];
  readonly w2: readonly PackedBf16Data[];
  readonly sharedW13: PackedBf16Data | null;
  readonly sharedW2: PackedBf16Data | null;
  readonly [expertSetBrand]: true;
}

/** Router output: `ids` i32 `[n, topK]` (selection order) and `weights` f32 `[n, topK]`. */
export interface MoeRouting {
  readonly topK: number;
  readonly ids: Int32Array;
  readonly weights: Float32Array;
}

/** Options of `moeRoute` / `moeRouter`. */
export interface MoeRouteOptions {
  /** f32 `[numExperts]` e_score_correction_bias (selection only); default none. */
  readonly bias?: Float32Array;
  /** Divide by the chosen scores' sum (+1e-20); default true (moe_renormalize). */
  readonly renormalize?: boolean;
  /** Where to write; allocated when absent. */
  readonly out?: { ids: Int32Array; weights: Float32Array };
  /** f32 `[n, numExperts]`: receives the sigmoid scores (for tests / statistics). */
  readonly scores?: Float32Array;
}

/**
 * Packs one expert from HF tensors (bf16 bits): w1 `[inter, hidden]` (gate), w3 `[inter, hidden]`
 * (up), w2 `[hidden, inter]` (down).
 */
export function packMoeExpert(
  w1: Uint16Array,
  w3: Uint16Array,
  w2: Uint16Array,
  hidden: number,
  inter: number,
): MoeExpertWeights {
  const call = 'packMoeExpert';
  expectInt(call, 'hidden', hidden, 1);
  expectInt(call, 'inter', inter, 1);
  expectArray(call, 'w1', w1, Uint16Array, inter * hidden, 'inter*hidden');
  expectArray(call, 'w3', w3, Uint16Array, inter * hidden, 'inter*hidden');
  expectArray(call, 'w2', w2, Uint16Array, hidden * inter, 'hidden*inter');
  const w13 = new Uint16Array(2 * inter * hidden);
  w13.set(w1, 0);
  w13.set(w3, inter * hidden);
  return { w13: packBf16Weights(w13, 2 * inter, hidden), w2: packBf16Weights(w2, hidden, inter) };
}

function checkExpert(call: string, param: string, e: MoeExpertWeights, hidden: number): number {
  if (typeof e !== 'object' || e === null) fail(call, param, '{ w13, w2 } packed weights', e);
  const inter = e.w2?.k;
  if (!Number.isInteger(inter) || e.w13?.n !== 2 * inter || e.w13.k !== hidden || e.w2.n !== hidden) {
    fail(
      call,
      param,
      `w13 [2*inter, ${hidden}] and w2 [${hidden}, inter] packed weights`,
      `w13 [${e.w13?.n}, ${e.w13?.k}], w2 [${e.w2?.n}, ${e.w2?.k}]`,
    );
  }
  expectArray(call, `${param}.w13.data`, e.w13.data, Uint16Array, packedBf16Length(2 * inter, hidden));
  expectArray(call, `${param}.w2.data`, e.w2.data, Uint16Array, packedBf16Length(hidden, inter));
  return inter;
}

/**
 * Validates a layer's experts once (all routed experts must share one shape) and keeps their
 * packed arrays in the form the native call takes.
 */
export function createMoeExpertSet(experts: readonly MoeExpertWeights[], shared?: MoeExpertWeights): MoeExpertSet {
  const call = 'createMoeExpertSet';
  if (!Array.isArray(experts) || experts.length === 0) fail(call, 'experts', 'a non-empty Array', experts);
  const hidden = expectInt(call, 'experts[0].w13.k', experts[0]?.w13?.k, 1);
  const inter = checkExpert(call, 'experts[0]', experts[0]!, hidden);
  experts.forEach((e, i) => {
    if (checkExpert(call, `experts[${i}]`, e, hidden) !== inter)
      fail(call, `experts[${i}]`, `inter = ${inter}`, e.w2.k);
  });
  const sharedInter = shared === undefined ? 0 : checkExpert(call, 'shared', shared, hidden);
  return Object.freeze({
    numExperts: experts.length,
    hidden,
    inter,
    sharedInter,
    w13: Object.freeze(experts.map((e) => e.w13.data)),
    w2: Object.freeze(experts.map((e) => e.w2.data)),
    sharedW13: shared?.w13.data ?? null,
    sharedW2: shared?.w2.data ?? null,
  }) as MoeExpertSet;
}

/**
 * Sigmoid top-k routing from router logits (module comment).
 * @param logits f32 `[n, numExperts]` = x·Wgᵀ (fp32).
 * @param topK experts per token (num_experts_per_token), 1..numExperts.
 * @param routedScalingFactor routed_scaling_factor.
 * @throws SpecdArgumentError on a wrong type, length or range.
 */
export function moeRoute(
  logits: Float32Array,
  n: number,
  numExperts: number,
  topK: number,
  routedScalingFactor: number,
  options: MoeRouteOptions = {},
): MoeRouting {
  const call = 'moeRoute';
  expectInt(call, 'n', n, 0);
  expectInt(call, 'numExperts', numExperts, 1);
  expectInt(call, 'topK', topK, 1, numExperts);
  expectNumber(call, 'routedScalingFactor', routedScalingFactor);
  expectArray(call, 'logits', logits, Float32Array, n * numExperts, 'n*numExperts');
  const bias =
    options.bias === undefined ? null : expectArray(call, 'bias', options.bias, Float32Array, numExperts, 'numExperts');
  const ids = options.out
    ? expectArray(call, 'out.ids', options.out.ids, Int32Array, n * topK, 'n*topK')
    : new Int32Array(n * topK);
  const weights = outArray(call, options.out?.weights, Float32Array, n * topK, 'n*topK');
  const scores =
    options.scores === undefined
      ? null
      : expectArray(call, 'scores', options.scores, Float32Array, n * numExperts, 'n*numExperts');
  addon.moeRoute(
    logits,
    n,
    numExperts,
    bias,
    topK,
    routedScalingFactor,
    options.renormalize ?? true,
    ids,
    weights,
    scores,
  );
  return { topK, ids, weights };
}

/**
 * Router from hidden states: logits = `gemmBf16(x, n, gate)` (gate.weight `[numExperts, hidden]`
 * packed; fp32 activations and accumulation), then `moeRoute`.
 * @param x f32 `[n, hidden]`. @returns the routing and the logits f32 `[n, numExperts]`.
 */
export function moeRouter(
  x: Float32Array,
  n: number,
  gate: PackedBf16Weights,
  topK: number,
  routedScalingFactor: number,
  options: MoeRouteOptions = {},
): MoeRouting & { logits: Float32Array } {
  const logits = gemmBf16(x, n, gate);
  return { ...moeRoute(logits, n, gate.n, topK, routedScalingFactor, options), logits };
}

function prepare(
  call: string,
  x: Float32Array,
  n: number,
  set: MoeExpertSet,
  routing: MoeRouting,
  out?: Float32Array,
): MoeExpertsRawArgs {
  expectInt(call, 'n', n, 0);
  if (typeof set !== 'object' || set === null || !Array.isArray(set.w13)) fail(call, 'experts', 'a MoeExpertSet', set);
  if (typeof routing !== 'object' || routing === null) fail(call, 'routing', '{ topK, ids, weights }', routing);
  const topK = expectInt(call, 'routing.topK', routing.topK, 1);
  expectArray(call, 'x', x, Float32Array, n * set.hidden, 'n*hidden');
  const ids = expectArray(call, 'routing.ids', routing.ids, Int32Array, n * topK, 'n*topK');
  for (let i = 0; i < ids.length; i++) {
    if (!(ids[i]! >= 0 && ids[i]! < set.numExperts))
      fail(call, `routing.ids[${i}]`, `an expert id in [0, ${set.numExperts})`, ids[i]);
  }
  expectArray(call, 'routing.weights', routing.weights, Float32Array, n * topK, 'n*topK');
  const y = outArray(call, out, Float32Array, n * set.hidden, 'n*hidden');
  return [
    x,
    n,
    set.hidden,
    ids,
    routing.weights,
    topK,
    set.inter,
    set.w13,
    set.w2,
    set.sharedW13,
    set.sharedW2,
    set.sharedInter,
    y,
  ];
}

/**
 * Routed experts + shared expert for n tokens (module comment).
 * @param x f32 `[n, hidden]`; @param routing from `moeRoute` (any ids in [0, numExperts)).
 * @param out optional f32 `[n, hidden]` (must not alias x).
 * @returns f32 `[n, hidden]`.
 * @throws SpecdArgumentError on a wrong type, length or expert id.
 */
export function moeExperts(
  x: Float32Array,
  n: number,
  experts: MoeExpertSet,
  routing: MoeRouting,
  out?: Float32Array,
): Float32Array {
  const args = prepare('moeExperts', x, n, experts, routing, out);
  addon.moeExperts(...args);
  return args[12];
}

/**
 * `moeExperts` on a libuv thread (long prefill). Do not write x, routing or the weights, nor read
 * out, until the Promise settles.
 */
export function moeExpertsAsync(
  x: Float32Array,
  n: number,
  experts: MoeExpertSet,
  routing: MoeRouting,
  out?: Float32Array,
): Promise<Float32Array> {
  const args = prepare('moeExpertsAsync', x, n, experts, routing, out);
  return addon.moeExpertsAsync(...args).then(() => args[12]);
}
