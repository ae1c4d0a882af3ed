/**
 * Reading Kimi weights from a checkpoint: bf16 matrices packed for `gemmBf16` (several matrices
 * sharing an input may be stacked by rows into one GEMM), norms and fp32 parameters as f32.
 * Accepts BF16 or F32 tensors everywhere (F32 matrices are rounded to bf16, nearest even: the
 * project runs bf16 weights; fp32 parameters stay fp32, as in the reference's FP32_PARAMS).
 */

import type { SafetensorsCheckpoint } from '@specd/core';
import { bf16ToF32, f32ToBf16, packBf16Weights, type PackedBf16Weights } from '@specd/native';

/** Thrown for a missing tensor or one with a wrong shape / dtype; names the tensor. */
export class KimiWeightError extends Error {
  override readonly name = 'KimiWeightError';
}

/** Reads tensors of one checkpoint and counts them for progress reporting. */
export class WeightReader {
  private done = 0;

  constructor(
    private readonly ckpt: SafetensorsCheckpoint,
    /** Tensors the stage will read (for progress). */
    readonly total: number,
    private readonly onTensor?: (done: number, total: number, name: string) => void,
  ) {}

  /** bf16 bits `[prod(shape)]` of `name`. @throws {KimiWeightError} if missing, shape differs, or dtype not BF16/F32. */
  bf16(name: string, shape: readonly number[]): Uint16Array {
    const t = this.read(name, shape);
    return t.dtype === 'BF16' ? (t.data as Uint16Array) : f32ToBf16(t.data as Float32Array);
  }

  /** f32 values `[prod(shape)]` of `name` (bf16 widened exactly). @throws {KimiWeightError} as {@link bf16}. */
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
    if (!this.ckpt.has(name)) throw new KimiWeightError(`checkpoint has no tensor ${JSON.stringify(name)}`);
    const info = this.ckpt.info(name);
    const numel = (s: readonly number[]) => s.reduce((a, b) => a * b, 1);
    if (numel(info.shape) !== numel(shape) || (info.shape.length === shape.length && info.shape.some((d, i) => d !== shape[i]))) {
      throw new KimiWeightError(`tensor ${JSON.stringify(name)}: expected shape [${shape.join(', ')}], got [${info.shape.join(', ')}]`);
    }
    if (info.dtype !== 'BF16' && info.dtype !== 'F32') {
      throw new KimiWeightError(`tensor ${JSON.stringify(name)}: expected dtype BF16 or F32, got ${info.dtype}`);
    }
    const t = this.ckpt.read(name);
    this.done++;
    this.onTensor?.(this.done, this.total, name);
    return { dtype: info.dtype, data: t.data as Uint16Array | Float32Array };
  }
}
