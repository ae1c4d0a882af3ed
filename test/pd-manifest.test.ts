// The transfer manifest on real checkpoints: for every drafter checkpoint in models/ (a folder named after its
// target, `<target>-<drafter>`, so a new drafter is covered by adding its folder) and the prompt-lookup example,
// a prefill instance P writes a prompt's draft context from the target's taps; a decode instance D (the same
// drafter loaded separately, its pages and slots shifted by another sequence) reserves the context and receives
// P's bytes entry by entry into its own ranges. Then D drafts exactly as P (greedy drafts, and sampled drafts
// and q with equal seeds), and withholding any one entry changes D's q — a drafter that forgot part of its state
// fails here. The same for the target: a decode step after copying the target entries (KV pages, KDA recurrent
// and conv state) gives bitwise P's logits, and withholding the KDA 'linear-state' entries changes them (and is
// named by checkManifest).
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  BUILTIN_PLUGIN_PACKAGES,
  CacheError,
  checkManifest,
  checkPdDrafter,
  DrafterRegistry,
  drafterEntries,
  entryByteLength,
  entryId,
  HfConfig,
  hasDraftContextFeatures,
  loadDrafter,
  loadPluginPackages,
  loadTarget,
  manifestRows,
  regionLookup,
  SequenceCache,
  targetEntries,
  targetRegions,
  type DraftContextFeatures,
  type DraftContextTransfer,
  type Drafter,
  type DraftProposal,
  type LoadedTarget,
  type LocalEntry,
  type RegionRange,
} from '@specd/core';
import { argmax } from '@specd/native';
import { container as rootContainer } from 'tsyringe';

import { PromptLookupDrafter } from '../examples/drafter-prompt-lookup/src/drafter.js';
import { skipWithoutFiles } from './require-files.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const MODELS = path.join(ROOT, 'models');
const KIMI = path.join(MODELS, 'kimi-k3-tiny');
const SMOLLM2 = path.join(MODELS, 'smollm2-135m-instruct');
const HAVE = !skipWithoutFiles('the PD transfer manifest on real checkpoints', [
  path.join(KIMI, 'config.json'),
  path.join(SMOLLM2, 'SmolLM2-135M-Instruct.Q4_1.gguf'),
]);
const PROMPT = 'The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the';
const SEQ = 'request-1';

/** Every `<target>-<suffix>` folder of models/ whose config.json names an architecture a drafter plugin claims. */
async function drafterCheckpoints(): Promise<{ target: string; dir: string }[]> {
  const container = rootContainer.createChildContainer();
  await loadPluginPackages(BUILTIN_PLUGIN_PACKAGES, container);
  const registry = DrafterRegistry.fromContainer(container);
  const names = fs.readdirSync(MODELS).sort();
  const out: { target: string; dir: string }[] = [];
  for (const name of names) {
    const config = path.join(MODELS, name, 'config.json');
    const target = names.find((t) => name.startsWith(`${t}-`));
    if (target === undefined || !fs.existsSync(config)) continue;
    try {
      registry.resolve(HfConfig.read(path.join(MODELS, name)));
    } catch {
      continue; // not a drafter checkpoint
    }
    out.push({ target: path.join(MODELS, target), dir: path.join(MODELS, name) });
  }
  return out;
}

/** mulberry32: a seeded uniform source in [0, 1). */
function rng(seed: number): { next(): number } {
  let a = seed >>> 0;
  return {
    next() {
      a = (a + 0x6d2b79f5) >>> 0;
      let t = a;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    },
  };
}

/** An entry's bytes, its ranges concatenated in order. */
function gather(bytes: (id: string) => Uint8Array, e: LocalEntry): Uint8Array {
  const out = new Uint8Array(entryByteLength(e));
  let at = 0;
  for (const r of e.ranges) {
    out.set(bytes(r.region).subarray(r.offset, r.offset + r.length), at);
    at += r.length;
  }
  return out;
}

/** Writes `data` into an entry's ranges in order. */
function scatter(bytes: (id: string) => Uint8Array, ranges: readonly RegionRange[], data: Uint8Array): void {
  let at = 0;
  for (const r of ranges) {
    bytes(r.region).set(data.subarray(at, at + r.length), r.offset);
    at += r.length;
  }
  expect(at).toBe(data.length);
}

/**
 * Copies P's entries into D's by key, as a transfer would (every entry of D's expected list must be sent with
 * its length); `withhold` entries are not sent — D's ranges of them are zeroed, as never-written memory.
 */
function transfer(
  from: { entries: readonly LocalEntry[]; bytes: (id: string) => Uint8Array },
  to: { entries: readonly LocalEntry[]; bytes: (id: string) => Uint8Array },
  withhold: (e: LocalEntry) => boolean = () => false,
): void {
  const sent = new Map(from.entries.map((e) => [entryId(e.key), e]));
  expect(to.entries.map((e) => entryId(e.key))).toEqual([...sent.keys()]);
  for (const e of to.entries) {
    const src = sent.get(entryId(e.key))!;
    expect(entryByteLength(e)).toBe(entryByteLength(src));
    if (withhold(e)) scatter(to.bytes, e.ranges, new Uint8Array(entryByteLength(e)));
    else scatter(to.bytes, e.ranges, gather(from.bytes, src));
  }
}

/** Bitwise equality of two f32 arrays (NaN payloads and signed zeros included). */
function sameBits(a: Float32Array | undefined, b: Float32Array | undefined): boolean {
  if (a === undefined || b === undefined) return a === b;
  return (
    Buffer.compare(
      Buffer.from(a.buffer, a.byteOffset, a.byteLength),
      Buffer.from(b.buffer, b.byteOffset, b.byteLength),
    ) === 0
  );
}

describe.skipIf(!HAVE)('the PD transfer manifest on real checkpoints', () => {
  const targets = new Map<string, LoadedTarget>();
  let checkpoints: { target: string; dir: string }[] = [];

  beforeAll(async () => {
    checkpoints = await drafterCheckpoints();
    for (const { target } of [...checkpoints, { target: KIMI }])
      if (!targets.has(target)) targets.set(target, await loadTarget(target, BUILTIN_PLUGIN_PACKAGES));
  });
  afterAll(() => {
    for (const t of targets.values()) t.model.dispose();
  });

  it('finds the shipped drafter checkpoints in models/', () => {
    const names = checkpoints.map((c) => path.basename(c.dir));
    for (const shipped of [
      'kimi-k3-tiny-dflash',
      'kimi-k3-tiny-dspark',
      'kimi-k3-tiny-eagle3',
      'smollm2-135m-instruct-dflash',
      'smollm2-135m-instruct-eagle3',
    ])
      expect(names).toContain(shipped);
  });

  /**
   * P: a prefill of the prompt with the drafter's taps, the draft context written as the engine writes it
   * (`nextTokens` = the prompt shifted by one, then the first generated token: the target's argmax, or
   * `pickFirst`'s choice). Returns the prompt and that token.
   */
  function prefillP(
    t: LoadedTarget,
    p: Drafter,
    pickFirst?: (prompt: Int32Array) => number,
    text = PROMPT,
  ): { prompt: Int32Array; first: number } {
    const prompt = t.tokenizer.encode(text, { addSpecialTokens: false });
    const n = prompt.length;
    const cache = new SequenceCache(t.model.cacheGeometry, { pageSize: 16, numPages: 16, numSlots: 1 });
    cache.add(SEQ);
    const taps = p.captureSetter(t.model.info);
    const res = t.model.forward(
      { sequences: [{ id: SEQ, position: 0, tokens: prompt, logits: 'last', phase: 'prefill' }] },
      cache,
      { taps },
    );
    const first = pickFirst?.(prompt) ?? argmax(res.logits!, t.model.info.vocabSize)[0]!;
    const nextTokens = new Int32Array(n);
    nextTokens.set(prompt.subarray(1));
    nextTokens[n - 1] = first;
    p.addSequence(SEQ);
    const sum = p.projectTargetHiddenPartial(res.taps, n);
    p.writeProjectedContextKV(sum, [{ id: SEQ, position: 0, numTokens: n, nextTokens }]);
    expect(p.contextLength(SEQ)).toBe(n);
    return { prompt, first };
  }

  /** One propose of `SEQ` at the end of the prompt: greedy (temperature 0) or sampled (seed 7). */
  function propose(d: Drafter, prompt: Int32Array, first: number, temperature: number): DraftProposal {
    const history = new Int32Array(prompt.length + 1);
    history.set(prompt);
    history[prompt.length] = first;
    const [out] = d.propose({
      sequences: [
        {
          id: SEQ,
          position: prompt.length,
          lastToken: first,
          maxDrafts: d.maxDraftTokens,
          history,
          sampling: { temperature },
          rng: rng(7),
        },
      ],
    });
    return out!;
  }

  /**
   * D drafts exactly as P at the end of the prompt: the same greedy drafts, and the same sampled drafts and q bit for
   * bit (seed 7). Returns P's sampled proposal.
   */
  function expectSameDrafts(p: Drafter, d: Drafter, prompt: Int32Array, first: number, name: string): DraftProposal {
    const greedyP = propose(p, prompt, first, 0);
    expect(propose(d, prompt, first, 0).tokens, name).toEqual(greedyP.tokens);
    const sampledP = propose(p, prompt, first, 0.8);
    const sampledD = propose(d, prompt, first, 0.8);
    expect(sampledD.tokens, name).toEqual(sampledP.tokens);
    expect(sameBits(sampledD.probs, sampledP.probs), name).toBe(true);
    return sampledP;
  }

  /** D: a sequence holding other pages and slots first, then `SEQ` reserved for `length` rows. */
  function reserveD(d: Drafter & DraftContextTransfer, length: number): void {
    d.addSequence('other');
    d.pdReserveContext('other', 21);
    d.addSequence(SEQ);
    d.pdReserveContext(SEQ, length);
  }

  /** Runs the P → D transfer of one drafter and checks drafts, q and every withheld entry. */
  async function checkDrafter(
    t: LoadedTarget,
    load: () => Promise<Drafter>,
    pickFirst?: (prompt: Int32Array) => number,
  ): Promise<{ method: string; entries: readonly LocalEntry[]; drafts: Int32Array }> {
    const p = await load();
    const d = await load();
    try {
      checkPdDrafter(p);
      checkPdDrafter(d);
      const { prompt, first } = prefillP(t, p, pickFirst);
      reserveD(d, prompt.length);
      const P = { entries: p.pdContextEntries(SEQ), bytes: regionLookup(p.pdRegions()) };
      const D = { entries: d.pdContextEntries(SEQ), bytes: regionLookup(d.pdRegions()) };
      transfer(P, D);
      // (a) the sequence's bytes are equal, entry by entry, though D holds them at other offsets
      for (const [i, e] of D.entries.entries()) expect(gather(D.bytes, e)).toEqual(gather(P.bytes, P.entries[i]!));
      if (P.entries.length > 0) expect(D.entries.map((e) => e.ranges)).not.toEqual(P.entries.map((e) => e.ranges));
      // (b) D drafts exactly as P: greedy drafts, sampled drafts and q (and any confidence), bit for bit
      const greedyP = propose(p, prompt, first, 0);
      const greedyD = propose(d, prompt, first, 0);
      expect(greedyD.tokens).toEqual(greedyP.tokens);
      expect(greedyP.tokens.length).toBeGreaterThan(0);
      const sampledP = propose(p, prompt, first, 0.8);
      const sampledD = propose(d, prompt, first, 0.8);
      expect(sampledD.tokens).toEqual(sampledP.tokens);
      expect(sameBits(sampledD.probs, sampledP.probs)).toBe(true);
      expect(sameBits(sampledD.confidence, sampledP.confidence)).toBe(true);
      // (c) every entry matters: without it (D's ranges never written) D's q is another
      for (const withheld of D.entries) {
        transfer(P, D, (e) => entryId(e.key) === entryId(withheld.key));
        const q = propose(d, prompt, first, 0.8);
        expect(sameBits(q.probs, sampledP.probs), `q without ${entryId(withheld.key)}`).toBe(false);
      }
      transfer(P, D);
      expect(sameBits(propose(d, prompt, first, 0.8).probs, sampledP.probs)).toBe(true);
      // both sides free everything
      for (const x of [p, d]) {
        x.freeSequence(SEQ);
        x.freeSequence('other');
        expect(x.pagesInUse).toBe(0);
      }
      return { method: p.method, entries: P.entries, drafts: greedyP.tokens };
    } finally {
      p.dispose();
      d.dispose();
    }
  }

  it('every drafter checkpoint: D drafts as P after the transfer, and every entry is needed', async () => {
    expect(checkpoints.length).toBeGreaterThanOrEqual(5);
    for (const { target, dir } of checkpoints) {
      const t = targets.get(target)!;
      const { method, entries } = await checkDrafter(t, async () => {
        const { drafter } = await loadDrafter(dir, BUILTIN_PLUGIN_PACKAGES, t, 256, 2);
        return drafter;
      });
      const kinds = new Set(entries.map((e) => e.key.kind));
      expect(kinds.has('draft-kv'), path.basename(dir)).toBe(true);
      // a drafter that continues from a per-sequence feature declares it (EAGLE-3's g)
      if (method === 'eagle3') expect(kinds.has('draft-state')).toBe(true);
    }
  });

  it('a sliding draft layer sends only its window; D drafts as P with the pages before it poisoned', async () => {
    const t = targets.get(KIMI)!;
    // a prompt longer than both windows plus a page: ~200 tokens
    const text = Array.from({ length: 12 }, (_, i) => `Line ${i}: the quick brown fox jumps over the lazy dog.`).join(
      ' ',
    );
    const PAGE = 16; // the draft KV's page size (DRAFT_PAGE_SIZE)
    // the shipped DFlash slides its last layer over 128 positions; its -swa variant all three over 64
    for (const [name, windows] of [
      ['kimi-k3-tiny-dflash', [0, 0, 128]],
      ['kimi-k3-tiny-dflash-swa', [64, 64, 64]],
    ] as const) {
      const load = async () => (await loadDrafter(path.join(MODELS, name), BUILTIN_PLUGIN_PACKAGES, t, 256, 2)).drafter;
      const p = (await load()) as Drafter & DraftContextTransfer;
      const d = (await load()) as Drafter & DraftContextTransfer;
      try {
        const { prompt, first } = prefillP(t, p, undefined, text);
        const L = prompt.length;
        expect(L).toBeGreaterThan(128 + PAGE);
        reserveD(d, L);
        const P = { entries: p.pdContextEntries(SEQ), bytes: regionLookup(p.pdRegions()) };
        const D = { entries: d.pdContextEntries(SEQ), bytes: regionLookup(d.pdRegions()) };
        // (a) per layer: every page for a full layer, the pages of rows [L − W, L) for a sliding one
        const pool = (
          d as unknown as { pool: { pageSize: number; pageBytes: number; blockTable(id: string): Int32Array } }
        ).pool;
        expect(pool.pageSize).toBe(PAGE);
        const pagesSent = (layer: number): number => {
          const w = windows[layer]!;
          return Math.ceil(L / PAGE) - (w > 0 ? Math.floor(Math.max(0, L - w) / PAGE) : 0);
        };
        for (const e of P.entries)
          expect(entryByteLength(e) / pool.pageBytes, `${name} ${entryId(e.key)}`).toBe(pagesSent(e.key.layer));
        transfer(P, D);
        // (b) D's pages before each window are never written: fill them with NaN, and D still drafts as P
        const table = pool.blockTable(SEQ);
        const rowFloats = pool.pageBytes / 4 / PAGE;
        const poison = (layer: number, rows: [number, number], value = Number.NaN) => {
          for (const part of ['k', 'v'] as const) {
            const bytes = D.bytes(`draft-kv/${layer}/${part}`);
            const store = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
            for (let row = rows[0]; row < rows[1]; row++) {
              const at = (table[Math.floor(row / PAGE)]! * PAGE + (row % PAGE)) * rowFloats;
              store.fill(value, at, at + rowFloats);
            }
          }
        };
        windows.forEach((w, j) => {
          if (w > 0) poison(j, [0, Math.floor((L - w) / PAGE) * PAGE]);
        });
        const sampledP = expectSameDrafts(p, d, prompt, first, name);
        // (c) the poison would show: zeros in a row of the window (its middle one) change D's q (a NaN there would
        // make the logits NaN)
        const j = windows.findIndex((w) => w > 0);
        const inside = L - windows[j]! / 2;
        poison(j, [inside, inside + 1], 0);
        const q = propose(d, prompt, first, 0.8).probs;
        expect(sameBits(q, sampledP.probs), `${name}: row ${inside} of layer ${j} poisoned`).toBe(false);
      } finally {
        p.dispose();
        d.dispose();
      }
    }
  });

  it("features instead of draft KV: D rebuilds P's K/V rows from P's features bit for bit, drafts as P", async () => {
    const text = Array.from({ length: 12 }, (_, i) => `Line ${i}: the quick brown fox jumps over the lazy dog.`).join(
      ' ',
    );
    const cases = checkpoints.filter(({ dir }) => /-(dflash|dflash-swa|dspark)$/.test(dir));
    expect(cases.length).toBeGreaterThanOrEqual(5); // kimi-k3-tiny: dflash, dflash-swa, dspark; SmolLM2: dflash, dspark
    for (const { target, dir } of cases) {
      const name = path.basename(dir);
      const t = targets.get(target)!;
      const load = async () =>
        (await loadDrafter(dir, BUILTIN_PLUGIN_PACKAGES, t, 256, 2, { pdFeatures: true })).drafter as Drafter &
          DraftContextTransfer;
      const p = await load();
      const d = await load();
      try {
        expect(hasDraftContextFeatures(p), name).toBe(true);
        const { prompt, first } = prefillP(t, p, undefined, text);
        const L = prompt.length;
        reserveD(d, L);
        const P = { entries: drafterEntries(p, SEQ, 0, 'both'), bytes: regionLookup(p.pdRegions()) };
        const D = { entries: drafterEntries(d, SEQ, 0, 'features'), bytes: regionLookup(d.pdRegions()) };
        // D asks for the features (no draft KV); P offers both forms
        expect(D.entries.map((e) => e.key.kind)).toEqual(['draft-features']);
        const kvBytes = P.entries.filter((e) => e.key.kind === 'draft-kv').reduce((a, e) => a + entryByteLength(e), 0);
        const featureBytes = entryByteLength(D.entries[0]!);
        expect(featureBytes, name).toBeLessThan(kvBytes);
        const wanted = new Set(D.entries.map((e) => entryId(e.key)));
        transfer({ ...P, entries: P.entries.filter((e) => wanted.has(entryId(e.key))) }, D);
        const rows = (d as unknown as DraftContextFeatures).pdRebuildFromFeatures(SEQ);
        expect(rows * t.model.info.hiddenSize * 4, name).toBeLessThanOrEqual(featureBytes);
        // the rebuilt K/V rows are P's bit for bit: rows [L − rows, L) of every layer (from the first row its entry
        // holds: a sliding layer's starts at its window's first page)
        const pageBytes = (d as unknown as { pool: { pageBytes: number } }).pool.pageBytes;
        const kvP = P.entries.filter((e) => e.key.kind === 'draft-kv');
        const kvD = drafterEntries(d, SEQ, 0, 'kv');
        expect(kvD.map((e) => entryId(e.key))).toEqual(kvP.map((e) => entryId(e.key)));
        for (const [i, e] of kvD.entries()) {
          const a = gather(D.bytes, e);
          const b = gather(P.bytes, kvP[i]!);
          const firstRow = (Math.ceil(L / 16) - a.length / pageBytes) * 16;
          const from = (Math.max(L - rows, firstRow) - firstRow) * (pageBytes / 16);
          const to = (L - firstRow) * (pageBytes / 16);
          expect(to - from, `${name} ${entryId(e.key)}`).toBeGreaterThan(0);
          expect(Buffer.compare(a.subarray(from, to), b.subarray(from, to)), `${name} ${entryId(e.key)}`).toBe(0);
        }
        expectSameDrafts(p, d, prompt, first, name);
      } finally {
        p.dispose();
        d.dispose();
      }
    }
  });

  it("EAGLE-3's g pool: a slot per added sequence (maxSequences of them), returned on free", async () => {
    const t = targets.get(KIMI)!;
    const { drafter } = await loadDrafter(path.join(MODELS, 'kimi-k3-tiny-eagle3'), BUILTIN_PLUGIN_PACKAGES, t, 64, 2);
    try {
      checkPdDrafter(drafter);
      const [pool] = drafter.pdRegions().filter((r) => r.id === 'draft-state/last-feature');
      const slotBytes = t.model.info.hiddenSize * 4;
      expect(pool!.bytes.byteLength).toBe(2 * slotBytes);
      drafter.addSequence('a');
      drafter.addSequence('b');
      expect(() => drafter.addSequence('c')).toThrow(/eagle3: addSequence: no free g slot \(2 sequences in use\)/);
      expect(drafter.contextLength('a')).toBe(0);
      expect(() => drafter.contextLength('c')).toThrow(CacheError);
      const slotOf = (id: string) => drafter.pdContextEntries(id).find((e) => e.key.kind === 'draft-state')!.ranges;
      const [b] = slotOf('b');
      expect(b).toEqual({ region: 'draft-state/last-feature', offset: b!.offset, length: slotBytes });
      expect(slotOf('a')[0]!.offset).not.toBe(b!.offset);
      drafter.freeSequence('a');
      drafter.addSequence('c');
      expect(slotOf('c')[0]!.offset).not.toBe(b!.offset);
    } finally {
      drafter.dispose();
    }
  });

  it('the prompt-lookup example: an empty context, D drafts from the token ids alone', async () => {
    const t = targets.get(KIMI)!;
    const settings = { numDraftTokens: 4, minNgram: 1, maxNgram: 4 };
    // the first generated token continues the repeat ("… over the" → "lazy"), so the lookup finds what followed it
    const continued = (prompt: Int32Array): number => {
      const last = prompt[prompt.length - 1]!;
      return prompt[prompt.subarray(0, prompt.length - 1).lastIndexOf(last) + 1]!;
    };
    const { entries, drafts } = await checkDrafter(
      t,
      () => Promise.resolve(new PromptLookupDrafter(settings)),
      continued,
    );
    expect(entries).toEqual([]);
    expect(drafts.length).toBe(4);
  });

  it("the target: a decode step after the transfer gives P's logits bit for bit; not without the KDA state", () => {
    for (const [dir, t] of targets) {
      const model = t.model;
      const prompt = t.tokenizer.encode(PROMPT, { addSpecialTokens: false });
      const n = prompt.length;
      const options = { pageSize: 16, numPages: 16, numSlots: 3 };
      const cacheP = new SequenceCache(model.cacheGeometry, options);
      cacheP.add(SEQ);
      const res = model.forward(
        { sequences: [{ id: SEQ, position: 0, tokens: prompt, logits: 'last', phase: 'prefill' }] },
        cacheP,
      );
      const first = argmax(res.logits!, model.info.vocabSize).subarray(0, 1);
      const P = { entries: targetEntries(cacheP, SEQ), bytes: regionLookup(targetRegions(cacheP)) };
      const decode = (cache: SequenceCache) =>
        model.forward({ sequences: [{ id: SEQ, position: n, tokens: first, logits: 'last' }] }, cache).logits!;
      const receive = (withhold: (e: LocalEntry) => boolean): Float32Array => {
        const cacheD = new SequenceCache(model.cacheGeometry, options);
        cacheD.add('other');
        cacheD.extend('other', 37);
        cacheD.add(SEQ);
        cacheD.extend(SEQ, n);
        const D = { entries: targetEntries(cacheD, SEQ), bytes: regionLookup(targetRegions(cacheD)) };
        transfer(P, D, withhold);
        return decode(cacheD);
      };
      const received = receive(() => false);
      const expected = decode(cacheP);
      expect(sameBits(received, expected), path.basename(dir)).toBe(true);
      const kinds = new Set(P.entries.map((e) => e.key.kind));
      // one target-kv layer withheld
      const kv = P.entries.find((e) => e.key.kind === 'target-kv')!;
      expect(
        sameBits(
          receive((e) => entryId(e.key) === entryId(kv.key)),
          expected,
        ),
      ).toBe(false);
      if (!kinds.has('linear-state')) continue;
      expect(kinds.has('conv-state')).toBe(true);
      // the KDA recurrent state withheld (D decodes from zeroed state): other logits, and D's check names it
      expect(
        sameBits(
          receive((e) => e.key.kind === 'linear-state'),
          expected,
        ),
      ).toBe(false);
      const checksum = () => '0';
      const rows = manifestRows(P.entries, P.bytes, checksum).filter((r) => r.key.kind !== 'linear-state');
      const layer = P.entries.find((e) => e.key.kind === 'linear-state')!.key.layer;
      expect(() => checkManifest(P.entries, rows)).toThrow(
        new RegExp(`linear-state layer ${layer} rank 0 \\(\\d+ bytes\\) is missing`),
      );
    }
  });
});
