/**
 * Committing a verify step on a stage with KDA state (REFERENCE.md §7: rolling back rejected draft
 * tokens needs per-position snapshots or a replay). Both give bitwise the state plain decoding of
 * the committed tokens would give (KDA decode and verify use the same recurrent kernel, per token).
 * - Replay: take `cache.checkpoint(id)` before the verify forward; {@link commitByReplay} restores
 *   it, drops the verify block's KV and runs the committed tokens again (one extra forward).
 * - Snapshots: verify with `{ kdaSnapshots: true }`; {@link commitFromSnapshots} copies the states
 *   after the last committed token into the slot and truncates the KV (a copy of
 *   H·d² + 3·H·d·(ks−1) floats per KDA layer; the verify pass writes T such copies).
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
 * of the block; KV beyond `position + committed` is dropped (pages freed).
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
  const row = span.tokenStart + committed - 1;
  for (const [l, snap] of snapshots.layers) {
    const st = cache.state!.recurrent(id, l);
    const cv = cache.state!.conv(id, l);
    st.set(snap.state.subarray(row * st.length, (row + 1) * st.length));
    cv.set(snap.conv.subarray(row * cv.length, (row + 1) * cv.length));
  }
  cache.rollback(id, { length: span.position + committed, state: undefined });
}
