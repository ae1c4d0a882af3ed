/**
 * How a Llama stage holds its weights, independent of the file format: projections behind
 * {@link LinearWeights} (bf16 panels for the batch-invariant GEMM today; quantized GGUF blocks can
 * implement the same interface), token embeddings behind {@link EmbeddingTable}, and a
 * {@link LlamaTensorSource} that the loader reads by Hugging Face tensor name
 * (`model.layers.{l}.self_attn.q_proj.weight`, …) whatever the file (safetensors folder or GGUF).
 */

import { WeightReader, type CheckpointSanity, type SafetensorsCheckpoint } from '@specd/core';
import { bf16ToF32, gemmBf16, type PackedBf16Weights } from '@specd/native';

/** A projection Y = X·Wᵀ with W `[n, k]`. */
export interface LinearWeights {
  /** Output features (rows of W). */
  readonly n: number;
  /** Input features. */
  readonly k: number;
  /**
   * `x [m, k]` f32 → `[m, n]` f32, fp32 accumulation. Batch invariant: row i of the result is bitwise
   * the same for every m and every position of the row in the batch. Written into `out` `[m, n]` f32 when given
   * (it must not alias x).
   */
  apply(x: Float32Array, m: number, out?: Float32Array): Float32Array;
}

/** A {@link LinearWeights} over packed bf16 panels (@specd/native `gemmBf16`). */
export function bf16Linear(w: PackedBf16Weights): LinearWeights {
  return { n: w.n, k: w.k, apply: (x, m, out) => gemmBf16(x, m, w, out) };
}

/** Token embeddings `[vocab, dim]`. */
export interface EmbeddingTable {
  readonly vocab: number;
  readonly dim: number;
  /** Writes the f32 embedding of `id` into `out[0, dim)`. The caller checks `0 ≤ id < vocab`. */
  row(id: number, out: Float32Array): void;
}

/** An {@link EmbeddingTable} over bf16 rows `[vocab · dim]`. */
export function bf16Embedding(bits: Uint16Array, vocab: number, dim: number): EmbeddingTable {
  // converted straight into out (no temporary array a token)
  return {
    vocab,
    dim,
    row: (id, out) => {
      bf16ToF32(bits.subarray(id * dim, (id + 1) * dim), out.length === dim ? out : out.subarray(0, dim));
    },
  };
}

/** What the loader reads, by Hugging Face tensor name. Implementations throw naming the file and tensor. */
export interface LlamaTensorSource {
  /** Label for messages (the folder or file). */
  readonly label: string;
  has(name: string): boolean;
  /** A norm weight `[dim]` f32. */
  vector(name: string, dim: number): Float32Array;
  /** Projections stacked by rows: `names[i]` is `[rows[i], k]`; the result is `[Σ rows, k]`. */
  linear(names: readonly string[], rows: readonly number[], k: number): LinearWeights;
  /** Token embeddings `[vocab, dim]`. */
  embedding(name: string, vocab: number, dim: number): EmbeddingTable;
  /**
   * Matrices stacked by rows as plain bf16 bits (not packed for the CPU GEMM; quantized tensors dequantized, then
   * rounded to bf16): `names[i]` is `[rows[i], k]`; the result is `[Σ rows, k]` row-major. For devices that take
   * their own layout (the CUDA stage).
   */
  bf16Rows(names: readonly string[], rows: readonly number[], k: number): Uint16Array;
}

/** Thrown for a missing or mis-shaped tensor. */
export class LlamaWeightError extends Error {
  override readonly name = 'LlamaWeightError';
}

/** A {@link LlamaTensorSource} over a safetensors checkpoint (bf16 / f16 / f32 tensors → bf16 panels). */
export function safetensorsSource(
  dir: string,
  weights: SafetensorsCheckpoint,
  onTensor?: (name: string) => void,
  sanity?: CheckpointSanity,
): LlamaTensorSource {
  const r = new WeightReader(weights, {
    makeError: (m) => new LlamaWeightError(`llama: ${dir}: ${m}`),
    ...(sanity === undefined ? {} : { sanity }),
  });
  const seen = (name: string) => onTensor?.(name);
  return {
    label: dir,
    has: (name) => r.has(name),
    vector(name, dim) {
      const v = r.f32(name, [dim]);
      seen(name);
      return v;
    },
    linear(names, rows, k) {
      const w = bf16Linear(r.packedRows(names, rows, k));
      names.forEach(seen);
      return w;
    },
    embedding(name, vocab, dim) {
      const e = bf16Embedding(r.bf16(name, [vocab, dim]), vocab, dim);
      seen(name);
      return e;
    },
    bf16Rows(names, rows, k) {
      const out = new Uint16Array(rows.reduce((a, b) => a + b, 0) * k);
      let at = 0;
      names.forEach((name, i) => {
        out.set(r.bf16(name, [rows[i]!, k]), at);
        at += rows[i]! * k;
        seen(name);
      });
      return out;
    },
  };
}
