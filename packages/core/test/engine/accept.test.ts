// Verification functions: greedy longest-prefix + bonus, and rejection sampling, whose committed
// tokens must be distributed as the target's p whatever the draft's q (Leviathan et al. 2023,
// Theorem 1) — checked with χ² tests over 2·10⁴ seeded draws, including q = point mass (argmax
// drafts), q with support where p has none, and p, q after the same temperature / top-k / top-p.
import { describe, expect, it } from 'vitest';

import { SeededRandom } from '../../src/engine/random.js';
import {
  acceptGreedy,
  acceptSampled,
  acceptSampledRows,
  sampleFromProbs,
  sampleFromSupport,
  samplingProbs,
} from '../../src/engine/index.js';

const V = 6;
const N = 20_000;
/** χ² critical value at p = 0.001 for V − 1 = 5 degrees of freedom. */
const CHI2_CRIT_5 = 20.515;

function chi2(counts: number[], probs: ArrayLike<number>, n: number): number {
  let s = 0;
  for (let i = 0; i < counts.length; i++) {
    const e = probs[i]! * n;
    if (e === 0) {
      expect(counts[i], `token ${i} has probability 0 but was drawn`).toBe(0);
      continue;
    }
    s += (counts[i]! - e) ** 2 / e;
  }
  return s;
}

function norm(xs: number[]): Float32Array {
  const t = xs.reduce((a, b) => a + b, 0);
  return Float32Array.from(xs, (x) => x / t);
}

describe('acceptGreedy', () => {
  const logitsFor = (tops: number[]) => {
    const l = new Float32Array(tops.length * V);
    tops.forEach((t, r) => {
      l[r * V + t] = 1;
    });
    return l;
  };
  it('accepts the longest prefix equal to the target argmax, then the bonus', () => {
    expect(acceptGreedy(Int32Array.of(1, 2, 3), logitsFor([1, 2, 3, 4]), V)).toEqual({ accepted: 3, bonus: 4 });
    expect(acceptGreedy(Int32Array.of(1, 5, 3), logitsFor([1, 2, 3, 4]), V)).toEqual({ accepted: 1, bonus: 2 });
    expect(acceptGreedy(Int32Array.of(0), logitsFor([1, 2]), V)).toEqual({ accepted: 0, bonus: 1 });
    expect(acceptGreedy(new Int32Array(0), logitsFor([5]), V)).toEqual({ accepted: 0, bonus: 5 });
  });
  it('rejects mis-sized logits', () => {
    expect(() => acceptGreedy(Int32Array.of(1), new Float32Array(V), V)).toThrow(/expected \[2, 6\]/);
  });
});

describe('acceptSampled preserves the target distribution (χ², 2·10⁴ draws)', () => {
  const p0 = norm([0.3, 0.25, 0.2, 0.1, 0.1, 0.05]);
  const p1 = norm([0.05, 0.05, 0.1, 0.2, 0.3, 0.3]);
  const cases: [string, Float32Array | 'point-mass'][] = [
    ['q close to p', norm([0.25, 0.25, 0.2, 0.15, 0.1, 0.05])],
    ['q far from p', norm([0.01, 0.04, 0.05, 0.3, 0.3, 0.3])],
    ['q = point mass (argmax drafts, no q)', 'point-mass'],
    ['q uniform', norm([1, 1, 1, 1, 1, 1])],
  ];
  it.each(cases)('first committed token ~ p: %s', (_name, q) => {
    const rng = new SeededRandom(12345);
    const counts = new Array<number>(V).fill(0);
    const p = new Float32Array(2 * V);
    p.set(p0, 0);
    p.set(p1, V);
    let accepted = 0;
    for (let i = 0; i < N; i++) {
      const x = q === 'point-mass' ? 1 : sampleFromProbs(q, rng);
      const r = acceptSampled(Int32Array.of(x), q === 'point-mass' ? undefined : q, p, V, rng);
      const first = r.accepted === 1 ? x : r.bonus;
      accepted += r.accepted;
      counts[first]!++;
    }
    expect(chi2(counts, p0, N)).toBeLessThan(CHI2_CRIT_5);
    expect(accepted).toBeGreaterThan(0);
  });

  it('the bonus after all drafts accepted ~ p of the next row; two-draft chains keep both marginals', () => {
    const rng = new SeededRandom(99);
    const q = new Float32Array(2 * V);
    q.set(norm([0.2, 0.2, 0.2, 0.2, 0.1, 0.1]), 0);
    q.set(norm([0.1, 0.1, 0.2, 0.2, 0.2, 0.2]), V);
    const p = new Float32Array(3 * V);
    p.set(p0, 0);
    p.set(p1, V);
    p.set(norm([1, 2, 3, 3, 2, 1]), 2 * V);
    const c0 = new Array<number>(V).fill(0);
    const c1 = new Array<number>(V).fill(0);
    let n1 = 0;
    for (let i = 0; i < N; i++) {
      const d = Int32Array.of(sampleFromProbs(q.subarray(0, V), rng), sampleFromProbs(q.subarray(V), rng));
      const r = acceptSampled(d, q, p, V, rng);
      const toks = [...d.subarray(0, r.accepted), r.bonus];
      c0[toks[0]!]!++;
      // the second token exists when the first draft was accepted; it is then distributed as p1
      if (toks.length >= 2) {
        c1[toks[1]!]!++;
        n1++;
      }
    }
    expect(chi2(c0, p0, N)).toBeLessThan(CHI2_CRIT_5);
    expect(chi2(c1, p1, n1)).toBeLessThan(CHI2_CRIT_5);
  });

  it(
    'temperature / top-k / top-p applied to both p and q: ' +
      'committed tokens ~ processed p; masked tokens never appear',
    () => {
      const params = { temperature: 0.7, topK: 4, topP: 0.9 };
      const tl = Float32Array.from([2.0, 1.5, 1.0, 0.5, 0.2, -1.0, 1.2, 0.3, 0.0, 0.1, 0.4, 0.2]);
      const ql = Float32Array.from([0.5, 2.0, 1.5, 0.1, 1.0, 0.0]);
      const p = samplingProbs(tl, V, params);
      const q = samplingProbs(ql, V, params);
      expect(p[5]).toBe(0);
      const rng = new SeededRandom(7);
      const counts = new Array<number>(V).fill(0);
      for (let i = 0; i < N; i++) {
        const x = sampleFromProbs(q, rng);
        const r = acceptSampled(Int32Array.of(x), q, p, V, rng);
        counts[r.accepted === 1 ? x : r.bonus]!++;
      }
      expect(chi2(counts, p.subarray(0, V), N)).toBeLessThan(CHI2_CRIT_5);
    },
  );

  it('rejects mis-sized p or q', () => {
    const rng = new SeededRandom(1);
    expect(() => acceptSampled(Int32Array.of(1), undefined, new Float32Array(V), V, rng)).toThrow(
      /p: expected \[2, 6\]/,
    );
    expect(() => acceptSampled(Int32Array.of(1), new Float32Array(2 * V), new Float32Array(2 * V), V, rng)).toThrow(
      /q: expected \[1, 6\]/,
    );
  });
});

describe('acceptSampled with a reduced q (probsIds: q over a list of token ids, 0 off it)', () => {
  // a 12-token vocabulary, q over 5 of its ids (out of order), p with mass on and off the list
  const VV = 12;
  const ids = Int32Array.of(7, 2, 9, 0, 4);
  const rows = (seed: number, n: number, width: number) => {
    const r = new SeededRandom(seed);
    const out = new Float32Array(n * width);
    for (let j = 0; j < n; j++) {
      let t = 0;
      for (let v = 0; v < width; v++) t += out[j * width + v] = r.next() < 0.2 ? 0 : r.next();
      for (let v = 0; v < width; v++) out[j * width + v]! /= t;
    }
    return out;
  };
  const expand = (q: Float32Array, k: number) => {
    const full = new Float32Array(k * VV);
    for (let j = 0; j < k; j++) for (let e = 0; e < ids.length; e++) full[j * VV + ids[e]!] = q[j * ids.length + e]!;
    return full;
  };

  it('decides exactly as the same q written out over the vocabulary: same accepted count, token and draws', () => {
    let rejections = 0;
    for (let seed = 0; seed < 400; seed++) {
      const k = 1 + (seed % 4);
      const q = rows(seed, k, ids.length);
      const p = rows(seed + 10_000, k + 1, VV);
      const drafts = Int32Array.from({ length: k }, (_, j) => ids[(seed + j) % ids.length]!);
      const a = new SeededRandom(seed);
      const b = new SeededRandom(seed);
      const reduced = acceptSampled(drafts, q, p, VV, a, ids);
      const full = acceptSampled(drafts, expand(q, k), p, VV, b);
      expect(reduced).toEqual(full);
      expect(a.next()).toBe(b.next()); // the same number of draws taken
      if (reduced.accepted < k) rejections++;
    }
    expect(rejections).toBeGreaterThan(50); // the residual path ran, not only acceptances
  });

  it('a draft off the list (q = 0 there) is accepted with probability 1, as with q written out', () => {
    const q = rows(3, 1, ids.length);
    const p = rows(4, 2, VV);
    for (let seed = 0; seed < 50; seed++) {
      const r = acceptSampled(Int32Array.of(5), q, p, VV, new SeededRandom(seed), ids);
      expect(r).toEqual(acceptSampled(Int32Array.of(5), expand(q, 1), p, VV, new SeededRandom(seed)));
      expect(r.accepted).toBe(1);
    }
  });

  it('refuses a q of the wrong width and ids outside the vocabulary or listed twice', () => {
    const rng = new SeededRandom(1);
    const p = new Float32Array(2 * VV).fill(1 / VV);
    expect(() => acceptSampled(Int32Array.of(7), new Float32Array(VV), p, VV, rng, ids)).toThrow(
      /q: expected \[1, 5\]/,
    );
    expect(() => acceptSampled(Int32Array.of(7), new Float32Array(2), p, VV, rng, Int32Array.of(7, 12))).toThrow(
      /qIds\[1\]: 12 is outside \[0, 12\)/,
    );
    expect(() => acceptSampled(Int32Array.of(7), new Float32Array(2), p, VV, rng, Int32Array.of(7, 7))).toThrow(
      /token 7 is listed twice/,
    );
  });
});

describe("acceptSampledRows with each row's support (samplingProbs's kept tokens)", () => {
  // p and q from logits through temperature and top-p, as the engine makes them: many zeros, a few kept tokens
  const VV = 40;
  const ids = Int32Array.from({ length: 25 }, (_, e) => (e * 7) % VV); // a reduced q's list, out of order
  const logits = (seed: number, n: number, width: number) => {
    const r = new SeededRandom(seed);
    return Float32Array.from({ length: n * width }, () => 4 * r.next());
  };
  const withSupport = (lg: Float32Array, n: number, width: number, t: number, topP: number) => {
    const support = { ids: new Int32Array(n * width), counts: new Int32Array(n) };
    const probs = samplingProbs(lg, width, { temperature: t, topP }, undefined, support);
    return { probs, support };
  };

  it('decides exactly as over the whole rows: same accepted count, token and draws (q none, full, reduced)', () => {
    let rejections = 0;
    let onSupport = 0;
    for (let seed = 0; seed < 600; seed++) {
      const k = 1 + (seed % 4);
      const [t, topP] = [
        [0.3, 0.9],
        [1, 0.7],
        [1.5, 1],
      ][seed % 3]!;
      const mode = ['none', 'full', 'reduced'][Math.floor(seed / 3) % 3]!;
      const W = mode === 'reduced' ? ids.length : VV;
      const q = mode === 'none' ? undefined : withSupport(logits(seed + 5_000, k, W), k, W, t, topP).probs;
      const qIds = mode === 'reduced' ? ids : undefined;
      const { probs: p, support } = withSupport(logits(seed, k + 1, VV), k + 1, VV, t, topP);
      for (let j = 0; j <= k; j++) onSupport += support.counts[j]!;
      // drafts: mostly tokens p keeps, sometimes one it does not
      const drafts = Int32Array.from({ length: k }, (_, j) => {
        if (seed % 5 === 0) return (seed + 3 * j) % VV;
        return support.ids[j * VV + (seed % Math.max(1, support.counts[j]!))]!;
      });
      const a = new SeededRandom(seed);
      const b = new SeededRandom(seed);
      const dense = acceptSampled(drafts, q, p, VV, a, qIds);
      const sparse = acceptSampledRows(
        drafts,
        q,
        (j) => ({
          probs: p.subarray(j * VV, (j + 1) * VV),
          support: support.ids.subarray(j * VV, j * VV + support.counts[j]!),
        }),
        VV,
        b,
        qIds,
      );
      expect(sparse, `seed ${seed}`).toEqual(dense);
      expect(b.next()).toBe(a.next()); // the same number of draws taken
      if (dense.accepted < k) rejections++;
    }
    expect(rejections).toBeGreaterThan(100); // the residual path ran, not only acceptances
    expect(onSupport).toBeLessThan(600 * 3.5 * VV * 0.8); // top-p left zeros for the support to skip
  });

  it('sampleFromSupport draws what sampleFromProbs draws over the whole row, with the same draws', () => {
    for (let seed = 0; seed < 300; seed++) {
      const { probs, support } = withSupport(
        logits(seed, 1, VV),
        1,
        VV,
        [0.2, 1, 3][seed % 3]!,
        [0.5, 0.95, 1][seed % 3]!,
      );
      const a = new SeededRandom(seed);
      const b = new SeededRandom(seed);
      expect(sampleFromSupport(probs, support.ids.subarray(0, support.counts[0]), b)).toBe(sampleFromProbs(probs, a));
      expect(b.next()).toBe(a.next());
    }
    expect(() =>
      sampleFromSupport(new Float32Array(4).fill(Number.NaN), Int32Array.of(1), new SeededRandom(1)),
    ).toThrow(/expected a positive finite total, got NaN/);
  });
});

describe('samplingProbs', () => {
  it('rows sum to 1; temperature 0 is refused (greedy has no distribution)', () => {
    const p = samplingProbs(Float32Array.from([1, 2, 3, 4, 5, 6]), V, { temperature: 1, topK: 3 });
    expect(p.reduce((a, b) => a + b, 0)).toBeCloseTo(1, 6);
    expect(Array.from(p.subarray(0, 3))).toEqual([0, 0, 0]);
    expect(() => samplingProbs(new Float32Array(V), V, { temperature: 0 })).toThrow(/temperature/);
  });
});
