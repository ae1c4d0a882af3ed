// The CUDA stage's DeviceSampling (cuda-stage.ts sampleOnDevice) without a GPU: @specd/native-cuda replaced by a
// stand-in that records what the stage hands to llamaSample. CI never sees a GPU, so this checks the packing the GPU
// tests (packages/native-cuda/test-gpu) rely on: each sequence's verify rows, drafts, q rows, top-k / top-p and
// draws; the results mapped back to the sequences; a stale result or a mismatched spec refused; and the engine
// sampling through it — argmax-only forwards, no logits copied back.
import { SpecEngine } from '@specd/core';
import type { CudaAddon, DeviceHandle, SampleRequest } from '@specd/native-cuda';
import { describe, expect, it } from 'vitest';

import { CudaLlamaStageModel, type LlamaConfig } from '../src/index.js';

const V = 64;
const config: LlamaConfig = {
  modelType: 'llama',
  vocabSize: V,
  hiddenSize: 8,
  numLayers: 2,
  intermediateSize: 16,
  numHeads: 2,
  numKvHeads: 1,
  headDim: 4,
  ropeTheta: 10000,
  ropeStyle: 'neox',
  rmsNormEps: 1e-5,
  tieWordEmbeddings: true,
  attentionBias: false,
  eosTokenIds: [],
  bosTokenId: undefined,
};

/** A stand-in addon: forwards return argmax 3 for every row and no logits; llamaSample records its requests. */
function standIn() {
  const calls = { forwards: [] as boolean[], samples: [] as SampleRequest[] };
  const addon = {
    info: { name: 'stand-in', computeCapability: '0.0', totalBytes: 0, freeBytes: 0 },
    llamaAllocKv: () => {},
    llamaInfo: () => ({
      weightBytes: 0,
      kvBytes: 0,
      activationBytes: 0,
      maxBlocks: 64,
      graphs: [],
      hostUs: { forwards: 0, checkUs: 0, launchUs: 0, waitUs: 0, copyUs: 0 },
    }),
    llamaForward: (
      _r: DeviceHandle,
      ids: Int32Array,
      _p: Int32Array,
      _s: Int32Array,
      _cu: Int32Array,
      _kv: Int32Array,
      _t: Int32Array,
      logitRows: Int32Array,
      taps: Int32Array,
      wantLogits: boolean,
    ) => {
      calls.forwards.push(wantLogits);
      return {
        tokens: new Int32Array(logitRows.length).fill(3),
        hidden: new Float32Array(ids.length * config.hiddenSize),
        taps: Array.from(taps, () => new Float32Array(ids.length * config.hiddenSize)),
        logits: wantLogits ? new Float32Array(logitRows.length * V) : undefined,
      };
    },
    // each group: accept every draft, then the token 5 + the group's index
    llamaSample: (_r: DeviceHandle, req: SampleRequest) => {
      calls.samples.push(req);
      const G = req.groups.length / 4;
      return Int32Array.from({ length: 2 * G }, (_, i) =>
        i % 2 === 0 ? req.groups[(i / 2) * 4 + 1]! : 5 + (i - 1) / 2,
      );
    },
    llamaDispose: () => {},
  } as unknown as CudaAddon;
  const model = new CudaLlamaStageModel(config, addon, {} as DeviceHandle, new Uint16Array(V * 8), 256, true);
  return { model, calls };
}

describe('CudaLlamaStageModel.sampleOnDevice (stand-in addon)', () => {
  it('packs each sequence’s verify rows, drafts, q rows, top-k / top-p and draws; maps the results back', () => {
    const { model, calls } = standIn();
    const cache = model.createCache({ pageSize: 4, numPages: 32, numSlots: 4 });
    for (const id of ['a', 'b', 'c']) cache.add(id);
    const seq = (id: string, tokens: number[]) => ({
      id,
      position: 0,
      tokens: Int32Array.from(tokens),
      logits: 'all' as const,
    });
    const res = model.forward({ sequences: [seq('a', [1, 2, 3]), seq('b', [4]), seq('c', [6, 7])] }, cache, {
      argmaxOnly: true,
    });
    expect(calls.forwards).toEqual([false]);
    const qA = Float32Array.from({ length: 2 * V }, (_, i) => i);
    const out = model.sampleOnDevice(res, [
      {
        temperature: 0.5,
        topK: 10,
        topP: 0.9,
        drafts: Int32Array.of(2, 3),
        q: qA,
        uniforms: Float64Array.of(0.1, 0.2, 0.3),
      },
      undefined,
      { temperature: 1.5, topK: 1000, drafts: Int32Array.of(7), q: undefined, uniforms: Float64Array.of(0.4, 0.5) },
    ]);
    const r = calls.samples[0]!;
    // a: rows 0–2 (k 2), q row 0, top-k 10; c: rows 4–5 (k 1), point masses, top-k ≥ V → off
    expect(Array.from(r.groups)).toEqual([0, 2, 0, 10, 4, 1, -1, 0]);
    expect(Array.from(r.temperature)).toEqual([0.5, 1.5]);
    expect(Array.from(r.topP)).toEqual([0.9, 1]);
    expect(Array.from(r.drafts)).toEqual([2, 3, 7]);
    expect(Array.from(r.uniforms)).toEqual([0.1, 0.2, 0.3, 0.4, 0.5]);
    expect(r.q).toEqual(qA);
    expect(Array.from(out)).toEqual([2, 5, -2, -2, 1, 6]);
  });

  it("q on the device (a GPU drafter's): one lent address and each group's row from it, no host q", () => {
    const { model, calls } = standIn();
    expect(model.acceptsDeviceProbs({ device: 'cuda', address: 0n })).toBe(true);
    expect(model.acceptsDeviceProbs({ device: 'cpu', address: 0n })).toBe(false);
    const cache = model.createCache({ pageSize: 4, numPages: 32, numSlots: 4 });
    for (const id of ['a', 'b']) cache.add(id);
    const res = model.forward(
      {
        sequences: [
          { id: 'a', position: 0, tokens: Int32Array.of(1, 2, 3), logits: 'all' },
          { id: 'b', position: 0, tokens: Int32Array.of(4, 5), logits: 'all' },
        ],
      },
      cache,
      { argmaxOnly: true },
    );
    const row = BigInt(V * 4);
    const base = 1n << 20n;
    const spec = (k: number, address: bigint) => ({
      temperature: 1,
      drafts: new Int32Array(k).fill(2),
      q: undefined,
      qDevice: { device: 'cuda', address },
      uniforms: new Float64Array(k + 1).fill(0.5),
    });
    // b's q rows lie after a's two in the drafter's buffer
    model.sampleOnDevice(res, [spec(2, base), spec(1, base + 2n * row)]);
    const r = calls.samples[0]!;
    expect(Array.from(r.groups)).toEqual([0, 2, 0, 0, 3, 1, 2, 0]);
    expect([r.q, r.qAddress, r.qRows]).toEqual([undefined, base, 3]);
    expect(() => model.sampleOnDevice(res, [spec(2, base), spec(1, base + 5n)])).toThrow(/not a whole row/);
    expect(() =>
      model.sampleOnDevice(res, [spec(2, base), { ...spec(1, 0n), qDevice: undefined, q: new Float32Array(V) }]),
    ).toThrow(/host memory and on the device/);
  });

  it('refuses a result that is not the latest forward, and specs that do not match the rows', () => {
    const { model } = standIn();
    const cache = model.createCache({ pageSize: 4, numPages: 32, numSlots: 2 });
    cache.add('a');
    const fwd = (position: number) =>
      model.forward({ sequences: [{ id: 'a', position, tokens: Int32Array.of(1, 2), logits: 'all' }] }, cache, {
        argmaxOnly: true,
      });
    const old = fwd(0);
    const res = fwd(2);
    const spec = { temperature: 1, drafts: Int32Array.of(2), q: undefined, uniforms: Float64Array.of(0.5, 0.5) };
    expect(() => model.sampleOnDevice(old, [spec])).toThrow(/latest forward/);
    expect(() => model.sampleOnDevice(res, [spec, spec])).toThrow(/specs: expected 1 entries/);
    expect(() => model.sampleOnDevice(res, [{ ...spec, drafts: Int32Array.of(1, 2) }])).toThrow(
      /2 drafts for 2 logit rows/,
    );
    expect(() => model.sampleOnDevice(res, [{ ...spec, uniforms: Float64Array.of(0.5) }])).toThrow(
      /expected 2 uniforms/,
    );
    expect(() => model.sampleOnDevice(res, [{ ...spec, q: new Float32Array(3) }])).toThrow(/q: expected \[1, 64\] f32/);
    expect(Array.from(model.sampleOnDevice(res, [spec]))).toEqual([1, 5]);
  });

  it('the engine samples through it: argmax-only forwards, every sampled token from llamaSample', () => {
    const { model, calls } = standIn();
    const engine = new SpecEngine(model, undefined, { maxSequences: 2, maxTokensPerSequence: 64, pageSize: 4 });
    const [a, b] = engine.run([
      { id: 'a', promptIds: Int32Array.of(1, 2, 3), maxTokens: 4, sampling: { temperature: 0.7, topP: 0.8 }, seed: 1 },
      { id: 'b', promptIds: Int32Array.of(4), maxTokens: 4, sampling: { temperature: 0 }, seed: 1 },
    ]);
    // a: every token is the stand-in's draw for its group; b (greedy): the device argmax 3
    expect(a!.tokenIds.every((t) => t >= 5)).toBe(true);
    expect(Array.from(b!.tokenIds)).toEqual([3, 3, 3, 3]);
    expect(calls.forwards.every((wantLogits) => !wantLogits)).toBe(true);
    expect(calls.samples.length).toBeGreaterThanOrEqual(4);
    for (const r of calls.samples) expect(Array.from(r.topP)).toEqual(new Array(r.topP.length).fill(0.8));
    expect(engine.cache.pagesInUse).toBe(0);
  });
});
