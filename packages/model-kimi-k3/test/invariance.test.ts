// Batch invariance (bitwise): a token's logits are the same decoded alone, inside a verify block,
// batched with another sequence, and whatever the prefill chunking. Also: verify rollback by
// replay, and pipeline stages that reproduce the whole model bitwise.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { HfConfig, SafetensorsCheckpoint, SequenceCache } from '@specd/core';

import { commitByReplay, commitFromSnapshots, loadKimiStage, type KimiStageModel } from '../src/index.js';
import { bitwiseEqual, cacheFor, KERNELS, loadStage, TINY_DIR } from './helpers.js';

const PROMPT = Int32Array.from([
  870, 330, 266, 870, 417, 835, 1381, 4121, 18, 356, 870, 330, 398, 266, 708, 2017, 287, 515, 18, 356,
]);
const OTHER = Int32Array.from([12, 99, 1000, 7, 8, 9, 4000]);
const DRAFTS = [4121, 18, 356, 77];

describe.each(KERNELS)('%s kernels', (kernels) => {
  let model: KimiStageModel;
  beforeAll(() => {
    model = loadStage(TINY_DIR, kernels);
  });
  afterAll(() => model?.dispose());

  function prefill(cache: SequenceCache, id: string, ids: Int32Array, chunk = 64): Float32Array {
    cache.add(id);
    let logits = new Float32Array(0);
    for (let p = 0; p < ids.length; p += chunk) {
      const res = model.forward(
        { sequences: [{ id, position: p, tokens: ids.subarray(p, Math.min(ids.length, p + chunk)), logits: 'all' }] },
        cache,
      );
      const next = new Float32Array(logits.length + res.logits!.length);
      next.set(logits);
      next.set(res.logits!, logits.length);
      logits = next;
    }
    return logits;
  }

  describe('batch invariance (bitwise)', () => {
    it('decode alone == verify block == batched with another sequence', () => {
      const V = model.info.vocabSize;
      const cache = cacheFor(model, 4, 256);
      prefill(cache, 'alone', PROMPT);
      prefill(cache, 'block', PROMPT);
      prefill(cache, 'batched', PROMPT);
      prefill(cache, 'other', OTHER);
      const alone: Float32Array[] = [];
      for (const t of DRAFTS) {
        const res = model.forward(
          { sequences: [{ id: 'alone', position: cache.length('alone'), tokens: Int32Array.of(t), logits: 'last' }] },
          cache,
        );
        alone.push(res.logits!);
      }
      const block = model.forward(
        { sequences: [{ id: 'block', position: PROMPT.length, tokens: Int32Array.from(DRAFTS), logits: 'all' }] },
        cache,
      );
      for (let i = 0; i < DRAFTS.length; i++) {
        const res = model.forward(
          {
            sequences: [
              { id: 'other', position: cache.length('other'), tokens: Int32Array.of(5 + i, 6 + i), logits: 'all' },
              { id: 'batched', position: cache.length('batched'), tokens: Int32Array.of(DRAFTS[i]!), logits: 'last' },
            ],
          },
          cache,
        );
        const rows = res.logitRowStart;
        expect(Array.from(rows)).toEqual([0, 2, 3]);
        expect(bitwiseEqual(res.logits!.subarray(2 * V, 3 * V), alone[i]!)).toBe(true);
        expect(bitwiseEqual(block.logits!.subarray(i * V, (i + 1) * V), alone[i]!)).toBe(true);
      }
      // the KDA state after the block equals the state after decoding one by one
      for (const l of model.cacheGeometry.linearState.layers) {
        expect(bitwiseEqual(cache.state!.recurrent('block', l), cache.state!.recurrent('alone', l))).toBe(true);
        expect(bitwiseEqual(cache.state!.recurrent('batched', l), cache.state!.recurrent('alone', l))).toBe(true);
      }
    });

    it(
      'chunked KDA prefill (phase "prefill"): splitting at ' + 'multiples of 64 tokens gives the same bits as one call',
      () => {
        const long = Int32Array.from({ length: 150 }, (_, i) => (i * 37 + 11) % 8000);
        const run = (chunk: number) => {
          const cache = cacheFor(model, 1, 256);
          cache.add('p');
          const out: Float32Array[] = [];
          for (let p = 0; p < long.length; p += chunk) {
            out.push(
              model.forward(
                {
                  sequences: [
                    {
                      id: 'p',
                      position: p,
                      tokens: long.subarray(p, Math.min(long.length, p + chunk)),
                      logits: 'last',
                      phase: 'prefill',
                    },
                  ],
                },
                cache,
              ).logits!,
            );
          }
          return { last: out[out.length - 1]!, state: cache.state!.recurrent('p', 0).slice() };
        };
        const a = run(64);
        const b = run(128);
        if (kernels === 'native') {
          expect(bitwiseEqual(a.last, b.last)).toBe(true);
          expect(bitwiseEqual(a.state, b.state)).toBe(true);
        }
        const c = run(150);
        let maxRel = 0;
        for (let i = 0; i < a.last.length; i++) maxRel = Math.max(maxRel, Math.abs(a.last[i]! - c.last[i]!));
        expect(maxRel).toBeLessThan(1e-3 * Math.max(...Array.from(a.last, Math.abs)));
      },
    );

    it('prefill logits do not depend on the chunk size (64, 7, 1)', () => {
      const cache = cacheFor(model, 3, 64);
      const a = prefill(cache, 'c64', PROMPT, 64);
      const b = prefill(cache, 'c7', PROMPT, 7);
      const c = prefill(cache, 'c1', PROMPT, 1);
      expect(bitwiseEqual(a, b)).toBe(true);
      expect(bitwiseEqual(a, c)).toBe(true);
    });
  });

  describe('verify rollback by replay', () => {
    it('commit 2 of 4 verified tokens: state and next logits equal plain decoding', () => {
      const V = model.info.vocabSize;
      const cache = cacheFor(model, 2, 128);
      prefill(cache, 'spec', PROMPT);
      prefill(cache, 'plain', PROMPT);
      const pagesBefore = cache.kv!.blockTable('spec').length;
      const cp = cache.checkpoint('spec');
      model.forward(
        {
          sequences: [
            {
              id: 'spec',
              position: PROMPT.length,
              tokens: Int32Array.from([...DRAFTS, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]),
              logits: 'all',
            },
          ],
        },
        cache,
      );
      expect(cache.kv!.blockTable('spec').length).toBeGreaterThan(pagesBefore);
      commitByReplay(model, cache, 'spec', cp, Int32Array.from(DRAFTS.slice(0, 2)));
      expect(cache.length('spec')).toBe(PROMPT.length + 2);
      expect(cache.kv!.blockTable('spec').length).toBe(Math.ceil((PROMPT.length + 2) / 16));
      for (const t of DRAFTS.slice(0, 2)) {
        model.forward(
          { sequences: [{ id: 'plain', position: cache.length('plain'), tokens: Int32Array.of(t), logits: 'none' }] },
          cache,
        );
      }
      for (const l of model.cacheGeometry.linearState.layers) {
        expect(bitwiseEqual(cache.state!.recurrent('spec', l), cache.state!.recurrent('plain', l))).toBe(true);
        expect(bitwiseEqual(cache.state!.conv('spec', l), cache.state!.conv('plain', l))).toBe(true);
      }
      const next = (id: string) =>
        model.forward(
          { sequences: [{ id, position: cache.length(id), tokens: Int32Array.of(42), logits: 'last' }] },
          cache,
        ).logits!;
      const a = next('spec');
      expect(a.length).toBe(V);
      expect(bitwiseEqual(a, next('plain'))).toBe(true);
      cache.abort('spec');
      cache.finish('plain');
      expect(cache.pagesInUse).toBe(0);
      expect(cache.slotsInUse).toBe(0);
    });
  });

  describe('verify rollback by snapshots', () => {
    it.each(['replay', 'copy'] as const)(
      'kdaCommit %s: batched verify of two sequences, commit 2 of 5 and 5 of 5: states, next logits = plain',
      (mode) => {
        model.kdaCommit = mode;
        const cache = cacheFor(model, 4, 128);
        for (const id of ['a', 'b', 'pa', 'pb']) prefill(cache, id, id.endsWith('a') ? PROMPT : OTHER);
        const blockA = Int32Array.from([...DRAFTS, 9]);
        const blockB = Int32Array.from([3, 1, 4, 1, 5]);
        const res = model.forward(
          {
            sequences: [
              { id: 'a', position: PROMPT.length, tokens: blockA, logits: 'all' },
              { id: 'b', position: OTHER.length, tokens: blockB, logits: 'all' },
            ],
          },
          cache,
          { kdaSnapshots: true },
        );
        expect(res.kdaSnapshots!.layers.size).toBe(model.cacheGeometry.linearState.layers.length);
        const snap0 = [...res.kdaSnapshots!.layers.values()][0]!;
        expect(snap0.perToken === undefined).toBe(mode === 'replay');
        // a sequence committed, then a later forward on it: a second commit of the same prefix is still exact
        commitFromSnapshots(cache, res.kdaSnapshots!, 'a', 4);
        model.forward(
          { sequences: [{ id: 'a', position: cache.length('a'), tokens: Int32Array.of(7), logits: 'none' }] },
          cache,
        );
        commitFromSnapshots(cache, res.kdaSnapshots!, 'a', 2);
        commitFromSnapshots(cache, res.kdaSnapshots!, 'b', 5);
        expect(() => commitFromSnapshots(cache, res.kdaSnapshots!, 'a', 0)).toThrow(
          /committed: expected an integer in \[1, 5\]/,
        );
        for (const [id, plain, toks] of [
          ['a', 'pa', blockA.subarray(0, 2)],
          ['b', 'pb', blockB],
        ] as const) {
          for (const t of toks)
            model.forward(
              { sequences: [{ id: plain, position: cache.length(plain), tokens: Int32Array.of(t), logits: 'none' }] },
              cache,
            );
          expect(cache.length(id)).toBe(cache.length(plain));
          for (const l of model.cacheGeometry.linearState.layers) {
            expect(bitwiseEqual(cache.state!.recurrent(id, l), cache.state!.recurrent(plain, l))).toBe(true);
            expect(bitwiseEqual(cache.state!.conv(id, l), cache.state!.conv(plain, l))).toBe(true);
          }
          const next = (s: string) =>
            model.forward(
              { sequences: [{ id: s, position: cache.length(s), tokens: Int32Array.of(42), logits: 'last' }] },
              cache,
            ).logits!;
          expect(bitwiseEqual(next(id), next(plain))).toBe(true);
        }
        for (const id of ['a', 'b', 'pa', 'pb']) cache.finish(id);
        expect(cache.pagesInUse + cache.slotsInUse).toBe(0);
        model.kdaCommit = 'replay';
      },
    );

    it('commitPrefix: a whole block right after its forward keeps the state; after a later forward it replays', () => {
      const cache = cacheFor(model, 4, 128);
      for (const id of ['a', 'b', 'pa', 'pb']) prefill(cache, id, id.endsWith('a') ? PROMPT : OTHER);
      const blockA = Int32Array.from([...DRAFTS, 9]);
      const blockB = Int32Array.from([3, 1, 4, 1, 5]);
      const verifyBlocks = () =>
        model.forward(
          {
            sequences: [
              { id: 'a', position: cache.length('a'), tokens: blockA, logits: 'all' },
              { id: 'b', position: cache.length('b'), tokens: blockB, logits: 'all' },
            ],
          },
          cache,
          { stateSnapshots: true },
        );
      const step = (id: string, toks: Int32Array) => {
        for (const t of toks)
          model.forward(
            { sequences: [{ id, position: cache.length(id), tokens: Int32Array.of(t), logits: 'none' }] },
            cache,
          );
      };
      const same = () => {
        for (const [id, plain] of [
          ['a', 'pa'],
          ['b', 'pb'],
        ] as const) {
          expect(cache.length(id)).toBe(cache.length(plain));
          for (const l of model.cacheGeometry.linearState.layers) {
            expect(bitwiseEqual(cache.state!.recurrent(id, l), cache.state!.recurrent(plain, l))).toBe(true);
            expect(bitwiseEqual(cache.state!.conv(id, l), cache.state!.conv(plain, l))).toBe(true);
          }
        }
      };
      // b whole right after the forward (nothing to redo), a partly (a replay)
      let res = verifyBlocks();
      model.commitPrefix(cache, res, 'b', 5);
      model.commitPrefix(cache, res, 'a', 2);
      model.commitPrefix(cache, res, 'b', 5);
      step('pa', blockA.subarray(0, 2));
      step('pb', blockB);
      same();
      // b whole after a later forward on it (one more token): restored from the snapshots, the extra token dropped
      res = verifyBlocks();
      step('b', Int32Array.of(7));
      model.commitPrefix(cache, res, 'a', 5);
      model.commitPrefix(cache, res, 'b', 5);
      step('pa', blockA);
      step('pb', blockB);
      same();
      for (const id of ['a', 'b', 'pa', 'pb']) cache.finish(id);
      expect(cache.pagesInUse + cache.slotsInUse).toBe(0);
    });
    it.each(['replay', 'copy'] as const)(
      'kdaCommit %s: commitPrefixes of four sequences in one call = plain; a bad commit changes nothing',
      (mode) => {
        model.kdaCommit = mode;
        const cache = cacheFor(model, 8, 128);
        const ids = ['a', 'b', 'c', 'd'] as const;
        const prompts = { a: PROMPT, b: OTHER, c: PROMPT.slice(0, 5), d: OTHER.slice(0, 7) };
        for (const id of ids) {
          prefill(cache, id, prompts[id]);
          prefill(cache, `p${id}`, prompts[id]);
        }
        const blocks = {
          a: Int32Array.from([...DRAFTS, 9]),
          b: Int32Array.from([3, 1, 4, 1, 5]),
          c: Int32Array.from([2, 7, 1, 8]),
          d: Int32Array.of(6),
        };
        const res = model.forward(
          {
            sequences: ids.map((id) => ({
              id,
              position: cache.length(id),
              tokens: blocks[id],
              logits: 'all' as const,
            })),
          },
          cache,
          { stateSnapshots: true },
        );
        const lengths = ids.map((id) => cache.length(id));
        // checked before anything changes: a repeated id, one not in the forward, a count out of range
        expect(() =>
          model.commitPrefixes(cache, res, [
            { id: 'a', committed: 2 },
            { id: 'a', committed: 3 },
          ]),
        ).toThrow(/a sequence is repeated/);
        expect(() =>
          model.commitPrefixes(cache, res, [
            { id: 'a', committed: 2 },
            { id: 'pa', committed: 1 },
          ]),
        ).toThrow(/sequence pa was not in the snapshotted forward/);
        expect(() =>
          model.commitPrefixes(cache, res, [
            { id: 'b', committed: 2 },
            { id: 'c', committed: 5 },
          ]),
        ).toThrow(/committed: expected an integer in \[1, 4\]/);
        // a block of one token keeps no state before it (it commits whole): no replay of it
        if (mode === 'replay')
          expect(() => commitFromSnapshots(cache, res.kdaSnapshots!, 'd', 1)).toThrow(
            /sequence d: its block of one token kept no state to replay/,
          );
        expect(ids.map((id) => cache.length(id))).toEqual(lengths);
        // a partly, b and d whole (right after the forward: nothing to redo), c partly — in one call
        const keep = { a: 2, b: 5, c: 3, d: 1 };
        model.commitPrefixes(
          cache,
          res,
          ids.map((id) => ({ id, committed: keep[id] })),
        );
        for (const id of ids) {
          for (const t of blocks[id].subarray(0, keep[id]))
            model.forward(
              {
                sequences: [
                  { id: `p${id}`, position: cache.length(`p${id}`), tokens: Int32Array.of(t), logits: 'none' },
                ],
              },
              cache,
            );
          expect(cache.length(id)).toBe(cache.length(`p${id}`));
          for (const l of model.cacheGeometry.linearState.layers) {
            expect(bitwiseEqual(cache.state!.recurrent(id, l), cache.state!.recurrent(`p${id}`, l))).toBe(true);
            expect(bitwiseEqual(cache.state!.conv(id, l), cache.state!.conv(`p${id}`, l))).toBe(true);
          }
        }
        for (const id of ids) {
          cache.finish(id);
          cache.finish(`p${id}`);
        }
        expect(cache.pagesInUse + cache.slotsInUse).toBe(0);
        model.kdaCommit = 'replay';
      },
    );
    it('snapshots in two kept buffer sets: a commit one snapshotted forward later is exact, two later throws', () => {
      const cache = cacheFor(model, 4, 128);
      for (const id of ['a', 'b', 'pa']) prefill(cache, id, id.endsWith('a') ? PROMPT : OTHER);
      const blockA = Int32Array.from([...DRAFTS, 9]);
      const verify = (id: string, tokens: Int32Array) =>
        model.forward({ sequences: [{ id, position: cache.length(id), tokens, logits: 'all' }] }, cache, {
          stateSnapshots: true,
        });
      const first = verify('a', blockA);
      const second = verify('b', Int32Array.from([3, 1, 4]));
      // a's snapshots outlive one more snapshotted forward (of b): its commit is still exact
      model.commitPrefix(cache, first, 'a', 2);
      model.commitPrefix(cache, second, 'b', 3);
      for (const t of blockA.subarray(0, 2))
        model.forward(
          { sequences: [{ id: 'pa', position: cache.length('pa'), tokens: Int32Array.of(t), logits: 'none' }] },
          cache,
        );
      for (const l of model.cacheGeometry.linearState.layers)
        expect(bitwiseEqual(cache.state!.recurrent('a', l), cache.state!.recurrent('pa', l))).toBe(true);
      // a third snapshotted forward reuses the first one's buffers: a commit from the first now throws, naming why
      verify('b', Int32Array.of(5, 9));
      expect(() => commitFromSnapshots(cache, first.kdaSnapshots!, 'a', 1)).toThrow(
        /two later forwards with snapshots on this stage have reused their buffers/,
      );
      for (const id of ['a', 'b', 'pa']) cache.finish(id);
      expect(cache.pagesInUse + cache.slotsInUse).toBe(0);
    });
  });

  describe('pipeline stages', () => {
    it('stages [0,3) + [3,8) load only their tensors and reproduce the whole model bitwise, taps included', () => {
      const weights = SafetensorsCheckpoint.open(TINY_DIR);
      const config = HfConfig.read(TINY_DIR);
      const seen: string[][] = [[], []];
      const s0 = loadKimiStage(
        { dir: TINY_DIR, config, weights },
        { layerStart: 0, layerEnd: 3, kernels, onProgress: (p) => seen[0]!.push(p.tensor) },
      );
      const s1 = loadKimiStage(
        { dir: TINY_DIR, config, weights },
        { layerStart: 3, layerEnd: 8, kernels, onProgress: (p) => seen[1]!.push(p.tensor) },
      );
      weights.close();
      const layerOf = (n: string) => (n.startsWith('model.layers.') ? Number(n.split('.')[2]) : -1);
      expect(seen[0]!.every((n) => (layerOf(n) >= 0 && layerOf(n) < 3) || n === 'model.embed_tokens.weight')).toBe(
        true,
      );
      expect(seen[1]!.every((n) => layerOf(n) >= 3 || n === 'model.norm.weight' || n === 'lm_head.weight')).toBe(true);
      expect(seen[0]!.length + seen[1]!.length).toBe(weights.names().length);
      expect(s0.info.isFirst && !s0.info.isLast && s1.info.isLast && !s1.info.isFirst).toBe(true);
      expect(s0.cacheGeometry.pagedKv.layers).toEqual([]);
      expect(s1.cacheGeometry.pagedKv.layers).toEqual([3, 7]);

      const c0 = new SequenceCache(s0.cacheGeometry, { numPages: 8, numSlots: 1 });
      const c1 = new SequenceCache(s1.cacheGeometry, { numPages: 8, numSlots: 1 });
      const cf = cacheFor(model, 1, 64);
      for (const c of [c0, c1, cf]) c.add('x');
      const seq = { id: 'x', position: 0, tokens: PROMPT, logits: 'all' as const };
      const r0 = s0.forward({ sequences: [seq] }, c0, { taps: [0, 3] });
      expect(r0.logits).toBeUndefined();
      const r1 = s1.forward({ sequences: [seq], hidden: r0.hidden }, c1, { taps: [3, 8] });
      const rf = model.forward({ sequences: [seq] }, cf, { taps: [0, 3, 8] });
      expect(bitwiseEqual(r1.logits!, rf.logits!)).toBe(true);
      expect(bitwiseEqual(r0.taps.get(0)!, rf.taps.get(0)!)).toBe(true);
      expect(bitwiseEqual(r0.taps.get(3)!, rf.taps.get(3)!)).toBe(true);
      expect(bitwiseEqual(r1.taps.get(3)!, rf.taps.get(3)!)).toBe(true);
      expect(bitwiseEqual(r1.taps.get(8)!, rf.taps.get(8)!)).toBe(true);
      expect(() => s0.forward({ sequences: [{ ...seq, position: PROMPT.length }] }, c0, { taps: [5] })).toThrow(
        /tap 5 is outside/,
      );
    });
  });

  describe('forward argument errors', () => {
    it('names the bad argument', () => {
      const cache = cacheFor(model, 1, 32);
      cache.add('e');
      expect(() => model.forward({ sequences: [] }, cache)).toThrow(/at least one sequence/);
      expect(() =>
        model.forward({ sequences: [{ id: 'e', position: 3, tokens: Int32Array.of(1), logits: 'last' }] }, cache),
      ).toThrow(/position: expected 0/);
      expect(() =>
        model.forward({ sequences: [{ id: 'e', position: 0, tokens: Int32Array.of(99999), logits: 'last' }] }, cache),
      ).toThrow(/id 99999 outside/);
      expect(() =>
        model.forward({ sequences: [{ id: 'e', position: 0, tokens: new Int32Array(40), logits: 'last' }] }, cache),
      ).toThrow(/page/);
      expect(cache.length('e')).toBe(0);
      expect(cache.pagesInUse).toBe(0);
    });
  });
});
