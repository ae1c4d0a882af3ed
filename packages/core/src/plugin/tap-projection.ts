/**
 * The context projection of drafters that read concatenated target taps through one linear layer
 * (`fc.weight` `[D, T·D]`: DFlash, DSpark, EAGLE-3; REFERENCE.md §3, §5, §8): fc(concat(h_1 … h_T)) =
 * Σ_i h_i · W_iᵀ with W_i the column block of tap i. Split by tap, the sum can be computed where the
 * taps are produced — each pipeline stage adds its own taps' products into an fp32 accumulator
 * `[n, D]` and hands it on — and only the last stage applies the norm and writes the draft KV.
 *
 * Bit-exact across partitions: every configuration (pp = 1 included) adds the products one tap at a
 * time, in ascending tap order, into the accumulator (acc ← acc + h_i·W_iᵀ, fp32: each dot product
 * reduced in a fixed order, batch-invariantly, then added once to the accumulator — one fused
 * `gemmBf16Accumulate` per tap, or in the `'q8_0'` format a `gemmQuant` then an `addF32`). So the sum is
 * ((h_a·W_aᵀ + h_b·W_bᵀ) + h_c·W_cᵀ) whether taps a, b, c are produced by one stage or three, and
 * whether the rows are projected in one call or in several (docs/ARCHITECTURE.md, "Pipeline
 * parallelism"; the error against float64 of this sum vs one concatenated projection and vs bf16
 * partials: docs/BENCHMARKS.md, "Partial projection numerics").
 *
 * Formats ({@link ProjectionFormat}): `'bf16'`, the checkpoint's blocks packed (fp32 activations); `'q8_0'`, each
 * block quantized at load to GGUF Q8_0 and run by `gemmQuant` with int16 activations (8.5 bits a weight instead of
 * 16; on an AVX-512 CPU without AMX 45 % less time a call in the engine at one sequence, about even at 16 rows, 25 %
 * more from a cold cache at 8: docs/BENCHMARKS.md, "The context projection in Q8_0"). A
 * block with a non-finite weight (loaded only under checkpoint sanity "warn") stays bf16. Every stage of a pipeline
 * must use the drafter's format (`ProjectionSpec.format`): the bits depend on it.
 */

import { addF32, gemmBf16Accumulate, packBf16Weights } from '@specd/native';

import { sliceColumns } from '../util/columns.js';
import type { TensorRead, WeightReader } from '../io/weight-reader.js';
import { q8_0LinearIfFinite } from '../model/quant-linear.js';
import type { BlockLinear } from '../model/dense-block.js';
import { DrafterError, type PartialProjection, type ProjectionFormat } from './drafter-plugin.js';

/**
 * The column blocks of `fc.weight` for some taps (all of a drafter's taps, or one stage's), and the
 * accumulate-by-tap projection over them.
 */
export class TapProjection implements PartialProjection {
  /**
   * @param allTaps every tap of the drafter, in checkpoint (column block) order.
   * @param blocks tap id → its `[D, D]` column block of fc, packed for `gemmBf16` or as a Q8_0 linear map (the
   *   taps this projection serves).
   * @param hiddenSize D.
   * @param where the error prefix (method name).
   * @param reads the tensor reads that built it (what a stage loaded).
   */
  constructor(
    readonly allTaps: readonly number[],
    private readonly blocks: ReadonlyMap<number, BlockLinear>,
    readonly hiddenSize: number,
    private readonly where: string,
    readonly reads: readonly TensorRead[] = [],
    /** The blocks' format (see the module comment). */
    readonly format: ProjectionFormat = 'bf16',
  ) {}

  /** A Q8_0 block's product, before it is added to the accumulator (`[numTokens, D]` f32; grown on demand). */
  private scratch = new Float32Array(0);

  /** The taps this projection has blocks for (ascending). */
  get taps(): readonly number[] {
    return [...this.blocks.keys()].sort((a, b) => a - b);
  }

  /**
   * Reads `name` `[D, allTaps.length · D]` from `reader` and packs the column blocks of `taps`
   * (default all) in `format` (default `'bf16'`). A strict subset reads only those columns
   * (`WeightReader.bf16Block`).
   * @throws {DrafterError} for a tap not in `allTaps`, a mis-shaped tensor, or `'q8_0'` with D not a multiple of 32.
   */
  static read(
    reader: WeightReader,
    name: string,
    hiddenSize: number,
    allTaps: readonly number[],
    where: string,
    taps: readonly number[] = allTaps,
    format: ProjectionFormat = 'bf16',
  ): TapProjection {
    const D = hiddenSize;
    if (format === 'q8_0' && D % 32 !== 0)
      throw new DrafterError(`${where}: a q8_0 context projection needs the hidden size a multiple of 32, got ${D}`);
    const pack = (bits: Uint16Array): BlockLinear =>
      format === 'q8_0' ? q8_0LinearIfFinite(bits, D, D) : packBf16Weights(bits, D, D);
    const nT = allTaps.length;
    const shape = reader.shape(name);
    if (shape.length !== 2 || shape[0] !== D || shape[1] !== nT * D) {
      throw new DrafterError(
        `${where}: ${name} is [${shape.join(', ')}], expected [${D}, ${nT * D}] ` +
          `(hidden ${D}, taps × hidden = ${nT} × ${D})`,
      );
    }
    const bad = taps.filter((t) => !allTaps.includes(t));
    if (bad.length > 0)
      throw new DrafterError(
        `${where}: taps [${bad.join(', ')}] are not among the drafter's taps [${allTaps.join(', ')}]`,
      );
    const before = reader.reads.length;
    const blocks = new Map<number, BlockLinear>();
    if (taps.length === nT) {
      const fc = reader.bf16(name, [D, nT * D]);
      allTaps.forEach((t, i) => {
        blocks.set(t, pack(sliceColumns(fc, D, nT * D, i * D, D)));
      });
    } else {
      for (const t of taps) {
        const i = allTaps.indexOf(t);
        blocks.set(t, pack(reader.bf16Block(name, D, nT * D, { cols: [i * D, (i + 1) * D] })));
      }
    }
    return new TapProjection(allTaps, blocks, D, where, reader.reads.slice(before), format);
  }

  /**
   * acc ← acc + Σ_{tap ∈ stageTaps, ascending} h_tap · W_tapᵀ, one tap at a time (see the module comment).
   * @param stageTaps tap id → `[numTokens, D]` f32 (may be empty: the accumulator passes through).
   * @param accumulator `[numTokens, D]` f32, updated in place; created zeroed when absent.
   * @returns the accumulator.
   * @throws {DrafterError} for a tap this projection has no block for, or a mis-sized tap / accumulator.
   */
  projectTargetHiddenPartial(
    stageTaps: ReadonlyMap<number, Float32Array>,
    numTokens: number,
    accumulator?: Float32Array,
  ): Float32Array {
    const D = this.hiddenSize;
    const acc = accumulator ?? new Float32Array(numTokens * D);
    if (acc.length !== numTokens * D)
      throw new DrafterError(
        `${this.where}: projectTargetHiddenPartial: accumulator: expected [${numTokens}, ${D}] f32, ` +
          `got length ${acc.length}`,
      );
    const order = [...stageTaps].sort(([a], [b]) => a - b);
    for (const [tap, h] of order) {
      const w = this.blocks.get(tap);
      if (w === undefined) {
        const held = this.taps;
        const known = held.length === this.allTaps.length ? this.allTaps : held;
        throw new DrafterError(
          `${this.where}: projectTargetHiddenPartial: stageTaps: tap ${tap} is not one of [${known.join(', ')}]`,
        );
      }
      if (h.length !== numTokens * D)
        throw new DrafterError(
          `${this.where}: projectTargetHiddenPartial: tap ${tap}: expected [${numTokens}, ${D}] f32, ` +
            `got length ${h.length}`,
        );
      if (numTokens === 0) continue;
      if ('apply' in w) {
        if (this.scratch.length < numTokens * D) this.scratch = new Float32Array(numTokens * D);
        const part = this.scratch.subarray(0, numTokens * D);
        w.apply(h, numTokens, part);
        addF32(acc, part, acc);
      } else gemmBf16Accumulate(h, numTokens, w, acc);
    }
    return acc;
  }

  /** Drops the blocks. */
  dispose(): void {
    (this.blocks as Map<number, BlockLinear>).clear();
    this.scratch = new Float32Array(0);
  }
}
