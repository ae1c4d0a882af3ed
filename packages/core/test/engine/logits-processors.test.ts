// The request's logits processors (logit_bias, min_tokens, repetition / frequency / presence penalties) against a
// plain-loop reference of vLLM's formulas, their verify-block rows (drafts before row j counted as generated) and
// their range checks.
import { describe, expect, it } from 'vitest';

import {
  hasLogitsProcessing,
  LogitsProcessor,
  logitsProcessingProblem,
  SeededRandom,
  type SamplingParams,
  type SpecRequest,
} from '../../src/engine/index.js';

const V = 64;

/**
 * vLLM's order (sampler.py apply_logits_processors; utils.py apply_penalties), one f32 rounding per operation, over
 * explicit lists (no counts kept): `generated` the generated tokens before this row.
 */
function reference(
  logits: Float32Array,
  s: SamplingParams,
  prompt: readonly number[],
  generated: readonly number[],
  stopIds: readonly number[],
): Float32Array {
  const f = Math.fround;
  const x = Float32Array.from(logits);
  for (const [id, b] of s.logitBias ?? []) x[id] = f(x[id]! + b);
  if (generated.length < (s.minTokens ?? 0)) for (const id of stopIds) x[id] = -Infinity;
  const r = f(s.repetitionPenalty ?? 1);
  for (let id = 0; id < V; id++) {
    const count = generated.filter((t) => t === id).length;
    if (prompt.includes(id) || count > 0) x[id] = x[id]! > 0 ? f(x[id]! / r) : f(x[id]! * r);
    x[id] = f(x[id]! - f(f(s.frequencyPenalty ?? 0) * count));
    if (count > 0) x[id] = f(x[id]! - f(s.presencePenalty ?? 0));
  }
  return x;
}

const randomRow = (rng: SeededRandom): Float32Array => Float32Array.from({ length: V }, () => (rng.next() - 0.5) * 8);
const randomIds = (rng: SeededRandom, n: number): number[] =>
  Array.from({ length: n }, () => Math.floor(rng.next() * V));

const request = (sampling: SamplingParams, promptIds: readonly number[], extra: Partial<SpecRequest> = {}) =>
  ({ id: 'r', promptIds: Int32Array.from(promptIds), maxTokens: 32, sampling, seed: 1, ...extra }) as SpecRequest;

const SETTINGS: readonly [string, SamplingParams][] = [
  ['repetition 1.3', { temperature: 0, repetitionPenalty: 1.3 }],
  ['repetition 0.7 (rewards repeats)', { temperature: 0, repetitionPenalty: 0.7 }],
  ['frequency 0.4 and presence -0.9', { temperature: 1, frequencyPenalty: 0.4, presencePenalty: -0.9 }],
  [
    'logit_bias',
    {
      temperature: 1,
      logitBias: new Map([
        [3, 5.5],
        [40, -100],
        [7, 0.25],
      ]),
    },
  ],
  [
    'everything, min_tokens 3',
    {
      temperature: 0.8,
      repetitionPenalty: 1.2,
      frequencyPenalty: -0.3,
      presencePenalty: 1.1,
      logitBias: new Map([[5, 2]]),
      minTokens: 3,
    },
  ],
];

describe.each(SETTINGS)('LogitsProcessor: %s', (_name, sampling) => {
  it('processes a row as the plain-loop reference, after the committed tokens and after drafts', () => {
    const rng = new SeededRandom(17);
    const prompt = randomIds(rng, 12);
    const stopIds = [2, 9];
    const proc = LogitsProcessor.of(request(sampling, prompt, { eosTokenIds: [2], stopTokenIds: [9] }))!;
    expect(proc).toBeDefined();
    const generated: number[] = [];
    let changed = 0;
    for (let step = 0; step < 6; step++) {
      const row = randomRow(rng);
      const want = reference(row, sampling, prompt, generated, stopIds);
      const got = Float32Array.from(row);
      proc.apply(got);
      expect(got, `step ${step}`).toEqual(want);
      if (got.some((v, i) => v !== row[i])) changed++;
      // a verify block after 3 drafts: row x is the row after the committed tokens and drafts [0, x)
      const drafts = randomIds(rng, 3);
      const block = Float32Array.from({ length: 4 * V }, () => (rng.next() - 0.5) * 8);
      const tokens = Int32Array.from([generated.at(-1) ?? prompt.at(-1)!, ...drafts]);
      const processed = proc.block(block, V, tokens);
      expect(block.some((v, i) => v !== processed[i])).toBe(true);
      for (let x = 0; x < 4; x++) {
        const ref = reference(
          block.subarray(x * V, (x + 1) * V),
          sampling,
          prompt,
          [...generated, ...drafts.slice(0, x)],
          stopIds,
        );
        expect(processed.subarray(x * V, (x + 1) * V), `step ${step}, verify row ${x}`).toEqual(ref);
      }
      const t = Math.floor(rng.next() * V);
      generated.push(t);
      proc.push(t);
    }
    // (frequency and presence change nothing before the first generated token)
    expect(changed).toBeGreaterThanOrEqual(5);
  });
});

describe('LogitsProcessor', () => {
  it('a tree row counts the drafts on its root path only', () => {
    const sampling: SamplingParams = { temperature: 0, frequencyPenalty: 1, repetitionPenalty: 1.5 };
    const prompt = [1, 2];
    const proc = LogitsProcessor.of(request(sampling, prompt))!;
    // rows: 0 root; 1 (draft 10) and 2 (draft 11) children of the root; 3 (draft 12) child of row 2
    const tokens = Int32Array.of(2, 10, 11, 12);
    const tree = Int32Array.of(-1, 0, 0, 2);
    const rng = new SeededRandom(3);
    const block = Float32Array.from({ length: 5 * V }, () => rng.next() * 4);
    const rows = proc.block(block.subarray(0, 4 * V), V, tokens, tree);
    const paths = [[], [10], [11], [11, 12]];
    paths.forEach((p, x) => {
      const ref = reference(block.subarray(x * V, (x + 1) * V), sampling, prompt, p, []);
      expect(rows.subarray(x * V, (x + 1) * V), `row ${x}`).toEqual(ref);
    });
  });

  it('min_tokens masks EOS (unless ignore_eos) and stop_token_ids until min_tokens are generated', () => {
    const sampling: SamplingParams = { temperature: 0, minTokens: 2 };
    for (const ignoreEos of [false, true]) {
      const proc = LogitsProcessor.of(request(sampling, [0], { eosTokenIds: [4], stopTokenIds: [6], ignoreEos }))!;
      const row = new Float32Array(V).fill(1);
      proc.apply(row);
      expect([row[4], row[6], row[5]]).toEqual([ignoreEos ? 1 : -Infinity, -Infinity, 1]);
      // a verify block of 2 drafts: rows after 0 and 1 generated tokens are masked, the row after 2 is not
      const block = new Float32Array(3 * V).fill(1);
      const out = proc.block(block, V, Int32Array.of(0, 8, 8));
      expect([0, 1, 2].map((x) => out[x * V + 6])).toEqual([-Infinity, -Infinity, 1]);
      proc.push(8);
      proc.push(8);
      const after = new Float32Array(V).fill(1);
      proc.apply(after);
      expect(after.every((v) => v === 1)).toBe(true);
    }
  });

  it('has no processor when every setting is neutral', () => {
    const neutral: SamplingParams = {
      temperature: 1,
      presencePenalty: 0,
      frequencyPenalty: 0,
      repetitionPenalty: 1,
      minTokens: 0,
      logitBias: new Map(),
    };
    expect(hasLogitsProcessing(neutral)).toBe(false);
    expect(LogitsProcessor.of(request(neutral, [1]))).toBeUndefined();
    expect(LogitsProcessor.of(request({ temperature: 0 }, [1]))).toBeUndefined();
    for (const [, s] of SETTINGS) expect(hasLogitsProcessing(s)).toBe(true);
  });

  it('refuses settings outside their ranges, naming the field', () => {
    const bad: readonly [SamplingParams, string, string][] = [
      [{ temperature: 0, presencePenalty: 2.5 }, 'presencePenalty', 'got 2.5'],
      [{ temperature: 0, frequencyPenalty: Number.NaN }, 'frequencyPenalty', 'got NaN'],
      [{ temperature: 0, repetitionPenalty: 0 }, 'repetitionPenalty', 'got 0'],
      [{ temperature: 0, repetitionPenalty: Number.POSITIVE_INFINITY }, 'repetitionPenalty', 'got Infinity'],
      [{ temperature: 0, minTokens: 1.5 }, 'minTokens', 'got 1.5'],
      [{ temperature: 0, logitBias: new Map([[V, 1]]) }, 'logitBias', `token id ${V} is outside the vocabulary`],
      [{ temperature: 0, logitBias: new Map([[-1, 1]]) }, 'logitBias', 'token id -1 is outside'],
      [{ temperature: 0, logitBias: new Map([[3, 101]]) }, 'logitBias', 'got 101'],
    ];
    for (const [s, field, message] of bad) {
      const problem = logitsProcessingProblem(s, V);
      expect(problem?.field).toBe(field);
      expect(problem?.message).toContain(message);
    }
    for (const [, s] of SETTINGS) expect(logitsProcessingProblem(s, V)).toBeUndefined();
  });
});
