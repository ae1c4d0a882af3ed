// Past the draft model's trained positions (`max_position_embeddings`) its drafts are noise (DFlash's τ fell to 1.03
// in the field), so the engine stops drafting for a sequence once a block would reach that position and counts the
// plain steps (RequestMetrics.positionLimitedSteps; /metrics specd_spec_decode_position_limited_steps_total).
// With the shipped target and DFlash, a limit of 48 positions: greedy output still equals plain greedy decoding,
// drafting happens before the limit and never in a block that would reach it, and the steps after it are counted;
// with the checkpoint's own limit (4096) nothing is limited.
import { beforeAll, describe, expect, it } from 'vitest';

import { SpecEngine, type StageModel } from '@specd/core';

import { loadDrafter, loadTarget } from './helpers.js';

const PROMPT = Int32Array.from([1, 450, 3302, 310, 278, 4272, 338, 263]);
const NEW_TOKENS = 64;
const LIMIT = 48;

let target: StageModel;
beforeAll(() => {
  target = loadTarget();
});

function run(drafter: Awaited<ReturnType<typeof loadDrafter>> | undefined) {
  const engine = new SpecEngine(target, drafter, { maxSequences: 1, maxTokensPerSequence: 256, draftPolicy: 'max' });
  // the highest position a draft block touches, per propose call
  let highest = -1;
  if (drafter !== undefined) {
    const propose = drafter.propose.bind(drafter);
    drafter.propose = (batch) => {
      for (const s of batch.sequences) highest = Math.max(highest, s.position + drafter.maxDraftTokens);
      return propose(batch);
    };
  }
  const [r] = engine.run([
    { id: 'p', promptIds: PROMPT, maxTokens: NEW_TOKENS, sampling: { temperature: 0 }, seed: 1, ignoreEos: true },
  ]);
  return { r: r!, highest, engine };
}

describe('the drafter position limit', () => {
  it(`stops drafting before a block reaches max_position_embeddings (${LIMIT}); output stays greedy`, async () => {
    const plain = run(undefined).r.tokenIds;
    const limited = await loadDrafter(target, { max_position_embeddings: LIMIT });
    expect(limited.maxPosition).toBe(LIMIT);
    const { r, highest } = run(limited);
    expect(r.tokenIds).toEqual(plain);
    expect(r.metrics.draftSteps).toBeGreaterThan(0);
    expect(highest).toBeLessThan(LIMIT);
    expect(highest).toBeGreaterThan(0);
    // every step after the last draft step decodes plainly and is counted: the sequence ends at
    // prompt + NEW_TOKENS = 72 positions, well past the limit
    expect(r.metrics.positionLimitedSteps).toBeGreaterThan(0);
    expect(r.metrics.positionLimitedSteps).toBeLessThanOrEqual(
      PROMPT.length + NEW_TOKENS - LIMIT + limited.maxDraftTokens,
    );
    limited.dispose();

    const whole = await loadDrafter(target);
    expect(whole.maxPosition).toBe(4096);
    const free = run(whole);
    expect(free.r.tokenIds).toEqual(plain);
    expect(free.r.metrics.positionLimitedSteps).toBe(0);
    expect(free.highest).toBeGreaterThan(LIMIT);
    whole.dispose();
  });
});
