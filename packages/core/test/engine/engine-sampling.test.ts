// End-to-end losslessness of rejection sampling through the engine (not only the accept function):
// a toy target whose next-token distribution is a Markov chain P, a toy drafter sampling from a
// different chain Q (returning q), 10⁴ seeded requests of 3 tokens; the joint distribution of the
// 2nd and 3rd generated tokens (both produced by verify steps) must be the target chain's, after the
// request's temperature and top-p — χ² over the 16 cells (cells top-p makes impossible must stay empty). Also with
// argmax drafts (no q: point masses).
// The same through a stage that samples where its logits live (DeviceSampling, a JavaScript model of the GPU
// stage's sampling.cu): the engine hands it the drafts, q and k + 1 draws, no logits come back, the χ² holds; a batch
// with a logprobs request stays on the host; a row the stage cannot draw from fails only its sequence.
// And seeded requests (SpecRequest.seeded) under a timing-based policy: plain decoding, reproducible.
// With the request's logits processors (penalties, logit_bias, min_tokens; logits-processors.ts): the same χ²
// against the processed chain, greedy speculation equal to plain decoding, min_tokens and stop_token_ids.
import { describe, expect, it } from 'vitest';

import {
  CostDraftPolicy,
  LogitsProcessor,
  samplingProbs,
  sampleFromProbs,
  SpecEngine,
  StepCosts,
  type SamplingParams,
  type SpecRequest,
  type SpecResult,
} from '../../src/engine/index.js';
import type { SequenceCache } from '../../src/kv/index.js';
import type {
  CacheGeometry,
  DeviceSampleSpec,
  DeviceSampling,
  DraftBatch,
  Drafter,
  DraftProposal,
  ForwardBatch,
  ForwardOptions,
  ForwardResult,
  PrefixCommit,
  StageInfo,
  StageModel,
} from '../../src/plugin/index.js';

const V = 4;
const P = [
  [0.1, 0.4, 0.3, 0.2],
  [0.5, 0.1, 0.1, 0.3],
  [0.25, 0.25, 0.25, 0.25],
  [0.05, 0.15, 0.6, 0.2],
];
const Q = [
  [0.4, 0.1, 0.1, 0.4],
  [0.1, 0.6, 0.2, 0.1],
  [0.7, 0.1, 0.1, 0.1],
  [0.25, 0.25, 0.25, 0.25],
];
const logRow = (m: number[][], t: number) => Float32Array.from(m[t]!, Math.log);

class ChainTarget implements StageModel, PrefixCommit {
  readonly info: StageInfo = {
    numLayers: 1,
    layerStart: 0,
    layerEnd: 1,
    hiddenSize: 2,
    vocabSize: V,
    isFirst: true,
    isLast: true,
    layerKinds: ['x'],
  };
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
    rows.forEach((t, r) => {
      logits.set(logRow(P, t), r * V);
    });
    const n = batch.sequences.reduce((a, s) => a + s.tokens.length, 0);
    return { logits, logitRowStart: start, hidden: new Float32Array(n * 2), taps: new Map() };
  }
  commitPrefix(cache: SequenceCache, _r: ForwardResult, id: string | number, committed: number): void {
    cache.rollback(id, { length: this.starts.get(id)! + committed, state: undefined });
  }
  readonly starts = new Map<string | number, number>();
  dispose(): void {}
}

/**
 * ChainTarget sampling "on its device" ({@link DeviceSampling}): a forward asked for `argmaxOnly` keeps its logits
 * and returns none; sampleOnDevice decides each spec as sampling.cu does, with the spec's draws (u_j for draft j,
 * u_k for the token drawn by the inverse CDF). Sequences in `poisoned` get the token −1 (a row not finite).
 */
class DeviceChainTarget extends ChainTarget implements DeviceSampling {
  private last: { res: ForwardResult; logits: Float32Array } | undefined;
  argmaxOnlyForwards = 0;
  logitForwards = 0;
  readonly specs: DeviceSampleSpec[] = [];
  readonly poisoned = new Set<string | number>();
  private ids: (string | number)[] = [];
  override forward(batch: ForwardBatch, cache: SequenceCache, options: ForwardOptions = {}): ForwardResult {
    const res = super.forward(batch, cache);
    this.ids = batch.sequences.map((s) => s.id);
    if (options.argmaxOnly !== true) {
      this.last = undefined;
      if (res.logits!.length > 0) this.logitForwards++;
      return res;
    }
    this.argmaxOnlyForwards++;
    const rows = res.logits!.length / V;
    const argmax = Int32Array.from({ length: rows }, (_, r) => {
      const row = Array.from(res.logits!.subarray(r * V, (r + 1) * V));
      return row.indexOf(Math.max(...row));
    });
    const out: ForwardResult = { ...res, logits: undefined, argmax };
    this.last = { res: out, logits: res.logits! };
    return out;
  }
  sampleOnDevice(result: ForwardResult, specs: readonly (DeviceSampleSpec | undefined)[]): Int32Array {
    expect(result, 'sampleOnDevice gets the latest forward').toBe(this.last?.res);
    const { logits } = this.last!;
    const out = new Int32Array(2 * specs.length).fill(-2);
    specs.forEach((sp, s) => {
      if (sp === undefined) return;
      this.specs.push(sp);
      const k = sp.drafts.length;
      expect(sp.uniforms.length).toBe(k + 1);
      const row0 = result.logitRowStart[s + 1]! - 1 - k;
      const p = (j: number) => samplingProbs(logits.subarray((row0 + j) * V, (row0 + j + 1) * V), V, sp);
      let j = 0;
      for (; j < k; j++) {
        const x = sp.drafts[j]!;
        if (!(sp.uniforms[j]! * (sp.q === undefined ? 1 : sp.q[j * V + x]!) < p(j)[x]!)) break;
      }
      let w = p(j);
      if (j < k) {
        const x = sp.drafts[j]!;
        const resid = w.map((v, i) => Math.max(0, v - (sp.q === undefined ? (i === x ? 1 : 0) : sp.q[j * V + i]!)));
        if (resid.some((v) => v > 0)) w = resid;
      }
      out[2 * s] = j;
      out[2 * s + 1] = this.poisoned.has(this.ids[s]!) ? -1 : sampleFromProbs(w, { next: () => sp.uniforms[k]! });
    });
    return out;
  }
}

class ChainDrafter implements Drafter {
  readonly method = 'chain';
  readonly maxDraftTokens = 3;
  readonly pagesInUse = 0;
  constructor(private readonly withQ: boolean) {}
  captureSetter(): readonly number[] {
    return [];
  }
  projectTargetHiddenPartial(_t: ReadonlyMap<number, Float32Array>, n: number): Float32Array {
    return new Float32Array(n * 2);
  }
  writeProjectedContextKV(): void {}
  propose(batch: DraftBatch): DraftProposal[] {
    return batch.sequences.map((s) => {
      const tokens = new Int32Array(s.maxDrafts);
      const probs = new Float32Array(s.maxDrafts * V);
      let t = s.lastToken;
      for (let j = 0; j < tokens.length; j++) {
        const lq = logRow(Q, t);
        if (this.withQ && s.sampling.temperature > 0) {
          const q = samplingProbs(lq, V, s.sampling);
          probs.set(q, j * V);
          t = sampleFromProbs(q, s.rng);
        } else {
          t = lq.indexOf(Math.max(...lq));
        }
        tokens[j] = t;
      }
      return this.withQ && s.sampling.temperature > 0 ? { id: s.id, tokens, probs } : { id: s.id, tokens };
    });
  }
  addSequence(): void {}
  contextLength(): number {
    return 0;
  }
  freeSequence(): void {}
  dispose(): void {}
}

/** χ² critical values at p = 0.001 for 0 … 15 degrees of freedom (cells − 1). */
const CHI2_CRIT = [
  0, 10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588, 31.264, 32.909, 34.528, 36.123,
  37.697,
];
const N = 10_000;

describe.each([
  ['q from a different chain, 2 drafts', true, 1, 2, 1],
  ['q from a different chain, 1 draft (the 3rd token is often the bonus after an accepted draft)', true, 1, 1, 1],
  ['q at temperature 0.6', true, 0.6, 2, 1],
  // top-p 0.8 at T = 1 cuts tokens from P's and Q's rows, so p and q differ in support too
  ['q from a different chain, temperature 1 with top-p 0.8', true, 1, 2, 0.8],
  ['argmax drafts (point mass)', false, 1, 2, 1],
] as const)('engine rejection sampling is lossless: %s', (_name, withQ, temperature, drafts, topP) => {
  it('(2nd, 3rd) generated tokens ~ the target chain (χ², 10⁴ requests)', () => {
    const target = new ChainTarget();
    const e = new SpecEngine(target, new ChainDrafter(withQ), {
      maxSequences: 256,
      maxTokensPerSequence: 16,
      pageSize: 4,
      draftLength: () => drafts,
    });
    const x = 2;
    const rs = e.run(
      Array.from({ length: N }, (_, i) => ({
        id: i,
        promptIds: Int32Array.of(x),
        maxTokens: 3,
        sampling: { temperature, topP },
        seed: Math.imul(i + 1, 2654435761) >>> 0,
      })),
    );
    const counts = new Array<number>(V * V).fill(0);
    for (const r of rs) counts[r.tokenIds[1]! * V + r.tokenIds[2]!]!++;
    const p = (t: number) => samplingProbs(logRow(P, t), V, { temperature, topP });
    // top-p 0.8 cuts tokens from rows 0, 1 and 3 of P (row 2 is uniform: all four kept)
    if (topP < 1) for (const t of [0, 1, 3]) expect(p(t).filter((v) => v === 0).length, `row ${t}`).toBeGreaterThan(0);
    const expected = new Array<number>(V * V).fill(0);
    const p0 = p(x);
    for (let a = 0; a < V; a++)
      for (let b = 0; b < V; b++) for (let c = 0; c < V; c++) expected[b * V + c]! += p0[a]! * p(a)[b]! * p(b)[c]!;
    let chi = 0;
    let cells = 0;
    for (let i = 0; i < V * V; i++) {
      if (expected[i]! === 0) {
        expect(counts[i], `cell ${i} has probability 0`).toBe(0);
        continue;
      }
      cells++;
      chi += (counts[i]! - expected[i]! * N) ** 2 / (expected[i]! * N);
    }
    expect(chi).toBeLessThan(CHI2_CRIT[cells - 1]!);
    expect(e.metrics.accepted).toBeGreaterThan(0);
    expect(e.metrics.accepted).toBeLessThan(e.metrics.drafted);
    expect(e.cache.pagesInUse + e.cache.slotsInUse).toBe(0);
  });
});

describe.each([
  ['q from a different chain, 2 drafts', true, 1, 2, 1],
  ['q, temperature 1 with top-p 0.8', true, 1, 2, 0.8],
  ['argmax drafts (point mass)', false, 1, 2, 1],
] as const)(
  'rejection sampling on the stage (DeviceSampling) is lossless: %s',
  (_name, withQ, temperature, k, topP) => {
    it('(2nd, 3rd) generated tokens ~ the target chain (χ², 10⁴ requests); no logits come back', () => {
      const target = new DeviceChainTarget();
      const e = new SpecEngine(target, new ChainDrafter(withQ), {
        maxSequences: 256,
        maxTokensPerSequence: 16,
        pageSize: 4,
        draftLength: () => k,
      });
      const rs = e.run(
        Array.from({ length: N }, (_, i) => ({
          id: i,
          promptIds: Int32Array.of(2),
          maxTokens: 3,
          sampling: { temperature, topP },
          seed: Math.imul(i + 7, 2654435761) >>> 0,
        })),
      );
      const counts = new Array<number>(V * V).fill(0);
      for (const r of rs) counts[r.tokenIds[1]! * V + r.tokenIds[2]!]!++;
      const p = (t: number) => samplingProbs(logRow(P, t), V, { temperature, topP });
      const p0 = p(2);
      let chi = 0;
      let cells = 0;
      for (let b = 0; b < V; b++)
        for (let c = 0; c < V; c++) {
          let want = 0;
          for (let a = 0; a < V; a++) want += p0[a]! * p(a)[b]! * p(b)[c]!;
          if (want === 0) {
            expect(counts[b * V + c], `cell ${b * V + c} has probability 0`).toBe(0);
            continue;
          }
          cells++;
          chi += (counts[b * V + c]! - want * N) ** 2 / (want * N);
        }
      expect(chi).toBeLessThan(CHI2_CRIT[cells - 1]!);
      // every prefill's first token and every verify step decided on the stage; no forward returned logits
      expect(target.logitForwards).toBe(0);
      expect(target.specs.filter((sp) => sp.drafts.length === 0).length).toBeGreaterThanOrEqual(N);
      expect(target.specs.some((sp) => sp.drafts.length === k && (sp.q !== undefined) === withQ)).toBe(true);
      expect(e.metrics.accepted).toBeGreaterThan(0);
      expect(e.metrics.accepted).toBeLessThan(e.metrics.drafted);
      expect(e.cache.pagesInUse + e.cache.slotsInUse).toBe(0);
    });
  },
);

/**
 * The (2nd, 3rd) generated tokens of `rs` (N requests of prompt [2]) against the target chain P at `temperature`
 * (top-p 1): every cell of the joint has probability > 0; χ² over the V² cells below the p = 0.001 critical value.
 */
function expectTargetJoint(rs: readonly SpecResult[], temperature: number): void {
  const counts = new Array<number>(V * V).fill(0);
  for (const r of rs) counts[r.tokenIds[1]! * V + r.tokenIds[2]!]!++;
  const p = (t: number) => samplingProbs(logRow(P, t), V, { temperature });
  const p0 = p(2);
  let chi = 0;
  for (let b = 0; b < V; b++)
    for (let c = 0; c < V; c++) {
      let want = 0;
      for (let a = 0; a < V; a++) want += p0[a]! * p(a)[b]! * p(b)[c]!;
      chi += (counts[b * V + c]! - want * N) ** 2 / (want * N);
    }
  expect(chi).toBeLessThan(CHI2_CRIT[V * V - 1]!);
}

/** "Device memory" of {@link DeviceQDrafter}: q arrays by address. */
const deviceQ = new Map<bigint, Float32Array>();
let nextAddress = 64n;

/**
 * ChainDrafter whose q "stays on the device" (a GPU drafter's `deviceProbs`): the proposal points at q in `deviceQ`
 * and its `probs` is a getter that counts the reads (a copy back to the host on the GPU).
 */
class DeviceQDrafter extends ChainDrafter {
  probsReads = 0;
  constructor() {
    super(true);
  }
  override propose(batch: DraftBatch): DraftProposal[] {
    return super.propose(batch).map((p) => {
      const q = p.probs;
      if (q === undefined) return p;
      const address = nextAddress;
      nextAddress += 64n;
      deviceQ.set(address, q);
      const out = { id: p.id, tokens: p.tokens, deviceProbs: { device: 'sim', address } };
      Object.defineProperty(out, 'probs', {
        enumerable: true,
        get: () => {
          this.probsReads++;
          return q;
        },
      });
      return out as DraftProposal;
    });
  }
}

/** DeviceChainTarget that reads q where a {@link DeviceQDrafter} left it, when `accepts`. */
class DeviceQTarget extends DeviceChainTarget {
  specsWithDeviceQ = 0;
  constructor(private readonly accepts: boolean) {
    super();
  }
  acceptsDeviceProbs(probs: { readonly device: string }): boolean {
    return this.accepts && probs.device === 'sim';
  }
  override sampleOnDevice(result: ForwardResult, specs: readonly (DeviceSampleSpec | undefined)[]): Int32Array {
    const resolved = specs.map((sp) => {
      if (sp?.qDevice === undefined) return sp;
      expect(sp.q, 'q on the device comes without a host copy').toBeUndefined();
      this.specsWithDeviceQ++;
      return { ...sp, q: deviceQ.get(sp.qDevice.address) };
    });
    return super.sampleOnDevice(result, resolved);
  }
}

/**
 * A DeviceQDrafter as a GPU drafter keeps q: ONE device buffer, rewritten by every propose (so a proposal's q is valid
 * until the next propose), and a batch of more than one sequence refused, so the engine retries one sequence at a
 * time — where each retry overwrites the previous proposal's q.
 */
class OneBufferDrafter extends DeviceQDrafter {
  static readonly ADDRESS = 1n << 40n;
  override propose(batch: DraftBatch): DraftProposal[] {
    if (batch.sequences.length > 1) throw new Error('one sequence at a time');
    return super.propose(batch).map((p) => {
      if (p.deviceProbs === undefined) return p;
      const q = deviceQ.get(p.deviceProbs.address)!;
      deviceQ.set(OneBufferDrafter.ADDRESS, q);
      const out = { id: p.id, tokens: p.tokens, deviceProbs: { device: 'sim', address: OneBufferDrafter.ADDRESS } };
      Object.defineProperty(out, 'probs', {
        enumerable: true,
        get: () => {
          this.probsReads++;
          return q;
        },
      });
      return out as DraftProposal;
    });
  }
}

describe('q kept on the device by the drafter (DraftProposal.deviceProbs)', () => {
  it('a stage that reads it gets the address, never a host copy; sampling stays lossless (χ², 10⁴ requests)', () => {
    const target = new DeviceQTarget(true);
    const drafter = new DeviceQDrafter();
    const e = new SpecEngine(target, drafter, {
      maxSequences: 256,
      maxTokensPerSequence: 16,
      pageSize: 4,
      draftLength: () => 2,
    });
    const rs = e.run(
      Array.from({ length: N }, (_, i) => ({
        id: i,
        promptIds: Int32Array.of(2),
        maxTokens: 3,
        sampling: { temperature: 1 },
        seed: Math.imul(i + 11, 2654435761) >>> 0,
      })),
    );
    expectTargetJoint(rs, 1);
    expect(target.specsWithDeviceQ).toBeGreaterThan(N / 2);
    expect(drafter.probsReads).toBe(0);
    expect(e.cache.pagesInUse + e.cache.slotsInUse).toBe(0);
  });

  it('proposals retried one by one carry their q to the host (the next retry overwrites the device buffer): χ²', () => {
    const target = new DeviceQTarget(true);
    const drafter = new OneBufferDrafter();
    const e = new SpecEngine(target, drafter, {
      maxSequences: 4,
      maxTokensPerSequence: 16,
      pageSize: 4,
      draftLength: () => 2,
    });
    const rs = e.run(
      Array.from({ length: N }, (_, i) => ({
        id: i,
        promptIds: Int32Array.of(2),
        maxTokens: 3,
        sampling: { temperature: 1 },
        seed: Math.imul(i + 13, 2654435761) >>> 0,
      })),
    );
    expectTargetJoint(rs, 1);
    // every batch of 4 was retried: its q came to the host, never as the (overwritten) device address
    expect(target.specsWithDeviceQ).toBe(0);
    expect(drafter.probsReads).toBeGreaterThan(N / 2);
    expect(target.specs.some((sp) => sp.drafts.length === 2 && sp.q !== undefined)).toBe(true);
  });

  it('a stage that does not read it gets the host copy (probs read), the same distribution path as before', () => {
    const target = new DeviceQTarget(false);
    const drafter = new DeviceQDrafter();
    const e = new SpecEngine(target, drafter, { maxSequences: 4, pageSize: 4, draftLength: () => 2 });
    const rs = e.run(
      [0, 1, 2].map((i) => ({
        id: i,
        promptIds: Int32Array.of(1),
        maxTokens: 6,
        sampling: { temperature: 0.9 },
        seed: i + 1,
      })),
    );
    expect(rs.every((r) => r.tokenIds.length === 6)).toBe(true);
    expect(target.specsWithDeviceQ).toBe(0);
    expect(drafter.probsReads).toBeGreaterThan(0);
    expect(target.specs.some((sp) => sp.drafts.length === 2 && sp.q !== undefined)).toBe(true);
  });
});

describe('DeviceSampling: what stays on the host, and a row the stage cannot draw from', () => {
  const req = (id: string, extra: Partial<SpecRequest> = {}): SpecRequest => ({
    id,
    promptIds: Int32Array.of(1),
    maxTokens: 6,
    sampling: { temperature: 0.9 },
    seed: 5,
    ...extra,
  });
  it('a batch with a logprobs request or a greedy one with logits processors is sampled on the host', () => {
    const target = new DeviceChainTarget();
    const e = new SpecEngine(target, new ChainDrafter(true), { maxSequences: 4, pageSize: 4, draftLength: () => 2 });
    const rs = e.run([req('a', { logprobs: 1 }), req('b')]);
    expect(rs.map((r) => [r.id, r.tokenIds.length])).toEqual([
      ['a', 6],
      ['b', 6],
    ]);
    // b's first token was drawn on the stage (its prefill); every verify step had a on board: host
    expect(target.specs.every((sp) => sp.drafts.length === 0)).toBe(true);
    expect(target.logitForwards).toBeGreaterThan(0);
    const alone = new DeviceChainTarget();
    new SpecEngine(alone, new ChainDrafter(true), { maxSequences: 4, pageSize: 4, draftLength: () => 2 }).run([
      req('b'),
    ]);
    expect(alone.logitForwards).toBe(0);
    expect(alone.specs.some((sp) => sp.drafts.length === 2)).toBe(true);
  });
  it('a token of −1 fails only its sequence, naming the row; the others finish; nothing leaks', () => {
    const target = new DeviceChainTarget();
    target.poisoned.add('bad');
    const e = new SpecEngine(target, new ChainDrafter(true), { maxSequences: 4, pageSize: 4, draftLength: () => 2 });
    const rs = e.run([req('ok'), req('bad')]);
    const bad = rs.find((r) => r.id === 'bad')!;
    expect([bad.finishReason, bad.error?.phase]).toEqual(['error', 'prefill']);
    expect(bad.error?.message).toMatch(/not finite/);
    expect(rs.find((r) => r.id === 'ok')!.tokenIds.length).toBe(6);
    expect(e.cache.pagesInUse + e.cache.slotsInUse).toBe(0);
  });
});

describe('seeded sampled requests under a timing-based draft policy', () => {
  // Calibrated costs forced two ways — drafting nearly free (the cost policy drafts) and drafting
  // dear (it never drafts) — stand for two machines or two load conditions: the k it picks, and so
  // how many PRNG draws each step takes, follows them.
  const costs = (draftMs: number) =>
    new StepCosts(
      [1, 4].map((b) => ({
        sequences: b,
        ks: [0, 1, 2, 3],
        verifyMs: [1, 1.01, 1.02, 1.03].map((x) => x * b),
        draftMs: [0, 1, 2, 3].map((k) => k * draftMs * b),
      })),
    );
  const policy = (draftMs: number) =>
    new CostDraftPolicy(costs(draftMs), { exploreEvery: 0, explorePlainEvery: 0, recalibrate: false });
  const request = (id: string, seeded: boolean, seed = 5): SpecRequest => ({
    id,
    promptIds: Int32Array.of(2),
    maxTokens: 48,
    sampling: { temperature: 1 },
    seed,
    ...(seeded ? { seeded: true } : {}),
  });
  const run = (
    draftPolicy: 'cost' | 'max' | CostDraftPolicy | undefined,
    reqs: SpecRequest[],
    drafter = true,
  ): Map<unknown, SpecResult> => {
    const e = new SpecEngine(new ChainTarget(), drafter ? new ChainDrafter(true) : undefined, {
      maxSequences: 4,
      maxTokensPerSequence: 64,
      pageSize: 4,
      ...(draftPolicy === undefined ? {} : { draftPolicy }),
    });
    const rs = new Map(e.run(reqs).map((r) => [r.id, r]));
    expect(e.cache.pagesInUse + e.cache.slotsInUse).toBe(0);
    return rs;
  };

  it(
    'verify with k = 0: the same tokens under any measured costs, ' +
      'alone or batched, equal to plain decoding with that seed',
    () => {
      // unseeded: the same seed gives different tokens when the measured costs differ
      const u1 = run(policy(0.001), [request('u', false)]).get('u')!;
      const u2 = run(policy(1000), [request('u', false)]).get('u')!;
      expect(u1.metrics.drafted).toBeGreaterThan(0);
      expect(u2.metrics.drafted).toBe(0);
      expect(u1.tokenIds).toHaveLength(48);
      expect(u1.tokenIds).not.toEqual(u2.tokenIds);
      // seeded: never drafts, so the tokens do not depend on the costs …
      const s1 = run(policy(0.001), [request('s', true)]).get('s')!;
      const s2 = run(policy(1000), [request('s', true)]).get('s')!;
      expect([s1.metrics.drafted, s1.metrics.verifySteps]).toEqual([0, 47]);
      expect(s2.metrics.drafted).toBe(0);
      expect(s1.tokenIds).toHaveLength(48);
      expect(s2.tokenIds).toEqual(s1.tokenIds);
      // … they are plain decoding's with that seed (no drafter at all) …
      expect(run(undefined, [request('s', true)], false).get('s')!.tokenIds).toEqual(s1.tokenIds);
      // … and batching it with unseeded requests (which still draft) changes nothing
      const mixed = run(policy(0.001), [request('x', false, 1), request('s', true), request('y', false, 2)]);
      expect(mixed.get('s')!.tokenIds).toEqual(s1.tokenIds);
      expect(mixed.get('s')!.metrics.drafted).toBe(0);
      expect(mixed.get('x')!.metrics.drafted + mixed.get('y')!.metrics.drafted).toBeGreaterThan(0);
      // the default 'cost' policy (costs calibrated on this machine) likewise
      const c = run('cost', [request('s', true), request('x', false, 1)]);
      expect(c.get('s')!.tokenIds).toEqual(s1.tokenIds);
      expect(c.get('s')!.metrics.drafted).toBe(0);
    },
  );

  it("has no effect where k is not timing-based ('max') or at temperature 0", () => {
    const m = run('max', [request('s', true)]).get('s')!;
    expect(m.metrics.drafted).toBeGreaterThan(0);
    expect(run('max', [request('s', true)]).get('s')!.tokenIds).toEqual(m.tokenIds); // fixed k: reproducible anyway
    const g = run(policy(0.001), [{ ...request('g', true), sampling: { temperature: 0 } }]).get('g')!;
    expect(g.metrics.drafted).toBeGreaterThan(0);
  });
});

/** Penalties and a bias that change the toy chain's rows (each setting on its own changes the χ² cells). */
const PENALTIES: SamplingParams = {
  temperature: 1,
  repetitionPenalty: 1.6,
  frequencyPenalty: 0.5,
  presencePenalty: 0.4,
  logitBias: new Map([[0, 0.7]]),
};

describe.each([
  ['q from a different chain, 2 drafts', true, 2],
  ['q from a different chain, 3 drafts', true, 3],
  ['argmax drafts (point mass), 2 drafts', false, 2],
] as const)('engine rejection sampling with penalties and logit_bias is lossless: %s', (_name, withQ, drafts) => {
  it('(2nd, 3rd) generated tokens ~ the processed target chain (χ², 10⁴ requests)', () => {
    const e = new SpecEngine(new ChainTarget(), new ChainDrafter(withQ), {
      maxSequences: 256,
      maxTokensPerSequence: 16,
      pageSize: 4,
      draftLength: () => drafts,
    });
    const x = 2;
    const req = (i: number): SpecRequest => ({
      id: i,
      promptIds: Int32Array.of(x),
      maxTokens: 3,
      sampling: PENALTIES,
      seed: Math.imul(i + 1, 2654435761) >>> 0,
    });
    const rs = e.run(Array.from({ length: N }, (_, i) => req(i)));
    const counts = new Array<number>(V * V).fill(0);
    for (const r of rs) counts[r.tokenIds[1]! * V + r.tokenIds[2]!]!++;
    // p(next | generated): the chain's row after the last token, processed after the generated tokens
    const p = (generated: readonly number[]): Float32Array => {
      const proc = LogitsProcessor.of(req(0))!;
      for (const t of generated) proc.push(t);
      const row = logRow(P, generated.at(-1) ?? x);
      proc.apply(row);
      return samplingProbs(row, V, PENALTIES);
    };
    // the penalties change the distribution of the 3rd token given the first two (else this test proves nothing)
    expect(Math.abs(p([1, 3])[3]! - samplingProbs(logRow(P, 3), V, { temperature: 1 })[3]!)).toBeGreaterThan(0.05);
    const expected = new Array<number>(V * V).fill(0);
    const p0 = p([]);
    for (let a = 0; a < V; a++) {
      const p1 = p([a]);
      for (let b = 0; b < V; b++) {
        const p2 = p([a, b]);
        for (let c = 0; c < V; c++) expected[b * V + c]! += p0[a]! * p1[b]! * p2[c]!;
      }
    }
    let chi = 0;
    for (let i = 0; i < V * V; i++) chi += (counts[i]! - expected[i]! * N) ** 2 / (expected[i]! * N);
    expect(chi).toBeLessThan(CHI2_CRIT[V * V - 1]!);
    // the unprocessed chain's joint is far from these counts (the penalties are applied, not ignored)
    const plain = new Array<number>(V * V).fill(0);
    const q = (t: number) => samplingProbs(logRow(P, t), V, { temperature: 1 });
    for (let a = 0; a < V; a++)
      for (let b = 0; b < V; b++) for (let c = 0; c < V; c++) plain[b * V + c]! += q(x)[a]! * q(a)[b]! * q(b)[c]!;
    let chiPlain = 0;
    for (let i = 0; i < V * V; i++) chiPlain += (counts[i]! - plain[i]! * N) ** 2 / (plain[i]! * N);
    expect(chiPlain).toBeGreaterThan(CHI2_CRIT[V * V - 1]!);
    expect(e.metrics.accepted).toBeGreaterThan(0);
    expect(e.metrics.accepted).toBeLessThan(e.metrics.drafted);
    expect(e.cache.pagesInUse + e.cache.slotsInUse).toBe(0);
  });
});

describe('greedy speculation with the logits processors', () => {
  const run = (sampling: SamplingParams, drafter: boolean, extra: Partial<SpecRequest> = {}): SpecResult[] => {
    const e = new SpecEngine(new ChainTarget(), drafter ? new ChainDrafter(false) : undefined, {
      maxSequences: 4,
      maxTokensPerSequence: 64,
      pageSize: 4,
      draftLength: () => 3,
    });
    const rs = e.run(
      [0, 1, 2, 3].map((x) => ({ id: x, promptIds: Int32Array.of(x, 2), maxTokens: 24, sampling, seed: 1, ...extra })),
    );
    expect(e.cache.pagesInUse + e.cache.slotsInUse).toBe(0);
    return rs.sort((a, b) => Number(a.id) - Number(b.id));
  };

  it('outputs plain decoding: the penalties count the drafts before each verify row', () => {
    const sampling: SamplingParams = { ...PENALTIES, temperature: 0 };
    const spec = run(sampling, true);
    const plain = run(sampling, false);
    expect(spec.map((r) => r.tokenIds)).toEqual(plain.map((r) => r.tokenIds));
    expect(spec.reduce((a, r) => a + r.metrics.accepted, 0)).toBeGreaterThan(0);
    // and the penalties changed the output
    expect(run({ temperature: 0 }, false).map((r) => r.tokenIds)).not.toEqual(plain.map((r) => r.tokenIds));
  });

  it('min_tokens masks EOS and stop_token_ids; a stop token id finishes with reason stop', () => {
    // greedy from token 2: 0, 1, 0, 1, … (P's argmax); token 1 masked: 0, 2, 0, 2, then 0, 1
    for (const drafter of [false, true]) {
      const eos = run({ temperature: 0 }, drafter, { eosTokenIds: [1] })[0]!;
      expect([eos.tokenIds, eos.finishReason]).toEqual([[0, 1], 'eos']);
      const min = run({ temperature: 0, minTokens: 4 }, drafter, { eosTokenIds: [1] })[0]!;
      expect([min.tokenIds, min.finishReason]).toEqual([[0, 2, 0, 2, 0, 1], 'eos']);
      const stop = run({ temperature: 0, minTokens: 4 }, drafter, { stopTokenIds: [1] })[0]!;
      expect([stop.tokenIds, stop.finishReason]).toEqual([[0, 2, 0, 2, 0, 1], 'stop']);
      // stop strings count from the end of the first min_tokens tokens' text (vLLM checks no stop before them)
      const decode = (ids: readonly number[]): string => ids.map((t) => 'abcd'[t]).join('');
      const stopAt = (minTokens: number): SpecResult => {
        const e = new SpecEngine(new ChainTarget(), drafter ? new ChainDrafter(false) : undefined, {
          maxSequences: 1,
          maxTokensPerSequence: 64,
          pageSize: 4,
          draftLength: () => 3,
          decode,
        });
        const sampling = { temperature: 0, minTokens };
        return e.run([
          { id: 0, promptIds: Int32Array.of(2), maxTokens: 24, sampling, seed: 1, stopStrings: ['ab'] },
        ])[0]!;
      };
      expect([decode(stopAt(0).tokenIds), stopAt(0).finishReason]).toEqual(['ab', 'stop']);
      expect([decode(stopAt(3).tokenIds), stopAt(3).finishReason]).toEqual(['ababab', 'stop']);
      // ignore_eos does not apply to stop_token_ids
      const ignored = run({ temperature: 0 }, drafter, { stopTokenIds: [1], eosTokenIds: [0], ignoreEos: true })[0]!;
      expect([ignored.tokenIds, ignored.finishReason]).toEqual([[0, 1], 'stop']);
    }
  });
});
