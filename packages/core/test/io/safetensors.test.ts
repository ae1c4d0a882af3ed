import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

import {
  SafetensorsError,
  SafetensorsFile,
  serializeSafetensors,
  writeSafetensors,
  type SafetensorsRule,
  type TensorToWrite,
} from '../../src/io/index.js';
import { makeTempDir } from './helpers.js';

const dir = makeTempDir('st');
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

/** Builds a file from a raw header object and data bytes (for hand-made invalid files). */
function rawFile(header: unknown, data: Uint8Array | number = 0, headerText?: string): Uint8Array {
  const text = new TextEncoder().encode(headerText ?? JSON.stringify(header));
  const bytes = typeof data === 'number' ? new Uint8Array(data) : data;
  const out = new Uint8Array(8 + text.length + bytes.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(text.length), true);
  out.set(text, 8);
  out.set(bytes, 8 + text.length);
  return out;
}

function expectRule(fn: () => unknown, rule: SafetensorsRule, tensor?: string): SafetensorsError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(SafetensorsError);
    const e = err as SafetensorsError;
    expect(e.rule, e.message).toBe(rule);
    if (tensor !== undefined) {
      expect(e.tensor).toBe(tensor);
      expect(e.message).toContain(JSON.stringify(tensor));
    }
    return e;
  }
  throw new Error(`expected SafetensorsError ${rule}`);
}

const sample: Record<string, TensorToWrite> = {
  'w.f32': { dtype: 'F32', shape: [2, 3], data: new Float32Array([1, 2, 3, 4, 5, 6]) },
  'w.bf16': { dtype: 'BF16', shape: [3], data: new Uint16Array([0x3f80, 0x4000, 0xbf80]) },
  'w.f16': { dtype: 'F16', shape: [1, 1], data: new Uint16Array([0x3c00]) },
  'w.i64': { dtype: 'I64', shape: [2], data: new BigInt64Array([-1n, 1n << 40n]) },
  'w.u64': { dtype: 'U64', shape: [1], data: new BigUint64Array([2n ** 64n - 1n]) },
  'w.i32': { dtype: 'I32', shape: [2], data: new Int32Array([-7, 7]) },
  'w.u32': { dtype: 'U32', shape: [1], data: new Uint32Array([4e9]) },
  'w.i16': { dtype: 'I16', shape: [1], data: new Int16Array([-300]) },
  'w.u16': { dtype: 'U16', shape: [1], data: new Uint16Array([60000]) },
  'w.i8': { dtype: 'I8', shape: [2], data: new Int8Array([-128, 127]) },
  'w.u8': { dtype: 'U8', shape: [3], data: new Uint8Array([0, 1, 255]) },
  'w.bool': { dtype: 'BOOL', shape: [2], data: new Uint8Array([1, 0]) },
  'w.f64': { dtype: 'F64', shape: [], data: new Float64Array([Math.PI]) },
  'w.f8': { dtype: 'F8_E4M3', shape: [1], data: new Uint8Array([0x38]) },
  'w.empty': { dtype: 'F32', shape: [0, 4], data: new Float32Array(0) },
};

describe('safetensors round trip', () => {
  const file = path.join(dir, 'all.safetensors');
  writeSafetensors(file, sample, { format: 'pt', note: 'test' });

  it('reads every dtype back as its typed array, from disk', () => {
    const st = SafetensorsFile.open(file);
    try {
      expect(st.names().sort()).toEqual(Object.keys(sample).sort());
      expect(st.metadata).toEqual({ format: 'pt', note: 'test' });
      for (const [name, t] of Object.entries(sample)) {
        const got = st.read(name);
        expect(got.dtype).toBe(t.dtype);
        expect(got.shape).toEqual(t.shape);
        expect(got.data.constructor).toBe(t.data.constructor);
        expect(Array.from(got.data as ArrayLike<number | bigint>)).toEqual(
          Array.from(t.data as unknown as ArrayLike<number | bigint>),
        );
        expect(st.info(name).byteLength).toBe(t.data.byteLength);
      }
      const f32 = st.readTyped('w.f32', 'F32', [2, 3]);
      const typed: Float32Array = f32.data;
      expect(typed[5]).toBe(6);
      const bf16: Uint16Array = st.readTyped('w.bf16', 'BF16').data;
      expect(bf16[0]).toBe(0x3f80);
    } finally {
      st.close();
    }
  });

  it('pads the header to 8 bytes and aligns tensors', () => {
    const bytes = fs.readFileSync(file);
    const n = Number(bytes.readBigUInt64LE(0));
    expect(n % 8).toBe(0);
    const st = SafetensorsFile.fromBytes(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.length));
    for (const name of st.names()) {
      const info = st.info(name);
      const el = (sample[name]!.data as { BYTES_PER_ELEMENT?: number }).BYTES_PER_ELEMENT ?? 1;
      expect((8 + n + info.dataOffsets[0]) % el).toBe(0);
    }
  });

  it('in memory: shares aligned memory, copies unaligned', () => {
    const bytes = serializeSafetensors({ x: { dtype: 'F32', shape: [2], data: new Float32Array([1.5, -2]) } });
    const aligned = SafetensorsFile.fromBytes(bytes);
    const a = aligned.read('x').data as Float32Array;
    expect(a.buffer).toBe(bytes.buffer);
    expect(Array.from(a)).toEqual([1.5, -2]);
    // Same file at an odd offset inside a larger buffer: must copy, values unchanged.
    const shifted = new Uint8Array(bytes.length + 1);
    shifted.set(bytes, 1);
    const un = SafetensorsFile.fromBytes(shifted.subarray(1));
    const b = un.read('x').data as Float32Array;
    expect(b.buffer).not.toBe(shifted.buffer);
    expect(Array.from(b)).toEqual([1.5, -2]);
  });

  it('readRows reads a row block; readBytes a byte range', () => {
    const st = SafetensorsFile.open(file);
    const rows = st.readRows('w.f32', 1, 2);
    expect(rows.shape).toEqual([1, 3]);
    expect(Array.from(rows.data as Float32Array)).toEqual([4, 5, 6]);
    expect(Array.from(st.readRows('w.f32', 0, 0).data as Float32Array)).toEqual([]);
    expectRule(() => st.readRows('w.f32', 1, 3), 'range', 'w.f32');
    expectRule(() => st.readRows('w.f64', 0, 1), 'range', 'w.f64');
    const raw = st.readBytes('w.u8', 1, 3);
    expect(Array.from(raw)).toEqual([1, 255]);
    expectRule(() => st.readBytes('w.u8', 2, 4), 'range', 'w.u8');
    // readInto: into a caller-owned shared buffer at an offset.
    const shared = new Uint8Array(new SharedArrayBuffer(16), 4, 8);
    st.readInto('w.f32', shared, 16);
    expect(Array.from(new Float32Array(shared.buffer, 4, 2))).toEqual([5, 6]);
    expectRule(() => st.readInto('w.f32', shared, 17), 'range', 'w.f32');
    st.close();
  });

  it('async reads match sync reads; close waits for reads in flight', async () => {
    const st = SafetensorsFile.open(file);
    const names = st.names();
    const closing = Promise.all(names.map((n) => st.readAsync(n)));
    st.close(); // requested while reads are in flight: they still complete
    const got = await closing;
    const again = SafetensorsFile.open(file);
    for (const t of got)
      expect(Array.from(t.data as ArrayLike<number | bigint>)).toEqual(
        Array.from(again.read(t.name).data as ArrayLike<number | bigint>),
      );
    const into = new Uint8Array(8);
    await again.readIntoAsync('w.f32', into, 8);
    expect(Array.from(new Float32Array(into.buffer))).toEqual([3, 4]);
    await expect(again.readIntoAsync('w.f32', into, 20)).rejects.toBeInstanceOf(SafetensorsError);
    again.close();
    await expect(st.readAsync('w.f32')).rejects.toMatchObject({ rule: 'closed' });
    await expect(again.readAsync('nope')).rejects.toMatchObject({ rule: 'tensor-not-found' });
  });

  it('names missing tensors, dtype and shape mismatches, and use after close', () => {
    const st = SafetensorsFile.open(file);
    expectRule(() => st.read('nope'), 'tensor-not-found', 'nope');
    expectRule(() => st.readTyped('w.f32', 'BF16'), 'dtype-mismatch', 'w.f32');
    expectRule(() => st.readTyped('w.f32', 'F32', [3, 2]), 'shape-mismatch', 'w.f32');
    st.close();
    st.close();
    expectRule(() => st.read('w.f32'), 'closed');
  });

  it('writer rejects inconsistent tensors', () => {
    expectRule(
      () => serializeSafetensors({ x: { dtype: 'F32', shape: [3], data: new Float32Array(2) } }),
      'write',
      'x',
    );
    expectRule(
      () => serializeSafetensors({ __metadata__: { dtype: 'U8', shape: [0], data: new Uint8Array(0) } }),
      'write',
    );
  });

  it('reports io errors naming the file', () => {
    const e = expectRule(() => SafetensorsFile.open(path.join(dir, 'missing.safetensors')), 'io');
    expect(e.message).toContain('missing.safetensors');
    expectRule(() => SafetensorsFile.open(dir), 'io');
  });

  it('detects a file truncated after open (short read)', () => {
    const f = path.join(dir, 'shrink.safetensors');
    writeSafetensors(f, { x: { dtype: 'U8', shape: [4096], data: new Uint8Array(4096).fill(7) } });
    const st = SafetensorsFile.open(f);
    fs.truncateSync(f, 100);
    expectRule(() => st.read('x'), 'io');
    st.close();
  });
});

describe('safetensors header validation', () => {
  const ok = { a: { dtype: 'F32', shape: [2], data_offsets: [0, 8] } };
  const cases: [string, () => Uint8Array, SafetensorsRule, string?][] = [
    ['empty file', () => new Uint8Array(0), 'file-too-small'],
    ['7 bytes', () => new Uint8Array(7), 'file-too-small'],
    [
      'header length > 100 MB',
      () => {
        const b = rawFile(ok, 8);
        new DataView(b.buffer).setBigUint64(0, 100_000_001n, true);
        return b;
      },
      'header-too-large',
    ],
    [
      'header length 2^64 − 1',
      () => {
        const b = rawFile(ok, 8);
        new DataView(b.buffer).setBigUint64(0, 2n ** 64n - 1n, true);
        return b;
      },
      'header-too-large',
    ],
    [
      'header length past EOF',
      () => {
        const b = rawFile(ok, 8);
        new DataView(b.buffer).setBigUint64(0, BigInt(b.length), true);
        return b;
      },
      'header-length',
    ],
    [
      'invalid UTF-8',
      () => {
        const b = rawFile(null, 0, '{"a":1}');
        b[10] = 0xff;
        return b;
      },
      'header-utf8',
    ],
    ['not JSON', () => rawFile(null, 0, '{"a": '), 'header-json'],
    ['trailing garbage', () => rawFile(null, 0, '{} x'), 'header-json'],
    [
      'duplicate tensor',
      () =>
        rawFile(
          null,
          8,
          '{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}',
        ),
      'header-json',
    ],
    ['deep nesting', () => rawFile(null, 0, '['.repeat(10000) + ']'.repeat(10000)), 'header-json'],
    ['array header', () => rawFile([1, 2]), 'header-not-object'],
    ['string header', () => rawFile('x'), 'header-not-object'],
    ['metadata not strings', () => rawFile({ __metadata__: { a: 1 } }), 'metadata'],
    ['metadata array', () => rawFile({ __metadata__: [] }), 'metadata'],
    ['entry not object', () => rawFile({ a: 5 }), 'tensor-info', 'a'],
    ['dtype missing', () => rawFile({ a: { shape: [2], data_offsets: [0, 8] } }, 8), 'tensor-info', 'a'],
    ['unknown dtype', () => rawFile({ a: { dtype: 'F128', shape: [2], data_offsets: [0, 8] } }, 8), 'dtype', 'a'],
    ['proto dtype', () => rawFile({ a: { dtype: 'toString', shape: [2], data_offsets: [0, 8] } }, 8), 'dtype', 'a'],
    ['negative dim', () => rawFile({ a: { dtype: 'F32', shape: [-2], data_offsets: [0, 8] } }, 8), 'shape', 'a'],
    ['fractional dim', () => rawFile({ a: { dtype: 'F32', shape: [1.5], data_offsets: [0, 8] } }, 8), 'shape', 'a'],
    ['string dim', () => rawFile({ a: { dtype: 'F32', shape: ['2'], data_offsets: [0, 8] } }, 8), 'shape', 'a'],
    [
      'huge dim (bigint)',
      () => rawFile(null, 8, '{"a":{"dtype":"F32","shape":[18446744073709551617],"data_offsets":[0,8]}}'),
      'shape',
      'a',
    ],
    [
      'overflowing product',
      () => rawFile({ a: { dtype: 'F32', shape: [2 ** 40, 2 ** 40, 2 ** 40], data_offsets: [0, 8] } }, 8),
      'byte-length',
      'a',
    ],
    [
      'wrong byte length',
      () => rawFile({ a: { dtype: 'F32', shape: [3], data_offsets: [0, 8] } }, 8),
      'byte-length',
      'a',
    ],
    [
      'zero dim, nonzero bytes',
      () => rawFile({ a: { dtype: 'F32', shape: [0], data_offsets: [0, 8] } }, 8),
      'byte-length',
      'a',
    ],
    ['offsets not pair', () => rawFile({ a: { dtype: 'F32', shape: [2], data_offsets: [0] } }, 8), 'offsets', 'a'],
    ['negative offset', () => rawFile({ a: { dtype: 'F32', shape: [2], data_offsets: [-8, 0] } }, 8), 'offsets', 'a'],
    ['reversed offsets', () => rawFile({ a: { dtype: 'F32', shape: [2], data_offsets: [8, 0] } }, 8), 'offsets', 'a'],
    ['offsets past data', () => rawFile({ a: { dtype: 'F32', shape: [2], data_offsets: [8, 16] } }, 8), 'offsets', 'a'],
    [
      'offset 2^64',
      () =>
        rawFile(
          null,
          8,
          '{"a":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,18446744073709551616]}}',
        ),
      'offsets',
      'a',
    ],
    [
      'overlap',
      () =>
        rawFile(
          {
            a: { dtype: 'U8', shape: [8], data_offsets: [0, 8] },
            b: { dtype: 'U8', shape: [4], data_offsets: [4, 8] },
          },
          8,
        ),
      'overlap',
      'b',
    ],
    [
      'zero-size tensor inside another',
      () =>
        rawFile(
          {
            a: { dtype: 'U8', shape: [8], data_offsets: [0, 8] },
            b: { dtype: 'U8', shape: [0], data_offsets: [4, 4] },
          },
          8,
        ),
      'overlap',
      'b',
    ],
    ['gap', () => rawFile({ a: { dtype: 'U8', shape: [4], data_offsets: [4, 8] } }, 8), 'gap', 'a'],
    ['trailing bytes', () => rawFile({ a: { dtype: 'U8', shape: [4], data_offsets: [0, 4] } }, 8), 'incomplete-buffer'],
    [
      'F4 odd element count',
      () => rawFile({ a: { dtype: 'F4', shape: [3], data_offsets: [0, 2] } }, 2),
      'byte-length',
      'a',
    ],
  ];
  for (const [label, make, rule, tensor] of cases) {
    it(`rejects ${label} [${rule}]`, () => {
      const e = expectRule(() => SafetensorsFile.fromBytes(make(), 'hostile.safetensors'), rule, tensor);
      expect(e.message).toContain('hostile.safetensors');
    });
  }

  it(
    'accepts what the reference accepts: any key order, ' + 'padding spaces, null metadata, extra fields, empty file',
    () => {
      const data = new Uint8Array(12);
      const st = SafetensorsFile.fromBytes(
        rawFile(
          null,
          data,
          ' {"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12],"extra":1},"__metadata__":null,' +
            '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}   ',
        ),
      );
      expect(st.names()).toEqual(['b', 'a']);
      expect(SafetensorsFile.fromBytes(rawFile({})).names()).toEqual([]);
      // F4 packs two elements per byte.
      expect(
        SafetensorsFile.fromBytes(rawFile({ q: { dtype: 'F4', shape: [4], data_offsets: [0, 2] } }, 2)).read('q').data
          .length,
      ).toBe(2);
      // A tensor named __proto__ is just a name.
      expect(
        SafetensorsFile.fromBytes(
          rawFile(null, 1, '{"__proto__":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'),
        ).names(),
      ).toEqual(['__proto__']);
    },
  );
});
