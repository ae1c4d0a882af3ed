/**
 * One growing i32 buffer handed out as `[rows, width]` views, one view kept per row count: per-step arrays (block
 * tables of a batch) refilled each call instead of allocated. A view is valid until the next `view` call that grows
 * the buffer; a caller that hands the view to a native call which copies its arguments before returning (the CUDA
 * runners' metadata) may reuse it at once.
 */
export class Int32RowViews {
  private buffer = new Int32Array(0);
  private views: Int32Array[] = [];

  /** @param width i32 per row (≥ 0). */
  constructor(readonly width: number) {}

  /** The `[rows, width]` view (rows ≥ 0), its contents whatever the last user left. */
  view(rows: number): Int32Array {
    const n = rows * this.width;
    if (n > this.buffer.length) {
      this.buffer = new Int32Array(n);
      this.views = [];
    }
    let v = this.views[rows];
    if (v === undefined) {
      v = this.buffer.subarray(0, n);
      this.views[rows] = v;
    }
    return v;
  }
}
