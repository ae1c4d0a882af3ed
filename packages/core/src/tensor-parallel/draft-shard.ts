/**
 * What a drafter plugin needs to shard a draft model over a tensor-parallel group (docs/
 * ARCHITECTURE.md "Tensor parallelism", Drafters): the rank's block of heads, KV heads and
 * intermediate width (Megatron-LM layout, Shoeybi et al. 2019 §3; GQA KV heads replicated when the
 * group is larger than the KV heads, as vLLM's `QKVParallelLinear` does), and the two collectives a
 * draft layer uses — the all-reduce of its row-parallel outputs and the broadcast of rank 0's token
 * embeddings (only rank 0's target shard embeds).
 */

import { DrafterError } from '../plugin/drafter-plugin.js';
import type { StageModel, TpComm } from '../plugin/model-plugin.js';

/** A rank's share of a draft model's attention and MLP: half-open index ranges [start, end). */
export interface DraftShardLayout {
  readonly rank: number;
  readonly size: number;
  /** Query heads [h0, h1) of the rank: [r·H/N, (r+1)·H/N). */
  readonly heads: readonly [number, number];
  /**
   * KV heads [k0, k1) of the rank: [r·KV/N, (r+1)·KV/N) when N ≤ KV; when N > KV one head,
   * ⌊r·KV/N⌋ (replicated over the N/KV ranks whose query heads form its GQA group).
   */
  readonly kvHeads: readonly [number, number];
  /** Intermediate channels [i0, i1) of the rank's gate/up rows and down columns: [r·I/N, (r+1)·I/N). */
  readonly intermediate: readonly [number, number];
}

/** Head and width counts of a draft model (per layer). */
export interface DraftShardCounts {
  /** Query heads H. */
  readonly heads: number;
  /** KV heads KV (H is a multiple of KV). */
  readonly kvHeads: number;
  /** MLP intermediate width I. */
  readonly intermediate: number;
}

/**
 * The block of rank `comm.rank` of `comm.size` (N): see {@link DraftShardLayout}. N = 1 is the whole model.
 * @param where the error prefix, e.g. `"dflash: models/x"`.
 * @throws {DrafterError} when N does not divide H or I, or neither N divides KV nor KV divides N
 *   (the message names every count and the rule).
 */
export function draftShardLayout(
  counts: DraftShardCounts,
  comm: Pick<TpComm, 'rank' | 'size'>,
  where: string,
): DraftShardLayout {
  const { heads: H, kvHeads: KV, intermediate: I } = counts;
  const N = comm.size;
  const r = comm.rank;
  const bad: string[] = [];
  if (H % N !== 0) bad.push(`num_attention_heads = ${H}`);
  if (I % N !== 0) bad.push(`intermediate_size = ${I}`);
  if (KV % N !== 0 && N % KV !== 0)
    bad.push(`num_key_value_heads = ${KV} (tp must divide it, or be a multiple of it so KV heads are replicated)`);
  if (bad.length > 0) {
    throw new DrafterError(
      `${where}: tp = ${N} does not fit the draft model: it does not divide ${bad.join(', ')}; ` +
        `the draft model has ${H} heads, ${KV} KV heads, intermediate ${I}`,
    );
  }
  const kv: readonly [number, number] =
    N <= KV ? [(r * KV) / N, ((r + 1) * KV) / N] : [Math.floor((r * KV) / N), Math.floor((r * KV) / N) + 1];
  return Object.freeze({
    rank: r,
    size: N,
    heads: [(r * H) / N, ((r + 1) * H) / N] as const,
    kvHeads: kv,
    intermediate: [(r * I) / N, ((r + 1) * I) / N] as const,
  });
}

/**
 * A draft model's view of its tensor-parallel group: the rank's {@link DraftShardLayout} and the
 * collectives its forward runs. Every rank calls {@link embed} and {@link reduce} in the same order.
 */
export class DraftShard {
  constructor(
    readonly comm: TpComm,
    readonly layout: DraftShardLayout,
  ) {}

  /** Whether this is rank 0 (the rank that embeds, projects with fc, runs the heads and samples). */
  get isRoot(): boolean {
    return this.comm.rank === 0;
  }

  /** Query heads of the rank (H/N). */
  get heads(): number {
    return this.layout.heads[1] - this.layout.heads[0];
  }

  /** KV heads of the rank (KV/N, or 1 when replicated). */
  get kvHeads(): number {
    return this.layout.kvHeads[1] - this.layout.kvHeads[0];
  }

  /** Intermediate width of the rank (I/N). */
  get intermediate(): number {
    return this.layout.intermediate[1] - this.layout.intermediate[0];
  }

  /**
   * Token embeddings `[tokens.length, hidden]` f32 on every rank: rank 0 embeds with `target.embedTokens`
   * (its target shard is the only one with an embedding) and broadcasts; the others pass zeros.
   * @throws {DrafterError} on rank 0 if the target has no embedTokens; the target's errors for bad ids (rank 0).
   */
  embed(target: StageModel, tokens: Int32Array, hidden: number): Float32Array {
    if (!this.isRoot) return this.comm.broadcast(new Float32Array(tokens.length * hidden));
    if (target.embedTokens === undefined)
      throw new DrafterError("tensor-parallel drafter: rank 0's target has no embedTokens");
    const e = target.embedTokens(tokens);
    return this.comm.size === 1 ? e : this.comm.broadcast(e);
  }

  /** Σ over ranks of the rank's partial `x` (row-parallel o_proj / down_proj outputs), in rank order. */
  reduce(x: Float32Array): Float32Array {
    return this.comm.size === 1 ? x : this.comm.allReduce(x);
  }
}
