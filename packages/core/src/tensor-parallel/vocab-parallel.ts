/**
 * Vocab-parallel output projection (lm_head) under tensor parallelism: rank r of N holds the rows
 * [⌊r·V/N⌋, ⌊(r+1)·V/N⌋) of the `[V, D]` lm_head, computes the logits of its vocabulary slice
 * `[rows, V_r]`, and the slices are all-gathered ({@link TpComm.allGather}) and laid out as
 * `[rows, V]` row-major. Source: Megatron-LM's output layer, a column-parallel linear over the
 * vocabulary whose outputs are gathered (Shoeybi et al. 2019 §3; `ColumnParallelLinear` with
 * `gather_output`), and vLLM's `ParallelLMHead` + `LogitsProcessor` (all-gather of the slices). Each logit is
 * the same dot product over D as without the split, so the logits are those of the whole lm_head.
 * vLLM pads V to a multiple of 64·N and splits evenly; we split unpadded, so V need not divide by N
 * (the first slices are at most one row shorter).
 */

import type { TpComm } from '../plugin/model-plugin.js';

/** A malformed vocab-parallel call (names the argument). */
export class VocabParallelError extends Error {
  override readonly name = 'VocabParallelError';
}

/**
 * Rank `rank`'s vocabulary slice of `vocabSize` ids over `size` ranks: [⌊rank·V/size⌋, ⌊(rank+1)·V/size⌋)
 * (start inclusive, end exclusive; slices cover [0, V) in rank order and differ in length by ≤ 1).
 * @throws {VocabParallelError} for a size < 1, a rank outside [0, size) or vocabSize < size.
 */
export function vocabShardRange(vocabSize: number, rank: number, size: number): [number, number] {
  if (!(Number.isInteger(size) && size >= 1))
    throw new VocabParallelError(`vocabShardRange: size: expected an integer >= 1, got ${size}`);
  if (!(Number.isInteger(rank) && rank >= 0 && rank < size))
    throw new VocabParallelError(`vocabShardRange: rank: expected an integer in [0, ${size}), got ${rank}`);
  if (!(Number.isInteger(vocabSize) && vocabSize >= size))
    throw new VocabParallelError(`vocabShardRange: vocabSize: expected an integer >= size (${size}), got ${vocabSize}`);
  return [Math.floor((rank * vocabSize) / size), Math.floor(((rank + 1) * vocabSize) / size)];
}

/**
 * Gathers vocab-parallel logits: `local` is this rank's slice `[rows, V_r]` f32 (row-major, V_r =
 * the length of {@link vocabShardRange}); returns the whole `[rows, vocabSize]` f32 on every rank
 * (one {@link TpComm.allGather}, then each rank's `[rows, V_r]` block copied into its columns).
 * Collective: every rank calls it at once with the same `rows`.
 * @throws {VocabParallelError} if `local` is not `[rows, V_r]`; TpAbortError (SharedComm) if the group was aborted.
 */
export function gatherVocabParallel(comm: TpComm, local: Float32Array, rows: number, vocabSize: number): Float32Array {
  const [v0, v1] = vocabShardRange(vocabSize, comm.rank, comm.size);
  if (local.length !== rows * (v1 - v0))
    throw new VocabParallelError(
      `gatherVocabParallel: local: expected [${rows}, ${v1 - v0}] f32 ` +
        `(rank ${comm.rank}'s vocabulary slice [${v0}, ${v1})), got length ${local.length}`,
    );
  if (comm.size === 1) return local;
  const pieces = comm.allGather(local);
  const out = new Float32Array(rows * vocabSize);
  let at = 0;
  for (let r = 0; r < comm.size; r++) {
    const [s0, s1] = vocabShardRange(vocabSize, r, comm.size);
    const w = s1 - s0;
    for (let i = 0; i < rows; i++) out.set(pieces.subarray(at + i * w, at + (i + 1) * w), i * vocabSize + s0);
    at += rows * w;
  }
  return out;
}
