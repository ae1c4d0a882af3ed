// Tree verification through the engine on SmolLM2 (an attention-only target): a drafter that
// proposes a token tree whose branches mix the target's own greedy continuation with wrong tokens
// (so acceptance follows a non-first branch, stops inside the tree, or accepts a whole path).
// Greedy output must be plain decoding's; one target forward per verify step; pages freed; and the
// tree's accepted depth must exceed what its first chain alone would give.
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  BUILTIN_PLUGIN_PACKAGES,
  EngineError,
  SpecEngine,
  loadTarget,
  type DraftBatch,
  type Drafter,
  type DraftProposal,
  type LoadedTarget,
  type SequenceId,
  type StageInfo,
} from '@specd/core';
import { skipWithoutFiles } from '../../../test/require-files.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const GGUF_DIR = path.join(ROOT, 'models/smollm2-135m-instruct');
const HAVE = !skipWithoutFiles('tree verification in the engine (SmolLM2)', [
  path.join(GGUF_DIR, 'SmolLM2-135M-Instruct.Q4_1.gguf'),
]);

/**
 * Knows the plain greedy continuation of each prompt. Tree per step (indices into the proposal):
 *   0: wrong (child of root)       1: right₁ (child of root)
 *   2: right₂ (child of 1)         3: wrong (child of 1)
 *   4: wrong (child of 2) or right₃ every other step, 5: right₃ (child of 2) otherwise wrong
 * so the target's path is root → 1 → 2 → (4 | 5): three accepted drafts, found off the first branch.
 */
class OracleTreeDrafter implements Drafter {
  readonly method = 'oracle-tree';
  readonly maxDraftTokens = 6;
  readonly pagesInUse = 0;
  step = 0;
  constructor(private readonly truth: Map<SequenceId, { promptLength: number; out: number[] }>) {}
  captureSetter(_t: StageInfo): readonly number[] {
    return [];
  }
  projectTargetHiddenPartial(_s: ReadonlyMap<number, Float32Array>, n: number, acc?: Float32Array): Float32Array {
    return acc ?? new Float32Array(n);
  }
  writeProjectedContextKV(): void {}
  propose(batch: DraftBatch): DraftProposal[] {
    return batch.sequences.map((s) => {
      const t = this.truth.get(s.id)!;
      const done = s.history.length - t.promptLength; // generated tokens so far (the last verified one included)
      const right = (j: number) => t.out[done + j] ?? 0;
      const wrong = (j: number) => (right(j) + 7) % 49152;
      const flip = this.step++ % 2 === 0;
      const tokens = [wrong(0), right(0), right(1), wrong(1), flip ? wrong(2) : right(2), flip ? right(2) : wrong(2)];
      const parents = [-1, -1, 1, 1, 2, 2];
      const k = Math.min(s.maxDrafts, tokens.length);
      return { id: s.id, tokens: Int32Array.from(tokens.slice(0, k)), parents: Int32Array.from(parents.slice(0, k)) };
    });
  }
  addSequence(): void {}
  contextLength(): number {
    return 0;
  }
  freeSequence(): void {}
  dispose(): void {}
}

describe.skipIf(!HAVE)('tree verification in the engine (SmolLM2)', () => {
  let target: LoadedTarget;
  beforeAll(async () => {
    target = await loadTarget(GGUF_DIR, BUILTIN_PLUGIN_PACKAGES);
  });
  afterAll(() => target?.model.dispose());

  it(
    'greedy output equals plain decoding; one forward per ' +
      'verify step; the tree accepts 3 drafts off its first branch',
    () => {
      const prompts = [
        '<|im_start|>user\nList three fruits.<|im_end|>\n<|im_start|>assistant\n',
        'The capital of France is',
      ].map((t) => target.tokenizer.encode(t, { addSpecialTokens: false }));
      const reqs = () =>
        prompts.map((ids, i) => ({
          id: i,
          promptIds: ids,
          maxTokens: 30,
          sampling: { temperature: 0 },
          seed: 0,
          ignoreEos: true,
        }));
      const plain = new SpecEngine(target.model, undefined, { maxSequences: 2, maxTokensPerSequence: 512 }).run(reqs());
      const truth = new Map(
        plain.map((r) => [r.id, { promptLength: prompts[r.id as number]!.length, out: r.tokenIds }]),
      );
      const drafter = new OracleTreeDrafter(truth);
      const e = new SpecEngine(target.model, drafter, {
        maxSequences: 2,
        maxTokensPerSequence: 512,
        draftPolicy: 'max',
      });
      const spec = e.run(reqs());
      for (const r of spec) expect(r.tokenIds).toEqual(plain.find((p) => p.id === r.id)!.tokenIds);
      const m = e.metrics;
      expect(m.decodeForwards).toBe(m.verifyForwards);
      // every full step accepts right₁ → right₂ → right₃: 3 drafts (+ bonus = 4 committed)
      const hist = m.requests.map((q) => q.acceptanceLengthHistogram);
      expect(hist.every((h) => (h[4] ?? 0) >= 5)).toBe(true);
      expect(m.tauPerStep).toBeGreaterThan(3);
      expect(e.cache.pagesInUse + e.cache.slotsInUse).toBe(0);
    },
  );

  it('a tree at temperature > 0 is refused with a clear error', () => {
    const ids = target.tokenizer.encode('Hello', { addSpecialTokens: false });
    const drafter = new OracleTreeDrafter(new Map([[0, { promptLength: ids.length, out: Array(40).fill(11) }]]));
    const e = new SpecEngine(target.model, drafter, { maxSequences: 1, maxTokensPerSequence: 256, draftPolicy: 'max' });
    // the request fails alone (engine/types.ts SequenceError), its cause the engine's refusal
    const [r] = e.run([{ id: 0, promptIds: ids, maxTokens: 8, sampling: { temperature: 0.7 }, seed: 1 }]);
    expect(r?.finishReason).toBe('error');
    expect(r?.error?.cause).toBeInstanceOf(EngineError);
    expect(r?.error?.message).toMatch(/tree drafts are verified greedily only/);
    expect(e.cache.pagesInUse + e.cache.slotsInUse).toBe(0);
  });
});
