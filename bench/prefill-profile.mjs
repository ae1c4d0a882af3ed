#!/usr/bin/env node
// Where specd's prefill time goes on SmolLM2-135M-Instruct Q4_1: time to the first token of a one-token request of P
// prompt tokens (the corpus' prompt ids concatenated, as bench:peer's prefill), per prefill chunk, with every
// synchronous kernel of '@specd/native' timed by name in the last repetition (bench/native-timing.mjs).
//
//   node bench/prefill-profile.mjs [--prefill 512,2048] [--chunks 64,512] [--reps 3] [--threads 2]
//
// Each repetition is printed: on the 2-vCPU VM of docs/BENCHMARKS.md the cores run about twice as fast for the first
// seconds of a burst as under sustained load (`--reps 12 --prefill 512 --chunks 512` shows the drop), so compare
// builds or settings alternated in one run, not across runs.
import * as fs from 'node:fs';
import { register } from 'node:module';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

register('./native-timing-hooks.mjs', import.meta.url);
const { nativeTiming, setNumThreads, isa } = await import('./native-timing.mjs');
const { BUILTIN_PLUGIN_PACKAGES, SpecEngine, loadTarget } = await import('@specd/core');

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const list = (s) => s.split(',').map(Number);
const PREFILL = list(arg('prefill', '512,2048'));
const CHUNKS = list(arg('chunks', '64,512'));
const REPS = Number(arg('reps', '3'));
setNumThreads(Number(arg('threads', '2')));

const target = await loadTarget(path.join(ROOT, 'models/smollm2-135m-instruct'), BUILTIN_PLUGIN_PACKAGES);
const corpus = [];
for (const f of ['chat', 'plain'])
  for (const l of fs.readFileSync(path.join(ROOT, 'tools/reference/smollm2/prompts', `${f}.jsonl`), 'utf8').split('\n'))
    if (l.trim()) corpus.push(...JSON.parse(l).prompt_token_ids);
const info = isa();
console.log(`prefill-profile — SmolLM2-135M-Instruct Q4_1; isa ${info.isa}, threads ${info.threads}`);
let id = 0;
for (const P of PREFILL) {
  if (corpus.length < P) throw new Error(`prefill-profile: the corpus has ${corpus.length} prompt tokens, < ${P}`);
  const ids = Int32Array.from(corpus.slice(0, P));
  for (const chunk of CHUNKS) {
    const e = new SpecEngine(target.model, undefined, {
      maxSequences: 1,
      maxTokensPerSequence: P + 16,
      prefillChunk: chunk,
    });
    const reps = [];
    for (let rep = 0; rep < REPS; rep++) {
      nativeTiming.reset();
      nativeTiming.enabled = rep === REPS - 1;
      const t0 = performance.now();
      let t1 = 0;
      e.run([
        {
          id: `p${id++}`,
          promptIds: ids,
          maxTokens: 1,
          sampling: { temperature: 0 },
          seed: 1,
          ignoreEos: true,
          onToken: () => {
            t1 = performance.now();
          },
        },
      ]);
      nativeTiming.enabled = false;
      reps.push(t1 - t0);
    }
    console.log(
      `\nP ${P}, chunk ${chunk}: ${reps.map((ms) => `${((P / ms) * 1000).toFixed(0)}`).join(' / ')} tok/s ` +
        `(${reps.map((ms) => ms.toFixed(0)).join(' / ')} ms); kernels of the last repetition:`,
    );
    let native = 0;
    for (const [name, v] of [...nativeTiming.totals].sort((a, b) => b[1].ms - a[1].ms)) {
      native += v.ms;
      console.log(`  ${name}: ${v.ms.toFixed(1)} ms, ${v.calls} calls`);
    }
    console.log(`  native ${native.toFixed(0)} of ${reps[REPS - 1].toFixed(0)} ms`);
  }
}
