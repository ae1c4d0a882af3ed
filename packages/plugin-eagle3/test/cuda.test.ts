/**
 * The GPU drafter's host side without a GPU: the plugin's choice of device (config refusals), and
 * Eagle3CudaDrafter's bookkeeping against a recording stand-in for @specd/native-cuda's EAGLE-3 runner — weights
 * uploaded, packed taps, slots and g slots of context writes, the chain's temporary pages reserved and given back on
 * every path, sampled drafts with q. The device math itself is tested on a GPU (packages/native-cuda/test-gpu/
 * eagle3.test.mjs).
 */
import { SeededRandom, type StageModel } from '@specd/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { Eagle3CudaDrafter, Eagle3Drafter, parseEagle3Settings, type Eagle3CudaAddon } from '../src/index.js';
import { loadDrafter, loadTarget } from './helpers.js';

type Call = { name: string; args: unknown[] };

/** A stand-in runner: records every call; chains return draft id (7·s + j) mod draftVocab at step j. */
function fakeAddon(fail: { context?: boolean; chain?: boolean } = {}): { addon: Eagle3CudaAddon; calls: Call[] } {
  const calls: Call[] = [];
  let maxBlocks = 0;
  let draftVocab = 0;
  let vocab = 0;
  const rec = (name: string, args: unknown[]) => calls.push({ name, args });
  const addon = {
    eagle3Create: (o: { draftVocabSize: number; vocabSize: number }) => {
      rec('eagle3Create', [o]);
      draftVocab = o.draftVocabSize;
      vocab = o.vocabSize;
      return {} as never;
    },
    eagle3AllocKv: (...a: unknown[]) => {
      rec('eagle3AllocKv', a);
      maxBlocks = Math.ceil((a[3] as number) / (a[1] as number));
    },
    eagle3SetWeight: (...a: unknown[]) => rec('eagle3SetWeight', a),
    eagle3ContextWrite: (...a: unknown[]) => {
      rec('eagle3ContextWrite', a);
      if (fail.context === true) throw new RangeError('slots[0]: outside [0, numPages * pageSize)');
    },
    eagle3Chain: (...a: unknown[]) => {
      rec('eagle3Chain', a);
      if (fail.chain === true) throw new Error('the chain (cudaStreamSynchronize): cudaErrorLaunchFailure');
      const S = (a[1] as Int32Array).length;
      const K = a[7] as number;
      return Int32Array.from({ length: S * K }, (_, i) => (7 * Math.floor(i / K) + (i % K) + 1) % draftVocab);
    },
    eagle3Step: (...a: unknown[]) => {
      rec('eagle3Step', a);
      const S = (a[2] as Int32Array).length;
      const logits = new Float32Array(S * draftVocab);
      for (let s = 0; s < S; s++) logits[s * draftVocab + ((3 * s + (a[1] as number)) % draftVocab)] = 5;
      return { argmax: new Int32Array(S), logits };
    },
    // sampled step j: sequence s draws draft id (3s + j) mod draftVocab, q a point mass there
    eagle3StepSample: (...a: unknown[]) => {
      // the runner copies its arguments: so does the record (the drafter refills its token array each step)
      rec(
        'eagle3StepSample',
        a.map((x) => (x instanceof Int32Array ? x.slice() : x)),
      );
      const S = (a[2] as Int32Array).length;
      const j = a[1] as number;
      return { ids: Int32Array.from({ length: S }, (_, s) => (3 * s + j) % draftVocab), qAddress: 8192n };
    },
    eagle3Probs: (...a: unknown[]) => {
      rec('eagle3Probs', a);
      return new Float32Array((a[2] as number) * vocab).fill(1 / vocab);
    },
    eagle3Synchronize: () => {},
    eagle3ReplayMs: () => -1,
    eagle3Info: () => ({ weightBytes: 0, kvBytes: 0, activationBytes: 0, maxBlocks, graphs: [] }),
    eagle3Dispose: (...a: unknown[]) => rec('eagle3Dispose', a),
  } satisfies Eagle3CudaAddon;
  return { addon, calls };
}

/** `target` with a `cudaDevice()` lending `addon` (what the CUDA Llama stage exposes). */
function onFakeGpu(target: StageModel, addon: Eagle3CudaAddon): StageModel {
  const embedding = new Uint16Array(target.info.vocabSize * target.info.hiddenSize);
  return Object.assign(Object.create(target) as StageModel, { cudaDevice: () => ({ addon, embedding }) });
}

let target: StageModel;
beforeAll(() => {
  target = loadTarget();
});
afterAll(() => target.dispose?.());

describe('the device setting', () => {
  it('parses auto / cpu / cuda and refuses anything else', () => {
    expect(parseEagle3Settings({ device: 'cuda' }).device).toBe('cuda');
    expect(() => parseEagle3Settings({ device: 'gpu' })).toThrow(/settings\.device: expected one of "auto", "cpu"/);
  });

  it('a CPU target gets the CPU drafter (auto, cpu); "cuda" is refused naming the fix', async () => {
    for (const device of [undefined, 'auto', 'cpu']) {
      const d = await loadDrafter(target, device === undefined ? {} : { settings: { device } });
      expect(d).toBeInstanceOf(Eagle3Drafter);
      d.dispose();
    }
    await expect(loadDrafter(target, { settings: { device: 'cuda' } })).rejects.toThrow(
      /drafter\.device "cuda": the target stage does not run on a GPU/,
    );
  });

  it('a target on a GPU gets the GPU drafter unless device is "cpu"', async () => {
    const { addon, calls } = fakeAddon();
    const gpu = onFakeGpu(target, addon);
    const d = (await loadDrafter(gpu)) as unknown as Eagle3CudaDrafter;
    expect(d).toBeInstanceOf(Eagle3CudaDrafter);
    const names = calls.filter((c) => c.name === 'eagle3SetWeight').map((c) => c.args[1]);
    expect(names.sort()).toEqual(
      [
        'd2t',
        'down',
        'embed',
        'fc',
        'finalNorm',
        'gateUp',
        'hiddenNorm',
        'inputNorm',
        'lmHead',
        'o',
        'postNorm',
        'qkv',
      ].sort(),
    );
    d.dispose();
    expect(calls.at(-1)?.name).toBe('eagle3Dispose');
    const cpu = await loadDrafter(gpu, { settings: { device: 'cpu' } });
    expect(cpu).toBeInstanceOf(Eagle3Drafter);
    cpu.dispose();
  });
});

describe('Eagle3CudaDrafter (host side, a stand-in runner)', () => {
  const D = () => target.info.hiddenSize;

  async function setup(fail: { context?: boolean; chain?: boolean } = {}) {
    const { addon, calls } = fakeAddon(fail);
    const d = (await loadDrafter(onFakeGpu(target, addon), { maxSequences: 2 })) as unknown as Eagle3CudaDrafter;
    return { d, calls };
  }

  /** Writes a context of `n` rows for `id` through projectTargetHiddenPartial → writeProjectedContextKV. */
  function writeContext(d: Eagle3CudaDrafter, id: string, n: number): Float32Array {
    const taps = new Map(d.config.taps.map((t, i) => [t, Float32Array.from({ length: n * D() }, (_, e) => i + e)]));
    const packed = d.projectTargetHiddenPartial(taps, n);
    d.writeProjectedContextKV(packed, [{ id, position: 0, numTokens: n, nextTokens: new Int32Array(n).fill(3) }]);
    return packed;
  }

  it('context writes pass packed taps, slots and the last row g slot; chains reserve and give back pages', async () => {
    const { d, calls } = await setup();
    const T = d.config.taps.length;
    d.addSequence('a');
    const packed = writeContext(d, 'a', 20);
    expect(packed.length).toBe(20 * T * D());
    // row 1, tap 2 block = tap 2's row 1
    expect(packed[(1 * T + 2) * D()]).toBe(2 + D());
    const w = calls.find((c) => c.name === 'eagle3ContextWrite')!.args;
    expect(w[2]).toBe(true);
    // only the last row keeps its g, in the sequence's slot (the first added sequence gets slot 0)
    expect(Array.from(w[6] as Int32Array)).toEqual([...new Array<number>(19).fill(-1), 0]);
    const pages = d.pagesInUse;
    expect(pages).toBe(2);
    const seq = {
      id: 'a',
      position: 20,
      lastToken: 5,
      maxDrafts: 6,
      history: new Int32Array(21),
      sampling: { temperature: 0 },
      rng: new SeededRandom(1),
    };
    const [p] = d.propose({ sequences: [seq] });
    const chain = calls.find((c) => c.name === 'eagle3Chain')!.args;
    expect(chain[7]).toBe(6);
    const stepSlots = chain[5] as Int32Array;
    expect(stepSlots.length).toBe(5);
    // step j ≥ 2 at position 20 + j − 2: slots 20 … 24 of the sequence's pages (page 1 holds 16 … 31)
    const table = chain[4] as Int32Array;
    expect(Array.from(stepSlots)).toEqual([20, 21, 22, 23, 24].map((pos) => table[1]! * 16 + (pos % 16)));
    expect(Array.from(p!.tokens)).toEqual([1, 2, 3, 4, 5, 6].map((x) => d.draftToTarget[x]));
    expect(d.pagesInUse).toBe(pages);
    expect(d.contextLength('a')).toBe(20);
    // sampled: one device step per call, each drawn there with one draw of the request's generator; q stays on the
    // device and comes back only when probs is read
    const [q] = d.propose({ sequences: [{ ...seq, sampling: { temperature: 0.7 }, maxDrafts: 3 }] });
    const steps = calls.filter((c) => c.name === 'eagle3StepSample');
    expect(steps.map((c) => c.args[1])).toEqual([1, 2, 3]);
    const rng = new SeededRandom(1);
    const u = steps.map((c) => (c.args[8] as { uniforms: Float64Array }).uniforms[0]);
    expect(u).toEqual([rng.next(), rng.next(), rng.next()]);
    // step j's draft feeds step j + 1 as its target id
    expect((steps[1]!.args[3] as Int32Array)[0]).toBe(d.draftToTarget[1]);
    expect(Array.from(q!.tokens)).toEqual([1, 2, 3].map((x) => d.draftToTarget[x]));
    expect(q!.deviceProbs).toEqual({ device: 'cuda', address: 8192n });
    expect(calls.some((c) => c.name === 'eagle3Probs')).toBe(false);
    const V = target.info.vocabSize;
    expect(q!.probs!.length).toBe(3 * V);
    expect(calls.filter((c) => c.name === 'eagle3Probs').map((c) => c.args.slice(1))).toEqual([[0, 3]]);
    expect(d.pagesInUse).toBe(pages);
    d.freeSequence('a');
    expect(d.pagesInUse).toBe(0);
    d.dispose();
    expect(() => d.propose({ sequences: [seq] })).toThrow(/disposed/);
  });

  it('gives the pages back when the device refuses a context write or a chain fails', async () => {
    const a = await setup({ context: true });
    a.d.addSequence('x');
    expect(() => writeContext(a.d, 'x', 5)).toThrow(/slots\[0\]/);
    expect(a.d.pagesInUse).toBe(0);
    expect(a.d.contextLength('x')).toBe(0);
    a.d.dispose();
    const b = await setup({ chain: true });
    b.d.addSequence('y');
    writeContext(b.d, 'y', 16);
    const before = b.d.pagesInUse;
    const seq = {
      id: 'y',
      position: 16,
      lastToken: 1,
      maxDrafts: 4,
      history: new Int32Array(17),
      sampling: { temperature: 0 },
      rng: new SeededRandom(1),
    };
    expect(() => b.d.propose({ sequences: [seq] })).toThrow(/cudaErrorLaunchFailure/);
    expect(b.d.pagesInUse).toBe(before);
    expect(b.d.contextLength('y')).toBe(16);
    b.d.freeSequence('y');
    expect(b.d.pagesInUse).toBe(0);
    b.d.dispose();
  });

  it('refuses a partial projection, a foreign tap and a propose before any context', async () => {
    const { d } = await setup();
    d.addSequence('z');
    const taps = new Map(d.config.taps.map((t) => [t, new Float32Array(2 * D())]));
    expect(() => d.projectTargetHiddenPartial(taps, 2, new Float32Array(2 * D()))).toThrow(/partial projection/);
    expect(() => d.projectTargetHiddenPartial(new Map([[999, new Float32Array(2 * D())]]), 2)).toThrow(
      /tap 999 is not one of/,
    );
    const seq = {
      id: 'z',
      position: 0,
      lastToken: 1,
      maxDrafts: 2,
      history: new Int32Array(1),
      sampling: { temperature: 0 },
      rng: new SeededRandom(1),
    };
    expect(() => d.propose({ sequences: [seq] })).toThrow(/no draft context yet/);
    d.dispose();
  });
});
