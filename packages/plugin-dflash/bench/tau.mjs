#!/usr/bin/env node
// τ (acceptance length) of the shipped DFlash drafter measured by specd's engine on the committed
// held-out prompt sets, in the layout of tools/reference/eval_tau.py, and compared with the
// reference's numbers when test/prompts/reference_tau.json exists.
//
//   node packages/plugin-dflash/bench/tau.mjs [--limit N] [--concurrency C] [--commit snapshots|replay] [--out FILE]
//
// Greedy, 128 new tokens per prompt, EOS ignored; τ = mean over verify steps of (accepted + 1).
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { HfConfig, SafetensorsCheckpoint, SpecEngine } from '@specd/core';
import { loadKimiStage } from '@specd/model-kimi-k3';
import { dflashPlugin } from '@specd/plugin-dflash';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i < 0 ? dflt : process.argv[i + 1];
};
const limit = Number(arg('limit', '1000'));
const conc = Number(arg('concurrency', '8'));
const commit = arg('commit', undefined);
const out = arg('out', undefined);
const NEW = 128;

const T = path.join(ROOT, 'models/kimi-k3-tiny');
const D = path.join(ROOT, 'models/kimi-k3-tiny-dflash');
const tw = SafetensorsCheckpoint.open(T);
const target = loadKimiStage({ dir: T, config: HfConfig.read(T), weights: tw });
tw.close();
const dw = SafetensorsCheckpoint.open(D);
const drafter = await dflashPlugin.load(
  { dir: D, config: HfConfig.read(D), weights: dw },
  { target, maxSequences: conc, maxTokensPerSequence: 4096 },
);
dw.close();

const refFile = path.join(ROOT, 'test/prompts/reference_tau.json');
// the greedy block-16 DFlash run: `runs.dflash_t0` in reference_tau.json (a bare run object is accepted too)
const refAll = fs.existsSync(refFile) ? JSON.parse(fs.readFileSync(refFile, 'utf8')) : undefined;
const reference = refAll?.runs?.dflash_t0 ?? (refAll?.domains !== undefined ? refAll : undefined);
if (refAll !== undefined && reference === undefined)
  throw new Error(`${refFile}: no runs.dflash_t0 (greedy DFlash, block 16)`);
const result = {
  target: 'models/kimi-k3-tiny',
  drafter: 'models/kimi-k3-tiny-dflash',
  temperature: 0,
  new_tokens: NEW,
  definition: 'mean over verify steps of (accepted + 1)',
  domains: {},
};
for (const name of ['prose', 'code']) {
  const rows = fs
    .readFileSync(path.join(ROOT, 'test/prompts', `${name}.jsonl`), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l))
    .slice(0, limit);
  const e = new SpecEngine(target, drafter, {
    maxSequences: conc,
    draftPolicy: 'max',
    maxTokensPerSequence: 4096,
    ...(commit ? { commit } : {}),
  });
  const t0 = performance.now();
  const rs = e.run(
    rows.map((r) => ({
      id: r.id,
      promptIds: Int32Array.from(r.prompt_token_ids),
      maxTokens: NEW,
      sampling: { temperature: 0 },
      seed: 0,
      ignoreEos: true,
    })),
  );
  const ms = performance.now() - t0;
  const m = e.metrics;
  const byId = new Map(rs.map((r) => [r.id, r]));
  const requests = rows.map((r) => {
    const x = byId.get(r.id);
    return { id: r.id, steps: x.metrics.verifySteps, committed: x.metrics.accepted + x.metrics.verifySteps };
  });
  const d = {
    tau: m.tauPerStep,
    tau_mean_of_request_means: m.tauMeanOfRequests,
    verify_steps: m.verifySteps,
    prompts: rows.length,
    per_position_acceptance: m.perPositionAcceptance,
    acceptance_length_histogram: m.acceptanceLengthHistogram,
    verify_forwards: m.verifyForwards,
    decode_forwards: m.decodeForwards,
    seconds: ms / 1000,
    requests,
  };
  const refDomain = reference?.domains?.[name];
  let line =
    `${name}: specd τ ${m.tauPerStep.toFixed(3)} (mean of requests ${m.tauMeanOfRequests.toFixed(3)}` +
    `) over ${m.verifySteps} verify steps, ${rows.length} prompts, ${(ms / 1000).toFixed(1)} s`;
  if (refDomain !== undefined) {
    const refReqs = new Map((refDomain.requests ?? []).map((r) => [r.id, r]));
    const both = requests.filter((r) => refReqs.has(r.id));
    const S = both.reduce((a, r) => a + refReqs.get(r.id).steps, 0);
    const A = both.reduce((a, r) => a + refReqs.get(r.id).committed, 0);
    const sameSteps = both.filter((r) => refReqs.get(r.id).steps === r.steps).length;
    d.reference_tau_same_prompts = S > 0 ? A / S : null;
    d.reference_tau = refDomain.tau;
    line +=
      `; reference τ ${refDomain.tau.toFixed(3)} (on these prompts ${(A / S).toFixed(3)}), Δ ` +
      `${(m.tauPerStep - A / S).toFixed(3)}; ${sameSteps}/${both.length} requests with the same step count`;
  }
  result.domains[name] = d;
  console.log(line);
}
if (out) fs.writeFileSync(out, `${JSON.stringify(result)}\n`);
drafter.dispose();
target.dispose();
