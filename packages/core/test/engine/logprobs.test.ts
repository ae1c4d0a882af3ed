// Token logprobs (engine/logprobs.ts) against a plain float64 log_softmax, and the engine's opt-in per request on
// the contracts alone (a toy target whose logits are a fixed function of the current token, a drafter that guesses
// the first `good` drafts right): a request that does not ask gets no logprobs and its prefill asks for the last
// row only; one that asks gets each committed token's logprob from the row before it — accepted drafts, recovered
// and bonus tokens alike, the same numbers with and without a drafter — and its prompt's logprobs across chunks.
import { describe, expect, it } from 'vitest';

import {
  EngineError,
  MAX_TOP_LOGPROBS,
  SpecEngine,
  type SpecRequest,
  type TokenLogprob,
  tokenLogprob,
} from '../../src/engine/index.js';
import type { SequenceCache } from '../../src/kv/index.js';
import type {
  CacheGeometry,
  DraftBatch,
  Drafter,
  DraftProposal,
  ForwardBatch,
  ForwardResult,
  StageInfo,
  StageModel,
} from '../../src/plugin/index.js';

/** log_softmax(row)[v] in float64, the plain-loop reference: row[v] − (m + log Σ exp(row[u] − m)), m the max. */
function refLogprob(row: Float32Array, v: number): number {
  let m = -Infinity;
  for (const x of row) m = Math.max(m, x);
  let s = 0;
  for (const x of row) s += Math.exp(x - m);
  return row[v]! - (m + Math.log(s));
}

/** A seeded row of f32 logits (xorshift). */
function randomRow(n: number, seed: number): Float32Array {
  let x = seed >>> 0 || 1;
  const row = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    row[i] = ((x >>> 0) / 2 ** 32) * 20 - 10;
  }
  return row;
}

describe('tokenLogprob', () => {
  it('equals a float64 log_softmax; top-n by logit descending, ties by id; rank; −Infinity stays −Infinity', () => {
    for (const seed of [1, 2, 3]) {
      const row = randomRow(1000, seed);
      const token = (seed * 97) % 1000;
      const lp = tokenLogprob(row, token, 7);
      expect(lp.logprob).toBe(refLogprob(row, token));
      const order = Array.from(row.keys()).sort((a, b) => row[b]! - row[a]! || a - b);
      expect(lp.top.map((t) => t.token)).toEqual(order.slice(0, 7));
      for (const t of lp.top) expect(t.logprob).toBe(refLogprob(row, t.token));
      expect(lp.rank).toBe(order.indexOf(token) + 1);
      expect(Math.abs(order.reduce((s, v) => s + Math.exp(refLogprob(row, v)), 0) - 1)).toBeLessThan(1e-12);
    }
    const ties = Float32Array.of(1, 3, -Infinity, 3, 0);
    const lp = tokenLogprob(ties, 3, 4);
    expect(lp.top.map((t) => t.token)).toEqual([1, 3, 0, 4]);
    expect(lp.rank).toBe(2);
    expect(tokenLogprob(ties, 2, 0)).toEqual({ token: 2, logprob: -Infinity, top: [], rank: 5 });
  });

  it('refuses a token outside the row and a top-n outside [0, 20]', () => {
    const row = randomRow(8, 4);
    expect(() => tokenLogprob(row, 8, 1)).toThrow(/token: expected an id in \[0, 8\), got 8/);
    expect(() => tokenLogprob(row, 0, MAX_TOP_LOGPROBS + 1)).toThrow(/topN: expected an integer in \[0, 20\]/);
  });
});

const V = 24;
const next = (t: number) => (t * 5 + 3) % V;
/** The toy target's logits after token t: next(t) gets 6, the others a spread of smaller values. */
function rowAfter(t: number): Float32Array {
  const row = new Float32Array(V);
  for (let v = 0; v < V; v++) row[v] = v === next(t) ? 6 : ((v * 7 + t * 3) % 11) * 0.5 - 2;
  return row;
}

class ToyTarget implements StageModel {
  /** The logits request of every sequence of every forward, by phase. */
  readonly asked: { phase: string; logits: string }[] = [];
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
    const rows: number[] = [];
    const start = new Int32Array(batch.sequences.length + 1);
    batch.sequences.forEach((s, i) => {
      this.asked.push({ phase: s.phase ?? 'decode', logits: s.logits });
      cache.extend(s.id, s.position + s.tokens.length);
      if (s.logits === 'all') rows.push(...s.tokens);
      else if (s.logits === 'last') rows.push(s.tokens[s.tokens.length - 1]!);
      start[i + 1] = rows.length;
    });
    const logits = new Float32Array(rows.length * V);
    rows.forEach((t, r) => {
      logits.set(rowAfter(t), r * V);
    });
    const n = batch.sequences.reduce((a, s) => a + s.tokens.length, 0);
    return { logits, logitRowStart: start, hidden: new Float32Array(n * 4), taps: new Map() };
  }
  dispose(): void {}
}

/** No taps, no KV; the first `good` drafts follow the target's argmax, the rest are wrong. */
class ToyDrafter implements Drafter {
  readonly method = 'toy';
  readonly maxDraftTokens = 4;
  readonly pagesInUse = 0;
  private readonly ctx = new Map<unknown, number>();
  constructor(private readonly good: number) {}
  captureSetter(): readonly number[] {
    return [];
  }
  projectTargetHiddenPartial(_t: ReadonlyMap<number, Float32Array>, n: number, acc?: Float32Array): Float32Array {
    return acc ?? new Float32Array(n * 4);
  }
  writeProjectedContextKV(_sum: Float32Array, spans: readonly { id: unknown; position: number; numTokens: number }[]) {
    for (const s of spans) this.ctx.set(s.id, s.position + s.numTokens);
  }
  propose(batch: DraftBatch): DraftProposal[] {
    return batch.sequences.map((s) => {
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

/** Runs one request; returns its tokens, the logprobs onToken got, the prompt logprobs and the target's log. */
function run(drafter: Drafter | undefined, extra: Partial<SpecRequest>, prefillChunk = 64) {
  const target = new ToyTarget();
  const engine = new SpecEngine(target, drafter, { draftLength: () => 4, prefillChunk });
  const lps: (TokenLogprob | undefined)[] = [];
  let prompt: readonly (TokenLogprob | null)[] | undefined;
  const [r] = engine.run([
    {
      id: 'a',
      promptIds: Int32Array.of(1, 7, 2, 9, 4),
      maxTokens: 13,
      sampling: { temperature: 0 },
      seed: 1,
      onToken: (_t, lp) => lps.push(lp),
      onPromptLogprobs: (p) => {
        prompt = p;
      },
      ...extra,
    },
  ]);
  return { tokens: r!.tokenIds, lps, prompt, asked: target.asked, metrics: r!.metrics };
}

describe('SpecEngine logprobs (opt-in per request)', () => {
  it('a request that does not ask gets none, and its prefill asks for the last row only', () => {
    const { lps, prompt, asked } = run(new ToyDrafter(2), {});
    expect(lps.length).toBe(13);
    expect(lps.every((lp) => lp === undefined)).toBe(true);
    expect(prompt).toBeUndefined();
    expect(asked.filter((a) => a.phase === 'prefill').map((a) => a.logits)).toEqual(['last']);
  });

  it('each committed token (accepted, recovered, bonus) has the logprob of the row before it, as no-spec', () => {
    const spec = run(new ToyDrafter(2), { logprobs: 3 });
    const plain = run(undefined, { logprobs: 3 });
    expect(spec.metrics.accepted).toBeGreaterThan(0);
    expect(spec.metrics.drafted).toBeGreaterThan(spec.metrics.accepted); // recovered tokens too
    expect(spec.tokens).toEqual(plain.tokens);
    expect(spec.lps).toEqual(plain.lps);
    let prev = 4;
    spec.tokens.forEach((t, i) => {
      const lp = spec.lps[i]!;
      expect(lp.token).toBe(t);
      expect(lp.logprob).toBe(refLogprob(rowAfter(prev), t));
      expect(lp.top.length).toBe(3);
      expect(lp.top[0]!.token).toBe(t); // greedy: the emitted token is the most likely
      prev = t;
    });
  });

  it('prompt logprobs across prefill chunks: entry 0 null, entry i from the row after token i − 1', () => {
    const { prompt, asked, lps } = run(new ToyDrafter(1), { promptLogprobs: 2, logprobs: 0 }, 2);
    const ids = [1, 7, 2, 9, 4];
    expect(asked.filter((a) => a.phase === 'prefill').map((a) => a.logits)).toEqual(['all', 'all', 'all']);
    expect(prompt!.length).toBe(ids.length);
    expect(prompt![0]).toBeNull();
    for (let i = 1; i < ids.length; i++) {
      expect(prompt![i]!.token).toBe(ids[i]);
      expect(prompt![i]!.logprob).toBe(refLogprob(rowAfter(ids[i - 1]!), ids[i]!));
      expect(prompt![i]!.top.length).toBe(2);
    }
    // the first generated token still comes from the last prompt row
    expect(lps[0]!.logprob).toBe(refLogprob(rowAfter(4), next(4)));
    expect(lps[0]!.top).toEqual([]);
  });

  it('refuses logprobs and promptLogprobs outside [0, 20], naming the field', () => {
    const engine = new SpecEngine(new ToyTarget(), undefined);
    const base = { promptIds: Int32Array.of(1), maxTokens: 2, sampling: { temperature: 0 }, seed: 1 };
    expect(() => engine.add({ ...base, id: 'x', logprobs: 21 })).toThrow(EngineError);
    expect(() => engine.add({ ...base, id: 'x', logprobs: 21 })).toThrow(/logprobs: expected an integer in \[0, 20\]/);
    expect(() => engine.add({ ...base, id: 'y', promptLogprobs: -1 })).toThrow(/promptLogprobs: expected an integer/);
  });
});
