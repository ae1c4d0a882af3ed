// The benches' prompt sets (issue 16's speed goals use every prompt of them) and the targets' default sampling.
// Bench-only.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/**
 * The two prompt sets of a target, as rows of their JSON lines (`prompt_token_ids` among the fields): SmolLM2 —
 * tools/reference/smollm2/prompts/chat.jsonl (chat template already applied) and plain.jsonl; kimi — test/prompts/
 * prose.jsonl and code.jsonl. @param target 'smollm2' or 'kimi'. @returns [first set, second set].
 * @throws {Error} on another target, or a file's read or JSON error.
 */
export function promptSets(target) {
  if (target !== 'smollm2' && target !== 'kimi') throw new Error(`promptSets: target ${target}: smollm2 or kimi`);
  const [dir, first, second] =
    target === 'kimi' ? ['test/prompts', 'prose', 'code'] : ['tools/reference/smollm2/prompts', 'chat', 'plain'];
  const read = (name) =>
    fs
      .readFileSync(path.join(ROOT, dir, `${name}.jsonl`), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
  return [read(first), read(second)];
}

/**
 * A target's default sampling as the benches run it: the fields of its generation_config.json (core's
 * readModelSamplingDefaults result; undefined or {} when it has none) as engine SamplingParams, unset fields at the
 * engine's own defaults (temperature 1, top-p 1, top-k 0: off). @returns { temperature, topP, topK }.
 */
export function defaultSampling(gen) {
  return { temperature: gen?.temperature ?? 1, topP: gen?.top_p ?? 1, topK: gen?.top_k ?? 0 };
}
