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
