/**
 * EAGLE-2-style greedy dynamic trees of the EAGLE-3 draft layer (eagle3.ts, module comment "Tree"):
 * expansion of the top_k frontier per depth, the total_tokens best nodes by cumulative log-prob.
 */

import { DrafterError, type DraftKvCache, type DraftProposal, type DraftSequence, type SequenceId } from '@specd/core';
import { makePagedBatch, pagedAttention, type KvPageLayout } from '@specd/native';

import type { Eagle3TreeSettings } from './config.js';
import type { Eagle3Model } from './eagle3-model.js';

/** A node of a dynamic draft tree (draft-vocabulary token, parent node index or −1 for the root). */
interface TreeNode {
  readonly draft: number;
  readonly depth: number;
  readonly parent: number;
  /** Cumulative log-prob: the parent's + this token's log-softmax under the parent's step. */
  readonly cum: number;
  /** Layer output h of the step that produced this node (its expansion's g), `[D]`. */
  readonly h: Float32Array;
  /** Global pool slot of its expansion's K/V entry; −1 until expanded. */
  slot: number;
}

/** Tree rank order: higher cumulative log-prob first; ties: lower depth, then generation order (index). */
function compareNodes(nodes: readonly TreeNode[], a: number, b: number): number {
  const x = nodes[a]!;
  const y = nodes[b]!;
  if (x.cum !== y.cum) return x.cum > y.cum ? -1 : 1;
  return x.depth - y.depth || a - b;
}

/** log Σ exp(x) over a row, in f64 (NaN entries skipped). */
function logSumExp(x: Float32Array): number {
  let m = -Infinity;
  for (let e = 0; e < x.length; e++) if (x[e]! > m) m = x[e]!;
  if (m === -Infinity) return m;
  let s = 0;
  for (let e = 0; e < x.length; e++) if (x[e]! >= -Infinity) s += Math.exp(x[e]! - m);
  return m + Math.log(s);
}

/** Indices of the k largest values, largest first; ties: lower index first; NaN never chosen (k = 1: `argmax`). */
function topIndices(x: Float32Array, k: number): number[] {
  const best: number[] = [];
  for (let e = 0; e < x.length; e++) {
    const v = x[e]!;
    if (!(v >= -Infinity)) continue;
    if (best.length === k) {
      if (!(v > x[best[k - 1]!]!)) continue;
      best.pop();
    }
    let at = best.length;
    best.push(e);
    while (at > 0 && v > x[best[at - 1]!]!) {
      best[at] = best[at - 1]!;
      at--;
    }
    best[at] = e;
  }
  return best;
}

/**
 * Greedy dynamic trees (eagle3.ts, module comment "Tree"), one per sequence, batched per depth level:
 * one set of GEMMs and one `pagedAttention` call (over the pool viewed with pageSize 1) per level.
 * Depth 1 reads g of anchor p − 1 from `lastG`; deeper nodes' K/V entries are temporary rows after each
 * sequence's context, dropped before returning (also on an error).
 * @returns per sequence the drafts (target ids, by depth then rank) and their `parents`.
 * @throws {DrafterError} on an internal inconsistency (a node selected without its parent);
 *   `CacheError` `full` when the draft KV has no page left for a level's entries.
 */
export function proposeTree(
  model: Eagle3Model,
  kv: DraftKvCache,
  lastG: ReadonlyMap<SequenceId, Float32Array>,
  seqs: readonly DraftSequence[],
  tree: Eagle3TreeSettings,
): DraftProposal[] {
  const c = model.config;
  const D = c.hiddenSize;
  const H = model.heads;
  const hd = c.headDim;
  const Vd = c.draftVocabSize;
  const w = model.weights();
  const F = kv.pool.floatsPerToken;
  const S = seqs.length;
  const attn = { numHeads: H, scale: 1 / Math.sqrt(hd), mask: 'causal' } as const;
  const budget = seqs.map((s) => Math.min(tree.totalTokens, s.maxDrafts));
  // children per node: a child ranked below `budget` among its siblings can never be selected
  const width = budget.map((b) => Math.min(tree.topK, Vd, b));
  const nodes: TreeNode[][] = seqs.map(() => []);
  const addChildren = (i: number, parent: number, depth: number, lg: Float32Array, h: Float32Array): void => {
    const base = parent < 0 ? 0 : nodes[i]![parent]!.cum;
    const lse = logSumExp(lg);
    for (const d of topIndices(lg, width[i]!))
      nodes[i]!.push({ draft: d, depth, parent, cum: base + (lg[d]! - lse), h, slot: -1 });
  };
  // depth 1: chain step 1
  {
    const g = new Float32Array(S * D);
    seqs.forEach((s, i) => {
      g.set(lastG.get(s.id)!, i * D);
    });
    const x = model.layerInput(model.embed(Int32Array.from(seqs, (s) => s.lastToken)), g, S);
    const q = model.firstQuery(x, seqs);
    const a = pagedAttention(
      q,
      kv.keys(0),
      kv.values(0),
      kv.layout,
      makePagedBatch(seqs.map((s) => ({ qLen: 1, kvLen: s.position, pages: kv.pool.blockTable(s.id) }))),
      attn,
    );
    const h = model.finish(g, a, S);
    const logits = model.logits(h, S);
    seqs.forEach((_, i) => {
      addChildren(i, -1, 1, logits.subarray(i * Vd, (i + 1) * Vd), h.slice(i * D, (i + 1) * D));
    });
  }
  // deeper levels: every token slot its own "page"
  const layout1: KvPageLayout = Object.freeze({
    ...kv.layout,
    numPages: kv.layout.numPages * kv.layout.pageSize,
    pageSize: 1,
  });
  const used = seqs.map(() => 0);
  let ctxSlots: Int32Array[] | undefined;
  try {
    for (let d = 2; d <= tree.depth; d++) {
      // frontier: the top `width` nodes of depth d − 1 by cumulative log-prob, of each sequence
      const rows: { i: number; n: number }[] = [];
      seqs.forEach((_, i) => {
        if (d > budget[i]!) return; // an ancestor-closed tree of budget nodes is at most budget deep
        const level: number[] = [];
        nodes[i]!.forEach((nd, n) => {
          if (nd.depth === d - 1) level.push(n);
        });
        level.sort((a, b) => compareNodes(nodes[i]!, a, b));
        for (const n of level.slice(0, width[i]!)) rows.push({ i, n });
      });
      const R = rows.length;
      if (R === 0) break;
      ctxSlots ??= seqs.map((s) => kv.pool.tokenSlots([{ id: s.id, start: 0, n: s.position }]));
      const g = new Float32Array(R * D);
      rows.forEach(({ i, n }, r) => {
        g.set(nodes[i]![n]!.h, r * D);
      });
      const tok = Int32Array.from(rows, ({ i, n }) => w.draftToTarget[nodes[i]![n]!.draft]!);
      const x = model.layerInput(model.embed(tok), g, R);
      const pos = Int32Array.from(rows, ({ i }) => seqs[i]!.position + d - 2);
      const [q, k, v] = model.queryKeysValues(x, pos);
      // temporary entry slots after each sequence's context
      const counts = seqs.map(() => 0);
      for (const { i } of rows) counts[i]!++;
      const grow = seqs.flatMap((s, i) =>
        counts[i]! === 0 ? [] : [{ id: s.id, position: s.position + used[i]!, numTokens: counts[i]! }],
      );
      kv.extendAll(grow);
      seqs.forEach((_, i) => {
        used[i]! += counts[i]!;
      });
      const slots = new Int32Array(R);
      const next = seqs.map((s, i) => s.position + used[i]! - counts[i]!);
      rows.forEach(({ i, n }, r) => {
        slots[r] = kv.pool.tokenOffset(seqs[i]!.id, next[i]!++) / F;
        nodes[i]![n]!.slot = slots[r]!;
      });
      kv.write(0, k, v, slots);
      // each node sees the context, its ancestors' entries (depth order) and its own entry
      const attnBatch = makePagedBatch(
        rows.map(({ i, n }) => {
          const p = seqs[i]!.position;
          const pages = new Int32Array(p + d - 1);
          pages.set(ctxSlots![i]!);
          for (let a = n, at = p + d - 2; a >= 0; a = nodes[i]![a]!.parent) pages[at--] = nodes[i]![a]!.slot;
          return { qLen: 1, kvLen: p + d - 1, pages };
        }),
      );
      const a = pagedAttention(q, kv.keys(0), kv.values(0), layout1, attnBatch, attn);
      const h = model.finish(g, a, R);
      const logits = model.logits(h, R);
      rows.forEach(({ i, n }, r) => {
        addChildren(i, n, d, logits.subarray(r * Vd, (r + 1) * Vd), h.slice(r * D, (r + 1) * D));
      });
    }
  } finally {
    kv.truncateAll(seqs.flatMap((s, i) => (used[i]! > 0 ? [{ id: s.id, position: s.position, numTokens: 0 }] : [])));
  }
  // the budget best nodes (ancestor-closed: a child ranks after its parent), by depth then rank
  return seqs.map((s, i) => {
    const all = nodes[i]!;
    const ranked = all
      .map((_, n) => n)
      .sort((a, b) => compareNodes(all, a, b))
      .slice(0, budget[i]!);
    const rank = new Map(ranked.map((n, r) => [n, r]));
    const order = [...ranked].sort((a, b) => all[a]!.depth - all[b]!.depth || rank.get(a)! - rank.get(b)!);
    const at = new Map(order.map((n, e) => [n, e]));
    const tokens = new Int32Array(order.length);
    const parents = new Int32Array(order.length);
    order.forEach((n, e) => {
      const nd = all[n]!;
      tokens[e] = w.draftToTarget[nd.draft]!;
      const pe = nd.parent < 0 ? -1 : at.get(nd.parent);
      if (pe === undefined)
        throw new DrafterError(
          `eagle3: propose: internal error: tree node ${n} of sequence ${String(s.id)} selected without its parent`,
        );
      parents[e] = pe;
    });
    return { id: s.id, tokens, parents };
  });
}
