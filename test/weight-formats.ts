// Shared by the drafter packages' tests of the `weights` setting (bf16 against Q8_0 draft weights): each drafter
// decodes the same greedy requests at its full draft length; its output must be plain decoding's token for token and
// it must free its pages. Returns τ per step of each, for the caller's bound.
import { expect } from 'vitest';

import { SpecEngine, type Drafter, type SpecRequest, type SpecResult, type StageModel } from '@specd/core';

export function tauByFormat(
  target: StageModel,
  drafters: readonly (readonly [string, Drafter & { readonly pagesInUse: number }])[],
  requests: readonly SpecRequest[],
  plain: ReadonlyMap<string | number, SpecResult>,
  maxSequences: number,
): Map<string, number> {
  const tau = new Map<string, number>();
  for (const [name, d] of drafters) {
    const e = new SpecEngine(target, d, { maxSequences, draftPolicy: 'max', maxTokensPerSequence: 2048 });
    const results = new Map(e.run(requests).map((r) => [r.id, r]));
    for (const q of requests)
      expect(results.get(q.id)!.tokenIds, `${name} ${String(q.id)}`).toEqual(plain.get(q.id)!.tokenIds);
    tau.set(name, e.metrics.tauPerStep);
    expect(d.pagesInUse).toBe(0);
  }
  return tau;
}
