// Sampling and rejection acceptance on the device (src/sampling.cu, issue 18) against the CPU path, on the GPU
// machine only (`node --test`, never vitest): the probabilities after temperature / top-k / top-p equal the CPU's
// samplingProbs (same kept set, ties at the top-p cut kept in index order; values within 1e-5 relative), a draw
// with a given uniform is the CPU's inverse-CDF draw, rejection sampling is lossless (χ² of the emitted token
// against p, with q and with point masses; the acceptance rate against Σ min(p, q)), results repeat bit for bit, a
// row that is not finite fails only a group that reaches it, and malformed requests are refused naming the field.
// Without a GPU or the addon every case is skipped with loadCuda()'s message.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { samplingProbs } from '@specd/native';

import { cuda, devBuf, gpu } from './device.mjs';
import { chiCrit, chiSquare, prng } from './reference.mjs';

/** Rows of logits ~ N(0, scale²) (Box–Muller over the seeded PRNG). */
function randomLogits(rows, vocab, seed, scale = 3) {
  const next = prng(seed);
  const x = new Float32Array(rows * vocab);
  for (let i = 0; i < x.length; i++)
    x[i] = scale * Math.sqrt(-2 * Math.log(1 - next())) * Math.cos(2 * Math.PI * next());
  return x;
}

/** One group per row (k = 0) with these settings; uniforms from `u`. */
function rowGroups(rows, { temperature, topK = 0, topP = 1 }, u) {
  const groups = new Int32Array(rows * 4);
  for (let r = 0; r < rows; r++) groups.set([r, 0, -1, topK], r * 4);
  return {
    groups,
    temperature: new Float64Array(rows).fill(temperature),
    topP: new Float64Array(rows).fill(topP),
    drafts: new Int32Array(0),
    uniforms: Float64Array.from({ length: rows }, (_, i) => u(i)),
  };
}

/** The CPU's inverse-CDF draw (packages/core probs.ts sampleFromProbs) at uniform u. */
function cpuDraw(p, u) {
  let total = 0;
  for (let i = 0; i < p.length; i++) total += p[i];
  const t = u * total;
  let acc = 0;
  let last = -1;
  for (let i = 0; i < p.length; i++) {
    if (p[i] <= 0) continue;
    acc += p[i];
    last = i;
    if (t < acc) return i;
  }
  return last;
}

const SETTINGS = [
  { temperature: 1 },
  { temperature: 0.7, topK: 50 },
  { temperature: 0.2, topP: 0.9 },
  { temperature: 1.3, topK: 1000, topP: 0.95 },
  { temperature: 1, topK: 1 },
  { temperature: 2, topP: 0.5 },
];

test(
  'probabilities equal the CPU samplingProbs: the same kept set, values within 1e-5; draws as the CPU draws',
  gpu,
  () => {
    const V = 49152;
    const rows = 6;
    const x = randomLogits(rows, V, 7);
    for (let r = 0; r < rows; r++) x[r * V + 100 + r] = 12; // a large entry per row (a few % of the mass)
    const buf = devBuf(x);
    for (const s of SETTINGS) {
      const next = prng(11);
      const req = rowGroups(rows, s, () => next());
      const { results, probs } = cuda.sample(buf, rows, V, req, true);
      const ref = samplingProbs(x, V, s.temperature, s.topK ?? 0, s.topP ?? 1);
      let worst = 0;
      for (let i = 0; i < ref.length; i++) {
        // below 1e-30 exp's subnormal results may flush to zero on one side: kept-ness is compared above it
        if (Math.max(probs[i], ref[i]) < 1e-30) continue;
        assert.equal(probs[i] > 0, ref[i] > 0, `${JSON.stringify(s)}: entry ${i} kept on one side only`);
        worst = Math.max(worst, Math.abs(probs[i] - ref[i]) / ref[i]);
      }
      assert.ok(worst <= 1e-5, `${JSON.stringify(s)}: worst relative difference ${worst}`);
      for (let r = 0; r < rows; r++) {
        assert.equal(results[2 * r], 0);
        const want = cpuDraw(ref.subarray(r * V, (r + 1) * V), req.uniforms[r]);
        assert.equal(results[2 * r + 1], want, `${JSON.stringify(s)}: row ${r}'s draw`);
      }
      console.log(`# ${JSON.stringify(s)}: worst relative difference ${worst.toExponential(2)}`);
    }
    cuda.free(buf);
  },
);

test('top-p ties at the cut are kept in index order, as the CPU sort does; 2,000 draws as the CPU draws', gpu, () => {
  const V = 4096;
  const x = new Float32Array(V).fill(-5);
  for (let i = 0; i < 12; i++) x[300 + 37 * i] = 4; // 12 equal logits: top-p 0.5 cuts inside them
  const buf = devBuf(x);
  for (const topP of [0.3, 0.5, 0.77, 0.999]) {
    const s = { temperature: 1, topP };
    const { probs } = cuda.sample(
      buf,
      1,
      V,
      rowGroups(1, s, () => 0.5),
      true,
    );
    const ref = samplingProbs(x, V, 1, 0, topP);
    for (let i = 0; i < V; i++) assert.equal(probs[i] > 0, ref[i] > 0, `topP ${topP}: entry ${i}`);
  }
  // draws: 2,000 uniforms over a random row, each the CPU's token
  const y = randomLogits(1, V, 3, 1.5);
  const yb = devBuf(y);
  const next = prng(5);
  const u = Array.from({ length: 2000 }, () => next());
  const groups = new Int32Array(2000 * 4);
  for (let g = 0; g < 2000; g++) groups.set([0, 0, -1, 0], g * 4);
  const req = {
    groups,
    temperature: new Float64Array(2000).fill(0.9),
    topP: new Float64Array(2000).fill(0.97),
    drafts: new Int32Array(0),
    uniforms: Float64Array.from(u),
  };
  const { results } = cuda.sample(yb, 1, V, req, false);
  const ref = samplingProbs(y, V, 0.9, 0, 0.97);
  let differ = 0;
  for (let g = 0; g < 2000; g++) if (results[2 * g + 1] !== cpuDraw(ref, u[g])) differ++;
  assert.ok(differ <= 1, `${differ} of 2,000 draws differ from the CPU's`);
  cuda.free(buf);
  cuda.free(yb);
});

test(
  'rejection sampling is lossless: the first emitted token is distributed as p (with q, and point masses)',
  gpu,
  () => {
    const V = 64;
    const N = 40000;
    const x = randomLogits(2, V, 21, 1.2); // row 0: the target at the draft, row 1: after it
    const buf = devBuf(x);
    for (const s of [{ temperature: 1 }, { temperature: 0.8, topK: 20, topP: 0.9 }]) {
      const p = cuda
        .sample(
          buf,
          2,
          V,
          rowGroups(2, s, () => 0),
          true,
        )
        .probs.subarray(0, V);
      // q: another distribution over the vocabulary (some mass where p has none)
      const qNext = prng(4);
      const q = Float32Array.from({ length: V }, () => qNext() ** 3);
      const qs = q.reduce((a, b) => a + b, 0);
      for (let i = 0; i < V; i++) q[i] /= qs;
      for (const withQ of [true, false]) {
        const next = prng(withQ ? 99 : 98);
        const drafts = new Int32Array(N);
        for (let g = 0; g < N; g++) drafts[g] = withQ ? cpuDraw(q, next()) : 7; // point mass at token 7
        const groups = new Int32Array(N * 4);
        for (let g = 0; g < N; g++) groups.set([0, 1, withQ ? 0 : -1, s.topK ?? 0], g * 4);
        const req = {
          groups,
          temperature: new Float64Array(N).fill(s.temperature),
          topP: new Float64Array(N).fill(s.topP ?? 1),
          drafts,
          uniforms: Float64Array.from({ length: 2 * N }, () => next()),
          q: withQ ? q : undefined,
        };
        const { results } = cuda.sample(buf, 2, V, req, false);
        const counts = new Float64Array(V);
        let accepted = 0;
        for (let g = 0; g < N; g++) {
          const a = results[2 * g];
          accepted += a;
          counts[a === 1 ? drafts[g] : results[2 * g + 1]]++;
        }
        const { stat, df } = chiSquare(counts, p, N);
        const rate = accepted / N;
        let want = 0;
        for (let i = 0; i < V; i++) want += Math.min(p[i], withQ ? q[i] : i === 7 ? 1 : 0);
        const sd = Math.sqrt((want * (1 - want)) / N);
        console.log(
          `# ${JSON.stringify(s)} ${withQ ? 'q' : 'point mass'}: χ² ${stat.toFixed(1)} (df ${df}, ` +
            `critical ${chiCrit(df).toFixed(1)}), acceptance ${rate.toFixed(4)} vs ${want.toFixed(4)}`,
        );
        assert.ok(stat < chiCrit(df), `χ² ${stat} ≥ ${chiCrit(df)} (df ${df})`);
        assert.ok(Math.abs(rate - want) < 5 * sd + 1e-9, `acceptance ${rate} vs Σ min(p, q) ${want}`);
      }
    }
    cuda.free(buf);
  },
);

test('the same request gives the same tokens; a row that is not finite fails only a group that reaches it', gpu, () => {
  const V = 1000;
  const x = randomLogits(4, V, 8);
  x[0 * V + 5] = 60; // row 0: token 5 certain
  x[2 * V + 9] = Number.NaN; // row 2: not finite
  x[3 * V + 1] = 60;
  const buf = devBuf(x);
  // group 0: draft 5 (certain) at row 0, then row 1 → fine. group 1: rows 1, 2 with draft 1 (rejected at row 1 when
  // p(1) < u; accepted → reaches row 2 → −1). group 2: row 2 alone → −1. group 3: rows 2, 3 with a draft → −1 at 0.
  const req = {
    groups: Int32Array.from([0, 1, -1, 0, 1, 1, -1, 0, 2, 0, -1, 0, 2, 1, -1, 0]),
    temperature: new Float64Array(4).fill(1),
    topP: new Float64Array(4).fill(1),
    drafts: Int32Array.from([5, 1, 3]),
    uniforms: Float64Array.from([0.5, 0.25, 0.999, 0.5, 0.5, 0.1, 0.5]),
  };
  const a = cuda.sample(buf, 4, V, req, false).results;
  const b = cuda.sample(buf, 4, V, req, false).results;
  assert.deepEqual(Array.from(a), Array.from(b));
  assert.equal(a[0], 1, 'group 0 accepts its certain draft');
  assert.ok(a[1] >= 0);
  assert.equal(a[2], 0, 'group 1 rejects draft 1 (p(1) < 0.999)');
  assert.ok(a[3] >= 0, 'group 1 never reaches the bad row');
  assert.deepEqual([a[4], a[5]], [0, -1], 'group 2 draws from the bad row');
  assert.deepEqual([a[6], a[7]], [0, -1], 'group 3 decides at the bad row');
  cuda.free(buf);
});

test('malformed requests are refused naming the field', gpu, () => {
  const V = 100;
  const buf = devBuf(new Float32Array(2 * V));
  const ok = () => ({
    groups: Int32Array.from([0, 1, -1, 0]),
    temperature: Float64Array.from([1]),
    topP: Float64Array.from([1]),
    drafts: Int32Array.from([3]),
    uniforms: Float64Array.from([0.5, 0.5]),
  });
  const bad = (patch, re) => assert.throws(() => cuda.sample(buf, 2, V, { ...ok(), ...patch }, false), re);
  bad({ groups: Int32Array.from([1, 1, -1, 0]) }, /group 0: rows 1 … 2 outside the 2 logit rows/);
  bad({ groups: Int32Array.from([0, 1, 0, 0]) }, /q rows outside/);
  bad({ temperature: Float64Array.from([0]) }, /temperature/);
  bad({ topP: Float64Array.from([1.5]) }, /topP/);
  bad({ drafts: Int32Array.from([V]) }, /drafts\[0\]: outside the vocabulary/);
  bad({ uniforms: Float64Array.from([0.5]) }, /uniforms: length 1, expected 2/);
  bad({ uniforms: Float64Array.from([0.5, 1]) }, /uniforms\[1\]: outside \[0, 1\)/);
  bad({ temperature: Float32Array.from([1]) }, /temperature: expected a Float64Array/);
  assert.deepEqual(Array.from(cuda.sample(buf, 2, V, ok(), false).results).length, 2);
  cuda.free(buf);
});
