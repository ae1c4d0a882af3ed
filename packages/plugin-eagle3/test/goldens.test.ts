// The EAGLE-3 drafter against the PyTorch goldens (tools/reference/goldens.py): the greedy first
// proposal after prefill (`eagle3.first_proposal`, 6 chained drafts, the greedy first token as the
// last verified token). The golden taps (hidden.{i}) are fed in, so the drafter is checked in
// isolation from the target's rounding; the fc projection is accumulated per tap ("stage") in fp32. Both weight
// formats: the checkpoint's bf16 (the reference's arithmetic) and the default Q8_0 (the same chains on these
// goldens; a Q8_0 chain may differ from the reference elsewhere, the engine tests bound its τ).
import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { SafetensorsFile, type StageModel } from '@specd/core';

import type { Eagle3Drafter } from '../src/index.js';
import { EAGLE3_DIR, GOLDENS_DIR, loadDrafter, loadTarget } from './helpers.js';

const index = JSON.parse(fs.readFileSync(path.join(GOLDENS_DIR, 'index.json'), 'utf8')) as {
  drafters: string[];
  goldens: Record<string, { file: string; T: number; first_token: number }>;
};

let target: StageModel;
let drafter: Eagle3Drafter;
const byFormat = new Map<string, Eagle3Drafter>();
beforeAll(async () => {
  target = loadTarget();
  drafter = await loadDrafter(target);
  for (const weights of ['bf16', 'q8_0'])
    byFormat.set(weights, await loadDrafter(target, { settings: { method: 'eagle3', path: EAGLE3_DIR, weights } }));
});
afterAll(() => {
  drafter.dispose();
  for (const d of byFormat.values()) d.dispose();
  target.dispose();
});

it('the goldens hold EAGLE-3 proposals', () => {
  expect(index.drafters).toContain('eagle3');
});

describe.each(Object.keys(index.goldens).flatMap((name) => ['bf16', 'q8_0'].map((w) => [name, w] as const)))(
  'EAGLE-3 vs golden %s, weights %s',
  (name, weights) => {
    const entry = index.goldens[name]!;
    const g = SafetensorsFile.open(path.join(GOLDENS_DIR, entry.file));
    afterAll(() => g.close());
    const f32 = (n: string) => g.read(n).data as Float32Array;
    const T = entry.T;

    it('the first greedy chain (6 drafts) equals the reference token for token; the chain KV is discarded', () => {
      const drafter = byFormat.get(weights)!;
      const ids = g.read('input_ids').data as Int32Array;
      expect(ids.length).toBe(T);
      let acc: Float32Array | undefined;
      for (const t of drafter.config.taps)
        acc = drafter.projectTargetHiddenPartial(new Map([[t, f32(`hidden.${t}`)]]), T, acc);
      // x_{t+1} for t = 0 … T − 1: the prompt shifted by one, then the first generated token
      const next = new Int32Array(T);
      next.set(ids.subarray(1));
      next[T - 1] = entry.first_token;
      const id = `golden-${name}`;
      drafter.addSequence(id);
      try {
        // two spans' worth (split context writes must equal one write)
        const cut = Math.max(1, T >> 1);
        const D = drafter.config.hiddenSize;
        drafter.writeProjectedContextKV(acc!.slice(0, cut * D), [
          { id, position: 0, numTokens: cut, nextTokens: next.slice(0, cut) },
        ]);
        if (cut < T)
          drafter.writeProjectedContextKV(acc!.slice(cut * D), [
            { id, position: cut, numTokens: T - cut, nextTokens: next.slice(cut) },
          ]);
        expect(drafter.contextLength(id)).toBe(T);
        const pages = drafter.pagesInUse;
        const [prop] = drafter.propose({
          sequences: [
            {
              id,
              position: T,
              lastToken: entry.first_token,
              maxDrafts: drafter.maxDraftTokens,
              history: new Int32Array(0),
              sampling: { temperature: 0 },
              rng: { next: () => 0 },
            },
          ],
        });
        const want = Array.from(g.read('eagle3.first_proposal').data as Int32Array);
        expect(want.length).toBe(6);
        expect(Array.from(prop!.tokens)).toEqual(want);
        expect(prop!.probs).toBeUndefined();
        expect(drafter.contextLength(id)).toBe(T);
        expect(drafter.pagesInUse).toBe(pages);
        // a shorter chain is the longer chain's prefix
        const [short] = drafter.propose({
          sequences: [
            {
              id,
              position: T,
              lastToken: entry.first_token,
              maxDrafts: 2,
              history: new Int32Array(0),
              sampling: { temperature: 0 },
              rng: { next: () => 0 },
            },
          ],
        });
        expect(Array.from(short!.tokens)).toEqual(want.slice(0, 2));
      } finally {
        drafter.freeSequence(id);
      }
      expect(drafter.pagesInUse).toBe(0);
    });
  },
);

describe('batching', () => {
  it('one batch of every golden (mixed maxDrafts) gives each sequence its own chain', () => {
    const names = Object.keys(index.goldens);
    const seqs = names.map((name, i) => {
      const entry = index.goldens[name]!;
      const g = SafetensorsFile.open(path.join(GOLDENS_DIR, entry.file));
      try {
        const T = entry.T;
        const ids = g.read('input_ids').data as Int32Array;
        let acc: Float32Array | undefined;
        for (const t of drafter.config.taps)
          acc = drafter.projectTargetHiddenPartial(new Map([[t, g.read(`hidden.${t}`).data as Float32Array]]), T, acc);
        const next = new Int32Array(T);
        next.set(ids.subarray(1));
        next[T - 1] = entry.first_token;
        return {
          id: `batch-${name}`,
          T,
          acc: acc!,
          next,
          want: Array.from(g.read('eagle3.first_proposal').data as Int32Array),
          k: 6 - i,
          first: entry.first_token,
        };
      } finally {
        g.close();
      }
    });
    try {
      for (const s of seqs) drafter.addSequence(s.id);
      const D = drafter.config.hiddenSize;
      const sum = new Float32Array(seqs.reduce((a, s) => a + s.T, 0) * D);
      let at = 0;
      for (const s of seqs) {
        sum.set(s.acc, at);
        at += s.acc.length;
      }
      drafter.writeProjectedContextKV(
        sum,
        seqs.map((s) => ({ id: s.id, position: 0, numTokens: s.T, nextTokens: s.next })),
      );
      const props = drafter.propose({
        sequences: seqs.map((s) => ({
          id: s.id,
          position: s.T,
          lastToken: s.first,
          maxDrafts: s.k,
          history: new Int32Array(0),
          sampling: { temperature: 0 },
          rng: { next: () => 0 },
        })),
      });
      props.forEach((p, i) => {
        expect(p.id).toBe(seqs[i]!.id);
        expect(Array.from(p.tokens)).toEqual(seqs[i]!.want.slice(0, seqs[i]!.k));
      });
      for (const s of seqs) expect(drafter.contextLength(s.id)).toBe(s.T);
    } finally {
      for (const s of seqs) drafter.freeSequence(s.id);
    }
    expect(drafter.pagesInUse).toBe(0);
  });
});
