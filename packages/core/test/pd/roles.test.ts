// The pieces of the PD roles that need no model: both roles refuse a drafter without DraftContextTransfer at
// start-up naming it; the /pd/* request parser names the bad field; range pairing cuts both sides at each other's
// boundaries and refuses a length mismatch naming the entry; the PRNG resumes from (seed, draws) exactly; the
// engine's reserve → resume keeps the request's slot until it is freed and refuses beyond maxSequences; tombstones
// expire.
import { describe, expect, it } from 'vitest';

import { SeededRandom } from '../../src/engine/random.js';
import { SpecEngine } from '../../src/engine/engine.js';
import { DraftKvCache, type SequenceCache } from '../../src/kv/index.js';
import {
  DecodeRole,
  pairRanges,
  parsePdRequest,
  PdError,
  type PdEntryKey,
  PrefillRole,
  Tombstones,
} from '../../src/pd/index.js';
import { DrafterBase, type DraftBatch, type DraftProposal } from '../../src/plugin/index.js';
import type { ForwardBatch, ForwardResult, StageModel } from '../../src/plugin/model-plugin.js';
import { ApiError } from '../../src/serve/errors.js';
import { EngineLoop } from '../../src/serve/engine-loop.js';

/** A whole-model stage with one paged layer (nothing written) whose forward returns zero logits (vocabulary 8). */
function tinyStage(): StageModel {
  return {
    info: {
      numLayers: 1,
      layerStart: 0,
      layerEnd: 1,
      hiddenSize: 4,
      vocabSize: 8,
      isFirst: true,
      isLast: true,
      layerKinds: ['attn'],
    },
    cacheGeometry: {
      pagedKv: { layers: [0], floatsPerToken: 2 },
      linearState: { layers: [], heads: 1, keyDim: 1, valueDim: 1, convStates: 0, convChannels: 0, convWidth: 0 },
    },
    forward(batch: ForwardBatch, cache: SequenceCache): ForwardResult {
      cache.extendAll(batch.sequences.map((s) => ({ id: s.id, position: s.position, numNew: s.tokens.length })));
      const n = batch.sequences.reduce((a, s) => a + s.tokens.length, 0);
      const rows = batch.sequences.map((s) => (s.logits === 'all' ? s.tokens.length : s.logits === 'last' ? 1 : 0));
      const start = new Int32Array(rows.length + 1);
      rows.forEach((r, i) => {
        start[i + 1] = (start[i] as number) + r;
      });
      return {
        logits: new Float32Array((start[rows.length] as number) * 8),
        logitRowStart: start,
        hidden: new Float32Array(n * 4),
        taps: new Map(),
      };
    },
    dispose() {},
  };
}

class NoPdDrafter extends DrafterBase {
  readonly method = 'no-pd-test';
  readonly maxDraftTokens = 2;
  constructor() {
    super(new DraftKvCache({ numLayers: 1, numKvHeads: 1, headDim: 4, pageSize: 4, numPages: 4 }));
  }
  propose(batch: DraftBatch): DraftProposal[] {
    return batch.sequences.map((s) => ({ id: s.id, tokens: new Int32Array(0) }));
  }
}

const roleOptions = { host: '127.0.0.1', bootstrapTimeoutMs: 1000, transferTimeoutMs: 1000, digest: {} as never };

describe('PD roles', () => {
  it('refuse a drafter without DraftContextTransfer at start-up, on both sides, naming it', () => {
    const drafter = new NoPdDrafter();
    const loop = new EngineLoop(
      tinyStage(),
      drafter,
      { draftLength: () => 0 },
      { maxWaiting: 4, maxTokensInFlight: 1000, eosTokenIds: [] },
    );
    for (const make of [
      () => new PrefillRole(loop, drafter, { ...roleOptions, bootstrapPort: 0 }),
      () => new DecodeRole(loop, drafter, roleOptions),
    ]) {
      expect(make).toThrow(PdError);
      expect(make).toThrow(/^no-pd-test: no prefill\/decode transfer/);
    }
  });
});

describe('parsePdRequest', () => {
  const ok = {
    request_id: 'r1',
    room: 42,
    kind: 'chat',
    prompt_ids: [1, 2, 3],
    bootstrap: 'tcp://127.0.0.1:5555',
    body: { model: 'm', messages: [] },
  };
  it('parses the router request (a numeric room becomes its name)', () => {
    const r = parsePdRequest(ok, 'decode');
    expect(r).toMatchObject({ requestId: 'r1', room: '42', kind: 'chat', promptIds: [1, 2, 3] });
    expect(r.bootstrap).toBe('tcp://127.0.0.1:5555');
  });
  it.each([
    [{ ...ok, request_id: '' }, 'request_id'],
    [{ ...ok, room: -1 }, 'room'],
    // a stage's transfer id is <room>/stage<k>: a room with a slash could collide with one
    [{ ...ok, room: '7/stage0' }, 'room'],
    [{ ...ok, kind: 'embeddings' }, 'kind'],
    [{ ...ok, prompt_ids: [] }, 'prompt_ids'],
    [{ ...ok, prompt_ids: [1, 2.5] }, 'prompt_ids'],
    [{ ...ok, bootstrap: 'http://x:1' }, 'bootstrap'],
    [{ ...ok, bootstrap: 'tcp://*:5555' }, 'bootstrap'],
    [{ ...ok, bootstrap: 'tcp://127.0.0.1:99999' }, 'bootstrap'],
    [{ ...ok, bootstrap: 'tcp://127.0.0.1:0' }, 'bootstrap'],
    [{ ...ok, body: 'x' }, 'body'],
  ])('%j → 400 naming %s', (body, field) => {
    let err: unknown;
    try {
      parsePdRequest(body, 'decode');
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ApiError);
    expect((err as ApiError).status).toBe(400);
    expect((err as ApiError).param).toBe(field);
  });
});

describe('pairRanges', () => {
  const key: PdEntryKey = { kind: 'target-kv', layer: 3, part: '', rank: 0 };
  it('cuts both sides at each other’s boundaries, in order', () => {
    const p = pairRanges(
      key,
      [
        { region: 'a', offset: 0, length: 6 },
        { region: 'a', offset: 100, length: 4 },
      ],
      [
        { region: 'b', offset: 10, length: 3 },
        { region: 'b', offset: 50, length: 7 },
      ],
    );
    expect(p.local).toEqual([
      { region: 'a', offset: 0, length: 3 },
      { region: 'a', offset: 3, length: 3 },
      { region: 'a', offset: 100, length: 4 },
    ]);
    expect(p.remote).toEqual([
      { region: 'b', offset: 10, length: 3 },
      { region: 'b', offset: 50, length: 3 },
      { region: 'b', offset: 53, length: 4 },
    ]);
  });
  it('refuses a length mismatch naming the entry and both lengths', () => {
    expect(() =>
      pairRanges(key, [{ region: 'a', offset: 0, length: 8 }], [{ region: 'b', offset: 0, length: 4 }]),
    ).toThrow(/target-kv layer 3 rank 0: 8 bytes here, the decode side expects 4 bytes/);
  });
});

describe('SeededRandom.resume', () => {
  it('continues the stream of (seed, draws) exactly', () => {
    for (const seed of [0, 7, 0xffffffff, 123456789]) {
      const a = new SeededRandom(seed);
      for (let i = 0; i < 1000; i++) a.next();
      const b = SeededRandom.resume(seed, 1000);
      expect(b.draws).toBe(1000);
      for (let i = 0; i < 50; i++) expect(b.next()).toBe(a.next());
    }
  });
});

describe('SpecEngine.reserve / resume / release', () => {
  const req = (id: string, n = 5) => ({
    id,
    promptIds: Int32Array.from({ length: n }, (_, i) => i),
    maxTokens: 3,
    sampling: { temperature: 0 },
    seed: 1,
    ignoreEos: true,
  });
  it('reserves pages for the prompt, refuses beyond maxSequences, resumes from the first token and frees', () => {
    const e = new SpecEngine(tinyStage(), undefined, { maxSequences: 2, maxTokensPerSequence: 64, pageSize: 4 });
    expect(e.reserve(req('a'))).toBe(true);
    expect(e.reserve(req('b'))).toBe(true);
    expect(e.reserve(req('c'))).toBe(false);
    expect(e.cache.length('a')).toBe(5);
    expect(e.cache.pagesInUse).toBe(4);
    expect(e.abort('b')?.finishReason).toBe('abort');
    expect(e.resume('a', { firstToken: 6, position: 5, seed: 1, draws: 1 })).toBeUndefined();
    expect(() => e.resume('a', { firstToken: 6, position: 5, seed: 1, draws: 1 })).toThrow(/not reserved/);
    const done = e.run();
    expect(done).toHaveLength(1);
    // the first token from the handoff, then the stage's argmax (all-zero logits: token 0)
    expect(done[0]?.tokenIds).toEqual([6, 0, 0]);
    expect(e.metrics.prefillTokens).toBe(0);
    expect(e.cache.pagesInUse).toBe(0);
  });
  it('hands off after the first token and keeps the caches until release', () => {
    const e = new SpecEngine(tinyStage(), undefined, { maxSequences: 1, maxTokensPerSequence: 64, pageSize: 4 });
    const [r] = e.run([{ ...req('p'), handoff: true }]);
    expect(r?.finishReason).toBe('handoff');
    expect(r?.handoff).toEqual({ firstToken: 0, position: 5, seed: 1, draws: 0 });
    expect(e.cache.pagesInUse).toBe(2);
    expect(e.occupied).toBe(1);
    expect(e.release('p')).toBe(true);
    expect(e.release('p')).toBe(false);
    expect(e.cache.pagesInUse + e.occupied).toBe(0);
  });
});

describe('Tombstones', () => {
  it('remember an ended room for a while, then forget it', () => {
    const t = new Tombstones();
    t.add('r', 'client left', 60_000);
    expect(t.reason('r')).toBe('client left');
    t.add('s', 'x', -1);
    expect(t.reason('s')).toBeUndefined();
  });
});
