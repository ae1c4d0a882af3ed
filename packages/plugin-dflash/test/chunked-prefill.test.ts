// Chunked prefill with the shipped target (+ DFlash): a 300-token prompt admitted while another
// sequence decodes is prefilled one 64-token chunk per engine step (5 steps), the decoding sequence
// commits tokens in every one of those steps, and nothing changes numerically — the long prompt's
// logits (its first token's and every plain decode step's) are bitwise those of the request run
// alone, and the greedy tokens of both requests, plain and with DFlash, are their alone tokens.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { SpecEngine, type ForwardBatch, type ForwardResult, type SpecRequest, type StageModel } from '@specd/core';

import type { DFlashDrafter } from '../src/index.js';
import { loadDrafter, loadTarget, REPO_ROOT } from './helpers.js';

const CHUNK = 64;
const readJsonl = (f: string) =>
  fs
    .readFileSync(path.join(REPO_ROOT, 'test/prompts', f), 'utf8')
    .trim()
    .split('\n')
    .map((l) => (JSON.parse(l) as { prompt_token_ids: number[] }).prompt_token_ids);

let target: StageModel;
let drafter: DFlashDrafter;
/** Logit rows returned for sequence 'b', in order (copied). */
let rowsOfB: Float32Array[] = [];
/** `target` with every forward's logit rows of sequence 'b' recorded. */
let recording: StageModel;
const longPrompt = Int32Array.from(readJsonl('prose.jsonl').flat().slice(0, 300));
const shortPrompt = Int32Array.from(readJsonl('code.jsonl')[0]!);

beforeAll(async () => {
  target = loadTarget();
  drafter = await loadDrafter(target, {}, 2, 1024);
  const forward = (...args: Parameters<StageModel['forward']>): ForwardResult => {
    const batch: ForwardBatch = args[0];
    const res = target.forward(...args);
    const V = target.info.vocabSize;
    batch.sequences.forEach((s, i) => {
      if (s.id === 'b' && res.logits !== undefined && res.logitRowStart[i + 1]! > res.logitRowStart[i]!)
        rowsOfB.push(res.logits.slice(res.logitRowStart[i]! * V, res.logitRowStart[i + 1]! * V));
    });
    return res;
  };
  recording = new Proxy(target, {
    get(t, key) {
      if (key === 'forward') return forward;
      const v: unknown = Reflect.get(t, key, t);
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(t) : v;
    },
  });
});
afterAll(() => {
  drafter.dispose();
  target.dispose();
});

const request = (id: string, promptIds: Int32Array, maxTokens: number, onToken?: (t: number) => void): SpecRequest => ({
  id,
  promptIds,
  maxTokens,
  sampling: { temperature: 0 },
  seed: 0,
  ignoreEos: true,
  ...(onToken === undefined ? {} : { onToken }),
});
const concat = (rows: Float32Array[]): Buffer =>
  Buffer.concat(rows.map((r) => Buffer.from(r.buffer, r.byteOffset, r.byteLength)));

describe.each([
  ['plain decoding', false],
  ['DFlash', true],
])('chunked prefill with the shipped target, %s', (_name, spec) => {
  it(
    'a 300-token prompt prefills over 5 steps while the other ' +
      'sequence commits in each; tokens (and plain logits) as alone',
    () => {
      expect(longPrompt.length).toBe(300);
      const engine = () =>
        new SpecEngine(recording, spec ? drafter : undefined, {
          maxSequences: 2,
          maxTokensPerSequence: 1024,
          draftPolicy: 'max',
          prefillChunk: CHUNK,
        });
      // alone
      const aloneA = engine().run([request('a', shortPrompt, 128)])[0]!.tokenIds;
      rowsOfB = [];
      const aloneB = engine().run([request('b', longPrompt, 24)])[0]!.tokenIds;
      const aloneRows = concat(rowsOfB);
      // interleaved: b admitted while a decodes
      rowsOfB = [];
      const e = engine();
      const got = { a: [] as number[], b: [] as number[] };
      e.add(request('a', shortPrompt, 128, (t) => got.a.push(t)));
      while (got.a.length === 0) e.step(); // a prefilled (⌈|prompt| / 64⌉ steps), decoding
      e.add(request('b', longPrompt, 24, (t) => got.b.push(t)));
      const steps = Math.ceil(longPrompt.length / CHUNK);
      expect(steps).toBe(5);
      for (let s = 0; s < steps; s++) {
        const [aBefore, prefillBefore] = [got.a.length, e.metrics.prefillForwards];
        e.step();
        expect(e.metrics.prefillForwards - prefillBefore).toBe(1); // one chunk of b per step
        expect(got.a.length - aBefore).toBeGreaterThanOrEqual(1); // a keeps decoding meanwhile
        if (!spec) expect(got.a.length - aBefore).toBe(1);
        expect(e.prefilling).toBe(s < steps - 1 ? 1 : 0);
        expect(got.b.length > 0).toBe(s === steps - 1);
      }
      while (e.pending > 0) e.step();
      expect(got.a.slice(0, 128)).toEqual(aloneA);
      expect(got.b.slice(0, 24)).toEqual(aloneB);
      expect(e.cache.pagesInUse + e.cache.slotsInUse + drafter.pagesInUse).toBe(0);
      // plain: every logit row of b (first token from the last chunk, then one per decode step, batched
      // with a) is bitwise the row b got alone
      if (!spec) {
        expect(rowsOfB.length).toBe(24);
        expect(concat(rowsOfB).equals(aloneRows)).toBe(true);
      }
    },
  );
});
