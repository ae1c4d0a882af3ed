// The spec-decode engine with the shipped target + DSpark drafter, end to end:
// - greedy output is token-for-token plain greedy decoding's for every golden prompt (128 tokens,
//   EOS ignored, draftPolicy 'max'); drafts are made, exactly one target forward per verify step;
// - τ on a 6 prose + 4 code subset within 0.1 of the reference (run `dspark_t0`, block 7) per request set;
// - after finish and abort every target page, state slot and draft page is free;
// - sampled decoding (q for rejection sampling) is reproducible per seed.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  fullDraftProbs,
  SafetensorsFile,
  SpecEngine,
  type SpecRequest,
  type SpecResult,
  type StageModel,
} from '@specd/core';

import type { DSparkDrafter } from '../src/index.js';
import { GOLDENS_DIR, loadDrafter, loadTarget, REPO_ROOT } from './helpers.js';
import { requireEntry, skipWithoutFiles } from '../../../test/require-files.js';
import { expectFormatsAgree } from '../../../test/weight-formats.js';

const NEW_TOKENS = 128;
const index = JSON.parse(fs.readFileSync(path.join(GOLDENS_DIR, 'index.json'), 'utf8')) as {
  goldens: Record<string, { file: string; greedy_continuation: number[] }>;
};
const readJsonl = (f: string) =>
  fs
    .readFileSync(path.join(REPO_ROOT, 'test/prompts', f), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { id: string; prompt_token_ids: number[] });

interface Prompt {
  id: string;
  ids: Int32Array;
}
const prompts: Prompt[] = Object.entries(index.goldens).map(([name, g]) => {
  const f = SafetensorsFile.open(path.join(GOLDENS_DIR, g.file));
  try {
    return { id: `golden-${name}`, ids: Int32Array.from(f.read('input_ids').data as Int32Array) };
  } finally {
    f.close();
  }
});

const greedy = (p: Prompt, extra: Partial<SpecRequest> = {}): SpecRequest => ({
  id: p.id,
  promptIds: p.ids,
  maxTokens: NEW_TOKENS,
  sampling: { temperature: 0 },
  seed: 0,
  ignoreEos: true,
  ...extra,
});
const byId = (rs: SpecResult[]) => new Map(rs.map((r) => [r.id, r]));

let target: StageModel;
let drafter: DSparkDrafter;
beforeAll(async () => {
  target = loadTarget();
  drafter = await loadDrafter(target, 8, 2048);
});
afterAll(() => {
  drafter.dispose();
  target.dispose();
});

describe('greedy speculative decoding with DSpark', () => {
  it('is token-for-token plain greedy for every golden prompt; drafts, one target forward per verify step', () => {
    const plain = byId(
      new SpecEngine(target, undefined, { maxSequences: 8, maxTokensPerSequence: 2048 }).run(
        prompts.map((p) => greedy(p)),
      ),
    );
    const e = new SpecEngine(target, drafter, { maxSequences: 4, draftPolicy: 'max', maxTokensPerSequence: 2048 });
    const results = byId(e.run(prompts.map((p) => greedy(p))));
    for (const p of prompts) {
      const r = results.get(p.id)!;
      expect(r.finishReason).toBe('length');
      expect(r.tokenIds.length).toBe(NEW_TOKENS);
      expect(r.tokenIds, p.id).toEqual(plain.get(p.id)!.tokenIds);
      expect(r.metrics.drafted, p.id).toBeGreaterThan(0);
    }
    const m = e.metrics;
    expect(m.accepted).toBeGreaterThan(0);
    expect(m.tauPerStep).toBeGreaterThan(1);
    expect(m.decodeForwards).toBe(m.verifyForwards);
    expect(m.perPositionAcceptance.length).toBeLessThanOrEqual(7);
    expect(e.cache.pagesInUse + e.cache.slotsInUse + drafter.pagesInUse).toBe(0);
    console.log(
      `DSpark greedy: τ ${m.tauPerStep.toFixed(3)} (per step), ` +
        `${m.verifyForwards} verify forwards, ${m.decodeForwards} decode forwards`,
    );
  });
});

describe('weights "q8_0" and "q8_0_int8" (the draft layers in Q8_0, int16 or int8 activations)', () => {
  it("is token-for-token plain greedy for every golden prompt; τ within 0.15 of the bf16 layers'", async () => {
    const bf = await loadDrafter(target, 8, 2048, { method: 'dspark', path: 'x', weights: 'bf16' });
    const q8 = await loadDrafter(target, 8, 2048, { method: 'dspark', path: 'x', weights: 'q8_0' });
    const i8 = await loadDrafter(target, 8, 2048, { method: 'dspark', path: 'x', weights: 'q8_0_int8' });
    try {
      expectFormatsAgree(
        'DSpark (draft layers)',
        target,
        { bf16: bf, q8_0: q8, q8_0_int8: i8 },
        prompts.map((p) => greedy(p)),
        {
          maxSequences: 4,
        },
      );
    } finally {
      bf.dispose();
      q8.dispose();
      i8.dispose();
    }
    await expect(loadDrafter(target, 8, 2048, { weights: 'int4' })).rejects.toThrow(
      /dspark: settings\.weights: expected "bf16" or "q8_0" or "q8_0_int8", got "int4"/,
    );
  });
});

const REF = path.join(REPO_ROOT, 'test/prompts/reference_tau.json');
interface RefRequest {
  id: string;
  steps: number;
  committed: number;
}
interface RefRun {
  block_size: number;
  max_drafts: number;
  new_tokens: number;
  domains: Record<string, { tau: number; requests: RefRequest[] }>;
}
const refRun = !skipWithoutFiles(
  'τ vs the reference run dspark_t0 (subset)',
  [REF],
  'git checkout -- test/prompts/reference_tau.json',
)
  ? requireEntry(
      (JSON.parse(fs.readFileSync(REF, 'utf8')) as { runs?: Record<string, RefRun> }).runs?.dspark_t0,
      REF,
      'run dspark_t0',
    )
  : undefined;

describe.skipIf(refRun === undefined)('τ vs the reference run dspark_t0 (subset)', () => {
  it('has block 7 and 7 drafts per step', () => {
    expect(refRun!.block_size).toBe(7);
    expect(refRun!.max_drafts).toBe(drafter.maxDraftTokens);
  });

  it.each([
    ['prose', 6],
    ['code', 4],
  ] as const)('%s: specd τ within 0.1 of the reference on the same prompts', (domain, count) => {
    const ref = refRun!.domains[domain]!;
    const refReqs = new Map(ref.requests.map((r) => [r.id, r]));
    const rows = readJsonl(`${domain}.jsonl`)
      .filter((r) => refReqs.has(r.id))
      .slice(0, count);
    expect(rows.length).toBe(count);
    const e = new SpecEngine(target, drafter, { maxSequences: 8, draftPolicy: 'max', maxTokensPerSequence: 2048 });
    e.run(
      rows.map((r) =>
        greedy({ id: r.id, ids: Int32Array.from(r.prompt_token_ids) }, { maxTokens: refRun!.new_tokens }),
      ),
    );
    const S = rows.reduce((a, r) => a + refReqs.get(r.id)!.steps, 0);
    const A = rows.reduce((a, r) => a + refReqs.get(r.id)!.committed, 0);
    console.log(
      `DSpark ${domain}: specd τ ${e.metrics.tauPerStep.toFixed(3)}, reference τ on the same ` +
        `${count} prompts ${(A / S).toFixed(3)} (reference, all prompts: ${ref.tau.toFixed(3)})`,
    );
    expect(Math.abs(e.metrics.tauPerStep - A / S)).toBeLessThan(0.1);
    expect(drafter.pagesInUse).toBe(0);
  });
});

describe('resources', () => {
  it('after finish and aborts (running and waiting) every page, state slot and draft page is free', () => {
    const e = new SpecEngine(target, drafter, { maxSequences: 2, draftPolicy: 'max', maxTokensPerSequence: 2048 });
    const [a, b, c] = prompts;
    e.add(greedy(a!, { maxTokens: 20 })); // finishes (length)
    e.add(greedy(b!)); // aborted while running
    e.add(greedy(c!)); // aborted while waiting
    const done: SpecResult[] = [];
    done.push(...e.step(), ...e.step());
    expect(drafter.pagesInUse).toBeGreaterThan(0);
    const aborted = [e.abort(c!.id)!, e.abort(b!.id)!];
    while (e.pending > 0) done.push(...e.step());
    expect(aborted.every((r) => r.finishReason === 'abort')).toBe(true);
    expect(done.find((r) => r.id === a!.id)!.finishReason).toBe('length');
    expect(e.cache.pagesInUse).toBe(0);
    expect(e.cache.slotsInUse).toBe(0);
    expect(drafter.pagesInUse).toBe(0);
    expect(e.cache.kv!.numSequences + drafter.pool.numSequences).toBe(0);
  });
});

describe('sampling', () => {
  it('temperature > 0: drafts come with q and confidences; reproducible per seed, drafts accepted', () => {
    const run = (seed: number) => {
      const e = new SpecEngine(target, drafter, { maxSequences: 2, draftPolicy: 'max', maxTokensPerSequence: 2048 });
      const rs = e.run(
        prompts
          .slice(0, 2)
          .map((p) => greedy(p, { maxTokens: 32, sampling: { temperature: 0.8, topK: 50, topP: 0.95 }, seed })),
      );
      return { tokens: rs.map((r) => r.tokenIds), m: e.metrics };
    };
    const r1 = run(3);
    expect(run(3).tokens).toEqual(r1.tokens);
    expect(r1.tokens.every((t) => t.length === 32)).toBe(true);
    expect(r1.m.accepted).toBeGreaterThan(0);
    expect(run(4).tokens).not.toEqual(r1.tokens);
    expect(drafter.pagesInUse).toBe(0);
  });

  it('a sampled proposal carries q [k, V] (rows sum to 1, q(d) > 0) and k confidences', () => {
    const id = 'sampled';
    const T = 8;
    const D = drafter.config.hiddenSize;
    const V = target.info.vocabSize;
    drafter.addSequence(id);
    try {
      const taps = new Map(
        drafter.config.taps.map((t, i) => [t, Float32Array.from({ length: T * D }, (_, e) => Math.sin(e * 0.37 + i))]),
      );
      drafter.writeProjectedContextKV(drafter.projectTargetHiddenPartial(taps, T), [{ id, position: 0, numTokens: T }]);
      let u = 0;
      const [p] = drafter.propose({
        sequences: [
          {
            id,
            position: T,
            lastToken: 5,
            maxDrafts: 7,
            history: new Int32Array(0),
            sampling: { temperature: 1 },
            rng: { next: () => (u = (u * 7919 + 0.123) % 1) },
          },
        ],
      });
      expect(p!.tokens.length).toBe(7);
      const full = fullDraftProbs(p, V)!;
      expect(full.length).toBe(7 * V);
      expect(p!.confidence!.length).toBe(7);
      for (let j = 0; j < 7; j++) {
        const q = full.subarray(j * V, (j + 1) * V);
        expect(q.reduce((a, b) => a + b, 0)).toBeCloseTo(1, 4);
        expect(q[p!.tokens[j]!]!).toBeGreaterThan(0);
      }
    } finally {
      drafter.freeSequence(id);
    }
    expect(drafter.pagesInUse).toBe(0);
  });
});
