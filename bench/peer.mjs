#!/usr/bin/env node
// The race: specd against llama.cpp (through node-llama-cpp 3.21.1) on the same GGUF,
// SmolLM2-135M-Instruct Q4_1, same thread count, greedy, the same prompt token ids; one table.
//
//   npm run bench:peer                      (root; run `npm run build` and `npm run models:fetch` first; 5–8 min)
//   node bench/peer.mjs [--threads N] [--prompts N] [--tokens N] [--reps N] [--json FILE] [--quick]
//
// node-llama-cpp is not a dependency of the project (its prebuilt binaries weigh ~730 MB): the first
// run installs it once into .cache/peer/ (git-ignored) with `npm install --prefix .cache/peer
// node-llama-cpp@3.21.1 --ignore-scripts`, and loads its prebuilt CPU binary (`getLlama({ gpu: false,
// build: 'never' })`: nothing is built or downloaded at run time).
//
// Prompts: the first N of tools/reference/smollm2/prompts/chat.jsonl and of plain.jsonl (N = 8 by
// default), their `prompt_token_ids` fed to both engines as ids (no re-tokenisation), `--tokens` new
// tokens each (default 128), EOS ignored (llama.cpp: `yieldEogToken: true` keeps it generating past
// an end-of-generation token). Threads: `--threads N` for both (default 2): specd's compute pool
// (setNumThreads) and the llama.cpp context's `threads`.
// Measured in one run, alternating per prompt, `--reps` times (per prompt the median time over reps):
//   1. decode tok/s = (new tokens − 1) / (time of the last token − time of the first token), summed
//      over the prompts of a rep, one request at a time: specd = SpecEngine without a drafter,
//      llama.cpp = LlamaContextSequence.evaluate at temperature 0;
//   2. llama.cpp with its prompt-lookup predictor (InputLookupTokenPredictor, default options:
//      patterns ≥ 1 token, up to 3 predicted tokens), and specd with the SmolLM2 DFlash / EAGLE-3
//      drafters when models/smollm2-135m-instruct-<method>/config.json exists (draftPolicy 'max' and
//      the default cost policy; the ceiling max_k τ(k)·t_step/(t_draft(k)+t_verify(k)) from the
//      cost engine's calibrated costs and the max-k per-position acceptance, as in bench/spec.mjs);
//      a drafter that is absent prints "not trained yet";
//   3. prefill tok/s = P / time to first token of a request with one new token, P = 512 and 2048
//      (the corpus prompts' ids concatenated: all of chat.jsonl, then plain.jsonl): specd's engine
//      (prefill chunk 64, its default, and 512) vs llama.cpp (batch 512).
// Greedy agreement (informational: llama.cpp quantises activations to 8 bits for its Q4_1 dot
// products, specd keeps them in fp32, so near-ties can flip): the first position where specd's and
// llama.cpp's outputs differ, per prompt. llama.cpp with prompt lookup must equal llama.cpp plain and
// each specd drafter run specd plain (greedy speculative decoding is lossless); differences are
// printed (llama.cpp's can differ: a multi-token verify batch goes through other kernels than a
// one-token decode, so near-ties can flip; at each specd/llama.cpp divergence the bench prints
// llama.cpp's probability of its token and of specd's, to show whether it is a near-tie).
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import { createRequire } from 'node:module';
import { cpus, loadavg } from 'node:os';
import * as path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { BUILTIN_PLUGIN_PACKAGES, SpecEngine, loadDrafter, loadTarget } from '@specd/core';
import { isa, setNumThreads } from '@specd/native';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const quick = argv.includes('--quick');
const THREADS = Number(arg('threads', '2'));
const NPROMPTS = Number(arg('prompts', quick ? '4' : '8')); // per file
const NEW = Number(arg('tokens', quick ? '64' : '128'));
const REPS = Number(arg('reps', quick ? '1' : '3'));
const PREFILL = quick ? [512] : [512, 2048];
const jsonOut = arg('json', undefined);
const NLC_VERSION = '3.21.1';
const MODEL_DIR = path.join(ROOT, 'models/smollm2-135m-instruct');
const GGUF = path.join(MODEL_DIR, 'SmolLM2-135M-Instruct.Q4_1.gguf');
const load = () => loadavg().slice(0, 2);
const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1];

if (!fs.existsSync(GGUF)) throw new Error(`bench:peer: ${GGUF} is missing: run \`npm run models:fetch\``);

// --- node-llama-cpp, installed on demand ------------------------------------------------------------
const PEER = path.join(ROOT, '.cache/peer');
const nlcPkg = path.join(PEER, 'node_modules/node-llama-cpp/package.json');
const installed = () => fs.existsSync(nlcPkg) && JSON.parse(fs.readFileSync(nlcPkg, 'utf8')).version === NLC_VERSION;
if (!installed()) {
  console.log(
    `bench:peer: installing node-llama-cpp@${NLC_VERSION} into ${path.relative(ROOT, PEER)}/ (once; ~730 MB)…`,
  );
  fs.mkdirSync(PEER, { recursive: true });
  if (!fs.existsSync(path.join(PEER, 'package.json')))
    fs.writeFileSync(path.join(PEER, 'package.json'), '{ "private": true }\n');
  execFileSync(
    'npm',
    [
      'install',
      '--prefix',
      PEER,
      `node-llama-cpp@${NLC_VERSION}`,
      '--ignore-scripts',
      '--no-audit',
      '--no-fund',
      '--no-save',
    ],
    { stdio: 'inherit' },
  );
  if (!installed()) throw new Error(`bench:peer: node-llama-cpp@${NLC_VERSION} did not install into ${PEER}`);
}
const nlcEntry = createRequire(path.join(PEER, 'package.json')).resolve('node-llama-cpp');
const { getLlama, InputLookupTokenPredictor } = await import(pathToFileURL(nlcEntry).href);

// --- prompts ----------------------------------------------------------------------------------------
const read = (name) =>
  fs
    .readFileSync(path.join(ROOT, 'tools/reference/smollm2/prompts', `${name}.jsonl`), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
const chat = read('chat');
const plain = read('plain');
const prompts = [...chat.slice(0, NPROMPTS), ...plain.slice(0, NPROMPTS)].map((p) => ({
  id: p.id,
  kind: p.kind,
  ids: p.prompt_token_ids,
}));
const corpus = [...chat, ...plain].flatMap((p) => p.prompt_token_ids);
for (const P of PREFILL)
  if (corpus.length < P) throw new Error(`bench:peer: the corpus has ${corpus.length} prompt tokens, fewer than ${P}`);

// --- engines ----------------------------------------------------------------------------------------
setNumThreads(THREADS);
const target = await loadTarget(MODEL_DIR, BUILTIN_PLUGIN_PACKAGES);
const MAX_SEQ_TOKENS = 4096;

const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' });
const lmodel = await llama.loadModel({ modelPath: GGUF });
const lctx = await lmodel.createContext({
  contextSize: MAX_SEQ_TOKENS,
  sequences: 2,
  threads: THREADS,
  batchSize: 512,
});
const lplain = lctx.getSequence();
const llookup = lctx.getSequence({ tokenPredictor: new InputLookupTokenPredictor() });

const METHODS = ['dflash', 'eagle3'];
const drafters = [];
for (const m of METHODS) {
  const dir = path.join(ROOT, 'models', `smollm2-135m-instruct-${m}`);
  if (!fs.existsSync(path.join(dir, 'config.json'))) {
    drafters.push({ method: m, absent: true });
    continue;
  }
  const { drafter } = await loadDrafter(dir, BUILTIN_PLUGIN_PACKAGES, target, MAX_SEQ_TOKENS, 1);
  const cost = new SpecEngine(target.model, drafter, {
    maxSequences: 1,
    maxTokensPerSequence: MAX_SEQ_TOKENS,
    draftPolicy: 'cost',
  });
  cost.calibrate(); // before any timer, as a server calibrates once
  const max = new SpecEngine(target.model, drafter, {
    maxSequences: 1,
    maxTokensPerSequence: MAX_SEQ_TOKENS,
    draftPolicy: 'max',
  });
  drafters.push({ method: m, drafter, max, cost });
}
const specdPlain = new SpecEngine(target.model, undefined, { maxSequences: 1, maxTokensPerSequence: MAX_SEQ_TOKENS });
const specdChunk = new Map([
  [64, specdPlain],
  [
    512,
    new SpecEngine(target.model, undefined, {
      maxSequences: 1,
      maxTokensPerSequence: MAX_SEQ_TOKENS,
      prefillChunk: 512,
    }),
  ],
]);

let nextId = 0;
/** One specd request on engine `e`: token times from onToken. */
function specd(e, ids, maxTokens) {
  const times = [];
  const t0 = performance.now();
  const [r] = e.run([
    {
      id: `r${nextId++}`,
      promptIds: Int32Array.from(ids),
      maxTokens,
      sampling: { temperature: 0 },
      seed: 1,
      ignoreEos: true,
      onToken: () => times.push(performance.now()),
    },
  ]);
  return { tokens: r.tokenIds, t0, times };
}
/** One llama.cpp request on sequence `seq` (history cleared first, outside the timer). */
async function llamacpp(seq, ids, maxTokens) {
  await seq.clearHistory();
  seq.tokenPredictor?.updateInputTokens(ids); // what LlamaChat does: the lookup predictor searches these
  const before = { ...seq.tokenPredictions };
  const tokens = [];
  const times = [];
  const t0 = performance.now();
  for await (const t of seq.evaluate(ids, { temperature: 0, yieldEogToken: true })) {
    times.push(performance.now());
    tokens.push(t);
    if (tokens.length >= maxTokens) break;
  }
  const after = seq.tokenPredictions;
  return { tokens, t0, times, validated: after.validated - before.validated, refuted: after.refuted - before.refuted };
}

// --- runs -------------------------------------------------------------------------------------------
const info = isa();
const [l1, l5] = load();
console.log(
  'bench:peer — SmolLM2-135M-Instruct Q4_1; specd vs llama.cpp (node-llama-cpp ' +
    `${NLC_VERSION}, ${llama.buildType ?? ''} CPU build); ${prompts.length} prompts × ${NEW}` +
    ` tokens, ${REPS} reps; threads ${THREADS} each; specd isa ${info.isa}, ${cpus().length}` +
    ` vCPUs (${cpus()[0]?.model ?? '?'}); load ${l1.toFixed(2)} / ${l5.toFixed(2)} (1/5 min)`,
);
// Warm-up (JIT, page faults, both engines).
specd(specdPlain, prompts[0].ids, 16);
await llamacpp(lplain, prompts[0].ids, 16);
await llamacpp(llookup, prompts[0].ids, 16);

/** Engines of the decode race, in alternation order. */
const racers = [
  { key: 'specd', label: 'specd, plain decoding', run: (ids) => specd(specdPlain, ids, NEW) },
  { key: 'llama', label: 'llama.cpp, plain decoding', run: (ids) => llamacpp(lplain, ids, NEW) },
  {
    key: 'llama-lookup',
    label: 'llama.cpp + prompt lookup (InputLookupTokenPredictor)',
    run: (ids) => llamacpp(llookup, ids, NEW),
  },
];
for (const d of drafters) {
  if (d.absent) continue;
  racers.push({
    key: `${d.method}-max`,
    label: `specd + ${d.method} (draftPolicy 'max', k=${d.drafter.maxDraftTokens})`,
    run: (ids) => specd(d.max, ids, NEW),
    engine: d.max,
  });
  racers.push({
    key: `${d.method}-cost`,
    label: `specd + ${d.method} (cost policy, default)`,
    run: (ids) => specd(d.cost, ids, NEW),
    engine: d.cost,
  });
}

// Per (engine, prompt): the decode time of every rep; reported: Σ (tokens − 1) / Σ median time, so a
// stall of the shared machine during one rep of one prompt does not count (per-rep totals go to --json).
const acc = new Map(
  racers.map((r) => [
    r.key,
    { dt: new Map(prompts.map((p) => [p.id, []])), repTotals: [], outputs: new Map(), validated: 0, refuted: 0 },
  ]),
);
for (let rep = 0; rep < REPS; rep++) {
  for (let i = 0; i < prompts.length; i++) {
    const p = prompts[i];
    // Alternate the order per prompt and rep so no engine always runs right after the same other one.
    const order = (i + rep) % 2 === 0 ? racers : [...racers].reverse();
    for (const r of order) {
      const res = await r.run(p.ids);
      const n = res.tokens.length;
      if (n !== NEW) throw new Error(`bench:peer: ${r.key}: ${p.id}: ${n} tokens, expected ${NEW}`);
      const a = acc.get(r.key);
      a.dt.get(p.id).push((res.times[n - 1] - res.times[0]) / 1000);
      if (rep === 0) a.outputs.set(p.id, res.tokens);
      if (res.validated !== undefined) {
        a.validated += res.validated;
        a.refuted += res.refuted;
      }
    }
  }
  for (const r of racers) {
    const a = acc.get(r.key);
    a.repTotals.push((prompts.length * (NEW - 1)) / prompts.reduce((t, p) => t + a.dt.get(p.id)[rep], 0));
  }
  console.log(
    `rep ${rep + 1}/${REPS}: ` +
      `${racers.map((r) => `${r.key} ${acc.get(r.key).repTotals.at(-1).toFixed(1)}`).join(', ')}` +
      ` tok/s; load ${load()[0].toFixed(2)}`,
  );
}
/** Decode tok/s of `key` over the prompts of `kind` (undefined: all), from the per-prompt median times. */
const decodeTokPerS = (key, kind) => {
  const ps = prompts.filter((p) => kind === undefined || p.kind === kind);
  return (ps.length * (NEW - 1)) / ps.reduce((t, p) => t + median(acc.get(key).dt.get(p.id)), 0);
};

// Prefill: time to first token of a one-token request.
const prefillRows = [];
for (const P of PREFILL) {
  const ids = corpus.slice(0, P);
  const runs = { 'specd-64': [], 'specd-512': [], llama: [] };
  for (let rep = 0; rep < REPS; rep++) {
    const order = rep % 2 === 0 ? ['specd-64', 'specd-512', 'llama'] : ['llama', 'specd-512', 'specd-64'];
    for (const k of order) {
      const res = k === 'llama' ? await llamacpp(lplain, ids, 1) : specd(specdChunk.get(Number(k.slice(6))), ids, 1);
      runs[k].push((res.times[0] - res.t0) / 1000);
    }
  }
  const ttft = Object.fromEntries(Object.entries(runs).map(([k, v]) => [k, median(v)]));
  prefillRows.push({ P, ttft, tokPerS: Object.fromEntries(Object.entries(ttft).map(([k, v]) => [k, P / v])) });
  console.log(
    `prefill ${P}: ${Object.entries(ttft)
      .map(([k, v]) => `${k} ${(P / v).toFixed(0)} tok/s (ttft ${(v * 1000).toFixed(0)} ms)`)
      .join(', ')}; load ${load()[0].toFixed(2)}`,
  );
}

// --- results ----------------------------------------------------------------------------------------
const firstDiff = (a, b) => {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : Math.min(a.length, b.length);
};
const specdOut = acc.get('specd').outputs;
const llamaOut = acc.get('llama').outputs;
const divergence = prompts.map((p) => ({ id: p.id, at: firstDiff(specdOut.get(p.id), llamaOut.get(p.id)) }));
const mismatches = []; // a specd drafter run that is not its plain greedy output: a bug
const lookupDiffs = []; // llama.cpp with lookup vs without: numerics of multi-token batches, not a bug of ours
for (const r of racers) {
  if (r.key === 'specd' || r.key === 'llama') continue;
  const isLlama = r.key.startsWith('llama');
  for (const p of prompts) {
    const at = firstDiff((isLlama ? llamaOut : specdOut).get(p.id), acc.get(r.key).outputs.get(p.id));
    if (at >= 0) (isLlama ? lookupDiffs : mismatches).push(`${r.key}: ${p.id} @${at}`);
  }
}
// At each divergence: llama.cpp's probabilities of its own token and of specd's token there (near-ties?).
for (const d of divergence) {
  if (d.at < 0) continue;
  const p = prompts.find((q) => q.id === d.id);
  const ctx = [...p.ids, ...specdOut.get(d.id).slice(0, d.at)];
  await lplain.clearHistory();
  for await (const x of lplain.evaluateWithMetadata(
    ctx,
    { probabilities: true },
    { temperature: 0, yieldEogToken: true },
  )) {
    d.llamaP = x.probabilities.get(llamaOut.get(d.id)[d.at]) ?? 0;
    d.specdTokenLlamaP = x.probabilities.get(specdOut.get(d.id)[d.at]) ?? 0;
    break;
  }
}

const llamaTok = decodeTokPerS('llama');
const specdTok = decodeTokPerS('specd');
const rows = racers.map((r) => {
  const a = acc.get(r.key);
  const row = {
    key: r.key,
    label: r.label,
    tokPerS: decodeTokPerS(r.key),
    chat: decodeTokPerS(r.key, 'chat'),
    plain: decodeTokPerS(r.key, 'plain'),
    repTotals: a.repTotals,
  };
  row.vsLlama = row.tokPerS / llamaTok;
  row.vsSpecd = row.tokPerS / specdTok;
  if (r.key === 'llama-lookup')
    row.note =
      `predicted tokens validated ${a.validated}, refuted ${a.refuted} (` +
      `${((100 * a.validated) / Math.max(1, a.validated + a.refuted)).toFixed(0)}% accepted)`;
  if (r.engine !== undefined) {
    const m = r.engine.metrics;
    row.tauPerStep = m.tauPerStep;
    row.perPosition = m.perPositionAcceptance;
    row.note =
      `τ per step ${m.tauPerStep.toFixed(3)}, drafts/step ` + `${(m.drafted / Math.max(1, m.verifySteps)).toFixed(2)}`;
  }
  return row;
});
// Ceiling of each drafter (C = 1, greedy): max-k acceptance × calibrated costs.
for (const d of drafters) {
  if (d.absent) continue;
  const c = d.cost.stepCosts;
  const perPos = d.max.metrics.perPositionAcceptance;
  const tStep = c.stepMs(1);
  let best = { k: 0, value: 1 };
  let tau = 1;
  for (let k = 1; k <= d.drafter.maxDraftTokens; k++) {
    tau += perPos[k - 1] ?? 0;
    const value = (tau * tStep) / (c.draftMs(1, k) + c.verifyMs(1, k + 1));
    if (value > best.value) best = { k, value };
  }
  d.ceiling = best;
  const row = rows.find((r) => r.key === `${d.method}-cost`);
  row.note += `; ceiling ×${best.value.toFixed(3)} at k=${best.k} (vs specd plain)`;
}

console.log('\nGreedy agreement, specd vs llama.cpp (first differing output token; -1 = all equal):');
console.log(divergence.map((d) => `${d.id} ${d.at}`).join(', '));
console.log(
  `llama.cpp's own probabilities there, p(its token) / p(specd's token): ${divergence
    .filter((d) => d.at >= 0)
    .map((d) => `${d.id} ${d.llamaP.toFixed(3)}/${d.specdTokenLlamaP.toFixed(3)}`)
    .join(', ')}`,
);
const agreeAll = divergence.filter((d) => d.at < 0).length;
const firstDivs = divergence.filter((d) => d.at >= 0).map((d) => d.at);
const firstDivergence = firstDivs.length
  ? `; first divergence at token ${Math.min(...firstDivs)} at the earliest, median ${median(firstDivs)}`
  : '';
console.log(`${agreeAll}/${prompts.length} prompts identical over ${NEW} tokens${firstDivergence}`);
if (lookupDiffs.length)
  console.log(
    'llama.cpp + prompt lookup differs from llama.cpp plain (greedy; its ' +
      `multi-token verify batches round differently): ${lookupDiffs.join(', ')}`,
  );
else console.log('llama.cpp + prompt lookup equals llama.cpp plain on every prompt');
if (mismatches.length) console.log(`SPECD LOSSLESSNESS MISMATCHES (a bug): ${mismatches.join(', ')}`);
else if (drafters.some((d) => !d.absent))
  console.log('specd drafter runs equal specd plain greedy output on every prompt');

const f1 = (x) => x.toFixed(1);
console.log(
  `\n| engine (threads ${THREADS}, greedy, ${NEW} new tokens, EOS ignored) | decode tok/s (all ` +
    `${prompts.length}) | chat ${NPROMPTS} | plain ${NPROMPTS} | ÷ llama.cpp plain | ÷ specd plain | notes |`,
);
console.log('|---|---:|---:|---:|---:|---:|---|');
for (const r of rows)
  console.log(
    `| ${r.label} | ${f1(r.tokPerS)} | ${f1(r.chat)} | ${f1(r.plain)} | ` +
      `${r.vsLlama.toFixed(3)} | ${r.vsSpecd.toFixed(3)} | ${r.note ?? ''} |`,
  );
for (const d of drafters)
  if (d.absent)
    console.log(
      `| specd + ${d.method} (max k / cost policy) | not trained yet ` +
        `| | | | | models/smollm2-135m-instruct-${d.method} absent |`,
    );
console.log(
  '\n| prefill (time to first token, one new token) | specd chunk 64 (default) tok/s | specd ' +
    'chunk 512 tok/s | llama.cpp (batch 512) tok/s | specd 64 ÷ llama.cpp | specd 512 ÷ llama.cpp |',
);
console.log('|---|---:|---:|---:|---:|---:|');
for (const p of prefillRows) {
  const t = p.tokPerS;
  console.log(
    `| ${p.P}-token prompt | ${t['specd-64'].toFixed(0)} (${(p.ttft['specd-64'] * 1000).toFixed(0)}` +
      ` ms) | ${t['specd-512'].toFixed(0)} (${(p.ttft['specd-512'] * 1000).toFixed(0)} ms) | ` +
      `${t.llama.toFixed(0)} (${(p.ttft.llama * 1000).toFixed(0)} ms) | ` +
      `${(t['specd-64'] / t.llama).toFixed(3)} | ${(t['specd-512'] / t.llama).toFixed(3)} |`,
  );
}
const [e1, e5] = load();
console.log(`\nload at the end ${e1.toFixed(2)} / ${e5.toFixed(2)} (1/5 min)`);
if (jsonOut) {
  fs.writeFileSync(
    jsonOut,
    `${JSON.stringify({
      threads: THREADS,
      isa: info.isa,
      prompts: prompts.map((p) => p.id),
      newTokens: NEW,
      reps: REPS,
      nodeLlamaCpp: NLC_VERSION,
      loadStart: [l1, l5],
      loadEnd: [e1, e5],
      decode: rows,
      prefill: prefillRows,
      divergence,
      mismatches,
      lookupDiffs,
      drafters: drafters.map((d) =>
        d.absent
          ? { method: d.method, absent: true }
          : { method: d.method, maxK: d.drafter.maxDraftTokens, ceiling: d.ceiling },
      ),
    })}\n`,
  );
}

for (const d of drafters) d.drafter?.dispose();
await lctx.dispose();
await lmodel.dispose();
await llama.dispose();
target.model.dispose();
