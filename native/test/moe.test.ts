// MoE: sigmoid top-k router (selection with bias, deterministic ties, weights) and grouped SwiGLU
// experts + shared expert vs float64 references (kimi.py MoEGate / SparseMoE); batch and thread
// invariance bit for bit; async == sync; argument errors. Both ISA paths.
import { afterAll, describe, expect, it } from 'vitest';
import {
  createMoeExpertSet,
  gemmBf16,
  isa,
  moeExperts,
  moeExpertsAsync,
  moeRoute,
  moeRouter,
  packBf16Weights,
  packMoeExpert,
  setIsa,
  setNumThreads,
  type MoeExpertSet,
  type MoeRouting,
} from '@specd/native';
import {
  bf16Bits,
  bf16Value,
  firstBitDifference,
  firstMismatches,
  freshSeed,
  isaPaths,
  poisoned,
  randomF32,
  relError,
  rng,
  tolDot,
  TOL_F32,
  withIsa,
} from './reference.js';

afterAll(() => {
  setIsa('auto');
  setNumThreads(isa().threads);
});

/** Random bf16 weights [n, k] (bits) and their exact values. */
function randomWeights(
  n: number,
  k: number,
  next: () => number,
  scale = 0.5,
): { bits: Uint16Array; values: Float64Array } {
  const bits = new Uint16Array(n * k);
  const values = new Float64Array(n * k);
  for (let i = 0; i < n * k; i++) {
    bits[i] = bf16Bits((next() * 2 - 1) * scale);
    values[i] = bf16Value(bits[i]!);
  }
  return { bits, values };
}

const sigmoid = (x: number) => 1 / (1 + Math.exp(-x));

/** float64 reference of MoEGate: ids in selection order (descending key, lowest id on ties). */
function referenceRoute(
  logits: Float32Array,
  n: number,
  E: number,
  k: number,
  factor: number,
  bias?: Float32Array,
  renorm = true,
) {
  const ids: number[][] = [];
  const weights: number[][] = [];
  const margins: number[] = [];
  for (let t = 0; t < n; t++) {
    const scores = Array.from({ length: E }, (_, e) => sigmoid(logits[t * E + e]!));
    const order = scores
      .map((s, e) => ({ e, key: s + (bias ? bias[e]! : 0) }))
      .sort((a, b) => b.key - a.key || a.e - b.e);
    const chosen = order.slice(0, k).map((o) => o.e);
    margins.push(k < E ? order[k - 1]!.key - order[k]!.key : Infinity);
    const sum = chosen.reduce((s, e) => s + scores[e]!, 0);
    ids.push(chosen);
    weights.push(chosen.map((e) => (renorm ? scores[e]! / (sum + 1e-20) : scores[e]!) * factor));
  }
  return { ids, weights, margins };
}

interface Layer {
  set: MoeExpertSet;
  w1: Float64Array[];
  w3: Float64Array[];
  w2: Float64Array[];
  shared?: { w1: Float64Array; w3: Float64Array; w2: Float64Array; inter: number };
}

function makeLayer(next: () => number, E: number, D: number, I: number, sharedInter: number): Layer {
  const w1: Float64Array[] = [];
  const w3: Float64Array[] = [];
  const w2: Float64Array[] = [];
  const packed = [];
  for (let e = 0; e < E; e++) {
    const a = randomWeights(I, D, next);
    const b = randomWeights(I, D, next);
    const c = randomWeights(D, I, next);
    w1.push(a.values);
    w3.push(b.values);
    w2.push(c.values);
    packed.push(packMoeExpert(a.bits, b.bits, c.bits, D, I));
  }
  if (sharedInter === 0) return { set: createMoeExpertSet(packed), w1, w3, w2 };
  const a = randomWeights(sharedInter, D, next);
  const b = randomWeights(sharedInter, D, next);
  const c = randomWeights(D, sharedInter, next);
  return {
    set: createMoeExpertSet(packed, packMoeExpert(a.bits, b.bits, c.bits, D, sharedInter)),
    w1,
    w3,
    w2,
    shared: { w1: a.values, w3: b.values, w2: c.values, inter: sharedInter },
  };
}

/** float64 SwiGLU expert on one token. */
function expertRef(
  x: Float32Array,
  w1: Float64Array,
  w3: Float64Array,
  w2: Float64Array,
  D: number,
  I: number,
): Float64Array {
  const a = new Float64Array(I);
  for (let i = 0; i < I; i++) {
    let g = 0;
    let u = 0;
    for (let j = 0; j < D; j++) {
      g += w1[i * D + j]! * x[j]!;
      u += w3[i * D + j]! * x[j]!;
    }
    a[i] = g * sigmoid(g) * u;
  }
  const y = new Float64Array(D);
  for (let j = 0; j < D; j++) for (let i = 0; i < I; i++) y[j] += w2[j * I + i]! * a[i]!;
  return y;
}

function referenceExperts(layer: Layer, x: Float32Array, n: number, routing: MoeRouting): Float64Array {
  const { hidden: D, inter: I } = layer.set;
  const out = new Float64Array(n * D);
  for (let t = 0; t < n; t++) {
    const xt = x.subarray(t * D, (t + 1) * D);
    for (let j = 0; j < routing.topK; j++) {
      const e = routing.ids[t * routing.topK + j]!;
      const y = expertRef(xt, layer.w1[e]!, layer.w3[e]!, layer.w2[e]!, D, I);
      for (let c = 0; c < D; c++) out[t * D + c] += routing.weights[t * routing.topK + j]! * y[c]!;
    }
    if (layer.shared) {
      const s = layer.shared;
      const y = expertRef(xt, s.w1, s.w3, s.w2, D, s.inter);
      for (let c = 0; c < D; c++) out[t * D + c] += y[c]!;
    }
  }
  return out;
}

/** Random routing (distinct experts per token) with positive weights. */
function randomRouting(next: () => number, n: number, E: number, k: number): MoeRouting {
  const ids = new Int32Array(n * k);
  const weights = new Float32Array(n * k);
  for (let t = 0; t < n; t++) {
    const pool = Array.from({ length: E }, (_, e) => e);
    for (let j = 0; j < k; j++) {
      ids[t * k + j] = pool.splice(Math.floor(next() * pool.length), 1)[0]!;
      weights[t * k + j] = 0.1 + next();
    }
  }
  return { topK: k, ids, weights };
}

describe('moeRoute', () => {
  it.each([1, 2, 5, 37])('matches float64 selection and weights (n=%i, E=19, k=5, bias, factor 2.5)', (n) => {
    const seed = freshSeed();
    const next = rng(seed);
    const [E, k, factor] = [19, 5, 2.5];
    const logits = randomF32(n * E, next, 4);
    const bias = randomF32(E, next, 0.3);
    const scores = poisoned(n * E);
    const r = moeRoute(logits, n, E, k, factor, {
      bias,
      scores,
      out: { ids: new Int32Array(n * k).fill(-7), weights: poisoned(n * k) },
    });
    const ref = referenceRoute(logits, n, E, k, factor, bias);
    for (let t = 0; t < n; t++) {
      if (ref.margins[t]! < 1e-5) continue; // a near tie: f32 may legitimately choose the other one
      expect(Array.from(r.ids.subarray(t * k, (t + 1) * k)), `seed ${seed} token ${t}`).toEqual(ref.ids[t]);
      expect(relError(r.weights.subarray(t * k, (t + 1) * k), ref.weights[t]!), `seed ${seed} token ${t}`).toBeLessThan(
        4 * TOL_F32,
      );
    }
    expect(relError(scores, Array.from(logits, sigmoid)), `seed ${seed}`).toBeLessThan(TOL_F32);
  });

  it('breaks ties by the lowest expert id, ranks NaN last, and can skip renormalisation', () => {
    const E = 6;
    const equal = new Float32Array(E).fill(0.5);
    expect(Array.from(moeRoute(equal, 1, E, 3, 1).ids)).toEqual([0, 1, 2]);
    // Bias makes experts 4 and 1 tie at the top (score equal, bias equal): 1 first.
    const bias = Float32Array.of(0, 0.25, 0, 0, 0.25, 0);
    expect(Array.from(moeRoute(equal, 1, E, 3, 1, { bias }).ids)).toEqual([1, 4, 0]);
    const withNaN = Float32Array.of(Number.NaN, 1, Number.NaN, 2, 0, -1);
    expect(Array.from(moeRoute(withNaN, 1, E, 5, 1).ids)).toEqual([3, 1, 4, 5, 0]);
    const logits = Float32Array.of(1, -2, 3, 0, 0.5, 2);
    const r = moeRoute(logits, 1, E, 2, 2, { renormalize: false });
    expect(Array.from(r.ids)).toEqual([2, 5]);
    expect(r.weights[0]).toBeCloseTo(2 * sigmoid(3), 6);
    const rn = moeRoute(logits, 1, E, 2, 2);
    expect(rn.weights[0]! + rn.weights[1]!).toBeCloseTo(2, 6);
  });

  it('moeRouter = gemmBf16 logits + moeRoute', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const [n, D, E] = [7, 45, 13];
    const gate = packBf16Weights(randomWeights(E, D, next).bits, E, D);
    const x = randomF32(n * D, next);
    const r = moeRouter(x, n, gate, 4, 1.5);
    const direct = moeRoute(gemmBf16(x, n, gate), n, E, 4, 1.5);
    expect(Array.from(r.ids)).toEqual(Array.from(direct.ids));
    expect(firstBitDifference(r.weights, direct.weights)).toBe(-1);
  });
});

describe.each(isaPaths())('moeExperts on the %s path', (path) => {
  const [E, D, I, S, k] = [7, 37, 23, 29, 3];

  it.each([1, 2, 5, 37])(
    'matches float64 with a shared expert (n=%i, E=7, hidden 37, inter 23, shared 29, k=3)',
    (n) => {
      const seed = freshSeed();
      const next = rng(seed);
      const layer = makeLayer(next, E, D, I, S);
      const x = randomF32(n * D, next);
      const routing = randomRouting(next, n, E, k);
      const y = withIsa(path, () => moeExperts(x, n, layer.set, routing, poisoned(n * D)));
      const ref = referenceExperts(layer, x, n, routing);
      expect(relError(y, ref), `seed ${seed}: ${firstMismatches(y, ref, 1e-4)}`).toBeLessThan(
        4 * (tolDot(D) + tolDot(I)),
      );
    },
  );

  it('matches float64 without a shared expert, with a repeated expert in one token', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const layer = makeLayer(next, E, D, I, 0);
    const x = randomF32(3 * D, next);
    const routing = {
      topK: 2,
      ids: Int32Array.of(4, 4, 0, 6, 6, 2),
      weights: Float32Array.of(0.5, 0.25, 1, 2, 0.3, 0.7),
    };
    const y = withIsa(path, () => moeExperts(x, 3, layer.set, routing, poisoned(3 * D)));
    expect(relError(y, referenceExperts(layer, x, 3, routing)), `seed ${seed}`).toBeLessThan(
      4 * (tolDot(D) + tolDot(I)),
    );
  });

  it('is batch invariant (any subset, any order) and thread invariant, bit for bit', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const n = 37;
    const layer = makeLayer(next, E, D, I, S);
    const x = randomF32(n * D, next);
    const routing = randomRouting(next, n, E, k);
    withIsa(path, () => {
      const full = moeExperts(x, n, layer.set, routing);
      const tokenOut = (t: number) => full.subarray(t * D, (t + 1) * D);
      // Every token alone.
      for (let t = 0; t < n; t++) {
        const one = moeExperts(x.subarray(t * D, (t + 1) * D), 1, layer.set, {
          topK: k,
          ids: routing.ids.subarray(t * k, (t + 1) * k),
          weights: routing.weights.subarray(t * k, (t + 1) * k),
        });
        expect(firstBitDifference(one, tokenOut(t)), `seed ${seed}: token ${t} alone`).toBe(-1);
      }
      // A shuffled subset of 11 tokens, slots permuted within each token too.
      const pick = Array.from({ length: n }, (_, i) => i)
        .sort(() => next() - 0.5)
        .slice(0, 11);
      const xs = new Float32Array(pick.length * D);
      const ids = new Int32Array(pick.length * k);
      const ws = new Float32Array(pick.length * k);
      pick.forEach((t, i) => {
        xs.set(x.subarray(t * D, (t + 1) * D), i * D);
        for (let j = 0; j < k; j++) {
          const src = t * k + ((j + i) % k);
          ids[i * k + j] = routing.ids[src]!;
          ws[i * k + j] = routing.weights[src]!;
        }
      });
      const sub = moeExperts(xs, pick.length, layer.set, { topK: k, ids, weights: ws });
      pick.forEach((t, i) => {
        expect(
          firstBitDifference(sub.subarray(i * D, (i + 1) * D), tokenOut(t)),
          `seed ${seed}: token ${t} in subset`,
        ).toBe(-1);
      });
      for (const threads of [1, 3]) {
        setNumThreads(threads);
        expect(firstBitDifference(moeExperts(x, n, layer.set, routing), full), `seed ${seed}: ${threads} threads`).toBe(
          -1,
        );
      }
      setNumThreads(isa().threads);
    });
  });
});

describe('moeExperts async and arguments', () => {
  it('async equals sync bit for bit', async () => {
    const seed = freshSeed();
    const next = rng(seed);
    const layer = makeLayer(next, 5, 40, 19, 16);
    const x = randomF32(33 * 40, next);
    const routing = randomRouting(next, 33, 5, 2);
    const y = moeExperts(x, 33, layer.set, routing);
    const ya = await moeExpertsAsync(x, 33, layer.set, routing, poisoned(y.length));
    expect(firstBitDifference(ya, y), `seed ${seed}`).toBe(-1);
  });

  it('a batch larger than one internal pass (n = 1100 > 512) equals small batches, bit for bit', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const [n, D, k] = [1100, 24, 2];
    const layer = makeLayer(next, 4, D, 8, 8);
    const x = randomF32(n * D, next);
    const routing = randomRouting(next, n, 4, k);
    const y = moeExperts(x, n, layer.set, routing);
    for (const t0 of [0, 500, 511, 1000]) {
      const m = 13;
      const part = moeExperts(x.subarray(t0 * D, (t0 + m) * D), m, layer.set, {
        topK: k,
        ids: routing.ids.subarray(t0 * k, (t0 + m) * k),
        weights: routing.weights.subarray(t0 * k, (t0 + m) * k),
      });
      expect(firstBitDifference(part, y.subarray(t0 * D, (t0 + m) * D)), `seed ${seed} t0 ${t0}`).toBe(-1);
    }
  });

  it('rejects bad expert ids, shapes and sets', () => {
    const next = rng(3);
    const layer = makeLayer(next, 3, 20, 8, 0);
    const x = randomF32(20, next);
    expect(() => moeExperts(x, 1, layer.set, { topK: 1, ids: Int32Array.of(3), weights: Float32Array.of(1) })).toThrow(
      /moeExperts: routing.ids\[0\]: expected an expert id in \[0, 3\)/,
    );
    expect(() =>
      moeExperts(x, 2, layer.set, { topK: 1, ids: Int32Array.of(0, 1), weights: Float32Array.of(1, 1) }),
    ).toThrow(/moeExperts: x: expected Float32Array of length 40/);
    const a = randomWeights(8, 20, next).bits;
    const other = packMoeExpert(a, a, randomWeights(20, 8, next).bits, 20, 8);
    const wrong = packMoeExpert(
      randomWeights(4, 20, next).bits,
      randomWeights(4, 20, next).bits,
      randomWeights(20, 4, next).bits,
      20,
      4,
    );
    expect(() => createMoeExpertSet([other, wrong])).toThrow(/createMoeExpertSet: experts\[1\]: expected inter = 8/);
    expect(() => moeRoute(new Float32Array(6), 2, 3, 4, 1)).toThrow(/moeRoute: topK/);
  });
});
