/**
 * Committing a verify step on a stage with KDA state (REFERENCE.md §7: rolling back rejected draft
 * tokens needs per-position snapshots or a replay). Both give bitwise the state plain decoding of
 * the committed tokens would give (KDA decode and verify use the same recurrent kernel, per token).
 * - Replay of the whole stage: take `cache.checkpoint(id)` before the verify forward; {@link commitByReplay}
 *   restores it, drops the verify block's KV and runs the committed tokens again (one extra forward).
 * - Snapshots: verify with `{ kdaSnapshots: true }` (or `stateSnapshots`); {@link commitFromSnapshots}
 *   restores each KDA layer's state from before the verify and re-runs only the KDA recurrence on the
 *   committed tokens' kept core inputs (no projection, attention or MoE), then truncates the KV. The
 *   verify pass copies one state per sequence and layer (H·d² + 3·H·d·(ks−1) floats) instead of one per
 *   token; the commit costs the recurrence of the committed tokens.
 */

import type { ForwardResult, SequenceCache, SequenceCheckpoint, SequenceId, StageModel } from '@specd/core';

import type { KdaSnapshotSet } from './model.js';

/**
 * Rolls `id` back to `checkpoint` and re-runs `committed` (the accepted drafts + bonus, or a
 * prefix of the verify block) on `stage`, with no logits.
 * @param hidden for a non-first stage: `[committed.length, hidden]` f32 input from the previous stage.
 * @returns the replay's forward result (taps as requested).
 */
export function commitByReplay(
  stage: StageModel,
  cache: SequenceCache,
  id: SequenceId,
  checkpoint: SequenceCheckpoint,
  committed: Int32Array,
  options: { hidden?: Float32Array; taps?: readonly number[] } = {},
): ForwardResult | undefined {
  cache.rollback(id, checkpoint);
  if (committed.length === 0) return undefined;
  return stage.forward(
    { sequences: [{ id, position: checkpoint.length, tokens: committed, logits: 'none' }], hidden: options.hidden },
    cache,
    { taps: options.taps },
  );
}

/**
 * Keeps the first `committed` tokens (≥ 1) of `id`'s rows in a verify forward run with
 * `{ kdaSnapshots: true }`: the KDA state and conv state become those after token `committed − 1`
 * of the block (restored from before the forward, then the recurrence re-run on the committed rows; the
 * same bits as the forward computed, so committing twice or after a later forward is still exact); KV
 * beyond `position + committed` is dropped (pages freed).
 * @throws {RangeError} if `id` was not in that forward, or `committed` is not in [1, numNew]
 *   (to keep none, roll back to a checkpoint).
 */
export function commitFromSnapshots(
  cache: SequenceCache,
  snapshots: KdaSnapshotSet,
  id: SequenceId,
  committed: number,
): void {
  const span = snapshots.spans.find((s) => s.id === id);
  if (span === undefined)
    throw new RangeError(`commitFromSnapshots: id: sequence ${String(id)} was not in the snapshotted forward`);
  if (!Number.isInteger(committed) || committed < 1 || committed > span.numNew) {
    throw new RangeError(
      `commitFromSnapshots: committed: expected an integer in [1, ${span.numNew}], got ${committed}`,
    );
  }
  const si = snapshots.spans.indexOf(span);
  const pools = cache.state!;
  for (const [l, snap] of snapshots.layers) {
    const st = pools.recurrent(id, l);
    const cv = pools.conv(id, l);
    if (snap.perToken !== undefined) {
      // commit mode 'copy': the forward kept the state after every row
      const row = span.tokenStart + committed - 1;
      st.set(snap.perToken.state.subarray(row * st.length, (row + 1) * st.length));
      cv.set(snap.perToken.conv.subarray(row * cv.length, (row + 1) * cv.length));
      continue;
    }
    st.set(snap.stateBefore.subarray(si * st.length, (si + 1) * st.length));
    cv.set(snap.convBefore.subarray(si * cv.length, (si + 1) * cv.length));
    const C = snap.heads * snap.headDim;
    const r0 = span.tokenStart;
    const r1 = r0 + committed;
    snap.kernels.kda(
      {
        qkv: snap.qkv.subarray(r0 * 3 * C, r1 * 3 * C),
        g: snap.g.subarray(r0 * C, r1 * C),
        beta: snap.beta.subarray(r0 * snap.heads, r1 * snap.heads),
        convWeight: snap.convWeight,
        seqLens: Int32Array.of(committed),
        slots: Int32Array.of(pools.slotOf(id)),
        state: pools.recurrentStore(l),
        conv: pools.convStore(l),
        heads: snap.heads,
        headDim: snap.headDim,
        out: new Float32Array(committed * C),
      },
      'recurrent',
    );
  }
  cache.rollback(id, { length: span.position + committed, state: undefined });
}
