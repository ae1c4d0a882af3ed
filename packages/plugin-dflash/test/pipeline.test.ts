// The context projection under pipeline parallelism (REFERENCE.md §1, §2): the target split into
// 4 stages [0,1) [1,2) [2,6) [6,8); each stage captures the taps it owns (`stageTaps`: tap t from the
// stage owning layer t − 1; [1,2) owns none — an empty capture stage) and adds its partial product
// Σ h_i·W_iᵀ to the fp32 accumulator it passes on; only the end applies the norm and writes the
// draft K/V. Each stage loads only its taps' fc blocks (`loadProjection`), in the drafter's projection format
// (bf16, or Q8_0 with int16 activations); the result is bitwise the one-stage projection and matches the reference
// goldens.
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  HfConfig,
  SafetensorsCheckpoint,
  SafetensorsFile,
  SequenceCache,
  stageTaps,
  type StageModel,
} from '@specd/core';
import { loadKimiStage } from '@specd/model-kimi-k3';

import { dflashPlugin, type DFlashDrafter } from '../src/index.js';
import { DFLASH_DIR, GOLDENS_DIR, loadDrafter, loadTarget, relError, TARGET_DIR } from './helpers.js';

const SPLITS = [
  [0, 1],
  [1, 2],
  [2, 6],
  [6, 8],
] as const;

let whole: StageModel;
let stages: StageModel[];
let bf16Drafter: DFlashDrafter;
/** The same checkpoint with Q8_0 layers: its context projection in Q8_0 (core's projectionFormatOf). */
let q8: DFlashDrafter;
beforeAll(async () => {
  whole = loadTarget();
  const weights = SafetensorsCheckpoint.open(TARGET_DIR);
  try {
    stages = SPLITS.map(([a, b]) =>
      loadKimiStage({ dir: TARGET_DIR, config: HfConfig.read(TARGET_DIR), weights }, { layerStart: a, layerEnd: b }),
    );
  } finally {
    weights.close();
  }
  bf16Drafter = await loadDrafter(whole, {}, 4, 1024, { weights: 'bf16' });
  q8 = await loadDrafter(whole, {}, 4, 1024, { weights: 'q8_0' });
});
afterAll(() => {
  bf16Drafter.dispose();
  q8.dispose();
  stages.forEach((s) => {
    s.dispose();
  });
  whole.dispose();
});

describe('pipeline-parallel context projection', () => {
  it('stageTaps assigns each tap to the stage producing it', () => {
    expect(stages.map((s) => stageTaps(bf16Drafter.config.taps, s.info))).toEqual([[1], [], [3, 5], [7]]);
    expect(stageTaps([0, 4], { layerStart: 0, layerEnd: 4, isFirst: true })).toEqual([0, 4]);
    expect(stageTaps([0, 4], { layerStart: 4, layerEnd: 8, isFirst: false })).toEqual([]);
  });

  it('the projection format follows the weights setting', () => {
    expect(bf16Drafter.projectionFormat).toBe('bf16');
    expect(q8.projectionFormat).toBe('q8_0');
  });

  it.each(['bf16', 'q8_0'] as const)(
    '%s: partial sums over 4 stages (one without taps), each with its own fc ' +
      'blocks, are bitwise the one-stage projection; golden context K/V',
    (format) => {
      const drafter = format === 'bf16' ? bf16Drafter : q8;
      const g = SafetensorsFile.open(path.join(GOLDENS_DIR, 'prose-long.safetensors'));
      try {
        const ids = Int32Array.from(g.read('input_ids').data as Int32Array);
        const T = ids.length;
        const seq = { id: 'p', position: 0, tokens: ids, logits: 'none' as const };
        // one stage
        const c1 = new SequenceCache(whole.cacheGeometry, { numPages: 64, numSlots: 1 });
        c1.add('p');
        const one = whole.forward({ sequences: [seq] }, c1, { taps: drafter.captureSetter(whole.info) });
        const ref = drafter.projectTargetHiddenPartial(one.taps, T);
        // four stages, hidden and accumulator handed on
        let hidden: Float32Array | undefined;
        let acc: Float32Array | undefined;
        for (const st of stages) {
          const cache = new SequenceCache(st.cacheGeometry, { numPages: 64, numSlots: 1 });
          cache.add('p');
          const mine = stageTaps(drafter.captureSetter(whole.info), st.info);
          const r = st.forward({ sequences: [seq], hidden }, cache, { taps: mine });
          expect([...r.taps.keys()]).toEqual(mine);
          // the stage's own share of fc (DrafterPlugin.loadProjection): only its taps' column blocks
          const ckpt = SafetensorsCheckpoint.open(DFLASH_DIR);
          const share = dflashPlugin.loadProjection!(
            { dir: DFLASH_DIR, config: HfConfig.read(DFLASH_DIR), weights: ckpt },
            { taps: mine, hiddenSize: 256, format: drafter.projectionFormat },
          );
          ckpt.close();
          expect(share.reads.map((x) => x.cols)).toEqual(
            mine.map((t) => [drafter.config.taps.indexOf(t) * 256, (drafter.config.taps.indexOf(t) + 1) * 256]),
          );
          acc = share.projectTargetHiddenPartial(r.taps, T, acc);
          hidden = r.hidden;
        }
        // accumulate-by-tap in ascending order: bitwise the one-stage projection, whatever the partition
        expect(new Uint32Array(acc!.buffer)).toEqual(new Uint32Array(ref.buffer));
        drafter.addSequence('pp');
        try {
          drafter.writeProjectedContextKV(acc!, [{ id: 'pp', position: 0, numTokens: T }]);
          const W = drafter.config.numKvHeads * drafter.config.headDim;
          const k0 = new Float32Array(T * W);
          const pool = drafter.pool.layerStore(0);
          for (let p = 0; p < T; p++)
            k0.set(pool.subarray(drafter.pool.tokenOffset('pp', p), drafter.pool.tokenOffset('pp', p) + W), p * W);
          expect(relError(k0, g.read('dflash.layer.0.k').data as Float32Array)).toBeLessThan(1e-2);
        } finally {
          drafter.freeSequence('pp');
        }
      } finally {
        g.close();
      }
    },
  );
});
