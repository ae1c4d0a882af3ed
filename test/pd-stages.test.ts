// Routing a transfer's entries to the prefill instance's pipeline stages (pd/stages.ts), which both sides compute:
// a target entry goes to the stage that keeps its cache layer (model-llama's K and V of layer l are cache layers
// 2l and 2l + 1; Kimi's are its layer ids), the drafter's entries and a layer no stage keeps to the last stage
// (the driver); each stage writes under its own transfer id, the last under the room itself.
import {
  entryStage,
  type LocalEntry,
  type PdEntryKey,
  type PdStageLayout,
  splitByStage,
  stageRequestId,
} from '@specd/core';
import { describe, expect, it } from 'vitest';

const key = (kind: PdEntryKey['kind'], layer: number, part = ''): PdEntryKey => ({ kind, layer, part, rank: 0 });

// llama, 4 layers at pp 3 (layers [0, 1), [1, 3), [3, 4)): cache layers 2l, 2l + 1
const LLAMA: PdStageLayout[] = [
  { layerStart: 0, layerEnd: 1, cacheLayers: [0, 1] },
  { layerStart: 1, layerEnd: 3, cacheLayers: [2, 3, 4, 5] },
  { layerStart: 3, layerEnd: 4, cacheLayers: [6, 7] },
];
// Kimi, 8 layers at pp 2: MLA layers 3 and 7, KDA the others (cache layers = layer ids, paged then linear)
const KIMI: PdStageLayout[] = [
  { layerStart: 0, layerEnd: 4, cacheLayers: [3, 0, 1, 2] },
  { layerStart: 4, layerEnd: 8, cacheLayers: [7, 4, 5, 6] },
];

describe('pd stages', () => {
  it('a target entry goes to the stage keeping its cache layer', () => {
    expect([0, 1, 2, 3, 4, 5, 6, 7].map((l) => entryStage(key('target-kv', l), LLAMA))).toEqual([
      0, 0, 1, 1, 1, 1, 2, 2,
    ]);
    expect(entryStage(key('linear-state', 2), KIMI)).toBe(0);
    expect(entryStage(key('conv-state', 2), KIMI)).toBe(0);
    expect(entryStage(key('target-kv', 3), KIMI)).toBe(0);
    expect(entryStage(key('linear-state', 5), KIMI)).toBe(1);
  });

  it("the drafter's entries and a layer no stage keeps go to the last stage", () => {
    // draft layer 0 is not target layer 0
    expect(entryStage(key('draft-kv', 0, 'k'), LLAMA)).toBe(2);
    expect(entryStage(key('draft-state', 0, 'last-feature'), KIMI)).toBe(1);
    expect(entryStage(key('target-kv', 99), LLAMA)).toBe(2);
    // one stage (pp = 1): everything to it
    expect(entryStage(key('target-kv', 0), [{ layerStart: 0, layerEnd: 4, cacheLayers: [0] }])).toBe(0);
  });

  it('splits a layout by stage in layout order; transfer ids per stage, the room for the last', () => {
    const entries: LocalEntry[] = [
      key('target-kv', 7),
      key('target-kv', 0),
      key('draft-kv', 0, 'v'),
      key('target-kv', 3),
      key('target-kv', 1),
    ].map((k) => ({ key: k, ranges: [] }));
    const parts = splitByStage(entries, LLAMA).map((p) => p.map((e) => `${e.key.kind}/${e.key.layer}`));
    expect(parts).toEqual([['target-kv/0', 'target-kv/1'], ['target-kv/3'], ['target-kv/7', 'draft-kv/0']]);
    expect(LLAMA.map((_, k) => stageRequestId('42', k, LLAMA))).toEqual(['42/stage0', '42/stage1', '42']);
  });
});
