// softmax (temperature), argmax, top-k and top-p filters vs float64 references.
import { describe, expect, it } from 'vitest';
import { argmax, argmaxChecked, argmaxProb, samplingProbs, softmax, topKMask, topPMask } from '@specd/native';
import {
  firstBitDifference,
  freshSeed,
  isaPaths,
  poisoned,
  randomF32,
  relError,
  rng,
  TOL_F32,
  withIsa,
} from './reference.js';

function refSoftmax(x: ArrayLike<number>, cols: number, t: number): Float64Array {
  const y = new Float64Array(x.length);
  for (let r = 0; r < x.length / cols; r++) {
    let mx = -Infinity;
    for (let i = 0; i < cols; i++) mx = Math.max(mx, x[r * cols + i]!);
    let s = 0;
    for (let i = 0; i < cols; i++) s += y[r * cols + i] = Math.exp((x[r * cols + i]! - mx) / t);
    for (let i = 0; i < cols; i++) y[r * cols + i]! /= s;
  }
  return y;
}

describe('softmax', () => {
  it.each([
    [1, 5, 1],
    [3, 1000, 0.7],
    [17, 4097, 1.5],
  ])('matches float64 (rows=%i vocab=%i T=%f)', (rows, vocab, t) => {
    const seed = freshSeed();
    const x = randomF32(rows * vocab, rng(seed), 10);
    x[0] = -Infinity;
    const y = softmax(x, vocab, t, poisoned(x.length));
    expect(relError(y, refSoftmax(x, vocab, t)), `seed ${seed}`).toBeLessThan(4 * TOL_F32);
    expect(y[0]).toBe(0);
  });

  it('throws a named error for a row without a finite value', () => {
    expect(() => softmax(new Float32Array([1, 2, -Infinity, -Infinity]), 2)).toThrow(
      'softmax: x: row 1 has no finite value',
    );
    expect(() => softmax(new Float32Array(4), 2, 0)).toThrow(
      'softmax: temperature: expected a number > 0, got number 0',
    );
  });
});

describe('argmax', () => {
  it('returns the first index of the row maximum, ignoring NaN', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const [rows, vocab] = [9, 3001];
    const x = randomF32(rows * vocab, next);
    const ref = Array.from({ length: rows }, (_, r) => {
      let best = 0;
      for (let i = 1; i < vocab; i++) if (x[r * vocab + i]! > x[r * vocab + best]!) best = i;
      return best;
    });
    expect(Array.from(argmax(x, vocab)), `seed ${seed}`).toEqual(ref);
    expect(Array.from(argmax(new Float32Array([Number.NaN, 1, 3, 3, Number.NaN, Number.NaN]), 3))).toEqual([2, 0]);
  });

  it('argmaxChecked: the same index, −1 for a row with NaN or +Infinity or no finite value, at every position', () => {
    const seed = freshSeed();
    const next = rng(seed);
    // 7 and 21 columns: the 4-lane pass and its scalar tail; every position of a bad value in both
    for (const vocab of [7, 21]) {
      const x = randomF32(vocab, next);
      expect(Array.from(argmaxChecked(x, vocab)), `seed ${seed}`).toEqual(Array.from(argmax(x, vocab)));
      for (let i = 0; i < vocab; i++) {
        for (const bad of [Number.NaN, Number.POSITIVE_INFINITY]) {
          const y = Float32Array.from(x);
          y[i] = bad;
          expect(argmaxChecked(y, vocab)[0], `${bad} at ${i} of ${vocab}`).toBe(-1);
        }
        // −Infinity (a masked token) is allowed: the argmax of the rest
        const m = Float32Array.from(x);
        m[i] = Number.NEGATIVE_INFINITY;
        expect(argmaxChecked(m, vocab)[0]).toBe(argmax(m, vocab)[0]);
      }
      expect(argmaxChecked(new Float32Array(vocab).fill(Number.NEGATIVE_INFINITY), vocab)[0]).toBe(-1);
    }
    // rows are independent: a bad row does not touch its neighbours
    const rows = new Float32Array([1, 5, 2, Number.NaN, 0, 1, 4, 4, 3]);
    expect(Array.from(argmaxChecked(rows, 3))).toEqual([1, -1, 0]);
  });
});

describe('argmaxProb', () => {
  it("argmax's index and softmax's value there, bit for bit, on every ISA path; NaN for a row with no maximum", () => {
    const seed = freshSeed();
    const next = rng(seed);
    const [rows, vocab] = [6, 4099];
    const x = randomF32(rows * vocab, next, 8);
    x[vocab + 5] = Number.NEGATIVE_INFINITY; // a masked token
    for (const isa of isaPaths()) {
      withIsa(isa, () => {
        const out = new Float32Array(rows);
        const { ids, prob } = argmaxProb(x, vocab, out);
        expect(prob).toBe(out);
        expect(Array.from(ids), `${isa} seed ${seed}`).toEqual(Array.from(argmax(x, vocab)));
        const sm = softmax(x, vocab);
        for (let r = 0; r < rows; r++) {
          const at = sm[r * vocab + ids[r]!]!;
          expect(firstBitDifference(prob.subarray(r, r + 1), Float32Array.of(at)), `${isa} row ${r}`).toBe(-1);
          // and the float64 reference's largest probability
          const ref = refSoftmax(x.subarray(r * vocab, (r + 1) * vocab), vocab, 1);
          expect(Math.abs(prob[r]! - Math.max(...ref)) / Math.max(...ref)).toBeLessThan(4 * TOL_F32);
        }
      });
    }
    const bad = argmaxProb(new Float32Array([1, 3, Number.NEGATIVE_INFINITY, Number.NEGATIVE_INFINITY]), 2);
    expect(bad.prob[0]).toBeCloseTo(1 / (1 + Math.exp(-2)), 6);
    expect(Number.isNaN(bad.prob[1])).toBe(true);
    expect(() => argmaxProb(new Float32Array(4), 2, new Float32Array(3))).toThrow(/argmaxProb/);
  });
});

describe('topKMask', () => {
  it('keeps the k largest of each row (ties at the boundary kept) and masks the rest with -Infinity', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const [rows, vocab, k] = [4, 1003, 17];
    const x = randomF32(rows * vocab, next);
    const y = topKMask(x, vocab, k, poisoned(x.length));
    for (let r = 0; r < rows; r++) {
      const row = Array.from(x.subarray(r * vocab, (r + 1) * vocab));
      const kth = [...row].sort((a, b) => b - a)[k - 1]!;
      for (let i = 0; i < vocab; i++)
        expect(y[r * vocab + i], `seed ${seed}`).toBe(row[i]! >= kth ? row[i] : -Infinity);
    }
    expect(Array.from(topKMask(new Float32Array([1, 3, 3, 2]), 4, 2))).toEqual([-Infinity, 3, 3, -Infinity]);
    expect(Array.from(topKMask(new Float32Array([1, 2, 2, 0]), 4, 2))).toEqual([-Infinity, 2, 2, -Infinity]);
  });

  it('the same threshold whatever the spread, ties, NaN (as −Infinity) and −Infinity entries, any k', () => {
    // the kernel selects among the values near the maximum when they hold the k largest: peaked and flat rows,
    // a near-constant row and huge magnitudes walk its widening window to its end and to the whole-row fallback
    const seed = freshSeed();
    const next = rng(seed);
    const vocab = 2003;
    const rows = [0.5, 3, 60, 1e3, 1e35].map((scale) => randomF32(vocab, next, scale));
    rows.push(Float32Array.from(randomF32(vocab, next, 4), (v) => Math.round(v))); // ties
    rows.push(Float32Array.from(randomF32(vocab, next, 1e-6), (v) => 7 + v)); // near-constant
    const holes = randomF32(vocab, next, 8);
    for (let i = 0; i < vocab; i += 5) holes[i] = i % 10 === 0 ? Number.NaN : -Infinity;
    rows.push(holes);
    const x = new Float32Array(rows.length * vocab);
    for (const [i, r] of rows.entries()) x.set(r, i * vocab);
    for (const k of [1, 17, 100, 700, vocab - 1]) {
      const y = topKMask(x, vocab, k);
      rows.forEach((row, r) => {
        const kth = Array.from(row, (v) => (Number.isNaN(v) ? -Infinity : v)).sort((a, b) => b - a)[k - 1]!;
        const want = Array.from(row, (v) => (v >= kth ? v : -Infinity));
        expect(Array.from(y.subarray(r * vocab, (r + 1) * vocab)), `seed ${seed}, row ${r}, k ${k}`).toEqual(want);
      });
    }
  });
});

/**
 * Top-p by sorting the whole row: the ids by (prob desc, index asc), and the smallest prefix whose cumulative (a
 * double sum in that order) reaches p, at least one id.
 */
function fullSortKeep(prob: ArrayLike<number>, p: number): { order: number[]; keep: Set<number> } {
  const at = (i: number): number => prob[i] ?? Number.NaN;
  const order = Array.from({ length: prob.length }, (_, i) => i).sort((a, b) => at(b) - at(a) || a - b);
  const keep = new Set<number>();
  let cum = 0;
  for (const i of order) {
    keep.add(i);
    cum += at(i);
    if (cum >= p) break;
  }
  return { order, keep };
}

describe('topPMask', () => {
  it('keeps the smallest most-probable set reaching p, at least one token', () => {
    const logits = Float32Array.from([0.1, 0.5, 0.2, 0.2].map(Math.log));
    const pick = (p: number) => Array.from(topPMask(logits, 4, p)).map((v) => (v === -Infinity ? 0 : 1));
    expect(pick(0.5)).toEqual([0, 1, 0, 0]);
    expect(pick(0.6)).toEqual([0, 1, 1, 0]); // tie 0.2/0.2: lower index first
    expect(pick(0.8)).toEqual([0, 1, 1, 1]);
    expect(pick(0.95)).toEqual([1, 1, 1, 1]);
    expect(pick(1e-9)).toEqual([0, 1, 0, 0]);
    expect(pick(1)).toEqual([1, 1, 1, 1]);
  });

  it('matches a float64 reference on random rows and works in place', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const [rows, vocab, p] = [3, 2000, 0.9];
    const x = randomF32(rows * vocab, next, 6);
    const y = topPMask(x, vocab, p, poisoned(x.length));
    for (let r = 0; r < rows; r++) {
      const prob = refSoftmax(x.subarray(r * vocab, (r + 1) * vocab), vocab, 1);
      const { order, keep } = fullSortKeep(prob, p);
      let kept = 0;
      for (let i = 0; i < vocab; i++) if (y[r * vocab + i] !== -Infinity) kept++;
      // float32 vs float64 probabilities may move the boundary by at most one token.
      expect(Math.abs(kept - keep.size), `seed ${seed}`).toBeLessThanOrEqual(1);
      for (const i of order.slice(0, keep.size - 1)) expect(y[r * vocab + i], `seed ${seed}`).toBe(x[r * vocab + i]);
    }
    const inPlace = Float32Array.from(x);
    topPMask(inPlace, vocab, p, inPlace);
    expect(Array.from(inPlace)).toEqual(Array.from(y));
    expect(() => topPMask(x, vocab, 1.5)).toThrow('topPMask: p: expected a number in (0, 1], got number 1.5');
  });

  it("keeps exactly the full sort's set over the kernel's own f32 probabilities (peaked, flat and tied rows)", () => {
    // the kernel sorts only the tokens above a threshold whose mass reaches p: it must keep what sorting the
    // whole row keeps (f32 softmax as the kernel computes it, order (prob desc, index asc), cumulative in double)
    const seed = freshSeed();
    const next = rng(seed);
    const vocab = 4099;
    const rows: Float32Array[] = [];
    for (const scale of [0.5, 2, 6, 20, 60, 400]) rows.push(randomF32(vocab, next, scale));
    rows.push(Float32Array.from(randomF32(vocab, next, 3), (v) => Math.round(v))); // many ties
    rows.push(Float32Array.from({ length: vocab }, (_, i) => (i % 7 === 0 ? 5 : 0))); // tied block on top
    rows.push(Float32Array.from({ length: vocab }, (_, i) => -i * 0.25)); // geometric: long tail
    const x = new Float32Array(rows.length * vocab);
    for (const [i, r] of rows.entries()) x.set(r, i * vocab);
    const probs = softmax(x, vocab, 1);
    for (const p of [1e-9, 0.1, 0.5, 0.9, 0.95, 0.99, 0.999999]) {
      const y = topPMask(x, vocab, p);
      rows.forEach((_, r) => {
        const { keep } = fullSortKeep(probs.subarray(r * vocab, (r + 1) * vocab), p);
        const kept = new Set<number>();
        for (let i = 0; i < vocab; i++) if (y[r * vocab + i] !== -Infinity) kept.add(i);
        expect(
          [...kept].sort((a, b) => a - b),
          `seed ${seed}, row ${r}, p ${p}`,
        ).toEqual([...keep].sort((a, b) => a - b));
      });
    }
  });
});

describe('samplingProbs', () => {
  it('gives the bits of x / T, topKMask, topPMask and softmax made one after the other (and works in place)', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const vocab = 4099;
    const rows: Float32Array[] = [];
    for (const scale of [0.5, 3, 20, 200]) rows.push(randomF32(vocab, next, scale));
    rows.push(Float32Array.from(randomF32(vocab, next, 3), (v) => Math.round(v))); // ties
    const masked = randomF32(vocab, next, 5);
    for (let i = 0; i < vocab; i += 3) masked[i] = -Infinity;
    rows.push(masked);
    const x = new Float32Array(rows.length * vocab);
    for (const [i, r] of rows.entries()) x.set(r, i * vocab);
    for (const t of [1, 0.2, 0.7, 1.7])
      for (const k of [0, 1, 40, vocab - 1, vocab])
        for (const p of [0.3, 0.9, 1]) {
          const ref = Float32Array.from(x, (v) => v / t);
          if (k > 0 && k < vocab) topKMask(ref, vocab, k, ref);
          if (p < 1) topPMask(ref, vocab, p, ref);
          softmax(ref, vocab, 1, ref);
          const y = samplingProbs(x, vocab, t, k, p, poisoned(x.length));
          const at = firstBitDifference(y, ref);
          expect(at, `seed ${seed}, T ${t}, k ${k}, p ${p}: first difference at ${at}`).toBe(-1);
          if (t === 0.7 && k === 40 && p === 0.9) {
            const inPlace = Float32Array.from(x);
            samplingProbs(inPlace, vocab, t, k, p, inPlace);
            expect(firstBitDifference(inPlace, ref)).toBe(-1);
          }
        }
  });

  it("lists each row's support (its positive entries' ids, ascending) with the same bits, on every ISA path", () => {
    const seed = freshSeed();
    const next = rng(seed);
    const vocab = 1031;
    const rows = [randomF32(vocab, next, 0.5), randomF32(vocab, next, 8), randomF32(vocab, next, 60)];
    rows.push(Float32Array.from(randomF32(vocab, next, 3), (v) => Math.round(v))); // ties
    const masked = randomF32(vocab, next, 5);
    for (let i = 0; i < vocab; i += 3) masked[i] = -Infinity;
    rows.push(masked);
    const nan = randomF32(vocab, next, 5);
    nan[17] = Number.NaN;
    rows.push(nan);
    const x = new Float32Array(rows.length * vocab);
    for (const [i, r] of rows.entries()) x.set(r, i * vocab);
    const nanRow = rows.length - 1;
    for (const path of isaPaths())
      for (const [t, k, p] of [
        [0.2, 0, 0.9],
        [1, 0, 1],
        [0.7, 40, 0.95],
        [1.3, 0, 0.3],
        [30, 0, 0.999],
      ] as const)
        withIsa(path, () => {
          const what = `seed ${seed}, ${path}, T ${t}, k ${k}, p ${p}`;
          const support = { ids: new Int32Array(x.length).fill(-7), counts: new Int32Array(rows.length) };
          const y = samplingProbs(x, vocab, t, k, p, poisoned(x.length), support);
          const plain = samplingProbs(x, vocab, t, k, p);
          for (let r = 0; r < rows.length; r++) {
            const row = y.subarray(r * vocab, (r + 1) * vocab);
            if (r === nanRow) {
              expect(support.counts[r], what).toBe(-1);
              expect(
                row.every((v) => Number.isNaN(v)),
                what,
              ).toBe(true);
              continue;
            }
            expect(firstBitDifference(row, plain.subarray(r * vocab, (r + 1) * vocab)), what).toBe(-1);
            const positive = [...row.keys()].filter((i) => row[i]! > 0);
            const n = support.counts[r]!;
            expect(Array.from(support.ids.subarray(r * vocab, r * vocab + n)), `${what}, row ${r}`).toEqual(positive);
          }
        });
  });

  it('names a bad argument and a row without a finite value', () => {
    const x = new Float32Array([1, 2, -Infinity, -Infinity]);
    expect(() => samplingProbs(x, 2, 1, 0, 1)).toThrow('samplingProbs: logits: row 1 has no finite value');
    expect(() => samplingProbs(x, 2, 0, 0, 1)).toThrow(
      'samplingProbs: temperature: expected a number > 0, got number 0',
    );
    expect(() => samplingProbs(x, 2, 1, 3, 1)).toThrow('samplingProbs: topK: expected an integer in [0, 2], got');
    expect(() => samplingProbs(x, 2, 1, 0, 0)).toThrow('samplingProbs: topP: expected a number in (0, 1], got');
  });
});

describe('softmax on every ISA path', () => {
  it('gives the same bits on each path (both run activation_kernels.h ExpF)', () => {
    const seed = freshSeed();
    const vocab = 4099;
    const x = randomF32(5 * vocab, rng(seed), 30);
    for (let i = 0; i < x.length; i += 11) x[i] = -Infinity;
    const outs = isaPaths().map((path) => withIsa(path, () => softmax(x, vocab, 0.7)));
    for (const y of outs.slice(1)) expect(firstBitDifference(y, outs[0]!), `seed ${seed}`).toBe(-1);
  });

  it('samplingProbs: the same bits on each path (the division, the 16-partial sums, the top-p candidates)', () => {
    const seed = freshSeed();
    const next = rng(seed);
    // lengths around the 16-lane and 8-lane tails; peaked, flat and tied rows
    for (const vocab of [1, 7, 15, 16, 17, 33, 4099]) {
      const rows = [randomF32(vocab, next, 0.5), randomF32(vocab, next, 8), randomF32(vocab, next, 60)];
      rows.push(Float32Array.from(randomF32(vocab, next, 3), (v) => Math.round(v)));
      const x = new Float32Array(rows.length * vocab);
      for (const [i, r] of rows.entries()) x.set(r, i * vocab);
      for (const [t, k, p] of [
        [1, 0, 1],
        [0.2, 0, 0.9],
        [0.7, 3, 0.95],
        [1.3, 0, 0.3],
      ] as const) {
        const kk = Math.min(k, vocab);
        const outs = isaPaths().map((path) => withIsa(path, () => samplingProbs(x, vocab, t, kk, p)));
        for (const y of outs.slice(1))
          expect(firstBitDifference(y, outs[0]!), `seed ${seed}, vocab ${vocab}, T ${t}, k ${k}, p ${p}`).toBe(-1);
      }
    }
  });
});
