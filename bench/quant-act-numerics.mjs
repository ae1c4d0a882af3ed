#!/usr/bin/env node
// Where the error of reduced-precision activations in the quantized GEMM comes from, on SmolLM2-135M-Instruct Q4_1
// against the PyTorch goldens (test/goldens-smollm2; the metrics of packages/model-llama/test/goldens.test.ts:
// relative L2 error of the residual entering every layer, last 4 positions, worst over layers; of the last logits;
// argmax differences over all positions). docs/BENCHMARKS.md, "int16 activations".
//
//   node bench/quant-act-numerics.mjs            end to end: one scheme on some projection kinds, the rest fp32 (~30 s)
//   node bench/quant-act-numerics.mjs --local    per projection kind: relative error of one GEMM against fp32
//                                                activations, on the fp32 model's own activations (~30 s)
//
// Projection kinds: qkv (fused q/k/v), o, gateup (fused gate/up), down, head (the tied Q8_0 lm_head).
// Schemes: `int8`, `int16` (gemmQuant act, native); `fake:<sub>[o<outliers>][w]`: activations rounded in JavaScript,
// then the fp32-activation GEMM — blocks of 32 split into sub-blocks of <sub> with their own scale max|x|/127,
// optionally the <outliers> largest |x| of each 32-block kept exact (the scale from the rest), `w` = 16-bit quants
// (scale max|x|/32767). fake:32 is the int8 scheme up to fp32 rounding.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { GgufFile, SafetensorsFile, SequenceCache } from '@specd/core';
import { ggufSource, loadLlamaStage, parseGgufLlamaConfig } from '@specd/model-llama';
import { argmax } from '@specd/native';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const GGUF = path.join(ROOT, 'models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf');
const GOLDENS = path.join(ROOT, 'test/goldens-smollm2');
if (!fs.existsSync(GGUF)) throw new Error(`quant-act-numerics: ${GGUF} is missing: run \`npm run models:fetch\``);
const index = JSON.parse(fs.readFileSync(path.join(GOLDENS, 'index.json'), 'utf8'));
const goldens = Object.entries(index.goldens).map(([name, g]) => {
  const f = SafetensorsFile.open(path.join(GOLDENS, g.file));
  const tensors = new Map();
  for (const t of f.names()) tensors.set(t, f.read(t).data);
  f.close();
  return { name, ids: Int32Array.from(tensors.get('input_ids')), tensors };
});
const KINDS = ['qkv', 'o', 'gateup', 'down', 'head'];

function relError(a, b) {
  let num = 0;
  let den = 0;
  for (let i = 0; i < a.length; i++) {
    num += (a[i] - b[i]) ** 2;
    den += b[i] ** 2;
  }
  return Math.sqrt(num / den);
}

/** Projection kind of a `linear` call by its first Hugging Face tensor name. */
function kindOf(names) {
  const n = names[0];
  if (n.includes('q_proj')) return 'qkv';
  if (n.includes('o_proj')) return 'o';
  if (n.includes('gate_proj')) return 'gateup';
  if (n.includes('down_proj')) return 'down';
  return 'head';
}

const roundEven = (v) => (Math.abs(v - Math.trunc(v)) === 0.5 ? 2 * Math.round(v / 2) : Math.round(v));

/** `fake:<sub>[o<outliers>][w]` -> { sub, outliers, qmax }. */
function parseFake(scheme) {
  const m = /^fake:(\d+)(?:o(\d+))?(w?)$/.exec(scheme);
  if (m === null) throw new Error(`quant-act-numerics: bad scheme ${scheme}`);
  return { sub: Number(m[1]), outliers: Number(m[2] ?? 0), qmax: m[3] === 'w' ? 32767 : 127 };
}

/** x [m, k] with every activation rounded as the scheme says (the dequantized values, f32). */
function fakeQuant(x, m, k, { sub, outliers, qmax }) {
  const y = new Float32Array(x.length);
  for (let r = 0; r < m; r++)
    for (let b0 = 0; b0 < k; b0 += 32) {
      const base = r * k + b0;
      const keep = new Set();
      if (outliers > 0) {
        const order = Array.from({ length: 32 }, (_, j) => j).sort(
          (a, c) => Math.abs(x[base + c]) - Math.abs(x[base + a]),
        );
        for (let o = 0; o < outliers; o++) keep.add(order[o]);
      }
      for (let s0 = 0; s0 < 32; s0 += sub) {
        let amax = 0;
        for (let j = s0; j < s0 + sub; j++) if (!keep.has(j)) amax = Math.max(amax, Math.abs(x[base + j]));
        const d = Math.fround(amax / qmax);
        for (let j = s0; j < s0 + sub; j++)
          y[base + j] = keep.has(j) ? x[base + j] : d === 0 ? 0 : d * roundEven(x[base + j] / d);
      }
    }
  return y;
}

const file = GgufFile.open(GGUF);
const sources = Object.fromEntries(
  ['f32', 'int8', 'int16'].map((act) => [act, ggufSource(file, 'quant', undefined, undefined, act)]),
);

/** The linear of `names` under `scheme`. */
function linearOf(scheme, names, rows, k) {
  if (!scheme.startsWith('fake:')) return sources[scheme].linear(names, rows, k);
  const w = sources.f32.linear(names, rows, k);
  const fake = parseFake(scheme);
  return { n: w.n, k: w.k, apply: (x, m) => w.apply(fakeQuant(x, m, k, fake), m) };
}

/** Goldens metrics of a model: worst per-layer error, logits error, argmax differences (all goldens). */
function measure(model) {
  let worst = 0;
  let logits = 0;
  let diffs = 0;
  let positions = 0;
  for (const g of goldens) {
    const { numLayers: L, hiddenSize: D, vocabSize: V } = model.info;
    const T = g.ids.length;
    const cache = new SequenceCache(model.cacheGeometry, {
      pageSize: 16,
      numPages: Math.ceil(T / 16) + 1,
      numSlots: 1,
    });
    cache.add('g');
    const r = model.forward({ sequences: [{ id: 'g', position: 0, tokens: g.ids, logits: 'all' }] }, cache, {
      taps: Array.from({ length: L + 1 }, (_, i) => i),
    });
    const last = Math.min(T, 4);
    for (let i = 0; i <= L; i++)
      worst = Math.max(
        worst,
        relError(r.taps.get(i).subarray((T - last) * D, T * D), g.tensors.get(`hidden_last.${i}`)),
      );
    const ref = g.tensors.get('logits.last');
    logits = Math.max(logits, relError(r.logits.subarray(T * V - ref.length), ref));
    const refArgmax = g.tensors.get('argmax');
    diffs += [...argmax(r.logits, V)].filter((a, t) => a !== refArgmax[t]).length;
    positions += T;
  }
  return { worst, logits, diffs, positions };
}

if (process.argv.includes('--local')) {
  const schemes = ['int8', 'int16', 'fake:16', 'fake:8', 'fake:32o1', 'fake:32o2', 'fake:16o1'];
  const stats = new Map(); // `${kind} ${scheme}` -> { max, sum, n }
  const peak = new Map(); // kind -> max over calls of max|x| / rms(x)
  const src = {
    ...sources.f32,
    linear(names, rows, k) {
      const kind = kindOf(names);
      const ref = sources.f32.linear(names, rows, k);
      const others = schemes.map((s) => [s, linearOf(s, names, rows, k)]);
      return {
        n: ref.n,
        k: ref.k,
        apply(x, m) {
          const y = ref.apply(x, m);
          for (const [s, w] of others) {
            const e = relError(w.apply(x, m), y);
            const st = stats.get(`${kind} ${s}`) ?? { max: 0, sum: 0, n: 0 };
            stats.set(`${kind} ${s}`, { max: Math.max(st.max, e), sum: st.sum + e, n: st.n + 1 });
          }
          let amax = 0;
          let ss = 0;
          for (const v of x) {
            amax = Math.max(amax, Math.abs(v));
            ss += v * v;
          }
          peak.set(kind, Math.max(peak.get(kind) ?? 0, amax / Math.sqrt(ss / x.length)));
          return y;
        },
      };
    },
  };
  const model = loadLlamaStage(parseGgufLlamaConfig(file), src);
  measure(model);
  model.dispose();
  console.log('Relative error of one GEMM against fp32 activations, mean / max over the calls of the 5 goldens');
  console.log(`| kind | max\\|x\\|/rms | ${schemes.join(' | ')} |\n|---|---:|${schemes.map(() => '---:|').join('')}`);
  for (const kind of KINDS) {
    const cells = schemes.map((s) => {
      const st = stats.get(`${kind} ${s}`);
      return `${(st.sum / st.n).toExponential(1)} / ${st.max.toExponential(1)}`;
    });
    console.log(`| ${kind} | ${peak.get(kind).toFixed(0)} | ${cells.join(' | ')} |`);
  }
} else {
  const runs = [
    ['f32', KINDS],
    ['int8', KINDS],
    ...KINDS.map((k) => ['int8', [k]]),
    ['int8', KINDS.filter((k) => k !== 'down')],
    ['int8', KINDS.filter((k) => k !== 'qkv')],
    ['fake:16', KINDS],
    ['fake:8', KINDS],
    ['fake:32o1', KINDS],
    ['fake:32o2', KINDS],
    ['fake:16o1', KINDS],
    ['fake:32w', KINDS],
    ['int16', KINDS],
  ];
  console.log(
    '| scheme | on | worst per-layer rel. error | logits rel. error | argmax differs |\n|---|---|---:|---:|---:|',
  );
  for (const [scheme, kinds] of runs) {
    const src = {
      ...sources.f32,
      linear: (names, rows, k) => linearOf(kinds.includes(kindOf(names)) ? scheme : 'f32', names, rows, k),
    };
    const model = loadLlamaStage(parseGgufLlamaConfig(file), src);
    const r = measure(model);
    model.dispose();
    console.log(
      `| ${scheme} | ${kinds.length === KINDS.length ? 'all' : kinds.join(', ')} | ${r.worst.toExponential(2)} | ` +
        `${r.logits.toExponential(2)} | ${r.diffs} of ${r.positions} |`,
    );
  }
}
