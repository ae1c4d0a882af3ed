#!/usr/bin/env node
// A/B of two builds of specd in ONE process (paired, alternated per rep, so machine noise hits both alike): an
// older checkout (`--old DIR`, built with `npm ci && npm run build`, its SmolLM2 GGUF fetched) against this one.
//
//   npm run bench:ab -- --old ../specd-before [--reps 7]
//
// SmolLM2-135M-Instruct Q4_1 (this checkout's models/), greedy, EOS ignored: plain decoding (4 prompts × 64
// tokens), EAGLE-3 and DFlash at draftPolicy 'max' (same drafts, same work in both builds), and a 512-token
// prefill (chunk 64). Outputs of the two builds are checked equal first. Prints per case the median wall time of
// each build and the median of the per-rep ratios new / old (< 1: this checkout is faster).
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { median as med } from './stats.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 && i + 1 < argv.length ? argv[i + 1] : dflt;
};
const OLD = arg('old', undefined);
if (OLD === undefined) throw new Error('bench:ab: --old DIR (a built checkout of specd to compare with) is required');
const sides = { old: { root: path.resolve(OLD) }, new: { root: ROOT } };
const MODEL = path.join(ROOT, 'models', 'smollm2-135m-instruct');
const REPS = Number(arg('reps', '7'));
const lines = fs
  .readFileSync(path.join(ROOT, 'tools/reference/smollm2/prompts/plain.jsonl'), 'utf8')
  .trim()
  .split('\n');
const prompts = lines.slice(0, 4).map((l) => Int32Array.from(JSON.parse(l).prompt_token_ids));
const corpus = [];
for (const l of lines) corpus.push(...JSON.parse(l).prompt_token_ids);
const long = Int32Array.from(corpus.slice(0, 512));
for (const [name, s] of Object.entries(sides)) {
  process.chdir(s.root); // plugin packages resolve from the working directory: each build loads its own
  const core = await import(`${s.root}/packages/core/dist/index.js`);
  s.core = core;
  s.target = await core.loadTarget(MODEL, core.BUILTIN_PLUGIN_PACKAGES);
  const mk = (drafter, opts = {}) =>
    new core.SpecEngine(s.target.model, drafter, { maxSequences: 1, maxTokensPerSequence: 1024, ...opts });
  s.engines = { plain: mk(undefined), prefill: mk(undefined, { prefillChunk: 64 }) };
  for (const m of ['eagle3', 'dflash']) {
    const { drafter } = await core.loadDrafter(
      path.join(ROOT, 'models', `smollm2-135m-instruct-${m}`),
      core.BUILTIN_PLUGIN_PACKAGES,
      s.target,
      1024,
      1,
    );
    s.engines[m] = mk(drafter, { draftPolicy: 'max' });
  }
  console.log(name, 'loaded');
}
let id = 0;
function run(e, ids, n) {
  const t0 = performance.now();
  const [r] = e.run([
    { id: `r${id++}`, promptIds: ids, maxTokens: n, sampling: { temperature: 0 }, seed: 1, ignoreEos: true },
  ]);
  return [performance.now() - t0, r.tokenIds];
}
const cases = {
  plain: (s) => prompts.reduce((t, p) => t + run(s.engines.plain, p, 64)[0], 0),
  eagle3: (s) => prompts.reduce((t, p) => t + run(s.engines.eagle3, p, 64)[0], 0),
  dflash: (s) => prompts.reduce((t, p) => t + run(s.engines.dflash, p, 64)[0], 0),
  prefill512: (s) => run(s.engines.prefill, long, 1)[0],
};
// equality of outputs first (and warm-up)
for (const c of ['plain', 'eagle3', 'dflash']) {
  const a = run(sides.old.engines[c], prompts[0], 64)[1];
  const b = run(sides.new.engines[c], prompts[0], 64)[1];
  if (a.join() !== b.join()) throw new Error(`${c}: outputs differ`);
}
const res = {};
for (const c of Object.keys(cases)) res[c] = { old: [], new: [] };
for (let r = 0; r < REPS; r++) {
  for (const c of Object.keys(cases)) {
    const order = r % 2 === 0 ? ['old', 'new'] : ['new', 'old'];
    for (const s of order) res[c][s].push(cases[c](sides[s]));
  }
}
for (const [c, v] of Object.entries(res)) {
  const ratios = v.new.map((x, i) => x / v.old[i]);
  const perRep = ratios.map((x) => x.toFixed(2)).join(' ');
  console.log(
    `${c}: old ${med(v.old).toFixed(1)} ms, new ${med(v.new).toFixed(1)} ms, ` +
      `median new/old ${med(ratios).toFixed(3)} (per rep ${perRep})`,
  );
}
process.exit(0);
