#!/usr/bin/env node
// Where a speculative step's time goes on SmolLM2-135M-Instruct, decode only (prefill left out), one sequence, greedy:
// plain decoding, fixed draft lengths and the default cost policy of one drafter, in one process, the engines
// alternating per prompt. bench:spec's phases divide the whole run's wall time (prefill included) by the verify
// steps; this one times from each request's first token to its last, and times the target's forwards inside that.
//
//   node bench/spec-steps.mjs [--drafter eagle3] [--ks 1,2,3] [--prompts 8] [--tokens 128] [--reps 2] [--no-cost]
//                             [--budget-all] [--target smollm2|kimi]
//
// Prompts: the first N/2 of tools/reference/smollm2/prompts/chat.jsonl and of plain.jsonl (their prompt_token_ids),
// `--tokens` new tokens, EOS ignored. Drafter: models/smollm2-135m-instruct-<drafter>. `--target kimi`: models/
// kimi-k3-tiny with models/kimi-k3-tiny-<drafter>, prompts from test/prompts/{prose,code}.jsonl. Printed, per engine:
//   - speed-up = plain ms per token ÷ the engine's ms per token (decode only);
//   - committed tokens per verify step; per step, ms: propose (draft-context writes + propose), verify (the verify
//     call, its target forward inside it), accept + commit, the rest of the loop; the step in plain steps;
//   - for the cost policy: how often it chose each k, and per verify shape the measured verify time (median) beside
//     the calibrated one the policy read (its trace).
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { BUILTIN_PLUGIN_PACKAGES, SpecEngine, fixedDraftPolicy, loadDrafter, loadTarget } from '@specd/core';
import { isa } from '@specd/native';
import { promptSets } from './prompts.mjs';
import { median } from './stats.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const DRAFTER = arg('drafter', 'eagle3');
const KS = arg('ks', '1,2,3').split(',').map(Number);
const N = Number(arg('prompts', '8'));
const NEW = Number(arg('tokens', '128'));
const REPS = Number(arg('reps', '2'));
const COST = !argv.includes('--no-cost');

const TARGET = arg('target', 'smollm2');
if (TARGET !== 'smollm2' && TARGET !== 'kimi') throw new Error(`spec-steps: --target ${TARGET}: smollm2 or kimi`);
const TARGET_DIR = TARGET === 'kimi' ? 'kimi-k3-tiny' : 'smollm2-135m-instruct';
const target = await loadTarget(path.join(ROOT, 'models', TARGET_DIR), BUILTIN_PLUGIN_PACKAGES);
const { drafter } = await loadDrafter(
  path.join(ROOT, `models/${TARGET_DIR}-${DRAFTER}`),
  BUILTIN_PLUGIN_PACKAGES,
  target,
  4096,
  1,
);

// the target's forwards, timed while a request decodes (after its first token)
let forwardMs = 0;
let decoding = false;
const forward = target.model.forward.bind(target.model);
target.model.forward = (...args) => {
  const t0 = performance.now();
  try {
    return forward(...args);
  } finally {
    if (decoding) forwardMs += performance.now() - t0;
  }
};

const [FIRST, SECOND] = promptSets(TARGET);
const prompts = [...FIRST.slice(0, Math.ceil(N / 2)), ...SECOND.slice(0, Math.floor(N / 2))];

const opts = { maxSequences: 1, maxTokensPerSequence: 4096 };
const engines = new Map([['plain', new SpecEngine(target.model, undefined, opts)]]);
for (const k of KS)
  engines.set(`k = ${k}`, new SpecEngine(target.model, drafter, { ...opts, draftPolicy: fixedDraftPolicy(k) }));
const chosen = new Map();
const shapes = new Map();
if (COST) {
  const trace = (ev) => {
    if (ev.kind === 'choose') chosen.set(ev.candidates[0].k, (chosen.get(ev.candidates[0].k) ?? 0) + 1);
    if (ev.kind === 'step' && ev.drafting > 0) {
      const s = shapes.get(ev.tokens) ?? { measured: [], calibrated: ev.calibratedVerifyMs };
      s.measured.push(ev.verifyMs);
      shapes.set(ev.tokens, s);
    }
  };
  const e = new SpecEngine(target.model, drafter, { ...opts, draftPolicy: 'cost', costPolicy: { trace } });
  e.calibrate(); // before any timer, as a server calibrates once
  engines.set('cost policy', e);
  // --budget-all: the same policy with every proposed draft verified (no verify budgets), for a drafter whose
  // proposals carry confidences (DSpark; EAGLE-3 with drafter.confidence): what the confidence cut is worth
  if (argv.includes('--budget-all')) {
    const all = new SpecEngine(target.model, drafter, { ...opts, draftPolicy: 'cost', verifyBudget: 'all' });
    all.calibrate();
    engines.set('cost, all verified', all);
  }
}

const acc = new Map();
let id = 0;
for (let rep = 0; rep < REPS; rep++)
  for (const p of prompts)
    for (const [name, e] of engines) {
      const m0 = { ...e.metrics };
      const f0 = forwardMs;
      const times = [];
      const [r] = e.run([
        {
          id: `s${id++}`,
          promptIds: Int32Array.from(p.prompt_token_ids),
          maxTokens: NEW,
          sampling: { temperature: 0 },
          seed: 1,
          ignoreEos: true,
          onToken: () => {
            times.push(performance.now());
            decoding = true;
          },
        },
      ]);
      decoding = false;
      const m = e.metrics;
      const a = acc.get(name) ?? { wall: 0, tokens: 0, steps: 0, draft: 0, verify: 0, commit: 0, forward: 0 };
      a.wall += times[times.length - 1] - times[0];
      a.tokens += r.tokenIds.length - 1;
      a.steps += m.verifyForwards - m0.verifyForwards;
      a.draft += m.draftMs - m0.draftMs;
      a.verify += m.verifyMs - m0.verifyMs;
      a.commit += m.commitMs - m0.commitMs;
      a.forward += forwardMs - f0;
      acc.set(name, a);
    }

const info = isa();
console.log(
  `spec-steps — ${TARGET === 'kimi' ? 'kimi-k3-tiny' : 'SmolLM2-135M-Instruct'} + ${DRAFTER}; ` +
    `${prompts.length} prompts × ${NEW} tokens, ${REPS} reps, greedy, one sequence; isa ${info.isa}, ` +
    `threads ${info.threads}`,
);
const plain = acc.get('plain');
const plainMs = plain.wall / plain.tokens;
console.log(
  `plain: ${plainMs.toFixed(3)} ms a token (decode only; ${(1000 / plainMs).toFixed(1)} tok/s), target forward ` +
    `${(plain.forward / plain.tokens).toFixed(3)} ms`,
);
console.log(
  '\n| engine | ×plain | tokens/step | propose ms | verify ms (forward) | accept + commit ms | rest ms | step ms ' +
    '| step ÷ plain step |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|',
);
for (const [name, a] of acc) {
  if (name === 'plain') continue;
  const s = Math.max(1, a.steps);
  const rest = a.wall - a.draft - a.verify - a.commit;
  console.log(
    `| ${name} | ${(plainMs / (a.wall / a.tokens)).toFixed(3)} | ${(a.tokens / s).toFixed(2)} | ` +
      `${(a.draft / s).toFixed(2)} | ${(a.verify / s).toFixed(2)} (${(a.forward / s).toFixed(2)}) | ` +
      `${(a.commit / s).toFixed(2)} | ${(rest / s).toFixed(2)} | ${(a.wall / s).toFixed(2)} | ` +
      `${(a.wall / s / plainMs).toFixed(2)} |`,
  );
}
if (COST) {
  const ks = [...chosen].sort((x, y) => x[0] - y[0]);
  console.log(`\ncost policy: k chosen ${ks.map(([k, n]) => `${k}: ${n}`).join(', ')}`);
  for (const [rows, s] of [...shapes].sort((x, y) => x[0] - y[0]))
    console.log(
      `  verify of ${rows} rows: ${s.measured.length} steps, measured ${median(s.measured).toFixed(2)} ms ` +
        `(median), calibrated ${s.calibrated.toFixed(2)} ms`,
    );
}
