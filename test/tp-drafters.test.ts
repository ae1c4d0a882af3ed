// Drafters sharded under tensor parallelism (packages/core/src/tensor-parallel/tp-drafter.ts,
// the plugins' loadShard). The shipped Kimi target with its DFlash, DSpark and EAGLE-3 drafters (4
// heads, 2 KV heads each): under tp = 2 every rank holds its shard of the draft model too, and greedy
// speculative output equals plain greedy decoding under tp = 2 token for token (the target decides),
// and tp = 1's speculative output (or first differs at a near-tie, the rule of tp-equivalence.ts); τ
// is reported for both. tp = 4 replicates the 2 KV heads (ranks 0, 1: head 0; ranks 2, 3: head 1):
// output equals plain tp = 4, and each rank's reads are asserted. DFlash and DSpark reuse the
// target's vocab-parallel lm_head: every rank's propose calls its target shard's lmHead (its 1/tp of
// the vocabulary rows, all-gathered), whose logits at tp = 4 are bit for bit the whole lm_head's on
// the same input. A tp that does not fit the draft heads is refused naming the counts; the sharded
// block forward equals the whole one within 1e-5.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  BUILTIN_PLUGIN_PACKAGES,
  DrafterError,
  draftShardLayout,
  HfConfig,
  loadDrafter,
  loadTensorParallelTarget,
  SafetensorsCheckpoint,
  TensorParallelDrafter,
  type Drafter,
  type LoadedTarget,
  type TensorRead,
  type TpComm,
} from '@specd/core';
import { dflashPlugin, type DFlashDrafter } from '@specd/plugin-dflash';

import { loadTpPair, TINY_TARGET, tinyDrafter, tinyDrafterDir, TpEquivalence } from './tp-equivalence.js';

const TARGET = TINY_TARGET;
const PLUGINS = BUILTIN_PLUGIN_PACKAGES;
const TAU_TOLERANCE = 0.25;
const dirOf = tinyDrafterDir;
let whole: LoadedTarget;
let tp2: LoadedTarget;
let promptIds: Int32Array[];
let eq: TpEquivalence;
const report: string[] = [];

/** Greedy output ids per prompt and τ per step: both prompts batched, max drafts, chunks of 4 (tp-equivalence.ts). */
function generate(target: LoadedTarget, drafter: Drafter | undefined): { ids: number[][]; tau: number } {
  return eq.run(target, drafter);
}

const drafterFor = tinyDrafter;

beforeAll(async () => {
  ({ whole, other: tp2, promptIds, eq } = await loadTpPair(2));
});

afterAll(() => {
  tp2?.model.dispose();
  whole?.model.dispose();
  process.stdout.write(
    `tp-drafters:${report.map((r) => `\n  ${r}`).join('')}\n  ${eq.nearTies.length}` +
      ` near-tie difference(s)${eq.nearTies.map((n) => `\n  ${n}`).join('')}\n`,
  );
});

describe('sharded drafters, tp = 2 (greedy, 2 sequences batched)', () => {
  let plain2: number[][];
  beforeAll(() => {
    plain2 = generate(tp2, undefined).ids;
  });

  for (const m of ['dflash', 'dspark', 'eagle3'] as const) {
    it(`${m}: lossless vs plain tp = 2, equivalent to tp = 1, τ close`, async () => {
      const d1 = await drafterFor(whole, m);
      const d2 = await drafterFor(tp2, m);
      try {
        expect(d2).toBeInstanceOf(TensorParallelDrafter);
        expect((d2 as TensorParallelDrafter).ranks.map((r) => r.rank)).toEqual([0, 1]);
        const a = generate(whole, d1);
        const b = generate(tp2, d2);
        expect(b.ids).toEqual(plain2);
        eq.expectEquivalent(m, a.ids, b.ids);
        report.push(`${m}: τ per step tp=1 ${a.tau.toFixed(3)}, tp=2 ${b.tau.toFixed(3)}`);
        expect(Math.abs(a.tau - b.tau)).toBeLessThan(TAU_TOLERANCE);
        expect(d2.pagesInUse).toBe(0);
      } finally {
        d1.dispose();
        d2.dispose();
      }
    });
  }

  it('dflash: the sharded block forward (3 layers) equals the whole one within 1e-5 on a random context', async () => {
    // the same numerics on both sides: a sharded drafter's layers are bf16 (the whole one's default may be Q8_0)
    const d1 = (await drafterFor(whole, 'dflash', { weights: 'bf16' })) as DFlashDrafter;
    const d2 = (await drafterFor(tp2, 'dflash')) as TensorParallelDrafter;
    try {
      const D = 256;
      const n = 37;
      let seed = 12345;
      const rand = () => {
        seed = (seed * 1103515245 + 12345) >>> 0;
        return (seed / 2 ** 32) * 2 - 1;
      };
      const sum = Float32Array.from({ length: n * D }, () => rand() * 4);
      const spans = [{ id: 's', position: 0, numTokens: n }];
      for (const d of [d1, d2] as Drafter[]) {
        d.addSequence('s');
        d.writeProjectedContextKV(sum, spans);
      }
      const seqs = [{ id: 's', position: n, lastToken: 1234 }];
      const ref = d1.runBlocks(seqs);
      const got = d2.invoke('runBlocks', [seqs]) as Float32Array;
      let num = 0;
      let den = 0;
      for (let e = 0; e < ref.length; e++) {
        num += (got[e]! - ref[e]!) ** 2;
        den += ref[e]! ** 2;
      }
      const rel = Math.sqrt(num / den);
      report.push(
        `dflash block forward tp=2 vs tp=1: ‖out − ref‖ / ‖ref‖ = ${rel.toExponential(2)} over ${ref.length} values`,
      );
      expect(got.length).toBe(ref.length);
      expect(rel).toBeLessThan(1e-5);
      expect(d2.contextLength('s')).toBe(n);
    } finally {
      d1.dispose();
      d2.dispose();
    }
  });
});

describe('tp = 4: the 2 draft KV heads replicated', () => {
  let tp4: LoadedTarget;
  beforeAll(async () => {
    tp4 = await loadTensorParallelTarget(TARGET, PLUGINS, { tp: 4 });
  });
  afterAll(() => tp4?.model.dispose());

  it("the target's vocab-parallel lm_head (2048 vocabulary rows per rank) is bit for bit the whole one", () => {
    const D = 256;
    let seed = 99;
    const rand = () => {
      seed = (seed * 1103515245 + 12345) >>> 0;
      return (seed / 2 ** 32) * 2 - 1;
    };
    const x = Float32Array.from({ length: 3 * D }, rand);
    const bits = (v: Float32Array) => Array.from(new Uint32Array(v.buffer, v.byteOffset, v.length));
    expect(bits(tp4.model.lmHead!(x, 3))).toEqual(bits(whole.model.lmHead!(x, 3)));
  });

  it(
    'dspark: greedy output equals plain tp = 4 (every rank calls ' +
      'the target lm_head); plain tp = 4 equivalent to tp = 1',
    async () => {
      const d4 = await drafterFor(tp4, 'dspark');
      try {
        const plain4 = generate(tp4, undefined).ids;
        expect(generate(tp4, d4).ids).toEqual(plain4);
        const eq4 = new TpEquivalence(whole, promptIds, 'tp=4');
        eq4.expectEquivalent('plain tp=4', generate(whole, undefined).ids, plain4);
        report.push(
          `plain tp=4 vs tp=1: ${eq4.nearTies.length} near-tie ` +
            `difference(s)${eq4.nearTies.map((n) => ` (${n})`).join('')}`,
        );
      } finally {
        d4.dispose();
      }
    },
  );

  it('dflash: greedy output equals plain tp = 4; each rank reads its blocks only', async () => {
    const d4 = (await drafterFor(tp4, 'dflash')) as TensorParallelDrafter;
    try {
      expect(generate(tp4, d4).ids).toEqual(generate(tp4, undefined).ids);
      const reads = (rank: number) => d4.ranks[rank]!.reads;
      const find = (rank: number, name: string): TensorRead => {
        const r = reads(rank).find((x) => x.name === name);
        expect(r, `rank ${rank} read ${name}`).toBeDefined();
        return r!;
      };
      for (let j = 0; j < 3; j++) {
        const p = `layers.${j}.`;
        expect(find(1, `${p}self_attn.q_proj.weight`).rows).toEqual([64, 128]);
        expect(find(1, `${p}self_attn.o_proj.weight`).cols).toEqual([64, 128]);
        for (const [rank, kv] of [
          [0, [0, 64]],
          [1, [0, 64]],
          [2, [64, 128]],
          [3, [64, 128]],
        ] as const) {
          expect(find(rank, `${p}self_attn.k_proj.weight`).rows).toEqual(kv);
          expect(find(rank, `${p}self_attn.v_proj.weight`).rows).toEqual(kv);
        }
        expect(find(1, `${p}mlp.gate_proj.weight`).rows).toEqual([128, 256]);
        expect(find(1, `${p}mlp.up_proj.weight`).rows).toEqual([128, 256]);
        expect(find(1, `${p}mlp.down_proj.weight`).cols).toEqual([128, 256]);
        expect(find(3, `${p}mlp.down_proj.weight`).cols).toEqual([384, 512]);
      }
      find(0, 'fc.weight');
      for (const rank of [1, 2, 3]) {
        expect(
          reads(rank).filter((r) => /^fc\.|lm_head|embed/.test(r.name)),
          `rank ${rank}`,
        ).toEqual([]);
      }
    } finally {
      d4.dispose();
    }
  });
});

describe('refusals', () => {
  it('a tp that does not fit the draft heads is refused, naming the counts', async () => {
    expect(() =>
      draftShardLayout({ heads: 4, kvHeads: 2, intermediate: 512 }, { rank: 0, size: 3 }, 'dflash: x'),
    ).toThrow(
      new RegExp(
        /tp = 3 does not fit the draft model: it does not divide num_attention_heads = 4, /.source +
          /intermediate_size = 512, num_key_value_heads = 2 .*4 heads, 2 KV heads, intermediate 512/.source,
      ),
    );
    expect(() => draftShardLayout({ heads: 12, kvHeads: 4, intermediate: 24 }, { rank: 0, size: 6 }, 'd')).toThrow(
      /num_key_value_heads = 4/,
    );
    expect(draftShardLayout({ heads: 8, kvHeads: 2, intermediate: 16 }, { rank: 5, size: 8 }, 'd')).toMatchObject({
      heads: [5, 6],
      kvHeads: [1, 2],
      intermediate: [10, 12],
    });
    // through the plugin: a group of 8 ranks does not divide the tiny drafter's 4 heads
    const comm: TpComm = { rank: 0, size: 8, allReduce: (x) => x, broadcast: (x) => x, allGather: (x) => x };
    const dir = dirOf('dflash');
    const weights = SafetensorsCheckpoint.open(dir);
    try {
      await expect(
        dflashPlugin.loadShard!(
          { dir, config: HfConfig.read(dir), weights },
          { target: whole.model, comm, maxSequences: 1, maxTokensPerSequence: 64 },
        ),
      ).rejects.toThrow(DrafterError);
      await expect(
        dflashPlugin.loadShard!(
          { dir, config: HfConfig.read(dir), weights },
          { target: whole.model, comm, maxSequences: 1, maxTokensPerSequence: 64 },
        ),
      ).rejects.toThrow(/tp = 8 does not fit the draft model: it does not divide num_attention_heads = 4/);
    } finally {
      weights.close();
    }
  });

  it("a bad propose fails on every rank before any collective: rank 0's error, the drafter stays usable", async () => {
    const d2 = (await drafterFor(tp2, 'dflash')) as TensorParallelDrafter;
    try {
      d2.addSequence('x');
      const seq = {
        id: 'x',
        position: 0,
        lastToken: 5,
        maxDrafts: 99,
        history: Int32Array.of(5),
        sampling: { temperature: 0 },
        rng: { next: () => 0.5 },
      };
      expect(() => d2.propose({ sequences: [seq] })).toThrow(/maxDrafts: expected \[1, 15\], got 99/);
      expect(d2.failure()).toBeUndefined();
      d2.writeProjectedContextKV(new Float32Array(3 * 256).fill(0.5), [{ id: 'x', position: 0, numTokens: 3 }]);
      expect(d2.propose({ sequences: [{ ...seq, position: 3, maxDrafts: 4 }] })[0]!.tokens.length).toBe(4);
      d2.freeSequence('x');
      expect(d2.pagesInUse).toBe(0);
    } finally {
      d2.dispose();
    }
  });

  it.each(['dflash', 'dspark'] as const)('%s: weights "q8_0" under tp = 2 is refused', async (m) => {
    await expect(loadDrafter({ dir: dirOf(m), settings: { weights: 'q8_0' } }, PLUGINS, tp2, 256, 1)).rejects.toThrow(
      /weights "q8_0" is not supported under tensor parallelism \(tp = 2\); use "bf16"/,
    );
  });

  it('eagle3: weights "q8_0" under tp = 2 is refused', async () => {
    await expect(
      loadDrafter({ dir: dirOf('eagle3'), settings: { weights: 'q8_0' } }, PLUGINS, tp2, 256, 1),
    ).rejects.toThrow(/drafter\.weights "q8_0" is not supported under tensor parallelism \(tp = 2\); use "bf16"/);
  });

  it('eagle3: a tree under tp = 2 is refused', async () => {
    await expect(
      loadDrafter(
        { dir: dirOf('eagle3'), settings: { tree: { top_k: 2, depth: 3, total_tokens: 6 } } },
        PLUGINS,
        tp2,
        256,
        1,
      ),
    ).rejects.toThrow(/tree drafting is not supported under tensor parallelism \(tp = 2\)/);
  });
});
