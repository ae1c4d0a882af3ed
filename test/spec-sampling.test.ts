// The end-to-end χ² test at temperature 1, per shipped drafter, with the shipped target:
// speculative sampling must leave the target's distribution unchanged. For one prompt, the exact
// joint distribution of the first two generated tokens (t1 from the prefill logits, t2 from a
// verify step that judged a full block of sampled drafts) is computed with plain target forwards;
// N seeded requests through SpecEngine (draftPolicy 'max', so every request verifies the drafter's
// whole block at its first step) are binned into the same cells and compared by Pearson's χ².
// Each drafter is loaded through its checkpoint's config.json (the registry picks the plugin).
// Also with the request's logits processors on (repetition / frequency / presence penalties, logit_bias): the
// expected cells then come from the processed rows (t1's row after the prompt, t2's after the prompt and t1, t1
// counted as generated), as plain decoding would sample them.
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  BUILTIN_PLUGIN_PACKAGES,
  LogitsProcessor,
  SequenceCache,
  SpecEngine,
  loadDrafter,
  loadTarget,
  samplingProbs,
  type LoadedTarget,
  type SamplingParams,
  type SpecResult,
} from '@specd/core';
import { skipWithoutFiles } from './require-files.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const TARGET = path.join(ROOT, 'models/kimi-k3-tiny');
const DRAFTERS = ['dflash', 'dspark', 'eagle3'].filter(
  (m) =>
    !skipWithoutFiles(
      `speculative sampling at T = 1 with ${m}`,
      [path.join(ROOT, 'models', `kimi-k3-tiny-${m}`, 'config.json')],
      'git checkout -- models/',
    ),
);
const PROMPT = 'The United States of'; // peaked enough at T = 1 for ~10 cells of ≥ 5 expected counts
const REQUESTS = 800;
/**
 * The settings each drafter is tested with, by name: plain T = 1, and T = 1 with every logits processor on — the
 * bias makes the 5th most likely successor (`top[1]`) of plain T = 1's most likely first token (`top[0]`) likely, so
 * t2's distribution (judged by the verifier) moves far enough for the χ² to see a verifier that ignores it.
 */
const SETTINGS: readonly [string, (top: readonly number[]) => SamplingParams][] = [
  ['', () => ({ temperature: 1 })],
  [
    ' with penalties and logit_bias',
    (top) => ({
      temperature: 1,
      repetitionPenalty: 1.3,
      frequencyPenalty: 0.5,
      presencePenalty: 0.8,
      logitBias: new Map([[top[1]!, 4]]),
    }),
  ],
];
const TOP = 4; // t1 cells: the TOP most likely + "other"; per t1 cell, t2: the TOP most likely + "other"
/** Cells expecting fewer counts than this are folded into the "other t1" cell (χ² needs ~5 per cell). */
const MIN_EXPECTED = 5;

/** χ² quantile at p = 0.001 (Wilson–Hilferty; within ~1% of the exact value for df ≥ 3). */
function chi2Critical(df: number): number {
  const z = 3.0902; // standard normal quantile at 0.999
  const a = 2 / (9 * df);
  return df * (1 - a + z * Math.sqrt(a)) ** 3;
}

let target: LoadedTarget;
let promptIds: Int32Array;

/**
 * Exact probabilities of the target after `ids` (the prompt, then generated tokens) with `sampling` (T = 1, no
 * top-k/top-p; its logits processors, if any, applied as plain decoding would), `[V]`.
 */
function nextDistribution(ids: Int32Array, sampling: SamplingParams): Float32Array {
  const m = target.model;
  const cache = new SequenceCache(m.cacheGeometry, {
    pageSize: 16,
    numPages: Math.ceil(ids.length / 16) + 1,
    numSlots: 1,
  });
  cache.add('ref');
  try {
    const r = m.forward(
      { sequences: [{ id: 'ref', position: 0, tokens: ids, logits: 'last', phase: 'prefill' }] },
      cache,
    );
    const processor = LogitsProcessor.of({ id: 'ref', promptIds, maxTokens: 2, sampling, seed: 0, ignoreEos: true });
    for (const t of ids.subarray(promptIds.length)) processor?.push(t);
    const row = r.logits!;
    processor?.apply(row);
    return samplingProbs(row, m.info.vocabSize, sampling);
  } finally {
    cache.finish('ref');
  }
}

const topIds = (p: Float32Array, n: number): number[] => [...p.keys()].sort((a, b) => p[b]! - p[a]!).slice(0, n);

interface Cells {
  readonly t1: number[];
  /** Per t1 cell (index into t1), its top t2 ids. */
  readonly t2: number[][];
  /**
   * Raw cell i * (TOP + 1) + j (t1 cell i, t2 cell j, j = TOP: other; last raw cell: "t1 other") → the bin it is
   * counted in.
   */
  readonly bin: Int32Array;
  /** Expected probability per bin. */
  readonly expected: Float64Array;
}

/** The cells and the sampling of each setting (by its name). */
const cellsOf = new Map<string, Cells>();
const samplingOf = new Map<string, SamplingParams>();
/** Plain T = 1's most likely first token and its 5th most likely successor. */
let top: readonly number[] = [];

function cellOf(cells: Cells, t1: number, t2: number): number {
  const i = cells.t1.indexOf(t1);
  if (i < 0) return cells.bin[TOP * (TOP + 1)]!;
  const j = cells.t2[i]!.indexOf(t2);
  return cells.bin[i * (TOP + 1) + (j < 0 ? TOP : j)]!;
}

beforeAll(async () => {
  target = await loadTarget(TARGET, BUILTIN_PLUGIN_PACKAGES);
  promptIds = target.tokenizer.encode(PROMPT, { addSpecialTokens: false });
  const top1 = topIds(nextDistribution(promptIds, { temperature: 1 }), 1)[0]!;
  top = [top1, topIds(nextDistribution(Int32Array.from([...promptIds, top1]), { temperature: 1 }), 5)[4]!];
  for (const [name, sampling] of SETTINGS) {
    samplingOf.set(name, sampling(top));
    cellsOf.set(name, expectedCells(sampling(top)));
  }
});

/** The χ² cells of the first two tokens under `sampling`, from plain target forwards. */
function expectedCells(sampling: SamplingParams): Cells {
  const p1 = nextDistribution(promptIds, sampling);
  const t1 = topIds(p1, TOP);
  const expected = new Float64Array(TOP * (TOP + 1) + 1);
  const t2: number[][] = [];
  let rest = 1;
  t1.forEach((a, i) => {
    const ids = new Int32Array(promptIds.length + 1);
    ids.set(promptIds);
    ids[promptIds.length] = a;
    const p2 = nextDistribution(ids, sampling);
    const tops = topIds(p2, TOP);
    t2.push(tops);
    let inTop = 0;
    tops.forEach((b, j) => {
      expected[i * (TOP + 1) + j] = p1[a]! * p2[b]!;
      inTop += p2[b]!;
    });
    expected[i * (TOP + 1) + TOP] = p1[a]! * Math.max(0, 1 - inTop);
    rest -= p1[a]!;
  });
  expected[TOP * (TOP + 1)] = Math.max(0, rest);
  // Fold sparse cells into the last one ("t1 other"), then number the bins.
  const last = TOP * (TOP + 1);
  const bin = new Int32Array(expected.length);
  const binned: number[] = [];
  const kept = [...expected.keys()].filter((c) => c === last || expected[c]! * REQUESTS >= MIN_EXPECTED);
  for (const c of kept) {
    bin[c] = binned.length;
    binned.push(expected[c]!);
  }
  for (let c = 0; c < expected.length; c++) {
    if (!kept.includes(c)) {
      bin[c] = bin[last]!;
      binned[bin[last]!]! += expected[c]!;
    }
  }
  return { t1, t2, bin, expected: Float64Array.from(binned) };
}

afterAll(() => target?.model.dispose());

describe.each(DRAFTERS.flatMap((method) => SETTINGS.map(([name]) => [method, name] as const)))(
  'speculative sampling at T = 1 with %s%s',
  (method, name) => {
    it(`the first two tokens follow the target's joint distribution (χ², ${REQUESTS} requests)`, async () => {
      const cells = cellsOf.get(name)!;
      const sampling = samplingOf.get(name)!;
      if (name !== '') {
        // the processors move t2's distribution: an unlikely successor of a likely t1 becomes likely
        const [a, b] = top;
        const after = Int32Array.from([...promptIds, a!]);
        expect(nextDistribution(promptIds, { temperature: 1 })[a!]).toBeGreaterThan(0.3);
        expect(nextDistribution(after, { temperature: 1 })[b!]).toBeLessThan(0.1);
        expect(nextDistribution(after, sampling)[b!]).toBeGreaterThan(0.3);
      }
      const dir = path.join(ROOT, 'models', `kimi-k3-tiny-${method}`);
      const { drafter } = await loadDrafter(dir, BUILTIN_PLUGIN_PACKAGES, target, 256, 32);
      try {
        expect(drafter.method).toBe(method);
        const engine = new SpecEngine(target.model, drafter, {
          maxSequences: 32,
          maxTokensPerSequence: 256,
          draftPolicy: 'max',
        });
        const counts = new Float64Array(cells.expected.length);
        // Every request drafts the full block at its first step (maxTokens leaves room for it); once
        // it has two tokens it is aborted, which also exercises freeing pages mid-generation.
        const maxTokens = drafter.maxDraftTokens + 2;
        let drafted = 0;
        for (let start = 0; start < REQUESTS; start += 32) {
          const ids: number[] = [];
          for (let s = start; s < Math.min(REQUESTS, start + 32); s++) {
            engine.add({ id: s, promptIds, maxTokens, sampling, seed: 1000 + s, ignoreEos: true });
            ids.push(s);
          }
          const firstTwo = new Map<number, number[]>();
          const finished: SpecResult[] = [];
          // One step admits and prefills every request (t1) and runs one propose → verify (t2 ≥ 1 more).
          finished.push(...engine.step());
          for (const id of ids) {
            const r = finished.find((f) => f.id === id) ?? engine.abort(id)!;
            firstTwo.set(id, r.tokenIds.slice(0, 2));
            drafted += r.metrics.drafted;
          }
          for (const [, [a, b]] of firstTwo) counts[cellOf(cells, a!, b!)]! += 1;
        }
        expect(drafted).toBeGreaterThanOrEqual(REQUESTS * Math.min(drafter.maxDraftTokens, maxTokens - 1));
        expect(engine.cache.pagesInUse + engine.cache.slotsInUse + drafter.pagesInUse).toBe(0);
        let chi2 = 0;
        const total = counts.reduce((a, b) => a + b, 0);
        expect(total).toBe(REQUESTS);
        cells.expected.forEach((p, c) => {
          const e = p * total;
          if (e > 0) chi2 += (counts[c]! - e) ** 2 / e;
          else expect(counts[c], `cell ${c} has probability 0`).toBe(0);
        });
        const minExpected = Math.min(...[...cells.expected].map((p) => p * total));
        const critical = chi2Critical(cells.expected.length - 1);
        console.log(
          `${method}${name}: χ² ${chi2.toFixed(2)} over ${cells.expected.length} cells ` +
            `(critical ${critical.toFixed(2)} at p = 0.001), smallest expected count ` +
            `${minExpected.toFixed(1)}, τ per step ${engine.metrics.tauPerStep.toFixed(3)}`,
        );
        expect(cells.expected.length).toBeGreaterThanOrEqual(6);
        expect(chi2).toBeLessThan(critical);
      } finally {
        drafter.dispose();
      }
    });
  },
);
