// The CUDA kernels of @specd/native-cuda against CPU references, on the GPU machine only (`npm run test:gpu`, which
// builds the addon first; `node --test`, never vitest): device info; bf16 conversion; the bf16 GEMM (cuBLASLt, fp32
// accumulation) within fp32-sum tolerance of an fp64 reference over the same bf16 inputs, and row-invariant — every
// row of an m ≤ 16 GEMM equals, bit for bit, the GEMM of that row alone (the plan is made for 16 rows, the padding
// zeros); RMSNorm, SwiGLU (tolerance), embedding and argmax (exact, ties to the lowest index); refusals of a buffer
// too small or freed. Without a GPU or the addon every case is skipped with loadCuda()'s message.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { cuda, devBuf, gpu } from './device.mjs';
import { bf16Bits, bf16Value, prng, randomBf16 } from './reference.mjs';

const readF32 = (b, n) => {
  const out = new Float32Array(n);
  cuda.download(b, out);
  return out;
};

test('toBf16 rounds to nearest even like the CPU', gpu, () => {
  const next = prng(1);
  const x = Float32Array.from({ length: 4097 }, () => (next() * 2 - 1) * 100);
  x[0] = 1.00390625; // a tie: 1 + 2^-8 → 1 (even)
  x[1] = 1.01171875; // 1 + 3 · 2^-8 → 1 + 2^-6 (even)
  const out = cuda.alloc(x.length * 2);
  cuda.toBf16(out, devBuf(x), x.length);
  const got = new Uint16Array(x.length);
  cuda.download(out, got);
  for (let i = 0; i < x.length; i++) assert.equal(got[i], bf16Bits(x[i]), `element ${i}`);
});

/** The GEMM of `m` rows of x (bf16) against w on the device, planned for `mPad` rows. */
function gemm(xRows, m, mPad, wBuf, n, k) {
  const x = new Float32Array(mPad * k);
  x.set(xRows.subarray(0, m * k));
  const xb = cuda.alloc(mPad * k * 2);
  cuda.toBf16(xb, devBuf(x), mPad * k);
  const out = cuda.alloc(mPad * n * 4);
  cuda.gemmBf16(out, xb, wBuf, m, mPad, n, k);
  return readF32(out, mPad * n).subarray(0, m * n);
}

test('gemmBf16: fp32-accumulated bf16 GEMM within tolerance of fp64, and row-invariant for m ≤ 16', gpu, () => {
  const next = prng(7);
  const [n, k] = [768, 1024];
  const w = randomBf16(n * k, next, 0.05);
  const wBuf = cuda.alloc(n * k * 2);
  cuda.upload(wBuf, w.bits);
  const x = Float32Array.from({ length: 16 * k }, () => next() * 2 - 1);
  const y16 = gemm(x, 16, 16, wBuf, n, k);
  let worst = 0;
  for (let r = 0; r < 16; r++)
    for (let j = 0; j < n; j++) {
      let s = 0;
      let mag = 0;
      for (let c = 0; c < k; c++) {
        const t = bf16Value(bf16Bits(x[r * k + c])) * w.values[j * k + c];
        s += t;
        mag += Math.abs(t);
      }
      const err = Math.abs(y16[r * n + j] - s) / mag;
      worst = Math.max(worst, err);
    }
  console.log(`gemmBf16 ${n}×${k}: worst |error| / Σ|terms| = ${worst.toExponential(2)}`);
  assert.ok(worst < 1e-5, `worst relative error ${worst}`);
  // row invariance: every m ≤ 16 gives the same rows; each row alone gives the same bits
  for (const m of [1, 2, 3, 7, 8, 15]) {
    const ym = gemm(x, m, 16, wBuf, n, k);
    assert.deepEqual(ym, y16.subarray(0, m * n), `m = ${m}`);
  }
  for (let r = 0; r < 16; r++) {
    const alone = gemm(x.subarray(r * k, (r + 1) * k), 1, 16, wBuf, n, k);
    assert.deepEqual(alone, y16.subarray(r * n, (r + 1) * n), `row ${r} alone`);
  }
});

test('rmsNorm, swiglu and embed against the CPU', gpu, () => {
  const next = prng(3);
  const [rows, cols] = [5, 2048];
  const x = Float32Array.from({ length: rows * cols }, () => (next() * 2 - 1) * 3);
  const w = randomBf16(cols, next, 2);
  const wBuf = cuda.alloc(cols * 2);
  cuda.upload(wBuf, w.bits);
  const out = cuda.alloc(rows * cols * 4);
  cuda.rmsNorm(out, devBuf(x), wBuf, rows, cols, 1e-5);
  const y = readF32(out, rows * cols);
  for (let r = 0; r < rows; r++) {
    let ss = 0;
    for (let c = 0; c < cols; c++) ss += x[r * cols + c] ** 2;
    const inv = 1 / Math.sqrt(ss / cols + 1e-5);
    for (let c = 0; c < cols; c++) {
      const want = x[r * cols + c] * inv * w.values[c];
      assert.ok(Math.abs(y[r * cols + c] - want) <= 1e-5 * (1 + Math.abs(want)), `rmsNorm [${r}, ${c}]`);
    }
  }
  const inter = 1536;
  const gu = Float32Array.from({ length: rows * 2 * inter }, () => (next() * 2 - 1) * 6);
  const s = cuda.alloc(rows * inter * 4);
  cuda.swiglu(s, devBuf(gu), rows, inter);
  const sy = readF32(s, rows * inter);
  for (let r = 0; r < rows; r++)
    for (let j = 0; j < inter; j++) {
      const g = gu[r * 2 * inter + j];
      const want = (g / (1 + Math.exp(-g))) * gu[r * 2 * inter + inter + j];
      assert.ok(Math.abs(sy[r * inter + j] - want) <= 1e-5 * (1 + Math.abs(want)), `swiglu [${r}, ${j}]`);
    }
  const [vocab, hidden] = [1000, 576];
  const table = randomBf16(vocab * hidden, next);
  const tBuf = cuda.alloc(vocab * hidden * 2);
  cuda.upload(tBuf, table.bits);
  const ids = Int32Array.from([0, 999, 17, 17, 500]);
  const e = cuda.alloc(ids.length * hidden * 4);
  cuda.embed(e, tBuf, devBuf(ids), ids.length, hidden, vocab);
  const ey = readF32(e, ids.length * hidden);
  for (const [r, id] of ids.entries())
    for (let c = 0; c < hidden; c++) assert.equal(ey[r * hidden + c], table.values[id * hidden + c]);
});

test('argmax: exact, ties to the lowest index', gpu, () => {
  const next = prng(11);
  const [rows, cols] = [4, 49152];
  const x = Float32Array.from({ length: rows * cols }, () => next());
  x[1 * cols + 40000] = 5;
  x[1 * cols + 30000] = 5; // tie: 30000 wins
  x[2 * cols + cols - 1] = 7;
  x.fill(-1, 3 * cols, 4 * cols); // all equal: 0
  const out = cuda.alloc(rows * 4);
  cuda.argmax(out, devBuf(x), rows, cols);
  const got = new Int32Array(rows);
  cuda.download(out, got);
  const want = [];
  for (let r = 0; r < rows; r++) {
    let b = 0;
    for (let c = 1; c < cols; c++) if (x[r * cols + c] > x[r * cols + b]) b = c;
    want.push(b);
  }
  assert.deepEqual([...got], want);
  assert.equal(got[1], 30000);
});

test('refuses a buffer too small or freed, naming it', gpu, () => {
  const small = cuda.alloc(16);
  const x = cuda.alloc(64);
  assert.throws(() => cuda.rmsNorm(small, x, x, 1, 16, 1e-5), {
    name: 'RangeError',
    message: /out: 16 bytes, needs 64/,
  });
  cuda.free(small);
  assert.throws(() => cuda.download(small, new Float32Array(1)), /buffer: the device buffer was freed/);
  assert.throws(() => cuda.alloc(0), { name: 'RangeError', message: /bytes/ });
});

test('rope: neox and interleaved against the CPU formula', gpu, () => {
  const next = prng(5);
  const [tokens, heads, headDim] = [6, 9, 64];
  const positions = Int32Array.from([0, 1, 7, 100, 1023, 2047]);
  for (const neox of [true, false])
    for (const rotaryDim of [64, 32]) {
      const x = Float32Array.from({ length: tokens * heads * headDim }, () => next() * 2 - 1);
      const xb = devBuf(x);
      cuda.rope(xb, devBuf(positions), tokens, heads, headDim, rotaryDim, 10000, neox);
      const y = readF32(xb, x.length);
      const half = rotaryDim / 2;
      for (let t = 0; t < tokens; t++)
        for (let h = 0; h < heads; h++)
          for (let i = 0; i < half; i++) {
            const base = (t * heads + h) * headDim;
            const [ia, ib] = neox ? [i, i + half] : [2 * i, 2 * i + 1];
            const angle = Math.fround(positions[t] * Math.fround(10000 ** ((-2 * i) / rotaryDim)));
            const [a, b] = [x[base + ia], x[base + ib]];
            const wa = a * Math.cos(angle) - b * Math.sin(angle);
            const wb = b * Math.cos(angle) + a * Math.sin(angle);
            const tol = 2e-5 * (1 + Math.abs(positions[t]) * 1e-3);
            assert.ok(Math.abs(y[base + ia] - wa) <= tol, `neox ${neox} rd ${rotaryDim} [${t}, ${h}, ${i}] a`);
            assert.ok(Math.abs(y[base + ib] - wb) <= tol, `neox ${neox} rd ${rotaryDim} [${t}, ${h}, ${i}] b`);
          }
      // the dimensions past rotaryDim are untouched
      for (let r = 0; r < tokens * heads; r++)
        for (let c = rotaryDim; c < headDim; c++) assert.equal(y[r * headDim + c], x[r * headDim + c]);
    }
});

/** Attention of one query (fp64): softmax(q·k · scale) · v over the keys `keys` of a sequence's K/V rows. */
function attendRef(qRow, kRows, vRows, keys, headDim, scale) {
  const out = new Float64Array(headDim);
  if (keys === 0) return out;
  const s = [];
  for (let j = 0; j < keys; j++) {
    let d = 0;
    for (let c = 0; c < headDim; c++) d += qRow[c] * kRows[j][c];
    s.push(d * scale);
  }
  const m = Math.max(...s);
  const p = s.map((x) => Math.exp(x - m));
  const l = p.reduce((a, b) => a + b, 0);
  for (let j = 0; j < keys; j++) for (let c = 0; c < headDim; c++) out[c] += (p[j] / l) * vRows[j][c];
  return out;
}

/**
 * |y − reference| over every query row and q head of a batch of paged-attention outputs y [totalQ, qHeads, headDim]:
 * sequence s's rows cu[s] … cu[s] + qLen − 1 attend to kv[s]'s first min(position + 1, kvLen) keys (causal) or all
 * kvLen (attendRef, fp64). → { worst, mean }.
 */
function attentionErrors({ y, q, seqs, cu, positions, kv, causal, qHeads, kvHeads, headDim, scale }) {
  let worst = 0;
  let sum = 0;
  let count = 0;
  seqs.forEach((sq, s) => {
    for (let i = 0; i < sq.qLen; i++) {
      const r = cu[s] + i;
      const keys = causal ? Math.min(positions[r] + 1, sq.kvLen) : sq.kvLen;
      for (let h = 0; h < qHeads; h++) {
        const g = Math.floor(h / (qHeads / kvHeads));
        const pick = (rows) => rows.map((row) => row.subarray(g * headDim, (g + 1) * headDim));
        const at = (r * qHeads + h) * headDim;
        const want = attendRef(q.subarray(at, at + headDim), pick(kv[s].k), pick(kv[s].v), keys, headDim, scale);
        for (let c = 0; c < headDim; c++) {
          const e = Math.abs(y[at + c] - want[c]);
          worst = Math.max(worst, e);
          sum += e;
          count++;
        }
      }
    }
  });
  return { worst, mean: sum / count };
}

test(
  'prefillAttention (tensor cores, TF32): causal prefill chunks of several sequences within TF32 tolerance of ' +
    'an fp64 reference; batch-invariant',
  gpu,
  () => {
    const next = prng(11);
    const [pageSize, numPages, qHeads, kvHeads, headDim] = [16, 80, 9, 3, 64];
    const rowFloats = kvHeads * headDim;
    // a fresh prompt sharing its 64-row block with the next sequence, a chunk continuing a prefill (positions
    // 200–299), a long prompt (11 key tiles), a short one at the end of a partly filled block
    const seqs = [
      { qLen: 40, kvLen: 40 },
      { qLen: 100, kvLen: 300 },
      { qLen: 700, kvLen: 700 },
      { qLen: 5, kvLen: 5 },
    ];
    const maxBlocks = 44;
    const free = Array.from({ length: numPages }, (_, i) => i).sort(() => next() - 0.5);
    const tables = new Int32Array(seqs.length * maxBlocks);
    const kPoolHost = new Float32Array(numPages * pageSize * rowFloats);
    const vPoolHost = new Float32Array(numPages * pageSize * rowFloats);
    const kv = seqs.map((sq, s) => {
      for (let b = 0; b < Math.ceil(sq.kvLen / pageSize); b++) tables[s * maxBlocks + b] = free.pop();
      const rows = () =>
        Array.from({ length: sq.kvLen }, () => Float32Array.from({ length: rowFloats }, () => next() * 2 - 1));
      const k = rows();
      const v = rows();
      for (let j = 0; j < sq.kvLen; j++) {
        const slot = tables[s * maxBlocks + Math.floor(j / pageSize)] * pageSize + (j % pageSize);
        kPoolHost.set(k[j], slot * rowFloats);
        vPoolHost.set(v[j], slot * rowFloats);
      }
      return { k, v };
    });
    const [kPool, vPool] = [devBuf(kPoolHost), devBuf(vPoolHost)];
    const cuArr = [0];
    for (const sq of seqs) cuArr.push(cuArr[cuArr.length - 1] + sq.qLen);
    const totalQ = cuArr[seqs.length];
    const positions = Int32Array.from(
      seqs.flatMap((sq) => Array.from({ length: sq.qLen }, (_, i) => sq.kvLen - sq.qLen + i)),
    );
    // queries ×3: scores of standard deviation ~1 after the 1/8 scale, so the softmax is not flat
    const q = Float32Array.from({ length: totalQ * qHeads * headDim }, () => (next() * 2 - 1) * 3);
    const scale = 1 / Math.sqrt(headDim);
    const run = (qb, cub, kvb, tb, pb, n, tq) => {
      const out = cuda.alloc(tq * qHeads * headDim * 4);
      cuda.prefillAttention(
        out,
        qb,
        kPool,
        vPool,
        cub,
        kvb,
        tb,
        pb,
        n,
        tq,
        maxBlocks,
        pageSize,
        qHeads,
        kvHeads,
        headDim,
        scale,
        numPages,
      );
      return readF32(out, tq * qHeads * headDim);
    };
    const y = run(
      devBuf(q),
      devBuf(Int32Array.from(cuArr)),
      devBuf(Int32Array.from(seqs.map((sq) => sq.kvLen))),
      devBuf(tables),
      devBuf(positions),
      seqs.length,
      totalQ,
    );
    const { worst, mean } = attentionErrors({
      y,
      q,
      seqs,
      cu: cuArr,
      positions,
      kv,
      causal: true,
      qHeads,
      kvHeads,
      headDim,
      scale,
    });
    console.log(
      `prefillAttention: ${totalQ} rows, worst |error| ${worst.toExponential(2)}, mean ${mean.toExponential(2)}`,
    );
    // TF32 rounds q, k, v and p to 2^-11 relative: ~1e-3 of an output in [-1, 1] at worst (fp32: < 2e-6)
    assert.ok(worst < 4e-3, `worst error ${worst}`);
    assert.ok(mean < 4e-4, `mean error ${mean}`);
    // batch invariance: each sequence alone gives its rows of the batch, bit for bit
    seqs.forEach((sq, s) => {
      const [r0, r1] = [cuArr[s], cuArr[s + 1]];
      const alone = run(
        devBuf(Float32Array.from(q.subarray(r0 * qHeads * headDim, r1 * qHeads * headDim))),
        devBuf(Int32Array.from([0, r1 - r0])),
        devBuf(Int32Array.from([sq.kvLen])),
        devBuf(tables.slice(s * maxBlocks, (s + 1) * maxBlocks)),
        devBuf(positions.slice(r0, r1)),
        1,
        r1 - r0,
      );
      assert.deepEqual(alone, y.subarray(r0 * qHeads * headDim, r1 * qHeads * headDim), `sequence ${s} alone`);
    });
    assert.throws(
      () =>
        cuda.prefillAttention(
          cuda.alloc(4),
          cuda.alloc(4),
          kPool,
          vPool,
          cuda.alloc(8),
          cuda.alloc(4),
          cuda.alloc(4),
          cuda.alloc(4),
          1,
          1,
          1,
          pageSize,
          qHeads,
          kvHeads,
          32,
          scale,
          numPages,
        ),
      /headDim/,
    );
  },
);

test(
  'writeKvPages and pagedAttention (GQA, NHD pages): decode, verify blocks, non-causal; batch-invariant',
  gpu,
  () => {
    const next = prng(9);
    const [pageSize, numPages, qHeads, kvHeads, headDim] = [16, 64, 9, 3, 64];
    const rowFloats = kvHeads * headDim;
    const seqs = [
      { qLen: 1, kvLen: 37 },
      { qLen: 5, kvLen: 600 }, // three partitions of 256 keys
      { qLen: 3, kvLen: 20 },
    ];
    const maxBlocks = 40;
    const free = Array.from({ length: numPages }, (_, i) => i).sort(() => next() - 0.5);
    const tables = new Int32Array(seqs.length * maxBlocks);
    const kv = seqs.map((sq, s) => {
      for (let b = 0; b < Math.ceil(sq.kvLen / pageSize); b++) tables[s * maxBlocks + b] = free.pop();
      const rows = () =>
        Array.from({ length: sq.kvLen }, () => Float32Array.from({ length: rowFloats }, () => next() * 2 - 1));
      return { k: rows(), v: rows() };
    });
    // every key of every sequence written through writeKvPages, one call
    const slots = [];
    const kFlat = [];
    const vFlat = [];
    seqs.forEach((sq, s) => {
      for (let j = 0; j < sq.kvLen; j++) {
        slots.push(tables[s * maxBlocks + Math.floor(j / pageSize)] * pageSize + (j % pageSize));
        kFlat.push(...kv[s].k[j]);
        vFlat.push(...kv[s].v[j]);
      }
    });
    slots.push(-1); // skipped
    kFlat.push(...new Array(rowFloats).fill(9));
    vFlat.push(...new Array(rowFloats).fill(9));
    const poolBytes = numPages * pageSize * rowFloats * 4;
    const [kPool, vPool] = [cuda.alloc(poolBytes), cuda.alloc(poolBytes)];
    cuda.upload(kPool, new Float32Array(poolBytes / 4));
    cuda.upload(vPool, new Float32Array(poolBytes / 4));
    cuda.writeKvPages(
      kPool,
      vPool,
      devBuf(Float32Array.from(kFlat)),
      devBuf(Float32Array.from(vFlat)),
      devBuf(Int32Array.from(slots)),
      slots.length,
      rowFloats,
      numPages * pageSize - 1,
    );
    const kHost = readF32(kPool, poolBytes / 4);
    assert.deepEqual(kHost.subarray(slots[3] * rowFloats, (slots[3] + 1) * rowFloats), kv[0].k[3]);
    // queries: the last qLen positions of each sequence
    const totalQ = seqs.reduce((a, sq) => a + sq.qLen, 0);
    const cu = Int32Array.from([0, 1, 6, 9]);
    const positions = Int32Array.from(
      seqs.flatMap((sq) => Array.from({ length: sq.qLen }, (_, i) => sq.kvLen - sq.qLen + i)),
    );
    const q = Float32Array.from({ length: totalQ * qHeads * headDim }, () => next() * 2 - 1);
    const scale = 1 / Math.sqrt(headDim);
    const run = (causal, qb, cub, kvb, tb, pb, n, tq, maxKv = 600) => {
      const out = cuda.alloc(tq * qHeads * headDim * 4);
      cuda.pagedAttention(
        out,
        qb,
        kPool,
        vPool,
        cub,
        kvb,
        tb,
        pb,
        n,
        tq,
        maxBlocks,
        pageSize,
        qHeads,
        kvHeads,
        headDim,
        scale,
        causal,
        numPages,
        maxKv,
      );
      return readF32(out, tq * qHeads * headDim);
    };
    const meta = [devBuf(cu), devBuf(Int32Array.from(seqs.map((sq) => sq.kvLen))), devBuf(tables), devBuf(positions)];
    for (const causal of [true, false]) {
      const y = run(causal, devBuf(q), ...meta, seqs.length, totalQ);
      const { worst } = attentionErrors({ y, q, seqs, cu, positions, kv, causal, qHeads, kvHeads, headDim, scale });
      console.log(`pagedAttention causal ${causal}: worst |error| ${worst.toExponential(2)}`);
      assert.ok(worst < 2e-6, `causal ${causal}: worst error ${worst}`);
      if (!causal) continue;
      // batch invariance: each sequence alone gives its rows of the batch, bit for bit (sequence 2 alone needs one
      // partition of keys where the batch launched three)
      for (const s of [1, 2]) {
        const [r0, r1] = [cu[s], cu[s + 1]];
        const alone = run(
          true,
          devBuf(Float32Array.from(q.subarray(r0 * qHeads * headDim, r1 * qHeads * headDim))),
          devBuf(Int32Array.from([0, r1 - r0])),
          devBuf(Int32Array.from([seqs[s].kvLen])),
          devBuf(tables.slice(s * maxBlocks, (s + 1) * maxBlocks)),
          devBuf(positions.slice(r0, r1)),
          1,
          r1 - r0,
          seqs[s].kvLen,
        );
        assert.deepEqual(alone, y.subarray(r0 * qHeads * headDim, r1 * qHeads * headDim), `sequence ${s} alone`);
      }
    }
  },
);
