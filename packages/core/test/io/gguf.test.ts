/** GGUF reader: parsing of synthetic files, getters, tensor views, dequantizers, rejection rules. */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

import {
  dequantize,
  dequantizeRow,
  f16ToF32,
  GgmlType,
  GgufError,
  GgufFile,
  GgufValueType,
} from '../../src/io/index.js';
import { buildGguf, f32ToF16Bits, tensorBytes, type BuildOptions } from './gguf-builder.js';
import { makeTempDir } from './helpers.js';

const dir = makeTempDir('gguf');
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

function u16le(...vals: number[]): number[] {
  return vals.flatMap((v) => [v & 0xff, v >> 8]);
}

/** One Q4_1 block: d, m, and 32 nibbles q[0..31] (q[j] low nibble of byte j, q[j+16] high nibble). */
function q41Block(d: number, m: number, q: number[]): number[] {
  const qs = Array.from({ length: 16 }, (_, j) => (q[j]! & 0xf) | ((q[j + 16]! & 0xf) << 4));
  return [...u16le(f32ToF16Bits(d), f32ToF16Bits(m)), ...qs];
}

function q40Block(d: number, q: number[]): number[] {
  const qs = Array.from({ length: 16 }, (_, j) => (q[j]! & 0xf) | ((q[j + 16]! & 0xf) << 4));
  return [...u16le(f32ToF16Bits(d)), ...qs];
}

function q80Block(d: number, q: number[]): number[] {
  return [...u16le(f32ToF16Bits(d)), ...q.map((v) => v & 0xff)];
}

const ramp = Array.from({ length: 32 }, (_, j) => j % 16);

function expectGgufError(fn: () => unknown, rule: string, text?: RegExp): GgufError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(GgufError);
    const e = err as GgufError;
    expect(e.rule, e.message).toBe(rule);
    if (text !== undefined) expect(e.message).toMatch(text);
    return e;
  }
  throw new Error(`expected GgufError ${rule}`);
}

const META: BuildOptions['metadata'] = [
  ['general.architecture', { t: GgufValueType.STRING, v: 'llama' }],
  ['u8', { t: GgufValueType.UINT8, v: 200 }],
  ['i8', { t: GgufValueType.INT8, v: -5 }],
  ['u16', { t: GgufValueType.UINT16, v: 65000 }],
  ['i16', { t: GgufValueType.INT16, v: -30000 }],
  ['llama.block_count', { t: GgufValueType.UINT32, v: 30 }],
  ['i32', { t: GgufValueType.INT32, v: -7 }],
  ['llama.rope.freq_base', { t: GgufValueType.FLOAT32, v: 100000 }],
  ['eps', { t: GgufValueType.FLOAT32, v: 1e-5 }],
  ['flag', { t: GgufValueType.BOOL, v: true }],
  ['u64', { t: GgufValueType.UINT64, v: 2n ** 63n + 5n }],
  ['i64', { t: GgufValueType.INT64, v: -(2n ** 40n) }],
  ['f64', { t: GgufValueType.FLOAT64, v: Math.PI }],
  ['names', { t: GgufValueType.ARRAY, of: GgufValueType.STRING, v: ['a', 'Ġthe', '日本', ''] }],
  ['types', { t: GgufValueType.ARRAY, of: GgufValueType.INT32, v: [1, 3, -1] }],
  ['floats', { t: GgufValueType.ARRAY, of: GgufValueType.FLOAT32, v: [0.5, -2] }],
  ['bools', { t: GgufValueType.ARRAY, of: GgufValueType.BOOL, v: [true, false] }],
  ['u64s', { t: GgufValueType.ARRAY, of: GgufValueType.UINT64, v: [1n, 2n ** 60n] }],
  [
    'nested',
    {
      t: GgufValueType.ARRAY,
      of: GgufValueType.ARRAY,
      v: [
        { t: GgufValueType.ARRAY, of: GgufValueType.STRING, v: ['x', 'y'] },
        { t: GgufValueType.ARRAY, of: GgufValueType.UINT8, v: [1, 2, 3] },
      ],
    },
  ],
];

function sampleFile(alignment?: number): Uint8Array {
  const f32 = new Uint8Array(new Float32Array([1, -2, 3.5, 0, 4, 5]).buffer);
  return buildGguf({
    alignment,
    metadata: META,
    tensors: [
      { name: 'f32', type: GgmlType.F32, ggmlShape: [3, 2], data: f32 },
      {
        name: 'q41',
        type: GgmlType.Q4_1,
        ggmlShape: [64, 1],
        data: Uint8Array.from([
          ...q41Block(0.5, -1, ramp),
          ...q41Block(
            2,
            3,
            ramp.map((q) => 15 - q),
          ),
        ]),
      },
      { name: 'q40', type: GgmlType.Q4_0, ggmlShape: [32], data: Uint8Array.from(q40Block(0.25, ramp)) },
      {
        name: 'q80',
        type: GgmlType.Q8_0,
        ggmlShape: [32],
        data: Uint8Array.from(
          q80Block(
            0.125,
            Array.from({ length: 32 }, (_, j) => j * 8 - 128),
          ),
        ),
      },
      { name: 'f16', type: GgmlType.F16, ggmlShape: [4], data: Uint8Array.from(u16le(0x3c00, 0xc000, 0x0001, 0x7c00)) },
      { name: 'bf16', type: GgmlType.BF16, ggmlShape: [2], data: Uint8Array.from(u16le(0x3f80, 0xc0a0)) },
      { name: 'q4k', type: GgmlType.Q4_K, ggmlShape: [256, 2] },
      { name: 'scalar', type: GgmlType.F32, ggmlShape: [], data: new Uint8Array(new Float32Array([7]).buffer) },
    ],
  });
}

describe('GgufFile: synthetic files', () => {
  it('parses every metadata value type, with typed getters', () => {
    const g = GgufFile.fromBytes(sampleFile(), 'sample.gguf');
    expect(g.version).toBe(3);
    expect(g.alignment).toBe(32);
    expect(g.getString('general.architecture')).toBe('llama');
    expect(g.getU32('llama.block_count')).toBe(30);
    expect(g.getF32('llama.rope.freq_base')).toBe(100000);
    expect(g.getF32('eps')).toBe(Math.fround(1e-5));
    expect(g.getBool('flag')).toBe(true);
    expect([g.get('u8'), g.get('i8'), g.get('u16'), g.get('i16'), g.get('i32')]).toEqual([200, -5, 65000, -30000, -7]);
    expect(g.get('u64')).toBe(2n ** 63n + 5n);
    expect(g.get('i64')).toBe(-(2n ** 40n));
    expect(g.get('f64')).toBe(Math.PI);
    expect(g.getStringArray('names')).toEqual(['a', 'Ġthe', '日本', '']);
    const types = g.getArray('types', GgufValueType.INT32).items;
    expect(types).toBeInstanceOf(Int32Array);
    expect([...(types as Int32Array)]).toEqual([1, 3, -1]);
    expect([...(g.getArray('floats').items as Float32Array)]).toEqual([0.5, -2]);
    expect(g.getArray('bools').items).toEqual([true, false]);
    expect([...(g.getArray('u64s').items as BigUint64Array)]).toEqual([1n, 2n ** 60n]);
    const nested = g.getArray('nested', GgufValueType.ARRAY).items as { elementType: number; items: unknown }[];
    expect(nested[0]!.items).toEqual(['x', 'y']);
    expect([...(nested[1]!.items as Uint8Array)]).toEqual([1, 2, 3]);
    expect([...g.metadata.keys()].slice(0, 3)).toEqual(['general.architecture', 'u8', 'i8']);
  });

  it('getters name the key, the byte offset and the type found', () => {
    const g = GgufFile.fromBytes(sampleFile(), 'sample.gguf');
    expectGgufError(
      () => g.getString('nope'),
      'metadata-missing',
      /sample\.gguf: metadata "nope": no such metadata key/,
    );
    const e = expectGgufError(
      () => g.getU32('general.architecture'),
      'metadata-type',
      /at byte 24: metadata "general\.architecture": expected UINT32, got STRING "llama"/,
    );
    expect(e.offsetBytes).toBe(24);
    expectGgufError(() => g.getF32('llama.block_count'), 'metadata-type', /expected FLOAT32, got UINT32 30/);
    expectGgufError(
      () => g.getArray('types', GgufValueType.STRING),
      'metadata-type',
      /expected ARRAY of STRING, got ARRAY array of 3 INT32/,
    );
    expectGgufError(() => g.getStringArray('flag'), 'metadata-type');
  });

  it('lists tensors with ggml and row-major shapes, offsets and byte lengths', () => {
    for (const alignment of [undefined, 64, 1]) {
      const g = GgufFile.fromBytes(sampleFile(alignment));
      expect(g.alignment).toBe(alignment ?? 32);
      expect(g.dataStartBytes % g.alignment).toBe(0);
      const list = g.tensors();
      expect(list.map((t) => t.name)).toEqual(['f32', 'q41', 'q40', 'q80', 'f16', 'bf16', 'q4k', 'scalar']);
      const f32 = g.info('f32');
      expect(f32.ggmlShape).toEqual([3, 2]);
      expect(f32.shape).toEqual([2, 3]);
      expect(f32.byteLength).toBe(24);
      expect(f32.offsetBytes).toBe(0);
      expect(f32.fileOffsetBytes).toBe(g.dataStartBytes);
      const q41 = g.info('q41');
      expect([q41.type, q41.typeName, q41.shape, q41.numElements, q41.byteLength]).toEqual([
        GgmlType.Q4_1,
        'Q4_1',
        [1, 64],
        64,
        40,
      ]);
      expect(q41.offsetBytes).toBe(Math.ceil(24 / g.alignment) * g.alignment);
      expect(g.info('q4k')).toMatchObject({ typeName: 'Q4_K', type: 12, byteLength: 288, shape: [2, 256] });
      expect(g.info('scalar')).toMatchObject({ shape: [], numElements: 1, byteLength: 4 });
      for (const t of list) expect(t.offsetBytes % g.alignment).toBe(0);
    }
  });

  it('gives zero-copy tensor views and an F32 typed view', () => {
    const bytes = sampleFile();
    const g = GgufFile.fromBytes(bytes);
    const v = g.tensor('q41');
    expect(v.bytes.buffer).toBe(bytes.buffer);
    expect(v.bytes.byteOffset).toBe(g.info('q41').fileOffsetBytes);
    expect(v.bytes.length).toBe(40);
    const f = g.f32('f32');
    expect(f.buffer).toBe(bytes.buffer);
    expect([...f]).toEqual([1, -2, 3.5, 0, 4, 5]);
    expect(g.f32('scalar')[0]).toBe(7);
    expectGgufError(() => g.f32('q41'), 'metadata-type', /tensor is Q4_1, not F32/);
    expectGgufError(() => g.tensor('missing'), 'tensor-not-found', /tensor "missing"/);
  });

  it('lists unsupported types but refuses to read them', () => {
    const g = GgufFile.fromBytes(sampleFile(), 'm.gguf');
    expectGgufError(() => g.tensor('q4k'), 'unsupported-type', /tensor "q4k": unsupported tensor type Q4_K \(id 12\)/);
    expectGgufError(() => g.dequantize('q4k'), 'unsupported-type');
    expectGgufError(
      () => dequantizeRow(GgmlType.Q6_K, new Uint8Array(210), 256, new Float32Array(256)),
      'unsupported-type',
    );
  });

  it('dequantizes Q4_1, Q4_0, Q8_0, F16, BF16, F32 per the ggml formulas', () => {
    const g = GgufFile.fromBytes(sampleFile());
    const q41 = g.dequantize('q41');
    for (let j = 0; j < 32; j++) {
      expect(q41[j]).toBe(0.5 * ramp[j]! - 1);
      expect(q41[32 + j]).toBe(2 * (15 - ramp[j]!) + 3);
    }
    const q40 = g.dequantize('q40');
    for (let j = 0; j < 32; j++) expect(q40[j]).toBe(0.25 * (ramp[j]! - 8));
    const q80 = g.dequantize('q80');
    for (let j = 0; j < 32; j++) expect(q80[j]).toBe(0.125 * (j * 8 - 128));
    expect([...g.dequantize('f16')]).toEqual([1, -2, 2 ** -24, Infinity]);
    expect([...g.dequantize('bf16')]).toEqual([1, -5]);
    expect([...g.dequantize('f32')]).toEqual([1, -2, 3.5, 0, 4, 5]);
    expect(dequantize(g.tensor('q41'))).toEqual(q41);
    // dequantizeRow at an offset, from an unaligned source
    const src = new Uint8Array(41);
    src.set(g.tensor('q41').bytes, 1);
    const out = new Float32Array(70);
    dequantizeRow(GgmlType.Q4_1, src.subarray(1), 64, out, 3);
    expect(out.subarray(3, 67)).toEqual(q41);
    expect(() => dequantizeRow(GgmlType.Q4_1, src, 48, out)).toThrow(/not a multiple of the Q4_1 block size 32/);
    expect(() => dequantizeRow(GgmlType.Q4_1, src.subarray(0, 20), 64, out)).toThrow(/needs 40/);
  });

  it('f16ToF32 covers subnormals, infinities and NaN', () => {
    expect(f16ToF32(0x0000)).toBe(0);
    expect(Object.is(f16ToF32(0x8000), -0)).toBe(true);
    expect(f16ToF32(0x0400)).toBe(2 ** -14);
    expect(f16ToF32(0x7bff)).toBe(65504);
    expect(f16ToF32(0xfc00)).toBe(-Infinity);
    expect(f16ToF32(0x7e00)).toBeNaN();
  });

  it('opens from disk; version 2 is accepted', () => {
    const p = path.join(dir, 'v2.gguf');
    fs.writeFileSync(
      p,
      buildGguf({ version: 2, metadata: META, tensors: [{ name: 'w', type: GgmlType.Q8_0, ggmlShape: [32, 3] }] }),
    );
    const g = GgufFile.open(p);
    expect(g.version).toBe(2);
    expect(g.info('w').shape).toEqual([3, 32]);
    expect(g.file).toBe(p);
    expectGgufError(() => GgufFile.open(path.join(dir, 'missing.gguf')), 'io', /missing\.gguf: cannot read/);
  });
});

describe('GgufFile: rejection rules', () => {
  const good = buildGguf({
    metadata: [['a', { t: GgufValueType.UINT32, v: 1 }]],
    tensors: [{ name: 'w', type: GgmlType.F32, ggmlShape: [8] }],
  });
  const patch = (bytes: Uint8Array, at: number, write: (dv: DataView) => void): Uint8Array => {
    const out = bytes.slice();
    write(new DataView(out.buffer, at));
    return out;
  };

  it('magic and version', () => {
    expectGgufError(
      () => GgufFile.fromBytes(new Uint8Array(0), 'e.gguf'),
      'truncated',
      /e\.gguf: at byte 0: magic: needs 4 bytes/,
    );
    expectGgufError(
      () => GgufFile.fromBytes(patch(good, 0, (d) => d.setUint8(0, 0x46))),
      'magic',
      /expected "GGUF" \(47 47 55 46\), got 46 47 55 46/,
    );
    expectGgufError(
      () => GgufFile.fromBytes(patch(good, 4, (d) => d.setUint32(0, 1, true))),
      'version',
      /version 1 is not 2 or 3 \(GGUF v1/,
    );
    expectGgufError(() => GgufFile.fromBytes(patch(good, 4, (d) => d.setUint32(0, 3, false))), 'version', /big-endian/);
  });

  it('counts larger than the file are refused before allocating', () => {
    expectGgufError(
      () => GgufFile.fromBytes(patch(good, 8, (d) => d.setBigUint64(0, 2n ** 62n, true))),
      'count',
      /at byte 8: tensor_count: count 4611686018427387904/,
    );
    expectGgufError(
      () => GgufFile.fromBytes(patch(good, 16, (d) => d.setBigUint64(0, 2n ** 64n - 1n, true))),
      'count',
      /metadata_kv_count/,
    );
    // key length
    expectGgufError(
      () => GgufFile.fromBytes(patch(good, 24, (d) => d.setBigUint64(0, 10n ** 12n, true))),
      'count',
      /at byte 24: metadata\[0\] key/,
    );
    // array count of a huge string array
    const arr = buildGguf({ metadata: [['s', { t: GgufValueType.ARRAY, of: GgufValueType.STRING, v: ['a', 'b'] }]] });
    const countAt = 24 + 8 + 1 + 4 + 4; // key len, "s", type, element type
    expectGgufError(
      () => GgufFile.fromBytes(patch(arr, countAt, (d) => d.setBigUint64(0, 2n ** 40n, true))),
      'count',
      /metadata "s" array count: count 1099511627776 × at least 8 bytes/,
    );
  });

  it('bad values: unknown type, bool byte, utf-8, duplicate key, alignment, nesting', () => {
    const vt = 24 + 8 + 1; // value type of key "a"
    expectGgufError(
      () => GgufFile.fromBytes(patch(good, vt, (d) => d.setUint32(0, 13, true))),
      'value-type',
      /at byte 33: metadata "a": unknown value type 13/,
    );
    const b = buildGguf({ metadata: [['b', { t: GgufValueType.BOOL, v: true }]] });
    expectGgufError(
      () => GgufFile.fromBytes(patch(b, vt + 4, (d) => d.setUint8(0, 2))),
      'value-type',
      /bool byte is 2/,
    );
    expectGgufError(
      () => GgufFile.fromBytes(patch(good, 32, (d) => d.setUint8(0, 0xff))),
      'utf8',
      /metadata\[0\] key: string of 1 bytes is not valid UTF-8/,
    );
    const dup = buildGguf({
      metadata: [
        ['k', { t: GgufValueType.UINT8, v: 1 }],
        ['k', { t: GgufValueType.UINT8, v: 2 }],
      ],
    });
    expectGgufError(
      () => GgufFile.fromBytes(dup),
      'duplicate-key',
      /metadata "k": key appears twice \(first at byte 24\)/,
    );
    expectGgufError(
      () => GgufFile.fromBytes(buildGguf({ alignment: 24 })),
      'alignment',
      /general\.alignment.*power of two, got UINT32 24/,
    );
    expectGgufError(
      () => GgufFile.fromBytes(buildGguf({ metadata: [['general.alignment', { t: GgufValueType.UINT64, v: 32n }]] })),
      'alignment',
    );
    let deep: { t: GgufValueType.ARRAY; of: GgufValueType; v: unknown[] } = {
      t: GgufValueType.ARRAY,
      of: GgufValueType.UINT8,
      v: [1],
    };
    for (let i = 0; i < 9; i++) deep = { t: GgufValueType.ARRAY, of: GgufValueType.ARRAY, v: [deep] };
    expectGgufError(
      () => GgufFile.fromBytes(buildGguf({ metadata: [['deep', deep as never]] })),
      'value-type',
      /nested deeper than 8/,
    );
  });

  it('bad tensor infos and layouts', () => {
    const one = (t: Parameters<typeof buildGguf>[0]) => () => GgufFile.fromBytes(buildGguf(t), 't.gguf');
    expectGgufError(
      one({ tensors: [{ name: 'w', type: 99, ggmlShape: [8], data: new Uint8Array(8) }] }),
      'tensor-info',
      /tensor "w" type: unknown ggml type id 99/,
    );
    expectGgufError(
      one({ tensors: [{ name: 'w', type: GgmlType.Q4_1, ggmlShape: [48, 2], data: new Uint8Array(60) }] }),
      'tensor-info',
      /ne\[0\] = 48 is not a multiple of the Q4_1 block size 32/,
    );
    expectGgufError(
      one({ tensors: [{ name: 'w', type: GgmlType.F32, ggmlShape: [1, 1, 1, 1, 1] }] }),
      'tensor-info',
      /n_dims 5 exceeds 4/,
    );
    expectGgufError(
      one({
        tensors: [
          { name: 'w', type: GgmlType.F32, ggmlShape: [4] },
          { name: 'w', type: GgmlType.F32, ggmlShape: [4] },
        ],
      }),
      'tensor-info',
      /appears twice/,
    );
    expectGgufError(
      one({ tensors: [{ name: 'w', type: GgmlType.F32, ggmlShape: [2 ** 40, 2 ** 40], data: new Uint8Array(4) }] }),
      'tensor-info',
      /more than the whole file/,
    );
    // offsets: misaligned, out of order, past the end
    const two = buildGguf({
      tensors: [
        { name: 'a', type: GgmlType.F32, ggmlShape: [8] },
        { name: 'b', type: GgmlType.F32, ggmlShape: [8] },
      ],
    });
    const g = GgufFile.fromBytes(two);
    expect(g.info('b').offsetBytes).toBe(32);
    const infoEnd = 24 + (8 + 1 + 4 + 8 + 4 + 8) * 2; // the two tensor infos
    const offsetOfB = infoEnd - 8;
    expectGgufError(
      () => GgufFile.fromBytes(patch(two, offsetOfB, (d) => d.setBigUint64(0, 36n, true))),
      'tensor-offset',
      /tensor "b" offset: offset 36 is not a multiple of the alignment 32/,
    );
    expectGgufError(
      () => GgufFile.fromBytes(patch(two, offsetOfB, (d) => d.setBigUint64(0, 64n, true))),
      'tensor-offset',
      /offset 64, expected 32/,
    );
    expectGgufError(
      () => GgufFile.fromBytes(patch(two, offsetOfB, (d) => d.setBigUint64(0, 0n, true))),
      'tensor-offset',
      /offset 0, expected 32/,
    );
    expectGgufError(
      () => GgufFile.fromBytes(two.subarray(0, two.length - 40)),
      'tensor-offset',
      /runs past the end of the file/,
    );
    expect(tensorBytes(GgmlType.Q4_1, [64, 3])).toBe(120);
  });
});
