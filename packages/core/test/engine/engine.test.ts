// The engine against the contracts alone (no real model, no method name): a toy target whose next
// token is a fixed function of the current one, and a prompt-lookup-style drafter with no taps and
// no KV that guesses the first `good` drafts right. Checks accept / commit bookkeeping, the two τ
// definitions, per-position acceptance, the histogram, the replay commit (a stage without
// commitPrefix), the draft-length hook, request validation, and chunked prefill interleaved with
// decoding (one prefill chunk per step; abort / failure mid-prefill frees everything); one request never
// fails another (a prefill that throws, non-finite logits rows, a drafter that throws on one sequence).
import { describe, expect, it } from 'vitest';

import {
  adaptiveDraftLength,
  EngineError,
  normalizeSampling,
  RequestMetrics,
  SpecEngine,
  type SpecRequest,
} from '../../src/engine/index.js';
import type { SequenceCache } from '../../src/kv/index.js';
import type {
  CacheGeometry,
  DraftBatch,
  Drafter,
  DraftProposal,
  DraftSampling,
  ForwardBatch,
  ForwardResult,
  StageInfo,
  StageModel,
} from '../../src/plugin/index.js';

const V = 32;
const next = (t: number) => (t * 7 + 3) % V;

/** A toy target: logits put all mass on next(token); one fake paged layer so KV bookkeeping is real. */
class ToyTarget implements StageModel {
  forwards = 0;
  /** Every forward: its sequences (id, first position, token count, phase). */
  readonly log: { id: unknown; position: number; n: number; phase: string }[][] = [];
  readonly info: StageInfo = {
    numLayers: 1,
    layerStart: 0,
    layerEnd: 1,
    hiddenSize: 4,
    vocabSize: V,
    isFirst: true,
    isLast: true,
    layerKinds: ['attn'],
  };
  readonly cacheGeometry: CacheGeometry = {
    pagedKv: { layers: [0], floatsPerToken: 1 },
    linearState: { layers: [], heads: 1, keyDim: 1, valueDim: 1, convStates: 0, convChannels: 0, convWidth: 0 },
  };
  forward(batch: ForwardBatch, cache: SequenceCache): ForwardResult {
    this.forwards++;
    this.log.push(
      batch.sequences.map((s) => ({ id: s.id, position: s.position, n: s.tokens.length, phase: s.phase ?? 'decode' })),
    );
    if (batch.sequences.some((s) => s.tokens.includes(V - 1))) throw new RangeError('toy: token V − 1 is not allowed');
    const rows: number[] = [];
    const start = new Int32Array(batch.sequences.length + 1);
    batch.sequences.forEach((s, i) => {
      expect(cache.length(s.id)).toBe(s.position);
      cache.extend(s.id, s.position + s.tokens.length);
      if (s.logits === 'all') rows.push(...s.tokens);
      else if (s.logits === 'last') rows.push(s.tokens[s.tokens.length - 1]!);
      start[i + 1] = rows.length;
    });
    const logits = new Float32Array(rows.length * V);
    rows.forEach((t, r) => {
      logits[r * V + next(t)] = 10;
    });
    const n = batch.sequences.reduce((a, s) => a + s.tokens.length, 0);
    return { logits, logitRowStart: start, hidden: new Float32Array(n * 4), taps: new Map() };
  }
  dispose(): void {}
}

/** Prompt-lookup-like drafter: no taps, no KV; the first `good` drafts follow the rule, the rest are wrong. */
class ToyDrafter implements Drafter {
  readonly method = 'toy';
  readonly maxDraftTokens = 5;
  readonly pagesInUse = 0;
  private readonly ctx = new Map<unknown, number>();
  constructor(private readonly good: number) {}
  captureSetter(): readonly number[] {
    return [];
  }
  projectTargetHiddenPartial(_t: ReadonlyMap<number, Float32Array>, n: number, acc?: Float32Array): Float32Array {
    return acc ?? new Float32Array(n * 4);
  }
  /** Every context row's next token as the engine reported it, by sequence and position. */
  readonly nextSeen = new Map<unknown, Map<number, number>>();
  writeProjectedContextKV(
    _sum: Float32Array,
    spans: readonly { id: unknown; position: number; numTokens: number; nextTokens?: Int32Array }[],
  ): void {
    for (const s of spans) {
      expect(this.ctx.get(s.id)).toBe(s.position);
      expect(s.nextTokens?.length).toBe(s.numTokens);
      let m = this.nextSeen.get(s.id);
      if (m === undefined) {
        m = new Map();
        this.nextSeen.set(s.id, m);
      }
      s.nextTokens!.forEach((t, i) => {
        m!.set(s.position + i, t);
      });
      this.ctx.set(s.id, s.position + s.numTokens);
    }
  }
  propose(batch: DraftBatch): DraftProposal[] {
    return batch.sequences.map((s) => {
      expect(s.history[s.history.length - 1]).toBe(s.lastToken);
      expect(this.ctx.get(s.id)).toBe(s.position);
      const d = new Int32Array(s.maxDrafts);
      let t = s.lastToken;
      for (let j = 0; j < d.length; j++) {
        t = next(t);
        d[j] = j < this.good ? t : (t + 1) % V;
      }
      return { id: s.id, tokens: d };
    });
  }
  addSequence(id: unknown): void {
    this.ctx.set(id, 0);
  }
  contextLength(id: unknown): number {
    return this.ctx.get(id)!;
  }
  freeSequence(id: unknown): void {
    this.ctx.delete(id);
  }
  get sequences(): number {
    return this.ctx.size;
  }
  dispose(): void {}
}

const req = (id: string, first: number, maxTokens: number, extra: Partial<SpecRequest> = {}): SpecRequest => ({
  id,
  promptIds: Int32Array.of(5, first),
  maxTokens,
  sampling: { temperature: 0 },
  seed: 1,
  ...extra,
});
const expected = (first: number, n: number) => {
  const out: number[] = [];
  let t = first;
  for (let i = 0; i < n; i++) {
    t = next(t);
    out.push(t);
  }
  return out;
};

/** A token whose "embedding is NaN": every logits row at or after it (in the cache or the block) is NaN. */
const POISON = V - 2;

/**
 * The toy target with broken outputs: rows at or after a POISON token of the sequence are NaN, as are rows at or
 * after `breakAt.get(id)` (the sequence's state went bad there); with `spread`, every other logit of a finite row
 * is 8 (next(t) keeps 10; V − 1 and POISON get −Infinity, never sampled), so sampling at temperature 1 picks
 * next(t) only ~20% of the time and the PRNG stream decides the output.
 */
class PoisonTarget extends ToyTarget {
  /** Per sequence, the cache positions holding POISON. */
  private readonly poisoned = new Map<unknown, number[]>();
  readonly breakAt = new Map<unknown, number>();
  constructor(private readonly spread = false) {
    super();
  }
  override forward(batch: ForwardBatch, cache: SequenceCache): ForwardResult {
    const res = super.forward(batch, cache);
    const logits = res.logits!;
    batch.sequences.forEach((s, i) => {
      const kept = (this.poisoned.get(s.id) ?? []).filter((q) => q < s.position); // rolled back beyond: gone
      s.tokens.forEach((t, j) => {
        if (t === POISON) kept.push(s.position + j);
      });
      this.poisoned.set(s.id, kept);
      const bad = Math.min(this.breakAt.get(s.id) ?? Number.POSITIVE_INFINITY, ...kept);
      const n = s.tokens.length;
      const positions =
        s.logits === 'all' ? s.tokens.map((_, j) => s.position + j) : s.logits === 'last' ? [s.position + n - 1] : [];
      positions.forEach((pos, r) => {
        const row = logits.subarray((res.logitRowStart[i]! + r) * V, (res.logitRowStart[i]! + r + 1) * V);
        if (pos >= bad) row.fill(Number.NaN);
        else if (this.spread) {
          for (let v = 0; v < V; v++) row[v] = v === V - 1 || v === POISON ? -Infinity : row[v] === 10 ? 10 : 8;
        }
      });
    });
    return res;
  }
}

describe('SpecEngine on the contracts', () => {
  it('greedy: output follows the target; 2 of 5 drafts accepted per step → τ = 3 (both definitions)', () => {
    const t = new ToyTarget();
    const d = new ToyDrafter(2);
    const e = new SpecEngine(t, d, { maxSequences: 2, draftPolicy: 'max', maxTokensPerSequence: 64 });
    const rs = e.run([req('a', 1, 31), req('b', 2, 31)]);
    for (const r of rs) expect(r.tokenIds).toEqual(expected(r.id === 'a' ? 1 : 2, 31));
    const m = e.metrics;
    expect(m.verifySteps).toBe(20); // 1 prefill token + 10 steps × 3 per request
    expect(m.tauPerStep).toBe(3);
    expect(m.tauMeanOfRequests).toBe(3);
    expect(m.perPositionAcceptance).toEqual([1, 1]);
    expect(m.acceptanceLengthHistogram).toEqual([0, 0, 0, 20]);
    expect(m.verifyForwards).toBe(10);
    expect(m.decodeForwards).toBe(30); // + one replay per sequence per step: the toy stage has no commitPrefix
    expect(t.forwards).toBe(2 + 30); // prefill + verify + replays
    expect(e.cache.pagesInUse + e.cache.slotsInUse + d.sequences).toBe(0);
  });

  it(
    'context spans carry nextTokens = the committed token after ' +
      'each row (prompt, first token, accepted drafts, bonus)',
    () => {
      const d = new ToyDrafter(2);
      const e = new SpecEngine(new ToyTarget(), d, { maxSequences: 1, draftPolicy: 'max', maxTokensPerSequence: 64 });
      const prompt = Int32Array.of(5, 9, 2);
      const [r] = e.run([{ id: 'n', promptIds: prompt, maxTokens: 12, sampling: { temperature: 0 }, seed: 0 }]);
      const all = [...prompt, ...r!.tokenIds];
      const seen = d.nextSeen.get('n')!;
      expect(seen.size).toBeGreaterThan(prompt.length);
      // (the last step may commit past maxTokens; those tokens are cut from the output, the sequence ends)
      for (const [pos, t] of seen) if (pos + 1 < all.length) expect(t, `position ${pos}`).toBe(all[pos + 1]);
    },
  );

  it('tree drafts on a target without commitTreePath fail their request, naming why', () => {
    class TreeDrafter extends ToyDrafter {
      override propose(batch: DraftBatch): DraftProposal[] {
        return super
          .propose(batch)
          .map((p) => ({ ...p, parents: Int32Array.from(p.tokens, (_, j) => (j === 0 ? -1 : 0)) }));
      }
    }
    const e = new SpecEngine(new ToyTarget(), new TreeDrafter(5), {
      maxSequences: 1,
      draftPolicy: 'max',
      maxTokensPerSequence: 64,
    });
    const [r] = e.run([req('t', 1, 8)]);
    expect([r!.finishReason, r!.error?.phase]).toEqual(['error', 'propose']);
    expect(r!.error?.message).toMatch(/tree drafts need a target that verifies trees \(StageModel.commitTreePath/);
    expect(e.cache.pagesInUse + e.cache.slotsInUse + e.cache.numSequences).toBe(0);
  });

  it('the two τ definitions differ when requests differ', () => {
    const e = new SpecEngine(new ToyTarget(), new ToyDrafter(5), {
      maxSequences: 2,
      draftPolicy: 'max',
      maxTokensPerSequence: 64,
    });
    e.run([req('a', 1, 13), req('b', 2, 3)]);
    // a: 2 steps committing 6; b: 1 step, 2 drafts (the tokens still needed) + bonus = 3 (as the
    // reference loop, the last step may commit one token past maxTokens; the output is cut)
    expect(e.metrics.tauPerStep).toBeCloseTo(15 / 3, 12);
    expect(e.metrics.tauMeanOfRequests).toBeCloseTo((6 + 3) / 2, 12);
  });

  it('the draft-length hook bounds drafts per sequence; no drafter = plain decoding', () => {
    const e = new SpecEngine(new ToyTarget(), new ToyDrafter(5), {
      maxSequences: 1,
      maxTokensPerSequence: 64,
      draftLength: () => 1,
    });
    const [r] = e.run([req('a', 1, 9)]);
    expect(r!.tokenIds).toEqual(expected(1, 9));
    expect(r!.metrics.drafted).toBe(4);
    const plain = new SpecEngine(new ToyTarget(), undefined, { maxSequences: 1, maxTokensPerSequence: 64 });
    const [p] = plain.run([req('a', 1, 9)]);
    expect(p!.tokenIds).toEqual(expected(1, 9));
    expect(p!.metrics.verifySteps).toBe(8);
    expect(p!.metrics.tauPerStep).toBe(1);
  });

  it('draftPolicy "cost": calibrates once before admitting, output unchanged, caches and drafter left clean', () => {
    const d = new ToyDrafter(5);
    const e = new SpecEngine(new ToyTarget(), d, { maxSequences: 3, maxTokensPerSequence: 64, draftPolicy: 'cost' });
    const rs = e.run([req('a', 1, 20), req('b', 2, 17), req('c', 3, 9)]);
    expect(e.stepCosts?.buckets.map((b) => b.sequences)).toEqual([1, 2, 3]);
    expect(e.stepCosts!.buckets[0]!.ks[0]).toBe(0);
    expect(e.metrics.calibrationMs).toBeGreaterThan(0);
    for (const r of rs)
      expect(r.tokenIds).toEqual(
        expected(r.id === 'a' ? 1 : r.id === 'b' ? 2 : 3, r.id === 'a' ? 20 : r.id === 'b' ? 17 : 9),
      );
    expect(e.cache.pagesInUse + e.cache.slotsInUse + e.cache.numSequences + d.sequences).toBe(0);
    // Deferred draft context (k = 0 steps) is written before the sequence drafts again.
    const f = new SpecEngine(new ToyTarget(), new ToyDrafter(5), {
      maxSequences: 1,
      maxTokensPerSequence: 64,
      draftLength: (_id, m) => (m.verifySteps % 3 === 2 ? 5 : 0),
    });
    expect(f.run([req('a', 1, 30)])[0]!.tokenIds).toEqual(expected(1, 30));
    // given step costs (one engine's calibration to another, or a skewed copy): taken as they are, nothing measured
    const g = new SpecEngine(new ToyTarget(), new ToyDrafter(5), {
      maxSequences: 3,
      maxTokensPerSequence: 64,
      draftPolicy: 'cost',
      stepCosts: e.stepCosts,
    });
    expect(g.run([req('a', 1, 20)])[0]!.tokenIds).toEqual(expected(1, 20));
    expect(g.stepCosts).toBe(e.stepCosts); // its own calibration (a new drafter: no cached one) would be a new object
  });

  it("adaptiveDraftLength follows each request's acceptance; the output does not change", () => {
    const policy = adaptiveDraftLength({ min: 1, max: 5, alpha: 1, margin: 1 });
    const m = new RequestMetrics();
    expect(policy('a', m)).toBe(5);
    m.recordStep(5, 0);
    expect(policy('a', m)).toBe(1);
    m.recordStep(1, 1);
    expect(policy('a', m)).toBe(2);
    expect(policy('b', new RequestMetrics())).toBe(5);
    const e = new SpecEngine(new ToyTarget(), new ToyDrafter(2), {
      maxSequences: 1,
      maxTokensPerSequence: 64,
      draftLength: adaptiveDraftLength({ margin: 1 }),
    });
    const [r] = e.run([req('a', 1, 25)]);
    expect(r!.tokenIds).toEqual(expected(1, 25));
    expect(r!.metrics.drafted).toBeLessThan(5 * r!.metrics.verifySteps); // shrank to 2 + 1 after the first step
    expect(() => adaptiveDraftLength({ min: 0 })).toThrow(RangeError);
  });

  it('EOS stops inside an accepted block; aborts free everything', () => {
    const d = new ToyDrafter(5);
    const e = new SpecEngine(new ToyTarget(), d, { maxSequences: 1, draftPolicy: 'max', maxTokensPerSequence: 64 });
    const want = expected(1, 20);
    e.add(req('a', 1, 20, { eosTokenIds: [want[3]!] }));
    e.add(req('b', 2, 20));
    const done = e.step();
    expect(done.map((r) => [r.id, r.finishReason, r.tokenIds])).toEqual([['a', 'eos', want.slice(0, 4)]]);
    e.step();
    expect(e.abort('b')!.finishReason).toBe('abort');
    expect(e.pending).toBe(0);
    expect(e.cache.pagesInUse + e.cache.slotsInUse + d.sequences).toBe(0);
  });

  it('a failing prefill fails its request alone and frees what the request held', () => {
    const d = new ToyDrafter(1);
    const e = new SpecEngine(new ToyTarget(), d, { maxSequences: 1, draftPolicy: 'max', maxTokensPerSequence: 64 });
    const [r] = e.run([{ ...req('a', 1, 4), promptIds: Int32Array.of(V - 1) }]);
    expect([r!.finishReason, r!.tokenIds, r!.error?.phase, r!.error?.id]).toEqual(['error', [], 'prefill', 'a']);
    expect(r!.error?.message).toMatch(/^request a: prefill: toy: token V − 1 is not allowed/);
    expect(e.metrics.requests).toHaveLength(0);
    expect(e.pending).toBe(0);
    expect(e.cache.pagesInUse + e.cache.slotsInUse + e.cache.numSequences + d.sequences).toBe(0);
    expect(e.run([req('b', 1, 4)])[0]!.tokenIds).toEqual(expected(1, 4));
  });

  it(
    'chunked prefill: a 30-token prompt prefills one 4-token chunk per step while a ' +
      'decoding sequence commits tokens in every step; outputs and draft context as alone',
    () => {
      const CHUNK = 4;
      // (ends in 2: b's continuation stays on the cycle 1 → 10 → 9 → 2 → …, whose wrong drafts avoid V − 1)
      const longPrompt = Int32Array.from({ length: 30 }, (_, i) => (i === 29 ? 2 : (i * 5 + 1) % (V - 1)));
      const mk = () => {
        const t = new ToyTarget();
        const d = new ToyDrafter(2);
        return {
          t,
          d,
          e: new SpecEngine(t, d, {
            maxSequences: 2,
            draftPolicy: 'max',
            maxTokensPerSequence: 128,
            prefillChunk: CHUNK,
          }),
        };
      };
      const reqA = req('a', 1, 40);
      const reqB: SpecRequest = { id: 'b', promptIds: longPrompt, maxTokens: 6, sampling: { temperature: 0 }, seed: 1 };
      // each request alone
      const alone = new Map<string, { tokens: number[]; ctx: Map<number, number> }>();
      for (const r of [reqA, reqB]) {
        const { d, e } = mk();
        const [res] = e.run([r]);
        alone.set(r.id as string, { tokens: res!.tokenIds, ctx: d.nextSeen.get(r.id)! });
      }
      expect(alone.get('b')!.tokens).toEqual(expected(longPrompt[29]!, 6));

      const { t, d, e } = mk();
      const got = new Map<string, number[]>([
        ['a', []],
        ['b', []],
      ]);
      const track = (r: SpecRequest): SpecRequest => ({ ...r, onToken: (tok) => got.get(r.id as string)!.push(tok) });
      e.add(track(reqA));
      e.step(); // a: its one prefill chunk + a verify round
      expect(got.get('a')!.length).toBe(1 + 3);
      e.add(track(reqB));
      const chunks = Math.ceil(longPrompt.length / CHUNK);
      expect(chunks).toBe(8);
      for (let s = 0; s < chunks; s++) {
        const aBefore = got.get('a')!.length;
        const from = t.log.length;
        e.step();
        const step = t.log.slice(from);
        // this step: exactly one prefill forward, b's chunk s at the old boundary [s·4, (s+1)·4) …
        const prefills = step.filter((f) => f.some((q) => q.phase === 'prefill'));
        expect(prefills).toEqual([
          [{ id: 'b', position: s * CHUNK, n: Math.min(CHUNK, longPrompt.length - s * CHUNK), phase: 'prefill' }],
        ]);
        // … then a's verify round: a committed 3 tokens (2 accepted drafts + bonus) in this step too
        expect(step.indexOf(prefills[0]!)).toBe(0);
        expect(step[1]!.map((q) => q.id)).toEqual(s < chunks - 1 ? ['a'] : ['a', 'b']);
        expect(got.get('a')!.length - aBefore).toBe(3);
        // b gets its first token (and joins the verify round) in the step of its last chunk
        expect(got.get('b')!.length).toBe(s < chunks - 1 ? 0 : 1 + 3);
        expect(e.prefilling).toBe(s < chunks - 1 ? 1 : 0);
      }
      while (e.pending > 0) e.step();
      expect(got.get('a')!.slice(0, 40)).toEqual(alone.get('a')!.tokens);
      expect(got.get('b')!.slice(0, 6)).toEqual(alone.get('b')!.tokens);
      // the draft context (positions and next tokens of every row) is written as when alone
      expect(d.nextSeen.get('b')).toEqual(alone.get('b')!.ctx);
      expect(d.nextSeen.get('a')).toEqual(alone.get('a')!.ctx);
      expect(e.metrics.prefillForwards).toBe(1 + chunks);
      expect(t.forwards).toBe(e.metrics.prefillForwards + e.metrics.decodeForwards); // prefill is not a decode forward
      expect(e.cache.pagesInUse + e.cache.slotsInUse + e.cache.numSequences + d.sequences).toBe(0);
    },
  );

  it(
    "abort mid-prefill frees the prompt's pages, slot and draft " +
      'sequence; a chunk that fails frees its request, the others go on',
    () => {
      const d = new ToyDrafter(2);
      const e = new SpecEngine(new ToyTarget(), d, {
        maxSequences: 2,
        draftPolicy: 'max',
        maxTokensPerSequence: 128,
        pageSize: 4,
        prefillChunk: 4,
      });
      e.add(req('a', 1, 30));
      e.step();
      const pagesA = e.cache.pagesInUse;
      e.add({ id: 'b', promptIds: new Int32Array(40).fill(3), maxTokens: 4, sampling: { temperature: 0 }, seed: 1 });
      e.step();
      e.step(); // b: 8 of 40 prompt tokens prefilled
      expect(e.prefilling).toBe(1);
      expect(e.cache.length('b')).toBe(8);
      expect(e.cache.numSequences).toBe(2);
      const pagesBoth = e.cache.pagesInUse;
      expect(pagesBoth).toBeGreaterThan(pagesA);
      const r = e.abort('b')!;
      expect([r.finishReason, r.tokenIds]).toEqual(['abort', []]);
      expect(e.prefilling).toBe(0);
      expect([e.cache.numSequences, d.sequences]).toEqual([1, 1]);
      expect(e.cache.pagesInUse).toBe(pagesBoth - 2); // b's 8 tokens = 2 pages of 4
      // a prompt whose third chunk holds a token the target refuses: c fails in that step and is freed
      const bad = Int32Array.from({ length: 12 }, (_, i) => (i === 9 ? V - 1 : 2));
      e.add({ id: 'c', promptIds: bad, maxTokens: 4, sampling: { temperature: 0 }, seed: 1 });
      e.step();
      e.step();
      expect(e.cache.length('c')).toBe(8);
      const failed = e.step();
      expect(failed.map((x) => [x.id, x.finishReason, x.error?.phase])).toEqual([['c', 'error', 'prefill']]);
      expect(failed[0]!.error?.message).toMatch(/not allowed/);
      expect([e.pending, e.prefilling, e.cache.numSequences, d.sequences]).toEqual([1, 0, 1, 1]);
      const done = e.run();
      expect(done.map((x) => [x.id, x.tokenIds])).toEqual([['a', expected(1, 30)]]);
      expect(e.cache.pagesInUse + e.cache.slotsInUse + e.cache.numSequences + d.sequences).toBe(0);
    },
  );

  it('validates requests with messages naming the field', () => {
    const e = new SpecEngine(new ToyTarget(), new ToyDrafter(1), {
      maxSequences: 1,
      draftPolicy: 'max',
      maxTokensPerSequence: 16,
    });
    expect(() => e.add(req('a', 1, 0))).toThrow(/maxTokens: expected an integer >= 1/);
    expect(() => e.add({ ...req('a', 1, 4), promptIds: new Int32Array(0) })).toThrow(/promptIds/);
    expect(() => e.add(req('a', 1, 12))).toThrow(/needs 20 tokens, maxTokensPerSequence is 16/);
    expect(() => e.add(req('a', 1, 4, { stopStrings: ['x'] }))).toThrow(/stopStrings need the engine's decode/);
    e.add(req('a', 1, 4));
    expect(() => e.add(req('a', 1, 4))).toThrow(EngineError);
    expect(() => new SpecEngine(new ToyTarget(), undefined, { prefillChunk: 0 })).toThrow(
      /prefillChunk: expected an integer >= 1, got 0/,
    );
  });
});

describe('one request never fails another', () => {
  /** ToyDrafter whose first wrong draft of sequence `a` is POISON (a NaN-embedding token drafted, then rejected). */
  class PoisonDrafter extends ToyDrafter {
    override propose(batch: DraftBatch): DraftProposal[] {
      return super.propose(batch).map((p) => {
        if (p.id !== 'a' || p.tokens.length < 3) return p;
        const tokens = Int32Array.from(p.tokens);
        tokens[2] = POISON;
        return { ...p, tokens };
      });
    }
  }

  /** ToyDrafter that never drafts V − 1 (the toy target throws on it) or POISON: for the sampled runs. */
  class SafeDrafter extends ToyDrafter {
    override propose(batch: DraftBatch): DraftProposal[] {
      return super.propose(batch).map((p) => ({ ...p, tokens: p.tokens.map((t) => (t >= POISON ? 0 : t)) }));
    }
  }

  it(
    'non-finite logits fail only the request whose rows they are: a prompt holding the NaN token at prefill, ' +
      'a state gone bad at a verify; a rejected NaN draft changes nothing; everything is freed',
    () => {
      expect(expected(1, 40)).not.toContain(POISON);
      expect(expected(2, 40)).not.toContain(POISON);
      const t = new PoisonTarget();
      const d = new PoisonDrafter(2);
      const e = new SpecEngine(t, d, { maxSequences: 4, draftPolicy: 'max', maxTokensPerSequence: 128 });
      t.breakAt.set('e', 9); // e's rows from position 9 on are NaN: its prompt (2) + 7 tokens are fine
      const results = e.run([
        req('a', 1, 40),
        { ...req('b', 1, 40), promptIds: Int32Array.of(5, POISON, 1) },
        req('c', 2, 40),
        req('e', 2, 40),
      ]);
      const by = new Map(results.map((r) => [r.id, r]));
      expect(by.get('a')!.tokenIds).toEqual(expected(1, 40));
      expect(by.get('c')!.tokenIds).toEqual(expected(2, 40));
      expect([by.get('a')!.finishReason, by.get('c')!.finishReason]).toEqual(['length', 'length']);
      const b = by.get('b')!;
      expect([b.finishReason, b.tokenIds, b.error?.phase]).toEqual(['error', [], 'prefill']);
      expect(b.error?.message).toMatch(
        /^request b: prefill: the logits after prompt position 2: the logit of token 0 is NaN/,
      );
      const bad = by.get('e')!;
      expect([bad.finishReason, bad.error?.phase]).toEqual(['error', 'accept']);
      expect(bad.error?.message).toMatch(/^request e: accept: verify row \d+: the logit of token 0 is NaN/);
      // e emitted the tokens of the steps before the one whose accepted path reached row 9 (tokens from rows ≤ 8)
      expect(bad.tokenIds.length).toBeGreaterThan(0);
      expect(bad.tokenIds.length).toBeLessThanOrEqual(8);
      expect(bad.tokenIds).toEqual(expected(2, bad.tokenIds.length));
      expect(e.metrics.requests).toHaveLength(2); // failed requests record no metrics
      expect(e.cache.pagesInUse + e.cache.slotsInUse + e.cache.numSequences + d.sequences).toBe(0);
      // the slots and pages they held serve new requests as before
      expect(e.run([req('f', 1, 12)])[0]!.tokenIds).toEqual(expected(1, 12));
    },
  );

  it('sampled: a NaN row fails only its request; the others keep their tokens (same PRNG streams as alone)', () => {
    const mk = () => {
      const t = new PoisonTarget(true);
      const d = new SafeDrafter(2);
      return { t, d, e: new SpecEngine(t, d, { maxSequences: 3, draftPolicy: 'max', maxTokensPerSequence: 128 }) };
    };
    const sampled = (id: string, first: number, seed: number): SpecRequest => ({
      ...req(id, first, 40),
      sampling: { temperature: 1 },
      seed,
    });
    const alone = [sampled('a', 1, 11), sampled('c', 2, 12)].map((r) => mk().e.run([r])[0]!.tokenIds);
    // the streams matter: outputs are not the target's argmax chain
    expect(alone[0]).not.toEqual(expected(1, 40));
    const { t, d, e } = mk();
    t.breakAt.set('x', 6);
    const by = new Map(e.run([sampled('a', 1, 11), sampled('x', 3, 13), sampled('c', 2, 12)]).map((r) => [r.id, r]));
    expect(by.get('a')!.tokenIds).toEqual(alone[0]);
    expect(by.get('c')!.tokenIds).toEqual(alone[1]);
    expect([by.get('x')!.finishReason, by.get('x')!.error?.phase]).toEqual(['error', 'accept']);
    expect(by.get('x')!.error?.message).toMatch(/NaN|finite/);
    expect(e.cache.pagesInUse + e.cache.slotsInUse + e.cache.numSequences + d.sequences).toBe(0);
  });

  it(
    'a drafter that throws on one sequence fails that request alone: the batch is re-proposed one by one ' +
      'with the PRNGs rewound, so the others keep their sampled tokens',
    () => {
      /** Draws once from each sequence's PRNG, then throws when `bad` is in the batch. */
      class ThrowingDrafter extends SafeDrafter {
        override propose(batch: DraftBatch): DraftProposal[] {
          for (const s of batch.sequences) s.rng.next();
          if (batch.sequences.some((s) => s.id === 'bad')) throw new Error('toy drafter: cannot draft for bad');
          return super.propose(batch);
        }
      }
      const mk = () => {
        const d = new ThrowingDrafter(2);
        const e = new SpecEngine(new PoisonTarget(true), d, {
          maxSequences: 3,
          draftPolicy: 'max',
          maxTokensPerSequence: 128,
        });
        return { d, e };
      };
      const sampled = (id: string, first: number, seed: number): SpecRequest => ({
        ...req(id, first, 30),
        sampling: { temperature: 1 },
        seed,
      });
      const alone = [sampled('a', 1, 21), sampled('c', 2, 22)].map((r) => mk().e.run([r])[0]!.tokenIds);
      const { d, e } = mk();
      // 'bad' drafts last in the batch: a and c drew before the batched call threw
      const by = new Map(
        e.run([sampled('a', 1, 21), sampled('c', 2, 22), sampled('bad', 3, 23)]).map((r) => [r.id, r]),
      );
      expect(by.get('a')!.tokenIds).toEqual(alone[0]);
      expect(by.get('c')!.tokenIds).toEqual(alone[1]);
      const bad = by.get('bad')!;
      expect([bad.finishReason, bad.error?.phase, bad.tokenIds.length]).toEqual(['error', 'propose', 1]);
      expect(bad.error?.message).toBe('request bad: propose: toy drafter: cannot draft for bad');
      expect(bad.error?.cause).toBeInstanceOf(Error);
      expect(e.cache.pagesInUse + e.cache.slotsInUse + e.cache.numSequences + d.sequences).toBe(0);
    },
  );

  it('refuses sampling settings outside their ranges, naming the field', () => {
    const e = new SpecEngine(new ToyTarget(), undefined, { maxTokensPerSequence: 16 });
    const bad: [DraftSampling, RegExp][] = [
      [{ temperature: 1e-45 }, /sampling.temperature: expected 0 \(greedy\) or a finite number >= 0.00001, got 1e-45/],
      [{ temperature: Number.NaN }, /sampling.temperature: .* got NaN/],
      [{ temperature: Number.POSITIVE_INFINITY }, /sampling.temperature: .* got Infinity/],
      [{ temperature: -1 }, /sampling.temperature: .* got -1/],
      [{ temperature: 1, topK: 1.5 }, /sampling.topK: expected an integer >= 0 \(0: off\), got 1.5/],
      [{ temperature: 1, topK: -1 }, /sampling.topK/],
      [{ temperature: 1, topP: 0 }, /sampling.topP: expected a number in \(0, 1\] \(1: off\), got 0/],
      [{ temperature: 1, topP: Number.NaN }, /sampling.topP/],
    ];
    for (const [sampling, msg] of bad) expect(() => e.add({ ...req('a', 1, 4), sampling }), msg.source).toThrow(msg);
    // normalised, a tiny temperature is greedy: the target's argmax chain
    const [r] = e.run([{ ...req('g', 1, 6), sampling: normalizeSampling({ temperature: 1e-45, topK: 3, topP: 0.5 }) }]);
    expect(r!.tokenIds).toEqual(expected(1, 6));
    expect(normalizeSampling({ temperature: 9e-6, topK: 3, topP: 0.5 })).toEqual({ temperature: 0 });
    expect(normalizeSampling({ temperature: 1e-5, topK: 3 })).toEqual({ temperature: 1e-5, topK: 3 });
  });
});
