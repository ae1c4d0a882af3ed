// The DFlash drafter's pieces against the PyTorch goldens (tools/reference/goldens.py): context
// features (hidden_norm(fc(taps)), projected per tap and summed in fp32), the per-layer context K/V
// in the draft pages (k_norm + RoPE), and the greedy first proposal after prefill. The golden taps
// (hidden.{i}) are fed in, so the drafter is checked in isolation from the target's rounding.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { SafetensorsFile, type StageModel } from '@specd/core';
import { rmsNorm } from '@specd/native';

import type { DFlashDrafter } from '../src/index.js';
import { GOLDENS_DIR, loadDrafter, loadTarget, relError } from './helpers.js';

const index = JSON.parse(fs.readFileSync(path.join(GOLDENS_DIR, 'index.json'), 'utf8')) as {
  goldens: Record<string, { file: string; T: number; first_token: number }>;
};

let target: StageModel;
let drafter: DFlashDrafter;
beforeAll(async () => {
  target = loadTarget();
  // the reference numerics: bf16 draft layers (the Q8_0 formats are checked against them in engine.test.ts)
  drafter = await loadDrafter(target, {}, 4, 1024, { weights: 'bf16' });
});
afterAll(() => {
  drafter.dispose();
  target.dispose();
});

describe.each(Object.keys(index.goldens))('DFlash vs golden %s', (name) => {
  const entry = index.goldens[name]!;
  const g = SafetensorsFile.open(path.join(GOLDENS_DIR, entry.file));
  afterAll(() => g.close());
  const f32 = (n: string) => g.read(n).data as Float32Array;
  const T = entry.T;

  it('context features, draft K/V pages and the first greedy proposal match', () => {
    const D = drafter.config.hiddenSize;
    const taps = new Map(drafter.config.taps.map((t) => [t, f32(`hidden.${t}`)]));
    // partial projections, one "stage" per tap, accumulated in fp32, norm after the sum
    let acc: Float32Array | undefined;
    for (const [t, h] of taps) acc = drafter.projectTargetHiddenPartial(new Map([[t, h]]), T, acc);
    const context = rmsNorm(
      acc!,
      (drafter as unknown as { hiddenNorm: Float32Array }).hiddenNorm,
      drafter.config.rmsNormEps,
    );
    expect(relError(context, f32('dflash.context'))).toBeLessThan(1e-3);
    expect(context.length).toBe(T * D);

    const id = `golden-${name}`;
    drafter.addSequence(id);
    try {
      drafter.writeProjectedContextKV(acc!, [{ id, position: 0, numTokens: T }]);
      expect(drafter.contextLength(id)).toBe(T);
      const W = drafter.config.numKvHeads * drafter.config.headDim;
      for (let j = 0; j < drafter.config.numLayers; j++) {
        for (const [kind, store] of [
          ['k', 2 * j],
          ['v', 2 * j + 1],
        ] as const) {
          const got = new Float32Array(T * W);
          const pool = drafter.pool.layerStore(store);
          for (let p = 0; p < T; p++) {
            const off = drafter.pool.tokenOffset(id, p);
            got.set(pool.subarray(off, off + W), p * W);
          }
          expect(relError(got, f32(`dflash.layer.${j}.${kind}`)), `layer ${j} ${kind}`).toBeLessThan(1e-3);
        }
      }
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
      const want = Array.from(g.read('dflash.first_proposal').data as Int32Array);
      const got = Array.from(prop!.tokens);
      expect(got.length).toBe(want.length);
      expect(got).toEqual(want);
      expect(drafter.contextLength(id)).toBe(T); // the block's KV is discarded
    } finally {
      drafter.freeSequence(id);
    }
    expect(drafter.pagesInUse).toBe(0);
  });
});
