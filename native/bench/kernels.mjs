#!/usr/bin/env node
// Kernel micro-benchmark (llm.c style: print the fraction of bandwidth / FLOP rate reached).
//
//   npm run bench:kernels                 (root; builds nothing: run `npm run build` first)
//   node native/bench/kernels.mjs --quick (smaller weights, fewer repetitions)
//
// Measures, on the current machine and thread pool:
//   1. STREAM-like copy bandwidth (parallelCopy, 2 x 256 MiB f32 arrays; GB/s = 2*bytes/time),
//   2. GEMM rate with cache-resident weights (n = k = 1024, bf16, m = 16) in GFLOP/s,
//   3. GEMV (m = 1) over 256 MiB of bf16 weights (n = 16384, k = 8192): GB/s of weights read and
//      fraction of the copy bandwidth,
//   4. t(GEMM m) / t(GEMV) for m = 1..16 on the same weights, re-read from memory every call
//      (256 MiB: 64x the 4 MiB of L2; the host's shared L3 is not dedicated to this VM),
//      with the default fp32 activations and with the opt-in bf16 and split-bf16 (bf16x2) activations
//      (AMX when available),
//   5. the same ratios on the portable path (m = 1, 4, 16) for reference,
//   6. OpenBLAS sgemm/sgemv on fp32 weights of the same shape when libopenblas-dev is installed
//      (bench-only: native/bench/openblas_sgemm.cc compiled into native/build/bench/),
//   7. the memory-bound elementwise kernels (RMSNorm, RoPE, SwiGLU, softmax, argmax, top-p mask,
//      bf16<->f32) on arrays far beyond cache: GB/s of bytes read + written, as a fraction of the copy
//      bandwidth (their limit).
// Attention, MLA, KDA and MoE have their own benches (native/bench/attention.mjs, kda_moe.mjs),
// which `npm run bench:kernels` runs after this one.
// Times are the minimum over repetitions (the machine may be shared), in milliseconds.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import {
  applyRope,
  argmax,
  bf16ToF32,
  f32ToBf16,
  gemmBf16,
  isa,
  packBf16Weights,
  parallelCopy,
  rmsNorm,
  setIsa,
  softmax,
  swiglu,
  topPMask,
} from '@specd/native';

const quick = process.argv.includes('--quick');
const reps = quick ? 3 : 7;

function minTimeMs(fn, repetitions = reps) {
  fn(); // warm-up (page faults, caches)
  let best = Infinity;
  for (let r = 0; r < repetitions; r++) {
    const t0 = process.hrtime.bigint();
    fn();
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e6);
  }
  return best;
}

function randomBf16(count, seed) {
  const out = new Uint16Array(count);
  let s = seed >>> 0;
  for (let i = 0; i < count; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = 0x3c00 | ((s >>> 16) & 0x83ff); // |w| in [2^-7, 2^-6), random sign
  }
  return out;
}

const info = isa();
console.log(
  `# specd kernels bench — isa ${info.isa}, amx ${info.amxAvailable}, threads ${info.threads}, node ${process.version}`,
);

// 1. Copy bandwidth.
const copyFloats = (quick ? 32 : 64) << 20;
const src = new Float32Array(copyFloats).fill(1);
const dst = new Float32Array(copyFloats);
const copyMs = minTimeMs(() => parallelCopy(dst, src));
const copyGBs = (2 * copyFloats * 4) / copyMs / 1e6;
console.log(`copy: ${(copyFloats * 4) >> 20} MiB x2 in ${copyMs.toFixed(2)} ms = ${copyGBs.toFixed(1)} GB/s`);

// 2. Cache-resident GEMM rate.
{
  const [n, k, m] = [1024, 1024, 16];
  const w = packBf16Weights(randomBf16(n * k, 1), n, k);
  const x = new Float32Array(m * k).fill(0.25);
  const y = new Float32Array(m * n);
  const inner = 20;
  for (const act of ['f32', 'bf16', 'bf16x2']) {
    const ms =
      minTimeMs(() => {
        for (let i = 0; i < inner; i++) gemmBf16(x, m, w, y, act);
      }) / inner;
    console.log(
      `gemm cached n=k=${n} m=${m} ${act} activations: ${(ms * 1000).toFixed(0)}` +
        ` us = ${((2 * m * n * k) / ms / 1e6).toFixed(0)} GFLOP/s`,
    );
  }
}

// 3-5. Big weights.
const [N, K] = quick ? [8192, 4096] : [16384, 8192];
const wBytes = N * K * 2;
const W = packBf16Weights(randomBf16(N * K, 2), N, K);
const X = new Float32Array(16 * K).map((_, i) => ((i * 7919) % 1000) / 1000 - 0.5);
const Y = new Float32Array(16 * N);
const run = (m, act = 'f32') => gemmBf16(X.subarray(0, m * K), m, W, Y.subarray(0, m * N), act);

const rows = [];
const t1 = minTimeMs(() => run(1));
const b1 = minTimeMs(() => run(1, 'bf16'));
const s1 = minTimeMs(() => run(1, 'bf16x2'));
const gemvGBs = wBytes / t1 / 1e6;
console.log(
  `gemv n=${N} k=${K} (${wBytes >> 20} MiB bf16): ${t1.toFixed(2)} ms = ` +
    `${gemvGBs.toFixed(1)} GB/s = ${((100 * gemvGBs) / copyGBs).toFixed(0)}% of copy bandwidth`,
);
console.log(
  '\n| m | f32 act: t (ms) | t(m)/t(1) | GFLOP/s | bf16 act' +
    `${info.amxAvailable ? ' (AMX)' : ''}: t (ms) | t(m)/t(1) | GFLOP/s | bf16x2 act: t (ms) | t(m)/t(1) | ` +
    't(m)/t_f32(1) |',
);
console.log('|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
const gflops = (m, t) => ((2 * m * N * K) / t / 1e6).toFixed(0);
for (let m = 1; m <= 16; m++) {
  const t = m === 1 ? t1 : minTimeMs(() => run(m));
  const b = m === 1 ? b1 : minTimeMs(() => run(m, 'bf16'));
  const sp = m === 1 ? s1 : minTimeMs(() => run(m, 'bf16x2'));
  rows.push([m, t]);
  console.log(
    `| ${m} | ${t.toFixed(2)} | ${(t / t1).toFixed(2)} | ${gflops(m, t)} ` +
      `| ${b.toFixed(2)} | ${(b / b1).toFixed(2)} | ${gflops(m, b)} ` +
      `| ${sp.toFixed(2)} | ${(sp / s1).toFixed(2)} | ${(sp / t1).toFixed(2)} |`,
  );
}

setIsa('portable');
const p1 = minTimeMs(() => run(1), 2);
const portable = [1, 4, 16].map((m) => [m, m === 1 ? p1 : minTimeMs(() => run(m), 2)]);
setIsa('auto');
console.log(
  `\nportable path: ${portable.map(([m, t]) => `m=${m} ${t.toFixed(1)} ms (x${(t / p1).toFixed(2)})`).join(', ')}`,
);

// 6. OpenBLAS (optional, bench-only).
const cblas = '/usr/include/x86_64-linux-gnu/cblas.h';
if (!existsSync(cblas)) {
  console.log('\nopenblas: skipped (apt-get install libopenblas-dev to compare)');
} else {
  const here = fileURLToPath(new URL('.', import.meta.url));
  const outDir = fileURLToPath(new URL('../build/bench/', import.meta.url));
  mkdirSync(outDir, { recursive: true });
  const exe = `${outDir}openblas_sgemm`;
  execFileSync('g++', ['-O2', `${here}openblas_sgemm.cc`, '-lopenblas', '-o', exe]);
  const lines = execFileSync(exe, [String(N), String(K), String(quick ? 2 : 4)], {
    encoding: 'utf8',
    env: { ...process.env, OPENBLAS_NUM_THREADS: String(info.threads) },
  })
    .trim()
    .split('\n');
  console.log(`\n${lines[0]} (same n, k as above; sgemv for m = 1, sgemm otherwise)`);
  console.log('| m | openblas t (ms) | t(m)/t(1) | GFLOP/s | specd t (ms) |\n|---:|---:|---:|---:|---:|');
  for (const line of lines.slice(1)) {
    const [m, t, ratio, gflops] = line.split(' ');
    const ours = rows.find(([mm]) => mm === Number(m));
    console.log(
      `| ${m} | ${Number(t).toFixed(2)} | ${Number(ratio).toFixed(2)} | ` +
        `${Number(gflops).toFixed(0)} | ${ours ? ours[1].toFixed(2) : ''} |`,
    );
  }
}

// 7. Memory-bound elementwise kernels: bytes read + written per call over the copy bandwidth.
{
  const rowsOf = (floats, dim) => Math.floor(floats / dim);
  const F = (quick ? 16 : 32) << 20; // floats per input array (64 / 128 MiB)
  const a = new Float32Array(F).map((_, i) => ((i * 2654435761) >>> 0) / 4294967296 - 0.5);
  const b = new Float32Array(F).map((_, i) => ((i * 40503) % 1000) / 1000 - 0.5);
  const o = new Float32Array(F);
  const dim = 2048;
  const vocab = 32768;
  const w = new Float32Array(dim).fill(1);
  const pos = Int32Array.from({ length: rowsOf(F, 16 * 128) }, (_, i) => i);
  const u16 = new Uint16Array(F);
  const cases = [
    ['rmsNorm [rows, 2048]', () => rmsNorm(a, w, 1e-5, o), 2 * F * 4],
    [
      'applyRope neox [tokens, 16 heads, 128]',
      () => applyRope(a, pos, { heads: 16, headDim: 128, theta: 10000, style: 'neox' }, o),
      2 * F * 4,
    ],
    ['swiglu (gate, up → out)', () => swiglu(a, b, o), 3 * F * 4],
    ['softmax [rows, 32768]', () => softmax(a, vocab, 1, o), 2 * F * 4],
    ['argmax [rows, 32768]', () => argmax(a, vocab), F * 4],
    [
      'topPMask p = 0.9 [rows, 32768]',
      () => topPMask(a.subarray(0, 256 * vocab), vocab, 0.9, o.subarray(0, 256 * vocab)),
      2 * 256 * vocab * 4,
    ],
    ['f32ToBf16', () => f32ToBf16(a, u16), F * 6],
    ['bf16ToF32', () => bf16ToF32(u16, o), F * 6],
  ];
  console.log(
    `\n| elementwise kernel (${(F * 4) >> 20} MiB f32 input) | t (ms) | GB/s (read + written) | of copy bandwidth |`,
  );
  console.log('|---|---:|---:|---:|');
  for (const [name, fn, bytes] of cases) {
    const t = minTimeMs(fn, quick ? 2 : 4);
    console.log(
      `| ${name} | ${t.toFixed(2)} | ${(bytes / t / 1e6).toFixed(1)}` +
        ` | ${((100 * bytes) / t / 1e6 / copyGBs).toFixed(0)} % |`,
    );
  }
}
