// The spec-decode engine with the shipped target + EAGLE-3 drafter (chain of 6), end to end:
// - greedy output is token-for-token plain greedy decoding's for every golden prompt (128 tokens,
//   EOS ignored, draftPolicy 'max'); drafts are made and accepted, one target forward per verify step;
// - τ on a 6 prose + 4 code subset within 0.1 of the reference run `eagle3_t0` on the same prompts, and
//   the verify steps of each request equal the reference's (one request of a subset may differ);
// - the default Q8_0 weights and bf16: both greedy-exact, their τ within 0.15 of each other;
// - after finish and abort every target page, state slot and draft page is free;
// - sampled decoding is reproducible per seed; a sampled proposal's q rows (target vocabulary) sum to 1, q(d) > 0.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  fullDraftProbs,
  type PrefixCommit,
  SafetensorsFile,
  SpecEngine,
  type SpecRequest,
  type SpecResult,
  type StageModel,
} from '@specd/core';

import type { Eagle3Drafter } from '../src/index.js';
import { EAGLE3_DIR, GOLDENS_DIR, loadDrafter, loadTarget, REPO_ROOT } from './helpers.js';
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
let drafter: Eagle3Drafter;
beforeAll(async () => {
  target = loadTarget();
  drafter = await loadDrafter(target, { maxSequences: 8, maxTokensPerSequence: 2048 });
});
afterAll(() => {
  drafter.dispose();
  target.dispose();
});

describe('greedy speculative decoding with EAGLE-3', () => {
  it(
    'is token-for-token plain greedy for every golden prompt; ' + 'drafts accepted, one target forward per verify step',
    () => {
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
      expect(m.perPositionAcceptance.length).toBeLessThanOrEqual(6);
      expect(e.cache.pagesInUse + e.cache.slotsInUse + drafter.pagesInUse).toBe(0);
      console.log(
        `EAGLE-3 greedy: τ ${m.tauPerStep.toFixed(3)} (per step), ` +
          `${m.verifyForwards} verify forwards, ${m.decodeForwards} decode forwards`,
      );
    },
  );
});

describe("committing a step's sequences", () => {
  it('one commitPrefixes call a step; when it throws, one by one, output unchanged', () => {
    const few = prompts.slice(0, 4);
    const plain = byId(
      new SpecEngine(target, undefined, { maxSequences: 4, maxTokensPerSequence: 2048 }).run(few.map((p) => greedy(p))),
    );
    const stage = target as StageModel & PrefixCommit;
    const batch = stage.commitPrefixes!;
    let calls = 0;
    let sequences = 0;
    const run = () => {
      const e = new SpecEngine(target, drafter, { maxSequences: 4, draftPolicy: 'max', maxTokensPerSequence: 2048 });
      const results = byId(e.run(few.map((p) => greedy(p))));
      for (const p of few) {
        expect(results.get(p.id)!.finishReason, p.id).toBe('length');
        expect(results.get(p.id)!.tokenIds, p.id).toEqual(plain.get(p.id)!.tokenIds);
      }
      expect(e.cache.pagesInUse + e.cache.slotsInUse + drafter.pagesInUse).toBe(0);
      return e.metrics;
    };
    try {
      stage.commitPrefixes = (cache, result, commits) => {
        calls++;
        sequences += commits.length;
        batch.call(stage, cache, result, commits);
      };
      const m = run();
      // every verify step of two or more sequences commits them in one call
      expect(calls).toBeGreaterThan(0);
      expect(calls).toBeLessThanOrEqual(m.verifyForwards);
      expect(sequences).toBeGreaterThanOrEqual(2 * calls);
      stage.commitPrefixes = () => {
        throw new Error('commitPrefixes: refused (test)');
      };
      run();
    } finally {
      stage.commitPrefixes = batch;
    }
  });
});

const REF = path.join(REPO_ROOT, 'test/prompts/reference_tau.json');
interface RefRequest {
  id: string;
  steps: number;
  committed: number;
}
interface RefRun {
  max_drafts: number;
  new_tokens: number;
  temperature: number;
  domains: Record<string, { tau: number; requests: RefRequest[] }>;
}
const refRun = !skipWithoutFiles(
  'τ vs the reference run eagle3_t0 (subset)',
  [REF],
  'git checkout -- test/prompts/reference_tau.json',
)
  ? requireEntry(
      (JSON.parse(fs.readFileSync(REF, 'utf8')) as { runs?: Record<string, RefRun> }).runs?.eagle3_t0,
      REF,
      'run eagle3_t0',
    )
  : undefined;

describe.skipIf(refRun === undefined)('τ vs the reference run eagle3_t0 (subset)', () => {
  it('is greedy with a chain of 6 drafts per step (the drafter default)', () => {
    expect(refRun!.temperature).toBe(0);
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
    const results = byId(
      e.run(
        rows.map((r) =>
          greedy({ id: r.id, ids: Int32Array.from(r.prompt_token_ids) }, { maxTokens: refRun!.new_tokens }),
        ),
      ),
    );
    const S = rows.reduce((a, r) => a + refReqs.get(r.id)!.steps, 0);
    const A = rows.reduce((a, r) => a + refReqs.get(r.id)!.committed, 0);
    // the same chain semantics give the same acceptance per request, step for step (fp32 rounding may
    // flip an argmax now and then: one request of the subset may differ)
    const same = rows.filter((r) => results.get(r.id)!.metrics.verifySteps === refReqs.get(r.id)!.steps).length;
    console.log(
      `EAGLE-3 ${domain}: specd τ ${e.metrics.tauPerStep.toFixed(4)}, reference τ on the same ` +
        `${count} prompts ${(A / S).toFixed(4)} (reference, all prompts: ${ref.tau.toFixed(3)}` +
        `); verify steps equal the reference's for ${same}/${count} requests`,
    );
    expect(Math.abs(e.metrics.tauPerStep - A / S)).toBeLessThan(0.1);
    expect(same).toBeGreaterThanOrEqual(count - 1);
    expect(drafter.pagesInUse).toBe(0);
  });
});

describe('weights: the default "q8_0", "q8_0_int8" and "bf16"', () => {
  it(
    'all give plain greedy output for every golden prompt, their τ within 0.15; the default is Q8_0 ' +
      '(every projection and the lm_head), "bf16" packed bf16',
    async () => {
      const bf16 = await loadDrafter(target, {
        settings: { method: 'eagle3', path: EAGLE3_DIR, weights: 'bf16' },
        maxSequences: 8,
        maxTokensPerSequence: 2048,
      });
      const int8 = await loadDrafter(target, {
        settings: { method: 'eagle3', path: EAGLE3_DIR, weights: 'q8_0_int8' },
        maxSequences: 8,
        maxTokensPerSequence: 2048,
      });
      try {
        // the formats took effect: a Q8_0 linear map has apply, a packed bf16 matrix is data for gemmBf16
        const names = ['q', 'qkv', 'kv', 'o', 'gateUp', 'down', 'lmHead'];
        const weightsOf = (d: Eagle3Drafter) =>
          (d as unknown as { model: { weights(): Record<string, unknown> } }).model.weights();
        for (const name of names) {
          expect(weightsOf(drafter)[name], name).toHaveProperty('apply');
          expect(weightsOf(int8)[name], name).toHaveProperty('apply');
          expect(weightsOf(bf16)[name], name).not.toHaveProperty('apply');
        }
        expectFormatsAgree(
          'EAGLE-3',
          target,
          { q8_0: drafter, q8_0_int8: int8, bf16 },
          prompts.map((p) => greedy(p)),
          {
            maxSequences: 4,
          },
        );
      } finally {
        bf16.dispose();
        int8.dispose();
      }
    },
  );
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
  it('temperature > 0: reproducible per seed, drafts accepted', () => {
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

  it(
    'a sampled proposal carries q [k, V] in the target vocabulary ' +
      '(rows sum to 1, q(d) > 0, 0 outside the draft vocabulary)',
    () => {
      const id = 'sampled';
      const T = 8;
      const D = drafter.config.hiddenSize;
      const V = target.info.vocabSize;
      const inDraft = new Uint8Array(V);
      for (const t of drafter.draftToTarget) inDraft[t] = 1;
      drafter.addSequence(id);
      try {
        const taps = new Map(
          drafter.config.taps.map((t, i) => [
            t,
            Float32Array.from({ length: T * D }, (_, e) => Math.sin(e * 0.37 + i)),
          ]),
        );
        drafter.writeProjectedContextKV(drafter.projectTargetHiddenPartial(taps, T), [
          { id, position: 0, numTokens: T, nextTokens: Int32Array.from({ length: T }, (_, i) => 10 + i) },
        ]);
        let u = 0;
        const [p] = drafter.propose({
          sequences: [
            {
              id,
              position: T,
              lastToken: 10 + T - 1,
              maxDrafts: 6,
              history: new Int32Array(0),
              sampling: { temperature: 1, topK: 50, topP: 0.95 },
              rng: { next: () => (u = (u * 7919 + 0.123) % 1) },
            },
          ],
        });
        expect(p!.tokens.length).toBe(6);
        // q over the draft vocabulary [6, Vd] (probsIds = d2t), written out [6, V]
        expect(p!.probs!.length).toBe(6 * p!.probsIds!.length);
        const full = fullDraftProbs(p, V)!;
        for (let j = 0; j < 6; j++) {
          const q = full.subarray(j * V, (j + 1) * V);
          expect(q.reduce((a, b) => a + b, 0)).toBeCloseTo(1, 4);
          expect(q[p!.tokens[j]!]!).toBeGreaterThan(0);
          expect(q.filter((x) => x > 0).length).toBeLessThanOrEqual(50); // top-k over the draft vocabulary
          expect(q.every((x, t) => x === 0 || inDraft[t] === 1)).toBe(true);
        }
      } finally {
        drafter.freeSequence(id);
      }
      expect(drafter.pagesInUse).toBe(0);
    },
  );
});
