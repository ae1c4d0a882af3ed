// The accumulate-by-tap context projection (core's TapProjection) in both weight formats: a partition of the taps
// over two projections (a pipeline's stages) adds up bit for bit to the one-projection sum; the 'q8_0' format is
// gemmQuant (Q8_0 weights, int16 activations) plus one f32 add per tap, within Q8_0's rounding of the bf16 result;
// it needs a hidden size that is a multiple of 32, and a block with a non-finite weight stays bf16.
import * as fs from 'node:fs';
import * as path from 'node:path';

import { addF32, gemmBf16Accumulate, gemmQuant, packBf16Weights, quantizedWeights } from '@specd/native';
import { afterAll, describe, expect, it } from 'vitest';

import { CheckpointSanity, SafetensorsCheckpoint, WeightReader, writeSafetensors } from '../../src/io/index.js';
import { quantizeQ8_0 } from '../../src/io/gguf-quant.js';
import { TapProjection } from '../../src/plugin/index.js';
import { makeTempDir, prng } from '../io/helpers.js';

const D = 64;
const TAPS = [2, 5, 9];
const N = 5;

/** bf16 bits of f32 values (truncation). */
function bf16(x: Float32Array): Uint16Array {
  return new Uint16Array(Uint32Array.from(new Uint32Array(x.buffer), (u) => u >>> 16));
}
function bf16ToF32(b: Uint16Array): Float32Array {
  return new Float32Array(Uint32Array.from(b, (u) => u << 16).buffer);
}
function random(n: number, rand: () => number, scale = 1): Float32Array {
  return Float32Array.from({ length: n }, () => (rand() * 2 - 1) * scale);
}
const bits = (x: Float32Array) => new Uint32Array(x.buffer, x.byteOffset, x.length);

describe('TapProjection', () => {
  const dir = makeTempDir('specd-tap-projection-');
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
  const rand = prng(5);
  const fc = bf16(random(D * TAPS.length * D, rand, 0.2));
  const file = path.join(dir, 'model.safetensors');
  writeSafetensors(file, { 'fc.weight': { dtype: 'BF16', shape: [D, TAPS.length * D], data: fc } });
  // taps with a residual stream's outlier channel
  const taps = new Map(
    TAPS.map((t) => {
      const h = random(N * D, rand, 2);
      for (let r = 0; r < N; r++) h[r * D + 7] = 180 * (r % 2 === 0 ? 1 : -1);
      return [t, h] as const;
    }),
  );
  const read = (format: 'bf16' | 'q8_0', only?: number[]) => {
    const ckpt = SafetensorsCheckpoint.open(file);
    try {
      return TapProjection.read(new WeightReader(ckpt), 'fc.weight', D, TAPS, 'test', only ?? TAPS, format);
    } finally {
      ckpt.close();
    }
  };
  /** Column block i of fc, `[D, D]` bf16 bits. */
  const block = (i: number) => {
    const out = new Uint16Array(D * D);
    for (let r = 0; r < D; r++)
      out.set(fc.subarray(r * TAPS.length * D + i * D, r * TAPS.length * D + (i + 1) * D), r * D);
    return out;
  };

  it.each(['bf16', 'q8_0'] as const)('%s: a partition of the taps adds up bit for bit to one projection', (format) => {
    const whole = read(format);
    expect(whole.format).toBe(format);
    const ref = whole.projectTargetHiddenPartial(taps, N);
    const first = read(format, [2]);
    const rest = read(format, [5, 9]);
    const acc = first.projectTargetHiddenPartial(new Map([[2, taps.get(2)!]]), N);
    rest.projectTargetHiddenPartial(
      new Map([
        [9, taps.get(9)!],
        [5, taps.get(5)!],
      ]),
      N,
      acc,
    );
    expect(bits(acc)).toEqual(bits(ref));
  });

  it('q8_0: each tap is gemmQuant (int16 activations) then one add, in ascending tap order', () => {
    const acc = new Float32Array(N * D);
    TAPS.forEach((t, i) => {
      const w = quantizedWeights(quantizeQ8_0(bf16ToF32(block(i)), D, D), 'q8_0', D, D);
      addF32(acc, gemmQuant(taps.get(t)!, N, w, undefined, 'int16'), acc);
    });
    expect(bits(read('q8_0').projectTargetHiddenPartial(taps, N))).toEqual(bits(acc));
    // and bf16 is one fused accumulate per tap
    const accB = new Float32Array(N * D);
    TAPS.forEach((t, i) => {
      gemmBf16Accumulate(taps.get(t)!, N, packBf16Weights(block(i), D, D), accB);
    });
    expect(bits(read('bf16').projectTargetHiddenPartial(taps, N))).toEqual(bits(accB));
  });

  it('q8_0 is within Q8_0 rounding of bf16, outlier channel included', () => {
    const q = read('q8_0').projectTargetHiddenPartial(taps, N);
    const b = read('bf16').projectTargetHiddenPartial(taps, N);
    // the largest deviation against the largest output (an outlier channel drives both)
    const e = Math.max(...q.map((v, i) => Math.abs(v - b[i]!))) / Math.max(...b.map(Math.abs));
    expect(e).toBeGreaterThan(0);
    expect(e).toBeLessThan(1e-2);
  });

  it('q8_0: a block with a non-finite weight (sanity "warn") stays bf16; the others are Q8_0', () => {
    const bad = fc.slice();
    bad[3 * TAPS.length * D + D + 4] = 0x7f80; // +Inf in tap 5's block (column block 1)
    const f = path.join(dir, 'inf.safetensors');
    writeSafetensors(f, { 'fc.weight': { dtype: 'BF16', shape: [D, TAPS.length * D], data: bad } });
    const ckpt = SafetensorsCheckpoint.open(f);
    try {
      const sanity = new CheckpointSanity({ mode: 'warn', onWarning: () => {} });
      const p = TapProjection.read(new WeightReader(ckpt, { sanity }), 'fc.weight', D, TAPS, 'inf', TAPS, 'q8_0');
      const one = (t: number) => p.projectTargetHiddenPartial(new Map([[t, taps.get(t)!]]), N);
      const infBlock = new Uint16Array(D * D);
      for (let r = 0; r < D; r++)
        infBlock.set(bad.subarray(r * TAPS.length * D + D, r * TAPS.length * D + 2 * D), r * D);
      const accB = new Float32Array(N * D);
      gemmBf16Accumulate(taps.get(5)!, N, packBf16Weights(infBlock, D, D), accB);
      expect(bits(one(5))).toEqual(bits(accB));
      expect(bits(one(2))).toEqual(bits(read('q8_0', [2]).projectTargetHiddenPartial(new Map([[2, taps.get(2)!]]), N)));
    } finally {
      ckpt.close();
    }
  });

  it('q8_0 needs a hidden size that is a multiple of 32', () => {
    const d = 48;
    const f = path.join(dir, 'odd.safetensors');
    writeSafetensors(f, { 'fc.weight': { dtype: 'BF16', shape: [d, 2 * d], data: bf16(random(2 * d * d, rand)) } });
    const ckpt = SafetensorsCheckpoint.open(f);
    try {
      expect(() => TapProjection.read(new WeightReader(ckpt), 'fc.weight', d, [1, 2], 'odd', [1, 2], 'q8_0')).toThrow(
        /odd: a q8_0 context projection needs the hidden size a multiple of 32, got 48/,
      );
    } finally {
      ckpt.close();
    }
  });
});
