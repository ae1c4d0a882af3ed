// τ measured by specd vs the PyTorch reference (tools/reference/eval_tau.py → test/prompts/reference_tau.json),
// on a CI-sized subset: the reference's per-request steps / committed tokens give its τ on exactly
// these prompts; specd's must be within 0.1 (greedy, 128 tokens, EOS ignored, block 16). The full
// set: `node packages/plugin-dflash/bench/tau.mjs`. Skipped until the reference file lands.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { SpecEngine, type StageModel } from '@specd/core';

import type { DFlashDrafter } from '../src/index.js';
import { loadDrafter, loadTarget, REPO_ROOT } from './helpers.js';
import { requireEntry, skipWithoutFiles } from '../../../test/require-files.js';

const REF = process.env.SPECD_REFERENCE_TAU ?? path.join(REPO_ROOT, 'test/prompts/reference_tau.json');

interface RefRequest {
  id: string;
  steps: number;
  committed: number;
}
interface RefRun {
  drafter?: string;
  temperature?: number;
  new_tokens?: number;
  domains: Record<string, { tau: number; requests?: RefRequest[] }>;
}

/** The greedy DFlash run in the reference file (a run object, or a container of runs). */
function findRun(x: unknown): RefRun | undefined {
  if (typeof x !== 'object' || x === null) return undefined;
  const o = x as Record<string, unknown>;
  if (typeof o.domains === 'object' && o.domains !== null) {
    const dr = typeof o.drafter === 'string' ? o.drafter : 'dflash';
    const temp = typeof o.temperature === 'number' ? o.temperature : 0;
    const block = typeof o.block_size === 'number' ? o.block_size : 16;
    if (/dflash/i.test(dr) && temp === 0 && block === 16) return o as unknown as RefRun;
  }
  for (const v of Array.isArray(x) ? x : Object.values(o)) {
    const r = findRun(v);
    if (r !== undefined) return r;
  }
  return undefined;
}

const run = skipWithoutFiles('τ vs the reference (subset)', [REF], 'git checkout -- test/prompts/reference_tau.json')
  ? undefined
  : requireEntry(findRun(JSON.parse(fs.readFileSync(REF, 'utf8'))), REF, 'greedy DFlash run with block size 16');

describe.skipIf(run === undefined)('τ vs the reference (subset)', () => {
  let target: StageModel;
  let drafter: DFlashDrafter;
  beforeAll(async () => {
    target = loadTarget();
    drafter = await loadDrafter(target, {}, 8, 2048);
  });
  afterAll(() => {
    drafter?.dispose();
    target?.dispose();
  });

  it.each([
    ['prose', 6],
    ['code', 4],
  ] as const)('%s: specd τ within 0.1 of the reference on the same prompts', (domain, count) => {
    const ref = run!.domains[domain];
    expect(ref, `reference has no ${domain} domain`).toBeDefined();
    const refReqs = new Map((ref!.requests ?? []).map((r) => [r.id, r]));
    const rows = fs
      .readFileSync(path.join(REPO_ROOT, 'test/prompts', `${domain}.jsonl`), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { id: string; prompt_token_ids: number[] })
      .filter((r) => refReqs.has(r.id))
      .slice(0, count);
    expect(rows.length).toBe(count);
    const e = new SpecEngine(target, drafter, { maxSequences: 8, draftPolicy: 'max', maxTokensPerSequence: 2048 });
    e.run(
      rows.map((r) => ({
        id: r.id,
        promptIds: Int32Array.from(r.prompt_token_ids),
        maxTokens: run!.new_tokens ?? 128,
        sampling: { temperature: 0 },
        seed: 0,
        ignoreEos: true,
      })),
    );
    const S = rows.reduce((a, r) => a + refReqs.get(r.id)!.steps, 0);
    const A = rows.reduce((a, r) => a + refReqs.get(r.id)!.committed, 0);
    console.log(
      `${domain}: specd τ ${e.metrics.tauPerStep.toFixed(3)}, reference τ on the same ${count}` +
        ` prompts ${(A / S).toFixed(3)} (reference, all prompts: ${ref!.tau.toFixed(3)})`,
    );
    expect(Math.abs(e.metrics.tauPerStep - A / S)).toBeLessThan(0.1);
  });
});
