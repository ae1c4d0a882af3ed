// KDA core (conv + SiLU, L2 norms, gated delta rule): recurrent and chunked kernels vs a float64
// reference of kimi.py (KDAAttention._conv, l2norm, kda_recurrent); snapshot commit == running only
// the accepted tokens (bitwise); block == token-by-token (bitwise); batch and thread invariance
// (bitwise); chunked vs recurrent within tolerance; async == sync; argument errors. Both ISA paths.
import { afterAll, describe, expect, it } from 'vitest';
import {
  createKdaSnapshots,
  isa,
  kdaChunked,
  kdaChunkedAsync,
  kdaCommitSnapshot,
  kdaCopySlot,
  kdaGate,
  kdaOutputNorm,
  kdaRecurrent,
  kdaRecurrentAsync,
  kdaResetSlot,
  kdaSlotLengths,
  setIsa,
  setNumThreads,
  type KdaBatch,
  type KdaInputs,
  type KdaShape,
  type KdaStatePools,
} from '@specd/native';
import {
  firstBitDifference,
  firstMismatches,
  freshSeed,
  isaPaths,
  poisoned,
  randomF32,
  relError,
  rng,
  TOL_F32,
  withIsa,
} from './reference.js';

const SHAPE: KdaShape = { heads: 3, headDim: 40 };

interface Problem {
  inputs: KdaInputs;
  batch: KdaBatch;
  pools: KdaStatePools;
}

/** Random inputs for sequences of `lens` tokens at `slots` of a pool of `numSlots`, random prior states. */
function makeProblem(next: () => number, shape: KdaShape, lens: number[], slots: number[], numSlots: number): Problem {
  const C = shape.heads * shape.headDim;
  const T = lens.reduce((a, b) => a + b, 0);
  const l = kdaSlotLengths(shape);
  const g = new Float32Array(T * C);
  for (let i = 0; i < g.length; i++) {
    // Mostly mild decay, some channels decaying hard (exp(G) underflows inside a chunk).
    g[i] = next() < 0.1 ? -5 - 10 * next() : -0.001 - 0.5 * next() ** 2;
  }
  const beta = new Float32Array(T * shape.heads).map(() => 0.05 + 0.9 * next());
  return {
    inputs: { qkv: randomF32(T * 3 * C, next, 1.5), g, beta, convWeight: randomF32(3 * C * 4, next, 0.6) },
    batch: { seqLens: Int32Array.from(lens), slots: Int32Array.from(slots) },
    pools: { state: randomF32(numSlots * l.state, next, 0.3), conv: randomF32(numSlots * l.conv, next, 1) },
  };
}

function clonePools(p: KdaStatePools): KdaStatePools {
  return { state: Float32Array.from(p.state), conv: Float32Array.from(p.conv) };
}

/** Rows [r0, r1) of the inputs (qkv, g, beta), as views. */
function rowsOf(inputs: KdaInputs, shape: KdaShape, r0: number, r1: number): KdaInputs {
  const C = shape.heads * shape.headDim;
  return {
    qkv: inputs.qkv.subarray(r0 * 3 * C, r1 * 3 * C),
    g: inputs.g.subarray(r0 * C, r1 * C),
    beta: inputs.beta.subarray(r0 * shape.heads, r1 * shape.heads),
    convWeight: inputs.convWeight,
  };
}

const one = (len: number, slot: number): KdaBatch => ({ seqLens: Int32Array.of(len), slots: Int32Array.of(slot) });

/** float64 reference of the whole core; returns o and the updated pools (float64). */
function referenceKda(p: Problem, shape: KdaShape, scale = 1 / Math.sqrt(shape.headDim)) {
  const { heads: H, headDim: d } = shape;
  const C = H * d;
  const l = kdaSlotLengths(shape);
  const state = Float64Array.from(p.pools.state);
  const conv = Float64Array.from(p.pools.conv);
  const T = p.inputs.beta.length / H;
  const o = new Float64Array(T * C);
  const post = new Float64Array(3 * C);
  let row = 0;
  for (let b = 0; b < p.batch.seqLens.length; b++) {
    const slot = p.batch.slots[b]!;
    for (let t = 0; t < p.batch.seqLens[b]!; t++, row++) {
      for (let ch = 0; ch < 3 * C; ch++) {
        const st = slot * l.conv + ch * 3;
        const w = p.inputs.convWeight.subarray(ch * 4, ch * 4 + 4);
        const x = p.inputs.qkv[row * 3 * C + ch]!;
        const y = w[0]! * conv[st]! + w[1]! * conv[st + 1]! + w[2]! * conv[st + 2]! + w[3]! * x;
        conv[st] = conv[st + 1]!;
        conv[st + 1] = conv[st + 2]!;
        conv[st + 2] = x;
        post[ch] = y / (1 + Math.exp(-y));
      }
      for (let h = 0; h < H; h++) {
        const q = post.slice(h * d, (h + 1) * d);
        const k = post.slice(C + h * d, C + (h + 1) * d);
        const v = post.slice(2 * C + h * d, 2 * C + (h + 1) * d);
        for (const [vec, s] of [
          [q, scale],
          [k, 1],
        ] as const) {
          let ss = 0;
          for (let i = 0; i < d; i++) ss += vec[i]! ** 2;
          const inv = 1 / Math.sqrt(ss + 1e-6);
          for (let i = 0; i < d; i++) vec[i] = vec[i]! * inv * s;
        }
        const S = slot * l.state + h * d * d;
        const beta = p.inputs.beta[row * H + h]!;
        const pred = new Float64Array(d);
        for (let i = 0; i < d; i++) {
          const a = Math.exp(p.inputs.g[row * C + h * d + i]!);
          for (let j = 0; j < d; j++) {
            state[S + i * d + j] = state[S + i * d + j]! * a;
            pred[j] += k[i]! * state[S + i * d + j]!;
          }
        }
        for (let i = 0; i < d; i++) {
          for (let j = 0; j < d; j++) {
            state[S + i * d + j] = state[S + i * d + j]! + k[i]! * beta * (v[j]! - pred[j]!);
            o[row * C + h * d + j] += q[i]! * state[S + i * d + j]!;
          }
        }
      }
    }
  }
  return { o, state, conv };
}

/** Relative errors tolerated: per-token f32 dot products of length d, growing slowly with T. */
const tolKda = (T: number) => 1.5e-6 * Math.sqrt(Math.max(1, T)) + 2e-6;

afterAll(() => {
  setIsa('auto');
  setNumThreads(isa().threads);
});

const configs: Array<[name: string, lens: number[], slots: number[], numSlots: number]> = [
  ['T=1', [1], [0], 1],
  ['T=2', [2], [1], 2],
  ['T=5', [5], [0], 1],
  ['T=33', [33], [2], 3],
  ['T=70', [70], [0], 1],
  ['batch of 5 (lens 5,0,33,1,70)', [5, 0, 33, 1, 70], [3, 0, 5, 1, 4], 6],
];

describe.each(isaPaths())('KDA on the %s path', (path) => {
  it.each(configs)('recurrent matches float64 (%s)', (_name, lens, slots, numSlots) => {
    const seed = freshSeed();
    const p = makeProblem(rng(seed), SHAPE, lens, slots, numSlots);
    const ref = referenceKda(p, SHAPE);
    const pools = clonePools(p.pools);
    const o = withIsa(path, () => kdaRecurrent(p.inputs, p.batch, pools, SHAPE, { out: poisoned(ref.o.length) }));
    const T = Math.max(...lens);
    expect(relError(o, ref.o), `seed ${seed}: ${firstMismatches(o, ref.o, 1e-4)}`).toBeLessThan(tolKda(T));
    expect(relError(pools.state, ref.state), `seed ${seed}: state`).toBeLessThan(tolKda(T));
    expect(relError(pools.conv, ref.conv), `seed ${seed}: conv`).toBe(0);
  });

  it.each(configs)(
    'chunked matches float64 and the recurrent kernel (%s, chunk 64 and 16)',
    (_name, lens, slots, numSlots) => {
      const seed = freshSeed();
      const p = makeProblem(rng(seed), SHAPE, lens, slots, numSlots);
      const ref = referenceKda(p, SHAPE);
      const T = Math.max(...lens);
      const recPools = clonePools(p.pools);
      const rec = withIsa(path, () => kdaRecurrent(p.inputs, p.batch, recPools, SHAPE));
      for (const chunk of [64, 16]) {
        const pools = clonePools(p.pools);
        const o = withIsa(path, () =>
          kdaChunked(p.inputs, p.batch, pools, SHAPE, { out: poisoned(ref.o.length), chunk }),
        );
        const msg = `seed ${seed} chunk ${chunk}`;
        expect(relError(o, ref.o), `${msg}: ${firstMismatches(o, ref.o, 1e-4)}`).toBeLessThan(tolKda(T));
        expect(relError(pools.state, ref.state), `${msg}: state`).toBeLessThan(tolKda(T));
        expect(relError(pools.conv, ref.conv), `${msg}: conv`).toBe(0);
        expect(relError(o, rec), `${msg}: vs recurrent`).toBeLessThan(2 * tolKda(T));
        expect(relError(pools.state, recPools.state), `${msg}: state vs recurrent`).toBeLessThan(2 * tolKda(T));
      }
    },
  );

  it('snapshot commit at every accepted position equals running only the accepted tokens, bit for bit', () => {
    const seed = freshSeed();
    // Two sequences verified together: 7 and 5 block tokens.
    const p = makeProblem(rng(seed), SHAPE, [7, 5], [2, 0], 4);
    const T = 12;
    const l = kdaSlotLengths(SHAPE);
    const snaps = createKdaSnapshots(SHAPE, T);
    snaps.state.fill(Number.NaN);
    snaps.conv.fill(Number.NaN);
    withIsa(path, () => {
      const verified = clonePools(p.pools);
      kdaRecurrent(p.inputs, p.batch, verified, SHAPE, { snapshots: snaps });
      // The last snapshot of each sequence is its final state.
      expect(
        firstBitDifference(
          snaps.state.subarray(6 * l.state, 7 * l.state),
          verified.state.subarray(2 * l.state, 3 * l.state),
        ),
      ).toBe(-1);
      expect(firstBitDifference(snaps.conv.subarray(11 * l.conv, 12 * l.conv), verified.conv.subarray(0, l.conv))).toBe(
        -1,
      );
      for (const [b, r0, len, slot] of [
        [0, 0, 7, 2],
        [1, 7, 5, 0],
      ] as const) {
        for (let n = 1; n <= len; n++) {
          // (a) commit from snapshots
          const committed = clonePools(verified);
          kdaCommitSnapshot(committed, SHAPE, slot, snaps, r0 + n - 1);
          // (b) replay: the pre-verify state, then only the n accepted tokens
          const replayed = clonePools(p.pools);
          const oReplay = kdaRecurrent(rowsOf(p.inputs, SHAPE, r0, r0 + n), one(n, slot), replayed, SHAPE);
          const msg = `seed ${seed} seq ${b} n=${n}`;
          expect(
            firstBitDifference(
              committed.state.subarray(slot * l.state, (slot + 1) * l.state),
              replayed.state.subarray(slot * l.state, (slot + 1) * l.state),
            ),
            `${msg}: state`,
          ).toBe(-1);
          expect(
            firstBitDifference(
              committed.conv.subarray(slot * l.conv, (slot + 1) * l.conv),
              replayed.conv.subarray(slot * l.conv, (slot + 1) * l.conv),
            ),
            `${msg}: conv`,
          ).toBe(-1);
          expect(
            oReplay.every((x) => Number.isFinite(x)),
            msg,
          ).toBe(true);
        }
      }
    });
  });

  it('replay through kdaCopySlot (keep the pre-verify state in a spare slot) gives the same bits', () => {
    const seed = freshSeed();
    const p = makeProblem(rng(seed), SHAPE, [6], [1], 3);
    const l = kdaSlotLengths(SHAPE);
    withIsa(path, () => {
      const pools = clonePools(p.pools);
      kdaCopySlot(pools, SHAPE, 1, 2); // spare
      kdaRecurrent(p.inputs, p.batch, pools, SHAPE); // verify 6
      kdaCopySlot(pools, SHAPE, 2, 1); // reject: restore
      kdaRecurrent(rowsOf(p.inputs, SHAPE, 0, 4), one(4, 1), pools, SHAPE); // accept 4
      const direct = clonePools(p.pools);
      kdaRecurrent(rowsOf(p.inputs, SHAPE, 0, 4), one(4, 1), direct, SHAPE);
      expect(
        firstBitDifference(pools.state.subarray(l.state, 2 * l.state), direct.state.subarray(l.state, 2 * l.state)),
        `seed ${seed}`,
      ).toBe(-1);
      expect(
        firstBitDifference(pools.conv.subarray(l.conv, 2 * l.conv), direct.conv.subarray(l.conv, 2 * l.conv)),
        `seed ${seed}`,
      ).toBe(-1);
      kdaResetSlot(pools, SHAPE, 1);
      expect(pools.state.subarray(l.state, 2 * l.state).every((x) => x === 0)).toBe(true);
    });
  });

  it('options.initial: each slot set to its row of a kept state, then its tokens = restoring first, bitwise', () => {
    const seed = freshSeed();
    const next = rng(seed);
    // three sequences in slots 2, 0, 3; the kept states are rows 1, 2, 0 of a 3-row array (random, not the pools')
    const p = makeProblem(next, SHAPE, [3, 1, 5], [2, 0, 3], 4);
    const l = kdaSlotLengths(SHAPE);
    const kept = {
      state: new Float32Array(3 * l.state).map(() => next() - 0.5),
      conv: new Float32Array(3 * l.conv).map(() => next() - 0.5),
    };
    const rows = Int32Array.of(1, 2, 0);
    withIsa(path, () => {
      const restored = clonePools(p.pools);
      for (let b = 0; b < 3; b++) {
        const slot = p.batch.slots[b]!;
        restored.state.set(kept.state.subarray(rows[b]! * l.state, (rows[b]! + 1) * l.state), slot * l.state);
        restored.conv.set(kept.conv.subarray(rows[b]! * l.conv, (rows[b]! + 1) * l.conv), slot * l.conv);
      }
      const oRestored = kdaRecurrent(p.inputs, p.batch, restored, SHAPE);
      const inKernel = clonePools(p.pools);
      const o = kdaRecurrent(p.inputs, p.batch, inKernel, SHAPE, { initial: { ...kept, rows } });
      expect(firstBitDifference(o, oRestored), `seed ${seed}`).toBe(-1);
      expect(firstBitDifference(inKernel.state, restored.state), `seed ${seed}`).toBe(-1);
      expect(firstBitDifference(inKernel.conv, restored.conv), `seed ${seed}`).toBe(-1);
      // without rows: row b for sequence b (as many rows as sequences)
      const byOrder = clonePools(p.pools);
      const reordered = {
        state: Float32Array.from([1, 2, 0].flatMap((r) => [...kept.state.subarray(r * l.state, (r + 1) * l.state)])),
        conv: Float32Array.from([1, 2, 0].flatMap((r) => [...kept.conv.subarray(r * l.conv, (r + 1) * l.conv)])),
      };
      kdaRecurrent(p.inputs, p.batch, byOrder, SHAPE, { initial: reordered });
      expect(firstBitDifference(byOrder.state, restored.state), `seed ${seed}`).toBe(-1);
    });
    const bad = (opts: Parameters<typeof kdaRecurrent>[4], re: RegExp, batch = p.batch) =>
      expect(() => kdaRecurrent(p.inputs, batch, clonePools(p.pools), SHAPE, opts)).toThrow(re);
    const fourRows = { state: new Float32Array(4 * l.state), conv: new Float32Array(4 * l.conv) };
    bad({ initial: fourRows }, /options.initial.state: expected 3 rows \(one per sequence\)/);
    bad(
      { initial: { ...kept, rows: Int32Array.of(0, 3, 1) } },
      /options.initial.rows\[1\]: expected a row in \[0, 3\)/,
    );
    bad({ initial: { ...kept, conv: new Float32Array(5) } }, /options.initial.conv/);
    bad({ initial: { state: new Float32Array(l.state + 1), conv: kept.conv } }, /options.initial.state/);
    const withEmpty = makeProblem(rng(seed), SHAPE, [3, 0, 5], [2, 0, 3], 4);
    expect(() =>
      kdaRecurrent(withEmpty.inputs, withEmpty.batch, withEmpty.pools, SHAPE, { initial: { ...kept, rows } }),
    ).toThrow(/batch.seqLens\[1\]: expected a length >= 1 with options.initial/);
  });

  it('options.keepBefore: each kept row holds its sequence state from before its tokens; -1 keeps none', () => {
    const seed = freshSeed();
    const p = makeProblem(rng(seed), SHAPE, [3, 1, 5], [2, 0, 3], 4);
    const l = kdaSlotLengths(SHAPE);
    const keep = {
      state: new Float32Array(3 * l.state).fill(7),
      conv: new Float32Array(3 * l.conv).fill(7),
      rows: Int32Array.of(2, -1, 0),
    };
    withIsa(path, () => {
      const plain = clonePools(p.pools);
      const oPlain = kdaRecurrent(p.inputs, p.batch, plain, SHAPE);
      const kept = clonePools(p.pools);
      const o = kdaRecurrent(p.inputs, p.batch, kept, SHAPE, { keepBefore: keep });
      // the forward itself is unchanged
      expect(firstBitDifference(o, oPlain), `seed ${seed}`).toBe(-1);
      expect(firstBitDifference(kept.state, plain.state), `seed ${seed}`).toBe(-1);
      for (const [b, row] of [
        [0, 2],
        [2, 0],
      ] as const) {
        const slot = p.batch.slots[b]!;
        const before = p.pools.state.subarray(slot * l.state, (slot + 1) * l.state);
        expect(firstBitDifference(keep.state.subarray(row * l.state, (row + 1) * l.state), before)).toBe(-1);
        const conv = p.pools.conv.subarray(slot * l.conv, (slot + 1) * l.conv);
        expect(firstBitDifference(keep.conv.subarray(row * l.conv, (row + 1) * l.conv), conv)).toBe(-1);
      }
      // row 1 was nobody's: untouched
      expect(keep.state.subarray(l.state, 2 * l.state).every((x) => x === 7)).toBe(true);
      expect(keep.conv.subarray(l.conv, 2 * l.conv).every((x) => x === 7)).toBe(true);
    });
    const bad = (k: typeof keep, re: RegExp) =>
      expect(() => kdaRecurrent(p.inputs, p.batch, clonePools(p.pools), SHAPE, { keepBefore: k })).toThrow(re);
    bad({ ...keep, rows: Int32Array.of(2, 2, 0) }, /options.keepBefore.rows\[1\]: expected distinct rows/);
    bad({ ...keep, rows: Int32Array.of(3, -1, 0) }, /options.keepBefore.rows\[0\]: expected a row in \[-1, 3\)/);
    bad({ ...keep, rows: Int32Array.of(0, 1) }, /options.keepBefore.rows/);
    bad({ ...keep, conv: new Float32Array(4) }, /options.keepBefore.conv/);
  });

  it('a block of T tokens equals T single-token calls (decode == verification), bit for bit', () => {
    const seed = freshSeed();
    const p = makeProblem(rng(seed), SHAPE, [9], [0], 1);
    withIsa(path, () => {
      const block = clonePools(p.pools);
      const oBlock = kdaRecurrent(p.inputs, p.batch, block, SHAPE);
      const steps = clonePools(p.pools);
      const C = SHAPE.heads * SHAPE.headDim;
      for (let t = 0; t < 9; t++) {
        const o = kdaRecurrent(rowsOf(p.inputs, SHAPE, t, t + 1), one(1, 0), steps, SHAPE);
        expect(firstBitDifference(o, oBlock.subarray(t * C, (t + 1) * C)), `seed ${seed} token ${t}`).toBe(-1);
      }
      expect(firstBitDifference(steps.state, block.state), `seed ${seed}`).toBe(-1);
      expect(firstBitDifference(steps.conv, block.conv), `seed ${seed}`).toBe(-1);
    });
  });

  it.each(['recurrent', 'chunked'] as const)('%s is batch invariant and thread invariant, bit for bit', (mode) => {
    const seed = freshSeed();
    const next = rng(seed);
    const lens = [33, 4, 70, 1, 17];
    const p = makeProblem(next, SHAPE, lens, [4, 1, 0, 3, 2], 5);
    const run = (q: Problem, pools: KdaStatePools) =>
      mode === 'recurrent'
        ? kdaRecurrent(q.inputs, q.batch, pools, SHAPE)
        : kdaChunked(q.inputs, q.batch, pools, SHAPE, { chunk: 16 });
    const C = SHAPE.heads * SHAPE.headDim;
    const l = kdaSlotLengths(SHAPE);
    withIsa(path, () => {
      const pools = clonePools(p.pools);
      const o = run(p, pools);
      // Each sequence alone, from the same prior state, in a one-slot pool.
      let r0 = 0;
      for (let b = 0; b < lens.length; b++) {
        const slot = p.batch.slots[b]!;
        const alone = {
          state: p.pools.state.slice(slot * l.state, (slot + 1) * l.state),
          conv: p.pools.conv.slice(slot * l.conv, (slot + 1) * l.conv),
        };
        const oAlone = run(
          { inputs: rowsOf(p.inputs, SHAPE, r0, r0 + lens[b]!), batch: one(lens[b]!, 0), pools: alone },
          alone,
        );
        const msg = `seed ${seed} seq ${b}`;
        expect(firstBitDifference(oAlone, o.subarray(r0 * C, (r0 + lens[b]!) * C)), `${msg}: output`).toBe(-1);
        expect(
          firstBitDifference(alone.state, pools.state.subarray(slot * l.state, (slot + 1) * l.state)),
          `${msg}: state`,
        ).toBe(-1);
        expect(
          firstBitDifference(alone.conv, pools.conv.subarray(slot * l.conv, (slot + 1) * l.conv)),
          `${msg}: conv`,
        ).toBe(-1);
        r0 += lens[b]!;
      }
      for (const threads of [1, 3]) {
        setNumThreads(threads);
        const poolsT = clonePools(p.pools);
        const oT = run(p, poolsT);
        expect(firstBitDifference(oT, o), `seed ${seed}: ${threads} threads`).toBe(-1);
        expect(firstBitDifference(poolsT.state, pools.state), `seed ${seed}: ${threads} threads state`).toBe(-1);
      }
      setNumThreads(isa().threads);
    });
  });

  it('chunked prefill split at a multiple of the chunk equals one call, bit for bit', () => {
    const seed = freshSeed();
    const p = makeProblem(rng(seed), SHAPE, [70], [0], 1);
    withIsa(path, () => {
      const whole = clonePools(p.pools);
      const o = kdaChunked(p.inputs, p.batch, whole, SHAPE, { chunk: 16 });
      const split = clonePools(p.pools);
      const o1 = kdaChunked(rowsOf(p.inputs, SHAPE, 0, 32), one(32, 0), split, SHAPE, { chunk: 16 });
      const o2 = kdaChunked(rowsOf(p.inputs, SHAPE, 32, 70), one(38, 0), split, SHAPE, { chunk: 16 });
      const C = SHAPE.heads * SHAPE.headDim;
      expect(firstBitDifference(o1, o.subarray(0, 32 * C)), `seed ${seed}`).toBe(-1);
      expect(firstBitDifference(o2, o.subarray(32 * C)), `seed ${seed}`).toBe(-1);
      expect(firstBitDifference(split.state, whole.state), `seed ${seed}`).toBe(-1);
    });
  });
});

describe('KDA async and arguments', () => {
  it('async variants equal the sync calls bit for bit', async () => {
    const seed = freshSeed();
    const p = makeProblem(rng(seed), SHAPE, [70, 3], [1, 0], 2);
    for (const [sync, async] of [
      [kdaRecurrent, kdaRecurrentAsync],
      [kdaChunked, kdaChunkedAsync],
    ] as const) {
      const a = clonePools(p.pools);
      const b = clonePools(p.pools);
      const o = sync(p.inputs, p.batch, a, SHAPE);
      const oAsync = await async(p.inputs, p.batch, b, SHAPE, { out: poisoned(o.length) });
      expect(firstBitDifference(oAsync, o), `seed ${seed}`).toBe(-1);
      expect(firstBitDifference(b.state, a.state), `seed ${seed}`).toBe(-1);
      expect(firstBitDifference(b.conv, a.conv), `seed ${seed}`).toBe(-1);
    }
  });

  it('rejects repeated or out-of-range slots, wrong lengths and snapshot sizes', () => {
    const p = makeProblem(rng(1), SHAPE, [2, 3], [0, 1], 2);
    const bad = (fn: () => unknown, re: RegExp) => expect(fn).toThrow(re);
    bad(
      () => kdaRecurrent(p.inputs, { seqLens: Int32Array.of(2, 3), slots: Int32Array.of(1, 1) }, p.pools, SHAPE),
      /kdaRecurrent: batch.slots\[1\]: expected distinct slots/,
    );
    bad(
      () => kdaRecurrent(p.inputs, { seqLens: Int32Array.of(2, 3), slots: Int32Array.of(0, 2) }, p.pools, SHAPE),
      /slot in \[0, 2\)/,
    );
    bad(
      () => kdaRecurrent(p.inputs, { seqLens: Int32Array.of(2, 4), slots: Int32Array.of(0, 1) }, p.pools, SHAPE),
      /inputs.qkv: expected Float32Array of length/,
    );
    bad(
      () => kdaChunked({ ...p.inputs, beta: new Float32Array(3) }, p.batch, p.pools, SHAPE),
      /kdaChunked: inputs.beta/,
    );
    bad(
      () => kdaRecurrent(p.inputs, p.batch, p.pools, SHAPE, { snapshots: createKdaSnapshots(SHAPE, 4) }),
      /snapshots.state/,
    );
    bad(() => kdaChunked(p.inputs, p.batch, p.pools, SHAPE, { chunk: 0 }), /chunk/);
    try {
      kdaRecurrent(p.inputs, p.batch, { state: p.pools.state, conv: new Float32Array(5) }, SHAPE);
    } catch (e) {
      expect((e as { code?: string }).code).toBe('ERR_SPECD_INVALID_ARG');
    }
  });

  it('kdaGate: g = negA·softplus(f + dtBias), β = sigmoid(b) at its layout, within 4 ulp of the double formula', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const { heads: H, headDim: d } = SHAPE;
    const C = H * d;
    const T = 5;
    const f = randomF32(T * C, next, 8);
    f[3] = 25; // above softplus's threshold: softplus(x) = x
    f[4] = -30;
    const dtBias = randomF32(C, next, 1);
    const negA = Float32Array.from({ length: H }, (_, h) => -Math.exp(Math.log(h + 1)));
    const stride = 2 * H + 3; // β's logits at columns [1, 1 + H) of a wider row
    const b = randomF32(T * stride, next, 6);
    const { g, beta } = kdaGate(f, dtBias, negA, b, SHAPE, { offset: 1, stride });
    const sp = (x: number) => (x > 20 ? x : Math.log1p(Math.exp(x)));
    let gMismatch = 0;
    let bMismatch = 0;
    for (let t = 0; t < T; t++) {
      for (let h = 0; h < H; h++) {
        for (let i = 0; i < d; i++) {
          const ch = h * d + i;
          const want = Math.fround(negA[h]! * Math.fround(sp(Math.fround(f[t * C + ch]! + dtBias[ch]!))));
          // fp32 exp and log1p series (kda_math.h): within 4 fp32 ulp of the double formula
          if (Math.abs(g[t * C + ch]! - want) > 4 * Math.abs(want) * 2 ** -23) gMismatch++;
        }
        const want = Math.fround(1 / (1 + Math.exp(-b[1 + t * stride + h]!)));
        if (Math.abs(beta[t * H + h]! - want) > 4 * want * 2 ** -23) bMismatch++;
      }
    }
    expect([gMismatch, bMismatch], `seed ${seed}`).toEqual([0, 0]);
    expect(g[3]).toBe(Math.fround(negA[0]! * Math.fround(25 + dtBias[3]!)));
    expect(Math.max(...g)).toBeLessThanOrEqual(0);
    // a token's gates do not depend on the other tokens of the call
    const one = kdaGate(f.subarray(2 * C, 3 * C), dtBias, negA, b, SHAPE, { offset: 1 + 2 * stride, stride });
    expect(firstBitDifference(one.g, g.subarray(2 * C, 3 * C))).toBe(-1);
    expect(firstBitDifference(one.beta, beta.subarray(2 * H, 3 * H))).toBe(-1);
    expect(() => kdaGate(f, dtBias, negA, b.subarray(0, (T - 1) * stride + H), SHAPE, { offset: 1, stride })).toThrow(
      /b: expected a Float32Array of at least/,
    );
    expect(() => kdaGate(f.subarray(1), dtBias, negA, b, SHAPE)).toThrow(/kdaGate: f/);
  });

  it('kdaOutputNorm is the per-head RMSNorm gated by sigmoid', () => {
    const seed = freshSeed();
    const next = rng(seed);
    const { heads, headDim: d } = SHAPE;
    const o = randomF32(2 * heads * d, next, 2);
    const w = randomF32(d, next);
    const gate = randomF32(o.length, next, 3);
    const y = kdaOutputNorm(o, SHAPE, w, gate, 1e-5, poisoned(o.length));
    const ref = new Float64Array(o.length);
    for (let r = 0; r < 2 * heads; r++) {
      let ss = 0;
      for (let i = 0; i < d; i++) ss += o[r * d + i]! ** 2;
      const inv = 1 / Math.sqrt(ss / d + 1e-5);
      for (let i = 0; i < d; i++) ref[r * d + i] = (o[r * d + i]! * inv * w[i]!) / (1 + Math.exp(-gate[r * d + i]!));
    }
    expect(relError(y, ref), `seed ${seed}`).toBeLessThan(TOL_F32);
  });
});
