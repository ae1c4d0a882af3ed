// End-to-end losslessness of rejection sampling through the engine (not only the accept function):
// a toy target whose next-token distribution is a Markov chain P, a toy drafter sampling from a
// different chain Q (returning q), 10⁴ seeded requests of 3 tokens; the joint distribution of the
// 2nd and 3rd generated tokens (both produced by verify steps) must be the target chain's, after the
// request's temperature — χ² over the 16 cells. Also with argmax drafts (no q: point masses).
import { describe, expect, it } from 'vitest';

import { samplingProbs, sampleFromProbs, SpecEngine } from '../../src/engine/index.js';
import type { SequenceCache } from '../../src/kv/index.js';
import type {
  CacheGeometry, DraftBatch, Drafter, DraftProposal, ForwardBatch, ForwardResult, StageInfo, StageModel,
} from '../../src/plugin/index.js';

const V = 4;
const P = [[0.1, 0.4, 0.3, 0.2], [0.5, 0.1, 0.1, 0.3], [0.25, 0.25, 0.25, 0.25], [0.05, 0.15, 0.6, 0.2]];
const Q = [[0.4, 0.1, 0.1, 0.4], [0.1, 0.6, 0.2, 0.1], [0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]];
const logRow = (m: number[][], t: number) => Float32Array.from(m[t]!, Math.log);

class ChainTarget implements StageModel {
  readonly info: StageInfo = { numLayers: 1, layerStart: 0, layerEnd: 1, hiddenSize: 2, vocabSize: V, isFirst: true, isLast: true, layerKinds: ['x'] };
  readonly cacheGeometry: CacheGeometry = {
    pagedKv: { layers: [0], floatsPerToken: 1 },
    linearState: { layers: [], heads: 1, keyDim: 1, valueDim: 1, convStates: 0, convChannels: 0, convWidth: 0 },
  };
  forward(batch: ForwardBatch, cache: SequenceCache): ForwardResult {
    const rows: number[] = [];
    const start = new Int32Array(batch.sequences.length + 1);
    batch.sequences.forEach((s, i) => {
      this.starts.set(s.id, s.position);
      cache.extend(s.id, s.position + s.tokens.length);
      if (s.logits === 'all') rows.push(...s.tokens);
      else if (s.logits === 'last') rows.push(s.tokens[s.tokens.length - 1]!);
      start[i + 1] = rows.length;
    });
    const logits = new Float32Array(rows.length * V);
    rows.forEach((t, r) => logits.set(logRow(P, t), r * V));
    const n = batch.sequences.reduce((a, s) => a + s.tokens.length, 0);
    return { logits, logitRowStart: start, hidden: new Float32Array(n * 2), taps: new Map() };
  }
  commitPrefix(cache: SequenceCache, _r: ForwardResult, id: string | number, committed: number): void {
    cache.rollback(id, { length: this.starts.get(id)! + committed, state: undefined });
  }
  readonly starts = new Map<string | number, number>();
  dispose(): void {}
}

class ChainDrafter implements Drafter {
  readonly method = 'chain';
  readonly maxDraftTokens = 3;
  readonly pagesInUse = 0;
  constructor(private readonly withQ: boolean) {}
  captureSetter(): readonly number[] { return []; }
  projectTargetHiddenPartial(_t: ReadonlyMap<number, Float32Array>, n: number): Float32Array { return new Float32Array(n * 2); }
  writeProjectedContextKV(): void {}
  propose(batch: DraftBatch): DraftProposal[] {
    return batch.sequences.map((s) => {
      const tokens = new Int32Array(s.maxDrafts);
      const probs = new Float32Array(s.maxDrafts * V);
      let t = s.lastToken;
      for (let j = 0; j < tokens.length; j++) {
        const lq = logRow(Q, t);
        if (this.withQ) {
          const q = samplingProbs(lq, V, s.sampling);
          probs.set(q, j * V);
          t = sampleFromProbs(q, s.rng);
        } else {
          t = lq.indexOf(Math.max(...lq));
        }
        tokens[j] = t;
      }
      return this.withQ ? { id: s.id, tokens, probs } : { id: s.id, tokens };
    });
  }
  buildPDInput(): unknown { throw new Error('no'); }
  acceptPDInput(): void { throw new Error('no'); }
  addSequence(): void {}
  contextLength(): number { return 0; }
  freeSequence(): void {}
  dispose(): void {}
}

/** χ² critical value at p = 0.001, 15 degrees of freedom. */
const CHI2_CRIT_15 = 37.697;
const N = 10_000;

describe.each([
  ['q from a different chain, 2 drafts', true, 1, 2],
  ['q from a different chain, 1 draft (the 3rd token is often the bonus after an accepted draft)', true, 1, 1],
  ['q at temperature 0.6', true, 0.6, 2],
  ['argmax drafts (point mass)', false, 1, 2],
])('engine rejection sampling is lossless: %s', (_name, withQ, temperature, drafts) => {
  it('(2nd, 3rd) generated tokens ~ the target chain (χ², 10⁴ requests)', () => {
    const target = new ChainTarget();
    const e = new SpecEngine(target, new ChainDrafter(withQ), { maxSequences: 256, maxTokensPerSequence: 16, pageSize: 4, draftLength: () => drafts });
    const x = 2;
    const rs = e.run(Array.from({ length: N }, (_, i) => ({
      id: i, promptIds: Int32Array.of(x), maxTokens: 3, sampling: { temperature }, seed: Math.imul(i + 1, 2654435761) >>> 0,
    })));
    const counts = new Array<number>(V * V).fill(0);
    for (const r of rs) counts[r.tokenIds[1]! * V + r.tokenIds[2]!]!++;
    const p = (t: number) => samplingProbs(logRow(P, t), V, { temperature });
    const expected = new Array<number>(V * V).fill(0);
    const p0 = p(x);
    for (let a = 0; a < V; a++) for (let b = 0; b < V; b++) for (let c = 0; c < V; c++) expected[b * V + c]! += p0[a]! * p(a)[b]! * p(b)[c]!;
    let chi = 0;
    for (let i = 0; i < V * V; i++) chi += (counts[i]! - expected[i]! * N) ** 2 / (expected[i]! * N);
    expect(chi).toBeLessThan(CHI2_CRIT_15);
    expect(e.metrics.accepted).toBeGreaterThan(0);
    expect(e.metrics.accepted).toBeLessThan(e.metrics.drafted);
    expect(e.cache.pagesInUse + e.cache.slotsInUse).toBe(0);
  });
});
