// A minimal GGUF v3 writer for bench-only synthetic checkpoints (bench/verify-dense.mjs); never part of a
// package. Layout (the GGUF spec, github.com/ggml-org/ggml docs/gguf.md, as core's parser in
// packages/core/src/io/gguf-format.ts reads it), all integers little-endian:
//   "GGUF" · u32 version 3 · u64 tensor count · u64 KV count
//   KVs: string key · u32 value type · value (string = u64 length + UTF-8; array = u32 element type + u64 count
//        + elements)
//   tensor infos: string name · u32 n_dims · n_dims × u64 ne (ne[0] the contiguous dimension) · u32 ggml type
//                 · u64 offset (from the data section's start; each tensor at the previous end padded to the
//                 alignment, as gguf.cpp lays them out)
//   zero padding to `general.alignment` (32 when absent) · the data section.
// The tensor data is streamed: each tensor's bytes come from its `data()` callback only when it is written, so
// a file of several GB never sits in memory at once. The file is written under a temporary name and renamed
// when complete (a killed run leaves no truncated file behind at `path`).
import * as fs from 'node:fs';

import { GgufValueType, ggmlBlockSize } from '@specd/core';

const SCALAR_BYTES = {
  [GgufValueType.UINT8]: 1,
  [GgufValueType.INT8]: 1,
  [GgufValueType.BOOL]: 1,
  [GgufValueType.UINT16]: 2,
  [GgufValueType.INT16]: 2,
  [GgufValueType.UINT32]: 4,
  [GgufValueType.INT32]: 4,
  [GgufValueType.FLOAT32]: 4,
  [GgufValueType.UINT64]: 8,
  [GgufValueType.INT64]: 8,
  [GgufValueType.FLOAT64]: 8,
};

/** Growing little-endian byte sink for the header (KVs and tensor infos). */
class Sink {
  constructor() {
    this.buf = Buffer.alloc(1 << 20);
    this.pos = 0;
  }
  need(n) {
    if (this.pos + n <= this.buf.length) return;
    const next = Buffer.alloc(Math.max(this.buf.length * 2, this.pos + n));
    this.buf.copy(next, 0, 0, this.pos);
    this.buf = next;
  }
  u32(v) {
    this.need(4);
    this.buf.writeUInt32LE(v, this.pos);
    this.pos += 4;
  }
  u64(v) {
    this.need(8);
    this.buf.writeBigUInt64LE(BigInt(v), this.pos);
    this.pos += 8;
  }
  bytes(b) {
    this.need(b.length);
    this.buf.set(b, this.pos);
    this.pos += b.length;
  }
  string(s) {
    const b = Buffer.from(s, 'utf8');
    this.u64(b.length);
    this.bytes(b);
  }
  scalar(type, v) {
    const n = SCALAR_BYTES[type];
    if (n === undefined) throw new TypeError(`gguf-write: value type ${type} is not a scalar type`);
    this.need(n);
    const b = this.buf;
    const p = this.pos;
    switch (type) {
      case GgufValueType.UINT8:
        b.writeUInt8(v, p);
        break;
      case GgufValueType.INT8:
        b.writeInt8(v, p);
        break;
      case GgufValueType.BOOL:
        b.writeUInt8(v ? 1 : 0, p);
        break;
      case GgufValueType.UINT16:
        b.writeUInt16LE(v, p);
        break;
      case GgufValueType.INT16:
        b.writeInt16LE(v, p);
        break;
      case GgufValueType.UINT32:
        b.writeUInt32LE(v, p);
        break;
      case GgufValueType.INT32:
        b.writeInt32LE(v, p);
        break;
      case GgufValueType.FLOAT32:
        b.writeFloatLE(v, p);
        break;
      case GgufValueType.UINT64:
        b.writeBigUInt64LE(BigInt(v), p);
        break;
      case GgufValueType.INT64:
        b.writeBigInt64LE(BigInt(v), p);
        break;
      case GgufValueType.FLOAT64:
        b.writeDoubleLE(v, p);
        break;
    }
    this.pos += n;
  }
  /** A value of `type` in core's GgufValue shape (arrays: { elementType, items }). */
  value(type, v) {
    if (type === GgufValueType.STRING) return this.string(v);
    if (type !== GgufValueType.ARRAY) return this.scalar(type, v);
    const { elementType, items } = v;
    this.u32(elementType);
    this.u64(items.length);
    if (ArrayBuffer.isView(items)) {
      // numeric arrays: typed arrays in host order (little-endian: core's reader refuses other hosts too)
      this.bytes(new Uint8Array(items.buffer, items.byteOffset, items.byteLength));
      return;
    }
    for (const item of items) this.value(elementType, item);
  }
}

/** Bytes of a tensor of ggml `type` and ggml shape `ne` (ne[0] contiguous). @throws for an unknown type. */
export function ggufTensorBytes(type, ne) {
  const block = ggmlBlockSize(type);
  if (block === undefined) throw new TypeError(`gguf-write: unknown ggml type ${type}`);
  const count = ne.reduce((a, b) => a * b, 1);
  if (ne[0] % block[0] !== 0) throw new RangeError(`gguf-write: ne[0] = ${ne[0]} is not a multiple of ${block[0]}`);
  return (count / block[0]) * block[1];
}

/**
 * Writes a GGUF v3 file.
 * @param path destination (written as `${path}.partial`, then renamed).
 * @param metadata `[{ key, type, value }]` in file order (core's GgufMetadataEntry shape: `type` a GgufValueType,
 *   `value` a number / bigint / boolean / string or `{ elementType, items }`); `general.alignment` (UINT32) sets the
 *   alignment, else 32.
 * @param tensors `[{ name, ne, type, data }]`: `ne` the ggml shape (ne[0] contiguous), `type` a GgmlType, `data()`
 *   returns the tensor's bytes (exactly ggufTensorBytes(type, ne) of them) when it is written.
 * @returns `{ tensorBytes, fileBytes, dataStart }` (tensorBytes: the sum of the tensors' bytes, without padding).
 */
export function writeGguf(path, metadata, tensors) {
  const alignEntry = metadata.find((e) => e.key === 'general.alignment');
  const alignment = alignEntry === undefined ? 32 : Number(alignEntry.value);
  const pad = (n) => Math.ceil(n / alignment) * alignment;
  const h = new Sink();
  h.bytes(Buffer.from('GGUF', 'latin1'));
  h.u32(3);
  h.u64(tensors.length);
  h.u64(metadata.length);
  for (const e of metadata) {
    h.string(e.key);
    h.u32(e.type);
    h.value(e.type, e.value);
  }
  let offset = 0;
  const sizes = [];
  for (const t of tensors) {
    const bytes = ggufTensorBytes(t.type, t.ne);
    sizes.push(bytes);
    h.string(t.name);
    h.u32(t.ne.length);
    for (const d of t.ne) h.u64(d);
    h.u32(t.type);
    h.u64(offset);
    offset = pad(offset + bytes);
  }
  const dataStart = pad(h.pos);
  const tmp = `${path}.partial`;
  const fd = fs.openSync(tmp, 'w');
  let tensorBytes = 0;
  let at = 0;
  try {
    const zeros = new Uint8Array(Math.max(alignment, 64));
    const writeAll = (b) => {
      let done = 0;
      while (done < b.length) done += fs.writeSync(fd, b, done, b.length - done);
      at += b.length;
    };
    writeAll(h.buf.subarray(0, h.pos));
    writeAll(zeros.subarray(0, dataStart - h.pos));
    tensors.forEach((t, i) => {
      const b = t.data();
      if (b.length !== sizes[i])
        throw new RangeError(`gguf-write: tensor ${t.name}: data() gave ${b.length} bytes, expected ${sizes[i]}`);
      writeAll(b);
      tensorBytes += b.length;
      if (i < tensors.length - 1) writeAll(zeros.subarray(0, pad(at - dataStart) - (at - dataStart)));
    });
  } finally {
    fs.closeSync(fd);
  }
  fs.renameSync(tmp, path);
  return { tensorBytes, fileBytes: at, dataStart };
}
