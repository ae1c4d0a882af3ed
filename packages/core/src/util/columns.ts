/** Row-major tensor helpers shared by the model and drafter plugins. */

/**
 * Copies columns [col, col + width) of `src [rows, srcWidth]` (row-major) into `out [rows, width]`, or a new
 * array of the same type when `out` is absent (f32 activations, or bf16 bits as u16).
 * @throws {RangeError} if the columns are not inside `srcWidth`, `src` is not `[rows, srcWidth]` or `out` is not
 *   `[rows, width]`.
 */
export function sliceColumns<T extends Float32Array | Uint16Array>(
  src: T,
  rows: number,
  srcWidth: number,
  col: number,
  width: number,
  out?: T,
): T {
  if (!(col >= 0 && width >= 0 && col + width <= srcWidth))
    throw new RangeError(`sliceColumns: columns [${col}, ${col + width}) outside [0, ${srcWidth})`);
  if (src.length !== rows * srcWidth)
    throw new RangeError(
      `sliceColumns: src: expected [${rows}, ${srcWidth}] (${rows * srcWidth} elements), got ${src.length}`,
    );
  if (out !== undefined && out.length !== rows * width)
    throw new RangeError(`sliceColumns: out: expected ${rows * width} elements, got ${out.length}`);
  const dst = out ?? new (src.constructor as new (n: number) => T)(rows * width);
  for (let r = 0; r < rows; r++) dst.set(src.subarray(r * srcWidth + col, r * srcWidth + col + width), r * width);
  return dst;
}
