// The PD transfer planner at real Kimi-K3 shapes (nothing allocated): the draft KV of the incident in
// REFERENCE.md §1 (P TP4/PP8 → D TP32/PP1, 8 KV heads, head_dim 128, bf16, pages of 64), the reverse
// direction, the MLA latent (replicated), KDA state and conv states by head (Kimi-Linear-48B-A3B's
// fixture config), PP stage ownership, coalescing, and every validation error.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

import { defaultPartition } from '../../src/pipeline/partition.js';
import {
  expectedEntries,
  forEachRange,
  payloadBytes,
  type PdCopy,
  PdError,
  type PdRegionSpec,
  type PdSideLayout,
  type PdUnitMapping,
  planTransfer,
  unitsForTokens,
  validatePlan,
} from '../../src/pd/index.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const kimiLinear = JSON.parse(
  fs.readFileSync(path.join(ROOT, 'test/fixtures/kimi-linear-48b-a3b/config.json'), 'utf8'),
) as {
  num_hidden_layers: number;
  kv_lora_rank: number;
  qk_rope_head_dim: number;
  linear_attn_config: {
    kda_layers: number[];
    full_attn_layers: number[];
    num_heads: number;
    head_dim: number;
    short_conv_kernel_size: number;
  };
};

const BF16 = 2;
const F32 = 4;
const PAGE = 64;
const K3_LAYERS = 93;
/** Kimi-K3's MLA layers, 0-based: every 4th (1-based 4, 8, …, 92) and the last. */
const K3_MLA = [...Array.from({ length: 23 }, (_, i) => 4 * i + 3), 92];

const draftKv: PdRegionSpec = {
  name: 'draft-kv',
  kind: 'draft-kv',
  layers: [0, 1, 2, 3, 4, 5],
  parts: ['k', 'v'],
  unit: 'page',
  rowsPerUnit: PAGE,
  heads: 8,
  headBytes: 128 * BF16,
  split: 'heads',
  window: 4096,
  drafter: true,
};
const mla: PdRegionSpec = {
  name: 'mla',
  kind: 'target-kv',
  layers: K3_MLA,
  parts: [''],
  unit: 'page',
  rowsPerUnit: PAGE,
  heads: 1,
  headBytes: (kimiLinear.kv_lora_rank + kimiLinear.qk_rope_head_dim) * BF16,
  split: 'replicated',
};

const P_BASE = 0x10_0000_0000;
const D_BASE = 0x7f00_0000_0000;
const side = (tp: number, pp: number, base: number, numUnits: Record<string, number>, layers = K3_LAYERS) =>
  ({ tp, pp, numLayers: layers, baseAddress: base, numUnits }) satisfies PdSideLayout;

const P_PAGES = 1024;
const D_PAGES = 2048;
const prefill = side(4, 8, P_BASE, { 'draft-kv': P_PAGES });
const decode = side(32, 1, D_BASE, { 'draft-kv': D_PAGES });
/** Pages 5, 6, 7 → 100, 101, 102 (one run) and 9 → 40. */
const pages: PdUnitMapping = {
  'draft-kv': [
    [5, 100],
    [6, 101],
    [7, 102],
    [9, 40],
  ],
};

function throwsLayout(f: () => unknown, message: RegExp): void {
  let caught: unknown;
  try {
    f();
  } catch (e) {
    caught = e;
  }
  expect(caught).toBeInstanceOf(PdError);
  expect((caught as PdError).code).toBe('layout');
  expect((caught as PdError).message).toMatch(message);
}

describe('draft KV, P TP4/PP8 → D TP32/PP1 (the incident)', () => {
  const copies = planTransfer([draftKv], prefill, decode, pages);

  it('per-rank pages: P 32 KiB (2 heads), D 16 KiB (1 replicated head); every copy one head of 256 bytes', () => {
    // 6 layers × K, V × 32 D ranks × 2 runs
    expect(copies.length).toBe(6 * 2 * 32 * 2);
    for (const c of copies) {
      expect(c.srcStride * PAGE).toBe(32768);
      expect(c.dstStride * PAGE).toBe(16384);
      expect(c.bytes).toBe(256);
      expect(c.heads).toBe(1);
      expect(c.srcStage).toBe(7); // the drafter lives on the last P stage
      expect(c.dstStage).toBe(0);
      expect(c.head).toBe(c.dstRank >> 2); // D rank r holds head ⌊r·8/32⌋
      expect(c.srcRank).toBe(c.head >> 1); // P rank r holds heads 2r, 2r+1
    }
  });

  it('strided rows are visited one range per row, each at its own side offsets', () => {
    const c = copies.find((x) => x.dstRank === 13 && x.layer === 2 && x.part === 'v' && x.count === PAGE);
    expect(c).toBeDefined();
    const ranges: number[][] = [];
    if (c !== undefined) forEachRange(c, (src, dst, bytes) => ranges.push([src, dst, bytes]));
    expect(ranges.length).toBe(PAGE);
    expect(ranges[0]).toEqual([9 * 32768 + 256, 40 * 16384, 256]);
    expect(ranges[63]).toEqual([9 * 32768 + 63 * 512 + 256, 40 * 16384 + 63 * 256, 256]);
  });

  it('offsets by hand: D rank 13, layer 2 (v), page 9 → 40', () => {
    const c = copies.find((x) => x.dstRank === 13 && x.layer === 2 && x.part === 'v' && x.count === PAGE)!;
    // head 3 = P rank 1's second head; buffer (layer 2, v) is the 6th of P stage 7: 5 × 1024 pages × 32768
    expect(c).toMatchObject({ head: 3, srcRank: 1, srcBufferOffset: 9 * 32768 + 256 });
    expect(c.srcOffset).toBe(P_BASE + 168067328); // 167772160 + 294912 + 256
    // D: the 6th buffer of 2048 pages × 16384; page 40; the rank's only head at +0
    expect(c.dstBufferOffset).toBe(40 * 16384);
    expect(c.dstOffset).toBe(D_BASE + 168427520); // 167772160 + 655360
  });

  it('every copy equals the formula with each side its own item size', () => {
    for (const c of copies) {
      const buffer = draftKv.layers.indexOf(c.layer) * 2 + draftKv.parts.indexOf(c.part);
      const [src, dst, units] = c.count === 3 * PAGE ? [5, 100, 3] : [9, 40, 1];
      expect(c.count).toBe(units * PAGE);
      expect(c.srcOffset).toBe(P_BASE + buffer * P_PAGES * 32768 + src * 32768 + (c.head % 2) * 256);
      expect(c.dstOffset).toBe(D_BASE + buffer * D_PAGES * 16384 + dst * 16384);
    }
  });

  it("a planner using the source's item size for D's offsets and lengths is refused", () => {
    const naive: PdCopy[] = copies.map((c) => {
      const dstBufferOffset = (c.dstBufferOffset / 16384) * 32768;
      return { ...c, bytes: 32768, count: c.count / PAGE, srcStride: 32768, dstStride: 32768, dstBufferOffset };
    });
    throwsLayout(
      () => validatePlan([draftKv], prefill, decode, pages, naive),
      new RegExp(
        '^plan: copy 0: region draft-kv layer 0 \\(k\\): prefill stage 7 rank 0 → decode stage 0 rank 0: ' +
          'bytes 32768: expected 1 heads × 256 bytes = 256',
      ),
    );
    // right length, offset from P's page length: lands on D page 200 (the mapping names 100)
    const offsetOnly = copies.map((c) => {
      const dstBufferOffset = c.dstBufferOffset + (c.dstBufferOffset % (D_PAGES * 16384));
      return { ...c, dstBufferOffset, dstOffset: c.dstOffset - c.dstBufferOffset + dstBufferOffset };
    });
    throwsLayout(
      () => validatePlan([draftKv], prefill, decode, pages, offsetOnly),
      /copy 0: .*: destination unit 200 is written from source unit 5; the mapping says it is not a destination/,
    );
  });

  it('expected entries and payload per request come from D alone', () => {
    const units = unitsForTokens([draftKv], 1000); // ⌈1000 / 64⌉ = 16 pages
    expect(units).toEqual({ 'draft-kv': 16 });
    const entries = expectedEntries([draftKv], decode, units);
    expect(entries.length).toBe(6 * 2 * 32);
    expect(new Set(entries.map((e) => e.byteLength))).toEqual(new Set([16 * 16384]));
    expect(entries[33]).toEqual({
      key: { kind: 'draft-kv', layer: 0, part: 'v', rank: 1 },
      stage: 0,
      byteLength: 262144,
    });
    expect(payloadBytes([draftKv], decode, units)).toEqual({
      target_kv: 0,
      linear_state: 0,
      draft_context: 6 * 2 * 32 * 262144,
    });
    // past the window (4096) only the window's pages: rows [L − W, L) = [5904, 10000) on pages 92 … 156
    expect(unitsForTokens([draftKv], 10_000)).toEqual({ 'draft-kv': 157 - 92 });
    expect(unitsForTokens([draftKv], 10_000, { windows: false })).toEqual({ 'draft-kv': 157 });
    expect(unitsForTokens([draftKv], 4096)).toEqual({ 'draft-kv': 64 }); // exactly the window: every page
    expect(unitsForTokens([draftKv], 4097)).toEqual({ 'draft-kv': 65 }); // row 0 shares page 0 with rows 1 … 63
    expect(unitsForTokens([draftKv], 4160)).toEqual({ 'draft-kv': 64 }); // rows [64, 4160): pages 1 … 64
    // a 16-page mapping delivers exactly that many bytes to every entry
    const sixteen = { 'draft-kv': Array.from({ length: 16 }, (_, i) => [3 * i, i] as const) };
    const got = new Map<string, number>();
    for (const c of planTransfer([draftKv], prefill, decode, sixteen)) {
      const k = `${c.layer}/${c.part}/${c.dstRank}`;
      got.set(k, (got.get(k) ?? 0) + c.bytes * c.count);
    }
    for (const e of entries) expect(got.get(`${e.key.layer}/${e.key.part}/${e.key.rank}`)).toBe(e.byteLength);
  });
});

describe('the reverse direction: P TP32/PP1 → D TP4/PP2', () => {
  const p = side(32, 1, P_BASE, { 'draft-kv': P_PAGES });
  const d = side(4, 2, D_BASE, { 'draft-kv': D_PAGES });
  const copies = planTransfer([draftKv], p, d, pages);

  it('each D rank gathers its 2 heads from 2 P ranks, strided on D, spread over P replicas', () => {
    expect(copies.length).toBe(6 * 2 * 4 * 2 * 2); // layers × parts × D ranks × heads × runs
    for (const c of copies) {
      expect(c).toMatchObject({ bytes: 256, heads: 1, srcStride: 256, dstStride: 512, srcStage: 0, dstStage: 1 });
      expect(c.head >> 1).toBe(c.dstRank);
      // P holds head h on ranks 4h … 4h+3; D rank r reads replica r mod 4
      expect(c.srcRank).toBe(4 * c.head + (c.dstRank % 4));
      expect(c.srcBufferOffset % 4096).toBe(0); // a whole P row (1 head) per token: page = 16 KiB
      expect(c.dstBufferOffset % 512).toBe((c.head % 2) * 256); // the head's half of D's 512-byte row
    }
    const ranks = (r: number) => [...new Set(copies.filter((c) => c.dstRank === r).map((c) => c.srcRank))];
    expect([0, 1, 2, 3].map(ranks)).toEqual([
      [0, 4],
      [9, 13],
      [18, 22],
      [27, 31],
    ]);
  });
});

describe('the target: MLA latent (replicated) and KDA state by head', () => {
  it('MLA: every D rank gets the whole latent page (1152 bytes a token) from the P stage owning the layer', () => {
    const p = side(4, 8, P_BASE, { mla: 512 });
    const d = side(32, 1, D_BASE, { mla: 512 });
    const copies = planTransfer([mla], p, d, { mla: [[1, 2]] });
    expect(copies.length).toBe(24 * 32);
    const ranges = defaultPartition(K3_LAYERS, 8); // [11, 11, 12, 12, 12, 12, 12, 11]
    expect(ranges).toEqual([11, 11, 12, 12, 12, 12, 12, 11]);
    for (const c of copies) {
      expect(c).toMatchObject({ bytes: 1152, srcStride: 1152, dstStride: 1152, count: 64, head: 0, heads: 1 });
      expect(c.srcRank).toBe(c.dstRank % 4);
    }
    // layer 55 (1-based 56) is the third MLA layer of stage 4 ([46, 58): 47, 51, 55)
    const c = copies.find((x) => x.layer === 55 && x.dstRank === 6)!;
    expect(c).toMatchObject({ srcStage: 4, srcRank: 2, srcBufferOffset: 64 * 1152, dstBufferOffset: 2 * 64 * 1152 });
    expect(c.srcOffset).toBe(P_BASE + 2 * 512 * 64 * 1152 + 64 * 1152);
    expect(c.dstOffset).toBe(D_BASE + K3_MLA.indexOf(55) * 512 * 64 * 1152 + 2 * 64 * 1152);
    expect(copies.find((x) => x.layer === 92)!.srcStage).toBe(7);
    expect(copies.find((x) => x.layer === 3)!.srcStage).toBe(0);
  });

  const lac = kimiLinear.linear_attn_config;
  const kdaLayers = lac.kda_layers.map((l) => l - 1);
  const kdaState: PdRegionSpec = {
    name: 'kda-state',
    kind: 'linear-state',
    layers: kdaLayers,
    parts: [''],
    unit: 'slot',
    rowsPerUnit: 1,
    heads: lac.num_heads,
    headBytes: lac.head_dim * lac.head_dim * F32,
    split: 'heads',
  };
  const kdaConv: PdRegionSpec = {
    ...kdaState,
    name: 'kda-conv',
    kind: 'conv-state',
    rowsPerUnit: 3, // q, k, v
    headBytes: lac.head_dim * (lac.short_conv_kernel_size - 1) * F32,
  };

  it('KDA (Kimi-Linear-48B-A3B: 32 heads × 128): P TP4/PP8 → D TP32: recurrent and conv state by head', () => {
    expect([kdaState.heads, kdaState.headBytes, kdaConv.headBytes]).toEqual([32, 65536, 1536]);
    const units = { 'kda-state': 4, 'kda-conv': 4 };
    const p = side(4, 8, P_BASE, units, kimiLinear.num_hidden_layers);
    const d = side(32, 1, D_BASE, { 'kda-state': 8, 'kda-conv': 8 }, kimiLinear.num_hidden_layers);
    const slot = { 'kda-state': [[2, 5]] as const, 'kda-conv': [[2, 5]] as const };
    const copies = planTransfer([kdaState, kdaConv], p, d, slot);
    expect(copies.length).toBe(2 * kdaLayers.length * 32);
    const ranges = [3, 6, 9, 12, 16, 20, 24, 27]; // stage ends of [3, 3, 3, 3, 4, 4, 4, 3]
    for (const c of copies) {
      expect(c.head).toBe(c.dstRank);
      expect(c.srcRank).toBe(c.dstRank >> 3);
      expect(c.srcStage).toBe(ranges.findIndex((end) => c.layer < end));
      if (c.region === 'kda-state') {
        expect(c).toMatchObject({ bytes: 65536, count: 1, srcStride: 8 * 65536, dstStride: 65536 });
        expect(c.dstBufferOffset).toBe(5 * 65536);
        expect(c.srcBufferOffset).toBe(2 * 8 * 65536 + (c.head % 8) * 65536);
      } else {
        // [slot, convStates, heads, headDim·(kernel−1)]: three strided rows per slot
        expect(c).toMatchObject({ bytes: 1536, count: 3, srcStride: 8 * 1536, dstStride: 1536 });
        expect(c.dstBufferOffset).toBe(5 * 3 * 1536);
        expect(c.srcBufferOffset).toBe(2 * 3 * 8 * 1536 + (c.head % 8) * 1536);
      }
    }
    // on a P stage the conv buffers follow every state buffer of that stage (region order first)
    const conv1 = copies.find((c) => c.region === 'kda-conv' && c.layer === 0 && c.dstRank === 0)!;
    const stage0Kda = kdaLayers.filter((l) => l < 3).length; // layers 0, 1, 2
    expect(conv1.srcOffset - conv1.srcBufferOffset - P_BASE).toBe(stage0Kda * 4 * 8 * 65536);
    expect(payloadBytes([kdaState, kdaConv], d, unitsForTokens([kdaState, kdaConv], 5000))).toEqual({
      target_kv: 0,
      linear_state: kdaLayers.length * 32 * (65536 + 3 * 1536),
      draft_context: 0,
    });
  });

  it('a rank-0 blob (e.g. the last hidden state) goes rank 0 → rank 0 only', () => {
    const blob: PdRegionSpec = {
      name: 'hidden',
      kind: 'draft-state',
      layers: [0],
      parts: ['hidden'],
      unit: 'slot',
      rowsPerUnit: 1,
      heads: 1,
      headBytes: 7168 * F32,
      split: 'rank0',
      drafter: true,
    };
    const regions = [blob, draftKv];
    const p = side(4, 8, P_BASE, { hidden: 2, 'draft-kv': P_PAGES });
    const d = side(32, 1, D_BASE, { hidden: 2, 'draft-kv': D_PAGES });
    const copies = planTransfer(regions, p, d, { hidden: [[1, 0]], ...pages });
    const blobs = copies.filter((c) => c.region === 'hidden');
    expect(blobs).toEqual([
      expect.objectContaining({ srcStage: 7, srcRank: 0, dstRank: 0, bytes: 28672, srcBufferOffset: 28672 }),
    ]);
    // the draft KV buffers start after the blob on rank 0 only
    const r0 = copies.find((c) => c.region === 'draft-kv' && c.dstRank === 0)!;
    const r4 = copies.find((c) => c.region === 'draft-kv' && c.dstRank === 4)!;
    expect(r0.dstOffset - r0.dstBufferOffset).toBe(D_BASE + 2 * 28672);
    expect(r4.dstOffset - r4.dstBufferOffset).toBe(D_BASE);
    expect(
      expectedEntries(regions, d, { hidden: 1, 'draft-kv': 0 }).filter((e) => e.key.kind === 'draft-state'),
    ).toEqual([{ key: { kind: 'draft-state', layer: 0, part: 'hidden', rank: 0 }, stage: 0, byteLength: 28672 }]);
  });
});

describe('coalescing and PP', () => {
  it('same head block on both sides: whole rows, consecutive pages merged into one contiguous copy', () => {
    const p = side(2, 1, 0, { 'draft-kv': 64 });
    const d = side(2, 1, 0, { 'draft-kv': 64 });
    const run = { 'draft-kv': [0, 1, 2, 3].map((i) => [i + 7, i + 10] as const) };
    const copies = planTransfer([draftKv], p, d, run);
    expect(copies.length).toBe(6 * 2 * 2);
    for (const c of copies) {
      // 4 heads × 256 bytes per row = the row on both sides: one range of 4 pages
      expect(c).toMatchObject({ heads: 4, bytes: 1024, srcStride: 1024, dstStride: 1024, count: 4 * PAGE });
      expect(c.srcBufferOffset).toBe(7 * PAGE * 1024);
      expect(c.dstBufferOffset).toBe(10 * PAGE * 1024);
    }
    // one range of 4 pages × 64 rows × 1024 bytes
    const ranges: number[][] = [];
    forEachRange(copies[0]!, (src, dst, bytes) => ranges.push([src, dst, bytes]));
    expect(ranges).toEqual([[7 * PAGE * 1024, 10 * PAGE * 1024, 4 * PAGE * 1024]]);
    const broken = {
      'draft-kv': [
        [7, 10],
        [9, 11],
        [10, 12],
      ] as const,
    };
    expect(
      planTransfer([draftKv], p, d, broken)
        .map((c) => c.count)
        .slice(0, 2),
    ).toEqual([PAGE, 2 * PAGE]);
  });

  it('D under PP: layers land on the D stage owning them; a wrong stage is refused', () => {
    const p = side(4, 8, P_BASE, { mla: 16 });
    const d = side(8, 3, D_BASE, { mla: 16 }); // [31, 31, 31]
    const copies = planTransfer([mla], p, d, { mla: [[0, 0]] });
    for (const c of copies) expect(c.dstStage).toBe(Math.floor(c.layer / 31));
    const i = copies.findIndex((c) => c.layer === 92);
    const bad = copies.map((c, k) => (k === i ? { ...c, srcStage: 6 } : c));
    throwsLayout(
      () => validatePlan([mla], p, d, { mla: [[0, 0]] }, bad),
      new RegExp(
        `^plan: copy ${i}: region mla layer 92: .*: prefill stage 6 does not hold layer 92 \\(stage 7 does\\)`,
      ),
    );
  });
});

describe('validation errors', () => {
  const plan = (p: PdSideLayout, d: PdSideLayout, m: PdUnitMapping = pages) => planTransfer([draftKv], p, d, m);

  it('tp that does not divide the heads', () => {
    throwsLayout(
      () => plan(side(3, 1, 0, { 'draft-kv': 8 }), decode),
      /^prefill: region draft-kv: tp 3 does not divide 8 heads$/,
    );
  });
  it('tp above the heads but not a multiple', () => {
    throwsLayout(
      () => plan(prefill, side(12, 1, 0, { 'draft-kv': 8 })),
      /^decode: region draft-kv: tp 12 is above 8 heads but not a multiple/,
    );
  });
  it('source unit out of range', () => {
    throwsLayout(
      () =>
        plan(prefill, decode, {
          'draft-kv': [
            [1, 1],
            [1024, 2],
          ],
        }),
      /^mapping: region draft-kv: \[1\] source unit 1024: out of range \(prefill has 1024\)$/,
    );
  });
  it('destination unit out of range', () => {
    throwsLayout(
      () => plan(prefill, decode, { 'draft-kv': [[1, 2048]] }),
      /^mapping: region draft-kv: \[0\] destination unit 2048: out of range \(decode has 2048\)$/,
    );
  });
  it('duplicate destination unit', () => {
    throwsLayout(
      () =>
        plan(prefill, decode, {
          'draft-kv': [
            [1, 7],
            [2, 8],
            [3, 7],
          ],
        }),
      /^mapping: region draft-kv: \[2\] destination unit 7: also the destination of \[0\]$/,
    );
  });
  it('a region without a mapping, or without a unit count', () => {
    throwsLayout(() => plan(prefill, decode, {}), /^mapping: region draft-kv: no unit mapping given$/);
    throwsLayout(
      () => plan(side(4, 1, 0, {}), decode),
      /^prefill: region draft-kv: numUnits: expected an integer >= 0, got undefined$/,
    );
  });
  it('a partition that does not fit', () => {
    throwsLayout(
      () => plan({ ...prefill, partition: [40, 40, 1, 1, 1, 1, 1, 1] }, decode),
      /^prefill: partition \[40, 40, 1, 1, 1, 1, 1, 1\]: sums to 86 layers, the model has 93$/,
    );
  });
  it('a target layer outside the model', () => {
    throwsLayout(
      () =>
        planTransfer([{ ...mla, layers: [3, 93] }], side(1, 1, 0, { mla: 1 }), side(1, 1, 0, { mla: 1 }), { mla: [] }),
      /^prefill: region mla: layer 93 is outside the target's 93 layers$/,
    );
  });

  const good = planTransfer([draftKv], prefill, decode, pages);
  const check = (copies: PdCopy[]) => () => validatePlan([draftKv], prefill, decode, pages, copies);
  it('two copies writing the same rows', () => {
    throwsLayout(
      check([...good, good[5]!]),
      /^plan: region draft-kv layer 0 \(k\): decode stage 0 rank 2 head 0: copies 5 and 768 both write rows \[2560,/,
    );
  });
  it('a destination unit nobody writes', () => {
    throwsLayout(
      check(good.filter((_, i) => i !== 1)),
      /^plan: region draft-kv layer 0 \(k\): decode stage 0 rank 0 head 0: destination unit 40 \(rows \[2560, 2624/,
    );
  });
  it('a stride other than the side row length', () => {
    throwsLayout(
      check(good.map((c) => ({ ...c, dstStride: 512 }))),
      /copy 0: .*: decode stride 512: expected the decode row length 256 bytes$/,
    );
  });
  it('an absolute offset that is not base + buffer start + in-buffer offset', () => {
    throwsLayout(
      check(good.map((c) => ({ ...c, srcOffset: c.srcOffset + 256 }))),
      new RegExp(
        `copy 0: .*: prefill offset ${P_BASE + 5 * 32768 + 256}: ` +
          `expected base \\+ buffer start ${P_BASE} \\+ ${5 * 32768}$`,
      ),
    );
  });
  it('rows past the end of a buffer', () => {
    const last = { 'draft-kv': [[1023, 2047]] as const };
    const ok = planTransfer([draftKv], prefill, decode, last);
    throwsLayout(
      () =>
        validatePlan(
          [draftKv],
          prefill,
          decode,
          last,
          ok.map((c) => ({ ...c, count: 2 * PAGE })),
        ),
      // 1023 · 32768 + 127 · 512 + 256 = 33586944
      /copy 0: .*: prefill rows end at byte 33586944 of a 33554432-byte buffer \(1024 units\)$/,
    );
  });
  it('a head the rank does not hold', () => {
    throwsLayout(
      check(good.map((c) => ({ ...c, head: c.head + 2 }))),
      /copy 0: .*: heads \[2, 3\) are not all on prefill rank 0 \(it holds \[0, 2\)\)$/,
    );
  });
});
