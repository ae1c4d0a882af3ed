/**
 * Reading model weights from a checkpoint for the native kernels: bf16 matrices packed for
 * `gemmBf16` (several matrices sharing an input may be stacked by rows into one GEMM), norms and
 * fp32 parameters as f32. Accepts BF16 or F32 tensors everywhere: F32 matrices are rounded to bf16
 * (nearest even; the project runs bf16 weights), bf16 parameters are widened exactly to f32.
 * Shared by every model and drafter plugin.
 */

import { bf16ToF32, f32ToBf16, packBf16Weights, type PackedBf16Weights } from '@specd/native';

import type { SafetensorsCheckpoint } from './safetensors-checkpoint.js';

/** Options of {@link WeightReader}. */
export interface WeightReaderOptions {
  /** Tensors the caller will read, for progress reporting (default 0 = unknown). */
  total?: number;
  /** Called after each tensor is read: (tensors read so far, total, tensor name). */
  onTensor?: (done: number, total: number, name: string) => void;
  /** Builds the error thrown for a missing tensor or a wrong shape/dtype (default: plain Error). */
  makeError?: (message: string) => Error;
}

/**
 * Reads tensors of one checkpoint, checking each against the shape the caller expects.
 * A tensor matches when its shape equals `shape`, or, for a different rank, when the element counts
 * agree (checkpoints store e.g. Kimi's A_log as `[1, 1, H, 1]` for an `[H]` parameter).
 * @throws the error from `makeError` naming the tensor: missing, wrong shape, dtype not BF16/F32.
 */
export class WeightReader {
  private done = 0;
  private readonly makeError: (message: string) => Error;

  constructor(
    private readonly ckpt: SafetensorsCheckpoint,
    private readonly options: WeightReaderOptions = {},
  ) {
    this.makeError = options.makeError ?? ((m) => new Error(m));
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
   * Stacks matrices `[n_i, k]` (same k) by rows and packs them: one GEMM computes all outputs,
   * `[m, Σ n_i]`, in the given order. Each output column is computed exactly as in a separate GEMM.
   */
  packedRows(names: readonly string[], rows: readonly number[], k: number): PackedBf16Weights {
    const n = rows.reduce((a, b) => a + b, 0);
    const all = new Uint16Array(n * k);
    let at = 0;
    names.forEach((name, i) => {
      all.set(this.bf16(name, [rows[i]!, k]), at);
      at += rows[i]! * k;
    });
    return packBf16Weights(all, n, k);
  }

  private read(name: string, shape: readonly number[]): { dtype: string; data: Uint16Array | Float32Array } {
    const got = this.shape(name);
    const numel = (s: readonly number[]) => s.reduce((a, b) => a * b, 1);
    if (numel(got) !== numel(shape) || (got.length === shape.length && got.some((d, i) => d !== shape[i]))) {
      throw this.makeError(`tensor ${JSON.stringify(name)}: expected shape [${shape.join(', ')}], got [${got.join(', ')}]`);
    }
    const dtype = this.ckpt.info(name).dtype;
    if (dtype !== 'BF16' && dtype !== 'F32') {
      throw this.makeError(`tensor ${JSON.stringify(name)}: expected dtype BF16 or F32, got ${dtype}`);
    }
    const t = this.ckpt.read(name);
    this.done++;
    this.options.onTensor?.(this.done, this.total, name);
    return { dtype, data: t.data as Uint16Array | Float32Array };
  }
}
