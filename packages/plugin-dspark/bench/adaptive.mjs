#!/usr/bin/env node
// Adaptive verification with DSpark (issue: DSpark adaptive verification): output tokens/s of the
// engine's default 'cost' policy — cost-based draft length + survival verify budgets from the
// confidence head (engine/draft-policy.ts) — against every fixed budget k = 1 … 7
// (fixedDraftPolicy(k): draft and verify k every step), at 1, 2, 4, 8 concurrent requests, greedy,
// measured in ONE run; prints adaptive / best fixed per load.
//
//   npm run bench:adaptive                               (root; run `npm run build` first)
//   node packages/plugin-dspark/bench/adaptive.mjs [--prompts N] [--tokens N] [--conc 1,2,4,8] [--reps N] [--json FILE]
//
// Also reported (context, not part of the ratio): plain decoding (no drafter) and "survival@7" —
// always draft the block (7) and verify only the survival budget (λ from the cost policy), which
// isolates the budget rule from the draft-length choice. Every cell is the median of `--reps`
// (default 3) runs; within a repetition the modes run in a rotated order (the VM is shared). The
// cost-policy engines (calibration before the timer) are kept across repetitions, as a server keeps
// its engine. Greedy outputs of every mode are checked equal to plain decoding's.
import * as fs from 'node:fs';
import { cpus, loadavg } from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { CostDraftPolicy, HfConfig, SafetensorsCheckpoint, SpecEngine, fixedDraftPolicy } from '@specd/core';
import { loadKimiStage } from '@specd/model-kimi-k3';
import { isa } from '@specd/native';
import { dsparkPlugin } from '@specd/plugin-dspark';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const NPROMPTS = Number(arg('prompts', '8'));
const NEW = Number(arg('tokens', '48'));
const CONCS = arg('conc', '1,2,4,8').split(',').map(Number);
const REPS = Number(arg('reps', '3'));
const jsonOut = arg('json', undefined);
const load = () => loadavg()[0];

const T = path.join(ROOT, 'models/kimi-k3-tiny');
const D = path.join(ROOT, 'models/kimi-k3-tiny-dspark');
const tw = SafetensorsCheckpoint.open(T);
const target = loadKimiStage({ dir: T, config: HfConfig.read(T), weights: tw });
tw.close();
const maxSeq = Math.max(...CONCS);
const dw = SafetensorsCheckpoint.open(D);
const drafter = await dsparkPlugin.load(
  { dir: D, config: HfConfig.read(D), weights: dw },
  { target, maxSequences: maxSeq, maxTokensPerSequence: 4096 },
);
dw.close();
const K = drafter.maxDraftTokens;

const read = (name) =>
  fs
    .readFileSync(path.join(ROOT, 'test/prompts', `${name}.jsonl`), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
const half = Math.ceil(NPROMPTS / 2);
const prompts = [...read('prose').slice(0, half), ...read('code').slice(0, NPROMPTS - half)];
const requests = () =>
  prompts.map((p, i) => ({
    id: p.id,
    promptIds: Int32Array.from(p.prompt_token_ids),
    maxTokens: NEW,
    sampling: { temperature: 0 },
    seed: 1000 + i,
    ignoreEos: true,
  }));

/** "survival@K": the cost policy's λ (its choose sets it), but always the whole block drafted. */
function survivalAtMax(costs) {
  const cost = new CostDraftPolicy(costs, { exploreEvery: 0 });
  return {
    choose: (cs) => {
      cost.choose(cs);
      return cs.map((c) => c.maxDrafts);
    },
    budgets: (items) => cost.budgets(items),
    observe: (id, drafted, accepted) => cost.observe(id, drafted, accepted),
    observeOverhead: (ms, drafted) => cost.observeOverhead(ms, drafted),
    release: (id) => cost.release(id),
  };
}

const kept = new Map();
function engine(C, mode) {
  const opts = { maxSequences: C, maxTokensPerSequence: 4096 };
  if (mode === 'plain') return new SpecEngine(target, undefined, opts);
  if (typeof mode === 'number')
    return new SpecEngine(target, drafter, { ...opts, draftPolicy: fixedDraftPolicy(mode) });
  let e = kept.get(`${C}|${mode}`);
  if (e === undefined) {
    if (mode === 'adaptive') {
      e = new SpecEngine(target, drafter, { ...opts, draftPolicy: 'cost' });
      e.calibrate();
    } else {
      const costs = engine(C, 'adaptive').stepCosts; // calibrated once per C
      e = new SpecEngine(target, drafter, { ...opts, draftPolicy: survivalAtMax(costs) });
    }
    kept.set(`${C}|${mode}`, e);
  }
  return e;
}

function run(C, mode) {
  const e = engine(C, mode);
  const m0 = {
    d: e.metrics.drafted,
    a: e.metrics.accepted,
    v: e.metrics.verifySteps,
    u: e.metrics.unverified,
    h: e.metrics.budgetHistogram,
  };
  const t0 = performance.now();
  const rs = e.run(requests());
  const s = (performance.now() - t0) / 1000;
  const m = e.metrics;
  const out = rs.reduce((a, r) => a + r.tokenIds.length, 0);
  const h = m.budgetHistogram.map((c, i) => c - (m0.h[i] ?? 0));
  const steps = m.verifySteps - m0.v;
  return {
    tokPerS: out / s,
    outputs: new Map(rs.map((r) => [r.id, r.tokenIds.join()])),
    tau: (m.accepted - m0.a + steps) / Math.max(1, steps),
    verified: m.drafted - m0.d,
    unverified: m.unverified - m0.u,
    steps,
    budgetHistogram: h,
  };
}

const info = isa();
console.log(
  `bench:adaptive — DSpark (block ${K}), ${prompts.length} prompts × ${NEW} tokens, greedy, ` +
    `threads ${info.threads}, isa ${info.isa}, ${cpus().length} vCPUs, load ${load().toFixed(2)}`,
);
run(1, 'plain'); // warm-up
const modes = ['plain', 'adaptive', 'survival', ...Array.from({ length: K }, (_, i) => i + 1)];
const rows = [];
for (const C of CONCS) {
  engine(C, 'adaptive'); // calibration, before the timers
  const res = new Map(modes.map((mo) => [mo, []]));
  for (let r = 0; r < REPS; r++) {
    const order = modes.map((_, i) => modes[(i + r * 3) % modes.length]);
    for (const mo of order) res.get(mo).push(run(C, mo));
  }
  // the median run by tok/s; of an even count the faster of the two middle runs (every policy's alike)
  const med = (xs) => [...xs].sort((a, b) => a.tokPerS - b.tokPerS)[xs.length >> 1];
  const cell = new Map([...res].map(([mo, xs]) => [mo, med(xs)]));
  const plain = cell.get('plain');
  for (const [mo, c] of cell) {
    for (const [id, toks] of plain.outputs)
      if (c.outputs.get(id) !== toks)
        throw new Error(`bench:adaptive: greedy output of ${mo} differs from plain at C=${C} (${id})`);
  }
  const fixed = Array.from({ length: K }, (_, i) => cell.get(i + 1).tokPerS);
  const bestK = fixed.indexOf(Math.max(...fixed)) + 1;
  const a = cell.get('adaptive');
  const sv = cell.get('survival');
  const hist = (xs) =>
    xs.reduce((acc, x) => acc.map((v, i) => v + (x.budgetHistogram[i] ?? 0)), new Array(K + 1).fill(0));
  const row = {
    C,
    plain: plain.tokPerS,
    adaptive: a.tokPerS,
    survival: sv.tokPerS,
    fixed,
    bestK,
    best: fixed[bestK - 1],
    ratio: a.tokPerS / fixed[bestK - 1],
    adaptiveTau: a.tau,
    adaptiveVerifiedPerStep: a.verified / Math.max(1, a.steps),
    adaptiveUnverified: a.unverified,
    adaptiveBudgets: hist(res.get('adaptive')),
    survivalBudgets: hist(res.get('survival')),
    survivalTau: sv.tau,
    lambda: engine(C, 'adaptive').policy?.threshold,
    load1: load(),
  };
  rows.push(row);
  console.log(
    `C=${C}: plain ${row.plain.toFixed(1)}, adaptive ${row.adaptive.toFixed(1)} (τ ` +
      `${a.tau.toFixed(3)}, verified/step ${row.adaptiveVerifiedPerStep.toFixed(2)}), ` +
      `survival@${K} ${row.survival.toFixed(1)} (τ ${sv.tau.toFixed(3)}), fixed ` +
      `${fixed.map((x) => x.toFixed(1)).join(' ')} tok/s; best fixed k=${bestK}; ` +
      `adaptive/best ${row.ratio.toFixed(3)}; load ${row.load1.toFixed(2)}`,
  );
  console.log(
    `  budget histograms (steps by verified drafts 0..${K}, all reps): adaptive ` +
      `${JSON.stringify(row.adaptiveBudgets)}, survival@${K} ${JSON.stringify(row.survivalBudgets)}`,
  );
}

console.log(
  '\n| requests | plain | adaptive (cost + survival) | ' +
    `${Array.from({ length: K }, (_, i) => `k=${i + 1}`).join(' | ')}` +
    ` | best fixed | adaptive / best fixed | survival@${K} |`,
);
console.log(`|---:|---:|---:|${'---:|'.repeat(K)}---:|---:|---:|`);
for (const r of rows) {
  console.log(
    `| ${r.C} | ${r.plain.toFixed(1)} | ${r.adaptive.toFixed(1)} | ` +
      `${r.fixed.map((x) => x.toFixed(1)).join(' | ')} | k=${r.bestK}` +
      ` | ${r.ratio.toFixed(3)} | ${r.survival.toFixed(1)} |`,
  );
}
console.log(`\nload at the end ${load().toFixed(2)}`);
if (jsonOut)
  fs.writeFileSync(
    jsonOut,
    `${JSON.stringify({ threads: info.threads, isa: info.isa, prompts: prompts.length, newTokens: NEW, rows })}\n`,
  );
drafter.dispose();
target.dispose();
