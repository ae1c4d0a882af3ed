/**
 * EAGLE-3 chain drafting (eagle3.ts, module comment "Chain"): k steps of the draft layer per sequence,
 * batched over sequences per step. Oracle: tools/reference/eval_tau.py (`Proposer._eagle`).
 */

import { DrafterError, type DraftKvCache, type DraftSequence, type SequenceId } from '@specd/core';
import { argmax, argmaxProb, makePagedBatch, pagedAttention } from '@specd/native';

import type { Eagle3Model } from './eagle3-model.js';

/**
 * Chooses step j's draft id (1-based) of sequence r from its draft-vocabulary logits `[draftVocab]` f32;
 * `greedy` is their argmax.
 */
export type ChainPick = (r: number, j: number, logits: Float32Array, greedy: number) => number;

/**
 * The chain (module comment) of `lengths[r]` steps for each of `seqs`, batched per step; `pick` chooses
 * step j's draft id of sequence r (rank 0 only: other ranks' drafts stay 0, their embeddings are rank
 * 0's). Step 1 reads g of anchor p − 1 from `lastG`; step j > 1 writes its K/V after the context (slot
 * p + j − 2) as temporary rows, dropped before returning (also on an error).
 * @param confidence optional, `[lengths[r]]` f32 per sequence: receives step j's greedy probability
 *   max softmax(logits_j) (a function of the drafts before j only; rank 0), before `pick` runs (which may
 *   overwrite it). Absent: no probability is worked out.
 * @returns the draft ids, `[lengths[r]]` i32 per sequence (draft vocabulary).
 * @throws `CacheError` `full` when the draft KV has no page left for a step's rows; {@link DrafterError}
 *   on an internal inconsistency (a sequence without a stored g: the callers check it first).
 */
export function runChain(
  model: Eagle3Model,
  kv: DraftKvCache,
  lastG: ReadonlyMap<SequenceId, Float32Array>,
  seqs: readonly DraftSequence[],
  lengths: readonly number[],
  pick: ChainPick,
  confidence?: readonly Float32Array[],
): Int32Array[] {
  const c = model.config;
  const D = c.hiddenSize;
  const H = model.heads;
  const hd = c.headDim;
  const Vd = c.draftVocabSize;
  const w = model.weights();
  const root = model.root;
  const S = seqs.length;
  const kMax = lengths.reduce((m, k) => Math.max(m, k), 0);
  const drafts = lengths.map((k) => new Int32Array(k));
  // per active sequence (i: its index in seqs, lengths and drafts): g (the step's residual input) and
  // the step's input token
  let active = seqs.map((seq, i) => ({ i, seq, length: lengths[i]!, out: drafts[i]! }));
  let g = new Float32Array(S * D);
  seqs.forEach((s, i) => {
    const last = lastG.get(s.id);
    if (last === undefined)
      throw new DrafterError(`eagle3: propose: internal error: no stored g for sequence ${String(s.id)}`);
    g.set(last, i * D);
  });
  let tok = Int32Array.from(seqs, (s) => s.lastToken);
  let grew = false;
  try {
    for (let j = 1; j <= kMax; j++) {
      const n = active.length;
      const x = model.layerInput(model.embed(tok), g, n);
      let q: Float32Array;
      if (j === 1) {
        q = model.firstQuery(
          x,
          active.map((c) => c.seq),
        );
      } else {
        const pos = Int32Array.from(active, ({ seq }) => seq.position + j - 2);
        const [qj, k, v] = model.queryKeysValues(x, pos);
        q = qj;
        const rows = active.map(({ seq }) => ({ id: seq.id, position: seq.position + j - 2, numTokens: 1 }));
        grew = true;
        kv.extendAll(rows);
        kv.write(0, k, v, kv.slots(rows));
      }
      const attnBatch = makePagedBatch(
        active.map(({ seq }) => ({ qLen: 1, kvLen: seq.position + j - 1, pages: kv.pool.blockTable(seq.id) })),
      );
      const a = pagedAttention(q, kv.keys(0), kv.values(0), kv.layout, attnBatch, {
        numHeads: H,
        scale: 1 / Math.sqrt(hd),
        mask: 'causal',
      });
      const h = model.finish(g, a, n);
      // logits and the pick on rank 0 only (the other ranks' drafts stay 0: their embeddings are rank 0's)
      const logits = root ? model.logits(h, n) : undefined;
      // the greedy ids, and their probabilities only when confidences are asked for
      const top =
        logits === undefined
          ? undefined
          : confidence === undefined
            ? { ids: argmax(logits, Vd), prob: undefined }
            : argmaxProb(logits, Vd);
      const nextActive: typeof active = [];
      const nextRows: number[] = [];
      active.forEach((c, row) => {
        if (confidence !== undefined && top?.prob !== undefined) confidence[c.i]![j - 1] = top.prob[row]!;
        const d =
          logits === undefined || top === undefined
            ? 0
            : pick(c.i, j, logits.subarray(row * Vd, (row + 1) * Vd), top.ids[row]!);
        c.out[j - 1] = d;
        if (c.length > j) {
          nextActive.push(c);
          nextRows.push(row);
        }
      });
      const ng = new Float32Array(nextRows.length * D);
      nextRows.forEach((row, r) => {
        ng.set(h.subarray(row * D, (row + 1) * D), r * D);
      });
      tok = Int32Array.from(nextActive, (c) => (root ? w.draftToTarget[c.out[j - 1]!]! : 0));
      g = ng;
      active = nextActive;
    }
  } finally {
    if (grew) kv.truncateAll(seqs.map((s) => ({ id: s.id, position: s.position, numTokens: 0 })));
  }
  return drafts;
}
