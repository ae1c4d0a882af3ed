// FR-Spec's reduced draft vocabulary (arXiv 2502.14856) on the shipped tiny target + DFlash drafter:
// - `dflash_config.draft_vocab_size` is checked against vocab_size, and `draft_vocab_ids` at load (present, shape,
//   dtype, in range, strictly ascending), each error naming the field or tensor;
// - the gathered lm_head rows are the target's (lmHead of any x restricted to the ids, within bf16 tolerance);
// - greedy speculative output with the reduced head equals plain greedy decoding token for token (verification keeps
//   the whole vocabulary), every draft is an id of the list, and a sampled proposal's q is 0 outside the list and
//   sums to 1 over it.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  fullDraftProbs,
  HfConfig,
  quantizeQ8_0,
  SafetensorsCheckpoint,
  SeededRandom,
  SpecEngine,
  writeSafetensors,
  type DraftProposal,
  type SpecResult,
  type StageModel,
} from '@specd/core';

import { quantizedWeights, gemmQuant } from '@specd/native';

import { dflashPlugin, gatherLmHeadRows, parseDFlashConfig, type DFlashDrafter } from '../src/index.js';
import { DFLASH_DIR, loadTarget, relError, REPO_ROOT } from './helpers.js';

const V = 8192;
let target: StageModel;
let tmp: string;
beforeAll(() => {
  target = loadTarget();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-draft-vocab-'));
});
afterAll(() => {
  target.dispose();
  fs.rmSync(tmp, { recursive: true, force: true });
});

/** A copy of the shipped DFlash checkpoint with `draft_vocab_size` and a `draft_vocab_ids` tensor. */
function checkpointWith(
  name: string,
  size: number | undefined,
  ids?: { dtype: 'I32' | 'I64' | 'F32'; data: ArrayBufferView; n: number },
): string {
  const dir = path.join(tmp, name);
  fs.mkdirSync(dir);
  const base = HfConfig.read(DFLASH_DIR).raw as Record<string, unknown>;
  const dflash = {
    ...(base.dflash_config as Record<string, unknown>),
    ...(size === undefined ? {} : { draft_vocab_size: size }),
  };
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify({ ...base, dflash_config: dflash }));
  const w = SafetensorsCheckpoint.open(DFLASH_DIR);
  const tensors = new Map(
    w.names().map((n) => {
      const t = w.read(n);
      return [n, { dtype: t.dtype, shape: t.shape, data: t.data }] as const;
    }),
  );
  w.close();
  if (ids !== undefined) tensors.set('draft_vocab_ids', { dtype: ids.dtype, shape: [ids.n], data: ids.data });
  writeSafetensors(path.join(dir, 'model.safetensors'), tensors);
  return dir;
}

async function load(dir: string, maxSequences = 4, settings?: Record<string, unknown>): Promise<DFlashDrafter> {
  const weights = SafetensorsCheckpoint.open(dir);
  try {
    return (await dflashPlugin.load(
      { dir, config: HfConfig.read(dir), weights },
      { target, maxSequences, maxTokensPerSequence: 1024, ...(settings === undefined ? {} : { settings }) },
    )) as DFlashDrafter;
  } finally {
    weights.close();
  }
}

/** Every third id below 6144, plus 6144 … 8191: 4096 ascending ids. */
const IDS = Int32Array.from([
  ...Array.from({ length: 2048 }, (_, i) => 3 * i),
  ...Array.from({ length: 2048 }, (_, i) => 6144 + i),
]);

describe('draft_vocab_size and draft_vocab_ids are checked', () => {
  it('draft_vocab_size above vocab_size names the field', () => {
    const base = HfConfig.read(DFLASH_DIR).raw as Record<string, unknown>;
    const cfg = (size: number) =>
      HfConfig.fromObject({ ...base, dflash_config: { ...(base.dflash_config as object), draft_vocab_size: size } });
    expect(() => parseDFlashConfig(cfg(V + 1))).toThrow(
      /dflash_config\.draft_vocab_size.*at most vocab_size = 8192, got 8193/,
    );
    expect(() => parseDFlashConfig(cfg(0))).toThrow(/dflash_config\.draft_vocab_size/);
    expect(parseDFlashConfig(cfg(4096)).draftVocabSize).toBe(4096);
    expect(parseDFlashConfig(HfConfig.read(DFLASH_DIR)).draftVocabSize).toBeUndefined();
  });
  it('a missing, mis-shaped, mis-typed, out-of-range, repeated or unsorted list is refused naming it', async () => {
    const i32 = (xs: number[]) => ({ dtype: 'I32' as const, data: Int32Array.from(xs), n: xs.length });
    await expect(load(checkpointWith('missing', 4))).rejects.toThrow(
      /draft_vocab_size is 4 but the checkpoint has no draft_vocab_ids/,
    );
    await expect(load(checkpointWith('shape', 4, i32([1, 2, 3])))).rejects.toThrow(
      /draft_vocab_ids is \[3\], expected \[4\]/,
    );
    await expect(load(checkpointWith('dtype', 2, { dtype: 'F32', data: Float32Array.of(1, 2), n: 2 }))).rejects.toThrow(
      /draft_vocab_ids: expected dtype I32 or I64, got F32/,
    );
    await expect(load(checkpointWith('range', 3, i32([1, 2, V])))).rejects.toThrow(
      /draft_vocab_ids\[2\] = 8192 is outside the vocabulary \[0, 8192\)/,
    );
    await expect(load(checkpointWith('repeat', 3, i32([1, 2, 2])))).rejects.toThrow(
      /draft_vocab_ids\[2\] = 2 does not follow draft_vocab_ids\[1\] = 2 \(expected strictly ascending/,
    );
    await expect(load(checkpointWith('order', 3, i32([1, 5, 4])))).rejects.toThrow(
      /draft_vocab_ids\[2\] = 4 does not follow/,
    );
  });
  it('I64 ids load as well', async () => {
    const d = await load(checkpointWith('i64', 3, { dtype: 'I64', data: BigInt64Array.of(7n, 70n, 700n), n: 3 }));
    expect(Array.from(d.draftHead!.ids!)).toEqual([7, 70, 700]);
    d.dispose();
  });
});

describe('the reduced draft head', () => {
  let drafter: DFlashDrafter;
  beforeAll(async () => {
    drafter = await load(checkpointWith('reduced', IDS.length, { dtype: 'I32', data: IDS, n: IDS.length }), 8);
  });
  afterAll(() => drafter.dispose());

  it("gathers the target's lm_head rows of the listed ids", () => {
    const D = target.info.hiddenSize;
    const rng = new SeededRandom(3);
    const x = Float32Array.from({ length: 2 * D }, () => rng.next() - 0.5);
    const full = target.lmHead!(x, 2);
    const rows = gatherLmHeadRows(target, IDS.subarray(0, 64));
    let worst = 0;
    for (let r = 0; r < 2; r++)
      for (let j = 0; j < 64; j++) {
        let dot = 0;
        for (let d = 0; d < D; d++) dot += x[r * D + d]! * rows[j * D + d]!;
        worst = Math.max(worst, Math.abs(dot - full[r * V + IDS[j]!]!));
      }
    expect(worst).toBeLessThan(1e-4);
    expect(drafter.draftHead!.size).toBe(IDS.length);
  });

  it('greedy speculative output equals plain decoding; drafts are ids of the list; sampled q lives on it', () => {
    const prompts = fs
      .readFileSync(path.join(REPO_ROOT, 'test/prompts/prose.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .slice(0, 6)
      .map((l) => JSON.parse(l) as { id: string; prompt_token_ids: number[] });
    const requests = prompts.map((p) => ({
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
    expect(engine.metrics.drafted).toBeGreaterThan(0);
    expect(engine.metrics.tauPerStep).toBeGreaterThan(1);
    const drafted = proposals.flatMap((p) => Array.from(p.tokens));
    expect(drafted.length).toBeGreaterThan(0);
    expect(drafted.filter((t) => !allowed.has(t))).toEqual([]);

    // one sampled proposal: q [k, Vd] over the list (probsIds), written out [k, V] 0 off it, sums to 1, and the
    // drafts are on it
    const sampled = new SpecEngine(target, drafter, { ...opts, draftPolicy: 'max' });
    proposals.length = 0;
    sampled.run([{ ...requests[0]!, maxTokens: 8, sampling: { temperature: 1 }, seed: 5 }]);
    const p = proposals[0]!;
    const k = p.tokens.length;
    expect(p.probsIds!.length).toBe(allowed.size);
    expect(p.probs!.length).toBe(k * allowed.size);
    const full = fullDraftProbs(p, V)!;
    expect(full.length).toBe(k * V);
    for (let j = 0; j < k; j++) {
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

describe("the reduced head's Q8_0 rows (AVX-512 CPUs without AMX)", () => {
  it('Q8_0 rows d·q come back as the same blocks; other rows within the 8-bit rounding', () => {
    // blocks with a ±127 quant (as ggml's quantizer makes them) round-trip exactly
    const n = 3;
    const k = 64;
    const rng = new SeededRandom(5);
    const raw = new Uint8Array(((n * k) / 32) * 34);
    const view = new DataView(raw.buffer);
    const w = new Float32Array(n * k);
    for (let b = 0; b < (n * k) / 32; b++) {
      const h = 0x1c00 + b * 37; // f16 scales 2^-8 … (exponent 7)
      view.setUint16(b * 34, h, true);
      const d = 2 ** -8 * (1 + (b * 37) / 1024);
      for (let j = 0; j < 32; j++) {
        const q = j === 5 ? (b % 2 === 0 ? 127 : -127) : Math.floor(rng.next() * 255) - 127;
        raw[b * 34 + 2 + j] = q & 0xff;
        w[b * 32 + j] = d * q;
      }
    }
    expect(Array.from(quantizeQ8_0(w, n, k))).toEqual(Array.from(raw));
    // arbitrary rows: within about half a quantum of each block's max
    const x = Float32Array.from({ length: n * k }, () => rng.next() - 0.5);
    const qw = quantizedWeights(quantizeQ8_0(x, n, k), 'q8_0', n, k);
    const eye = new Float32Array(k * k);
    for (let i = 0; i < k; i++) eye[i * k + i] = 1;
    const back = gemmQuant(eye, k, qw); // [k, n]: column i of the dequantized rows
    for (let r = 0; r < n; r++)
      for (let b = 0; b < k / 32; b++) {
        let amax = 0;
        for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(x[r * k + b * 32 + j]!));
        for (let j = 0; j < 32; j++)
          // half a quantum, plus 127 quanta of d's f16 rounding (ggml rounds w / d with the f32 d, stores d as f16)
          expect(Math.abs(back[(b * 32 + j) * n + r]! - x[r * k + b * 32 + j]!)).toBeLessThanOrEqual(
            (0.5 + 127 * 2 ** -11 + 1e-3) * (amax / 127),
          );
      }
  });

  it('draft_vocab "whole" drafts over the whole vocabulary although the checkpoint lists a reduced one', async () => {
    const dir = checkpointWith('whole', IDS.length, { dtype: 'I32', data: IDS, n: IDS.length });
    const d = await load(dir, 1, { draft_vocab: 'whole' });
    try {
      expect(d.draftHead!.ids).toBeUndefined();
      expect(d.draftHead!.size).toBe(V);
    } finally {
      d.dispose();
    }
  });
});

describe('draft_head "packed": the whole vocabulary from a drafter-owned copy of the lm_head', () => {
  it("gives the target lm_head's logits within bf16 rounding", async () => {
    const d = await load(DFLASH_DIR, 1, { draft_head: 'packed' });
    try {
      const head = d.draftHead!;
      expect(head.size).toBe(V);
      expect(head.ids).toBeUndefined();
      const D = target.info.hiddenSize;
      const rng = new SeededRandom(9);
      const x = Float32Array.from({ length: 3 * D }, () => rng.next() - 0.5);
      // bf16 weights (and bf16 activations on AMX): 8 significant bits; Q8_0 weights with int8 activations (AVX-512
      // without AMX): ~1 %
      expect(relError(head.logits(x, 3), target.lmHead!(x, 3))).toBeLessThan(2e-2);
    } finally {
      d.dispose();
    }
  });
});
