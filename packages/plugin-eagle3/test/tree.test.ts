// EAGLE-2-style dynamic-tree drafting (greedy) of the EAGLE-3 drafter. The shipped target (Kimi-K3
// tiny) has KDA layers, so `tree` is refused on it (its StageInfo.treeVerificationBlocker names them).
// The drafter-side tests use the same target behind a proxy that reports every layer as 'attention'
// and no blocker: drafting reads only the target's embedding and geometry (embedTokens / info) — the
// layers matter for verifying a tree (a tree attention mask), which the engine tests cover on an
// all-attention target. The
// goldens' taps give real draft contexts; the expected trees are rebuilt here from the chain code
// path (`forcedChainLogits`: a chain whose drafts are forced to a node's ancestor path), so every
// node's children are checked to be the top_k of the chain step over its path.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { fullDraftProbs, SafetensorsFile, samplingProbs, type DraftSequence, type StageModel } from '@specd/core';
import { argmax, softmax } from '@specd/native';

import type { Eagle3Drafter } from '../src/index.js';
import { EAGLE3_DIR, GOLDENS_DIR, loadDrafter, loadTarget } from './helpers.js';

const index = JSON.parse(fs.readFileSync(path.join(GOLDENS_DIR, 'index.json'), 'utf8')) as {
  goldens: Record<string, { file: string; T: number; first_token: number }>;
};
const NAMES = Object.keys(index.goldens);

/**
 * The target, reporting all layers as attention and declaring the TreeCommit capability (see the file
 * comment; these tests draft trees and never commit one); everything else delegates.
 */
function allAttention(t: StageModel): StageModel {
  const info = { ...t.info, layerKinds: t.info.layerKinds.map(() => 'attention'), treeVerificationBlocker: undefined };
  const commitTreePath = (): void => {
    throw new Error('allAttention: commitTreePath is not used by these tests');
  };
  return new Proxy(t, {
    has(o, p) {
      return p === 'commitTreePath' || Reflect.has(o, p);
    },
    get(o, p) {
      if (p === 'info') return info;
      if (p === 'commitTreePath') return commitTreePath;
      const v = Reflect.get(o, p, o) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(o) : v;
    },
  });
}

interface Golden {
  T: number;
  first: number;
  sum: Float32Array;
  next: Int32Array;
  want: number[];
}
const goldens = new Map<string, Golden>();

let target: StageModel;
let attnTarget: StageModel;
let chain1: Eagle3Drafter; // top_k 1 tree
let tree: Eagle3Drafter; // top_k 2, depth 4, total 10
let chain: Eagle3Drafter; // no tree: chains, with confidences
beforeAll(async () => {
  target = loadTarget();
  attnTarget = allAttention(target);
  chain = await loadDrafter(target, { settings: { method: 'eagle3', path: EAGLE3_DIR, confidence: true } });
  chain1 = await loadDrafter(attnTarget, {
    settings: { method: 'eagle3', path: EAGLE3_DIR, tree: { top_k: 1, depth: 6, total_tokens: 10 } },
  });
  tree = await loadDrafter(attnTarget, {
    settings: { method: 'eagle3', path: EAGLE3_DIR, tree: { top_k: 2, depth: 4, total_tokens: 10 } },
  });
  for (const name of NAMES) {
    const e = index.goldens[name]!;
    const g = SafetensorsFile.open(path.join(GOLDENS_DIR, e.file));
    try {
      const ids = g.read('input_ids').data as Int32Array;
      const next = Int32Array.from({ length: e.T }, (_, i) => (i + 1 < e.T ? ids[i + 1]! : e.first_token));
      const sum = tree.projectTargetHiddenPartial(
        new Map(tree.config.taps.map((t) => [t, g.read(`hidden.${t}`).data as Float32Array])),
        e.T,
      );
      goldens.set(name, {
        T: e.T,
        first: e.first_token,
        sum,
        next,
        want: Array.from(g.read('eagle3.first_proposal').data as Int32Array),
      });
    } finally {
      g.close();
    }
  }
});
afterAll(() => {
  chain.dispose();
  chain1.dispose();
  tree.dispose();
  target.dispose();
});

/** Adds `id` with golden `name`'s context to `d`; returns its (greedy unless said) draft sequence. */
function addGolden(
  d: Eagle3Drafter,
  id: string,
  name: string,
): (maxDrafts: number, temperature?: number) => DraftSequence {
  const g = goldens.get(name)!;
  d.addSequence(id);
  d.writeProjectedContextKV(g.sum, [{ id, position: 0, numTokens: g.T, nextTokens: g.next }]);
  let u = 0.123;
  return (maxDrafts, temperature = 0) => ({
    id,
    position: g.T,
    lastToken: g.first,
    maxDrafts,
    history: new Int32Array(0),
    sampling: { temperature },
    rng: { next: () => (u = (u * 9301 + 0.49297) % 1) },
  });
}

/** Indices of the k largest (largest first, ties: lower index), NaN excluded — by full sort. */
function topK(x: Float32Array, k: number): number[] {
  return Array.from(x.keys())
    .filter((i) => !Number.isNaN(x[i]!))
    .sort((a, b) => x[b]! - x[a]! || a - b)
    .slice(0, k);
}

function logSoftmax(x: Float32Array): Float64Array {
  let m = -Infinity;
  for (const v of x) m = Math.max(m, v);
  let s = 0;
  for (const v of x) s += Math.exp(v - m);
  const lse = m + Math.log(s);
  return Float64Array.from(x, (v) => v - lse);
}

/**
 * The expected tree, rebuilt from forced chains: the EAGLE-2 expansion (top_k children per node,
 * frontier = top_k of the previous depth by cumulative log-prob), then the `budget` best nodes
 * (ties: lower depth, then generation order), emitted by depth then rank. Tokens in the target vocabulary.
 */
function expectedTree(
  d: Eagle3Drafter,
  seq: DraftSequence,
  k: number,
  depth: number,
  budget: number,
): { tokens: number[]; parents: number[] } {
  const Vd = d.config.draftVocabSize;
  const d2t = d.draftToTarget;
  interface N {
    draft: number;
    depth: number;
    parent: number;
    cum: number;
    path: number[];
  }
  const nodes: N[] = [];
  const expand = (parent: number): void => {
    const path = parent < 0 ? [] : nodes[parent]!.path;
    const all = d.forcedChainLogits(seq, path);
    const lg = all.subarray(path.length * Vd, (path.length + 1) * Vd);
    const lp = logSoftmax(lg);
    const base = parent < 0 ? 0 : nodes[parent]!.cum;
    for (const t of topK(lg, k))
      nodes.push({ draft: t, depth: path.length + 1, parent, cum: base + lp[t]!, path: [...path, t] });
  };
  const cmp = (a: number, b: number) =>
    nodes[a]!.cum !== nodes[b]!.cum
      ? nodes[a]!.cum > nodes[b]!.cum
        ? -1
        : 1
      : nodes[a]!.depth - nodes[b]!.depth || a - b;
  expand(-1);
  for (let lvl = 2; lvl <= depth; lvl++) {
    const frontier = nodes
      .map((_, i) => i)
      .filter((i) => nodes[i]!.depth === lvl - 1)
      .sort(cmp)
      .slice(0, k);
    for (const n of frontier) expand(n);
  }
  const ranked = nodes
    .map((_, i) => i)
    .sort(cmp)
    .slice(0, budget);
  const order = [...ranked].sort((a, b) => nodes[a]!.depth - nodes[b]!.depth || ranked.indexOf(a) - ranked.indexOf(b));
  return {
    tokens: order.map((n) => d2t[nodes[n]!.draft]!),
    parents: order.map((n) => (nodes[n]!.parent < 0 ? -1 : order.indexOf(nodes[n]!.parent))),
  };
}

describe('loading with `tree`', () => {
  it('the KDA target still refuses it, naming the KDA layers', async () => {
    await expect(
      loadDrafter(target, {
        settings: { method: 'eagle3', path: EAGLE3_DIR, tree: { top_k: 2, depth: 4, total_tokens: 10 } },
      }),
    ).rejects.toThrow(
      'eagle3: EAGLE-3 tree drafting needs per-branch linear-attention state, which targets ' +
        'with KDA layers (layers 0, 1, 2, 4, 5, 6) do not have; use chain drafting (omit `tree`)',
    );
  });
  it('an all-attention target accepts it; maxDraftTokens = total_tokens', () => {
    expect(tree.maxDraftTokens).toBe(10);
    expect(tree.tree).toEqual({ topK: 2, depth: 4, totalTokens: 10 });
    expect(chain1.maxDraftTokens).toBe(10);
  });
});

describe.each(NAMES)('tree drafting on golden %s', (name) => {
  it('top_k 1 gives exactly the greedy chain (the golden first proposal), as a tree of parents i − 1', () => {
    const g = goldens.get(name)!;
    const seq = addGolden(chain1, 'a', name);
    try {
      const [p] = chain1.propose({ sequences: [seq(10)] });
      expect(Array.from(p!.tokens)).toEqual(g.want);
      expect(Array.from(p!.parents!)).toEqual([-1, 0, 1, 2, 3, 4]);
      expect(p!.probs).toBeUndefined();
      const [short] = chain1.propose({ sequences: [seq(3)] });
      expect(Array.from(short!.tokens)).toEqual(g.want.slice(0, 3));
      expect(Array.from(short!.parents!)).toEqual([-1, 0, 1]);
      expect(chain1.contextLength('a')).toBe(g.T);
    } finally {
      chain1.freeSequence('a');
    }
    expect(chain1.pagesInUse).toBe(0);
  });

  it('top_k 2, depth 4, total 10: a valid ancestor-closed tree equal to the one rebuilt from forced chains', () => {
    const g = goldens.get(name)!;
    const seq = addGolden(tree, 'b', name);
    try {
      const pages = tree.pagesInUse;
      const d2t = tree.draftToTarget;
      const image = new Set(d2t);
      for (const maxDrafts of [10, 7, 1]) {
        const s = seq(maxDrafts);
        const [p] = tree.propose({ sequences: [s] });
        const tokens = Array.from(p!.tokens);
        const parents = Array.from(p!.parents!);
        expect(tokens.length).toBe(Math.min(10, maxDrafts));
        expect(parents.length).toBe(tokens.length);
        const depthOf: number[] = [];
        parents.forEach((q, e) => {
          expect(q).toBeGreaterThanOrEqual(-1);
          expect(q).toBeLessThan(e); // topological, and the parent is in the tree: ancestor-closed
          depthOf.push(q < 0 ? 1 : depthOf[q]! + 1);
          if (e > 0) expect(depthOf[e]).toBeGreaterThanOrEqual(depthOf[e - 1]!); // by depth
        });
        expect(Math.max(...depthOf)).toBeLessThanOrEqual(4);
        for (const t of tokens) expect(image.has(t)).toBe(true);
        // siblings are distinct tokens
        const sib = new Set(parents.map((q, e) => `${q}:${tokens[e]}`));
        expect(sib.size).toBe(tokens.length);
        // the root's children: the top 2 of step 1's logits (rank 1 always kept, in rank order)
        const step1 = tree.forcedChainLogits(s, []);
        const top = topK(step1, 2).map((t) => d2t[t]!);
        const roots = tokens.filter((_, e) => parents[e] === -1);
        expect(roots[0]).toBe(top[0]);
        expect(top.slice(0, roots.length)).toEqual(roots);
        expect(roots[0]).toBe(g.want[0]);
        // every node's children are the top_k of the chain step over its ancestor path
        expect({ tokens, parents }).toEqual(expectedTree(tree, s, 2, 4, Math.min(10, maxDrafts)));
        expect(tree.contextLength('b')).toBe(g.T);
        expect(tree.pagesInUse).toBe(pages);
      }
    } finally {
      tree.freeSequence('b');
    }
    expect(tree.pagesInUse).toBe(0);
  });
});

describe('confidence (chains)', () => {
  it("c_j is the largest probability of step j's distribution: greedy, its softmax; sampled, its q", async () => {
    const Vd = chain.config.draftVocabSize;
    const toDraft = new Map(Array.from(chain.draftToTarget, (t, d) => [t, d]));
    for (const [temperature, id] of [
      [0, 'greedy'],
      [0.8, 'sampled'],
    ] as const) {
      const seqOf = addGolden(chain, id, NAMES[0]!);
      const seq = seqOf(4, temperature);
      const [p] = chain.propose({ sequences: [seq] });
      const c = p!.confidence!;
      expect(c.length).toBe(4);
      const drafts = Array.from(p!.tokens, (t) => toDraft.get(t)!);
      // the chain's logits with its drafts forced: step j's row saw drafts 1 … j − 1 only
      const lg = chain.forcedChainLogits(seqOf(4, temperature), drafts.slice(0, 3));
      for (let j = 0; j < 4; j++) {
        const row = lg.subarray(j * Vd, (j + 1) * Vd);
        if (temperature === 0) {
          const best = argmax(row, Vd)[0]!;
          expect(drafts[j]).toBe(best);
          expect(c[j]).toBe(softmax(row, Vd)[best]); // the same bits as softmax's entry
        } else {
          const q = samplingProbs(row, Vd, seq.sampling);
          expect(c[j]).toBe(q.reduce((m, v) => Math.max(m, v), 0));
        }
        expect(c[j]).toBeGreaterThan(0);
        expect(c[j]).toBeLessThanOrEqual(1);
      }
      chain.freeSequence(id);
    }
    // off by default (drafter.confidence): every draft verified
    const plain = await loadDrafter(target);
    try {
      const seq = addGolden(plain, 'off', NAMES[0]!)(4);
      const [p] = plain.propose({ sequences: [seq] });
      expect(p!.tokens.length).toBe(4);
      expect(p!.confidence).toBeUndefined();
    } finally {
      plain.dispose();
    }
  });
});

describe('batching and fallbacks', () => {
  it('a batch of 2 sequences gives each its own tree, equal to drafting it alone', () => {
    const [n1, n2] = [NAMES[1]!, NAMES[3]!];
    const s1 = addGolden(tree, 'x', n1);
    const s2 = addGolden(tree, 'y', n2);
    try {
      const [a1] = tree.propose({ sequences: [s1(10)] });
      const [a2] = tree.propose({ sequences: [s2(6)] });
      const both = tree.propose({ sequences: [s1(10), s2(6)] });
      expect(both.map((p) => p.id)).toEqual(['x', 'y']);
      expect(Array.from(both[0]!.tokens)).toEqual(Array.from(a1!.tokens));
      expect(Array.from(both[0]!.parents!)).toEqual(Array.from(a1!.parents!));
      expect(Array.from(both[1]!.tokens)).toEqual(Array.from(a2!.tokens));
      expect(Array.from(both[1]!.parents!)).toEqual(Array.from(a2!.parents!));
      expect(both[1]!.tokens.length).toBe(6);
      expect(tree.contextLength('x')).toBe(goldens.get(n1)!.T);
      expect(tree.contextLength('y')).toBe(goldens.get(n2)!.T);
    } finally {
      tree.freeSequence('x');
      tree.freeSequence('y');
    }
    expect(tree.pagesInUse).toBe(0);
  });

  it(
    'temperature > 0 drafts a chain of min(depth, maxDrafts) (no ' +
      'parents, q returned); mixed with a greedy tree in one batch',
    () => {
      const name = NAMES[1]!;
      const V = target.info.vocabSize;
      const s1 = addGolden(tree, 's', name);
      const s2 = addGolden(tree, 't', name);
      try {
        const [c] = tree.propose({ sequences: [s1(10, 0.8)] });
        expect(c!.parents).toBeUndefined();
        expect(c!.tokens.length).toBe(4);
        expect(fullDraftProbs(c, V)!.length).toBe(4 * V); // q over the draft vocabulary, written out
        const [c2] = tree.propose({ sequences: [s1(3, 0.8)] });
        expect(c2!.tokens.length).toBe(3);
        const [alone] = tree.propose({ sequences: [s2(10)] });
        const mixed = tree.propose({ sequences: [s1(10, 0.8), s2(10)] });
        expect(mixed[0]!.parents).toBeUndefined();
        expect(mixed[0]!.tokens.length).toBe(4);
        expect(Array.from(mixed[1]!.tokens)).toEqual(Array.from(alone!.tokens));
        expect(Array.from(mixed[1]!.parents!)).toEqual(Array.from(alone!.parents!));
        expect(tree.contextLength('s')).toBe(goldens.get(name)!.T);
        expect(tree.contextLength('t')).toBe(goldens.get(name)!.T);
      } finally {
        tree.freeSequence('s');
        tree.freeSequence('t');
      }
      expect(tree.pagesInUse).toBe(0);
    },
  );

  it('maxDrafts beyond total_tokens is refused', () => {
    const seq = addGolden(tree, 'z', NAMES[0]!);
    try {
      expect(() => tree.propose({ sequences: [seq(11)] })).toThrow(/maxDrafts: expected \[1, 10\], got 11/);
    } finally {
      tree.freeSequence('z');
    }
  });
});
