/**
 * A {@link BlockLinear} over weights quantized at load to GGUF Q8_0 (a drafter's `weights: "q8_0"` or `"q8_0_int8"`
 * setting): core's {@link quantizeQ8_0} of the bf16 matrix, then `@specd/native` `gemmQuant` with int16 activations
 * (`"q8_0"`: each row of x quantized per 32-block to 16 bits, two VNNI products a weight; ~4e-5 relative per GEMM
 * against fp32 activations on the same weights: native/src/quant.ts) or int8 activations (`"q8_0_int8"`: 8 bits, one
 * VNNI product a weight, half the dot-product work; ~7e-3 relative per GEMM, docs/BENCHMARKS.md "int16
 * activations"). Batch invariant as every `gemmQuant` path: row i of a GEMM is the GEMV of row i bit for bit, so a
 * drafter's proposals do not depend on how many sequences draft together.
 */

import { bf16ToF32, gemmQuant, isa, packBf16Weights, quantizedWeights } from '@specd/native';

import { quantizeQ8_0 } from '../io/gguf-quant.js';
import type { WeightReader } from '../io/weight-reader.js';
import { DrafterError, type ProjectionFormat } from '../plugin/drafter-plugin.js';
import type { BlockLinear } from './dense-block.js';
import { packShard, type ShardPart, type WeightShard } from './shard-weights.js';

/**
 * A drafter's `weights` setting: its draft model's projections as the checkpoint's packed bf16, or quantized to Q8_0
 * at load and run with int16 (`'q8_0'`) or int8 (`'q8_0_int8'`) activations ({@link packLinear}).
 */
export type DraftWeightFormat = 'bf16' | 'q8_0' | 'q8_0_int8';

/** The accepted values of a drafter's `weights` setting. */
export const DRAFT_WEIGHT_FORMATS: readonly DraftWeightFormat[] = Object.freeze(['bf16', 'q8_0', 'q8_0_int8']);

/** Whether a `weights` setting is one of the Q8_0 formats (CPU only; whole matrices, input widths multiples of 32). */
export function isQ8_0Format(f: DraftWeightFormat | undefined): f is 'q8_0' | 'q8_0_int8' {
  return f === 'q8_0' || f === 'q8_0_int8';
}

/**
 * The `weights` default of a block drafter's CPU draft layers (DFlash, DSpark) on this machine: `'q8_0_int8'` on the
 * AVX-512 path without AMX, where the int8 VNNI dot products run a 16-row draft block in about half the time of bf16
 * weights with fp32 activations (docs/BENCHMARKS.md, "Draft layers in Q8_0 with int8 activations"); `'bf16'` where
 * AMX-BF16 tiles run the bf16 weights, on the portable path, and wherever `blocker` ({@link q8_0Blocker}) says Q8_0
 * cannot hold them.
 */
export function blockDrafterWeightsDefault(blocker: string | undefined): DraftWeightFormat {
  const i = isa();
  return blocker === undefined && i.isa === 'avx512' && !i.amxAvailable ? 'q8_0_int8' : 'bf16';
}

/**
 * The context projection's format (core's TapProjection) that goes with a drafter's resolved `weights` setting:
 * `'bf16'` for `'bf16'`, `'q8_0'` (Q8_0 blocks, int16 activations) for either Q8_0 format. int16, not int8, for
 * `'q8_0_int8'` too: the projection reads the target's residual stream, whose outlier channels int8 blocks would
 * flatten, and it runs a few rows a step, where int16 costs what int8 does (docs/BENCHMARKS.md, "The context
 * projection in Q8_0").
 */
export function projectionFormatOf(weights: DraftWeightFormat): ProjectionFormat {
  return weights === 'bf16' ? 'bf16' : 'q8_0';
}

/**
 * A drafter's `weights` setting checked (undefined stays undefined: the drafter's default), as `drafterDevice` checks
 * `device` for callers that bypass the config schema.
 * @throws {DrafterError} "`method`: settings.weights: expected "bf16" or "q8_0", got …".
 */
export function draftWeightFormat(method: string, value: unknown): DraftWeightFormat | undefined {
  if (value === undefined) return undefined;
  if (!DRAFT_WEIGHT_FORMATS.includes(value as DraftWeightFormat))
    throw new DrafterError(
      `${method}: settings.weights: expected ${DRAFT_WEIGHT_FORMATS.map((f) => JSON.stringify(f)).join(' or ')}, ` +
        `got ${JSON.stringify(value)}`,
    );
  return value as DraftWeightFormat;
}

/**
 * Why Q8_0 weights cannot hold a draft model's projections, or undefined when they can: under tensor parallelism
 * (`tpSize` > 1: {@link packLinear} quantizes whole matrices) or with an input width that is not a multiple of 32
 * (Q8_0 blocks run along k). The drafters refuse an explicit `weights: "q8_0"` with it and default to bf16.
 */
export function q8_0Blocker(inputWidths: readonly number[], tpSize: number): string | undefined {
  if (tpSize > 1) return `is not supported under tensor parallelism (tp = ${tpSize})`;
  const odd = [...new Set(inputWidths)].filter((x) => x % 32 !== 0);
  if (odd.length > 0)
    return (
      "needs every projection's input width to be a multiple of 32 (Q8_0 blocks); this draft model has " +
      odd.join(', ')
    );
  return undefined;
}

/** A Q8_0 linear map `[rows, k]` → `[rows, n]` f32. */
export type Q8_0Linear = Extract<BlockLinear, { apply: unknown }> & { readonly k: number };

/**
 * Quantizes `w` `[n, k]` bf16 (row-major bit patterns, as a checkpoint stores them) to Q8_0 and packs it for
 * `gemmQuant`: `apply(x [rows, k] f32, rows, out?)` → `[rows, n]` f32, x quantized to `act` (`'int16'` default,
 * `'int8'`) per 32-block. Reads 8.5 bits a weight instead of 16.
 * @throws {RangeError} if k is not a multiple of 32 or a weight is not finite (quantizeQ8_0); SpecdArgumentError
 *   on a wrong length.
 */
export function q8_0Linear(w: Uint16Array, n: number, k: number, act: 'int16' | 'int8' = 'int16'): Q8_0Linear {
  if (w.length !== n * k) throw new RangeError(`q8_0Linear: w has ${w.length} values, expected n·k = ${n * k}`);
  const packed = quantizedWeights(quantizeQ8_0(bf16ToF32(w), n, k), 'q8_0', n, k);
  return { n, k, apply: (x, rows, out) => gemmQuant(x, rows, packed, out, act) };
}

/**
 * A drafter's projection from the row blocks `parts` (stacked in order, one `k`) in the weight format of its `weights`
 * setting: `'bf16'` packs them ({@link packShard}: the rank's blocks under `shard`), `'q8_0'` / `'q8_0_int8'` quantize
 * the whole matrices ({@link q8_0Linear} with int16 / int8 activations). With `bf16IfNonFinite` (a format the user
 * did not ask for: a default), a matrix with a non-finite weight — which Q8_0 cannot hold, loaded only under checkpoint
 * sanity "warn" — is packed bf16 instead, so such a checkpoint loads as it would have in bf16.
 * @throws {RangeError} for a Q8_0 format with a shard over more than one rank (the callers refuse that setting under
 *   tensor parallelism first, naming it), or as q8_0Linear (a non-finite weight without `bf16IfNonFinite`); what
 *   packShard and the reader throw on a missing or mis-shaped tensor.
 */
export function packLinear(
  r: WeightReader,
  parts: readonly ShardPart[],
  shard: WeightShard | undefined,
  format: DraftWeightFormat,
  bf16IfNonFinite = false,
): BlockLinear {
  if (format === 'bf16') return packShard(r, parts, shard);
  if (shard !== undefined && shard.layout.size > 1)
    throw new RangeError(`packLinear: q8_0 weights are whole matrices, not a shard of ${shard.layout.size} ranks`);
  const rows = parts.map((x) => x.n);
  const n = rows.reduce((a, b) => a + b, 0);
  const k = parts[0]!.k;
  const bits = r.bf16Rows(
    parts.map((x) => x.name),
    rows,
    k,
  );
  const act = format === 'q8_0_int8' ? 'int8' : 'int16';
  return bf16IfNonFinite ? q8_0LinearIfFinite(bits, n, k, act) : q8_0Linear(bits, n, k, act);
}

/**
 * {@link q8_0Linear} of `w` `[n, k]` bf16, or `w` packed bf16 when a weight is not finite (Q8_0 cannot hold it; such a
 * checkpoint loads only under checkpoint sanity "warn"), so it runs as it would have in bf16.
 * @throws {RangeError} as q8_0Linear for k not a multiple of 32 or a wrong length.
 */
export function q8_0LinearIfFinite(w: Uint16Array, n: number, k: number, act: 'int16' | 'int8' = 'int16'): BlockLinear {
  // bf16 Inf / NaN: every exponent bit set
  return w.some((b) => (b & 0x7f80) === 0x7f80) ? packBf16Weights(w, n, k) : q8_0Linear(w, n, k, act);
}
