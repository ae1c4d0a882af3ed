// DrafterBase: the defaults a drafter inherits (no taps, nothing projected, context rows counted in
// its DraftKvCache, bookkeeping delegated to it) and the check helpers' messages.
import { describe, expect, it } from 'vitest';

import { CacheError, DraftKvCache } from '../../src/kv/index.js';
import {
  DrafterBase,
  DrafterError,
  type DraftBatch,
  type DraftProposal,
  type StageInfo,
} from '../../src/plugin/index.js';

/** A drafter that writes only what is its own: method, maxDraftTokens, propose. */
class Echo extends DrafterBase {
  readonly method = 'echo';
  readonly maxDraftTokens = 2;
  constructor(kv?: DraftKvCache) {
    super(kv);
  }
  propose(batch: DraftBatch): DraftProposal[] {
    return batch.sequences.map((s, i) => {
      this.checkMaxDrafts(s, i, this.maxDraftTokens);
      this.checkProposePosition(s, i);
      return { id: s.id, tokens: Int32Array.of(s.lastToken) };
    });
  }
}

const seq = (id: string, position: number, maxDrafts = 1) => ({
  id,
  position,
  lastToken: 7,
  maxDrafts,
  history: new Int32Array(position + 1),
  sampling: { temperature: 0 },
  rng: { next: () => 0 },
});

describe('DrafterBase', () => {
  it('defaults: no taps, the accumulator returned as it is, no pages', () => {
    const d = new Echo(new DraftKvCache());
    expect(d.captureSetter({} as StageInfo)).toEqual([]);
    const acc = new Float32Array(3);
    expect(d.projectTargetHiddenPartial(new Map(), 1, acc)).toBe(acc);
    expect(d.projectTargetHiddenPartial(new Map(), 1)).toEqual(new Float32Array(0));
    expect(d.pagesInUse).toBe(0);
  });

  it('counts context rows in its cache, checks positions, frees idempotently', () => {
    const d = new Echo(new DraftKvCache());
    d.addSequence('a');
    d.writeProjectedContextKV(new Float32Array(0), [{ id: 'a', position: 0, numTokens: 4 }]);
    expect(d.contextLength('a')).toBe(4);
    expect(() => d.writeProjectedContextKV(new Float32Array(0), [{ id: 'a', position: 3, numTokens: 1 }])).toThrow(
      new DrafterError('echo: writeProjectedContextKV: sequence a: position 3 is not the draft context length 4'),
    );
    expect(d.propose({ sequences: [seq('a', 4)] })[0]!.tokens).toEqual(Int32Array.of(7));
    expect(() => d.propose({ sequences: [seq('a', 5)] })).toThrow(
      'echo: propose: sequences[0] (a): position 5 is not the draft context length 4',
    );
    expect(() => d.propose({ sequences: [seq('a', 4, 3)] })).toThrow(
      'echo: propose: sequences[0].maxDrafts: expected [1, 2], got 3',
    );
    expect(() => d.addSequence('a')).toThrow(CacheError);
    d.freeSequence('a');
    d.freeSequence('a');
    expect(() => d.contextLength('a')).toThrow(CacheError);
    d.dispose();
    expect(() => d.addSequence('b')).toThrow(/disposed/);
  });

  it('without a cache: no draft context at all', () => {
    const d = new Echo();
    d.addSequence('a');
    d.writeProjectedContextKV(new Float32Array(0), [{ id: 'a', position: 9, numTokens: 4 }]);
    expect(d.contextLength('a')).toBe(0);
    d.freeSequence('a');
    d.dispose();
  });
});
