/** Internal batch bookkeeping shared by the layers. */
import type { SequenceId } from '@specd/core';

/** One sequence's place in a flattened batch. */
export interface SeqSpan {
  readonly id: SequenceId;
  /** First row of this sequence in the `[numTokens, ·]` batch tensors. */
  readonly tokenStart: number;
  /** New tokens of the sequence. */
  readonly numNew: number;
  /** Position of its first new token (= cached tokens before this forward). */
  readonly position: number;
}

/** A tensor-parallel rank's place: rank `rank` of `size` (size 1 = the whole model). */
export interface ShardRank {
  readonly rank: number;
  readonly size: number;
}

/** Rank `s.rank`'s block [start, end) of `n` items split evenly over `s.size` ranks. */
export function shardRange(n: number, s: ShardRank): [number, number] {
  const per = n / s.size;
  return [s.rank * per, (s.rank + 1) * per];
}
