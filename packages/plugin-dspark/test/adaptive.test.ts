// DSpark with the engine's adaptive verification (the 'cost' policy's survival budgets over the
// confidence head) and the context-KV-only load mode, with the shipped target + DSpark checkpoint:
// - draftPolicy 'cost': greedy output is plain greedy decoding's; budgets below the block are
//   recorded in the metrics (histogram printed); every page is freed;
// - context-KV-only: the projection and the draft KV it writes are bit-identical to the full
//   drafter's; propose throws a DrafterError that says why; the block weights are not loaded.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  CostDraftPolicy,
  DrafterError,
  HfConfig,
  SafetensorsCheckpoint,
  SafetensorsFile,
  SpecEngine,
  StepCosts,
  type SpecRequest,
  type StageModel,
} from '@specd/core';

import { dsparkPlugin, DSPARK_SCHEMA, type DSparkDrafter } from '../src/index.js';
import { DSPARK_DIR, GOLDENS_DIR, loadDrafter, loadTarget } from './helpers.js';

const index = JSON.parse(fs.readFileSync(path.join(GOLDENS_DIR, 'index.json'), 'utf8')) as {
  goldens: Record<string, { file: string }>;
};
const prompts = Object.entries(index.goldens)
  .slice(0, 4)
  .map(([name, g]) => {
    const f = SafetensorsFile.open(path.join(GOLDENS_DIR, g.file));
    try {
      return { id: `golden-${name}`, ids: Int32Array.from(f.read('input_ids').data as Int32Array) };
    } finally {
      f.close();
    }
  });
const NEW_TOKENS = 96;
const greedy = (p: { id: string; ids: Int32Array }): SpecRequest => ({
  id: p.id,
  promptIds: p.ids,
  maxTokens: NEW_TOKENS,
  sampling: { temperature: 0 },
  seed: 0,
  ignoreEos: true,
});

let target: StageModel;
let drafter: DSparkDrafter;
beforeAll(async () => {
  target = loadTarget();
  drafter = await loadDrafter(target, 4, 2048);
});
afterAll(() => {
  drafter.dispose();
  target.dispose();
});

describe('adaptive verification (draftPolicy "cost")', () => {
  it("greedy output is plain decoding's; survival budgets below the block are recorded; pages freed", () => {
    const plain = new Map(
      new SpecEngine(target, undefined, { maxSequences: 4, maxTokensPerSequence: 2048 })
        .run(prompts.map(greedy))
        .map((r) => [r.id, r.tokenIds]),
    );
    // Fixed synthetic step costs (not this machine's timings, which vary with load): verifying is
    // expensive (t_verify = 100 ms + 60 ms per row per sequence, t_draft = 50 ms), so λ = R*·δ ≈ 0.6
    // and the survival rule cuts blocks; plain steps are the optimum, so every other step explores
    // with the full block (exploreEvery 1) — budgets need proposals. Measured per-step overheads
    // (~ms) barely move λ at this scale.
    const ks = [0, 1, 2, 3, 4, 5, 6, 7];
    const costs = new StepCosts([
      { sequences: 1, ks, verifyMs: ks.map((k) => 100 + 60 * k), draftMs: ks.map((k) => (k === 0 ? 0 : 50)) },
    ]);
    // keep the synthetic costs; the rule alone (the realised-rate arms would check it against this machine's timings)
    const policy = new CostDraftPolicy(costs, {
      exploreEvery: 1,
      exploreDrafts: 7,
      recalibrate: false,
      realizedArms: false,
    });
    const e = new SpecEngine(target, drafter, { maxSequences: 4, maxTokensPerSequence: 2048, draftPolicy: policy });
    const rs = e.run(prompts.map(greedy));
    for (const r of rs) {
      expect(r.tokenIds.length).toBe(NEW_TOKENS);
      expect(r.tokenIds, String(r.id)).toEqual(plain.get(r.id));
    }
    const m = e.metrics;
    const h = m.budgetHistogram;
    console.log(
      `DSpark adaptive: budget histogram (steps by verified drafts) ${JSON.stringify(h)}` +
        `, mean budget ${m.meanBudget.toFixed(2)}, unverified ${m.unverified}, verified ` +
        `${m.drafted}, accepted ${m.accepted}, τ ${m.tauPerStep.toFixed(3)}`,
    );
    expect(h.reduce((a, b) => a + b, 0)).toBeGreaterThan(0);
    expect(h.slice(0, 7).reduce((a, b) => a + b, 0)).toBeGreaterThan(0); // some budgets < the block (7)
    expect(m.unverified).toBeGreaterThan(0);
    expect(m.accepted).toBeGreaterThan(0);
    expect(policy.threshold).toBeGreaterThan(0.3);
    expect(e.cache.pagesInUse + e.cache.slotsInUse + drafter.pagesInUse).toBe(0);
  });
});

describe('context-KV-only mode', () => {
  let ctx: DSparkDrafter;
  beforeAll(async () => {
    const weights = SafetensorsCheckpoint.open(DSPARK_DIR);
    try {
      ctx = (await dsparkPlugin.load(
        { dir: DSPARK_DIR, config: HfConfig.read(DSPARK_DIR), weights },
        {
          target,
          maxSequences: 4,
          maxTokensPerSequence: 2048,
          settings: { method: 'dspark', path: DSPARK_DIR, context_only: true },
        },
      )) as DSparkDrafter;
    } finally {
      weights.close();
    }
  });
  afterAll(() => ctx.dispose());

  it('is in the config schema', () => {
    expect((DSPARK_SCHEMA.properties as Record<string, unknown>).context_only).toMatchObject({
      type: 'boolean',
      default: false,
    });
  });

  it("projection and draft KV are bit-identical to the full drafter's (two spans, pool contents compared)", () => {
    expect(ctx.contextOnly).toBe(true);
    expect(drafter.contextOnly).toBe(false);
    const D = drafter.config.hiddenSize;
    const id = 'ctx-kv';
    const spans = [11, 23]; // two writes: positions 0..10, then 11..33
    for (const d of [drafter, ctx]) d.addSequence(id);
    try {
      let pos = 0;
      for (const [si, T] of spans.entries()) {
        const taps = new Map(
          drafter.config.taps.map((t, i) => [
            t,
            Float32Array.from({ length: T * D }, (_, e) => Math.sin(e * 0.37 + i + 5 * si)),
          ]),
        );
        const sums = [drafter, ctx].map((d) => d.projectTargetHiddenPartial(taps, T));
        expect(Buffer.from(sums[1]!.buffer).equals(Buffer.from(sums[0]!.buffer))).toBe(true);
        [drafter, ctx].forEach((d, i) => {
          d.writeProjectedContextKV(sums[i]!, [{ id, position: pos, numTokens: T }]);
        });
        pos += T;
      }
      expect(ctx.contextLength(id)).toBe(pos);
      const F = drafter.pool.floatsPerToken;
      let compared = 0;
      for (let layer = 0; layer < 2 * drafter.config.numLayers; layer++) {
        const a = drafter.pool.layerStore(layer);
        const b = ctx.pool.layerStore(layer);
        for (let t = 0; t < pos; t++) {
          const oa = drafter.pool.tokenOffset(id, t);
          const ob = ctx.pool.tokenOffset(id, t);
          const va = a.subarray(oa, oa + F);
          const vb = b.subarray(ob, ob + F);
          expect(
            Buffer.from(vb.slice().buffer).equals(Buffer.from(va.slice().buffer)),
            `layer ${layer} token ${t}`,
          ).toBe(true);
          compared++;
        }
      }
      expect(compared).toBe(2 * drafter.config.numLayers * pos);
    } finally {
      drafter.freeSequence(id);
      ctx.freeSequence(id);
    }
    expect(ctx.pagesInUse + drafter.pagesInUse).toBe(0);
  });

  it(
    'propose throws a DrafterError that says why (also through ' +
      'the engine); loaded via DrafterLoadOptions.contextOnly too',
    async () => {
      const id = 'ctx-propose';
      ctx.addSequence(id);
      try {
        const call = () =>
          ctx.propose({
            sequences: [
              {
                id,
                position: 0,
                lastToken: 1,
                maxDrafts: 3,
                history: Int32Array.of(1),
                sampling: { temperature: 0 },
                rng: { next: () => 0.5 },
              },
            ],
          });
        expect(call).toThrow(DrafterError);
        expect(call).toThrow(
          'dspark: propose: this drafter was loaded in context-KV-only mode (projection and ' +
            'draft KV only, for a prefill-only producer); load it without context_only to draft',
        );
      } finally {
        ctx.freeSequence(id);
      }
      const e = new SpecEngine(target, ctx, { maxSequences: 1, maxTokensPerSequence: 2048, draftPolicy: 'max' });
      // through the engine the request fails alone, with the drafter's reason
      const [r] = e.run([{ ...greedy(prompts[0]!), maxTokens: 4 }]);
      expect(r?.finishReason).toBe('error');
      expect(r?.error?.cause).toBeInstanceOf(DrafterError);
      expect(r?.error?.message).toMatch(/context-KV-only mode/);
      e.dispose();
      expect(ctx.pagesInUse).toBe(0);
      const weights = SafetensorsCheckpoint.open(DSPARK_DIR);
      try {
        const d2 = (await dsparkPlugin.load(
          { dir: DSPARK_DIR, config: HfConfig.read(DSPARK_DIR), weights },
          { target, maxSequences: 1, maxTokensPerSequence: 256, contextOnly: true },
        )) as DSparkDrafter;
        expect(d2.contextOnly).toBe(true);
        expect(() => d2.backbone.runBlocks([])).toThrow(/context-KV-only/);
        d2.dispose();
      } finally {
        weights.close();
      }
    },
  );
});
