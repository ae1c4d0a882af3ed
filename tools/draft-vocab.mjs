#!/usr/bin/env node
// FR-Spec's reduced draft vocabulary (Zhao et al. 2025, arXiv 2502.14856, §3.2) for a drafter that shares the
// target's lm_head (DFlash, DSpark): counts token frequencies of text the drafter never sees in evaluation, keeps
// the `--size` most frequent ids, and writes a copy of the drafter's checkpoint with `dflash_config.draft_vocab_size`
// and the id list as the tensor `draft_vocab_ids` ([size] I32, ascending; the plugin validates it at load).
//
//   node tools/draft-vocab.mjs [--target models/smollm2-135m-instruct] [--drafter models/smollm2-135m-instruct-dflash]
//                              [--size 8192] [--generate 64] [--tokens 64] [--out DIR]
//   (default --out: <drafter>-v<size>; models/ copies are not committed: run this after `npm run models:fetch`)
//   `--drafter` and `--size` take comma lists (one count, a copy per drafter and size; `--out` then refused): the
//   list depends on the target and the counted text only, so DFlash and DSpark get the same ids. A sharded
//   checkpoint keeps its shards (the ids go into the first, its index updated), so every file stays as small.
//   The shipped SmolLM2 DFlash and DSpark carry the 24,576-id list of
//   `--drafter models/smollm2-135m-instruct-dflash,models/smollm2-135m-instruct-dspark --size 24576 --generate 1024`
//   (docs/BENCHMARKS.md, "A full DFlash block under half a target step").
//
// Counted text (never the held-out prompts of tools/reference/smollm2/prompts/{chat,plain}.jsonl or test/prompts):
// - the drafter's training prompts, tools/reference/smollm2/prompts/train_prompts.u16 (32,768 prompts of the
//   corpora's train splits, concatenated u16 ids; train_prompts.len.u16 holds one length per prompt);
// - the target's own greedy continuations (EOS ignored) of the first `--generate` training prompts, `--tokens`
//   each — what a drafter trained on regenerated data predicts; weighted so that they count as much as the
//   prompts in total (each half of the frequency mass).
// Ties in frequency go to the lower id. Deterministic: the same inputs give the same list.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { BUILTIN_PLUGIN_PACKAGES, SafetensorsFile, SpecEngine, loadTarget, writeSafetensors } from '@specd/core';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const TARGET = path.resolve(ROOT, arg('target', 'models/smollm2-135m-instruct'));
const DRAFTERS = arg('drafter', 'models/smollm2-135m-instruct-dflash')
  .split(',')
  .map((d) => path.resolve(ROOT, d));
const SIZES = arg('size', '8192').split(',').map(Number);
const GENERATE = Number(arg('generate', '64'));
const TOKENS = Number(arg('tokens', '64'));
const PROMPTS = path.join(ROOT, 'tools/reference/smollm2/prompts');

const fail = (m) => {
  console.error(`draft-vocab: ${m}`);
  process.exit(1);
};
for (const SIZE of SIZES)
  if (!(Number.isInteger(SIZE) && SIZE >= 1)) fail(`--size: expected integers >= 1, got ${arg('size')}`);
if (arg('out') !== undefined && DRAFTERS.length * SIZES.length > 1)
  fail('--out: only with one --drafter and one --size (else each copy goes to <drafter>-v<size>)');
const configs = DRAFTERS.map((d) => JSON.parse(fs.readFileSync(path.join(d, 'config.json'), 'utf8')));
const V = configs[0].vocab_size;
DRAFTERS.forEach((d, i) => {
  if (configs[i].dflash_config === undefined) fail(`${d}/config.json has no dflash_config (not a DFlash/DSpark)`);
  if (configs[i].vocab_size !== V) fail(`${d}: vocab_size ${configs[i].vocab_size} differs from ${V}`);
});
for (const SIZE of SIZES) if (SIZE > V) fail(`--size ${SIZE} exceeds the drafters' vocab_size ${V}`);

// the training prompts
const ids = new Uint16Array(fs.readFileSync(path.join(PROMPTS, 'train_prompts.u16')).buffer.slice(0));
const lens = new Uint16Array(fs.readFileSync(path.join(PROMPTS, 'train_prompts.len.u16')).buffer.slice(0));
const promptCounts = new Float64Array(V);
for (const id of ids) promptCounts[id]++;
console.log(`draft-vocab: ${lens.length} training prompts, ${ids.length} tokens`);

// the target's greedy continuations of the first GENERATE prompts
const genCounts = new Float64Array(V);
let generated = 0;
if (GENERATE > 0) {
  const target = await loadTarget(TARGET, BUILTIN_PLUGIN_PACKAGES);
  const engine = new SpecEngine(target.model, undefined, { maxSequences: 8, maxTokensPerSequence: 1024 });
  const requests = [];
  let at = 0;
  for (let i = 0; i < Math.min(GENERATE, lens.length); i++) {
    const promptIds = Int32Array.from(ids.subarray(at, at + lens[i]));
    at += lens[i];
    requests.push({
      id: `p${i}`,
      promptIds,
      maxTokens: TOKENS,
      sampling: { temperature: 0 },
      seed: i,
      ignoreEos: true,
    });
  }
  const t0 = performance.now();
  for (const r of engine.run(requests))
    for (const id of r.tokenIds) {
      genCounts[id]++;
      generated++;
    }
  console.log(
    `draft-vocab: ${generated} generated tokens (${requests.length} × ${TOKENS}, greedy) in ` +
      `${((performance.now() - t0) / 1000).toFixed(1)} s`,
  );
  target.model.dispose();
}

// equal mass for prompts and generations; top SIZE by frequency, ties to the lower id
const wGen = generated > 0 ? ids.length / generated : 0;
const freq = Float64Array.from(promptCounts, (c, i) => c + wGen * genCounts[i]);
const order = Int32Array.from({ length: V }, (_, i) => i).sort((a, b) => freq[b] - freq[a] || a - b);
const total = freq.reduce((a, b) => a + b, 0);

/** The checkpoint's files: its shards in index order, or the one model.safetensors. */
function checkpointFiles(dir) {
  const index = path.join(dir, 'model.safetensors.index.json');
  if (!fs.existsSync(index)) return { files: ['model.safetensors'], index: undefined };
  const json = JSON.parse(fs.readFileSync(index, 'utf8'));
  return { files: [...new Set(Object.values(json.weight_map))].sort(), index: json };
}

for (const SIZE of SIZES) {
  const chosen = Int32Array.from(order.subarray(0, SIZE)).sort();
  let covered = 0;
  for (const id of chosen) covered += freq[id];
  const genCovered = chosen.reduce((a, id) => a + genCounts[id], 0);
  console.log(
    `draft-vocab: ${SIZE} of ${V} ids cover ${((100 * covered) / total).toFixed(2)} % of the weighted counts, ` +
      `${generated > 0 ? ((100 * genCovered) / generated).toFixed(2) : '-'} % of the generated tokens`,
  );
  DRAFTERS.forEach((DRAFTER, di) => {
    const OUT = path.resolve(ROOT, arg('out', `${DRAFTER}-v${SIZE}`));
    // the checkpoint copy: every tensor as it is, plus draft_vocab_ids (in the first shard)
    fs.mkdirSync(OUT, { recursive: true });
    const { files, index } = checkpointFiles(DRAFTER);
    files.forEach((file, fi) => {
      const weights = SafetensorsFile.open(path.join(DRAFTER, file));
      const tensors = new Map();
      for (const name of weights.names()) {
        if (name === 'draft_vocab_ids') continue;
        const t = weights.read(name);
        tensors.set(name, { dtype: t.dtype, shape: t.shape, data: t.data });
      }
      if (fi === 0) tensors.set('draft_vocab_ids', { dtype: 'I32', shape: [SIZE], data: chosen });
      writeSafetensors(path.join(OUT, file), tensors, weights.metadata); // e.g. {"format": "pt"}
      weights.close();
    });
    if (index !== undefined) {
      const map = { ...index.weight_map, draft_vocab_ids: files[0] };
      const prior =
        index.weight_map.draft_vocab_ids === undefined ? 0 : 4 * (configs[di].dflash_config.draft_vocab_size ?? 0);
      const out = {
        ...index,
        metadata: { ...index.metadata, total_size: index.metadata.total_size - prior + 4 * SIZE },
        weight_map: Object.fromEntries(
          Object.keys(map)
            .sort()
            .map((k) => [k, map[k]]),
        ),
      };
      fs.writeFileSync(path.join(OUT, 'model.safetensors.index.json'), `${JSON.stringify(out, null, 2)}\n`);
    }
    const config = configs[di];
    const outConfig = { ...config, dflash_config: { ...config.dflash_config, draft_vocab_size: SIZE } };
    fs.writeFileSync(path.join(OUT, 'config.json'), `${JSON.stringify(outConfig, null, 2)}\n`);
    const card = fs.existsSync(path.join(DRAFTER, 'MODEL_CARD.md'))
      ? fs
          .readFileSync(path.join(DRAFTER, 'MODEL_CARD.md'), 'utf8')
          .replace(/\n## Reduced draft vocabulary \(FR-Spec\)\n[\s\S]*$/, '')
      : `# ${path.basename(DRAFTER)}\n`;
    fs.writeFileSync(
      path.join(OUT, 'MODEL_CARD.md'),
      `${card.trimEnd()}\n\n## Reduced draft vocabulary (FR-Spec)\n` +
        `This checkpoint drafts over the ${SIZE} most frequent of ${V} token ids ` +
        '(`dflash_config.draft_vocab_size`, ids in the tensor `draft_vocab_ids`); verification keeps the whole ' +
        'vocabulary, so the output is unchanged (setting `draft_vocab: "whole"` drafts over all of it). ' +
        `Frequencies: the ${lens.length} training prompts (${ids.length} tokens) and the target's greedy ` +
        `continuations of the first ${GENERATE} of them (${generated} tokens), each half of the mass; the list ` +
        `covers ${((100 * covered) / total).toFixed(2)} % of it. Made by \`node tools/draft-vocab.mjs --drafter ` +
        `${path.relative(ROOT, DRAFTER)} --size ${SIZE} --generate ${GENERATE} --tokens ${TOKENS}\`.\n`,
    );
    console.log(`draft-vocab: wrote ${path.relative(ROOT, OUT) || OUT}`);
  });
}
