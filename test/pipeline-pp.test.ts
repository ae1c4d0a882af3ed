// Pipeline parallelism with stages as processes (packages/core/src/pipeline).
// With the shipped Kimi target (8 layers) split into 2 or 3 stages — [4,4] (EAGLE-3's tap 4 is the
// output of layer 3: exactly on the stage boundary, owned by stage 0), [3,5] (uneven), [2,3,3]
// (EAGLE-3's taps [2,4,5]: the last stage owns none) — greedy SpecEngine output is token-for-token
// pp = 1's, for every shipped drafter and for plain decoding; each stage loads only its layers; a
// killed stage fails the request naming the stage, and no stage process is left behind. Stages talk
// to the driver over ZeroMQ (the default transport); the FIFO transport (`transport: 'fifo'`) is run
// for one partition and for the killed stage.
import { execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  BUILTIN_PLUGIN_PACKAGES,
  defaultPartition,
  liveStagePids,
  loadDrafter,
  loadPipelineTarget,
  loadTarget,
  type PipelineModel,
  SequenceCache,
  SpecEngine,
  stageTaps,
  type Drafter,
  type ForwardResult,
  type LoadedTarget,
} from '@specd/core';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const TARGET = path.join(ROOT, 'models/kimi-k3-tiny');
const DRAFTERS = ['dflash', 'dspark', 'eagle3'] as const;
const PLUGINS = BUILTIN_PLUGIN_PACKAGES;
const PROMPT = 'The history of the city begins with';
const MAX_TOKENS = 20;

let whole: LoadedTarget;
let promptIds: Int32Array;
/** pp = 1 greedy outputs: 'plain' and per drafter. */
const reference = new Map<string, number[]>();
/** Each drafter's taps in checkpoint (fc column block) order. */
const drafterTaps = new Map<string, readonly number[]>();

function generate(target: LoadedTarget, drafter: Drafter | undefined, commit?: 'replay'): number[] {
  const engine = new SpecEngine(target.model, drafter, {
    maxSequences: 1,
    maxTokensPerSequence: 256,
    draftPolicy: 'max',
    prefillChunk: 4,
    ...(commit === undefined ? {} : { commit }),
  });
  const [r] = engine.run([
    { id: 'r', promptIds, maxTokens: MAX_TOKENS, sampling: { temperature: 0 }, seed: 1, ignoreEos: true },
  ]);
  return r!.tokenIds;
}

async function drafterFor(target: LoadedTarget, method: string): Promise<Drafter> {
  return (await loadDrafter(path.join(ROOT, 'models', `kimi-k3-tiny-${method}`), PLUGINS, target, 256)).drafter;
}

/** One prefill forward of the prompt with `taps` on a scratch cache (freed after). */
function prefillWithTaps(target: LoadedTarget, taps: readonly number[]): ForwardResult {
  const options = { pageSize: 16, numPages: 8, numSlots: 1 };
  const cache = target.model.createCache?.(options) ?? new SequenceCache(target.model.cacheGeometry, options);
  cache.add('taps');
  try {
    return target.model.forward(
      { sequences: [{ id: 'taps', position: 0, tokens: promptIds, logits: 'none', phase: 'prefill' }] },
      cache,
      { taps },
    );
  } finally {
    cache.finish('taps');
  }
}

function alive(pid: number): boolean {
  try {
    return !fs.readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') Z ');
  } catch {
    return false;
  }
}

beforeAll(async () => {
  whole = await loadTarget(TARGET, PLUGINS);
  promptIds = whole.tokenizer.encode(PROMPT, { addSpecialTokens: false });
  reference.set('plain', generate(whole, undefined));
  for (const m of DRAFTERS) {
    const d = await drafterFor(whole, m);
    reference.set(m, generate(whole, d));
    drafterTaps.set(m, d.captureSetter(whole.model.info));
    if (m === 'dflash') reference.set('dflash-replay', generate(whole, d, 'replay'));
    d.dispose();
  }
});

afterAll(() => {
  whole?.model.dispose();
});

describe('partition', () => {
  it("vLLM's default split puts the remainder on the stages before the last", () => {
    expect(defaultPartition(8, 2)).toEqual([4, 4]);
    expect(defaultPartition(8, 3)).toEqual([3, 3, 2]);
    expect(defaultPartition(10, 4)).toEqual([2, 3, 3, 2]);
    expect(defaultPartition(9, 4)).toEqual([2, 2, 3, 2]);
    expect(() => defaultPartition(8, 9)).toThrow(/only 8 layers/);
  });
});

describe.each([{ partition: [4, 4] }, { partition: [3, 5] }, { partition: [2, 3, 3] }])(
  'pipeline $partition',
  ({ partition }) => {
    let pipe: LoadedTarget;
    let model: PipelineModel;
    beforeAll(async () => {
      pipe = await loadPipelineTarget(TARGET, PLUGINS, { pp: partition.length, partition }); // ZeroMQ
      model = pipe.model as PipelineModel;
    });
    afterAll(() => pipe?.model.dispose());

    it(
      'each stage loads only its layers; the first the embedding, the ' +
        'last the final norm, lm_head (and the embedding, for drafters)',
      () => {
        const L = 8;
        expect(model.stages.map((s) => s.layerEnd - s.layerStart)).toEqual(partition);
        model.stages.forEach((s, k) => {
          const layers = new Set(s.tensors.flatMap((t) => /^model\.layers\.(\d+)\./.exec(t)?.[1] ?? []).map(Number));
          expect([...layers].sort((a, b) => a - b)).toEqual(
            Array.from({ length: s.layerEnd - s.layerStart }, (_, i) => s.layerStart + i),
          );
          const isLast = k === model.stages.length - 1;
          // the last: drafters reuse it
          expect(s.tensors.includes('model.embed_tokens.weight')).toBe(k === 0 || isLast);
          expect(s.tensors.includes('model.norm.weight')).toBe(isLast);
          expect(s.tensors.includes('lm_head.weight')).toBe(isLast);
          expect(s.pid === undefined).toBe(isLast);
          expect(s.layerEnd <= L).toBe(true);
        });
      },
    );

    it('plain greedy decoding equals pp = 1', () => {
      expect(generate(pipe, undefined)).toEqual(reference.get('plain'));
    });

    it.each(DRAFTERS)('%s: greedy speculative output equals pp = 1', async (method) => {
      const d = await drafterFor(pipe, method);
      try {
        const taps = d.captureSetter(model.info);
        const owned = model.stages.map((s) =>
          stageTaps(taps, { layerStart: s.layerStart, layerEnd: s.layerEnd, isFirst: s.layerStart === 0 }),
        );
        expect(owned.flat().sort((a, b) => a - b)).toEqual([...taps].sort((a, b) => a - b));
        // tap on the boundary: stage 0
        if (method === 'eagle3' && partition.join() === '4,4') expect(owned[0]).toContain(4);
        if (method === 'eagle3' && partition.join() === '2,3,3') expect(owned[2]).toEqual([]); // a stage without taps
        // every stage before the last loaded the fc column blocks of the taps it produces, nothing else
        const D = model.info.hiddenSize;
        const all = drafterTaps.get(method)!;
        expect(model.projectionReads).toHaveLength(model.stages.length - 1);
        model.projectionReads.forEach((reads, k) => {
          const want = owned[k]!.map((t) => ({
            name: 'fc.weight',
            cols: [all.indexOf(t) * D, (all.indexOf(t) + 1) * D],
          }));
          expect(reads).toEqual(want);
        });
        // the stages hand on an fp32 accumulator, not their taps; with the last stage's own taps it is
        // bitwise the pp = 1 projection
        const res = prefillWithTaps(pipe, taps);
        const lastOwned = owned[owned.length - 1]!;
        expect([...res.taps.keys()]).toEqual(lastOwned);
        const early = owned.slice(0, -1).flat();
        expect(res.projection !== undefined).toBe(early.length > 0);
        const n = promptIds.length;
        const viaStages = d.projectTargetHiddenPartial(res.taps, n, res.projection?.slice());
        const ref = d.projectTargetHiddenPartial(prefillWithTaps(whole, taps).taps, n);
        expect(new Uint32Array(viaStages.buffer)).toEqual(new Uint32Array(ref.buffer));
        // dropped (a drafter whose plugin cannot split its projection): raw taps again, same bits
        model.distributeProjection(undefined);
        const raw = prefillWithTaps(pipe, taps);
        expect(raw.projection).toBeUndefined();
        expect([...raw.taps.keys()].sort((a, b) => a - b)).toEqual([...taps].sort((a, b) => a - b));
        expect(new Uint32Array(d.projectTargetHiddenPartial(raw.taps, n).buffer)).toEqual(new Uint32Array(ref.buffer));
        expect(generate(pipe, d)).toEqual(reference.get(method));
      } finally {
        d.dispose();
      }
    });

    it('dflash, commit by checkpoint + replay (rollback mirrored on every stage): equals pp = 1', async () => {
      const d = await drafterFor(pipe, 'dflash');
      try {
        expect(generate(pipe, d, 'replay')).toEqual(reference.get('dflash-replay'));
      } finally {
        d.dispose();
      }
    });
  },
);

describe('the FIFO transport', () => {
  it('[3, 5] over FIFOs: plain and DFlash greedy output equal pp = 1', async () => {
    const pipe = await loadPipelineTarget(TARGET, PLUGINS, { pp: 2, partition: [3, 5], transport: 'fifo' });
    try {
      const args = execFileSync('ps', ['-o', 'args=', '-p', String((pipe.model as PipelineModel).pids[0])], {
        encoding: 'utf8',
      });
      expect(args).toMatch(/stage-worker\.js fifo /);
      expect(generate(pipe, undefined)).toEqual(reference.get('plain'));
      const d = await drafterFor(pipe, 'dflash');
      expect(generate(pipe, d)).toEqual(reference.get('dflash'));
      d.dispose();
    } finally {
      pipe.model.dispose();
    }
  });
});

describe.each(['zmq', 'fifo'] as const)('stage failure (%s)', (transport) => {
  it(
    'killing a stage process mid-generation fails the ' + 'request naming the stage; no stage process is left',
    async () => {
      const pipe = await loadPipelineTarget(TARGET, PLUGINS, { pp: 3, partition: [2, 3, 3], transport });
      const model = pipe.model as PipelineModel;
      const pids = model.pids;
      expect(pids).toHaveLength(2);
      expect(execFileSync('ps', ['-o', 'args=', '-p', String(pids[0])], { encoding: 'utf8' })).toContain(
        `stage-worker.js ${transport} `,
      );
      const d = await drafterFor(pipe, 'dflash');
      const engine = new SpecEngine(model, d, {
        maxSequences: 1,
        maxTokensPerSequence: 256,
        draftPolicy: 'max',
        prefillChunk: 4,
      });
      let n = 0;
      expect(() =>
        engine.run([
          {
            id: 'k',
            promptIds,
            maxTokens: MAX_TOKENS,
            sampling: { temperature: 0 },
            seed: 1,
            ignoreEos: true,
            onToken: () => {
              if (++n === 3) process.kill(pids[1]!, 'SIGKILL');
            },
          },
        ]),
      ).toThrow(new RegExp(`pipeline stage 1 \\(layers 2–4, pid ${pids[1]}\\) was killed by SIGKILL`));
      // later requests fail the same way (a failed prefill fails its request alone: finish reason error)
      const [later] = new SpecEngine(model, undefined, { maxSequences: 1, maxTokensPerSequence: 256 }).run([
        { id: 'l', promptIds, maxTokens: 4, sampling: { temperature: 0 }, seed: 1 },
      ]);
      expect(later?.finishReason).toBe('error');
      expect(later?.error?.message).toMatch(/pipeline stage 1 \(layers 2–4, pid \d+\) was killed by SIGKILL/);
      expect(model.failure()).toBeDefined();
      d.dispose();
      model.dispose();
      for (let i = 0; i < 200 && pids.some(alive); i++) await new Promise((r) => setTimeout(r, 10));
      expect(pids.filter(alive)).toEqual([]);
      expect(liveStagePids()).toEqual([]);
    },
  );
});

describe('specd generate --pp', () => {
  it('--pp 2 --json gives the token ids of --pp 1 and leaves no stage process', () => {
    const run = (pp: string[]) =>
      JSON.parse(
        execFileSync(
          process.execPath,
          [
            path.join(ROOT, 'packages/core/src/cli/bin.js'),
            'generate',
            ...pp,
            '--json',
            '--prompt',
            PROMPT,
            '--max-tokens',
            '16',
            '--num-draft-tokens',
            '4',
            '--seed',
            '1',
          ],
          { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 60_000 },
        ),
      ) as { token_ids: number[]; method: string }; // exits by itself
    const one = run(['--pp', '1']);
    const two = run(['--pp', '2']);
    expect(two.method).toBe('dflash');
    expect(two.token_ids).toEqual(one.token_ids);
    const three = run(['--pp', '3', '--pp-partition', '3,4,1']);
    expect(three.token_ids).toEqual(one.token_ids);
    const left = execFileSync('ps', ['-eo', 'args'], { encoding: 'utf8' })
      .split('\n')
      .filter((l) => l.includes(`${path.sep}stage-worker.js`) && l.includes('specd-pp-'));
    expect(left).toEqual([]);
  });

  it.each(['SIGINT', 'SIGTERM'] as const)(
    '%s stops a long --pp 2 generate by the signal (not after it finished) and leaves no stage process',
    async (sig) => {
      const child = spawn(
        process.execPath,
        [
          path.join(ROOT, 'packages/core/src/cli/bin.js'),
          'generate',
          '--pp',
          '2',
          '--prompt',
          PROMPT,
          '--max-tokens',
          '2000',
          '--ignore-eos',
        ],
        { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] },
      );
      const exited = new Promise<[number | null, NodeJS.Signals | null]>((resolve) =>
        child.once('exit', (code, signal) => resolve([code, signal])),
      );
      await new Promise<void>((resolve) =>
        child.stdout.on('data', () => {
          resolve(); // the first streamed text: generation is under way
        }),
      );
      const stagePids = execFileSync('ps', ['-o', 'pid=', '--ppid', String(child.pid)], { encoding: 'utf8' })
        .split('\n')
        .map((l) => Number(l.trim()))
        .filter((p) => p > 0);
      expect(stagePids.length).toBeGreaterThan(0);
      child.kill(sig);
      const [code, signal] = await exited;
      // a handler that waited for the loop would exit 0 after 2000 tokens
      expect({ code, signal }).toEqual({ code: null, signal: sig });
      for (let i = 0; i < 300 && stagePids.some(alive); i++) await new Promise((r) => setTimeout(r, 10));
      expect(stagePids.filter(alive)).toEqual([]);
    },
  );
});
