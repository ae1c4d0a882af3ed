/** Row-major tensor helpers shared by the model and drafter plugins. */

/**
 * Copies columns [col, col + width) of `src [rows, srcWidth]` (row-major) into a new `[rows, width]`
 * array of the same type (f32 activations, or bf16 bits as u16).
 * @throws {RangeError} if the columns are not inside `srcWidth` or `src` is not `[rows, srcWidth]`.
 */
export function sliceColumns<T extends Float32Array | Uint16Array>(
  src: T,
  rows: number,
  srcWidth: number,
  col: number,
  width: number,
): T {
  if (!(col >= 0 && width >= 0 && col + width <= srcWidth))
    throw new RangeError(`sliceColumns: columns [${col}, ${col + width}) outside [0, ${srcWidth})`);
  if (src.length !== rows * srcWidth)
    throw new RangeError(
      `sliceColumns: src: expected [${rows}, ${srcWidth}] (${rows * srcWidth} elements), got ${src.length}`,
    );
  const out = new (src.constructor as new (n: number) => T)(rows * width);
  for (let r = 0; r < rows; r++) out.set(src.subarray(r * srcWidth + col, r * srcWidth + col + width), r * width);
  return out;
}
