#!/usr/bin/env node
// Activation precision of the Kimi dense GEMMs (KimiStageModel.gemmActivations: 'f32', 'bf16',
// 'bf16x2'), end to end, all variants in ONE process on the same loaded weights, alternated.
//
//   npm run bench:activations                        (kimi-k3-tiny + the synthetic large config)
//   node packages/model-kimi-k3/bench/activations.mjs --quick          (tiny only, fewer repeats)
//   ... --keep-synthetic DIR   (generate the 3.5 GB synthetic checkpoint into DIR once and reuse it)
//   ... --threads N            (compute pool; default 2)
//
// Per model and variant, at a context of 128 prompt tokens (one sequence):
//   t_step    one decode forward (1 token, logits of the last row)  -> decode tokens/s = 1000 / t_step
//   t_verify  one verify forward of 16 tokens with logits of all 16 (the engine's verify step)
// each undone by a cache checkpoint/rollback outside the timer. Every round runs the variants in a
// rotated order (f32, bf16, bf16x2 / bf16, bf16x2, f32 / ...), each forward timed once per round;
// the median over rounds is reported, so machine load hits every variant alike. The greedy token of
// each verify row is compared across variants (argmax agreement; identical bits are not expected).
// The goal printed at the end: the default on this CPU (defaultKimiActivations) is the fastest
// variant that holds the goldens (packages/model-kimi-k3/test/activations.test.ts), or within 3 %.
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { HfConfig, SafetensorsCheckpoint, SequenceCache } from '@specd/core';
import { argmax, isa, setNumThreads } from '@specd/native';

import { defaultKimiActivations, loadKimiStage } from '../dist/index.js';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const argv = process.argv.slice(2);
const quick = argv.includes('--quick');
const keepAt = argv.includes('--keep-synthetic') ? argv[argv.indexOf('--keep-synthetic') + 1] : undefined;
const threads = argv.includes('--threads') ? Number(argv[argv.indexOf('--threads') + 1]) : 2;
setNumThreads(threads);

const VARIANTS = ['f32', 'bf16', 'bf16x2'];
const CONTEXT = 128;
const BLOCK = 16;

let seed = 2024;
const randomTokens = (n, V) =>
  Int32Array.from({ length: n }, () => {
    seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
    return 3 + (seed % (V - 3));
  });

function loadModel(dir) {
  const weights = SafetensorsCheckpoint.open(dir);
  try {
    return loadKimiStage({ dir, config: HfConfig.read(dir), weights }, { kernels: 'native' });
  } finally {
    weights.close();
  }
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

/** Times decode and verify forwards per variant; returns {variant: {step, verify, rows}}. */
function measure(stage, rounds) {
  const V = stage.info.vocabSize;
  const cache = new SequenceCache(stage.cacheGeometry, {
    pageSize: 16,
    numPages: Math.ceil((CONTEXT + BLOCK + 16) / 16) + 2,
    numSlots: 1,
  });
  cache.add(0);
  stage.gemmActivations = 'f32';
  stage.forward(
    { sequences: [{ id: 0, position: 0, tokens: randomTokens(CONTEXT, V), logits: 'last', phase: 'prefill' }] },
    cache,
  );
  const block = randomTokens(BLOCK, V);
  const once = (k) => {
    const cp = cache.checkpoint(0);
    const t0 = performance.now();
    const out = stage.forward(
      {
        sequences: [
          { id: 0, position: cache.length(0), tokens: block.subarray(0, k), logits: k === 1 ? 'last' : 'all' },
        ],
      },
      cache,
    );
    const t = performance.now() - t0;
    cache.rollback(0, cp);
    return { t, logits: out.logits };
  };
  const res = Object.fromEntries(VARIANTS.map((v) => [v, { step: [], verify: [], rows: [] }]));
  for (const v of VARIANTS) {
    // warm-up: JIT, pool, AMX tile permission, first-touch of scratch
    stage.gemmActivations = v;
    for (let i = 0; i < 3; i++) {
      once(1);
      once(BLOCK);
    }
  }
  for (let r = 0; r < rounds; r++) {
    for (let j = 0; j < VARIANTS.length; j++) {
      const v = VARIANTS[(r + j) % VARIANTS.length];
      stage.gemmActivations = v;
      res[v].step.push(once(1).t);
      const verify = once(BLOCK);
      res[v].verify.push(verify.t);
      if (r === 0) res[v].rows = Array.from(argmax(verify.logits, V));
    }
  }
  cache.finish(0);
  return res;
}

function report(name, res) {
  const base = res.f32;
  const rounds = base.step.length;
  console.log(`\n### ${name}: ${CONTEXT}-token context, 1 sequence, ms: median (min) of ${rounds} rounds\n`);
  console.log(
    '| activations | t_step | decode tok/s | vs f32 (min) | t_verify(16) | verify tok/s | vs f32 (min) | ' +
      't_verify(16)/t_step | argmax = f32 |',
  );
  console.log('|---|---:|---:|---:|---:|---:|---:|---:|---:|');
  const out = {};
  const vs = (a, b) => `${(a / b).toFixed(2)}×`;
  for (const v of VARIANTS) {
    const step = median(res[v].step);
    const verify = median(res[v].verify);
    const stepMin = Math.min(...res[v].step);
    const verifyMin = Math.min(...res[v].verify);
    const agree = res[v].rows.filter((a, i) => a === base.rows[i]).length;
    out[v] = { step, verify };
    console.log(
      `| ${v} | ${step.toFixed(2)} (${stepMin.toFixed(2)}) | ${(1000 / step).toFixed(1)} | ` +
        `${vs(median(base.step), step)} (${vs(Math.min(...base.step), stepMin)}) | ` +
        `${verify.toFixed(2)} (${verifyMin.toFixed(2)}) | ${((1000 * BLOCK) / verify).toFixed(0)} | ` +
        `${vs(median(base.verify), verify)} (${vs(Math.min(...base.verify), verifyMin)}) | ` +
        `${(verify / step).toFixed(2)} | ${agree}/${BLOCK} |`,
    );
  }
  return out;
}

const info = isa();
console.log(
  `activations bench: ${cpus()[0]?.model ?? 'unknown CPU'}, path ${info.isa}, AMX ${info.amxAvailable}, ` +
    `${threads} threads, load ${loadavg()[0].toFixed(2)}, default ${defaultKimiActivations()}`,
);
const models = [['kimi-k3-tiny', join(ROOT, 'models/kimi-k3-tiny'), quick ? 9 : 41]];
let tmp;
if (!quick) {
  const { largeSyntheticConfig, writeSyntheticKimi } = await import(join(ROOT, 'bench/synthetic-kimi.mjs'));
  let dir = keepAt;
  if (dir === undefined || !existsSync(join(dir, 'config.json'))) {
    dir ??= tmp = mkdtempSync(join(tmpdir(), 'specd-act-'));
    writeSyntheticKimi(dir, largeSyntheticConfig());
  }
  models.push(['synthetic-large', dir, 15]);
}
const summary = [];
try {
  for (const [name, dir, rounds] of models) {
    const stage = loadModel(dir);
    summary.push([name, report(name, measure(stage, rounds))]);
    stage.dispose();
  }
} finally {
  if (tmp !== undefined) rmSync(tmp, { recursive: true, force: true });
}

const def = defaultKimiActivations();
console.log(`\nload ${loadavg()[0].toFixed(2)} at the end`);
for (const [name, r] of summary) {
  // the default must not lose to f32 (the variant it replaces) by more than 3 %, decode or verify
  const ok = r[def].step <= 1.03 * r.f32.step && r[def].verify <= 1.03 * r.f32.verify;
  console.log(
    `goal (${name}): default '${def}' at least as fast as f32 (±3 %), decode and verify: ` +
      `${ok ? 'met' : 'NOT met'} (decode ${(r.f32.step / r[def].step).toFixed(2)}×, ` +
      `verify ${(r.f32.verify / r[def].verify).toFixed(2)}×)`,
  );
}
