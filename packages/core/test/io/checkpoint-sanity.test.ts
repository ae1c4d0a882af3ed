/**
 * Checkpoint sanity units: findNonFinite against a plain Number.isFinite loop on random bf16 / f32 data with
 * NaN and ±Infinity planted at every word position, CheckpointSanity's modes, and WeightReader's shape rule
 * (size-1 dimensions may differ, nothing else) and non-finite scan of whole tensors and blocks (the element
 * named is the tensor's, not the block's).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

import {
  CheckpointSanity,
  CheckpointSanityError,
  SafetensorsCheckpoint,
  WeightReader,
  findNonFinite,
  writeSafetensors,
} from '../../src/io/index.js';
import { makeTempDir, prng } from './helpers.js';

const dir = makeTempDir('checkpoint-sanity');
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const f32Bits = (x: number) => new Uint32Array(Float32Array.of(x).buffer)[0]!;
const bf16 = (x: number) => f32Bits(x) >>> 16;

/** The reference: count, first index and value by a plain loop over the decoded values. */
function reference(values: readonly number[]): { count: number; first: number; value: number } | undefined {
  const bad = values.flatMap((v, i) => (Number.isFinite(v) ? [] : [i]));
  return bad.length === 0 ? undefined : { count: bad.length, first: bad[0]!, value: values[bad[0]!]! };
}

describe('findNonFinite', () => {
  const rand = prng(0x5a17);
  const specials = [Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY];
  for (const n of [0, 1, 2, 3, 7, 8, 9, 64, 1001]) {
    it(`bf16 and f32, length ${n}: clean, and one or several specials at random places, as the reference`, () => {
      for (let trial = 0; trial < 12; trial++) {
        const values = Array.from({ length: n }, () => (rand() - 0.5) * 1e4);
        const plant = trial === 0 || n === 0 ? 0 : 1 + Math.floor(rand() * 3);
        for (let k = 0; k < plant; k++) values[Math.floor(rand() * n)] = specials[Math.floor(rand() * 3)]!;
        // bf16: the values rounded toward zero to bf16 (finite stays finite: |x| < 1e4)
        const bits = Uint16Array.from(values, bf16);
        const asBf16 = Array.from(bits, (b) => new Float32Array(Uint32Array.of(b << 16).buffer)[0]!);
        expect(findNonFinite(bits), `bf16 n=${n} trial ${trial}`).toEqual(reference(asBf16));
        const f32 = Float32Array.from(values);
        expect(findNonFinite(f32), `f32 n=${n} trial ${trial}`).toEqual(reference(Array.from(f32)));
      }
    });
  }

  it('an unaligned bf16 view (odd element offset) is scanned correctly', () => {
    const all = Uint16Array.from([0, bf16(1), bf16(2), bf16(Number.NaN), bf16(3)]);
    const view = all.subarray(1);
    expect(view.byteOffset % 4).toBe(2);
    expect(findNonFinite(view)).toEqual({ count: 1, first: 2, value: Number.NaN });
    expect(findNonFinite(all.subarray(1, 3))).toBeUndefined();
  });

  it('the largest finite values and subnormals are finite', () => {
    expect(findNonFinite(Uint16Array.of(0x7f7f, 0xff7f, 0x0001, 0x8001, 0x0000, 0x8000))).toBeUndefined();
    expect(findNonFinite(Float32Array.of(3.4028234e38, -3.4028234e38, 1e-45, -0))).toBeUndefined();
  });
});

describe('CheckpointSanity', () => {
  it('refuse mode throws a CheckpointSanityError naming the subject; warn mode records and forwards', () => {
    const refuse = new CheckpointSanity({ onWarning: () => {} });
    expect(() => refuse.checkFinite('f.safetensors', 'w', [2, 3], Float32Array.of(1, 2, 3, 4, Number.NaN, 6))).toThrow(
      new CheckpointSanityError(
        'non-finite',
        'w',
        'f.safetensors: tensor "w": 1 non-finite value of 6, the first NaN at element 4 (row 1) ' +
          '(refused; checkpoint_sanity: "warn" loads it anyway)',
      ),
    );
    const seen: string[] = [];
    const warn = new CheckpointSanity({ mode: 'warn', onWarning: (m) => seen.push(m) });
    warn.checkFinite('f.safetensors', 'w', [4], Float32Array.of(1, -Infinity, Infinity, 0));
    expect(seen).toEqual([
      'f.safetensors: tensor "w": 2 non-finite values of 4, the first -Infinity at element 1 ' +
        '(loaded anyway: checkpoint_sanity is "warn")',
    ]);
    expect(warn.warnings).toEqual(seen);
    expect(() => warn.refuse('size', 'block_size', 'too big')).toThrow(CheckpointSanityError);
  });
});

describe('WeightReader: shapes and non-finite values', () => {
  const file = path.join(dir, 'w.safetensors');
  const matrix = new Float32Array(4 * 6).map((_, i) => i / 8);
  matrix[3 * 6 + 4] = Number.NaN; // row 3, column 4
  writeSafetensors(file, {
    a_log: { dtype: 'F32', shape: [1, 1, 3, 1], data: Float32Array.of(1, 2, 3) },
    flat: { dtype: 'BF16', shape: [24], data: new Uint16Array(24) },
    m: { dtype: 'F32', shape: [4, 6], data: matrix },
  });
  const open = (sanity?: CheckpointSanity) =>
    new WeightReader(SafetensorsCheckpoint.open(file), sanity === undefined ? {} : { sanity });

  it('accepts a shape that differs only by size-1 dimensions; refuses a flattened or transposed one', () => {
    const r = open();
    expect(Array.from(r.f32('a_log', [3]))).toEqual([1, 2, 3]);
    expect(() => r.bf16('flat', [4, 6])).toThrow(
      `tensor "flat" in ${file}: expected shape [4, 6] (from the config), got [24]`,
    );
    expect(() => r.f32('m', [6, 4])).toThrow('expected shape [6, 4] (from the config), got [4, 6]');
  });

  it('names the tensor element of a NaN found in a whole read, a row block, a column block and a range', () => {
    const r = open(new CheckpointSanity({ onWarning: () => {} }));
    expect(() => r.f32('m', [4, 6])).toThrow('the first NaN at element 22 (row 3)');
    expect(() => r.bf16Block('m', 4, 6, { rows: [2, 4] })).toThrow('the first NaN at element 22 (row 3)');
    expect(() => r.bf16Block('m', 4, 6, { cols: [3, 6] })).toThrow('the first NaN at element 22 (row 3)');
    expect(() => r.f32Range('m', [4, 6], 20, 24)).toThrow('the first NaN at element 22 (row 3)');
    // blocks without it are clean
    expect(r.bf16Block('m', 4, 6, { rows: [0, 3] })).toHaveLength(18);
    expect(r.bf16Block('m', 4, 6, { cols: [0, 4] })).toHaveLength(16);
  });

  it('in warn mode the NaN is loaded as is and reported once per read', () => {
    const seen: string[] = [];
    const r = open(new CheckpointSanity({ mode: 'warn', onWarning: (m) => seen.push(m) }));
    const m = r.f32('m', [4, 6]);
    expect(Number.isNaN(m[22])).toBe(true);
    expect(seen).toHaveLength(1);
    expect(seen[0]).toContain('tensor "m": 1 non-finite value of 24');
  });

  it('unreadNames lists what no read touched', () => {
    const ckpt = SafetensorsCheckpoint.open(file);
    try {
      expect(ckpt.unreadNames()).toEqual(['a_log', 'flat', 'm']);
      ckpt.readBytes('m', 0, 4);
      ckpt.read('a_log');
      expect(ckpt.unreadNames()).toEqual(['flat']);
    } finally {
      ckpt.close();
    }
  });
});
