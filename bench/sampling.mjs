#!/usr/bin/env node
// The sampled row's cost: `samplingProbs` (temperature, top-k, top-p, softmax in one native call) on real SmolLM2
// logits, at several sampling settings, optionally against another build of the addon in the same process (an A/B
// of a kernel change: build the old commit's addon in a git worktree and pass its .node file).
//
//   npm run bench:sampling                       (root; run `npm run build` first; ~1 min)
//   node bench/sampling.mjs [--rows 64] [--calls 1000] [--reps 5] [--against path/to/specd_native.node]
//
// Rows: the logits SmolLM2-135M-Instruct (models/smollm2-135m-instruct) produces while decoding the held-out chat
// prompts at its default sampling (generation_config.json), captured from the engine's own samplingProbs calls.
// Each setting runs `--calls` calls over the rows in turn, `--reps` times, the addons alternating; the best repetition
// is reported (µs a row), with the support's mean size (the kept tokens) from this build. One thread per row: the
// call parallelises over rows only. Bench-only.
import { cpus } from 'node:os';
import * as path from 'node:path';
import { register } from 'node:module';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const arg = (n, d) => (argv.indexOf(`--${n}`) >= 0 ? argv[argv.indexOf(`--${n}`) + 1] : d);
const ROWS = Number(arg('rows', '64'));
const CALLS = Number(arg('calls', '1000'));
const REPS = Number(arg('reps', '5'));
const AGAINST = arg('against', undefined);
for (const [name, v] of [
  ['rows', ROWS],
  ['calls', CALLS],
  ['reps', REPS],
])
  if (!(Number.isSafeInteger(v) && v >= 1)) throw new Error(`bench:sampling: --${name}: expected an integer >= 1`);

// the timing shim's onCall hook sees the engine's samplingProbs arguments
register('./native-timing-hooks.mjs', import.meta.url);
const { BUILTIN_PLUGIN_PACKAGES, SpecEngine, loadTarget, readModelSamplingDefaults } = await import('@specd/core');
const { isa } = await import('@specd/native');
const { nativeTiming } = await import('./native-timing.mjs');
const { promptSets } = await import('./prompts.mjs');

const dir = path.join(ROOT, 'models', 'smollm2-135m-instruct');
const target = await loadTarget(dir, BUILTIN_PLUGIN_PACKAGES);
const V = target.model.info.vocabSize;
const gen = readModelSamplingDefaults(dir) ?? {};
const defaults = { temperature: gen.temperature ?? 1, topP: gen.top_p ?? 1 };
const rows = [];
nativeTiming.onCall = (name, args) => {
  if (name === 'samplingProbs' && rows.length < ROWS && args[1] === V)
    rows.push(Float32Array.from(args[0].subarray(0, V)));
};
const engine = new SpecEngine(target.model, undefined, { maxSequences: 1, maxTokensPerSequence: 2048 });
const chat = promptSets('smollm2')[0];
for (let i = 0; rows.length < ROWS; i++)
  engine.run([
    {
      id: `s${i}`,
      promptIds: Int32Array.from(chat[i % chat.length].prompt_token_ids),
      maxTokens: 32,
      sampling: defaults,
      seed: i,
      ignoreEos: true,
    },
  ]);
nativeTiming.onCall = null;

const require = createRequire(import.meta.url);
const addons = [['this build', require(path.join(ROOT, 'native', 'build', 'Release', 'specd_native.node'))]];
if (AGAINST !== undefined) addons.push(['--against', require(path.resolve(AGAINST))]);
const settings = [
  [defaults.temperature, 0, defaults.topP],
  [0.7, 0, 0.95],
  [1, 0, 0.9],
  [1, 0, 1],
  [0.7, 40, 0.95],
];
const out = new Float32Array(V);
const ids = new Int32Array(V);
const counts = new Int32Array(1);
const best = new Map();
const kept = new Map();
for (let rep = 0; rep < REPS; rep++)
  for (const [name, addon] of addons)
    for (const [t, k, p] of settings) {
      const key = `${t}|${k}|${p}|${name}`;
      const call = (r) => addon.samplingProbs(rows[r], 1, V, t, k, p, out);
      for (let i = 0; i < 100; i++) call(i % ROWS);
      const t0 = performance.now();
      for (let i = 0; i < CALLS; i++) call(i % ROWS);
      best.set(key, Math.min(best.get(key) ?? Number.POSITIVE_INFINITY, ((performance.now() - t0) / CALLS) * 1000));
      if (rep === 0 && name === 'this build') {
        let n = 0;
        for (let r = 0; r < ROWS; r++) {
          addon.samplingProbs(rows[r], 1, V, t, k, p, out, ids, counts);
          n += counts[0];
        }
        kept.set(`${t}|${k}|${p}`, n / ROWS);
      }
    }

const info = isa();
console.log(
  `bench:sampling — samplingProbs on ${ROWS} rows of SmolLM2 logits (${V} tokens, captured at ` +
    `T ${defaults.temperature}, top-p ${defaults.topP}); ${CALLS} calls × ${REPS} reps, best; ` +
    `isa ${info.isa}${info.amxAvailable ? ' + AMX' : ''}, ${cpus()[0]?.model ?? '?'}`,
);
console.log(`| T | top-k | top-p | kept tokens (mean) | ${addons.map(([n]) => `${n} µs a row`).join(' | ')} |`);
console.log(`|---:|---:|---:|---:|${addons.map(() => '---:').join('|')}|`);
for (const [t, k, p] of settings)
  console.log(
    `| ${t} | ${k} | ${p} | ${kept.get(`${t}|${k}|${p}`).toFixed(1)} | ` +
      `${addons.map(([n]) => best.get(`${t}|${k}|${p}|${n}`).toFixed(1)).join(' | ')} |`,
  );
