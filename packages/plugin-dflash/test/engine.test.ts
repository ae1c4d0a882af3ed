// The spec-decode engine with the shipped target + DFlash drafter, end to end:
// - greedy output is token-for-token plain greedy decoding's (and the reference's 64-token golden
//   continuation) for every golden prompt and every held-out prompt (test/prompts, 32 prose + 32 code),
//   128 tokens with EOS ignored, at 1 and 8 concurrent sequences; drafts are made, τ > 1.5, exactly one target forward
//   per verify step;
// - the replay commit gives the same tokens (one extra forward per partially accepted step);
// - after a mix of finish, EOS, stop strings and aborts every target page, state slot and draft page is free;
// - sampled decoding is reproducible per seed.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  SafetensorsFile,
  SpecEngine,
  Tokenizer,
  type SpecRequest,
  type SpecResult,
  type StageModel,
} from '@specd/core';

import type { DFlashDrafter } from '../src/index.js';
import { GOLDENS_DIR, loadDrafter, loadTarget, REPO_ROOT, TARGET_DIR } from './helpers.js';
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
  golden?: number[];
}
const prompts: Prompt[] = [
  ...Object.entries(index.goldens).map(([name, g]) => {
    const f = SafetensorsFile.open(path.join(GOLDENS_DIR, g.file));
    try {
      return {
        id: `golden-${name}`,
        ids: Int32Array.from(f.read('input_ids').data as Int32Array),
        golden: g.greedy_continuation,
      };
    } finally {
      f.close();
    }
  }),
  // every held-out prompt
  ...readJsonl('prose.jsonl').map((r) => ({ id: r.id, ids: Int32Array.from(r.prompt_token_ids) })),
  ...readJsonl('code.jsonl').map((r) => ({ id: r.id, ids: Int32Array.from(r.prompt_token_ids) })),
];

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
let drafter: DFlashDrafter;
let plain: Map<string | number, SpecResult>;
beforeAll(async () => {
  target = loadTarget();
  drafter = await loadDrafter(target, {}, 8, 2048);
  // plain greedy decoding (no drafter: one token per forward), batched — bitwise equal to one at a time
  const e = new SpecEngine(target, undefined, { maxSequences: 8, maxTokensPerSequence: 2048 });
  plain = byId(e.run(prompts.map((p) => greedy(p))));
});
afterAll(() => {
  drafter.dispose();
  target.dispose();
});

describe('weights "q8_0" and "q8_0_int8" (the draft layers in Q8_0, int16 or int8 activations)', () => {
  it("is token-for-token plain greedy for every prompt at 8 sequences; τ within 0.15 of the bf16 layers'", async () => {
    const bf = await loadDrafter(target, {}, 8, 2048, { method: 'dflash', path: 'x', weights: 'bf16' });
    const q8 = await loadDrafter(target, {}, 8, 2048, { method: 'dflash', path: 'x', weights: 'q8_0' });
    const i8 = await loadDrafter(target, {}, 8, 2048, { method: 'dflash', path: 'x', weights: 'q8_0_int8' });
    try {
      expectFormatsAgree(
        'DFlash (draft layers)',
        target,
        { bf16: bf, q8_0: q8, q8_0_int8: i8 },
        prompts.map((p) => greedy(p)),
        {
          maxSequences: 8,
          plain,
        },
      );
    } finally {
      bf.dispose();
      q8.dispose();
      i8.dispose();
    }
    await expect(loadDrafter(target, {}, 8, 2048, { weights: 'int4' })).rejects.toThrow(
      /dflash: settings\.weights: expected "bf16" or "q8_0" or "q8_0_int8", got "int4"/,
    );
  });
});

describe('confidences (the setting confidence) and the cost policy', () => {
  it('cuts proposals by their confidences; token-for-token plain greedy for every prompt (one sequence)', async () => {
    const off = await loadDrafter(target, {}, 8, 2048, { method: 'dflash', path: 'x', confidence: false });
    try {
      expect(drafter.confidence).toBe(true); // the default
      expect(off.confidence).toBe(false);
      const cut = new Map<string, number>();
      for (const [name, d] of [
        ['confidence', drafter],
        ['none', off],
      ] as const) {
        // one sequence: on this 2-core target the cost policy drafts far more often alone than in a batch
        const e = new SpecEngine(target, d, { maxSequences: 1, maxTokensPerSequence: 2048 });
        const results = byId(e.run(prompts.map((p) => greedy(p))));
        for (const p of prompts)
          expect(results.get(p.id)!.tokenIds, `${name} ${p.id}`).toEqual(plain.get(p.id)!.tokenIds);
        const m = e.metrics;
        expect(m.drafted, name).toBeGreaterThan(0);
        expect(e.cache.pagesInUse + e.cache.slotsInUse + d.pagesInUse).toBe(0);
        cut.set(name, m.unverified);
        console.log(
          `DFlash, cost policy, one sequence, confidence ${name}: τ ${m.tauPerStep.toFixed(3)}, ` +
            `drafted ${m.drafted}, cut by budgets ${m.unverified}`,
        );
      }
      // the budgets cut only proposals that carry confidences
      expect(cut.get('confidence')).toBeGreaterThan(0);
      expect(cut.get('none')).toBe(0);
    } finally {
      off.dispose();
    }
    await expect(loadDrafter(target, {}, 8, 2048, { confidence: 'yes' })).rejects.toThrow(
      /dflash: settings\.confidence: expected a boolean, got "yes"/,
    );
  });
});

describe('greedy speculative decoding with DFlash', () => {
  it('plain greedy (the baseline) matches the reference continuation of every golden', () => {
    for (const p of prompts) {
      const r = plain.get(p.id)!;
      expect(r.tokenIds.length).toBe(NEW_TOKENS);
      expect(r.metrics.drafted).toBe(0);
      if (p.golden !== undefined) expect(r.tokenIds.slice(0, p.golden.length), p.id).toEqual(p.golden);
    }
  });

  it.each([1, 8])(
    'is token-for-token plain greedy at %i concurrent sequence(s); drafts, τ > 1.5, one target forward per verify step',
    (conc) => {
      const e = new SpecEngine(target, drafter, { maxSequences: conc, draftPolicy: 'max', maxTokensPerSequence: 2048 });
      expect(prompts.length).toBe(4 + 64);
      const results = byId(e.run(prompts.map((p) => greedy(p))));
      for (const p of prompts) {
        const r = results.get(p.id)!;
        expect(r.finishReason).toBe('length');
        expect(r.tokenIds, p.id).toEqual(plain.get(p.id)!.tokenIds);
        expect(r.metrics.drafted, p.id).toBeGreaterThan(0);
      }
      const m = e.metrics;
      expect(m.tauPerStep).toBeGreaterThan(1.5);
      expect(m.tauMeanOfRequests).toBeGreaterThan(1.5);
      expect(m.decodeForwards).toBe(m.verifyForwards);
      // every verify forward carried every running sequence: fewer forwards than per-request steps when batched
      if (conc > 1) expect(m.verifyForwards).toBeLessThan(m.verifySteps);
      else expect(m.verifyForwards).toBe(m.verifySteps);
      // metrics are consistent: committed tokens = accepted + steps (≥ the requested tokens, the last step may
      // overshoot)
      expect(m.accepted + m.verifySteps + prompts.length).toBeGreaterThanOrEqual(prompts.length * NEW_TOKENS);
      const hist = m.acceptanceLengthHistogram;
      expect(hist.reduce((a, b) => a + b, 0)).toBe(m.verifySteps);
      expect(hist.reduce((a, c, n) => a + c * n, 0)).toBe(m.accepted + m.verifySteps);
      expect(m.perPositionAcceptance[0]).toBeGreaterThan(m.perPositionAcceptance[m.perPositionAcceptance.length - 1]!);
      expect(e.cache.pagesInUse + e.cache.slotsInUse + drafter.pagesInUse).toBe(0);
      console.log(
        `DFlash greedy, ${conc} concurrent: τ ${m.tauPerStep.toFixed(3)} ` +
          `(per step) / ${m.tauMeanOfRequests.toFixed(3)} (mean of requests), ` +
          `${m.verifyForwards} verify forwards, ${m.decodeForwards} decode forwards, draft ` +
          `${m.draftMs.toFixed(0)} ms, verify ${m.verifyMs.toFixed(0)} ms, commit ${m.commitMs.toFixed(0)} ms`,
      );
    },
  );

  it('commit by replay gives the same tokens, with extra forwards', () => {
    const few = prompts.slice(0, 2);
    const e = new SpecEngine(target, drafter, {
      maxSequences: 2,
      draftPolicy: 'max',
      maxTokensPerSequence: 2048,
      commit: 'replay',
    });
    const results = byId(e.run(few.map((p) => greedy(p, { maxTokens: 48 }))));
    for (const p of few) expect(results.get(p.id)!.tokenIds).toEqual(plain.get(p.id)!.tokenIds.slice(0, 48));
    expect(e.metrics.decodeForwards).toBeGreaterThan(e.metrics.verifyForwards);
  });
});

describe('resources', () => {
  it('after a mix of length, EOS, stop strings and aborts every page, state slot and draft page is free', () => {
    const tok = Tokenizer.load(TARGET_DIR);
    const e = new SpecEngine(target, drafter, {
      maxSequences: 3,
      draftPolicy: 'max',
      maxTokensPerSequence: 2048,
      decode: (ids) => tok.decode([...ids], { skipSpecialTokens: true }),
    });
    const [a, b, c, d, f] = prompts;
    const pa = plain.get(a!.id)!.tokenIds;
    const pc = plain.get(c!.id)!.tokenIds;
    const stopText = tok.decode(pc.slice(0, 20), { skipSpecialTokens: true });
    e.add(greedy(a!, { maxTokens: 40, ignoreEos: false, eosTokenIds: [pa[9]!] })); // EOS at its 10th token
    e.add(greedy(b!, { maxTokens: 30 })); // length
    e.add(greedy(c!, { stopStrings: [stopText.slice(-6)] })); // stop string
    e.add(greedy(d!)); // aborted while running
    e.add(greedy(f!)); // aborted while waiting
    const done: SpecResult[] = [];
    done.push(...e.step());
    const aborted = [e.abort(f!.id)!];
    done.push(...e.step(), ...e.step());
    aborted.push(e.abort(d!.id) ?? e.abort(c!.id)!);
    while (e.pending > 0) done.push(...e.step());
    const all = byId([...done, ...aborted]);
    expect(all.get(a!.id)!.finishReason).toBe('eos');
    expect(all.get(a!.id)!.tokenIds).toEqual(pa.slice(0, pa.indexOf(pa[9]!) + 1));
    expect(all.get(b!.id)!.finishReason).toBe('length');
    expect(all.get(b!.id)!.tokenIds).toEqual(plain.get(b!.id)!.tokenIds.slice(0, 30));
    expect(all.get(f!.id)!.finishReason).toBe('abort');
    expect(aborted.every((r) => r.finishReason === 'abort')).toBe(true);
    const cr = all.get(c!.id)!;
    expect(cr.finishReason).toBe('stop');
    expect(tok.decode(cr.tokenIds, { skipSpecialTokens: true })).toContain(stopText.slice(-6));
    expect(cr.tokenIds.length).toBeLessThanOrEqual(20);
    expect(all.get(d!.id)!.finishReason).toBe('abort');
    expect(e.cache.pagesInUse).toBe(0);
    expect(e.cache.slotsInUse).toBe(0);
    expect(drafter.pagesInUse).toBe(0);
    expect(e.cache.kv!.numSequences + drafter.pool.numSequences).toBe(0);
    expect(e.abort('nobody')).toBeUndefined();
  });
});

describe('sampling', () => {
  it('temperature > 0: reproducible per seed, finishes, drafts accepted', () => {
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
    const r2 = run(3);
    expect(r1.tokens).toEqual(r2.tokens);
    expect(r1.tokens.every((t) => t.length === 32)).toBe(true);
    expect(r1.m.accepted).toBeGreaterThan(0);
    expect(run(4).tokens).not.toEqual(r1.tokens);
  });
});
