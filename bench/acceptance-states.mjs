#!/usr/bin/env node
// How a draft's acceptance depends on what the request's last steps did: the first-draft acceptance a_1 (and a_2
// given a_1) of a drafter, grouped by the request's state before the step. It checks the state model of core's
// AcceptanceEstimator (packages/core/src/engine/draft-policy.ts): rates by "the last drafting step was fully
// accepted" (hot) or "it had a rejection" (cold), a plain step (k = 0) leaving the state as it was. Bench-only.
//
//   node bench/acceptance-states.mjs [--target smollm2|kimi] [--drafter dflash] [--k 2] [--sampling greedy|defaults]
//                                    [--prompts 64] [--tokens 128] [--gaps 0,1,2,4,8] [--reps 1]
//
// One sequence at a time, a probe policy in place of the cost policy: every step drafts `--k` (fewer where the
// request has fewer tokens left), except that after a step with a rejection the request decodes plainly for g steps,
// g taken in turn from `--gaps` (one list for the whole run, so every gap gets about the same number of rejections).
// Each drafting step is filed under the request's state before it:
//   first   the request's first drafting step (right after its prefill);
//   hot     the previous step drafted and had every draft accepted;
//   cold g  the previous drafting step had a rejection, and g plain steps came after it (cold 0: the step right
//           after the rejection).
// Printed per state: the steps, a_1 = P(draft 1 accepted), a_2 | a_1 = P(draft 2 accepted | draft 1 accepted), each
// with its binomial standard error. Prompts: `--prompts` of the target's two sets (bench/prompts.mjs) taken
// alternately (64: every SmolLM2 prompt), `--tokens` new tokens each, EOS ignored; `--sampling defaults` samples at
// the target's generation_config.json defaults (as `specd serve` does), one seed a request.
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { BUILTIN_PLUGIN_PACKAGES, SpecEngine, loadDrafter, loadTarget, readModelSamplingDefaults } from '@specd/core';

import { drafterSource } from './drafter-variants.mjs';
import { defaultSampling, promptSets } from './prompts.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/**
 * The probe policy (a core DraftPolicy): `k` drafts a step (fewer where a request has fewer tokens left), but after a
 * step with a rejection the request decodes plainly for g steps, g taken in turn from `gaps` (one list for all
 * requests). Each drafting step's outcome goes to `record(state, drafted, accepted)` under the request's state
 * before the step: 'first', 'hot' or `cold ${g}` (the file comment).
 */
export function probePolicy(k, gaps, record) {
  let nextGap = 0;
  /** Per running request: its state label and the plain steps it still owes. */
  const requests = new Map();
  return {
    choose(candidates) {
      return candidates.map((c) => {
        let r = requests.get(c.id);
        if (r === undefined) {
          r = { state: 'first', wait: 0 };
          requests.set(c.id, r);
        }
        if (r.wait > 0) {
          r.wait--;
          return 0;
        }
        return Math.min(k, c.maxDrafts);
      });
    },
    observe(id, drafted, accepted) {
      const r = requests.get(id);
      if (r === undefined || !(drafted > 0)) return;
      record(r.state, drafted, accepted);
      if (accepted >= drafted) {
        r.state = 'hot';
        return;
      }
      const g = gaps[nextGap++ % gaps.length];
      r.state = `cold ${g}`;
      r.wait = g;
    },
    release(id) {
      requests.delete(id);
    },
  };
}

/**
 * Counts per state of the drafting steps `record` receives: steps, draft 1 accepted, steps with draft 1 accepted and a
 * second draft offered, draft 2 accepted. @returns { record, stats: Map<state, counts> }.
 */
export function stateCounts() {
  const stats = new Map();
  const record = (state, drafted, accepted) => {
    let s = stats.get(state);
    if (s === undefined) {
      s = { steps: 0, a1: 0, n2: 0, a2: 0 };
      stats.set(state, s);
    }
    s.steps++;
    if (accepted >= 1) {
      s.a1++;
      if (drafted >= 2) {
        s.n2++;
        if (accepted >= 2) s.a2++;
      }
    }
  };
  return { record, stats };
}

/** The printed table's rows: per state in `order` that has steps, a_1 and a_2 | a_1 with binomial standard errors. */
export function formatStates(stats, order) {
  const se = (x, n) => Math.sqrt(((x / n) * (1 - x / n)) / n);
  const lines = ['| state before the step | steps | a_1 (± s.e.) | a_2 given a_1 (± s.e.) |', '|---|---:|---:|---:|'];
  for (const state of order) {
    const s = stats.get(state);
    if (s === undefined) continue;
    const a1 = `${(s.a1 / s.steps).toFixed(3)} ± ${se(s.a1, s.steps).toFixed(3)}`;
    const a2 = s.n2 > 0 ? `${(s.a2 / s.n2).toFixed(3)} ± ${se(s.a2, s.n2).toFixed(3)}` : '–';
    lines.push(`| ${state} | ${s.steps} | ${a1} | ${a2} |`);
  }
  return lines;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const argv = process.argv.slice(2);
  const arg = (name, dflt) => {
    const i = argv.indexOf(`--${name}`);
    return i < 0 ? dflt : argv[i + 1];
  };
  const TARGET = arg('target', 'smollm2');
  const DRAFTER = arg('drafter', 'dflash');
  const K = Number(arg('k', '2'));
  const SAMPLING = arg('sampling', 'greedy');
  const N = Number(arg('prompts', '64'));
  const NEW = Number(arg('tokens', '128'));
  const GAPS = arg('gaps', '0,1,2,4,8').split(',').map(Number);
  const REPS = Number(arg('reps', '1'));
  if (!(Number.isInteger(K) && K >= 2)) throw new Error(`acceptance-states: --k must be an integer >= 2, got ${K}`);
  if (!GAPS.every((g) => Number.isInteger(g) && g >= 0))
    throw new Error(`acceptance-states: --gaps must be integers >= 0, got ${GAPS.join(',')}`);
  if (SAMPLING !== 'greedy' && SAMPLING !== 'defaults')
    throw new Error(`acceptance-states: --sampling must be greedy or defaults, got ${SAMPLING}`);

  const targetDir = TARGET === 'smollm2' ? 'smollm2-135m-instruct' : 'kimi-k3-tiny';
  const modelDir = path.join(ROOT, 'models', targetDir);
  const target = await loadTarget(modelDir, BUILTIN_PLUGIN_PACKAGES);
  const { drafter } = await loadDrafter(
    drafterSource(path.join(ROOT, 'models'), targetDir, DRAFTER),
    BUILTIN_PLUGIN_PACKAGES,
    target,
    4096,
    1,
  );
  const sampling = SAMPLING === 'greedy' ? { temperature: 0 } : defaultSampling(readModelSamplingDefaults(modelDir));
  const [a, b] = promptSets(TARGET);
  /** Prompt i alternates between the two sets. */
  const promptAt = (i) => {
    const set = i % 2 === 0 ? a : b;
    return set[(i >> 1) % set.length];
  };
  const { record, stats } = stateCounts();
  const engine = new SpecEngine(target.model, drafter, {
    maxSequences: 1,
    maxTokensPerSequence: 4096,
    draftPolicy: probePolicy(K, GAPS, record),
  });
  for (let rep = 0; rep < REPS; rep++)
    for (let i = 0; i < N; i++)
      engine.run([
        {
          id: `r${rep}-${i}`,
          promptIds: Int32Array.from(promptAt(i).prompt_token_ids),
          maxTokens: NEW,
          sampling,
          seed: 1000 + i + 7 * rep,
          ignoreEos: true,
        },
      ]);
  const order = ['first', 'hot', ...[...new Set(GAPS)].map((g) => `cold ${g}`)];
  const how = SAMPLING === 'greedy' ? 'greedy' : `defaults (${JSON.stringify(sampling)})`;
  console.log(
    `bench:acceptance-states — ${targetDir} + ${DRAFTER}, k = ${K}, ${how}; ${N} prompts × ${NEW} tokens × ` +
      `${REPS} rep(s); gaps after a rejection ${GAPS.join(', ')}`,
  );
  for (const line of formatStates(stats, order)) console.log(line);
}
