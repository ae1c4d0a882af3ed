// Tensor parallelism combined with pipeline parallelism (`--tp 2 --pp 2`). The shipped Kimi
// target (8 layers) in 2 pipeline stages, each a TP group of 2 ranks: stage 0 = a stage process whose
// rank 1 is a worker thread of that process; the last stage = rank 0 on this thread + a worker thread.
// Greedy SpecEngine output equals tp = 1, pp = 1's for plain decoding and DFlash (snapshot and replay
// commit), or its first difference falls at a near-tie (top-2 logit gap < 1e-3 in the tp = 1 run),
// which is reported — the rule of test/tensor-parallel.test.ts. Each stage's ranks read only their
// stage's layers and only their shard of them; the embedding only on the ranks 0 that need it; the
// final norm on both ranks of the last stage and its lm_head vocab-parallel (each rank its 4096 of
// the 8192 vocabulary rows; stage 0 has none). Disposing the pipeline leaves no stage process.
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  BUILTIN_PLUGIN_PACKAGES,
  loadDrafter,
  loadParallelTarget,
  loadTarget,
  PipelineModel,
  TensorParallelDrafter,
  TensorParallelModel,
  type LoadedTarget,
  type TensorRead,
} from '@specd/core';

import { TpEquivalence } from './tp-equivalence.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const TARGET = path.join(ROOT, 'models/kimi-k3-tiny');
const PLUGINS = BUILTIN_PLUGIN_PACKAGES;
const PROMPTS = ['The history of the city begins with', 'def fibonacci(n):'];
let whole: LoadedTarget;
let tpp: LoadedTarget;
let promptIds: Int32Array[];
let eq: TpEquivalence;

function alive(pid: number): boolean {
  try {
    return !fs.readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') Z ');
  } catch {
    return false;
  }
}

beforeAll(async () => {
  whole = await loadTarget(TARGET, PLUGINS);
  promptIds = PROMPTS.map((p) => whole.tokenizer.encode(p, { addSpecialTokens: false }));
  eq = new TpEquivalence(whole, promptIds, 'tp=2×pp=2');
  tpp = await loadParallelTarget(TARGET, PLUGINS, { tp: 2, pp: 2, lastStageEmbedding: true });
});

afterAll(() => {
  whole?.model.dispose();
  process.stdout.write(
    `tp×pp: ${eq.nearTies.length} near-tie difference(s)${eq.nearTies.map((n) => `\n  ${n}`).join('')}\n`,
  );
});

describe('tp = 2 × pp = 2 vs tp = 1, pp = 1 (greedy, 2 sequences batched)', () => {
  it('plain decoding', () => {
    expect(tpp.model).toBeInstanceOf(PipelineModel);
    expect((tpp.model as PipelineModel).last).toBeInstanceOf(TensorParallelModel);
    eq.expectEquivalent('plain', eq.generate(whole, undefined), eq.generate(tpp, undefined));
  });

  it('dflash (snapshot and replay commit)', async () => {
    const d1 = (await loadDrafter(path.join(ROOT, 'models/kimi-k3-tiny-dflash'), PLUGINS, whole, 256, 2)).drafter;
    const d2 = (await loadDrafter(path.join(ROOT, 'models/kimi-k3-tiny-dflash'), PLUGINS, tpp, 256, 2)).drafter;
    try {
      // the drafter lives on the last stage, sharded over its TP group
      expect(d2).toBeInstanceOf(TensorParallelDrafter);
      eq.expectEquivalent('dflash', eq.generate(whole, d1), eq.generate(tpp, d2));
      eq.expectEquivalent('dflash (replay commit)', eq.generate(whole, d1, 'replay'), eq.generate(tpp, d2, 'replay'));
    } finally {
      d1.dispose();
      d2.dispose();
    }
  });
});

describe("what each stage's ranks load", () => {
  const stage = (k: number) => (tpp.model as PipelineModel).stages[k]!;
  const reads = (k: number, rank: number): TensorRead[] => [...stage(k).ranks![rank]!.reads];
  const layersOf = (rs: readonly TensorRead[]) =>
    [
      ...new Set(
        rs.flatMap((r) => {
          const m = /^model\.layers\.(\d+)\./.exec(r.name);
          return m === null ? [] : [Number(m[1])];
        }),
      ),
    ].sort((a, b) => a - b);
  const others = (rs: readonly TensorRead[]) =>
    [...new Set(rs.map((r) => r.name).filter((n) => !n.startsWith('model.layers.')))].sort();

  it('stage 0 (a process, its rank 1 a thread of it) and the last stage (this process): two ranks each', () => {
    const pipe = tpp.model as PipelineModel;
    expect(pipe.stages.map((s) => [s.layerStart, s.layerEnd])).toEqual([
      [0, 4],
      [4, 8],
    ]);
    expect(stage(0).pid).toBeGreaterThan(0);
    expect(stage(0).pid).not.toBe(process.pid);
    for (const k of [0, 1]) {
      expect(stage(k).ranks!.map((r) => r.rank)).toEqual([0, 1]);
      expect(stage(k).ranks![0]!.threadId).toBeUndefined();
      expect(stage(k).ranks![1]!.threadId).toBeGreaterThan(0);
    }
    // kernel threads per process: max(1, ⌊CPUs / (tp · pp)⌋)
    if (process.env.SPECD_NUM_THREADS === undefined) {
      expect((pipe.last as TensorParallelModel).kernelThreads).toBe(
        Math.max(1, Math.floor(os.availableParallelism() / 4)),
      );
    }
  });

  it(
    'layers of the stage only; embedding on the ranks 0 that need ' +
      'it; last stage: norm on both, lm_head rows by vocabulary slice',
    () => {
      expect(layersOf(reads(0, 0))).toEqual([0, 1, 2, 3]);
      expect(layersOf(reads(0, 1))).toEqual([0, 1, 2, 3]);
      expect(layersOf(reads(1, 0))).toEqual([4, 5, 6, 7]);
      expect(layersOf(reads(1, 1))).toEqual([4, 5, 6, 7]);
      expect(others(reads(0, 0))).toEqual(['model.embed_tokens.weight']);
      expect(others(reads(0, 1))).toEqual([]);
      // the last stage: final norm and its lm_head slice on both ranks, the embedding (for the drafter) on rank 0
      expect(others(reads(1, 0))).toEqual(['lm_head.weight', 'model.embed_tokens.weight', 'model.norm.weight']);
      expect(others(reads(1, 1))).toEqual(['lm_head.weight', 'model.norm.weight']);
      for (const rank of [0, 1]) {
        expect(reads(1, rank).filter((r) => r.name === 'lm_head.weight')).toEqual([
          { name: 'lm_head.weight', rows: [rank * 4096, rank * 4096 + 4096] },
        ]);
      }
      expect(stage(0).tensors.filter((n) => !n.startsWith('model.layers.'))).toEqual(['model.embed_tokens.weight']);
    },
  );

  it('each rank its shard: MLA heads (layer 3, stage 0), KDA heads (layer 4, stage 1), experts', () => {
    const find = (k: number, rank: number, name: string) => reads(k, rank).filter((r) => r.name === name);
    for (const rank of [0, 1]) {
      const q = 'model.layers.3.self_attn.q_proj.weight';
      expect(find(0, rank, q)).toEqual([{ name: q, rows: [rank * 192, rank * 192 + 192] }]);
      const kq = 'model.layers.4.self_attn.q_proj.weight';
      expect(find(1, rank, kq)).toEqual([{ name: kq, rows: [rank * 128, rank * 128 + 128] }]);
      for (const k of [0, 1]) {
        const experts = [
          ...new Set(
            reads(k, rank).flatMap((r) => {
              const m = /\.experts\.(\d+)\./.exec(r.name);
              return m === null ? [] : [Number(m[1])];
            }),
          ),
        ].sort((a, b) => a - b);
        expect(experts).toEqual(rank === 0 ? [0, 1, 2, 3] : [4, 5, 6, 7]);
      }
    }
  });
});

describe('the CLI', () => {
  it('specd generate --tp 2 --pp 2 --json equals --tp 1 --pp 1; --tp 3 --pp 2 is refused naming the counts', () => {
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
      ) as { token_ids: number[] };
    eq.expectEquivalent('cli', [run([]).token_ids], [run(['--tp', '2', '--pp', '2']).token_ids]);
    let err = '';
    try {
      execFileSync(process.execPath, [bin, ...args, '--tp', '3', '--pp', '2'], {
        cwd: ROOT,
        encoding: 'utf8',
        stdio: 'pipe',
        timeout: 60_000,
      });
    } catch (e) {
      err = String((e as { stderr: string }).stderr);
    }
    expect(err).toMatch(/tp = 3 does not divide num_attention_heads/);
  }, 60_000);
});

describe('lifecycle', () => {
  it('dispose ends the stage processes', async () => {
    const pids = (tpp.model as PipelineModel).pids;
    expect(pids.every(alive)).toBe(true);
    tpp.model.dispose();
    const end = Date.now() + 5000;
    while (pids.some(alive) && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
    expect(pids.filter(alive)).toEqual([]);
  });
});
