#!/usr/bin/env node
// Speculation under load: one engine with a drafter (the default cost policy) against one without (`--no-spec`),
// at 1, 4, 8 and 16 concurrent requests, alternated in ONE run so that machine noise hits both alike.
//
//   npm run bench:load                                   (root; after `npm run build` and `npm run models:fetch`)
//   node bench/load.mjs [--model smollm2|kimi] [--drafters eagle3,dflash] [--conc 1,4,8,16] [--tokens N]
//                       [--waves N] [--requests N] [--reps N] [--policy cost|max|off|fixed:K] [--budget survival|all]
//                       [--json FILE] [--trace FILE] [--turn N] [--sequential] [--quick] [--cost-options JSON]
// (a drafter name may carry a setting: `dflash:noconf` — confidence false —, `eagle3:bf16`, `eagle3:q8_0`)
//
// The engines of a level run in lockstep: they take turns one step() each (the order rotating), and each engine's
// time is the sum of its own steps, so that this VM's slow spells (seconds long, ±10 % on a whole run) fall on both
// sides alike (`--turn N`: N steps a turn, default 1); `--sequential` runs the engines one after the other, each
// timed by its run's wall clock.
// Each engine is built once with maxSequences = the largest level (as a server is) and, for the drafter, its
// cost calibration runs before any timer. A level C runs max(C × waves, --requests) requests with C running at a
// time (continuous batching: a finished request's slot goes to the next one, as C closed-loop clients of a server),
// greedy, EOS ignored, `--tokens` new tokens each (default 128, as issue 16 states every speed goal). Prompts:
// SmolLM2 — tools/reference/smollm2/prompts/{chat,plain}.jsonl alternately (chat template already applied); kimi —
// test/prompts/{prose,code}.jsonl alternately;
// --requests defaults to every prompt of both sets once (64 for SmolLM2; 0 with --quick): with C × waves requests
// alone a level of one sequence ran the same two prompts, whose τ is not the prompt set's.
// Per level and drafter: median tok/s of each side (output tokens / the engine's own time, prefill included), the
// median of the per-repetition ratios spec / plain, drafted tokens per sequence step and per batch step, the share of
// batch steps that drafted, and τ per verify step. Greedy outputs are checked equal to plain decoding's (abort if not).
// Goals (issue 16, "Never lose under load"): ratio ≥ 1.0 at 4, 8 and 16 and ≥ 1.3 at 1, with drafts made at every
// level (drafted tokens per step > 0: never drafting is not a pass).
// --trace FILE: every decision and observation of the cost policy (CostDraftPolicyOptions.trace) as JSON lines,
// tagged with the drafter, level and repetition (what each choice read: a_j, the modelled cost of each D, the k).
// The trace serialises every event inside the timed steps: it can cost the drafting engine 1–2 % at 16 sequences
// (docs/BENCHMARKS.md, "median vs mean verify prices"), so time the goals without it.
import * as fs from 'node:fs';
import { cpus, loadavg } from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { BUILTIN_PLUGIN_PACKAGES, SpecEngine, fixedDraftPolicy, loadDrafter, loadTarget } from '@specd/core';

import { drafterDir, drafterSource } from './drafter-variants.mjs';
import { isa } from '@specd/native';
import { median } from './stats.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const quick = argv.includes('--quick');
/** Engines of a level take turns step by step (default), or run one after the other (`--sequential`). */
const LOCKSTEP = !argv.includes('--sequential');
/** Steps an engine runs in one turn of the lockstep (`--turn N`). */
const TURN = Number(arg('turn', '1'));
if (!(Number.isInteger(TURN) && TURN >= 1))
  throw new Error(`bench:load: --turn: expected an integer >= 1, got ${TURN}`);
const MODEL = arg('model', 'smollm2');
if (MODEL !== 'smollm2' && MODEL !== 'kimi')
  throw new Error(`bench:load: --model: expected smollm2 or kimi, got ${MODEL}`);
const CONCS = arg('conc', quick ? '1,8' : '1,4,8,16')
  .split(',')
  .map(Number);
const NEW = Number(arg('tokens', quick ? '32' : '128'));
const WAVES = Number(arg('waves', quick ? '1' : '2'));
const REPS = Number(arg('reps', quick ? '1' : '3'));
const POLICY = arg('policy', 'cost');
/** The draft policy `--policy` names: 'cost' and 'max' as named, 'off' = fixed:0, 'fixed:K' K drafts every step. */
const DRAFT_POLICY = (() => {
  if (POLICY === 'cost' || POLICY === 'max') return POLICY;
  const k = POLICY === 'off' ? 0 : POLICY.startsWith('fixed:') ? Number(POLICY.slice('fixed:'.length)) : Number.NaN;
  if (!Number.isInteger(k) || k < 0)
    throw new Error(`bench:load: --policy: expected cost, max, off or fixed:K with K >= 0, got ${POLICY}`);
  return fixedDraftPolicy(k);
})();
/** Verify budgets (SpecEngineOptions.verifyBudget): 'survival' (default) cuts proposals by their confidences. */
const BUDGET = arg('budget', 'survival');
const jsonOut = arg('json', undefined);
/** `--cost-options JSON`: CostDraftPolicyOptions for the cost policy (e.g. '{"minGain":0}'), for A/B runs. */
const COST_OPTIONS = (() => {
  const raw = arg('cost-options', undefined);
  if (raw === undefined) return undefined;
  let o;
  try {
    o = JSON.parse(raw);
  } catch (err) {
    throw new Error(`bench:load: --cost-options: not JSON: ${err.message}`);
  }
  if (o === null || typeof o !== 'object' || Array.isArray(o))
    throw new Error(`bench:load: --cost-options: expected a JSON object, got ${raw}`);
  return o;
})();
const traceOut = arg('trace', undefined);
/** The trace's lines, and the tag of the run in progress. */
const traceLines = [];
let traceTag = { C: 0, rep: -1 };
const targetDir = MODEL === 'smollm2' ? 'smollm2-135m-instruct' : 'kimi-k3-tiny';
const METHODS = arg('drafters', MODEL === 'smollm2' ? 'eagle3,dflash' : 'eagle3,dflash,dspark')
  .split(',')
  .filter((m) => fs.existsSync(path.join(drafterDir(path.join(ROOT, 'models'), targetDir, m), 'config.json')));
if (METHODS.length === 0) throw new Error(`bench:load: no drafter of ${targetDir} found under models/`);

const readJsonl = (file) =>
  fs
    .readFileSync(path.join(ROOT, file), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
const sources =
  MODEL === 'smollm2'
    ? ['chat', 'plain'].map((n) => readJsonl(`tools/reference/smollm2/prompts/${n}.jsonl`))
    : ['prose', 'code'].map((n) => readJsonl(`test/prompts/${n}.jsonl`));
/** Requests per level and repetition: every prompt of both sets once (at least C × waves). */
const PROMPTS = Number(arg('requests', String(quick ? 0 : sources[0].length + sources[1].length)));
/** Prompt i alternates between the two sets. */
const promptAt = (i) => {
  const set = sources[i % 2];
  return Int32Array.from(set[(i >> 1) % set.length].prompt_token_ids);
};

const maxSeq = Math.max(...CONCS);
const maxTokensPerSequence = 2048;
const target = await loadTarget(path.join(ROOT, 'models', targetDir), BUILTIN_PLUGIN_PACKAGES);
const engines = { plain: new SpecEngine(target.model, undefined, { maxSequences: maxSeq, maxTokensPerSequence }) };
for (const m of METHODS) {
  const { drafter } = await loadDrafter(
    drafterSource(path.join(ROOT, 'models'), targetDir, m),
    BUILTIN_PLUGIN_PACKAGES,
    target,
    maxTokensPerSequence,
    maxSeq,
  );
  // 'off' drafts nothing (the cost of keeping a drafter attached: taps kept, policy asked, no drafter call)
  const draftPolicy = DRAFT_POLICY;
  const costPolicy =
    traceOut === undefined && COST_OPTIONS === undefined
      ? undefined
      : {
          ...COST_OPTIONS,
          ...(traceOut === undefined
            ? {}
            : { trace: (ev) => traceLines.push(JSON.stringify({ drafter: m, ...traceTag, ...ev })) }),
        };
  const e = new SpecEngine(target.model, drafter, {
    maxSequences: maxSeq,
    maxTokensPerSequence,
    draftPolicy,
    costPolicy,
    verifyBudget: BUDGET,
  });
  e.calibrate();
  engines[m] = e;
}

let nextId = 0;
/**
 * One level on some engines: max(C × WAVES, PROMPTS) requests on each, C at a time. Sequential (`--sequential`):
 * one engine after the other, each timed by the wall clock of its whole run. Lockstep (default): the engines take
 * turns step by step (the order of a turn rotates), and each engine's time is the sum of its own `step()` calls
 * (adding the next request is part of the step that freed its slot) — a slow spell of the machine then falls on
 * every engine alike instead of on whichever ran during it.
 */
function runLevel(names, C) {
  if (!LOCKSTEP) return Object.fromEntries(names.map((n) => [n, finish(steps(start(n, C), Number.POSITIVE_INFINITY))]));
  const runs = names.map((n) => start(n, C));
  for (let turn = 0; runs.some((r) => r.e.pending > 0); turn++)
    for (let i = 0; i < runs.length; i++) {
      const r = runs[(turn + i) % runs.length];
      if (r.e.pending > 0) steps(r, TURN);
    }
  return Object.fromEntries(runs.map((r, i) => [names[i], finish(r)]));
}
/** A level's state on one engine: its requests queued, the first C added. */
function start(name, C) {
  const e = engines[name];
  const total = Math.max(C * WAVES, PROMPTS);
  const reqs = Array.from({ length: total }, (_, i) => ({
    id: `${name}-${nextId++}`,
    promptIds: promptAt(i),
    maxTokens: NEW,
    sampling: { temperature: 0 },
    seed: 1,
    ignoreEos: true,
  }));
  const r = {
    e,
    reqs,
    queued: 0,
    results: [],
    ms: 0,
    cpuUs: 0,
    steps0: e.metrics.verifyForwards,
    ms0: [e.metrics.draftMs, e.metrics.verifyMs, e.metrics.commitMs],
  };
  const t0 = performance.now();
  const c0 = process.cpuUsage();
  for (; r.queued < C; r.queued++) e.add(reqs[r.queued]);
  account(r, t0, c0);
  return r;
}
/** Adds the wall time since `t0` (performance.now(), ms) and the process CPU time since `c0` to a level's run. */
function account(r, t0, c0) {
  r.ms += performance.now() - t0;
  const c = process.cpuUsage(c0);
  r.cpuUs += c.user + c.system;
}
/**
 * Up to `n` `step()`s of a level's engine (Infinity: until it has nothing pending), timed as one span, with the next
 * request added for each one finished.
 */
function steps(r, n) {
  const t0 = performance.now();
  const c0 = process.cpuUsage();
  for (let j = 0; j < n && r.e.pending > 0; j++)
    for (const res of r.e.step()) {
      r.results.push(res);
      if (r.queued < r.reqs.length) r.e.add(r.reqs[r.queued++]);
    }
  account(r, t0, c0);
  return r;
}
/** A level's figures on one engine, from its finished run. */
function finish(level) {
  const { e, results, steps0, ms0 } = level;
  const index = new Map(level.reqs.map((q, i) => [q.id, i]));
  const outputs = new Map();
  const s = level.ms / 1000;
  const cpuS = level.cpuUs / 1e6;
  let drafted = 0;
  let accepted = 0;
  let seqSteps = 0;
  let draftSteps = 0;
  for (const r of results) {
    if (r.finishReason !== 'length') throw new Error(`bench:load: ${r.id} ended with ${r.finishReason}`);
    drafted += r.metrics.drafted;
    accepted += r.metrics.accepted;
    seqSteps += r.metrics.verifySteps;
    draftSteps += r.metrics.draftSteps;
    // request i of every engine has the same prompt: key outputs by i
    outputs.set(index.get(r.id), r.tokenIds.join());
  }
  const batchSteps = e.metrics.verifyForwards - steps0;
  // where a batch step's time went: the propose call (with any catch-up), the verify forward, accept + commit
  const split = [e.metrics.draftMs, e.metrics.verifyMs, e.metrics.commitMs].map(
    (v, i) => (v - ms0[i]) / Math.max(1, batchSteps),
  );
  const tokens = results.reduce((a, r) => a + r.tokenIds.length, 0);
  return {
    tokPerS: tokens / s,
    tokPerCpuS: tokens / cpuS,
    draftsPerSeqStep: drafted / Math.max(1, seqSteps),
    draftsPerBatchStep: drafted / Math.max(1, batchSteps),
    draftStepShare: draftSteps / Math.max(1, seqSteps),
    tau: seqSteps === 0 ? 0 : (accepted + seqSteps) / seqSteps,
    split,
    stepMs: (s * 1000) / Math.max(1, batchSteps),
    outputs,
  };
}

const info = isa();
const [l1, l5] = loadavg();
const policyNote = COST_OPTIONS === undefined ? POLICY : `${POLICY} ${JSON.stringify(COST_OPTIONS)}`;
console.log(
  `bench:load — ${targetDir}; drafters ${METHODS.join(', ')} (policy ${policyNote}); levels ${CONCS.join(', ')}; ` +
    `max(${WAVES} wave(s), ${PROMPTS} requests) × ${NEW} tokens; ${REPS} rep(s); budgets ${BUDGET}; ` +
    `threads ${info.threads}, isa ${info.isa}, ${cpus().length} vCPUs (${cpus()[0]?.model ?? '?'}); ` +
    `load ${l1.toFixed(2)} / ${l5.toFixed(2)} (1/5 min)`,
);
// the calibrated verify curve the batch rule reads: t_verify(B, T) by the batch's total rows T
for (const m of METHODS) {
  const costs = engines[m].stepCosts;
  if (costs === undefined) continue;
  for (const b of costs.buckets) {
    const rows = b.verifyRows ?? b.ks.map((k) => b.sequences * (k + 1));
    const ms = b.verifyRowsMs ?? b.verifyMs;
    const curve = rows.map((t, i) => `${t}:${ms[i].toFixed(1)}`).join(' ');
    console.log(`${m} calibrated t_verify(B=${b.sequences}, T) ms: ${curve}; t_draft(k=1) ${b.draftMs[1]?.toFixed(1)}`);
  }
}
runLevel(['plain'], 1); // warm-up (JIT, page faults)

const rows = [];
for (const C of CONCS) {
  const per = Object.fromEntries(Object.keys(engines).map((n) => [n, []]));
  const ratios = Object.fromEntries(METHODS.map((m) => [m, []]));
  const cpuRatios = Object.fromEntries(METHODS.map((m) => [m, []]));
  for (let r = 0; r < REPS; r++) {
    // alternate the order per repetition: plain first, then last
    const order = r % 2 === 0 ? ['plain', ...METHODS] : [...METHODS, 'plain'];
    traceTag = { C, rep: r };
    const got = runLevel(order, C);
    for (const m of METHODS) {
      for (const [i, toks] of got.plain.outputs)
        if (got[m].outputs.get(i) !== toks)
          throw new Error(`bench:load: ${m}: greedy output of request ${i} differs from plain decoding (C=${C})`);
      ratios[m].push(got[m].tokPerS / got.plain.tokPerS);
      cpuRatios[m].push(got[m].tokPerCpuS / got.plain.tokPerCpuS);
    }
    for (const n of order) per[n].push(got[n]);
  }
  const plainTok = median(per.plain.map((x) => x.tokPerS));
  for (const m of METHODS) {
    const xs = per[m];
    const row = {
      method: m,
      C,
      plainTokPerS: plainTok,
      specTokPerS: median(xs.map((x) => x.tokPerS)),
      ratio: median(ratios[m]),
      ratios: ratios[m],
      cpuRatio: median(cpuRatios[m]),
      draftsPerSeqStep: median(xs.map((x) => x.draftsPerSeqStep)),
      draftsPerBatchStep: median(xs.map((x) => x.draftsPerBatchStep)),
      draftStepShare: median(xs.map((x) => x.draftStepShare)),
      tau: median(xs.map((x) => x.tau)),
      split: [0, 1, 2].map((i) => median(xs.map((x) => x.split[i]))),
      plainSplit: [0, 1, 2].map((i) => median(per.plain.map((x) => x.split[i]))),
      stepMs: median(xs.map((x) => x.stepMs)),
      plainStepMs: median(per.plain.map((x) => x.stepMs)),
      load1: loadavg()[0],
    };
    rows.push(row);
    console.log(
      `${m} C=${C}: plain ${plainTok.toFixed(1)} tok/s, spec ${row.specTokPerS.toFixed(1)} (×${row.ratio.toFixed(3)};` +
        ` per rep ${row.ratios.map((x) => x.toFixed(2)).join(' ')}; per CPU-second ×${row.cpuRatio.toFixed(3)}),` +
        ` drafts/seq step ${row.draftsPerSeqStep.toFixed(2)},` +
        ` drafts/batch step ${row.draftsPerBatchStep.toFixed(2)}, τ ${row.tau.toFixed(3)};` +
        ` ms a batch step (wall incl. prefill / propose / verify / accept+commit): spec` +
        ` ${[row.stepMs, ...row.split].map((v) => v.toFixed(2)).join(' / ')}, plain` +
        ` ${[row.plainStepMs, ...row.plainSplit].map((v) => v.toFixed(2)).join(' / ')}`,
    );
  }
}

console.log(
  '\n| drafter | concurrent | plain tok/s | spec tok/s | spec ÷ plain | ÷ plain per CPU-s | drafts / seq step |' +
    ' drafts / batch step | drafting steps | τ per verify step | goal |',
);
console.log('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|');
let met = 0;
for (const r of rows) {
  const need = r.C === 1 ? 1.3 : 1.0;
  const ok = r.ratio >= need && r.draftsPerSeqStep > 0;
  if (ok) met++;
  r.goal = { need, met: ok };
  console.log(
    `| ${r.method} | ${r.C} | ${r.plainTokPerS.toFixed(1)} | ${r.specTokPerS.toFixed(1)} | ${r.ratio.toFixed(3)} | ` +
      `${r.cpuRatio.toFixed(3)} | ${r.draftsPerSeqStep.toFixed(2)} | ${r.draftsPerBatchStep.toFixed(2)} | ` +
      `${(100 * r.draftStepShare).toFixed(0)} % | ${r.tau.toFixed(3)} | ` +
      `≥ ${need.toFixed(1)}× with drafts: ${ok ? 'met' : 'NOT met'} |`,
  );
}
console.log(`\ngoals met: ${met} of ${rows.length}; load at the end ${loadavg()[0].toFixed(2)} (1 min)`);
if (traceOut) fs.writeFileSync(traceOut, traceLines.length === 0 ? '' : `${traceLines.join('\n')}\n`);
if (jsonOut)
  fs.writeFileSync(jsonOut, `${JSON.stringify({ model: targetDir, threads: info.threads, isa: info.isa, rows })}\n`);
for (const e of Object.values(engines)) e.drafter?.dispose();
target.model.dispose();
