/** Test helper: writes small GGUF files in memory (layout as ggml's gguf.cpp writes it). */
import { f32ToF16, type GgmlType, ggmlBlockSize, GgufValueType } from '../../src/io/index.js';

/** A metadata value to write: the type tag decides the encoding. */
export type BuildValue =
  | { t: Exclude<GgufValueType, GgufValueType.ARRAY | GgufValueType.STRING>; v: number | bigint | boolean }
  | { t: GgufValueType.STRING; v: string }
  | { t: GgufValueType.ARRAY; of: GgufValueType; v: readonly (number | bigint | boolean | string | BuildValue)[] };

export interface BuildTensor {
  name: string;
  type: GgmlType | number;
  /** ggml order, ne[0] first. */
  ggmlShape: number[];
  /** Encoded bytes; zeros of the right size if absent. */
  data?: Uint8Array;
}

export interface BuildOptions {
  version?: number;
  alignment?: number;
  metadata?: [string, BuildValue][];
  tensors?: BuildTensor[];
}

class Writer {
  private chunks: number[] = [];
  get length(): number {
    return this.chunks.length;
  }
  bytes(b: ArrayLike<number>): void {
    for (let i = 0; i < b.length; i++) this.chunks.push(b[i]!);
  }
  u32(v: number): void {
    const b = new Uint8Array(4);
    new DataView(b.buffer).setUint32(0, v, true);
    this.bytes(b);
  }
  u64(v: number | bigint): void {
    const b = new Uint8Array(8);
    new DataView(b.buffer).setBigUint64(0, BigInt(v), true);
    this.bytes(b);
  }
  string(s: string): void {
    const b = new TextEncoder().encode(s);
    this.u64(b.length);
    this.bytes(b);
  }
  scalar(t: GgufValueType, v: number | bigint | boolean | string): void {
    const b = new Uint8Array(8);
    const dv = new DataView(b.buffer);
    switch (t) {
      case GgufValueType.UINT8:
        this.bytes([Number(v)]);
        return;
      case GgufValueType.INT8:
        dv.setInt8(0, Number(v));
        this.bytes(b.subarray(0, 1));
        return;
      case GgufValueType.BOOL:
        this.bytes([v ? 1 : 0]);
        return;
      case GgufValueType.UINT16:
        dv.setUint16(0, Number(v), true);
        this.bytes(b.subarray(0, 2));
        return;
      case GgufValueType.INT16:
        dv.setInt16(0, Number(v), true);
        this.bytes(b.subarray(0, 2));
        return;
      case GgufValueType.UINT32:
        dv.setUint32(0, Number(v), true);
        this.bytes(b.subarray(0, 4));
        return;
      case GgufValueType.INT32:
        dv.setInt32(0, Number(v), true);
        this.bytes(b.subarray(0, 4));
        return;
      case GgufValueType.FLOAT32:
        dv.setFloat32(0, Number(v), true);
        this.bytes(b.subarray(0, 4));
        return;
      case GgufValueType.FLOAT64:
        dv.setFloat64(0, Number(v), true);
        this.bytes(b);
        return;
      case GgufValueType.UINT64:
        dv.setBigUint64(0, BigInt(v as number | bigint), true);
        this.bytes(b);
        return;
      case GgufValueType.INT64:
        dv.setBigInt64(0, BigInt(v as number | bigint), true);
        this.bytes(b);
        return;
      case GgufValueType.STRING:
        this.string(String(v));
        return;
      default:
        throw new Error(`scalar ${t}`);
    }
  }
  value(bv: BuildValue): void {
    if (bv.t === GgufValueType.ARRAY) {
      this.u32(bv.of);
      this.u64(bv.v.length);
      for (const item of bv.v) {
        if (bv.of === GgufValueType.ARRAY) this.value(item as BuildValue);
        else this.scalar(bv.of, item as number);
      }
      return;
    }
    this.scalar(bv.t, bv.v);
  }
  pad(alignment: number): void {
    while (this.chunks.length % alignment !== 0) this.chunks.push(0);
  }
  done(): Uint8Array {
    return Uint8Array.from(this.chunks);
  }
}

/** Encoded byte size of a tensor. */
export function tensorBytes(type: number, ggmlShape: number[]): number {
  const [be, bb] = ggmlBlockSize(type)!;
  return (ggmlShape.reduce((a, b) => a * b, 1) / be) * bb;
}

/** A GGUF file: header, metadata, tensor infos, padding, data (each tensor padded to the alignment). */
export function buildGguf(opts: BuildOptions = {}): Uint8Array {
  const alignment = opts.alignment ?? 32;
  const metadata = [...(opts.metadata ?? [])];
  if (opts.alignment !== undefined) metadata.push(['general.alignment', { t: GgufValueType.UINT32, v: alignment }]);
  const tensors = opts.tensors ?? [];
  const w = new Writer();
  w.bytes([0x47, 0x47, 0x55, 0x46]);
  w.u32(opts.version ?? 3);
  w.u64(tensors.length);
  w.u64(metadata.length);
  for (const [k, v] of metadata) {
    w.string(k);
    w.u32(v.t);
    w.value(v);
  }
  let offset = 0;
  const datas: Uint8Array[] = [];
  for (const t of tensors) {
    w.string(t.name);
    w.u32(t.ggmlShape.length);
    for (const d of t.ggmlShape) w.u64(d);
    w.u32(t.type);
    w.u64(offset);
    const data = t.data ?? new Uint8Array(tensorBytes(t.type, t.ggmlShape));
    datas.push(data);
    offset += Math.ceil(data.length / alignment) * alignment;
  }
  w.pad(alignment);
  for (const d of datas) {
    w.bytes(d);
    w.pad(alignment);
  }
  return w.done();
}

/** IEEE binary16 bits of `x` (core's f32ToF16, under the name the tests use). */
export const f32ToF16Bits = f32ToF16;
