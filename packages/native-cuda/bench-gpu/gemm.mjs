// bench:gpu — the bf16 GEMM of @specd/native-cuda on this GPU (`npm run bench:gpu` after `npm run build:cuda`): the
// time of one call of out [m, n] = x [m, k] · wᵀ (cuBLASLt, bf16 in, fp32 accumulation and out, the plan made for 16
// rows at m ≤ 16) at m = 1, 16 and larger, and the weight-read rate it implies against the device's memory bandwidth
// (a 16-token verify costs what one token costs while the GEMM reads weights: the physics of issue 18).
import { loadCuda } from '../index.js';

const cuda = loadCuda();
console.log(`device: ${cuda.info.name}, sm ${cuda.info.computeCapability}`);
console.log('| n × k (bf16 weights) | m | plan rows | ms per call | weight GB/s | TFLOP/s | t(m) / t(1) |');
console.log('|---|---|---|---|---|---|---|');
for (const [n, k] of [
  [8192, 8192],
  [4096, 4096],
  [576, 1536],
]) {
  const w = cuda.alloc(n * k * 2);
  cuda.upload(w, new Uint16Array(n * k).fill(0x3c00)); // 0.0078125 everywhere
  let t1;
  for (const m of [1, 16, 64, 512, 8192]) {
    const mPad = Math.max(m, 16);
    const xb = cuda.alloc(mPad * k * 2);
    cuda.upload(xb, new Uint16Array(mPad * k).fill(0x3f80));
    const out = cuda.alloc(mPad * n * 4);
    const ms = cuda.timeGemm(out, xb, w, m, mPad, n, k, m >= 512 ? 20 : 200);
    t1 ??= ms;
    const gbs = (n * k * 2) / (ms / 1000) / 1e9;
    const tflops = (2 * mPad * n * k) / (ms / 1000) / 1e12;
    const cells = [`${n} × ${k}`, m, mPad, ms.toFixed(4), gbs.toFixed(0), tflops.toFixed(1), (ms / t1).toFixed(2)];
    console.log(`| ${cells.join(' | ')} |`);
    cuda.free(xb);
    cuda.free(out);
  }
  cuda.free(w);
}

// paged attention (SmolLM2's heads: 9 query, 3 KV, head_dim 64; pages of 16 keys): one sequence, a decode row vs a
// verify block of 16 rows at the end of kvLen keys; wall time per call over 200 launches, synchronized.
console.log('\n| attention kvLen | query rows | µs per call | t(16) / t(1) |');
console.log('|---|---|---|---|');
const [qHeads, kvHeads, headDim, pageSize] = [9, 3, 64, 16];
for (const kvLen of [512, 4096]) {
  const pages = Math.ceil(kvLen / pageSize);
  const poolFloats = pages * pageSize * kvHeads * headDim;
  const dev = (a) => {
    const b = cuda.alloc(a.byteLength);
    cuda.upload(b, a);
    return b;
  };
  const kPool = dev(new Float32Array(poolFloats).fill(0.01));
  const vPool = dev(new Float32Array(poolFloats).fill(0.02));
  const tables = dev(Int32Array.from({ length: pages }, (_, i) => i));
  let t1;
  for (const qLen of [1, 16]) {
    const q = dev(new Float32Array(qLen * qHeads * headDim).fill(0.1));
    const out = cuda.alloc(qLen * qHeads * headDim * 4);
    const args = [
      out,
      q,
      kPool,
      vPool,
      dev(Int32Array.from([0, qLen])),
      dev(Int32Array.from([kvLen])),
      tables,
      dev(Int32Array.from({ length: qLen }, (_, i) => kvLen - qLen + i)),
      1,
      qLen,
      pages,
      pageSize,
      qHeads,
      kvHeads,
      headDim,
      0.125,
      true,
      pages,
      kvLen,
    ];
    cuda.pagedAttention(...args);
    cuda.synchronize();
    const t0 = performance.now();
    for (let r = 0; r < 200; r++) cuda.pagedAttention(...args);
    cuda.synchronize();
    const us = ((performance.now() - t0) / 200) * 1000;
    t1 ??= us;
    console.log(`| ${kvLen} | ${qLen} | ${us.toFixed(1)} | ${(us / t1).toFixed(2)} |`);
  }
}
