/**
 * Reading model weights from a checkpoint for the native kernels: bf16 matrices packed for
 * `gemmBf16` (several matrices sharing an input may be stacked by rows into one GEMM), norms and
 * fp32 parameters as f32. Accepts BF16 or F32 tensors everywhere: F32 matrices are rounded to bf16
 * (nearest even; the project runs bf16 weights), bf16 parameters are widened exactly to f32.
 * Shared by every model and drafter plugin.
 */

import { bf16ToF32, f32ToBf16, packBf16Weights, type PackedBf16Weights } from '@specd/native';

import { CheckpointSanity } from './checkpoint-sanity.js';
import type { SafetensorsCheckpoint } from './safetensors-checkpoint.js';

/** Options of {@link WeightReader}. */
export interface WeightReaderOptions {
  /** Tensors the caller will read, for progress reporting (default 0 = unknown). */
  total?: number;
  /** Called after each tensor is read: (tensors read so far, total, tensor name). */
  onTensor?: (done: number, total: number, name: string) => void;
  /** Builds the error thrown for a missing tensor or a wrong shape/dtype (default: plain Error). */
  makeError?: (message: string) => Error;
  /**
   * The load's sanity policy: every tensor and block read is scanned for non-finite values and reported
   * through it (default: a fresh {@link CheckpointSanity}, mode `'refuse'`).
   */
  sanity?: CheckpointSanity;
}

/** One read of {@link WeightReader}: a whole tensor, or a block of it (tensor-parallel shards). */
export interface TensorRead {
  readonly name: string;
  /** Rows [start, end) along dimension 0 (absent: all rows). */
  readonly rows?: readonly [number, number];
  /** Columns [start, end) of a matrix (absent: all columns). */
  readonly cols?: readonly [number, number];
  /** Elements [start, end) of the flattened tensor (absent: all). */
  readonly elements?: readonly [number, number];
}

/** The part of a matrix to read: rows and/or columns (default: all). */
export interface MatrixBlock {
  readonly rows?: readonly [number, number];
  readonly cols?: readonly [number, number];
}

/**
 * Reads tensors of one checkpoint, checking each against the shape the caller expects and scanning
 * what it reads for non-finite values (`options.sanity`).
 * A tensor matches when its shape equals `shape` once dimensions of size 1 are dropped from both
 * (checkpoints store e.g. Kimi's A_log as `[1, 1, H, 1]` for an `[H]` parameter); a flattened or
 * reshaped tensor with the same element count (`[n·k]` for `[n, k]`, `[k, n]`) is refused.
 * @throws the error from `makeError` naming the tensor: missing, wrong shape, dtype not BF16/F32;
 *   {@link CheckpointSanityError} for a non-finite value in mode `'refuse'`.
 */
export class WeightReader {
  private done = 0;
  /** Every read, in order: whole tensors and the row / column / element blocks of sharded ones. */
  readonly reads: TensorRead[] = [];
  private readonly makeError: (message: string) => Error;
  /** The load's sanity policy (non-finite values). */
  readonly sanity: CheckpointSanity;

  constructor(
    private readonly ckpt: SafetensorsCheckpoint,
    private readonly options: WeightReaderOptions = {},
  ) {
    this.makeError = options.makeError ?? ((m) => new Error(m));
    this.sanity = options.sanity ?? new CheckpointSanity();
  }

  /** Tensors the caller announced it will read. */
  get total(): number {
    return this.options.total ?? 0;
  }

  /** Whether the checkpoint holds `name`. */
  has(name: string): boolean {
    return this.ckpt.has(name);
  }

  /** The stored shape of `name`. @throws if missing. */
  shape(name: string): readonly number[] {
    if (!this.ckpt.has(name)) throw this.makeError(`checkpoint has no tensor ${JSON.stringify(name)}`);
    return this.ckpt.info(name).shape;
  }

  /** bf16 bits `[prod(shape)]` of `name`. */
  bf16(name: string, shape: readonly number[]): Uint16Array {
    const t = this.read(name, shape);
    return t.dtype === 'BF16' ? (t.data as Uint16Array) : f32ToBf16(t.data as Float32Array);
  }

  /** f32 values `[prod(shape)]` of `name` (bf16 widened exactly). */
  f32(name: string, shape: readonly number[]): Float32Array {
    const t = this.read(name, shape);
    return t.dtype === 'F32' ? (t.data as Float32Array) : bf16ToF32(t.data as Uint16Array);
  }

  /**
   * bf16 bits of a block of the matrix `name` `[n, k]`: rows [r0, r1) and columns [c0, c1)
   * (row-major `[r1 − r0, c1 − c0]`). Reads only those bytes: one range for a row block, one range
   * per row for a column block (tensor-parallel shards).
   */
  bf16Block(name: string, n: number, k: number, block: MatrixBlock = {}): Uint16Array {
    const [r0, r1] = block.rows ?? [0, n];
    const [c0, c1] = block.cols ?? [0, k];
    if (!(0 <= r0 && r0 < r1 && r1 <= n && 0 <= c0 && c0 < c1 && c1 <= k)) {
      throw this.makeError(
        `tensor ${JSON.stringify(name)}: block rows [${r0}, ${r1}) cols [${c0}, ${c1}) outside [${n}, ${k}]`,
      );
    }
    if (r0 === 0 && r1 === n && c0 === 0 && c1 === k) return this.bf16(name, [n, k]);
    const dtype = this.check(name, [n, k]);
    const eb = dtype === 'BF16' ? 2 : 4;
    const w = c1 - c0;
    const out = new Uint16Array((r1 - r0) * w);
    const put = (bytes: Uint8Array, at: number) => {
      const copy = new Uint8Array(bytes.length);
      copy.set(bytes);
      const raw = eb === 2 ? new Uint16Array(copy.buffer) : new Float32Array(copy.buffer);
      const flat = (r0 + Math.floor(at / w)) * k + c0;
      this.sanity.checkFinite(this.fileName(name), name, [n, k], raw, flat);
      out.set(raw instanceof Uint16Array ? raw : f32ToBf16(raw), at);
    };
    if (c0 === 0 && c1 === k) put(this.ckpt.readBytes(name, r0 * k * eb, r1 * k * eb), 0);
    else
      for (let r = r0; r < r1; r++) put(this.ckpt.readBytes(name, (r * k + c0) * eb, (r * k + c1) * eb), (r - r0) * w);
    this.logRead({
      name,
      ...(block.rows === undefined ? {} : { rows: [r0, r1] as const }),
      ...(block.cols === undefined ? {} : { cols: [c0, c1] as const }),
    });
    return out;
  }

  /** f32 values of elements [start, end) of the flattened tensor `name` (expected `shape`); reads only those bytes. */
  f32Range(name: string, shape: readonly number[], start: number, end: number): Float32Array {
    const numel = shape.reduce((a, b) => a * b, 1);
    if (!(0 <= start && start < end && end <= numel))
      throw this.makeError(`tensor ${JSON.stringify(name)}: elements [${start}, ${end}) outside [0, ${numel})`);
    if (start === 0 && end === numel) return this.f32(name, shape);
    const dtype = this.check(name, shape);
    const eb = dtype === 'BF16' ? 2 : 4;
    const bytes = this.ckpt.readBytes(name, start * eb, end * eb);
    const copy = new Uint8Array(bytes.length);
    copy.set(bytes);
    const raw = eb === 4 ? new Float32Array(copy.buffer) : new Uint16Array(copy.buffer);
    this.sanity.checkFinite(this.fileName(name), name, shape, raw, start);
    this.logRead({ name, elements: [start, end] });
    return raw instanceof Float32Array ? raw : bf16ToF32(raw);
  }

  /**
   * {@link packedRows} over blocks: stacks `parts` (each a block of a matrix `[n, k]` with the same
   * column count after blocking) by rows and packs them for one GEMM.
   */
  packedBlocks(
    parts: readonly { readonly name: string; readonly n: number; readonly k: number; readonly block?: MatrixBlock }[],
  ): PackedBf16Weights {
    const mats = parts.map((p) => {
      const b = p.block ?? {};
      const rows = b.rows === undefined ? p.n : b.rows[1] - b.rows[0];
      const cols = b.cols === undefined ? p.k : b.cols[1] - b.cols[0];
      return { data: this.bf16Block(p.name, p.n, p.k, b), rows, cols };
    });
    const k = mats[0]!.cols;
    if (mats.some((m) => m.cols !== k))
      throw this.makeError(`packedBlocks: blocks of ${parts.map((p) => p.name).join(', ')} have different widths`);
    const n = mats.reduce((a, m) => a + m.rows, 0);
    const all = new Uint16Array(n * k);
    let at = 0;
    for (const m of mats) {
      all.set(m.data, at);
      at += m.data.length;
    }
    return packBf16Weights(all, n, k);
  }

  /**
   * Stacks matrices `[n_i, k]` (same k) by rows and packs them: one GEMM computes all outputs,
   * `[m, Σ n_i]`, in the given order. Each output column is computed exactly as in a separate GEMM.
   */
  packedRows(names: readonly string[], rows: readonly number[], k: number): PackedBf16Weights {
    const n = rows.reduce((a, b) => a + b, 0);
    return packBf16Weights(this.bf16Rows(names, rows, k), n, k);
  }

  /**
   * Matrices `names[i]` `[rows[i], k]` (same k) stacked by rows as bf16 bits `[Σ rows, k]` row-major, unpacked (the
   * layout a GPU runner uploads: q|k|v or gate|up in one GEMM).
   */
  bf16Rows(names: readonly string[], rows: readonly number[], k: number): Uint16Array {
    const all = new Uint16Array(rows.reduce((a, b) => a + b, 0) * k);
    let at = 0;
    names.forEach((name, i) => {
      all.set(this.bf16(name, [rows[i]!, k]), at);
      at += rows[i]! * k;
    });
    return all;
  }

  private logRead(r: TensorRead): void {
    this.reads.push(r);
    this.done++;
    this.options.onTensor?.(this.done, this.total, r.name);
  }

  /** Checks shape and dtype of `name`; returns the dtype. */
  private check(name: string, shape: readonly number[]): 'BF16' | 'F32' {
    const got = this.shape(name);
    const squeeze = (s: readonly number[]) => s.filter((d) => d !== 1);
    const [a, b] = [squeeze(got), squeeze(shape)];
    if (a.length !== b.length || a.some((d, i) => d !== b[i])) {
      throw this.makeError(
        `tensor ${JSON.stringify(name)} in ${this.fileName(name)}: expected shape [${shape.join(', ')}] ` +
          `(from the config), got [${got.join(', ')}]`,
      );
    }
    const dtype = this.ckpt.info(name).dtype;
    if (dtype !== 'BF16' && dtype !== 'F32') {
      throw this.makeError(`tensor ${JSON.stringify(name)}: expected dtype BF16 or F32, got ${dtype}`);
    }
    return dtype;
  }

  private read(name: string, shape: readonly number[]): { dtype: string; data: Uint16Array | Float32Array } {
    const dtype = this.check(name, shape);
    const data = this.ckpt.read(name).data as Uint16Array | Float32Array;
    this.sanity.checkFinite(this.fileName(name), name, shape, data);
    this.logRead({ name });
    return { dtype, data };
  }

  /** The file holding `name` (for messages). */
  private fileName(name: string): string {
    return this.ckpt.fileOf(name).path;
  }
}
