#!/usr/bin/env node
// Where a verify block's time goes on SmolLM2-135M-Instruct Q4_1 (the GGUF path, default activations): one
// forward of m rows (m = 1: a decode step; m > 1: a verify block, logits of every row) after a context of
// `--context` tokens, every synchronous kernel of '@specd/native' timed by name (bench/native-timing.mjs), the
// rest of the forward reported as JavaScript. The m values alternate per round; medians over `--reps` rounds.
//
//   node bench/verify-profile.mjs [--rows 1,2,4,8,16] [--context 64] [--reps 30] [--threads 2]
import { register } from 'node:module';
import { loadavg } from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { median } from './stats.mjs';

register('./native-timing-hooks.mjs', import.meta.url);
const { nativeTiming, setNumThreads, isa } = await import('./native-timing.mjs');
const { GgufFile, SequenceCache } = await import('@specd/core');
const { ggufSource, loadLlamaStage, parseGgufLlamaConfig } = await import('@specd/model-llama');

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const ROWS = arg('rows', '1,2,4,8,16').split(',').map(Number);
const CONTEXT = Number(arg('context', '64'));
const REPS = Number(arg('reps', '30'));
const THREADS = Number(arg('threads', '2'));
const ACT = process.env.SPECD_GGUF_ACT || 'int16';
setNumThreads(THREADS);
const GGUF = path.join(ROOT, 'models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf');
const file = GgufFile.open(GGUF);
const model = loadLlamaStage(parseGgufLlamaConfig(file), ggufSource(file, 'quant', undefined, undefined, ACT));
const V = model.info.vocabSize;
const maxRows = Math.max(...ROWS);
const cache = new SequenceCache(model.cacheGeometry, {
  pageSize: 16,
  numPages: Math.ceil((CONTEXT + maxRows) / 16) + 1,
  numSlots: 1,
});
cache.add('s');
const prompt = Int32Array.from({ length: CONTEXT }, (_, i) => 1 + ((i * 7919) % (V - 1)));
model.forward({ sequences: [{ id: 's', position: 0, tokens: prompt, logits: 'last' }] }, cache);
/** m → { wall: number[], fam: Map<name, number[]> } */
const res = new Map(ROWS.map((m) => [m, { wall: [], fam: new Map() }]));
for (let r = 0; r < REPS + 2; r++) {
  const order = r % 2 === 0 ? ROWS : [...ROWS].reverse();
  for (const m of order) {
    const block = Int32Array.from({ length: m }, (_, i) => 1 + (((i + r) * 104729) % (V - 1)));
    const cp = cache.checkpoint('s');
    nativeTiming.reset();
    nativeTiming.enabled = true;
    const t0 = performance.now();
    model.forward(
      { sequences: [{ id: 's', position: CONTEXT, tokens: block, logits: m === 1 ? 'last' : 'all' }] },
      cache,
    );
    const wall = performance.now() - t0;
    nativeTiming.enabled = false;
    cache.rollback('s', cp);
    if (r < 2) continue; // warm-up
    const e = res.get(m);
    e.wall.push(wall);
    let native = 0;
    for (const [name, t] of nativeTiming.totals) {
      if (!e.fam.has(name)) e.fam.set(name, []);
      e.fam.get(name).push(t.ms);
      native += t.ms;
    }
    if (!e.fam.has('JavaScript')) e.fam.set('JavaScript', []);
    e.fam.get('JavaScript').push(wall - native);
  }
}
const l = loadavg();
console.log(
  `verify-profile: SmolLM2-135M-Instruct Q4_1, activations ${ACT}, isa ${isa().isa}, threads ${THREADS}, context ` +
    `${CONTEXT}, ${REPS} rounds; load ${l[0].toFixed(2)} / ${l[1].toFixed(2)}; ms, medians (ratio to m = 1)`,
);
const names = [...new Set([...res.values()].flatMap((e) => [...e.fam.keys()]))].sort(
  (a, b) => median(res.get(maxRows).fam.get(b) ?? [0]) - median(res.get(maxRows).fam.get(a) ?? [0]),
);
const one = res.get(ROWS[0]);
console.log(`| part | ${ROWS.map((m) => `m = ${m}`).join(' | ')} |`);
console.log(`|---|${ROWS.map(() => '---:').join('|')}|`);
const cell = (v, base) => `${v.toFixed(2)}${base > 0 ? ` (${(v / base).toFixed(1)})` : ''}`;
for (const n of names) {
  const b = median(one.fam.get(n) ?? [0]);
  console.log(`| ${n} | ${ROWS.map((m) => cell(median(res.get(m).fam.get(n) ?? [0]), b)).join(' | ')} |`);
}
const bw = median(one.wall);
console.log(`| **whole forward** | ${ROWS.map((m) => `**${cell(median(res.get(m).wall), bw)}**`).join(' | ')} |`);
