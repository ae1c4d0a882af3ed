/**
 * The GGUF on-disk format: the bounds-checked parser of header + metadata + tensor infos (the types
 * it produces, the ggml type table and the error type are in ./gguf-types.ts).
 *
 * Source: the GGUF spec, github.com/ggml-org/ggml `docs/gguf.md`, and its reference reader
 * `ggml/src/gguf.cpp` (whose acceptance rules we follow). Layout, all integers little-endian:
 *   u32 magic "GGUF" (bytes 47 47 55 46) · u32 version (2 or 3; v1 used u32 counts and is rejected)
 *   u64 tensor_count · u64 metadata_kv_count
 *   metadata_kv_count × { string key · u32 value_type · value }
 *   tensor_count × { string name · u32 n_dims (≤ 4) · n_dims × u64 ne · u32 ggml_type · u64 offset }
 *   padding to `general.alignment` (u32, a power of two; default 32) · the data section
 * where `string` = u64 byte length + UTF-8 bytes (no NUL), and an array value = u32 element type +
 * u64 count + elements. `ne[0]` is the fastest-varying (contiguous) dimension; `offset` is relative
 * to the start of the data section.
 *
 * Validation (same acceptance as gguf.cpp): magic, version ∈ {2, 3}; every length and count is
 * checked against the bytes that remain BEFORE anything is allocated (a hostile count cannot make us
 * allocate more than the file's size); keys and tensor names are valid UTF-8 and unique; array
 * nesting ≤ {@link GGUF_MAX_ARRAY_DEPTH}; `general.alignment`, when present, is a u32 power of two;
 * n_dims ≤ 4, each ne ≤ 2^53 − 1, product(ne) computed in BigInt; a block-quantized type needs
 * ne[0] % blockSize = 0; tensor offsets are multiples of the alignment and laid out like gguf.cpp
 * writes them (in table order, each at the previous end padded to the alignment); every tensor lies
 * inside the file. Unknown ggml type ids are rejected (their byte size is unknown); known but
 * unsupported types (K-quants, IQ*, …) parse and are listed, and reading them throws.
 */

import {
  GGUF_DEFAULT_ALIGNMENT,
  GGUF_MAX_ARRAY_DEPTH,
  GGUF_MAX_DIMS,
  type GgmlType,
  ggmlBlockSize,
  ggmlTypeName,
  type GgufArrayValue,
  GgufError,
  type GgufHeader,
  type GgufMetadataEntry,
  type GgufTensorInfo,
  type GgufValue,
  GgufValueType,
} from './gguf-types.js';
const UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** Minimum encoded size in bytes of one value of each metadata type (for count checks). */
function minValueBytes(type: GgufValueType): number {
  switch (type) {
    case GgufValueType.UINT8:
    case GgufValueType.INT8:
    case GgufValueType.BOOL:
      return 1;
    case GgufValueType.UINT16:
    case GgufValueType.INT16:
      return 2;
    case GgufValueType.UINT32:
    case GgufValueType.INT32:
    case GgufValueType.FLOAT32:
      return 4;
    case GgufValueType.UINT64:
    case GgufValueType.INT64:
    case GgufValueType.FLOAT64:
    case GgufValueType.STRING: // u64 length
      return 8;
    case GgufValueType.ARRAY: // u32 type + u64 count
      return 12;
  }
}

const TYPED_ARRAYS = {
  [GgufValueType.UINT8]: Uint8Array,
  [GgufValueType.INT8]: Int8Array,
  [GgufValueType.UINT16]: Uint16Array,
  [GgufValueType.INT16]: Int16Array,
  [GgufValueType.UINT32]: Uint32Array,
  [GgufValueType.INT32]: Int32Array,
  [GgufValueType.FLOAT32]: Float32Array,
  [GgufValueType.FLOAT64]: Float64Array,
  [GgufValueType.UINT64]: BigUint64Array,
  [GgufValueType.INT64]: BigInt64Array,
} as const;

/** A bounds-checked little-endian cursor over the file bytes. */
class Cursor {
  pos = 0;
  private readonly view: DataView;
  constructor(
    readonly file: string,
    readonly bytes: Uint8Array,
  ) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }
  get remaining(): number {
    return this.bytes.length - this.pos;
  }
  need(n: number, field: string): void {
    if (n > this.remaining) {
      throw new GgufError(
        this.file,
        'truncated',
        `needs ${n} bytes but the file ends ${this.remaining} bytes later (file is ${this.bytes.length} bytes)`,
        field,
        this.pos,
      );
    }
  }
  u8(field: string): number {
    this.need(1, field);
    return this.view.getUint8(this.pos++);
  }
  u32(field: string): number {
    this.need(4, field);
    const v = this.view.getUint32(this.pos, true);
    this.pos += 4;
    return v;
  }
  u64(field: string): bigint {
    this.need(8, field);
    const v = this.view.getBigUint64(this.pos, true);
    this.pos += 8;
    return v;
  }
  /** A u64 count of items of at least `minItemBytes` each, checked against the remaining bytes. */
  count(field: string, minItemBytes: number): number {
    const at = this.pos;
    const n = this.u64(field);
    if (n * BigInt(minItemBytes) > BigInt(this.remaining)) {
      throw new GgufError(
        this.file,
        'count',
        `count ${n} × at least ${minItemBytes} bytes each exceeds the ${this.remaining} bytes left in the file`,
        field,
        at,
      );
    }
    return Number(n);
  }
  string(field: string): string {
    const at = this.pos;
    const n = this.count(field, 1);
    const slice = this.bytes.subarray(this.pos, this.pos + n);
    this.pos += n;
    try {
      return UTF8.decode(slice);
    } catch (cause) {
      throw new GgufError(this.file, 'utf8', `string of ${n} bytes is not valid UTF-8`, field, at, { cause });
    }
  }
  /** A copy of the next `n` bytes in a fresh (aligned) ArrayBuffer. */
  copy(n: number): ArrayBuffer {
    const out = new Uint8Array(n);
    out.set(this.bytes.subarray(this.pos, this.pos + n));
    this.pos += n;
    return out.buffer;
  }
  scalar(type: GgufValueType, field: string): number | bigint | boolean {
    const size = minValueBytes(type);
    this.need(size, field);
    const p = this.pos;
    this.pos += size;
    const v = this.view;
    switch (type) {
      case GgufValueType.UINT8:
        return v.getUint8(p);
      case GgufValueType.INT8:
        return v.getInt8(p);
      case GgufValueType.UINT16:
        return v.getUint16(p, true);
      case GgufValueType.INT16:
        return v.getInt16(p, true);
      case GgufValueType.UINT32:
        return v.getUint32(p, true);
      case GgufValueType.INT32:
        return v.getInt32(p, true);
      case GgufValueType.FLOAT32:
        return v.getFloat32(p, true);
      case GgufValueType.FLOAT64:
        return v.getFloat64(p, true);
      case GgufValueType.UINT64:
        return v.getBigUint64(p, true);
      case GgufValueType.INT64:
        return v.getBigInt64(p, true);
      case GgufValueType.BOOL: {
        const b = v.getUint8(p);
        if (b > 1) throw new GgufError(this.file, 'value-type', `bool byte is ${b}, not 0 or 1`, field, p);
        return b === 1;
      }
      default:
        throw new Error(`unreachable: scalar type ${type}`);
    }
  }
}

function isValueType(t: number): t is GgufValueType {
  return Number.isInteger(t) && t >= 0 && t <= GgufValueType.FLOAT64;
}

function readValue(c: Cursor, type: GgufValueType, field: string, depth: number): GgufValue {
  if (type === GgufValueType.STRING) return c.string(field);
  if (type !== GgufValueType.ARRAY) return c.scalar(type, field);
  const at = c.pos;
  const elementType = c.u32(`${field} array element type`);
  if (!isValueType(elementType))
    throw new GgufError(c.file, 'value-type', `unknown array element type ${elementType}`, field, at);
  if (elementType === GgufValueType.ARRAY && depth + 1 >= GGUF_MAX_ARRAY_DEPTH) {
    throw new GgufError(c.file, 'value-type', `arrays nested deeper than ${GGUF_MAX_ARRAY_DEPTH}`, field, at);
  }
  const n = c.count(`${field} array count`, minValueBytes(elementType));
  switch (elementType) {
    case GgufValueType.STRING: {
      const items = new Array<string>(n);
      for (let i = 0; i < n; i++) items[i] = c.string(`${field}[${i}]`);
      return { elementType, items };
    }
    case GgufValueType.BOOL: {
      const items = new Array<boolean>(n);
      for (let i = 0; i < n; i++) items[i] = c.scalar(GgufValueType.BOOL, `${field}[${i}]`) as boolean;
      return { elementType, items };
    }
    case GgufValueType.ARRAY: {
      const items = new Array<GgufArrayValue>(n);
      for (let i = 0; i < n; i++)
        items[i] = readValue(c, GgufValueType.ARRAY, `${field}[${i}]`, depth + 1) as GgufArrayValue;
      return { elementType, items };
    }
    default: {
      const ctor = TYPED_ARRAYS[elementType];
      const buffer = c.copy(n * ctor.BYTES_PER_ELEMENT); // count() already checked n × size ≤ remaining
      return { elementType, items: new ctor(buffer) } as GgufArrayValue;
    }
  }
}

/**
 * Parses and validates a whole GGUF file held in memory (see the module comment for the rules).
 * @param bytes the entire file.
 * @throws {GgufError} for the first rule broken, naming the byte offset and the field.
 */
export function parseGguf(file: string, bytes: Uint8Array): GgufHeader {
  const c = new Cursor(file, bytes);
  c.need(4, 'magic');
  if (bytes[0] !== 0x47 || bytes[1] !== 0x47 || bytes[2] !== 0x55 || bytes[3] !== 0x46) {
    const got = [...bytes.subarray(0, 4)].map((b) => b.toString(16).padStart(2, '0')).join(' ');
    throw new GgufError(file, 'magic', `expected "GGUF" (47 47 55 46), got ${got}`, 'magic', 0);
  }
  c.pos = 4;
  const version = c.u32('version');
  if (version !== 2 && version !== 3) {
    const hint =
      version === 1
        ? ' (GGUF v1 is not supported: re-convert the model)'
        : version >= 1 << 16
          ? ' (byte-swapped: a big-endian GGUF, not supported)'
          : '';
    throw new GgufError(file, 'version', `version ${version} is not 2 or 3${hint}`, 'version', 4);
  }
  // Minimum sizes: a tensor info is ≥ 8 (name len) + 4 (n_dims) + 4 (type) + 8 (offset) bytes; a kv ≥ 8 + 4 + 1.
  const tensorCountAt = c.pos;
  const tensorCount64 = c.u64('tensor_count');
  const kvCount = c.count('metadata_kv_count', 13);
  if (tensorCount64 * 24n > BigInt(c.remaining)) {
    throw new GgufError(
      file,
      'count',
      `count ${tensorCount64} × at least 24 bytes each exceeds the ${c.remaining} bytes left in the file`,
      'tensor_count',
      tensorCountAt,
    );
  }
  const tensorCount = Number(tensorCount64);

  const metadata = new Map<string, GgufMetadataEntry>();
  for (let i = 0; i < kvCount; i++) {
    const at = c.pos;
    const key = c.string(`metadata[${i}] key`);
    if (metadata.has(key))
      throw new GgufError(
        file,
        'duplicate-key',
        `key appears twice (first at byte ${metadata.get(key)!.offsetBytes})`,
        `metadata ${JSON.stringify(key)}`,
        at,
      );
    const typeAt = c.pos;
    const type = c.u32(`metadata ${JSON.stringify(key)} type`);
    if (!isValueType(type))
      throw new GgufError(file, 'value-type', `unknown value type ${type}`, `metadata ${JSON.stringify(key)}`, typeAt);
    const value = readValue(c, type, `metadata ${JSON.stringify(key)}`, 0);
    metadata.set(key, { key, type, value, offsetBytes: at });
  }

  let alignment = GGUF_DEFAULT_ALIGNMENT;
  const al = metadata.get('general.alignment');
  if (al !== undefined) {
    if (
      al.type !== GgufValueType.UINT32 ||
      typeof al.value !== 'number' ||
      al.value === 0 ||
      (al.value & (al.value - 1)) !== 0
    ) {
      throw new GgufError(
        file,
        'alignment',
        `must be a u32 power of two, got ${GgufValueType[al.type]} ${describeValue(al.value)}`,
        'metadata "general.alignment"',
        al.offsetBytes,
      );
    }
    alignment = al.value;
  }

  const infos: { info: Omit<GgufTensorInfo, 'fileOffsetBytes'>; at: number }[] = [];
  const names = new Set<string>();
  for (let i = 0; i < tensorCount; i++) {
    const at = c.pos;
    const name = c.string(`tensor[${i}] name`);
    const field = `tensor ${JSON.stringify(name)}`;
    if (names.has(name)) throw new GgufError(file, 'tensor-info', 'tensor name appears twice', field, at);
    names.add(name);
    const dimsAt = c.pos;
    const nDims = c.u32(`${field} n_dims`);
    if (nDims > GGUF_MAX_DIMS)
      throw new GgufError(file, 'tensor-info', `n_dims ${nDims} exceeds ${GGUF_MAX_DIMS}`, `${field} n_dims`, dimsAt);
    const ggmlShape: number[] = [];
    let count = 1n;
    for (let d = 0; d < nDims; d++) {
      const neAt = c.pos;
      const ne = c.u64(`${field} ne[${d}]`);
      if (ne > BigInt(Number.MAX_SAFE_INTEGER))
        throw new GgufError(file, 'tensor-info', `ne[${d}] = ${ne} exceeds 2^53 − 1`, `${field} ne[${d}]`, neAt);
      ggmlShape.push(Number(ne));
      count *= ne;
    }
    const typeAt = c.pos;
    const type = c.u32(`${field} type`);
    const block = ggmlBlockSize(type);
    if (block === undefined)
      throw new GgufError(file, 'tensor-info', `unknown ggml type id ${type}`, `${field} type`, typeAt);
    const [blockElems, blockBytes] = block;
    if (nDims > 0 && ggmlShape[0]! % blockElems !== 0) {
      throw new GgufError(
        file,
        'tensor-info',
        `ne[0] = ${ggmlShape[0]} is not a multiple of the ${ggmlTypeName(type)} block size ${blockElems}`,
        `${field} ne[0]`,
        dimsAt + 4,
      );
    }
    const byteLength = (count / BigInt(blockElems)) * BigInt(blockBytes);
    if (byteLength > BigInt(bytes.length)) {
      throw new GgufError(
        file,
        'tensor-info',
        `shape [${ggmlShape.join(', ')}] × ${ggmlTypeName(type)} = ${byteLength} bytes, ` +
          `more than the whole file (${bytes.length})`,
        field,
        dimsAt,
      );
    }
    const offAt = c.pos;
    const offset = c.u64(`${field} offset`);
    if (offset > BigInt(bytes.length))
      throw new GgufError(
        file,
        'tensor-offset',
        `offset ${offset} is past the end of the file (${bytes.length} bytes)`,
        `${field} offset`,
        offAt,
      );
    infos.push({
      info: {
        name,
        type: type as GgmlType,
        typeName: ggmlTypeName(type),
        ggmlShape: Object.freeze(ggmlShape),
        shape: Object.freeze([...ggmlShape].reverse()),
        numElements: Number(count), // ≤ byteLength × blockElems ≤ file size × 256: safe
        offsetBytes: Number(offset),
        byteLength: Number(byteLength),
      },
      at: offAt,
    });
  }

  const dataStartBytes = padTo(c.pos, alignment);
  const tensors = new Map<string, GgufTensorInfo>();
  let expected = 0; // gguf.cpp: each tensor starts at the previous end padded to the alignment
  for (const { info, at } of infos) {
    const field = `tensor ${JSON.stringify(info.name)} offset`;
    if (info.offsetBytes % alignment !== 0)
      throw new GgufError(
        file,
        'tensor-offset',
        `offset ${info.offsetBytes} is not a multiple of the alignment ${alignment}`,
        field,
        at,
      );
    if (info.offsetBytes !== expected)
      throw new GgufError(
        file,
        'tensor-offset',
        `offset ${info.offsetBytes}, expected ${expected} ` +
          `(tensors are laid out in table order, each padded to ${alignment} bytes)`,
        field,
        at,
      );
    const fileOffsetBytes = dataStartBytes + info.offsetBytes;
    if (fileOffsetBytes + info.byteLength > bytes.length) {
      throw new GgufError(
        file,
        'tensor-offset',
        `data [${fileOffsetBytes}, ${fileOffsetBytes + info.byteLength}) ` +
          `runs past the end of the file (${bytes.length} bytes)`,
        field,
        at,
      );
    }
    expected = padTo(info.offsetBytes + info.byteLength, alignment);
    tensors.set(info.name, Object.freeze({ ...info, fileOffsetBytes }));
  }
  return { version, metadata, tensors, alignment, dataStartBytes };
}

function padTo(n: number, alignment: number): number {
  return Math.ceil(n / alignment) * alignment;
}

/** A short description of a metadata value for error messages. */
export function describeValue(v: GgufValue): string {
  if (typeof v === 'string') return JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}…` : v);
  if (typeof v === 'object') return `array of ${v.items.length} ${GgufValueType[v.elementType]}`;
  return String(v);
}
