/**
 * The GPU drafter's host side without a GPU: the plugin's choice of device (config refusals), and DFlashCudaDrafter's
 * bookkeeping against a recording stand-in for @specd/native-cuda's DFlash runner — weights uploaded (the draft head
 * gathered from the target's lm_head), packed taps and slots of context writes, a block's temporary pages reserved and
 * given back on every path, greedy ids and sampled drafts with q. The device math itself is tested on a GPU
 * (packages/native-cuda/test-gpu/dflash.test.mjs).
 */
import * as path from 'node:path';

import { HfConfig, SafetensorsCheckpoint, SeededRandom, type Drafter, type StageModel } from '@specd/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { DFlashCudaDrafter, DFlashDrafter, dflashDevice, dflashPlugin, type DFlashCudaAddon } from '../src/index.js';
import { DFLASH_DIR, loadTarget } from './helpers.js';

type Call = { name: string; args: unknown[] };

/** A stand-in runner: records every call; a block drafts token (5·s + j) mod vocab at slot j of sequence s. */
function fakeAddon(fail: { context?: boolean; block?: boolean; nanRow?: number } = {}): {
  addon: DFlashCudaAddon;
  calls: Call[];
} {
  const calls: Call[] = [];
  let maxBlocks = 0;
  let vocab = 0;
  let draftVocab = 0;
  let B = 0;
  let lastQ = new Float32Array(0);
  const rec = (name: string, args: unknown[]) => calls.push({ name, args });
  const addon = {
    dflashCreate: (o: { vocabSize: number; draftVocabSize: number; blockSize: number }) => {
      rec('dflashCreate', [o]);
      vocab = o.vocabSize;
      draftVocab = o.draftVocabSize;
      B = o.blockSize;
      return {} as never;
    },
    dflashAllocKv: (...a: unknown[]) => {
      rec('dflashAllocKv', a);
      maxBlocks = Math.ceil((a[3] as number) / (a[1] as number));
    },
    dflashSetWeight: (...a: unknown[]) => rec('dflashSetWeight', a),
    dflashContextWrite: (...a: unknown[]) => {
      rec('dflashContextWrite', a);
      if (fail.context === true) throw new RangeError('slots[0]: outside [0, numPages * pageSize)');
    },
    dflashBlock: (...a: unknown[]) => {
      rec('dflashBlock', a);
      if (fail.block === true) throw new Error('the block (cudaStreamSynchronize): cudaErrorLaunchFailure');
      const S = (a[1] as Int32Array).length;
      const ids = Int32Array.from(
        { length: S * (B - 1) },
        (_, i) => (5 * Math.floor(i / (B - 1)) + (i % (B - 1)) + 1) % vocab,
      );
      if (a[6] !== true) return { ids };
      const logits = new Float32Array(S * (B - 1) * draftVocab);
      for (let r = 0; r < S * (B - 1); r++) logits[r * draftVocab + ((3 * r) % draftVocab)] = 6;
      return { ids, logits };
    },
    dflashSample: (...a: unknown[]) => {
      rec('dflashSample', a);
      const req = a[1] as { groups: Int32Array; uniforms: Float64Array };
      const G = req.uniforms.length;
      const results = new Int32Array(2 * G);
      lastQ = new Float32Array(G * vocab);
      for (let g = 0; g < G; g++) {
        // row r's draw: draft index (3r) mod draftVocab, q a point mass there (its token id: the ids' entry)
        results[2 * g + 1] = fail.nanRow === g ? -1 : (3 * req.groups[4 * g]!) % draftVocab;
        lastQ[g * vocab + results[2 * g + 1]!] = 1;
      }
      return { results, qAddress: 4096n, ...(a[2] === true ? { probs: lastQ } : {}) };
    },
    dflashProbs: (...a: unknown[]) => {
      rec('dflashProbs', a);
      const [row, rows] = [a[1] as number, a[2] as number];
      return lastQ.slice(row * vocab, (row + rows) * vocab);
    },
    dflashSynchronize: () => {},
    dflashReplayMs: () => -1,
    dflashInfo: () => ({ weightBytes: 0, kvBytes: 0, activationBytes: 0, maxBlocks, graphs: [] }),
    dflashDispose: (...a: unknown[]) => rec('dflashDispose', a),
  } satisfies DFlashCudaAddon;
  return { addon, calls };
}

/** `target` with a `cudaDevice()` lending `addon` (what the CUDA Llama stage exposes). */
function onFakeGpu(target: StageModel, addon: DFlashCudaAddon): StageModel {
  const embedding = new Uint16Array(target.info.vocabSize * target.info.hiddenSize);
  return Object.assign(Object.create(target) as StageModel, { cudaDevice: () => ({ addon, embedding }) });
}

/**
 * The shipped kimi-k3-tiny DFlash checkpoint for `target` with `settings`; `full` makes every draft layer full
 * attention (the checkpoint's third layer slides, which the GPU drafter refuses).
 */
async function load(
  target: StageModel,
  settings: Record<string, unknown> = {},
  full = true,
  maxSequences = 2,
): Promise<Drafter> {
  const weights = SafetensorsCheckpoint.open(DFLASH_DIR);
  try {
    const raw = HfConfig.read(DFLASH_DIR).raw as Record<string, unknown>;
    const over = full ? { layer_types: ['full_attention', 'full_attention', 'full_attention'] } : {};
    const config = HfConfig.fromObject({ ...raw, ...over }, path.join(DFLASH_DIR, 'config.json'));
    return await dflashPlugin.load(
      { dir: DFLASH_DIR, config, weights },
      { target, maxSequences, maxTokensPerSequence: 256, settings },
    );
  } finally {
    weights.close();
  }
}

let target: StageModel;
beforeAll(() => {
  target = loadTarget();
});
afterAll(() => target.dispose?.());

describe('the device setting', () => {
  it('parses auto / cpu / cuda and refuses anything else', () => {
    expect(dflashDevice(undefined)).toBe('auto');
    expect(dflashDevice('cuda')).toBe('cuda');
    expect(() => dflashDevice('gpu')).toThrow(/settings\.device: expected one of "auto", "cpu", "cuda", got "gpu"/);
  });

  it('a CPU target gets the CPU drafter (auto, cpu); "cuda" is refused naming the fix', async () => {
    for (const device of [undefined, 'auto', 'cpu']) {
      const d = await load(target, device === undefined ? {} : { device });
      expect(d).toBeInstanceOf(DFlashDrafter);
      d.dispose();
    }
    await expect(load(target, { device: 'cuda' })).rejects.toThrow(
      /device "cuda": the target stage does not run on a GPU/,
    );
  });

  it('a target on a GPU gets the GPU drafter unless device is "cpu" or a draft layer slides', async () => {
    const { addon, calls } = fakeAddon();
    const gpu = onFakeGpu(target, addon);
    const d = (await load(gpu)) as DFlashCudaDrafter;
    expect(d).toBeInstanceOf(DFlashCudaDrafter);
    const sets = calls.filter((c) => c.name === 'dflashSetWeight');
    const global = sets.filter((c) => c.args[2] === -1).map((c) => c.args[1]);
    expect(global.sort()).toEqual(['embed', 'fc', 'finalNorm', 'hiddenNorm', 'ids', 'lmHead']);
    for (let j = 0; j < 3; j++)
      expect(
        sets
          .filter((c) => c.args[2] === j)
          .map((c) => c.args[1])
          .sort(),
      ).toEqual(['down', 'gateUp', 'inputNorm', 'kNorm', 'o', 'postNorm', 'qNorm', 'qkv']);
    // the draft head: the target lm_head's rows, as bf16 bits (whole vocabulary: ids 0 … V − 1)
    const V = target.info.vocabSize;
    const D = target.info.hiddenSize;
    const head = sets.find((c) => c.args[1] === 'lmHead')!.args[3] as Uint16Array;
    expect(head.length).toBe(V * D);
    const e = new Float32Array(D);
    e[3] = 1;
    const col = target.lmHead!(e, 1); // W[:, 3]
    const bits = new Uint32Array(1);
    const asF32 = new Float32Array(bits.buffer);
    for (const v of [0, 17, V - 1]) {
      bits[0] = head[v * D + 3]! << 16;
      expect(asF32[0]).toBe(col[v]);
    }
    expect(Array.from((sets.find((c) => c.args[1] === 'ids')!.args[3] as Int32Array).subarray(0, 4))).toEqual([
      0, 1, 2, 3,
    ]);
    d.dispose();
    expect(calls.at(-1)?.name).toBe('dflashDispose');
    const cpu = await load(gpu, { device: 'cpu' });
    expect(cpu).toBeInstanceOf(DFlashDrafter);
    cpu.dispose();
    // the checkpoint as shipped (a sliding layer): auto stays on the CPU, "cuda" is refused
    const sliding = await load(gpu, {}, false);
    expect(sliding).toBeInstanceOf(DFlashDrafter);
    sliding.dispose();
    await expect(load(gpu, { device: 'cuda' }, false)).rejects.toThrow(/sliding-window draft layers run on the CPU/);
    await expect(load(gpu, { device: 'cuda', draft_head: 'packed' })).rejects.toThrow(/draft_head "packed"/);
  });
});

describe('DFlashCudaDrafter (host side, a stand-in runner)', () => {
  const D = () => target.info.hiddenSize;

  async function setup(fail: { context?: boolean; block?: boolean; nanRow?: number } = {}) {
    const { addon, calls } = fakeAddon(fail);
    const d = (await load(onFakeGpu(target, addon))) as DFlashCudaDrafter;
    return { d, calls };
  }

  /** Writes a context of `n` rows for `id` through projectTargetHiddenPartial → writeProjectedContextKV. */
  function writeContext(d: DFlashCudaDrafter, id: string, n: number): Float32Array {
    const taps = new Map(d.config.taps.map((t, i) => [t, Float32Array.from({ length: n * D() }, (_, e) => i + e)]));
    const packed = d.projectTargetHiddenPartial(taps, n);
    d.writeProjectedContextKV(packed, [{ id, position: 0, numTokens: n }]);
    return packed;
  }

  const seq = (id: string, position: number, maxDrafts: number, temperature = 0) => ({
    id,
    position,
    lastToken: 5,
    maxDrafts,
    history: new Int32Array(position + 1),
    sampling: { temperature },
    rng: new SeededRandom(1),
  });

  it('context writes pass packed taps and slots; blocks reserve B rows and give them back', async () => {
    const { d, calls } = await setup();
    const T = d.config.taps.length;
    const B = d.config.blockSize;
    d.addSequence('a');
    d.addSequence('b');
    const packed = writeContext(d, 'a', 20);
    writeContext(d, 'b', 3);
    expect(packed.length).toBe(20 * T * D());
    expect(packed[(1 * T + 2) * D()]).toBe(2 + D()); // row 1, tap 2's block = tap 2's row 1
    const w = calls.find((c) => c.name === 'dflashContextWrite')!.args;
    expect(w[2]).toBe(true);
    expect(Array.from(w[3] as Int32Array)).toEqual(Array.from({ length: 20 }, (_, i) => i));
    expect((w[4] as Int32Array).length).toBe(20);
    const pages = d.pagesInUse;
    expect(pages).toBe(3);
    const props = d.propose({ sequences: [seq('a', 20, 15), seq('b', 3, 4)] });
    const blk = calls.find((c) => c.name === 'dflashBlock')!.args;
    expect(Array.from(blk[1] as Int32Array)).toEqual([5, 5]);
    expect(Array.from(blk[2] as Int32Array)).toEqual([20, 3]);
    const slots = blk[4] as Int32Array;
    expect(slots.length).toBe(2 * B);
    // sequence a's block rows at positions 20 … 35: its page 1 holds 16 … 31, page 2 holds 32 … 35
    const table = blk[3] as Int32Array;
    expect(slots[0]).toBe(table[1]! * 16 + 4);
    expect(slots[12]).toBe(table[2]! * 16 + 0);
    expect(blk[6]).toBe(false); // greedy: no logits
    expect(Array.from(props[0]!.tokens)).toEqual(Array.from({ length: 15 }, (_, j) => j + 1));
    expect(Array.from(props[1]!.tokens)).toEqual([6, 7, 8, 9]);
    expect(d.pagesInUse).toBe(pages);
    expect(d.contextLength('a')).toBe(20);
    // sampled: drawn on the device from the same block (one uniform of the request's generator per draft), q over
    // the whole vocabulary; a greedy sequence in the same batch keeps its argmax drafts
    const [q, greedy] = d.propose({ sequences: [seq('a', 20, 3, 0.7), seq('b', 3, 2)] });
    const sample = calls.filter((c) => c.name === 'dflashSample').at(-1)!.args[1] as {
      groups: Int32Array;
      temperature: Float64Array;
      uniforms: Float64Array;
    };
    expect(Array.from(sample.groups)).toEqual([0, 0, -1, 0, 1, 0, -1, 0, 2, 0, -1, 0]);
    expect(Array.from(sample.temperature)).toEqual([0.7, 0.7, 0.7]);
    const rng = new SeededRandom(1);
    expect(Array.from(sample.uniforms)).toEqual([rng.next(), rng.next(), rng.next()]);
    expect(Array.from(q!.tokens)).toEqual([0, 3, 6]); // whole vocabulary: index = id
    const V = target.info.vocabSize;
    // q stays on the device (the stage reads it there); reading probs copies rows [0, 3) back, once
    expect(q!.deviceProbs).toEqual({ device: 'cuda', address: 4096n });
    expect(calls.filter((c) => c.name === 'dflashProbs').length).toBe(0);
    expect(q!.probs!.length).toBe(3 * V);
    for (let j = 0; j < 3; j++) expect(q!.probs![j * V + q!.tokens[j]!]).toBe(1);
    expect(calls.filter((c) => c.name === 'dflashProbs').map((c) => c.args.slice(1))).toEqual([[0, 3]]);
    expect(greedy!.probs).toBeUndefined();
    expect(Array.from(greedy!.tokens)).toEqual([6, 7]);
    // two sampled sequences: the second's q starts at its first row; a stale proposal's q is refused
    const [a2, b2] = d.propose({ sequences: [seq('a', 20, 2, 0.7), seq('b', 3, 3, 0.9)] });
    expect(b2!.deviceProbs!.address).toBe(4096n + BigInt(2 * V * 4));
    d.propose({ sequences: [seq('a', 20, 1, 0.7)] });
    expect(() => a2!.probs).toThrow(/read after a later sampled propose/);
    expect(d.pagesInUse).toBe(pages);
    d.freeSequence('a');
    d.freeSequence('b');
    expect(d.pagesInUse).toBe(0);
    d.dispose();
    expect(() => d.propose({ sequences: [seq('a', 20, 3)] })).toThrow(/disposed/);
  });

  it("a draft row that is not finite ends that sequence's drafts there, greedy or sampled", async () => {
    const { d } = await setup({ nanRow: 1 });
    d.addSequence('n');
    writeContext(d, 'n', 4);
    const [p] = d.propose({ sequences: [seq('n', 4, 3, 0.5)] });
    expect(p!.tokens.length).toBe(1);
    expect(p!.probs!.length).toBe(target.info.vocabSize);
    expect(p!.deviceProbs?.address).toBe(4096n);
    d.freeSequence('n');
    d.dispose();
  });

  it('gives the pages back when the device refuses a context write or a block fails', async () => {
    const a = await setup({ context: true });
    a.d.addSequence('x');
    expect(() => writeContext(a.d, 'x', 5)).toThrow(/slots\[0\]/);
    expect(a.d.pagesInUse).toBe(0);
    expect(a.d.contextLength('x')).toBe(0);
    a.d.dispose();
    const b = await setup({ block: true });
    b.d.addSequence('y');
    writeContext(b.d, 'y', 16);
    const before = b.d.pagesInUse;
    expect(() => b.d.propose({ sequences: [seq('y', 16, 4)] })).toThrow(/cudaErrorLaunchFailure/);
    expect(b.d.pagesInUse).toBe(before);
    expect(b.d.contextLength('y')).toBe(16);
    b.d.freeSequence('y');
    expect(b.d.pagesInUse).toBe(0);
    b.d.dispose();
  });

  it('refuses a partial projection, a foreign tap, a wrong sum, a stale position and too many drafts', async () => {
    const { d } = await setup();
    d.addSequence('z');
    const taps = new Map(d.config.taps.map((t) => [t, new Float32Array(2 * D())]));
    expect(() => d.projectTargetHiddenPartial(taps, 2, new Float32Array(2 * D()))).toThrow(/partial projection/);
    expect(() => d.projectTargetHiddenPartial(new Map([[999, new Float32Array(2 * D())]]), 2)).toThrow(
      /tap 999 is not one of/,
    );
    expect(() => d.writeProjectedContextKV(new Float32Array(7), [{ id: 'z', position: 0, numTokens: 1 }])).toThrow(
      new RegExp(`sum: expected \\[1, ${D()}\\] f32, got length 7`),
    );
    // projected features from elsewhere ([n, D]) are written as they are
    d.writeProjectedContextKV(new Float32Array(2 * D()), [{ id: 'z', position: 0, numTokens: 2 }]);
    expect(() => d.propose({ sequences: [seq('z', 3, 2)] })).toThrow(/not the draft context length/);
    expect(() => d.propose({ sequences: [seq('z', 2, 16)] })).toThrow(/maxDrafts/);
    d.freeSequence('z');
    expect(d.pagesInUse).toBe(0);
    d.dispose();
  });
});
