#!/usr/bin/env node
// Per-step native call and thread-pool costs of plain decoding on SmolLM2-135M-Instruct Q4_1 (issue 16:
// "plain decode near the bandwidth bound on a 30-layer model needs few native calls per layer per step").
//
//   node bench/decode-calls.mjs [--threads N] [--tokens N] [--reps N] [--json FILE] [--quick]
//   (bench:peer runs it in a child process and folds its summary into its goals)
//
// Measured in one process, at `--threads` (default 2) and at 1 thread, alternating, `--reps` times (default 3):
//   1. plain decode step time: SpecEngine without a drafter, one request of the first chat prompt of
//      tools/reference/smollm2/prompts/chat.jsonl, `--tokens` new tokens (default 128), greedy, EOS ignored;
//      ms per step = (time of the last token − time of the first) / (tokens − 1), median over reps;
//   2. a profiled pass of the same request (bench/native-timing.mjs by function name, through a resolve hook: every
//      synchronous kernel call of '@specd/native' counted and timed, from the first token's onToken on):
//      native calls per step and per layer per step, by function, with µs per call; the rest of the step
//      (engine, model JavaScript, the wrappers' own timers) is "JavaScript";
//   3. probes: the cost of one native call that does no work (`parallelCopy` of two empty arrays: the JS
//      facade's argument checks, the N-API crossing, an inline ParallelFor over 0 items; median of 7 × 20,000
//      calls) and of one pool hand-off (`parallelCopy` of 512 KiB, the smallest copy ParallelFor splits:
//      32 chunks of 16 KiB, 2 × 2^17 work units; hand-off cost ≈ t(T threads) − t(1 thread) / T, since an
//      ideal split of the same work would take t(1)/T; median of 7 × 2,000 calls, the copy L2-resident).
// The fraction of a step these cost: calls per step × no-op µs, and the step at 1 thread ÷ the step at T threads
// (the pool's net effect on the whole step: hand-offs paid, parallel work gained).
import * as fs from 'node:fs';
import { register } from 'node:module';
import { cpus, loadavg } from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { median } from './stats.mjs';

register('./native-timing-hooks.mjs', import.meta.url);
const { nativeTiming: nativeCalls, parallelCopy, setNumThreads, isa } = await import('./native-timing.mjs');
const { BUILTIN_PLUGIN_PACKAGES, GgufFile, SpecEngine, loadTarget } = await import('@specd/core');

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const quick = argv.includes('--quick');
const THREADS = Number(arg('threads', '2'));
const NEW = Number(arg('tokens', quick ? '64' : '128'));
const REPS = Number(arg('reps', quick ? '2' : '3'));
const jsonOut = arg('json', undefined);
const MODEL_DIR = path.join(ROOT, 'models/smollm2-135m-instruct');
const GGUF = path.join(MODEL_DIR, 'SmolLM2-135M-Instruct.Q4_1.gguf');
if (!fs.existsSync(GGUF)) throw new Error(`decode-calls: ${GGUF} is missing: run \`npm run models:fetch\``);

const layers = GgufFile.open(GGUF).metadata.get('llama.block_count')?.value;
if (typeof layers !== 'number') throw new Error(`decode-calls: ${GGUF}: no llama.block_count`);
const prompt = JSON.parse(
  fs.readFileSync(path.join(ROOT, 'tools/reference/smollm2/prompts/chat.jsonl'), 'utf8').split('\n')[0],
);

setNumThreads(THREADS);
const target = await loadTarget(MODEL_DIR, BUILTIN_PLUGIN_PACKAGES);
const engine = new SpecEngine(target.model, undefined, { maxSequences: 1, maxTokensPerSequence: 1024 });

let nextId = 0;
/** One greedy request; `profile`: count native calls from the first token on. @returns ms per step. */
function decode(profile) {
  const times = [];
  nativeCalls.reset();
  engine.run([
    {
      id: `c${nextId++}`,
      promptIds: Int32Array.from(prompt.prompt_token_ids),
      maxTokens: NEW,
      sampling: { temperature: 0 },
      seed: 1,
      ignoreEos: true,
      onToken: () => {
        times.push(performance.now());
        if (profile && times.length === 1) nativeCalls.enabled = true;
        if (times.length === NEW) nativeCalls.enabled = false;
      },
    },
  ]);
  nativeCalls.enabled = false;
  return (times[NEW - 1] - times[0]) / (NEW - 1);
}

/** Median µs per call of `fn` over 7 batches of `count` calls. */
function perCallUs(fn, count) {
  for (let i = 0; i < count; i++) fn();
  const xs = [];
  for (let r = 0; r < 7; r++) {
    const t0 = performance.now();
    for (let i = 0; i < count; i++) fn();
    xs.push(((performance.now() - t0) * 1000) / count);
  }
  return median(xs);
}

const empty = new Float32Array(0);
const splitSrc = new Float32Array(32 * 4096).fill(1);
const splitDst = new Float32Array(32 * 4096);
const threadCounts = THREADS === 1 ? [1] : [THREADS, 1];
const steps = new Map(threadCounts.map((t) => [t, []]));
const probes = new Map(threadCounts.map((t) => [t, { noopUs: [], splitUs: [] }]));
decode(false); // warm-up: JIT, page faults
for (let rep = 0; rep < REPS; rep++) {
  for (const t of rep % 2 === 0 ? threadCounts : [...threadCounts].reverse()) {
    setNumThreads(t);
    steps.get(t).push(decode(false));
    probes.get(t).noopUs.push(perCallUs(() => parallelCopy(empty, empty), 20000));
    probes.get(t).splitUs.push(perCallUs(() => parallelCopy(splitDst, splitSrc), 2000));
  }
}
/** Per thread count: the profiled pass (calls and native time per step, by function). */
const profiles = new Map();
for (const t of threadCounts) {
  setNumThreads(t);
  const wallMs = decode(true);
  const byName = [...nativeCalls.totals]
    .map(([name, v]) => ({ name, callsPerStep: v.calls / (NEW - 1), msPerStep: v.ms / (NEW - 1) }))
    .sort((a, b) => b.msPerStep - a.msPerStep);
  profiles.set(t, { wallMs, byName });
}
setNumThreads(THREADS);

const stepMs = median(steps.get(THREADS));
const step1Ms = median(steps.get(1));
const noopUs = median(probes.get(THREADS).noopUs);
const splitUs = median(probes.get(THREADS).splitUs);
const split1Us = median(probes.get(1).splitUs);
const handoffUs = THREADS === 1 ? 0 : splitUs - split1Us / THREADS;
const prof = profiles.get(THREADS);
const callsPerStep = prof.byName.reduce((a, r) => a + r.callsPerStep, 0);
const nativeMs = prof.byName.reduce((a, r) => a + r.msPerStep, 0);
const summary = {
  cpu: cpus()[0]?.model,
  vcpus: cpus().length,
  isa: isa().isa,
  threads: THREADS,
  layers,
  newTokens: NEW,
  reps: REPS,
  stepMs,
  step1Ms,
  callsPerStep,
  callsPerLayerPerStep: callsPerStep / layers,
  noopUs,
  noopShare: (callsPerStep * noopUs) / (stepMs * 1000),
  poolSplitUs: splitUs,
  poolSplit1Us: split1Us,
  handoffUs,
  poolSpeedup: step1Ms / stepMs,
  profiledWallMs: prof.wallMs,
  nativeMsPerStep: nativeMs,
  javascriptMsPerStep: prof.wallMs - nativeMs,
  byName: prof.byName,
  byName1: profiles.get(1)?.byName,
  load: loadavg().slice(0, 2),
};

const f2 = (x) => x.toFixed(2);
console.log(
  `decode-calls — SmolLM2-135M-Instruct Q4_1, plain decode, ${NEW} tokens, ${REPS} reps, threads ${THREADS} ` +
    `(and 1); ${summary.vcpus} vCPUs (${summary.cpu}); isa ${summary.isa}; load ${summary.load.map(f2).join(' / ')}`,
);
console.log(
  `step ${f2(stepMs)} ms at ${THREADS} threads, ${f2(step1Ms)} ms at 1 thread (the pool's net effect: ` +
    `×${f2(summary.poolSpeedup)}); native calls per step ${callsPerStep.toFixed(1)} = ` +
    `${summary.callsPerLayerPerStep.toFixed(2)} per layer (${layers} layers)`,
);
console.log(
  `no-op native call ${noopUs.toFixed(3)} µs → ${(100 * summary.noopShare).toFixed(2)} % of a step; pool hand-off ` +
    `(512 KiB parallelCopy): ${f2(splitUs)} µs at ${THREADS} threads vs ${f2(split1Us)} µs at 1 → ` +
    `${f2(handoffUs)} µs per split call`,
);
console.log(
  `profiled step ${f2(prof.wallMs)} ms: native ${f2(nativeMs)} ms, JavaScript (engine, model, timers) ` +
    `${f2(summary.javascriptMsPerStep)} ms`,
);
console.log(
  `\n| native call | calls per step | per layer | µs per call (${THREADS} thr) | µs per call (1 thr) | ms per step |`,
);
console.log('|---|---:|---:|---:|---:|---:|');
for (const r of prof.byName) {
  const one = summary.byName1?.find((x) => x.name === r.name);
  console.log(
    `| ${r.name} | ${r.callsPerStep.toFixed(1)} | ${(r.callsPerStep / layers).toFixed(2)} | ` +
      `${((1000 * r.msPerStep) / r.callsPerStep).toFixed(1)} | ` +
      `${one ? ((1000 * one.msPerStep) / one.callsPerStep).toFixed(1) : '–'} | ${f2(r.msPerStep)} |`,
  );
}
if (jsonOut) fs.writeFileSync(jsonOut, `${JSON.stringify(summary)}\n`);
target.model.dispose();
