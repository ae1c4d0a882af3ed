// Tensor parallelism (packages/core/src/tensor-parallel, Kimi's loadShard).
// The shipped Kimi target (4 MLA heads, 4 KDA heads, 8 experts) split over tp = 2 ranks (rank 0 on
// this thread, rank 1 a worker thread): greedy SpecEngine output equals tp = 1's for plain decoding
// and every shipped drafter — or the first difference falls at a near-tie (top-2 logit gap < 1e-3 in
// the tp = 1 run at that token), which is reported. TP changes the association of the all-reduced
// sums (rank 0's partial + rank 1's), so logits are equal within rounding, not bit for bit. The
// lm_head is vocab-parallel (each rank its 4096 of the 8192 vocabulary rows, all-gathered): on the
// same input its logits are bit for bit the whole lm_head's, through `lmHead` and through a forward.
// Each rank reads only its blocks of the weights (asserted); a tp that does not divide the head
// counts is refused; `specd generate --tp 2 --json` equals `--tp 1`.
import { execFileSync } from 'node:child_process';
import * as path from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  BUILTIN_PLUGIN_PACKAGES,
  startServe,
  loadTensorParallelTarget,
  SafetensorsCheckpoint,
  SequenceCache,
  TensorParallelModel,
  WeightReader,
  type LoadedTarget,
  type StageModel,
  type TensorRead,
} from '@specd/core';
import { rmsNorm } from '@specd/native';

import { loadTpPair, ROOT, TINY_TARGET, tinyDrafter, TP_PROMPTS, type TpEquivalence } from './tp-equivalence.js';

const TARGET = TINY_TARGET;
const DRAFTERS = ['dflash', 'dspark', 'eagle3'] as const;
const PLUGINS = BUILTIN_PLUGIN_PACKAGES;
const PROMPTS = TP_PROMPTS;
let whole: LoadedTarget;
let tp2: LoadedTarget;
let promptIds: Int32Array[];
let eq: TpEquivalence;

const drafterFor = tinyDrafter;

beforeAll(async () => {
  ({ whole, other: tp2, promptIds, eq } = await loadTpPair(2));
});

afterAll(() => {
  tp2?.model.dispose();
  whole?.model.dispose();
  // the number of near-tie differences is part of the result
  process.stdout.write(
    `tensor-parallel: ${eq.nearTies.length} near-tie difference(s)${eq.nearTies.map((n) => `\n  ${n}`).join('')}\n`,
  );
});

describe('tensor parallelism, tp = 2 vs tp = 1 (greedy, 2 sequences batched)', () => {
  it('plain decoding', () => {
    expect(tp2.model).toBeInstanceOf(TensorParallelModel);
    eq.expectEquivalent('plain', eq.generate(whole, undefined), eq.generate(tp2, undefined));
  });

  for (const m of DRAFTERS) {
    it(`${m}`, async () => {
      const d1 = await drafterFor(whole, m);
      const d2 = await drafterFor(tp2, m);
      try {
        eq.expectEquivalent(m, eq.generate(whole, d1), eq.generate(tp2, d2));
        if (m === 'dflash')
          eq.expectEquivalent(
            'dflash (replay commit)',
            eq.generate(whole, d1, 'replay'),
            eq.generate(tp2, d2, 'replay'),
          );
      } finally {
        d1.dispose();
        d2.dispose();
      }
    });
  }

  it('logits and taps agree within rounding', () => {
    const run = (model: StageModel) => {
      const cache =
        model.createCache?.({ pageSize: 16, numPages: 8, numSlots: 1 }) ??
        new SequenceCache(model.cacheGeometry, { pageSize: 16, numPages: 8, numSlots: 1 });
      cache.add(0);
      const r = model.forward({ sequences: [{ id: 0, position: 0, tokens: promptIds[0]!, logits: 'all' }] }, cache, {
        taps: [0, 4, 8],
      });
      cache.finish(0);
      return r;
    };
    const a = run(whole.model);
    const b = run(tp2.model);
    let maxDiff = 0;
    a.logits!.forEach((v, i) => {
      maxDiff = Math.max(maxDiff, Math.abs(v - b.logits![i]!));
    });
    expect(maxDiff).toBeLessThan(1e-2);
    expect(b.taps.get(0)).toEqual(a.taps.get(0)); // the embedding is rank 0's, not reduced
    for (const t of [4, 8]) {
      const x = a.taps.get(t)!;
      const y = b.taps.get(t)!;
      let d = 0;
      x.forEach((v, i) => {
        d = Math.max(d, Math.abs(v - y[i]!));
      });
      expect(d).toBeLessThan(1e-3);
    }
    process.stdout.write(
      'tensor-parallel: max |logit(tp=2) − logit(tp=1)| = ' +
        `${maxDiff.toExponential(2)} over ${a.logits!.length} logits\n`,
    );
  });
});

describe('vocab-parallel lm_head (tp = 2): bit for bit the whole lm_head on the same input', () => {
  const D = 256;
  const V = 8192;
  const bits = (x: Float32Array) => Array.from(new Uint32Array(x.buffer, x.byteOffset, x.length));

  it('lmHead (called outside a drafter: the workers join through an lmHead request)', () => {
    let seed = 7;
    const rand = () => {
      seed = (seed * 1103515245 + 12345) >>> 0;
      return (seed / 2 ** 32) * 2 - 1;
    };
    for (const rows of [1, 5]) {
      const x = Float32Array.from({ length: rows * D }, rand);
      const a = whole.model.lmHead!(x, rows);
      const b = tp2.model.lmHead!(x, rows);
      expect(b.length).toBe(rows * V);
      expect(bits(b)).toEqual(bits(a));
    }
    expect(() => tp2.model.lmHead!(new Float32Array(3), 1)).toThrow(/lmHead: x: expected \[1, 256\]/);
    expect(tp2.model.lmHead!(new Float32Array(D), 1).length).toBe(V); // still usable after the failure
  });

  it('forward: its logits are the whole lm_head of norm(its own final hidden), rows as requested', () => {
    const weights = SafetensorsCheckpoint.open(TARGET);
    const norm = new WeightReader(weights).f32('model.norm.weight', [D]);
    weights.close();
    const model = tp2.model;
    const cache = model.createCache!({ pageSize: 16, numPages: 8, numSlots: 2 });
    cache.add(0);
    cache.add(1);
    const [p0, p1] = [promptIds[0]!, promptIds[1]!];
    const r = model.forward(
      {
        sequences: [
          { id: 0, position: 0, tokens: p0, logits: 'all' },
          { id: 1, position: 0, tokens: p1, logits: 'last' },
        ],
      },
      cache,
    );
    cache.finish(0);
    cache.finish(1);
    const rows = [...Array.from({ length: p0.length }, (_, i) => i), p0.length + p1.length - 1];
    const x = new Float32Array(rows.length * D);
    rows.forEach((row, i) => {
      x.set(r.hidden.subarray(row * D, (row + 1) * D), i * D);
    });
    const expected = whole.model.lmHead!(rmsNorm(x, norm, 1e-5), rows.length);
    expect(Array.from(r.logitRowStart)).toEqual([0, p0.length, p0.length + 1]);
    expect(bits(r.logits!)).toEqual(bits(expected));
  });
});

describe('failures', () => {
  it('a bad batch fails every rank alike before any all-reduce; the model stays usable', () => {
    const model = tp2.model;
    const cache = model.createCache!({ pageSize: 16, numPages: 8, numSlots: 1 });
    cache.add(0);
    expect(() =>
      model.forward({ sequences: [{ id: 0, position: 3, tokens: promptIds[0]!, logits: 'last' }] }, cache),
    ).toThrow(/position: expected 0/);
    expect(() =>
      model.forward({ sequences: [{ id: 0, position: 0, tokens: Int32Array.of(1 << 20), logits: 'last' }] }, cache),
    ).toThrow(/outside \[0, 8192\)/);
    const ok = model.forward({ sequences: [{ id: 0, position: 0, tokens: promptIds[0]!, logits: 'last' }] }, cache);
    expect(ok.logits!.length).toBe(8192);
    cache.finish(0);
    eq.expectEquivalent('after failures', eq.generate(whole, undefined), eq.generate(tp2, undefined));
  });
});

describe('what each rank loads', () => {
  const readsOf = (rank: number): TensorRead[] => [...(tp2.model as TensorParallelModel).ranks[rank]!.reads];
  const find = (rank: number, name: string) => readsOf(rank).filter((r) => r.name === name);

  it('ranks: rank 0 on this thread, rank 1 a worker thread; kernel threads sized per rank', () => {
    const m = tp2.model as TensorParallelModel;
    expect(m.size).toBe(2);
    expect(m.ranks.map((r) => r.rank)).toEqual([0, 1]);
    expect(m.ranks[0]!.threadId).toBeUndefined();
    expect(m.ranks[1]!.threadId).toBeGreaterThan(0);
    if (process.env.SPECD_NUM_THREADS === undefined) expect(m.kernelThreads).toBeGreaterThanOrEqual(1);
  });

  it('MLA (layer 3, 4 heads × (64 + 32) q, 64 + 64 kv_b, 64 v): each rank its 2 heads', () => {
    const p = 'model.layers.3.self_attn.';
    for (const rank of [0, 1]) {
      expect(find(rank, `${p}q_proj.weight`)).toEqual([
        { name: `${p}q_proj.weight`, rows: [rank * 192, rank * 192 + 192] },
      ]);
      expect(find(rank, `${p}kv_b_proj.weight`)).toEqual([
        { name: `${p}kv_b_proj.weight`, rows: [rank * 256, rank * 256 + 256] },
      ]);
      expect(find(rank, `${p}o_proj.weight`)).toEqual([
        { name: `${p}o_proj.weight`, cols: [rank * 128, rank * 128 + 128] },
      ]);
      // the latent projection and its norm are shared by all heads: whole on every rank
      expect(find(rank, `${p}kv_a_proj_with_mqa.weight`)).toEqual([{ name: `${p}kv_a_proj_with_mqa.weight` }]);
    }
  });

  it('KDA (layer 0, 4 heads × 64): each rank its heads, channels and state', () => {
    const p = 'model.layers.0.self_attn.';
    for (const rank of [0, 1]) {
      const ch = [rank * 128, rank * 128 + 128];
      for (const n of ['q_proj', 'k_proj', 'v_proj', 'f_b_proj', 'g_b_proj'])
        expect(find(rank, `${p}${n}.weight`)).toEqual([{ name: `${p}${n}.weight`, rows: ch }]);
      expect(find(rank, `${p}b_proj.weight`)).toEqual([{ name: `${p}b_proj.weight`, rows: [rank * 2, rank * 2 + 2] }]);
      expect(find(rank, `${p}A_log`)).toEqual([{ name: `${p}A_log`, elements: [rank * 2, rank * 2 + 2] }]);
      expect(find(rank, `${p}q_conv1d.weight`)).toEqual([
        { name: `${p}q_conv1d.weight`, elements: [ch[0]! * 4, ch[1]! * 4] },
      ]);
      expect(find(rank, `${p}o_proj.weight`)).toEqual([{ name: `${p}o_proj.weight`, cols: ch }]);
      expect(find(rank, `${p}f_a_proj.weight`)).toEqual([{ name: `${p}f_a_proj.weight` }]);
    }
    // its cache holds its 2 heads' state
    const m = tp2.model as TensorParallelModel;
    expect(m.cacheGeometry.linearState.heads).toBe(2);
    expect(m.cacheGeometry.linearState.convChannels).toBe(128);
  });

  it('MoE: experts 0–3 on rank 0, 4–7 on rank 1; router whole; shared expert and dense MLP by columns', () => {
    const expertsOf = (rank: number) =>
      [
        ...new Set(
          readsOf(rank).flatMap((r) => {
            const m = /^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\./.exec(r.name);
            return m === null ? [] : [Number(m[2])];
          }),
        ),
      ].sort((a, b) => a - b);
    expect(expertsOf(0)).toEqual([0, 1, 2, 3]);
    expect(expertsOf(1)).toEqual([4, 5, 6, 7]);
    for (const rank of [0, 1]) {
      for (let l = 1; l < 8; l++) {
        const p = `model.layers.${l}.block_sparse_moe.`;
        expect(find(rank, `${p}gate.weight`)).toEqual([{ name: `${p}gate.weight` }]);
        expect(find(rank, `${p}experts.${rank * 4}.w1.weight`)).toEqual([
          { name: `${p}experts.${rank * 4}.w1.weight` },
        ]);
        expect(find(rank, `${p}shared_experts.down_proj.weight`)).toEqual([
          { name: `${p}shared_experts.down_proj.weight`, cols: [rank * 64, rank * 64 + 64] },
        ]);
      }
      expect(find(rank, 'model.layers.0.mlp.gate_proj.weight')).toEqual([
        { name: 'model.layers.0.mlp.gate_proj.weight', rows: [rank * 384, rank * 384 + 384] },
      ]);
      expect(find(rank, 'model.layers.0.mlp.down_proj.weight')).toEqual([
        { name: 'model.layers.0.mlp.down_proj.weight', cols: [rank * 384, rank * 384 + 384] },
      ]);
    }
  });

  it(
    'embedding on rank 0 only; final norm on both; lm_head ' +
      'rows of its vocabulary slice on each; every layer on both',
    () => {
      expect(find(0, 'model.embed_tokens.weight')).toHaveLength(1);
      expect(find(1, 'model.embed_tokens.weight')).toHaveLength(0);
      for (const rank of [0, 1]) {
        expect(find(rank, 'model.norm.weight')).toEqual([{ name: 'model.norm.weight' }]);
        expect(find(rank, 'lm_head.weight')).toEqual([
          { name: 'lm_head.weight', rows: [rank * 4096, rank * 4096 + 4096] },
        ]);
      }
      for (const rank of [0, 1]) {
        const layers = new Set(readsOf(rank).flatMap((r) => /^model\.layers\.(\d+)\./.exec(r.name)?.[1] ?? []));
        expect([...layers].map(Number).sort((a, b) => a - b)).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
      }
    },
  );
});

describe('refusals and the CLI', () => {
  it('a tp that does not divide the head counts is refused, naming them', async () => {
    await expect(loadTensorParallelTarget(TARGET, PLUGINS, { tp: 3 })).rejects.toThrow(
      new RegExp(
        /tp = 3 does not divide num_attention_heads \(MLA heads\) = 4, /.source +
          /linear_attn_config\.num_heads \(KDA heads\) = 4, num_experts = 8/.source,
      ),
    );
  });

  it('specd generate --tp 2 --json equals --tp 1; --tp 3 is refused (--tp 2 --pp 2: test/tp-pp.test.ts)', () => {
    const bin = path.join(ROOT, 'packages/core/src/cli/bin.js');
    const args = [
      'generate',
      '--prompt',
      PROMPTS[0]!,
      '--max-tokens',
      '16',
      '--ignore-eos',
      '--temperature',
      '0',
      '--seed',
      '1',
      '--json',
    ];
    const run = (extra: string[]) =>
      JSON.parse(
        execFileSync(process.execPath, [bin, ...args, ...extra], { cwd: ROOT, encoding: 'utf8', timeout: 60_000 }),
      ) as { token_ids: number[]; text: string };
    const one = run(['--tp', '1']);
    const two = run(['--tp', '2']);
    eq.expectEquivalent('cli', [one.token_ids], [two.token_ids]);
    const fail = (extra: string[]) => {
      try {
        execFileSync(process.execPath, [bin, ...args, ...extra], {
          cwd: ROOT,
          encoding: 'utf8',
          stdio: 'pipe',
          timeout: 60_000,
        });
      } catch (err) {
        return String((err as { stderr: string }).stderr);
      }
      throw new Error(`expected ${extra.join(' ')} to fail`);
    };
    expect(fail(['--tp', '3'])).toMatch(/--tp 3: tensor parallelism: tp = 3 does not divide num_attention_heads/);
  }, 60_000);

  it('specd serve --tp 2 answers a greedy completion as tp = 1 does', async () => {
    const io = { cwd: ROOT, stdout: { write: () => true }, stderr: { write: () => true } };
    const complete = async (tp: number) => {
      const s = await startServe(
        { model: 'models/kimi-k3-tiny', port: 0, logLevel: 'silent', tp, spec: false },
        io as never,
      );
      try {
        expect(s.target.model instanceof TensorParallelModel).toBe(tp > 1);
        const res = await fetch(`${s.url}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({
            model: s.server.options.modelName,
            prompt: PROMPTS[0],
            max_tokens: 12,
            temperature: 0,
            ignore_eos: true,
          }),
        });
        if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
        return ((await res.json()) as { choices: { text: string }[] }).choices[0]!.text;
      } finally {
        await s.close();
      }
    };
    const one = await complete(1);
    const two = await complete(2);
    if (two !== one) eq.nearTies.push(`serve: texts differ: ${JSON.stringify(one)} vs ${JSON.stringify(two)}`);
    expect(two).toBe(one);
  }, 60_000);
});
