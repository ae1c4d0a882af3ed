/**
 * The target's taps of a drafter's context rows, packed side by side for a drafter that projects them on a device
 * (the GPU drafters of EAGLE-3 and DFlash): there `projectTargetHiddenPartial` does no arithmetic, it returns the
 * rows' taps concatenated in the drafter's tap order — `[numTokens, T·D]` f32, row r = the taps' rows r (fc's column
 * blocks) — and `writeProjectedContextKV` hands them to the device, which computes fc there. The packs are
 * remembered by identity, so a write can tell them from a projection made elsewhere (`[n, D]` f32, the contract's).
 */

import { DrafterError } from './drafter-plugin.js';

/** Packs taps for a device drafter (module comment). */
export class PackedTaps {
  private readonly packs = new WeakSet<Float32Array>();
  /**
   * Packs of a step's rows (≤ reuseRows) reuse one buffer, `[n, T·D]` views of it by n, while no view of it is lent
   * out (returned by {@link pack} and not yet handed over); larger packs and a second pack while one is lent get their
   * own array.
   */
  private readonly buffer: Float32Array;
  private readonly views: Float32Array[] = [];
  private lent = false;

  /**
   * @param method the drafter's name (prefixes every error).
   * @param taps the drafter's taps in fc's column order.
   * @param hiddenSize D.
   * @param reuseRows rows a reused pack holds at most (a step's: the drafts + 1).
   */
  constructor(
    private readonly method: string,
    readonly taps: readonly number[],
    readonly hiddenSize: number,
    reuseRows: number,
  ) {
    this.buffer = new Float32Array(reuseRows * taps.length * hiddenSize);
  }

  /** T·D: floats per packed row. */
  get width(): number {
    return this.taps.length * this.hiddenSize;
  }

  /**
   * `projectTargetHiddenPartial` of a device drafter: every tap `[numTokens, D]` f32 → `[numTokens, T·D]` f32 (module
   * comment). Not a projection: only the drafter's own write reads it.
   * @throws {DrafterError} with an accumulator (a partial projection from pipeline stages: the device projects every
   *   tap at once), for a missing or foreign tap, or a tap that is not `[numTokens, D]`.
   */
  pack(stageTaps: ReadonlyMap<number, Float32Array>, numTokens: number, accumulator?: Float32Array): Float32Array {
    const D = this.hiddenSize;
    const T = this.taps.length;
    const where = `${this.method}: projectTargetHiddenPartial`;
    if (accumulator !== undefined)
      throw new DrafterError(
        `${where}: the GPU drafter projects every tap at once on the device; ` +
          'a partial projection (pipeline stages) is not supported with it',
      );
    for (const tap of stageTaps.keys())
      if (!this.taps.includes(tap))
        throw new DrafterError(`${where}: stageTaps: tap ${tap} is not one of [${this.taps.join(', ')}]`);
    for (const tap of this.taps) {
      const h = stageTaps.get(tap);
      if (h === undefined || h.length !== numTokens * D)
        throw new DrafterError(
          `${where}: tap ${tap}: expected [${numTokens}, ${D}] f32, ` +
            (h === undefined ? 'missing' : `got length ${h.length}`),
        );
    }
    const size = numTokens * T * D;
    let out: Float32Array;
    if (!this.lent && size <= this.buffer.length) {
      out = this.views[numTokens] ?? this.buffer.subarray(0, size);
      this.views[numTokens] = out;
      this.lent = true;
    } else out = new Float32Array(size);
    for (let i = 0; i < T; i++) {
      const h = stageTaps.get(this.taps[i]!)!;
      for (let r = 0; r < numTokens; r++) out.set(h.subarray(r * D, (r + 1) * D), (r * T + i) * D);
    }
    this.packs.add(out);
    return out;
  }

  /**
   * At the start of the drafter's write of `sum`: the reused buffer is free again (a later pack may overwrite it once
   * this write has copied it), and whether `sum` is one of {@link pack}'s arrays.
   */
  handOver(sum: Float32Array): boolean {
    if (sum.buffer === this.buffer.buffer) this.lent = false;
    return this.packs.has(sum);
  }

  /** After the drafter wrote `sum`: forgets it. */
  written(sum: Float32Array): void {
    this.packs.delete(sum);
  }
}
