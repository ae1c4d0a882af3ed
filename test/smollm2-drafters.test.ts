// The DFlash, DSpark and EAGLE-3 drafters trained for SmolLM2-135M-Instruct
// (models/smollm2-135m-instruct-{dflash,dspark,eagle3}) run through the unchanged plugins on the GGUF target
// (model-llama): greedy output must be plain decoding's, with one target forward per verify step and every
// page freed; EAGLE-3 dynamic trees too; and specd's τ must be the PyTorch reference's
// (tools/reference/smollm2/reference_tau.json, eval_tau.py on the GPU) within 0.1 on the first two chat and
// two plain held-out prompts of tools/reference/smollm2/prompts.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { BUILTIN_PLUGIN_PACKAGES, SpecEngine, loadDrafter, loadTarget, type LoadedTarget } from '@specd/core';
import { skipWithoutFiles } from './require-files.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const GGUF_DIR = path.join(ROOT, 'models/smollm2-135m-instruct');
const HAVE = !skipWithoutFiles('the drafters trained for SmolLM2-135M-Instruct', [
  path.join(GGUF_DIR, 'SmolLM2-135M-Instruct.Q4_1.gguf'),
]);

const DRAFTERS = {
  dflash: path.join(ROOT, 'models/smollm2-135m-instruct-dflash'),
  dspark: path.join(ROOT, 'models/smollm2-135m-instruct-dspark'),
  eagle3: path.join(ROOT, 'models/smollm2-135m-instruct-eagle3'),
};
const REF = path.join(ROOT, 'tools/reference/smollm2/reference_tau.json');

interface RefRequest {
  id: string;
  steps: number;
  committed: number;
}
interface RefRun {
  method: string;
  temperature: number;
  new_tokens: number;
  domains: Record<string, { tau: number; requests: RefRequest[] }>;
}

describe.skipIf(!HAVE)('the drafters trained for SmolLM2-135M-Instruct', () => {
  let target: LoadedTarget;
  let prompts: Int32Array[];
  beforeAll(async () => {
    target = await loadTarget(GGUF_DIR, BUILTIN_PLUGIN_PACKAGES);
    prompts = [
      '<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n',
      'def add(a, b):\n    return',
    ].map((t) => target.tokenizer.encode(t, { addSpecialTokens: false }));
  });
  afterAll(() => {
    target?.model.dispose();
  });

  it(
    'eagle3 with dynamic trees (top_k 2, depth 3, 6 nodes): verified ' +
      "in one forward per step, greedy output is plain decoding's",
    async () => {
      const dir = DRAFTERS.eagle3;
      const settings = { method: 'eagle3', path: dir, tree: { top_k: 2, depth: 3, total_tokens: 6 } };
      const { drafter } = await loadDrafter(
        { dir, method: 'eagle3', settings },
        BUILTIN_PLUGIN_PACKAGES,
        target,
        512,
        2,
      );
      try {
        expect(drafter.maxDraftTokens).toBe(6);
        // the drafter proposes trees (parents not a chain)
        const spy = drafter.propose.bind(drafter);
        let trees = 0;
        drafter.propose = (b) => {
          const out = spy(b);
          trees += out.filter((p) => p.parents?.some((v, j) => v !== j - 1)).length;
          return out;
        };
        const reqs = () =>
          prompts.map((ids, i) => ({
            id: i,
            promptIds: ids,
            maxTokens: 20,
            sampling: { temperature: 0 },
            seed: 0,
            ignoreEos: true,
          }));
        const plain = new SpecEngine(target.model, undefined, { maxSequences: 2, maxTokensPerSequence: 512 }).run(
          reqs(),
        );
        const e = new SpecEngine(target.model, drafter, {
          maxSequences: 2,
          maxTokensPerSequence: 512,
          draftPolicy: 'max',
        });
        const spec = e.run(reqs());
        for (const r of spec) expect(r.tokenIds).toEqual(plain.find((p) => p.id === r.id)!.tokenIds);
        expect(trees).toBeGreaterThan(0);
        expect(e.metrics.decodeForwards).toBe(e.metrics.verifyForwards);
        expect(e.cache.pagesInUse + e.cache.slotsInUse + drafter.pagesInUse).toBe(0);
      } finally {
        drafter.dispose();
      }
    },
  );

  it.each(['dflash', 'dspark', 'eagle3'])(
    "%s: greedy output is plain decoding's; drafts made, one target forward per verify step, pages freed",
    async (method) => {
      const { drafter } = await loadDrafter(
        DRAFTERS[method as keyof typeof DRAFTERS],
        BUILTIN_PLUGIN_PACKAGES,
        target,
        512,
        2,
      );
      try {
        expect(drafter.method).toBe(method);
        const reqs = () =>
          prompts.map((ids, i) => ({
            id: i,
            promptIds: ids,
            maxTokens: 24,
            sampling: { temperature: 0 },
            seed: 0,
            ignoreEos: true,
          }));
        const plain = new SpecEngine(target.model, undefined, { maxSequences: 2, maxTokensPerSequence: 512 }).run(
          reqs(),
        );
        const e = new SpecEngine(target.model, drafter, {
          maxSequences: 2,
          maxTokensPerSequence: 512,
          draftPolicy: 'max',
        });
        const spec = e.run(reqs());
        for (const r of spec)
          expect(r.tokenIds, `request ${String(r.id)}`).toEqual(plain.find((p) => p.id === r.id)!.tokenIds);
        expect(e.metrics.drafted).toBeGreaterThan(0);
        expect(e.metrics.decodeForwards).toBe(e.metrics.verifyForwards);
        expect(e.cache.pagesInUse + e.cache.slotsInUse + drafter.pagesInUse).toBe(0);
      } finally {
        drafter.dispose();
      }
    },
  );

  it.each(['dflash', 'dspark', 'eagle3'] as const)(
    '%s: specd τ within 0.1 of the reference on the same prompts (greedy, 128 tokens, 2 chat + 2 plain)',
    async (method) => {
      const run = (JSON.parse(fs.readFileSync(REF, 'utf8')) as { runs: RefRun[] }).runs.find(
        (r) => r.method === method && r.temperature === 0,
      );
      expect(run, `no greedy ${method} run in ${REF}`).toBeDefined();
      const { drafter } = await loadDrafter(DRAFTERS[method], BUILTIN_PLUGIN_PACKAGES, target, 512, 4);
      try {
        const rows: { id: string; prompt_token_ids: number[] }[] = [];
        for (const domain of ['chat', 'plain']) {
          rows.push(
            ...fs
              .readFileSync(path.join(ROOT, 'tools/reference/smollm2/prompts', `${domain}.jsonl`), 'utf8')
              .trim()
              .split('\n')
              .slice(0, 2)
              .map((l) => JSON.parse(l) as { id: string; prompt_token_ids: number[] }),
          );
        }
        const ref = new Map(
          Object.values(run!.domains)
            .flatMap((d) => d.requests)
            .map((r) => [r.id, r]),
        );
        expect(rows.every((r) => ref.has(r.id))).toBe(true);
        const e = new SpecEngine(target.model, drafter, {
          maxSequences: 4,
          maxTokensPerSequence: 512,
          draftPolicy: 'max',
        });
        e.run(
          rows.map((r) => ({
            id: r.id,
            promptIds: Int32Array.from(r.prompt_token_ids),
            maxTokens: run!.new_tokens,
            sampling: { temperature: 0 },
            seed: 0,
            ignoreEos: true,
          })),
        );
        const steps = rows.reduce((a, r) => a + ref.get(r.id)!.steps, 0);
        const committed = rows.reduce((a, r) => a + ref.get(r.id)!.committed, 0);
        console.log(
          `${method}: specd τ ${e.metrics.tauPerStep.toFixed(3)}, reference ` +
            `τ on the same prompts ${(committed / steps).toFixed(3)}`,
        );
        expect(e.metrics.drafted).toBeGreaterThan(0);
        expect(Math.abs(e.metrics.tauPerStep - committed / steps)).toBeLessThan(0.1);
        expect(e.cache.pagesInUse + e.cache.slotsInUse + drafter.pagesInUse).toBe(0);
      } finally {
        drafter.dispose();
      }
    },
  );
});
