// DSpark with FR-Spec's reduced draft vocabulary (arXiv 2502.14856; the DFlash backbone's draft head): on a copy of
// the shipped checkpoint with `draft_vocab_size` and `draft_vocab_ids`, greedy speculative output equals plain greedy
// decoding token for token, every draft is a listed id, and a sampled proposal's q is 0 off the list and sums to 1.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  fullDraftProbs,
  HfConfig,
  SafetensorsCheckpoint,
  SpecEngine,
  writeSafetensors,
  type DraftProposal,
  type SpecResult,
  type StageModel,
} from '@specd/core';

import { dsparkPlugin, type DSparkDrafter } from '../src/index.js';
import { DSPARK_DIR, loadTarget, REPO_ROOT } from './helpers.js';

const V = 8192;
/** Every other id below 4096, plus 4096 … 8191: 6144 ascending ids. */
const IDS = Int32Array.from([
  ...Array.from({ length: 2048 }, (_, i) => 2 * i),
  ...Array.from({ length: 4096 }, (_, i) => 4096 + i),
]);

let target: StageModel;
let tmp: string;
let drafter: DSparkDrafter;
beforeAll(async () => {
  target = loadTarget();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-dspark-vocab-'));
  const base = HfConfig.read(DSPARK_DIR).raw as Record<string, unknown>;
  const dflash = { ...(base.dflash_config as Record<string, unknown>), draft_vocab_size: IDS.length };
  fs.writeFileSync(path.join(tmp, 'config.json'), JSON.stringify({ ...base, dflash_config: dflash }));
  const w = SafetensorsCheckpoint.open(DSPARK_DIR);
  const tensors = new Map(
    w.names().map((n) => {
      const t = w.read(n);
      return [n, { dtype: t.dtype, shape: t.shape, data: t.data }] as const;
    }),
  );
  w.close();
  tensors.set('draft_vocab_ids', { dtype: 'I32', shape: [IDS.length], data: IDS });
  writeSafetensors(path.join(tmp, 'model.safetensors'), tensors);
  const weights = SafetensorsCheckpoint.open(tmp);
  try {
    drafter = (await dsparkPlugin.load(
      { dir: tmp, config: HfConfig.read(tmp), weights },
      { target, maxSequences: 8, maxTokensPerSequence: 1024 },
    )) as DSparkDrafter;
  } finally {
    weights.close();
  }
});
afterAll(() => {
  drafter.dispose();
  target.dispose();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('DSpark with a reduced draft vocabulary', () => {
  it('greedy output equals plain decoding; drafts are listed ids; sampled q lives on the list', () => {
    expect(drafter.backbone.draftHead?.size).toBe(IDS.length);
    const requests = fs
      .readFileSync(path.join(REPO_ROOT, 'test/prompts/code.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .slice(0, 6)
      .map((l) => JSON.parse(l) as { id: string; prompt_token_ids: number[] })
      .map((p) => ({
        id: p.id,
        promptIds: Int32Array.from(p.prompt_token_ids),
        maxTokens: 48,
        sampling: { temperature: 0 },
        seed: 1,
        ignoreEos: true,
      }));
    const allowed = new Set(IDS);
    const proposals: DraftProposal[] = [];
    const propose = drafter.propose.bind(drafter);
    drafter.propose = (batch) => {
      const out = propose(batch);
      proposals.push(...out);
      return out;
    };
    const opts = { maxSequences: 8, maxTokensPerSequence: 1024 };
    const plain = new SpecEngine(target, undefined, opts).run(requests);
    const engine = new SpecEngine(target, drafter, { ...opts, draftPolicy: 'max' });
    const spec = engine.run(requests);
    // results come in completion order: compare by request id
    const byId = (rs: readonly SpecResult[]) => Object.fromEntries(rs.map((r) => [r.id, Array.from(r.tokenIds)]));
    expect(spec).toHaveLength(requests.length);
    expect(byId(spec)).toEqual(byId(plain));
    expect(engine.metrics.tauPerStep).toBeGreaterThan(1);
    const drafted = proposals.flatMap((p) => Array.from(p.tokens));
    expect(drafted.length).toBeGreaterThan(0);
    expect(drafted.filter((t) => !allowed.has(t))).toEqual([]);

    proposals.length = 0;
    new SpecEngine(target, drafter, { ...opts, draftPolicy: 'max' }).run([
      { ...requests[0]!, maxTokens: 8, sampling: { temperature: 1 }, seed: 5 },
    ]);
    const p = proposals[0]!;
    // q over the draft vocabulary [k, Vd] (probsIds), written out [k, V]
    expect(p.probs!.length).toBe(p.tokens.length * p.probsIds!.length);
    const full = fullDraftProbs(p, V)!;
    for (let j = 0; j < p.tokens.length; j++) {
      let on = 0;
      let off = 0;
      for (let v = 0; v < V; v++) {
        const q = full[j * V + v]!;
        if (allowed.has(v)) on += q;
        else off += q;
      }
      expect(off).toBe(0);
      expect(on).toBeCloseTo(1, 4);
      expect(allowed.has(p.tokens[j]!)).toBe(true);
    }
  });
});
