// Shared model pieces: the dense decoder block equals the same native ops written out (bit for bit,
// with and without a reduce), and packShard equals packedRows without a shard and the rank's
// packedBlocks with one (the same bits and the same reads).
import * as fs from 'node:fs';
import * as path from 'node:path';

import { gemmBf16, packBf16Weights, rmsNorm, swigluFused } from '@specd/native';
import { afterAll, describe, expect, it } from 'vitest';

import { SafetensorsCheckpoint, WeightReader, writeSafetensors } from '../../src/io/index.js';
import { denseBlock, denseBlockOutput, packShard, type ShardPart } from '../../src/model/index.js';
import { draftShardLayout } from '../../src/tensor-parallel/index.js';
import { makeTempDir, prng } from '../io/helpers.js';

const D = 16;
const I = 24;
const HD = 8; // H = 2 heads of 4
const N = 3;

function random(n: number, rand: () => number, scale = 1): Float32Array {
  return Float32Array.from({ length: n }, () => (rand() * 2 - 1) * scale);
}

/** bf16 bits of f32 values (truncation: exact for the test's purposes). */
function bf16(x: Float32Array): Uint16Array {
  return new Uint16Array(Uint32Array.from(new Uint32Array(x.buffer), (u) => u >>> 16));
}

describe('denseBlock', () => {
  const rand = prng(7);
  const w = {
    inputNorm: random(D, rand),
    postNorm: random(D, rand),
    o: packBf16Weights(bf16(random(D * HD, rand, 0.3)), D, HD),
    gateUp: packBf16Weights(bf16(random(2 * I * D, rand, 0.3)), 2 * I, D),
    down: packBf16Weights(bf16(random(D * I, rand, 0.3)), D, I),
  };
  const attnW = packBf16Weights(bf16(random(HD * D, rand, 0.3)), HD, D);
  const h0 = random(N * D, rand);

  it('is norm → attention → o_proj → residual → norm → SwiGLU → residual, bit for bit', () => {
    const want = Float32Array.from(h0);
    const a = gemmBf16(rmsNorm(want, w.inputNorm, 1e-6), N, attnW);
    const o = gemmBf16(a, N, w.o);
    for (let e = 0; e < want.length; e++) want[e] = want[e]! + o[e]!;
    const m = gemmBf16(swigluFused(gemmBf16(rmsNorm(want, w.postNorm, 1e-6), N, w.gateUp), I), N, w.down);
    for (let e = 0; e < want.length; e++) want[e] = want[e]! + m[e]!;
    const h = Float32Array.from(h0);
    const out = denseBlock(h, N, w, (x) => gemmBf16(x, N, attnW), { eps: 1e-6, intermediate: I });
    expect(out).toBe(h);
    expect(h).toEqual(want);
  });

  it('takes any linear map with apply (e.g. quantized weights) as well as packed bf16', () => {
    const lin = (p: typeof w.o) => ({ apply: (x: Float32Array, m: number) => gemmBf16(x, m, p) });
    const wl = { ...w, o: lin(w.o), gateUp: lin(w.gateUp), down: lin(w.down) };
    const a = random(N * HD, rand);
    const opts = { eps: 1e-6, intermediate: I };
    expect(denseBlockOutput(Float32Array.from(h0), a, N, wl, opts)).toEqual(
      denseBlockOutput(Float32Array.from(h0), a, N, w, opts),
    );
  });

  it('sends both row-parallel outputs through reduce', () => {
    const seen: number[] = [];
    const twice = (x: Float32Array) => {
      seen.push(x.length);
      return Float32Array.from(x, (v) => 2 * v);
    };
    const a = random(N * HD, rand);
    const h = denseBlockOutput(Float32Array.from(h0), a, N, w, { eps: 1e-6, intermediate: I, reduce: twice });
    const want = Float32Array.from(h0);
    const o = gemmBf16(a, N, w.o);
    for (let e = 0; e < want.length; e++) want[e] = want[e]! + 2 * o[e]!;
    const m = gemmBf16(swigluFused(gemmBf16(rmsNorm(want, w.postNorm, 1e-6), N, w.gateUp), I), N, w.down);
    for (let e = 0; e < want.length; e++) want[e] = want[e]! + 2 * m[e]!;
    expect(seen).toEqual([N * D, N * D]);
    expect(h).toEqual(want);
  });
});

describe('packShard', () => {
  const dir = makeTempDir('specd-pack-shard-');
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
  const rand = prng(11);
  const file = path.join(dir, 'model.safetensors');
  const mat = (n: number, k: number) => ({ dtype: 'BF16' as const, shape: [n, k], data: bf16(random(n * k, rand)) });
  writeSafetensors(file, { q: mat(4 * HD, D), k: mat(2 * HD, D), o: mat(D, 4 * HD), up: mat(I, D), down: mat(D, I) });
  const parts: ShardPart[] = [
    { name: 'q', n: 4 * HD, k: D, split: 'heads' },
    { name: 'k', n: 2 * HD, k: D, split: 'kvHeads' },
    { name: 'up', n: I, k: D, split: 'intermediate' },
  ];

  it('without a shard: packedRows of the whole matrices (same bits, same reads)', () => {
    const ckpt = SafetensorsCheckpoint.open(file);
    try {
      const a = new WeightReader(ckpt);
      const b = new WeightReader(ckpt);
      expect(packShard(a, parts, undefined)).toEqual(b.packedRows(['q', 'k', 'up'], [4 * HD, 2 * HD, I], D));
      expect(a.reads).toEqual(b.reads);
    } finally {
      ckpt.close();
    }
  });

  it("with a shard: the rank's rows / columns (Megatron layout)", () => {
    const ckpt = SafetensorsCheckpoint.open(file);
    try {
      const layout = draftShardLayout({ heads: 4, kvHeads: 2, intermediate: I }, { rank: 1, size: 2 }, 'test');
      const a = new WeightReader(ckpt);
      const b = new WeightReader(ckpt);
      const got = packShard(a, parts, { layout, headDim: HD });
      const want = b.packedBlocks([
        { name: 'q', n: 4 * HD, k: D, block: { rows: [2 * HD, 4 * HD] } },
        { name: 'k', n: 2 * HD, k: D, block: { rows: [HD, 2 * HD] } },
        { name: 'up', n: I, k: D, block: { rows: [I / 2, I] } },
      ]);
      expect(got).toEqual(want);
      expect(a.reads).toEqual([
        { name: 'q', rows: [2 * HD, 4 * HD] },
        { name: 'k', rows: [HD, 2 * HD] },
        { name: 'up', rows: [I / 2, I] },
      ]);
      const cols = new WeightReader(ckpt);
      packShard(cols, [{ name: 'o', n: D, k: 4 * HD, split: 'headsIn' }], { layout, headDim: HD });
      packShard(cols, [{ name: 'down', n: D, k: I, split: 'intermediateIn' }], { layout, headDim: HD });
      expect(cols.reads).toEqual([
        { name: 'o', cols: [2 * HD, 4 * HD] },
        { name: 'down', cols: [I / 2, I] },
      ]);
    } finally {
      ckpt.close();
    }
  });
});
