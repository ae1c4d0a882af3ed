// The engine's argmax-only forwards (ForwardOptions.argmaxOnly, ForwardResult.argmax), the contract a GPU stage
// uses to keep its logits on the device: a CPU stage wrapped to answer such forwards with argmax rows only must give
// the same greedy tokens as with logits, plain and speculative (EAGLE-3 on SmolLM2); a forward with any sampled,
// logprobs or penalized request still gets logits; a row flagged not finite (−1) fails its request alone.
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  BUILTIN_PLUGIN_PACKAGES,
  type ForwardBatch,
  type ForwardOptions,
  type ForwardResult,
  type LoadedTarget,
  type SequenceCache,
  SpecEngine,
  type SpecRequest,
  type StageModel,
  loadDrafter,
  loadTarget,
} from '@specd/core';
import { argmax } from '@specd/native';
import { skipWithoutFiles } from './require-files.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const GGUF_DIR = path.join(ROOT, 'models/smollm2-135m-instruct');
const EAGLE3 = path.join(ROOT, 'models/smollm2-135m-instruct-eagle3');
const HAVE = !skipWithoutFiles('SmolLM2 and its EAGLE-3 drafter', [
  path.join(GGUF_DIR, 'SmolLM2-135M-Instruct.Q4_1.gguf'),
  path.join(EAGLE3, 'config.json'),
]);

/**
 * A stage answering argmaxOnly forwards as a GPU stage does: each logit row's argmax (−1 for a row of a sequence in
 * `poisoned`), no logits. Records which forwards asked for argmax only. (The CPU Llama stage answers argmaxOnly
 * itself since issue 16's kept logits buffer; the wrapper then only poisons its argmax rows.)
 */
function argmaxOnlyStage(inner: StageModel, poisoned: Set<unknown>, asked: boolean[]): StageModel {
  const V = inner.info.vocabSize;
  return {
    info: inner.info,
    cacheGeometry: inner.cacheGeometry,
    embedTokens: inner.embedTokens?.bind(inner),
    lmHead: inner.lmHead?.bind(inner),
    dispose: () => {},
    forward(batch: ForwardBatch, cache: SequenceCache, options: ForwardOptions = {}): ForwardResult {
      asked.push(options.argmaxOnly === true);
      const res = inner.forward(batch, cache, options);
      if (options.argmaxOnly !== true) return res;
      // the Llama stage answers argmaxOnly itself (argmax rows, no logits); a stage that does not gets them here
      const top =
        res.argmax !== undefined
          ? Int32Array.from(res.argmax)
          : res.logits!.length === 0
            ? new Int32Array(0)
            : argmax(res.logits!, V);
      batch.sequences.forEach((s, i) => {
        if (poisoned.has(s.id)) top.fill(-1, res.logitRowStart[i]!, res.logitRowStart[i + 1]!);
      });
      return { ...res, logits: undefined, argmax: top };
    },
  } as StageModel;
}

describe.skipIf(!HAVE)('argmax-only forwards (the GPU stage contract) on SmolLM2', () => {
  let target: LoadedTarget;
  let prompts: Int32Array[];
  beforeAll(async () => {
    target = await loadTarget(GGUF_DIR, BUILTIN_PLUGIN_PACKAGES);
    prompts = [
      '<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n',
      'def add(a, b):\n    return',
      'The capital of France is',
    ].map((t) => target.tokenizer.encode(t, { addSpecialTokens: false }));
  });
  afterAll(() => target?.model.dispose());

  const greedy = (extra: Partial<SpecRequest> = {}): SpecRequest[] =>
    prompts.map((ids, i) => ({
      id: i,
      promptIds: ids,
      maxTokens: 20,
      sampling: { temperature: 0 },
      seed: 0,
      ignoreEos: true,
      ...extra,
    }));

  it('greedy plain and EAGLE-3 decoding give the same tokens from argmax rows as from logits', async () => {
    const opts = { maxSequences: 3, maxTokensPerSequence: 256 };
    const ref = new SpecEngine(target.model, undefined, opts).run(greedy());
    const asked: boolean[] = [];
    const wrapped = argmaxOnlyStage(target.model, new Set(), asked);
    const plain = new SpecEngine(wrapped, undefined, opts).run(greedy());
    for (const r of plain) expect(r.tokenIds).toEqual(ref.find((x) => x.id === r.id)!.tokenIds);
    expect(asked.length).toBeGreaterThan(0);
    expect(asked.every(Boolean)).toBe(true);
    const { drafter } = await loadDrafter(EAGLE3, BUILTIN_PLUGIN_PACKAGES, target, 256, 3);
    try {
      const e = new SpecEngine(wrapped, drafter, { ...opts, draftPolicy: 'max' });
      const spec = e.run(greedy());
      for (const r of spec) expect(r.tokenIds).toEqual(ref.find((x) => x.id === r.id)!.tokenIds);
      expect(e.metrics.drafted).toBeGreaterThan(0);
      expect(e.cache.pagesInUse + drafter.pagesInUse).toBe(0);
    } finally {
      drafter.dispose();
    }
  });

  it('a forward with a sampled, logprobs or penalized request is asked for logits', () => {
    const asked: boolean[] = [];
    const wrapped = argmaxOnlyStage(target.model, new Set(), asked);
    const opts = { maxSequences: 3, maxTokensPerSequence: 256 };
    for (const extra of [
      { sampling: { temperature: 0.8 }, seed: 1 },
      { logprobs: 2 },
      { sampling: { temperature: 0, repetitionPenalty: 1.3 } },
    ] as Partial<SpecRequest>[]) {
      asked.length = 0;
      const [first, ...rest] = greedy();
      const out = new SpecEngine(wrapped, undefined, opts).run([{ ...first!, ...extra }, ...rest]);
      expect(out.every((r) => r.finishReason === 'length')).toBe(true);
      // every forward holding the first request (prefill of request 0, and every decode step while it runs) had
      // logits; prefills of the greedy requests alone may be argmax-only
      expect(asked.filter((a) => !a).length).toBeGreaterThanOrEqual(20);
    }
  });

  it('a row flagged not finite fails its request alone', () => {
    const ref = new SpecEngine(target.model, undefined, { maxSequences: 3, maxTokensPerSequence: 256 }).run(greedy());
    const wrapped = argmaxOnlyStage(target.model, new Set([1]), []);
    const e = new SpecEngine(wrapped, undefined, { maxSequences: 3, maxTokensPerSequence: 256 });
    const out = e.run(greedy());
    const bad = out.find((r) => r.id === 1)!;
    expect(bad.finishReason).toBe('error');
    expect(String(bad.error)).toMatch(/not finite/);
    for (const id of [0, 2])
      expect(out.find((r) => r.id === id)!.tokenIds).toEqual(ref.find((r) => r.id === id)!.tokenIds);
    expect(e.cache.pagesInUse).toBe(0);
  });
});
