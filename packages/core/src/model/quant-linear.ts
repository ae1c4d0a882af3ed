/**
 * A {@link BlockLinear} over weights quantized at load to GGUF Q8_0 (a drafter's `weights: "q8_0"` setting): core's
 * {@link quantizeQ8_0} of the bf16 matrix, then `@specd/native` `gemmQuant` with int16 activations (each row of x
 * quantized per 32-block to 16 bits, VNNI dot products; ~4e-5 relative per GEMM against fp32 activations on the same
 * weights: native/src/quant.ts). Batch invariant as every `gemmQuant` path: row i of a GEMM is the GEMV of row i bit
 * for bit, so a drafter's proposals do not depend on how many sequences draft together.
 */

import { bf16ToF32, gemmQuant, quantizedWeights } from '@specd/native';

import { quantizeQ8_0 } from '../io/gguf-quant.js';
import type { WeightReader } from '../io/weight-reader.js';
import { DrafterError } from '../plugin/drafter-plugin.js';
import type { BlockLinear } from './dense-block.js';
import { packShard, type ShardPart, type WeightShard } from './shard-weights.js';

/**
 * A drafter's `weights` setting: its draft model's projections as the checkpoint's packed bf16 or quantized to Q8_0
 * at load ({@link packLinear}).
 */
export type DraftWeightFormat = 'bf16' | 'q8_0';

/** The accepted values of a drafter's `weights` setting. */
export const DRAFT_WEIGHT_FORMATS: readonly DraftWeightFormat[] = Object.freeze(['bf16', 'q8_0']);

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
 * `gemmQuant`: `apply(x [rows, k] f32, rows, out?)` → `[rows, n]` f32. Reads 8.5 bits a weight instead of 16.
 * @throws {RangeError} if k is not a multiple of 32 or a weight is not finite (quantizeQ8_0); SpecdArgumentError
 *   on a wrong length.
 */
export function q8_0Linear(w: Uint16Array, n: number, k: number): Q8_0Linear {
  if (w.length !== n * k) throw new RangeError(`q8_0Linear: w has ${w.length} values, expected n·k = ${n * k}`);
  const packed = quantizedWeights(quantizeQ8_0(bf16ToF32(w), n, k), 'q8_0', n, k);
  return { n, k, apply: (x, rows, out) => gemmQuant(x, rows, packed, out, 'int16') };
}

/**
 * A drafter's projection from the row blocks `parts` (stacked in order, one `k`) in the weight format of its `weights`
 * setting: `'bf16'` packs them ({@link packShard}: the rank's blocks under `shard`), `'q8_0'` quantizes the whole
 * matrices ({@link q8_0Linear}).
 * @throws {RangeError} for `'q8_0'` with a shard over more than one rank (the callers refuse that setting under
 *   tensor parallelism first, naming it), or as q8_0Linear; what packShard and the reader throw on a missing or
 *   mis-shaped tensor.
 */
export function packLinear(
  r: WeightReader,
  parts: readonly ShardPart[],
  shard: WeightShard | undefined,
  format: DraftWeightFormat,
): BlockLinear {
  if (format === 'bf16') return packShard(r, parts, shard);
  if (shard !== undefined && shard.layout.size > 1)
    throw new RangeError(`packLinear: q8_0 weights are whole matrices, not a shard of ${shard.layout.size} ranks`);
  const rows = parts.map((x) => x.n);
  const k = parts[0]!.k;
  return q8_0Linear(
    r.bf16Rows(
      parts.map((x) => x.name),
      rows,
      k,
    ),
    rows.reduce((a, b) => a + b, 0),
    k,
  );
}
