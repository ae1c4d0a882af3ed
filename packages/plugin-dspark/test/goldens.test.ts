// DSpark's first greedy proposal after prefill against the PyTorch goldens (`dspark.first_proposal`,
// tools/reference/goldens.py): next-token slots, Markov head left to right, block 7 → 7 drafts. The
// golden taps (hidden.{i}) are fed in, so the drafter is checked in isolation from the target's rounding.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { SafetensorsFile, SeededRandom, type StageModel } from '@specd/core';

import type { DSparkDrafter } from '../src/index.js';
import { GOLDENS_DIR, loadDrafter, loadTarget } from './helpers.js';

const index = JSON.parse(fs.readFileSync(path.join(GOLDENS_DIR, 'index.json'), 'utf8')) as {
  goldens: Record<string, { file: string; T: number; first_token: number }>;
};

let target: StageModel;
let drafter: DSparkDrafter;
let defaultDrafter: DSparkDrafter;
beforeAll(async () => {
  target = loadTarget();
  // the reference numerics: bf16 draft layers (the Q8_0 formats are checked against them in engine.test.ts)
  drafter = await loadDrafter(target, 4, 1024, { weights: 'bf16' });
  defaultDrafter = await loadDrafter(target, 4, 1024);
});
afterAll(() => {
  drafter.dispose();
  defaultDrafter.dispose();
  target.dispose();
});

it('loads as method dspark with block_size drafts per step', () => {
  expect(drafter.method).toBe('dspark');
  expect(drafter.maxDraftTokens).toBe(7);
  expect(drafter.config.markovRank).toBe(64);
});

describe.each(Object.keys(index.goldens))('DSpark vs golden %s', (name) => {
  const entry = index.goldens[name]!;
  const g = SafetensorsFile.open(path.join(GOLDENS_DIR, entry.file));
  afterAll(() => g.close());
  const f32 = (n: string) => g.read(n).data as Float32Array;
  const T = entry.T;

  it('the first greedy proposal matches dspark.first_proposal; confidences in (0, 1)', () => {
    const id = `golden-${name}`;
    let acc: Float32Array | undefined;
    for (const t of drafter.config.taps)
      acc = drafter.projectTargetHiddenPartial(new Map([[t, f32(`hidden.${t}`)]]), T, acc);
    drafter.addSequence(id);
    try {
      drafter.writeProjectedContextKV(acc!, [{ id, position: 0, numTokens: T }]);
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
      const want = Array.from(g.read('dspark.first_proposal').data as Int32Array);
      expect(want.length).toBe(7);
      expect(Array.from(prop!.tokens)).toEqual(want);
      expect(prop!.probs).toBeUndefined();
      expect(prop!.confidence!.length).toBe(7);
      for (const c of prop!.confidence!) expect(c > 0 && c < 1).toBe(true);
      expect(drafter.contextLength(id)).toBe(T); // the block's KV is discarded
      // fewer drafts: a prefix of the same left-to-right chain
      const [short] = drafter.propose({
        sequences: [
          {
            id,
            position: T,
            lastToken: entry.first_token,
            maxDrafts: 3,
            history: new Int32Array(0),
            sampling: { temperature: 0 },
            rng: { next: () => 0 },
          },
        ],
      });
      expect(Array.from(short!.tokens)).toEqual(want.slice(0, 3));
    } finally {
      drafter.freeSequence(id);
    }
    expect(drafter.pagesInUse).toBe(0);
  });
});

// the bf16 drafter above, and the default one (on AVX-512 without AMX: Q8_0 draft layers and Markov projection)
describe.each([
  ['bf16 weights', () => drafter],
  ['default weights', () => defaultDrafter],
])('a batch of proposals, %s', (_, drafterOf) => {
  // every golden prompt's taps as one sequence's draft context
  const seqs = Object.entries(index.goldens).map(([name, entry], n) => ({ name, entry, n }));
  // sequence n drafts maxDrafts 7, 3, 5, 1 (cycled); every other one sampled (T 0.8, top-p 0.95; a seeded PRNG)
  const request = (s: (typeof seqs)[number]) => ({
    id: `batch-${s.name}`,
    position: s.entry.T,
    lastToken: s.entry.first_token,
    maxDrafts: [7, 3, 5, 1][s.n % 4]!,
    history: new Int32Array(0),
    sampling: s.n % 2 === 0 ? { temperature: 0 } : { temperature: 0.8, topP: 0.95 },
    rng: new SeededRandom(1234 + s.n),
  });

  it('gives every sequence the proposal it gets alone (tokens, q rows, confidences), bit for bit', () => {
    for (const s of seqs) {
      const g = SafetensorsFile.open(path.join(GOLDENS_DIR, s.entry.file));
      try {
        let acc: Float32Array | undefined;
        for (const t of drafterOf().config.taps)
          acc = drafterOf().projectTargetHiddenPartial(
            new Map([[t, g.read(`hidden.${t}`).data as Float32Array]]),
            s.entry.T,
            acc,
          );
        drafterOf().addSequence(`batch-${s.name}`);
        drafterOf().writeProjectedContextKV(acc!, [{ id: `batch-${s.name}`, position: 0, numTokens: s.entry.T }]);
      } finally {
        g.close();
      }
    }
    try {
      const alone = seqs.map((s) => drafterOf().propose({ sequences: [request(s)] })[0]!);
      const together = drafterOf().propose({ sequences: seqs.map(request) });
      expect(together.length).toBe(seqs.length);
      seqs.forEach((s, i) => {
        const a = alone[i]!;
        const b = together[i]!;
        expect(b.id).toBe(`batch-${s.name}`);
        expect(b.tokens.length).toBe(request(s).maxDrafts);
        expect(Array.from(b.tokens)).toEqual(Array.from(a.tokens));
        expect(Array.from(b.confidence!)).toEqual(Array.from(a.confidence!));
        if (s.n % 2 === 0) expect(b.probs).toBeUndefined();
        else {
          // q over the whole vocabulary (this drafter has no reduced one)
          const V = target.info.vocabSize;
          expect(b.probsIds).toBeUndefined();
          expect(b.probs!.length).toBe(request(s).maxDrafts * V);
          expect(Buffer.from(b.probs!.buffer).equals(Buffer.from(a.probs!.buffer))).toBe(true);
          // each drafted token has q > 0 in its row
          b.tokens.forEach((t, j) => {
            expect(b.probs![j * V + t]!).toBeGreaterThan(0);
          });
        }
      });
    } finally {
      for (const s of seqs) drafterOf().freeSequence(`batch-${s.name}`);
    }
    expect(drafterOf().pagesInUse).toBe(0);
  });
});

describe('setting confidence', () => {
  it('false: the same proposal without confidences; a non-boolean is refused naming the setting', async () => {
    const plain = await loadDrafter(target, 4, 1024, { confidence: false });
    try {
      const [name, entry] = Object.entries(index.goldens)[1]!;
      const g = SafetensorsFile.open(path.join(GOLDENS_DIR, entry.file));
      const props = [defaultDrafter, plain].map((d) => {
        const id = `conf-${name}`;
        let acc: Float32Array | undefined;
        for (const t of d.config.taps)
          acc = d.projectTargetHiddenPartial(new Map([[t, g.read(`hidden.${t}`).data as Float32Array]]), entry.T, acc);
        d.addSequence(id);
        try {
          d.writeProjectedContextKV(acc as Float32Array, [{ id, position: 0, numTokens: entry.T }]);
          const sampling = { temperature: 0.8, topP: 0.95 };
          const seq = { id, position: entry.T, lastToken: entry.first_token, maxDrafts: 5, history: new Int32Array(0) };
          return d.propose({ sequences: [{ ...seq, sampling, rng: new SeededRandom(7) }] })[0];
        } finally {
          d.freeSequence(id);
        }
      });
      g.close();
      const [withConf, without] = props;
      expect(withConf?.confidence?.length).toBe(5);
      expect(without?.confidence).toBeUndefined();
      expect(Array.from(without?.tokens ?? [])).toEqual(Array.from(withConf?.tokens ?? [1]));
      expect(without?.probs).toEqual(withConf?.probs);
    } finally {
      plain.dispose();
    }
    await expect(loadDrafter(target, 4, 1024, { confidence: 'yes' })).rejects.toThrow(
      /dspark: settings\.confidence: expected a boolean, got "yes"/,
    );
  });
});
