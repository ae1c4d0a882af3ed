// Prefill/decode disaggregation at the engine level, over real sockets in one process: a prefill engine (its
// drafter loaded context-only) runs each prompt and hands off (SpecRequest.handoff); a decode engine reserves
// the sequence (SpecEngine.reserve, the drafter's pdReserveContext), the state moves over two ZeroMQ transfer
// engines (pd/zmq-transfer.ts) entry by entry with checksums, the decode side checks the manifest it derived
// from its own plugins and the checksums, and resumes (SpecEngine.resume). For every drafter in models/ of the
// shipped Kimi target and of SmolLM2 (data-driven, so a new drafter checkpoint is covered) and plain decoding,
// on every prompt of test/prompts/ and tools/reference/smollm2/prompts/: greedy output and τ per prompt equal
// the aggregated engine's (fixed draft length: the drafter's maximum), the decode engine runs no prompt token
// through its target, and the decode side's KDA state, target KV and draft KV after the transfer equal the
// aggregated run's after the same prefill, bit for bit. Withholding the KDA state (payload and manifest row)
// fails with an error naming the entry.
import * as fs from 'node:fs';
import * as path from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  allEntries,
  allRegions,
  BUILTIN_PLUGIN_PACKAGES,
  checkManifest,
  checksumRanges,
  createZmqTransferEngine,
  type Drafter,
  entryId,
  entryName,
  hasDraftContextTransfer,
  type LoadedTarget,
  loadDrafter,
  loadTarget,
  type LocalEntry,
  type ManifestRow,
  type PdEntryKey,
  planSend,
  type RegionRange,
  regionLookup,
  type SequenceId,
  SpecEngine,
  type SpecResult,
  type TransferEngine,
} from '@specd/core';

import { drafterDirs, MODELS, ROOT } from './pd-cluster.js';
import { skipWithoutFiles } from './require-files.js';

const PREFILL_CHUNK = 32;

interface Family {
  readonly target: string;
  /** New tokens per prompt (fewer on SmolLM2, the slower target on a CPU). */
  readonly newTokens: number;
  readonly files: readonly string[];
  readonly prompts: readonly string[];
}

const FAMILIES: readonly Family[] = [
  {
    target: 'kimi-k3-tiny',
    newTokens: 24,
    files: ['kimi-k3-tiny/config.json'],
    prompts: ['test/prompts/code.jsonl', 'test/prompts/prose.jsonl'],
  },
  {
    target: 'smollm2-135m-instruct',
    newTokens: 16,
    files: ['smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf'],
    prompts: ['tools/reference/smollm2/prompts/chat.jsonl', 'tools/reference/smollm2/prompts/plain.jsonl'],
  },
];

function promptsOf(family: Family): Int32Array[] {
  return family.prompts.flatMap((f) =>
    fs
      .readFileSync(path.join(ROOT, f), 'utf8')
      .trim()
      .split('\n')
      .map((l) => Int32Array.from((JSON.parse(l) as { prompt_token_ids: number[] }).prompt_token_ids)),
  );
}

const MAX_TOKENS = 1024;

/** An engine with a fixed draft length (the drafter's maximum): the aggregated baseline and the decode side. */
function engine(target: LoadedTarget, drafter: Drafter | undefined): SpecEngine {
  return new SpecEngine(target.model, drafter, {
    maxSequences: 8,
    maxTokensPerSequence: MAX_TOKENS,
    prefillChunk: PREFILL_CHUNK,
    draftPolicy: 'max',
  });
}

/** Bytes of `ranges` (a copy), from a lookup of region bytes. */
function bytesOf(lookup: (id: string) => Uint8Array, ranges: readonly RegionRange[]): Uint8Array {
  const out = new Uint8Array(ranges.reduce((a, r) => a + r.length, 0));
  let at = 0;
  for (const r of ranges) {
    out.set(lookup(r.region).subarray(r.offset, r.offset + r.length), at);
    at += r.length;
  }
  return out;
}

/** One side of the pair: an engine, its drafter, its transfer engine and its regions. */
interface Side {
  readonly engine: SpecEngine;
  readonly drafter: Drafter | undefined;
  readonly transfer: TransferEngine;
  readonly lookup: (id: string) => Uint8Array;
}

async function side(e: SpecEngine, drafter: Drafter | undefined): Promise<Side> {
  const transfer = await createZmqTransferEngine({ host: '127.0.0.1', port: 0 });
  const regions = allRegions(e.cache, drafter);
  transfer.registerRegions(regions);
  return { engine: e, drafter, transfer, lookup: regionLookup(regions) };
}

/**
 * Moves sequence `pid` of P to the reserved `did` of D over the transfer engines and checks it as the decode role
 * does (pd/decode-role.ts): the entries D derives from its own plugins, lengths, checksums.
 * @param withhold entries left out of both the payload and the manifest.
 */
async function transfer(
  P: Side,
  pid: SequenceId,
  D: Side,
  did: SequenceId,
  room: string,
  withhold: (k: PdEntryKey) => boolean = () => false,
): Promise<LocalEntry[]> {
  const expected = allEntries(D.engine.cache, D.drafter, did);
  const { local, remote, rows } = planSend(
    expected,
    allEntries(P.engine.cache, P.drafter, pid),
    P.lookup,
    'P',
    withhold,
  );
  const arrived = D.transfer.expect(
    room,
    expected.flatMap((e) => e.ranges),
    { timeoutMs: 20_000 },
  );
  await P.transfer.write(D.transfer.address, room, local, remote, { rows }, { timeoutMs: 20_000 });
  const note = (await arrived) as { rows: ManifestRow[] };
  checkManifest(expected, note.rows);
  const sums = new Map(note.rows.map((r) => [entryName(r.key), r.checksum]));
  for (const e of expected)
    expect(checksumRanges(D.lookup, e.ranges), entryName(e.key)).toBe(sums.get(entryName(e.key)));
  return expected;
}

let newTokens = 0;

function req(id: SequenceId, promptIds: Int32Array, extra: { handoff?: boolean; onToken?: (t: number) => void } = {}) {
  return {
    id,
    promptIds,
    maxTokens: newTokens,
    sampling: { temperature: 0 },
    seed: 7,
    ignoreEos: true,
    ...extra,
  };
}

/** The first P·rowBytes bytes of each entry (rows [0, P) of a paged entry; the whole of a state entry). */
function rowsOf(
  lookup: (id: string) => Uint8Array,
  entries: readonly LocalEntry[],
  rowBytes: Map<string, number>,
  P: number,
) {
  const out = new Map<string, Uint8Array>();
  for (const e of entries) {
    const all = bytesOf(lookup, e.ranges);
    const rb = rowBytes.get(entryId(e.key));
    out.set(entryName(e.key), rb === undefined ? all : all.subarray(0, P * rb));
  }
  return out;
}

for (const family of FAMILIES) {
  const HAVE = !skipWithoutFiles(
    `PD engine handoff (${family.target})`,
    family.files.map((f) => path.join(MODELS, f)),
  );
  describe.skipIf(!HAVE)(`PD at the engine level: ${family.target}`, () => {
    let target: LoadedTarget;
    let prompts: Int32Array[];
    const report: string[] = [];
    beforeAll(async () => {
      target = await loadTarget(path.join(MODELS, family.target), BUILTIN_PLUGIN_PACKAGES);
      newTokens = family.newTokens;
      prompts = promptsOf(family);
    }, 120_000);
    afterAll(() => {
      target?.model.dispose();
      if (report.length > 0)
        process.stdout.write(`pd-engine ${family.target}:${report.map((r) => `\n  ${r}`).join('')}\n`);
    });

    const cases = [undefined, ...(HAVE ? drafterDirs(family.target) : [])];
    it.each(cases.map((d) => [d === undefined ? 'plain decoding' : path.basename(d), d]))(
      '%s: greedy output and τ per prompt equal aggregated; D prefills nothing; state bit-identical',
      async (_name, dir) => {
        const load = async (contextOnly: boolean) =>
          dir === undefined
            ? undefined
            : (await loadDrafter(dir, BUILTIN_PLUGIN_PACKAGES, target, MAX_TOKENS, 8, { contextOnly })).drafter;
        const dDrafter = await load(false);
        const pDrafter = await load(true);
        if (dDrafter !== undefined) expect(hasDraftContextTransfer(dDrafter)).toBe(true);
        const A = engine(target, dDrafter);
        // aggregated, with the state of prompt 0 captured after its prefill (first token) and first step
        const captured: { target?: Map<string, Uint8Array>; draft?: Map<string, Uint8Array> } = {};
        const aggLookup = regionLookup(allRegions(A.cache, dDrafter));
        let seen = 0;
        const agg = A.run(
          prompts.map((ids, i) =>
            req(`a${i}`, ids, {
              onToken:
                i === 0
                  ? () => {
                      seen++;
                      if (seen === 1)
                        captured.target = rowsOf(aggLookup, allEntries(A.cache, undefined, 'a0'), new Map(), 0);
                      if (seen === 2 && dDrafter !== undefined)
                        captured.draft = new Map(
                          [...rowsOf(aggLookup, allEntries(A.cache, dDrafter, 'a0'), new Map(), 0)].filter(([k]) =>
                            k.startsWith('draft-kv'),
                          ),
                        );
                    }
                  : undefined,
            }),
          ),
        );
        const byId = new Map(agg.map((r) => [r.id, r]));
        // PD: P hands off, D reserves, the state moves, D resumes
        const Pe = new SpecEngine(target.model, pDrafter, {
          maxSequences: 8,
          maxTokensPerSequence: MAX_TOKENS,
          prefillChunk: PREFILL_CHUNK,
          draftLength: () => 0,
        });
        const P = await side(Pe, pDrafter);
        const D = await side(engine(target, dDrafter), dDrafter);
        try {
          const out = new Map<SequenceId, SpecResult>();
          for (let i = 0; i < prompts.length; i++) {
            const ids = prompts[i] as Int32Array;
            Pe.add(req(`p${i}`, ids, { handoff: true }));
            let h: SpecResult | undefined;
            while (h === undefined) h = Pe.step().find((r) => r.id === `p${i}`);
            expect(h.finishReason).toBe('handoff');
            // D decodes the requests it holds until a sequence is free (continuous batching with arriving transfers)
            while (!D.engine.reserve(req(`d${i}`, ids))) for (const r of D.engine.step()) out.set(r.id, r);
            if (dDrafter !== undefined && hasDraftContextTransfer(dDrafter))
              dDrafter.pdReserveContext(`d${i}`, ids.length);
            const entries = await transfer(P, `p${i}`, D, `d${i}`, `room-${i}`);
            if (i === 0) {
              // bit for bit: rows [0, P) of every paged entry, the whole of every state entry
              const rowBytes = new Map<string, number>();
              // tokens the entry's pages hold: the prompt rounded up to whole pages
              const pageTokens = (pageSize: number) => Math.ceil(ids.length / pageSize) * pageSize;
              for (const e of entries) {
                const bytes = e.ranges.reduce((a, r) => a + r.length, 0);
                if (e.key.kind === 'target-kv')
                  rowBytes.set(entryId(e.key), bytes / pageTokens(D.engine.cache.kv?.pageSize ?? 16));
                if (e.key.kind === 'draft-kv') rowBytes.set(entryId(e.key), bytes / pageTokens(16));
              }
              const got = rowsOf(D.lookup, entries, rowBytes, ids.length);
              // the aggregated state was captured (every target entry; every draft KV entry when the drafter has KV)
              expect(captured.target?.size).toBe(entries.filter((e) => !e.key.kind.startsWith('draft')).length);
              expect(captured.draft?.size ?? 0).toBe(entries.filter((e) => e.key.kind === 'draft-kv').length);
              for (const [name, want] of captured.target ?? new Map()) {
                const g = got.get(name);
                const w = want as Uint8Array;
                expect(g?.subarray(0, Math.min(w.length, g.length)), name).toEqual(
                  w.subarray(0, Math.min(w.length, g?.length ?? 0)),
                );
              }
              for (const [name, want] of captured.draft ?? new Map()) {
                const g = got.get(name) as Uint8Array;
                expect(g, name).toEqual((want as Uint8Array).subarray(0, g.length));
              }
            }
            expect(Pe.release(`p${i}`)).toBe(true);
            const early = D.engine.resume(`d${i}`, h.handoff as NonNullable<SpecResult['handoff']>);
            if (early !== undefined) out.set(early.id, early);
          }
          for (const r of D.engine.run()) out.set(r.id, r);
          let tauA = 0;
          let tauD = 0;
          for (let i = 0; i < prompts.length; i++) {
            const a = byId.get(`a${i}`) as SpecResult;
            const d = out.get(`d${i}`) as SpecResult;
            expect(d.tokenIds, `prompt ${i}`).toEqual(a.tokenIds);
            expect(d.metrics.tauPerStep, `τ of prompt ${i}`).toBe(a.metrics.tauPerStep);
            tauA += a.metrics.tauPerStep;
            tauD += d.metrics.tauPerStep;
          }
          expect(D.engine.metrics.prefillTokens).toBe(0);
          expect(Pe.metrics.prefillTokens).toBe(prompts.reduce((a, p) => a + p.length, 0));
          // prefill time: the prefill instance's only, the decode instance ran no prefill chunk
          expect(D.engine.metrics.prefillMs).toBe(0);
          expect(Pe.metrics.prefillMs).toBeGreaterThan(0);
          expect(Pe.cache.pagesInUse + Pe.cache.slotsInUse + (pDrafter?.pagesInUse ?? 0)).toBe(0);
          expect(D.engine.cache.pagesInUse + D.engine.cache.slotsInUse + (dDrafter?.pagesInUse ?? 0)).toBe(0);
          report.push(
            `${dir === undefined ? 'plain' : path.basename(dir)}: ${prompts.length} prompts, mean τ aggregated ` +
              `${(tauA / prompts.length).toFixed(3)}, PD ${(tauD / prompts.length).toFixed(3)}`,
          );
        } finally {
          await P.transfer.close();
          await D.transfer.close();
          dDrafter?.dispose();
          pDrafter?.dispose();
        }
      },
      600_000,
    );

    it('withholding the KDA state (payload and manifest row) fails naming the entry; everything is freed', async () => {
      const Pe = new SpecEngine(target.model, undefined, { maxSequences: 2, maxTokensPerSequence: MAX_TOKENS });
      const De = engine(target, undefined);
      const P = await side(Pe, undefined);
      const D = await side(De, undefined);
      try {
        const ids = prompts[0] as Int32Array;
        Pe.add(req('p', ids, { handoff: true }));
        while (Pe.step().length === 0);
        expect(De.reserve(req('d', ids))).toBe(true);
        const linear = allEntries(De.cache, undefined, 'd').filter((e) => e.key.kind === 'linear-state');
        const attempt = transfer(P, 'p', D, 'd', 'room-w', (k) => k.kind === 'linear-state');
        if (linear.length === 0) {
          // an attention-only target has no KDA state to withhold: the transfer is complete
          await attempt;
        } else {
          await expect(attempt).rejects.toThrow(
            new RegExp(`linear-state layer ${(linear[0] as LocalEntry).key.layer}\\b.*rank 0`),
          );
        }
        De.abort('d');
        Pe.abort('p');
        expect(De.cache.pagesInUse + De.cache.slotsInUse + Pe.cache.pagesInUse + Pe.cache.slotsInUse).toBe(0);
      } finally {
        await P.transfer.close();
        await D.transfer.close();
      }
    });
  });
}
