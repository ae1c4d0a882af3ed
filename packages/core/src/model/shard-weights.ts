/**
 * Packing a layer's matrices whole or as one tensor-parallel rank's blocks (Megatron-LM layout, Shoeybi
 * et al. 2019 §3; core's `draftShardLayout`), in one call: the caller names how each matrix is split and
 * the helper reads the rank's rows or columns, or the whole matrix without a shard. The packed result is
 * bit for bit `WeightReader.packedRows` of the same matrices when there is no shard.
 */

import type { PackedBf16Weights } from '@specd/native';

import type { MatrixBlock, WeightReader } from '../io/weight-reader.js';
import type { DraftShardLayout } from '../tensor-parallel/draft-shard.js';

/**
 * How a matrix `[n, k]` is split over the ranks:
 * - `'heads'`: column-parallel over query heads — rows [h0·hd, h1·hd) (q_proj);
 * - `'kvHeads'`: column-parallel over KV heads — rows [k0·hd, k1·hd) (k_proj, v_proj);
 * - `'headsIn'`: row-parallel over query heads — columns [h0·hd, h1·hd) (o_proj);
 * - `'intermediate'`: column-parallel over the MLP width — rows [i0, i1) (gate_proj, up_proj);
 * - `'intermediateIn'`: row-parallel over the MLP width — columns [i0, i1) (down_proj);
 * - `'replicated'`: the whole matrix on every rank.
 */
export type ShardSplit = 'heads' | 'kvHeads' | 'headsIn' | 'intermediate' | 'intermediateIn' | 'replicated';

/** One matrix of a packed weight. */
export interface ShardPart {
  /** Tensor name in the checkpoint. */
  readonly name: string;
  /** Rows of the whole matrix. */
  readonly n: number;
  /** Columns of the whole matrix. */
  readonly k: number;
  readonly split: ShardSplit;
}

/** A rank's block of heads / KV heads / intermediate channels, and the head size that scales head ranges. */
export interface WeightShard {
  readonly layout: DraftShardLayout;
  /** Elements per head (hd). */
  readonly headDim: number;
}

/** The block of `split` for `shard` (module comment). */
function blockOf(split: ShardSplit, shard: WeightShard): MatrixBlock | undefined {
  const { layout: L, headDim: hd } = shard;
  switch (split) {
    case 'heads':
      return { rows: [L.heads[0] * hd, L.heads[1] * hd] };
    case 'kvHeads':
      return { rows: [L.kvHeads[0] * hd, L.kvHeads[1] * hd] };
    case 'headsIn':
      return { cols: [L.heads[0] * hd, L.heads[1] * hd] };
    case 'intermediate':
      return { rows: L.intermediate };
    case 'intermediateIn':
      return { cols: L.intermediate };
    case 'replicated':
      return undefined;
  }
}

/**
 * Stacks `parts` by rows and packs them for one GEMM: the whole matrices without `shard`, else each
 * one's block for the rank (the blocks must have the same column count). Reads are logged by `reader`
 * (a block read names its rows / columns).
 * @returns `[Σ rows, cols]` packed bf16 weights.
 * @throws the reader's error naming a missing or mis-shaped tensor, or blocks of different widths.
 */
export function packShard(
  reader: WeightReader,
  parts: readonly ShardPart[],
  shard: WeightShard | undefined,
): PackedBf16Weights {
  if (shard === undefined)
    return reader.packedRows(
      parts.map((p) => p.name),
      parts.map((p) => p.n),
      parts[0]?.k ?? 0,
    );
  return reader.packedBlocks(
    parts.map((p) => {
      const block = blockOf(p.split, shard);
      return { name: p.name, n: p.n, k: p.k, ...(block === undefined ? {} : { block }) };
    }),
  );
}
