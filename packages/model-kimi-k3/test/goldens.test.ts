// The shipped target (models/kimi-k3-tiny, bf16) against the PyTorch goldens (test/goldens,
// tools/reference/goldens.py): per-layer residual stream (taps), KDA recurrent + conv state, MLA
// latent cache, logits, router choices, and the 64-token greedy continuation, token for token.
// Prefill is split in chunks of 64 tokens (the reference runs it in one call, KDA chunk 32).
import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { SafetensorsFile, type SequenceCache } from '@specd/core';

import type { KimiStageModel, RouterChoice } from '../src/index.js';
import { argmaxRows, cacheFor, GOLDENS_DIR, loadStage, relError, TINY_DIR } from './helpers.js';

const TOL = 1e-2;
const PREFILL_CHUNK = 64;

interface GoldenEntry {
  file: string;
  T: number;
  first_token: number;
  greedy_continuation: number[];
}
const index = JSON.parse(fs.readFileSync(path.join(GOLDENS_DIR, 'index.json'), 'utf8')) as {
  layer_kinds: string[];
  goldens: Record<string, GoldenEntry>;
};

const models = new Map<string, KimiStageModel>();
afterAll(() =>
  models.forEach((m) => {
    m.dispose();
  }),
);

/** Kernel set × KDA prefill form: TS reference, native recurrent, native chunked prefill (WY, as the reference). */
const VARIANTS = [
  { kernels: 'ts', prefill: 'recurrent' },
  { kernels: 'native', prefill: 'recurrent' },
  { kernels: 'native', prefill: 'chunked' },
] as const;
const CASES = VARIANTS.flatMap((v) =>
  Object.keys(index.goldens).map((name) => [`${v.kernels}/${v.prefill}`, name, v] as const),
);

function concat(parts: Float32Array[]): Float32Array {
  const out = new Float32Array(parts.reduce((a, b) => a + b.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

describe.each(CASES)('%s golden %s', (variant, name, v) => {
  let model: KimiStageModel;
  const entry = index.goldens[name]!;
  const g = SafetensorsFile.open(path.join(GOLDENS_DIR, entry.file));
  afterAll(() => g.close());
  const f32 = (n: string) => g.read(n).data as Float32Array;
  const i32 = (n: string) => g.read(n).data as Int32Array;
  const ids = i32('input_ids');
  let cache: SequenceCache;
  const L = 8;
  const taps = Array.from({ length: L + 1 }, (_, i) => i);
  const hidden: Float32Array[][] = taps.map(() => []);
  const routes = new Map<number, RouterChoice[]>();
  const logitRows: Float32Array[] = [];

  beforeAll(() => {
    if (!models.has(v.kernels)) models.set(v.kernels, loadStage(TINY_DIR, v.kernels));
    model = models.get(v.kernels)!;
    model.kdaPrefill = v.prefill;
    expect(model.config.layerKinds).toEqual(index.layer_kinds);
    cache = cacheFor(model, 1, 512);
    cache.add(name);
    model.debug = { onRoute: (l, r) => routes.set(l, [...(routes.get(l) ?? []), r]) };
    try {
      for (let p = 0; p < ids.length; p += PREFILL_CHUNK) {
        const chunk = ids.subarray(p, Math.min(ids.length, p + PREFILL_CHUNK));
        const res = model.forward(
          { sequences: [{ id: name, position: p, tokens: chunk, logits: 'all', phase: 'prefill' }] },
          cache,
          { taps },
        );
        for (const t of taps) hidden[t]!.push(res.taps.get(t)!);
        logitRows.push(res.logits!);
      }
    } finally {
      model.debug = undefined;
    }
  });

  it('residual stream entering every layer (taps 0..L) within 1e-2', () => {
    for (const t of taps) {
      const err = relError(concat(hidden[t]!), f32(`hidden.${t}`));
      console.log(`[${variant} ${name}] hidden.${t} rel ${err.toExponential(2)}`);
      expect(err).toBeLessThan(TOL);
    }
  });

  it('logits of the last 8 prompt tokens within 1e-2, argmax of every position', () => {
    const V = model.info.vocabSize;
    const all = concat(logitRows);
    const want = f32('logits.last');
    const rows = want.length / V;
    const err = relError(all.subarray(all.length - rows * V), want);
    console.log(`[${variant} ${name}] logits.last rel ${err.toExponential(2)}`);
    expect(err).toBeLessThan(TOL);
    const am = argmaxRows(all, V);
    const ref = Array.from(i32('argmax'));
    const mismatches = am.flatMap((a, i) => (a === ref[i] ? [] : [i]));
    expect(mismatches.length).toBeLessThanOrEqual(Math.ceil(ids.length * 0.01));
  });

  it('KDA recurrent and conv state, MLA latent cache within 1e-2', () => {
    model.config.layerKinds.forEach((kind, l) => {
      if (kind === 'kda') {
        const err = relError(cache.state!.recurrent(name, l), f32(`kda.${l}.state`));
        const conv = cache.state!.conv(name, l);
        const n = conv.length / 3;
        const convErr = Math.max(
          ...['q', 'k', 'v'].map((s, i) => relError(conv.subarray(i * n, (i + 1) * n), f32(`kda.${l}.conv_${s}`))),
        );
        console.log(
          `[${variant} ${name}] kda.${l} state rel ${err.toExponential(2)} conv rel ${convErr.toExponential(2)}`,
        );
        expect(err).toBeLessThan(TOL);
        expect(convErr).toBeLessThan(TOL);
      } else {
        const kv = cache.kv!;
        const store = kv.layerStore(l);
        const r = model.config.kvLoraRank;
        const rope = model.config.qkRopeHeadDim;
        const lat = new Float32Array(ids.length * r);
        const kpe = new Float32Array(ids.length * rope);
        for (let p = 0; p < ids.length; p++) {
          const o = kv.tokenOffset(name, p);
          lat.set(store.subarray(o, o + r), p * r);
          kpe.set(store.subarray(o + r, o + r + rope), p * rope);
        }
        const e1 = relError(lat, f32(`mla.${l}.latent`));
        const e2 = relError(kpe, f32(`mla.${l}.k_pe`));
        console.log(`[${variant} ${name}] mla.${l} latent rel ${e1.toExponential(2)} k_pe rel ${e2.toExponential(2)}`);
        expect(e1).toBeLessThan(TOL);
        expect(e2).toBeLessThan(TOL);
      }
    });
  });

  it('router choices equal the reference (except near-ties) and weights within 1e-2', () => {
    const E = model.config.numExperts;
    const K = model.config.expertsPerToken;
    for (const [l, parts] of routes) {
      const wantIds = i32(`moe.${l}.ids`);
      const wantW = f32(`moe.${l}.weights`);
      const scores = f32(`moe.${l}.choice_scores`);
      const ids2 = new Int32Array(parts.reduce((a, p) => a + p.ids.length, 0));
      const w2 = new Float32Array(ids2.length);
      let o = 0;
      for (const p of parts) {
        ids2.set(p.ids, o);
        w2.set(p.weights, o);
        o += p.ids.length;
      }
      let nearTies = 0;
      for (let t = 0; t < ids.length; t++) {
        const mine = Array.from(ids2.subarray(t * K, (t + 1) * K)).sort((a, b) => a - b);
        const ref = Array.from(wantIds.subarray(t * K, (t + 1) * K)).sort((a, b) => a - b);
        if (mine.join() === ref.join()) {
          for (let j = 0; j < K; j++) {
            const e = ids2[t * K + j]!;
            const jr = Array.from(wantIds.subarray(t * K, (t + 1) * K)).indexOf(e);
            expect(Math.abs(w2[t * K + j]! - wantW[t * K + jr]!)).toBeLessThan(
              TOL * Math.abs(wantW[t * K + jr]!) + 1e-6,
            );
          }
          continue;
        }
        // a differing choice is allowed only at a near-tie of the k-th and (k+1)-th choice score
        const row = Array.from(scores.subarray(t * E, (t + 1) * E)).sort((a, b) => b - a);
        expect(row[K - 1]! - row[K]!).toBeLessThan(1e-4);
        nearTies++;
      }
      console.log(
        `[${variant} ${name}] moe.${l} router: ${ids.length - nearTies}/${ids.length} identical, ${nearTies} near-ties`,
      );
    }
  });

  it('greedy continuation (64 tokens, decode one by one) equals the reference token for token', () => {
    const V = model.info.vocabSize;
    const all = concat(logitRows);
    const out = [argmaxRows(all.subarray(all.length - V), V)[0]!];
    expect(out[0]).toBe(entry.first_token);
    while (out.length < entry.greedy_continuation.length) {
      const pos = cache.length(name);
      const res = model.forward(
        { sequences: [{ id: name, position: pos, tokens: Int32Array.of(out[out.length - 1]!), logits: 'last' }] },
        cache,
      );
      out.push(argmaxRows(res.logits!, V)[0]!);
    }
    expect(out).toEqual(entry.greedy_continuation);
    cache.finish(name);
    expect(cache.pagesInUse).toBe(0);
    expect(cache.slotsInUse).toBe(0);
  });
});
