// Shared by the drafter packages' tests of the `weights` setting (bf16 against Q8_0 draft weights): each drafter
// decodes the same greedy requests at its full draft length; its output must be plain decoding's token for token, it
// must free its pages, τ per step must exceed 1.5 for each and differ by less than 0.15 between them.
import { expect } from 'vitest';

import { SpecEngine, type Drafter, type SpecRequest, type SpecResult, type StageModel } from '@specd/core';

/**
 * @param drafters the same drafter in each weight format, by format name (decoded in this order).
 * @param options.plain plain greedy decoding's results of `requests` by id; absent: decoded here (without a drafter).
 */
export function expectFormatsAgree(
  label: string,
  target: StageModel,
  drafters: Readonly<Record<string, Drafter & { readonly pagesInUse: number }>>,
  requests: readonly SpecRequest[],
  options: { readonly maxSequences: number; readonly plain?: ReadonlyMap<string | number, SpecResult> },
): void {
  const { maxSequences } = options;
  const plain =
    options.plain ??
    new Map(
      new SpecEngine(target, undefined, { maxSequences, maxTokensPerSequence: 2048 })
        .run(requests)
        .map((r) => [r.id, r]),
    );
  const tau = new Map<string, number>();
  for (const [name, d] of Object.entries(drafters)) {
    const e = new SpecEngine(target, d, { maxSequences, draftPolicy: 'max', maxTokensPerSequence: 2048 });
    const results = new Map(e.run(requests).map((r) => [r.id, r]));
    for (const q of requests)
      expect(results.get(q.id)!.tokenIds, `${name} ${String(q.id)}`).toEqual(plain.get(q.id)!.tokenIds);
    tau.set(name, e.metrics.tauPerStep);
    expect(d.pagesInUse).toBe(0);
  }
  console.log(`${label} greedy τ per step: ${[...tau].map(([n, t]) => `${n} ${t.toFixed(3)}`).join(', ')}`);
  const taus = [...tau.values()];
  for (const t of taus) expect(t).toBeGreaterThan(1.5);
  expect(Math.max(...taus) - Math.min(...taus)).toBeLessThan(0.15);
}
