// forwardPrologue: the batch checks and their messages (in the model's error class), the span
// records, the embed-or-hidden intake, the all-or-nothing cache extension and the tap capture.
import { describe, expect, it } from 'vitest';
import {
  forwardPrologue,
  forwardSequence,
  SequenceCache,
  type ForwardBatch,
  type ForwardPrologueSpec,
  type StageInfo,
} from '@specd/core';

class ToyError extends Error {
  override readonly name = 'ToyError';
}

const D = 2;
const info = (layerStart: number, layerEnd: number): StageInfo => ({
  numLayers: 4,
  layerStart,
  layerEnd,
  hiddenSize: D,
  vocabSize: 10,
  isFirst: layerStart === 0,
  isLast: layerEnd === 4,
  layerKinds: ['a', 'a', 'a', 'a'],
});

interface ToySpan {
  readonly id: string | number;
  readonly row: number;
  readonly numNew: number;
  readonly position: number;
}

const spec = (
  layerStart = 0,
  layerEnd = 4,
  hiddenOnFirstStage: 'use' | 'ignore' = 'use',
): ForwardPrologueSpec<ToySpan> => ({
  info: info(layerStart, layerEnd),
  error: (message) => new ToyError(message),
  span: (s, _i, row) => ({ id: s.id, row, numNew: s.tokens.length, position: s.position }),
  embedRow: (id, out) => out.fill(id + 0.5),
  hiddenOnFirstStage,
});

function cacheWith(...ids: string[]): SequenceCache {
  const cache = new SequenceCache(
    {
      pagedKv: { layers: [0], floatsPerToken: 1 },
      linearState: { layers: [], heads: 1, keyDim: 1, valueDim: 1, convStates: 0, convChannels: 0, convWidth: 0 },
    },
    { pageSize: 4, numPages: 2, numSlots: 1 },
  );
  for (const id of ids) cache.add(id);
  return cache;
}

const seq = (id: string, tokens: number[], position = 0) => forwardSequence(id, position, tokens);

describe('forwardPrologue', () => {
  it('lays the sequences out as rows, embeds the tokens, extends the cache and captures tap layerStart', () => {
    const cache = cacheWith('a', 'b');
    const batch: ForwardBatch = { sequences: [seq('a', [1, 2]), seq('b', [3])] };
    const p = forwardPrologue(batch, cache, { taps: [0, 2] }, spec());
    expect(p.spans).toEqual([
      { id: 'a', row: 0, numNew: 2, position: 0 },
      { id: 'b', row: 2, numNew: 1, position: 0 },
    ]);
    expect(p.numTokens).toBe(3);
    expect(Array.from(p.hidden)).toEqual([1.5, 1.5, 2.5, 2.5, 3.5, 3.5]);
    expect([cache.length('a'), cache.length('b')]).toEqual([2, 1]);
    expect([...p.captured.keys()]).toEqual([0]);
    p.hidden.fill(7);
    p.capture(1);
    p.capture(2);
    expect([...p.captured.keys()]).toEqual([0, 2]);
    expect(Array.from(p.captured.get(0) ?? [])).toEqual([1.5, 1.5, 2.5, 2.5, 3.5, 3.5]);
    expect(Array.from(p.captured.get(2) ?? [])).toEqual([7, 7, 7, 7, 7, 7]);
  });

  it("takes a copy of batch.hidden on a later stage, and on a first stage unless told to 'ignore' it", () => {
    const hidden = Float32Array.from([9, 8]);
    const later = forwardPrologue({ sequences: [seq('a', [1])], hidden }, cacheWith('a'), {}, spec(2, 4));
    expect(Array.from(later.hidden)).toEqual([9, 8]);
    expect(later.hidden).not.toBe(hidden);
    const use = forwardPrologue({ sequences: [seq('a', [1])], hidden }, cacheWith('a'), {}, spec(0, 4, 'use'));
    expect(Array.from(use.hidden)).toEqual([9, 8]);
    const ignore = forwardPrologue({ sequences: [seq('a', [1])], hidden }, cacheWith('a'), {}, spec(0, 4, 'ignore'));
    expect(Array.from(ignore.hidden)).toEqual([1.5, 1.5]);
  });

  it('throws the model error naming the argument, before the cache is touched', () => {
    const cache = cacheWith('a', 'b');
    const run =
      (batch: ForwardBatch, taps?: number[], s = spec()) =>
      () =>
        forwardPrologue(batch, cache, taps === undefined ? {} : { taps }, s);
    expect(run({ sequences: [] })).toThrow(new ToyError('forward: batch.sequences: expected at least one sequence'));
    expect(run({ sequences: [seq('a', [1]), seq('a', [2])] })).toThrow(
      'forward: sequences[1].id: sequence a appears twice in the batch',
    );
    expect(run({ sequences: [seq('a', [])] })).toThrow('forward: sequences[0].tokens: expected at least one token');
    expect(run({ sequences: [seq('a', [1], 3)] })).toThrow(
      'forward: sequences[0].position: expected 0 (cached tokens), got 3',
    );
    expect(run({ sequences: [seq('a', [1])] }, [5])).toThrow("forward: taps: tap 5 is outside this stage's [0, 4]");
    expect(run({ sequences: [seq('a', [1]), seq('b', [10])] })).toThrow(
      'forward: sequences[1].tokens: id 10 outside [0, 10)',
    );
    expect(run({ sequences: [seq('a', [1, 2])] }, undefined, spec(1, 4))).toThrow(
      'forward: batch.hidden: expected Float32Array [2, 2] from the previous stage, got none',
    );
    expect(run({ sequences: [seq('a', [1])], hidden: new Float32Array(3) }, undefined, spec(1, 4))).toThrow(
      'forward: batch.hidden: expected Float32Array [1, 2] from the previous stage, got length 3',
    );
    expect(run({ sequences: [] })).toThrow(ToyError);
    expect([cache.length('a'), cache.length('b')]).toEqual([0, 0]);
  });

  it('extends all sequences or none when the pool runs out of pages', () => {
    const cache = cacheWith('a', 'b');
    const batch: ForwardBatch = { sequences: [seq('a', [1, 1, 1, 1, 1]), seq('b', [1, 1, 1, 1])] };
    expect(() => forwardPrologue(batch, cache, {}, spec())).toThrow();
    expect([cache.length('a'), cache.length('b'), cache.pagesInUse]).toEqual([0, 0, 0]);
  });
});
