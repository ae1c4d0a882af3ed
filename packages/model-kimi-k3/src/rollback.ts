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

import {
  type ForwardResult,
  keptScratch,
  type PrefixCommitItem,
  type SequenceCache,
  type SequenceCheckpoint,
  type SequenceId,
  type StageModel,
} from '@specd/core';

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
 * beyond `position + committed` is dropped (pages freed). {@link commitFromSnapshotsBatch} of one commit.
 * @throws {RangeError} if `id` was not in that forward, or `committed` is not in [1, numNew]
 *   (to keep none, roll back to a checkpoint).
 */
export function commitFromSnapshots(
  cache: SequenceCache,
  snapshots: KdaSnapshotSet,
  id: SequenceId,
  committed: number,
): void {
  commitFromSnapshotsBatch(cache, snapshots, [{ id, committed }]);
}

/**
 * The batched commit's gathered rows and replay output, kept from one commit to the next (core's `keptScratch`). One
 * for the module: every use is inside one synchronous kernel call, so commits of several stages in one thread cannot
 * overlap (a stage in a worker thread has its own module instance).
 */
const commitScratch = keptScratch();

/**
 * {@link commitFromSnapshots} for several sequences of the same snapshotted forward at once: per KDA layer, ONE
 * recurrent kernel call over all their committed rows (`seqLens` = the committed counts; the rows gathered
 * `[Σ committed, 3·H·d]` when there are several), which first sets each slot to the sequence's state from before the
 * forward (the kernel's `initial`), instead of a restore and a call per sequence and layer — on kimi-k3-tiny at 8
 * sequences those cost ~0.7 ms a step, half a plain step; now ~0.3. The recurrence of a sequence does not depend on
 * the others in the call, so each gets the bits its own replay writes. Everything is checked before anything changes.
 * @throws {RangeError} if an id was not in that forward or is repeated, a `committed` is not in [1, numNew], or the
 *   snapshots were recycled ({@link KdaSnapshotSet.recycled}).
 */
export function commitFromSnapshotsBatch(
  cache: SequenceCache,
  snapshots: KdaSnapshotSet,
  commits: readonly PrefixCommitItem[],
): void {
  if (snapshots.recycled === true)
    throw new RangeError(
      'commitFromSnapshots: snapshots: two later forwards with snapshots on this stage have reused their buffers ' +
        '(commit right after the forward)',
    );
  const replays = [...snapshots.layers.values()].some((l) => l.perToken === undefined);
  const spans = commits.map(({ id, committed }) => {
    const si = snapshots.spans.findIndex((s) => s.id === id);
    if (si < 0)
      throw new RangeError(`commitFromSnapshots: id: sequence ${String(id)} was not in the snapshotted forward`);
    const span = snapshots.spans[si]!;
    if (!Number.isInteger(committed) || committed < 1 || committed > span.numNew) {
      throw new RangeError(
        `commitFromSnapshots: committed: expected an integer in [1, ${span.numNew}], got ${committed}`,
      );
    }
    if (span.numNew < 2 && replays)
      throw new RangeError(
        `commitFromSnapshots: sequence ${String(id)}: its block of one token kept no state to replay ` +
          '(committed whole right after its forward, it needs none: KimiStageModel.commitPrefix)',
      );
    return { span, si, committed };
  });
  if (new Set(commits.map((c) => c.id)).size !== commits.length)
    throw new RangeError('commitFromSnapshots: commits: a sequence is repeated');
  if (commits.length === 0) return;
  const pools = cache.state;
  const total = spans.reduce((a, s) => a + s.committed, 0);
  const seqLens = Int32Array.from(spans, (s) => s.committed);
  // (a stage without KDA layers has no linear state: only its KV is truncated)
  const slots = pools === undefined ? undefined : Int32Array.from(spans, (s) => pools.slotOf(s.span.id));
  const initialRows = Int32Array.from(spans, (s) => s.si);
  // the gathered rows and the replay's (unread) output: one buffer each, kept between commits (commitScratch)
  const buffer = commitScratch;
  for (const [l, snap] of snapshots.layers) {
    if (pools === undefined || slots === undefined)
      throw new RangeError('commitFromSnapshots: cache: KDA snapshots on a cache without linear state');
    if (snap.perToken !== undefined) {
      // commit mode 'copy': the forward kept the state after every row
      for (const { span, committed } of spans) {
        const st = pools.recurrent(span.id, l);
        const cv = pools.conv(span.id, l);
        const row = span.tokenStart + committed - 1;
        st.set(snap.perToken.state.subarray(row * st.length, (row + 1) * st.length));
        cv.set(snap.perToken.conv.subarray(row * cv.length, (row + 1) * cv.length));
      }
      continue;
    }
    const H = snap.heads;
    const C = H * snap.headDim;
    const rows = (name: string, a: Float32Array, width: number): Float32Array => {
      if (spans.length === 1) {
        const r0 = spans[0]!.span.tokenStart;
        return a.subarray(r0 * width, (r0 + spans[0]!.committed) * width);
      }
      const out = buffer(name, total * width);
      let at = 0;
      for (const { span, committed } of spans) {
        out.set(a.subarray(span.tokenStart * width, (span.tokenStart + committed) * width), at * width);
        at += committed;
      }
      return out;
    };
    snap.kernels.kda(
      {
        qkv: rows('qkv', snap.qkv, 3 * C),
        g: rows('g', snap.g, C),
        beta: rows('beta', snap.beta, H),
        convWeight: snap.convWeight,
        seqLens,
        slots,
        state: pools.recurrentStore(l),
        conv: pools.convStore(l),
        heads: H,
        headDim: snap.headDim,
        out: buffer('out', total * C),
        // each slot restored from before the forward inside the kernel, then the committed rows replayed
        initial: { state: snap.stateBefore, conv: snap.convBefore, rows: initialRows },
      },
      'recurrent',
    );
  }
  for (const { span, committed } of spans)
    cache.rollback(span.id, { length: span.position + committed, state: undefined });
}
