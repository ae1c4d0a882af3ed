// Speculative decoding with the request's logits processors (repetition / frequency / presence penalties,
// logit_bias, min_tokens; core engine/logits-processors.ts) stays lossless on the shipped target, per shipped
// drafter: greedy output equals plain decoding's (no drafter) token for token, with the drafter's whole block
// verified every step (draftPolicy 'max'), so the penalised rows at draft positions j > 0 decide acceptance; and the
// settings change the output (else the identity would prove nothing). The shipped drafters rarely agree with a
// penalised target, so an oracle drafter that proposes plain decoding's own tokens (one in nine corrupted) also runs:
// every row of its blocks decides a token, so a verify row processed without the drafts before it would change the
// output.
// Each drafter is loaded through its checkpoint's config.json (the registry picks the plugin).
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  BUILTIN_PLUGIN_PACKAGES,
  SpecEngine,
  loadDrafter,
  loadTarget,
  type DraftBatch,
  type Drafter,
  type DraftProposal,
  type LoadedTarget,
  type SamplingParams,
  type SpecResult,
} from '@specd/core';
import { skipWithoutFiles } from './require-files.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const TARGET = path.join(ROOT, 'models/kimi-k3-tiny');
const DRAFTERS = ['dflash', 'dspark', 'eagle3'].filter(
  (m) =>
    !skipWithoutFiles(
      `greedy speculation with penalties with ${m}`,
      [path.join(ROOT, 'models', `kimi-k3-tiny-${m}`, 'config.json')],
      'git checkout -- models/',
    ),
);
const PROMPTS = ['The history of the', 'Once upon a time, there was a', 'The United States of'];
const MAX_TOKENS = 40;

/** Settings strong enough to change the tiny model's greedy output. */
const SETTINGS: readonly [string, SamplingParams][] = [
  ['repetition_penalty 1.3', { temperature: 0, repetitionPenalty: 1.3 }],
  ['frequency 0.6 + presence 0.4', { temperature: 0, frequencyPenalty: 0.6, presencePenalty: 0.4 }],
  [
    'all of them, logit_bias and min_tokens',
    {
      temperature: 0,
      repetitionPenalty: 1.15,
      frequencyPenalty: 0.3,
      presencePenalty: -0.2,
      minTokens: 8,
      logitBias: new Map([
        [13, 3],
        [264, -5],
      ]),
    },
  ],
];

let target: LoadedTarget;
let prompts: Int32Array[];

beforeAll(async () => {
  target = await loadTarget(TARGET, BUILTIN_PLUGIN_PACKAGES);
  prompts = PROMPTS.map((p) => target.tokenizer.encode(p, { addSpecialTokens: false }));
});
afterAll(() => target?.model.dispose());

/** Greedy outputs of every prompt, batched, with `drafter` ('max': its whole block each step) or plain decoding. */
function run(drafter: Drafter | undefined, sampling: SamplingParams): SpecResult[] {
  const engine = new SpecEngine(target.model, drafter, {
    maxSequences: 4,
    maxTokensPerSequence: 256,
    draftPolicy: 'max',
  });
  const results = engine.run(
    prompts.map((promptIds, id) => ({
      id,
      promptIds,
      maxTokens: MAX_TOKENS,
      sampling,
      seed: 1,
      eosTokenIds: target.eosTokenIds,
    })),
  );
  expect(engine.cache.pagesInUse + engine.cache.slotsInUse).toBe(0);
  return results.sort((a, b) => Number(a.id) - Number(b.id));
}

describe.each(DRAFTERS)('greedy speculation with penalties with %s', (method) => {
  it.each(SETTINGS)('%s: the tokens of plain decoding with the same settings', async (_name, sampling) => {
    const dir = path.join(ROOT, 'models', `kimi-k3-tiny-${method}`);
    const { drafter } = await loadDrafter(dir, BUILTIN_PLUGIN_PACKAGES, target, 256, 4);
    try {
      expect(drafter.method).toBe(method);
      const plain = run(undefined, sampling);
      const spec = run(drafter, sampling);
      expect(spec.map((r) => r.tokenIds)).toEqual(plain.map((r) => r.tokenIds));
      expect(spec.map((r) => r.finishReason)).toEqual(plain.map((r) => r.finishReason));
      const accepted = spec.reduce((a, r) => a + r.metrics.accepted, 0);
      expect(accepted).toBeGreaterThan(0);
      // the settings change the output: the identity above is not plain greedy's
      const unpenalised = run(undefined, { temperature: 0 });
      expect(unpenalised.map((r) => r.tokenIds)).not.toEqual(plain.map((r) => r.tokenIds));
      if (sampling.minTokens !== undefined)
        for (const r of spec)
          expect(r.tokenIds.slice(0, sampling.minTokens).some((t) => target.eosTokenIds.includes(t))).toBe(false);
      console.log(
        `${method}, ${_name}: ${spec.length} × ${MAX_TOKENS} tokens equal plain decoding; ` +
          `${accepted} drafts accepted of ${spec.reduce((a, r) => a + r.metrics.drafted, 0)}`,
      );
    } finally {
      drafter.dispose();
    }
  });
});

/**
 * Proposes the expected output of each request (by id) after the tokens generated so far, every ninth draft
 * replaced by another token (so blocks are rejected too). No draft context.
 */
class OracleDrafter implements Drafter {
  readonly method = 'oracle';
  readonly maxDraftTokens = 6;
  readonly pagesInUse = 0;
  private proposed = 0;
  constructor(
    private readonly expected: ReadonlyMap<number, readonly number[]>,
    private readonly promptLength: ReadonlyMap<number, number>,
  ) {}
  captureSetter(): readonly number[] {
    return [];
  }
  projectTargetHiddenPartial(_taps: ReadonlyMap<number, Float32Array>, n: number): Float32Array {
    return new Float32Array(n);
  }
  writeProjectedContextKV(): void {}
  propose(batch: DraftBatch): DraftProposal[] {
    return batch.sequences.map((s) => {
      const out = this.expected.get(Number(s.id))!;
      const generated = s.history.length - this.promptLength.get(Number(s.id))!;
      const tokens = Int32Array.from(out.slice(generated, generated + s.maxDrafts));
      for (let j = 0; j < tokens.length; j++) if (++this.proposed % 9 === 0) tokens[j] = (tokens[j]! + 1) % 1000;
      return { id: s.id, tokens };
    });
  }
  addSequence(): void {}
  contextLength(): number {
    return 0;
  }
  freeSequence(): void {}
  dispose(): void {}
}

describe('greedy speculation with penalties with an oracle drafter', () => {
  it.each(SETTINGS)('%s: every verify row decides, and the tokens are plain decoding', (name, sampling) => {
    const plain = run(undefined, sampling);
    const oracle = new OracleDrafter(
      new Map(plain.map((r) => [Number(r.id), r.tokenIds])),
      new Map(prompts.map((p, id) => [id, p.length])),
    );
    const spec = run(oracle, sampling);
    expect(spec.map((r) => r.tokenIds)).toEqual(plain.map((r) => r.tokenIds));
    const accepted = spec.reduce((a, r) => a + r.metrics.accepted, 0);
    const drafted = spec.reduce((a, r) => a + r.metrics.drafted, 0);
    // most drafts are plain decoding's own tokens: accepted, so the later rows of each block are judged
    expect(accepted).toBeGreaterThan(drafted / 3);
    expect(accepted).toBeLessThan(drafted);
    console.log(`oracle, ${name}: ${accepted} drafts accepted of ${drafted}`);
  });
});
