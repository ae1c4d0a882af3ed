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

/** A node with its index in its sequence's node list. */
interface IndexedNode {
  readonly n: number;
  readonly node: TreeNode;
}

/** Tree rank order: higher cumulative log-prob first; ties: lower depth, then generation order (index). */
function compareNodes({ n: a, node: x }: IndexedNode, { n: b, node: y }: IndexedNode): number {
  if (x.cum !== y.cum) return x.cum > y.cum ? -1 : 1;
  return x.depth - y.depth || a - b;
}

/** One sequence's tree while it grows. */
interface SeqTree {
  readonly seq: DraftSequence;
  /** Nodes returned at most: min(total_tokens, maxDrafts). */
  readonly budget: number;
  /** Children per node: a child ranked below `budget` among its siblings can never be selected. */
  readonly width: number;
  /** The nodes in generation order (a parent before its children). */
  readonly nodes: TreeNode[];
  /** Temporary draft-KV entries appended after the context so far. */
  used: number;
  /** Entries appended at the current level. */
  added: number;
  /** Position of the next temporary entry written at the current level. */
  next: number;
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
  const trees: SeqTree[] = seqs.map((seq) => {
    const budget = Math.min(tree.totalTokens, seq.maxDrafts);
    return { seq, budget, width: Math.min(tree.topK, Vd, budget), nodes: [], used: 0, added: 0, next: 0 };
  });
  const addChildren = (
    t: SeqTree,
    parent: IndexedNode | undefined,
    depth: number,
    lg: Float32Array,
    h: Float32Array,
  ): void => {
    const base = parent === undefined ? 0 : parent.node.cum;
    const lse = logSumExp(lg);
    for (const d of topIndices(lg, t.width))
      t.nodes.push({
        draft: d,
        depth,
        parent: parent === undefined ? -1 : parent.n,
        cum: base + (lg[d]! - lse),
        h,
        slot: -1,
      });
  };
  // depth 1: chain step 1
  {
    const g = new Float32Array(S * D);
    seqs.forEach((s, i) => {
      const last = lastG.get(s.id);
      // Eagle3Drafter.propose refuses a sequence without a stored g before it calls proposeTree
      if (last === undefined)
        throw new DrafterError(`eagle3: propose: internal error: no stored g for sequence ${String(s.id)}`);
      g.set(last, i * D);
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
    trees.forEach((t, i) => {
      addChildren(t, undefined, 1, logits.subarray(i * Vd, (i + 1) * Vd), h.slice(i * D, (i + 1) * D));
    });
  }
  // deeper levels: every token slot its own "page"
  const layout1: KvPageLayout = Object.freeze({
    ...kv.layout,
    numPages: kv.layout.numPages * kv.layout.pageSize,
    pageSize: 1,
  });
  let ctxSlots: Int32Array[] | undefined;
  try {
    for (let d = 2; d <= tree.depth; d++) {
      // frontier: the top `width` nodes of depth d − 1 by cumulative log-prob, of each sequence
      const rows: { i: number; t: SeqTree; parent: IndexedNode }[] = [];
      trees.forEach((t, i) => {
        if (d > t.budget) return; // an ancestor-closed tree of budget nodes is at most budget deep
        const level: IndexedNode[] = [];
        t.nodes.forEach((node, n) => {
          if (node.depth === d - 1) level.push({ n, node });
        });
        level.sort(compareNodes);
        for (const parent of level.slice(0, t.width)) rows.push({ i, t, parent });
      });
      const R = rows.length;
      if (R === 0) break;
      ctxSlots ??= seqs.map((s) => kv.pool.tokenSlots([{ id: s.id, start: 0, n: s.position }]));
      const ctx = ctxSlots;
      const g = new Float32Array(R * D);
      rows.forEach(({ parent }, r) => {
        g.set(parent.node.h, r * D);
      });
      const tok = Int32Array.from(rows, ({ parent }) => w.draftToTarget[parent.node.draft]!);
      const x = model.layerInput(model.embed(tok), g, R);
      const pos = Int32Array.from(rows, ({ t }) => t.seq.position + d - 2);
      const [q, k, v] = model.queryKeysValues(x, pos);
      // temporary entry slots after each sequence's context
      for (const t of trees) t.added = 0;
      for (const { t } of rows) t.added++;
      const grow = trees.flatMap((t) =>
        t.added === 0 ? [] : [{ id: t.seq.id, position: t.seq.position + t.used, numTokens: t.added }],
      );
      kv.extendAll(grow);
      for (const t of trees) {
        t.next = t.seq.position + t.used;
        t.used += t.added;
      }
      const slots = new Int32Array(R);
      rows.forEach(({ t, parent }, r) => {
        slots[r] = kv.pool.tokenOffset(t.seq.id, t.next++) / F;
        parent.node.slot = slots[r]!;
      });
      kv.write(0, k, v, slots);
      // each node sees the context, its ancestors' entries (depth order) and its own entry
      const attnBatch = makePagedBatch(
        rows.map(({ i, t, parent }) => {
          const p = t.seq.position;
          const pages = new Int32Array(p + d - 1);
          pages.set(ctx[i]!);
          // a node's parent index is always one of its sequence's nodes (or −1 for a root)
          for (let nd = parent.node, at = p + d - 2; ; nd = t.nodes[nd.parent]!) {
            pages[at--] = nd.slot;
            if (nd.parent < 0) break;
          }
          return { qLen: 1, kvLen: p + d - 1, pages };
        }),
      );
      const a = pagedAttention(q, kv.keys(0), kv.values(0), layout1, attnBatch, attn);
      const h = model.finish(g, a, R);
      const logits = model.logits(h, R);
      rows.forEach(({ t, parent }, r) => {
        addChildren(t, parent, d, logits.subarray(r * Vd, (r + 1) * Vd), h.slice(r * D, (r + 1) * D));
      });
    }
  } finally {
    kv.truncateAll(
      trees.flatMap((t) => (t.used > 0 ? [{ id: t.seq.id, position: t.seq.position, numTokens: 0 }] : [])),
    );
  }
  // the budget best nodes (ancestor-closed: a child ranks after its parent), by depth then rank
  return trees.map(({ seq, budget, nodes }) => {
    const ranked = nodes
      .map((node, n) => ({ n, node }))
      .sort(compareNodes)
      .slice(0, budget);
    const order = ranked.map((x, r) => ({ ...x, r })).sort((a, b) => a.node.depth - b.node.depth || a.r - b.r);
    const at = new Map(order.map(({ n }, e) => [n, e]));
    const tokens = new Int32Array(order.length);
    const parents = new Int32Array(order.length);
    order.forEach(({ n, node: nd }, e) => {
      tokens[e] = w.draftToTarget[nd.draft]!;
      const pe = nd.parent < 0 ? -1 : at.get(nd.parent);
      if (pe === undefined)
        throw new DrafterError(
          `eagle3: propose: internal error: tree node ${n} of sequence ${String(seq.id)} selected without its parent`,
        );
      parents[e] = pe;
    });
    return { id: seq.id, tokens, parents };
  });
}
