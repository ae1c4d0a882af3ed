#!/usr/bin/env node
// Speculative decoding speed (issue #4): output tokens/s with and without DFlash on the tiny target,
// at 1, 4 and 8 concurrent sequences, greedy and temperature 1, measured in ONE run, plus the
// ceiling from the measured step costs and the cost-based policy as a fraction of it.
//
//   npm run bench:spec                                   (root; run `npm run build` first)
//   node packages/plugin-dflash/bench/spec.mjs [--prompts N] [--tokens N] [--conc 1,4,8] [--reps N] [--json FILE] [--quick]
//
// Each (C, temperature) alternates plain and spec runs `--reps` times (default 3) and reports the
// medians (the VM is shared: single runs of ~1 s varied by ±30% under load).
// Prompts: the first N/2 of test/prompts/prose.jsonl and of code.jsonl (held out), N = 16 by
// default, `--tokens` new tokens each (default 64), EOS ignored. For every concurrency C and
// temperature: plain = SpecEngine without a drafter (blocks of one token), spec = SpecEngine with
// DFlash and the cost-based draft policy (draftPolicy 'cost'; its calibration runs before the
// timer); speed-up = spec tok/s / plain tok/s. τ in both definitions (glossary: tauPerStep,
// tauMeanOfRequests; k = 0 steps count as verify steps committing 1 token).
// Ceiling (1 sequence, greedy): fixed-k runs give τ(k); with the calibrated costs
//   ceiling(k) = τ(k) · t_step / (t_draft(k) + t_verify(k))     (REFERENCE.md §11)
// and the adaptive policy's speed-up is reported as a fraction of max_k ceiling(k) (k = 0: 1.0).
import * as fs from 'node:fs';
import { cpus, loadavg } from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { HfConfig, SafetensorsCheckpoint, SpecEngine, fixedDraftPolicy } from '@specd/core';
import { loadKimiStage } from '@specd/model-kimi-k3';
import { isa } from '@specd/native';
import { dflashPlugin } from '@specd/plugin-dflash';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const quick = argv.includes('--quick');
const NPROMPTS = Number(arg('prompts', quick ? '8' : '16'));
const NEW = Number(arg('tokens', quick ? '32' : '64'));
const CONCS = arg('conc', '1,4,8').split(',').map(Number);
const FIXED_KS = [1, 2, 3, 4, 6, 8, 11, 15];
const REPS = Number(arg('reps', quick ? '1' : '3')); // plain / spec runs alternate; medians are reported
const jsonOut = arg('json', undefined);

function machineLoad() {
  const [l1, l5] = loadavg();
  return { load1: l1, load5: l5 };
}

const T = path.join(ROOT, 'models/kimi-k3-tiny');
const D = path.join(ROOT, 'models/kimi-k3-tiny-dflash');
const tw = SafetensorsCheckpoint.open(T);
const target = loadKimiStage({ dir: T, config: HfConfig.read(T), weights: tw });
tw.close();
const maxSeq = Math.max(...CONCS);
const dw = SafetensorsCheckpoint.open(D);
const drafter = await dflashPlugin.load({ dir: D, config: HfConfig.read(D), weights: dw }, { target, maxSequences: maxSeq, maxTokensPerSequence: 4096 });
dw.close();

const read = (name) => fs.readFileSync(path.join(ROOT, 'test/prompts', `${name}.jsonl`), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const half = Math.ceil(NPROMPTS / 2);
const prompts = [...read('prose').slice(0, half), ...read('code').slice(0, NPROMPTS - half)];
const requests = (temperature) => prompts.map((p, i) => ({
  id: p.id, promptIds: Int32Array.from(p.prompt_token_ids), maxTokens: NEW, sampling: { temperature }, seed: 1000 + i, ignoreEos: true,
}));

/**
 * Runs every prompt through an engine; returns tok/s (output tokens / wall, prefill included) and
 * metrics. The cost-policy engine of a (C, temperature) is kept across repetitions, as a server keeps
 * its engine: its first run includes learning the acceptance and the per-step overhead (a few
 * drafting steps), later runs start from what it learnt; τ and drafts are over all its runs.
 */
const costEngines = new Map();
function runEngine(C, temperature, mode) {
  const opts = { maxSequences: C, maxTokensPerSequence: 4096 };
  let e;
  if (mode === 'cost') {
    e = costEngines.get(`${C}|${temperature}`);
    if (e === undefined) {
      e = new SpecEngine(target, drafter, { ...opts, draftPolicy: 'cost' });
      e.calibrate();
      costEngines.set(`${C}|${temperature}`, e);
    }
  } else {
    e = mode === 'plain' ? new SpecEngine(target, undefined, opts) : new SpecEngine(target, drafter, { ...opts, draftPolicy: fixedDraftPolicy(mode) });
  }
  const t0 = performance.now();
  const rs = e.run(requests(temperature));
  const s = (performance.now() - t0) / 1000;
  const out = rs.reduce((a, r) => a + r.tokenIds.length, 0);
  const m = e.metrics;
  return {
    tokPerS: out / s, seconds: s, tokens: out, tauPerStep: m.tauPerStep, tauMeanOfRequests: m.tauMeanOfRequests,
    drafted: m.drafted, accepted: m.accepted, verifySteps: m.verifySteps, perPosition: m.perPositionAcceptance,
    outputs: rs.map((r) => [r.id, r.tokenIds]), costs: e.stepCosts,
  };
}

const info = isa();
const startLoad = machineLoad();
console.log(`bench:spec — ${prompts.length} prompts × ${NEW} tokens, threads ${info.threads}, isa ${info.isa}, ${cpus().length} vCPUs, load ${startLoad.load1.toFixed(2)} / ${startLoad.load5.toFixed(2)} (1/5 min)`);
// Warm-up (JIT, page faults).
runEngine(1, 0, 'plain');

const rows = [];
let costs;
for (const C of CONCS) {
  for (const temperature of [0, 1]) {
    const plains = [];
    const specs = [];
    for (let r = 0; r < REPS; r++) {
      plains.push(runEngine(C, temperature, 'plain'));
      specs.push(runEngine(C, temperature, 'cost'));
    }
    const med = (xs) => [...xs].sort((a, b) => a.tokPerS - b.tokPerS)[xs.length >> 1];
    const plain = med(plains);
    const spec = med(specs);
    costs ??= spec.costs;
    if (temperature === 0) {
      const same = plain.outputs.every(([id, toks], i) => spec.outputs.find(([j]) => j === id)?.[1].join() === toks.join() && i >= 0);
      if (!same) throw new Error(`bench:spec: greedy spec output differs from plain at C=${C}`);
    }
    const row = { C, temperature, plain: plain.tokPerS, spec: spec.tokPerS, speedup: spec.tokPerS / plain.tokPerS,
      tauPerStep: spec.tauPerStep, tauMeanOfRequests: spec.tauMeanOfRequests, draftsPerStep: spec.drafted / Math.max(1, spec.verifySteps), load1: machineLoad().load1 };
    rows.push(row);
    console.log(`C=${C} T=${temperature}: plain ${plain.tokPerS.toFixed(1)} tok/s, DFlash+cost ${spec.tokPerS.toFixed(1)} tok/s (×${row.speedup.toFixed(3)}), `
      + `τ ${spec.tauPerStep.toFixed(3)} / ${spec.tauMeanOfRequests.toFixed(3)}, drafts/step ${row.draftsPerStep.toFixed(2)}, load ${row.load1.toFixed(2)}`);
  }
}

// Ceiling at 1 sequence, greedy: fixed-k τ(k) and the calibrated costs.
const b1 = costs.buckets[0];
const tStep = costs.stepMs(1);
const plain1 = runEngine(1, 0, 'plain');
const ceiling = [{ k: 0, tau: 1, costMs: tStep, ceiling: 1, measured: 1 }];
for (const k of FIXED_KS.filter((x) => x <= drafter.maxDraftTokens)) {
  const r = runEngine(1, 0, k);
  const costMs = costs.draftMs(1, k) + costs.verifyMs(1, k + 1);
  ceiling.push({ k, tau: r.tauPerStep, costMs, ceiling: r.tauPerStep * tStep / costMs, measured: r.tokPerS / plain1.tokPerS });
}
const best = ceiling.reduce((a, c) => (c.ceiling > a.ceiling ? c : a));
const adaptive1 = rows.find((r) => r.C === 1 && r.temperature === 0);
console.log(`\nstep costs (1 sequence): t_step ${tStep.toFixed(3)} ms; k: ${b1.ks.join(' ')}`);
console.log(`  t_verify(k) ms: ${b1.verifyMs.map((x) => x.toFixed(2)).join(' ')}`);
console.log(`  t_draft(k) ms:  ${b1.draftMs.map((x) => x.toFixed(2)).join(' ')}`);
for (const B of costs.buckets.slice(1)) console.log(`  ${B.sequences} sequences: t_verify(k) ${B.verifyMs.map((x) => x.toFixed(2)).join(' ')}; t_draft(k) ${B.draftMs.map((x) => x.toFixed(2)).join(' ')}`);
console.log('\n| k | τ(k) fixed-k | t_draft(k)+t_verify(k) ms | ceiling τ(k)·t_step/(t_draft+t_verify) | measured speed-up fixed k |');
console.log('|---:|---:|---:|---:|---:|');
for (const c of ceiling) console.log(`| ${c.k} | ${c.tau.toFixed(3)} | ${c.costMs.toFixed(3)} | ${c.ceiling.toFixed(3)} | ${c.measured.toFixed(3)} |`);
console.log(`\nbest ceiling: k = ${best.k}, ×${best.ceiling.toFixed(3)}; cost policy at 1 sequence, greedy: ×${adaptive1.speedup.toFixed(3)} = ${(100 * adaptive1.speedup / best.ceiling).toFixed(1)}% of the best ceiling`);
console.log('\n| sequences | temperature | plain tok/s | DFlash (cost policy) tok/s | speed-up | τ per step | τ mean of requests | drafts per step |');
console.log('|---:|---:|---:|---:|---:|---:|---:|---:|');
for (const r of rows) console.log(`| ${r.C} | ${r.temperature} | ${r.plain.toFixed(1)} | ${r.spec.toFixed(1)} | ${r.speedup.toFixed(3)} | ${r.tauPerStep.toFixed(3)} | ${r.tauMeanOfRequests.toFixed(3)} | ${r.draftsPerStep.toFixed(2)} |`);
const endLoad = machineLoad();
console.log(`\nload at the end ${endLoad.load1.toFixed(2)} / ${endLoad.load5.toFixed(2)} (1/5 min)`);
if (jsonOut) fs.writeFileSync(jsonOut, `${JSON.stringify({ threads: info.threads, isa: info.isa, prompts: prompts.length, newTokens: NEW, startLoad, endLoad, rows, ceiling, best, costs })}\n`);
drafter.dispose();
target.dispose();
