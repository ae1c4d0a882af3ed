#!/usr/bin/env node
// Numerics of the cross-stage partial projection (REFERENCE.md §8): the drafter's context
// projection Σ_i h_i·W_iᵀ over its taps computed
//   (a) as ONE projection of the concatenated taps [h_1 | … | h_n] · fcᵀ (one fp32 sum over n·D),
//   (b) as per-stage partials h_i·W_iᵀ summed in fp32 (what specd does across stages),
//   (c) as per-stage partials rounded to bf16 before the sum (what an engine that ships bf16 partials does),
// against a float64 reference, on real taps: the shipped target (models/kimi-k3-tiny) over held-out
// prose and code prompts, the shipped DFlash drafter's fc (taps 1, 3, 5, 7). Relative error per row
// ‖out − ref‖ / ‖ref‖; prints the distribution (median, p90, p99, max) of each.
//
//   node bench/projection-numerics.mjs [--prompts N]
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { HfConfig, SafetensorsCheckpoint, SequenceCache, WeightReader } from '@specd/core';
import { loadKimiFromDir } from '@specd/model-kimi-k3';
import { bf16ToF32, f32ToBf16, gemmBf16, packBf16Weights } from '@specd/native';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const N = Number(argv[argv.indexOf('--prompts') + 1] ?? 8) || 8;
const target = loadKimiFromDir(path.join(ROOT, 'models/kimi-k3-tiny'));
const DDIR = path.join(ROOT, 'models/kimi-k3-tiny-dflash');
const cfg = HfConfig.read(DDIR);
const taps = cfg
  .section('dflash_config')
  .requireIntArray('target_layer_ids')
  .map((t) => t + 1);
const D = target.info.hiddenSize;
const w = SafetensorsCheckpoint.open(DDIR);
const fc = new WeightReader(w).bf16('fc.weight', [D, taps.length * D]);
w.close();
const fc64 = Float64Array.from(bf16ToF32(fc));
const K = taps.length * D;
const read = (n) =>
  fs
    .readFileSync(path.join(ROOT, 'test/prompts', `${n}.jsonl`), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
const prompts = [...read('prose').slice(0, N / 2), ...read('code').slice(0, N / 2)];

const fcFull = packBf16Weights(fc, D, K);
const fcBlocks = taps.map((_, i) => {
  const b = new Uint16Array(D * D);
  for (let r = 0; r < D; r++) b.set(fc.subarray(r * K + i * D, r * K + (i + 1) * D), r * D);
  return packBf16Weights(b, D, D);
});

const errs = { concat: [], fp32: [], bf16: [] };
let rows = 0;
for (const p of prompts) {
  const ids = Int32Array.from(p.prompt_token_ids);
  const T = ids.length;
  const cache = new SequenceCache(target.cacheGeometry, { pageSize: 16, numPages: Math.ceil(T / 16) + 1, numSlots: 1 });
  cache.add('x');
  const r = target.forward({ sequences: [{ id: 'x', position: 0, tokens: ids, logits: 'none' }] }, cache, { taps });
  cache.finish('x');
  const hs = taps.map((t) => r.taps.get(t));
  const x = new Float32Array(T * K);
  for (let t = 0; t < T; t++)
    hs.forEach((h, i) => {
      x.set(h.subarray(t * D, (t + 1) * D), t * K + i * D);
    });
  const concat = gemmBf16(x, T, fcFull);
  const parts = fcBlocks.map((b, i) => gemmBf16(hs[i], T, b));
  const fp32 = new Float32Array(T * D);
  const bf = new Float32Array(T * D);
  for (const part of parts) {
    const rounded = bf16ToF32(f32ToBf16(part));
    for (let e = 0; e < fp32.length; e++) {
      fp32[e] = fp32[e] + part[e];
      bf[e] = bf[e] + rounded[e];
    }
  }
  for (let t = 0; t < T; t++) {
    const ref = new Float64Array(D);
    for (let o = 0; o < D; o++) {
      let s = 0;
      const wr = o * K;
      const xr = t * K;
      for (let k = 0; k < K; k++) s += x[xr + k] * fc64[wr + k];
      ref[o] = s;
    }
    let den = 0;
    for (let o = 0; o < D; o++) den += ref[o] ** 2;
    const rel = (out) => {
      let num = 0;
      for (let o = 0; o < D; o++) num += (out[t * D + o] - ref[o]) ** 2;
      return Math.sqrt(num / den);
    };
    errs.concat.push(rel(concat));
    errs.fp32.push(rel(fp32));
    errs.bf16.push(rel(bf));
  }
  rows += T;
}
const q = (xs, f) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(f * xs.length))];
console.log(
  `projection numerics: ${prompts.length} prompts, ${rows} rows, ` +
    `taps [${taps.join(', ')}], hidden ${D}, fc [${D}, ${K}] bf16`,
);
console.log('\n| projection | median | p90 | p99 | max |');
console.log('|---|---:|---:|---:|---:|');
for (const [name, label] of [
  ['concat', 'one projection of the concatenated taps (fp32)'],
  ['fp32', 'per-tap partials accumulated in fp32, ascending taps (specd, every pp)'],
  ['bf16', 'per-stage partials rounded to bf16, then summed'],
]) {
  const xs = errs[name];
  console.log(
    `| ${label} | ${q(xs, 0.5).toExponential(2)} | ${q(xs, 0.9).toExponential(2)} ` +
      `| ${q(xs, 0.99).toExponential(2)} | ${Math.max(...xs).toExponential(2)} |`,
  );
}
target.dispose();
