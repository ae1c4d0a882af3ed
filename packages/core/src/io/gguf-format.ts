/**
 * The GGUF on-disk format: ggml tensor types, metadata value types, the error type, and the
 * bounds-checked parser of header + metadata + tensor infos.
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

/** Largest ggml tensor rank (`GGML_MAX_DIMS`). */
export const GGUF_MAX_DIMS = 4;
/** Default data-section alignment in bytes (`GGUF_DEFAULT_ALIGNMENT`). */
export const GGUF_DEFAULT_ALIGNMENT = 32;
/** Deepest accepted nesting of metadata arrays (arrays of arrays …). */
export const GGUF_MAX_ARRAY_DEPTH = 8;

/** Metadata value types (`gguf_type`, spec §"GGUF metadata value types"). Enum values only grow. */
export enum GgufValueType {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
}

/** ggml tensor types (`ggml_type`); gaps are ids ggml removed. Enum values only grow. */
export enum GgmlType {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
}

/** [elements per block, bytes per block] per ggml type (ggml `type_traits`; checked against pip `gguf`'s GGML_QUANT_SIZES). */
const GGML_BLOCK: Readonly<Record<number, readonly [number, number]>> = {
  [GgmlType.F32]: [1, 4],
  [GgmlType.F16]: [1, 2],
  [GgmlType.Q4_0]: [32, 18],
  [GgmlType.Q4_1]: [32, 20],
  [GgmlType.Q5_0]: [32, 22],
  [GgmlType.Q5_1]: [32, 24],
  [GgmlType.Q8_0]: [32, 34],
  [GgmlType.Q8_1]: [32, 40],
  [GgmlType.Q2_K]: [256, 84],
  [GgmlType.Q3_K]: [256, 110],
  [GgmlType.Q4_K]: [256, 144],
  [GgmlType.Q5_K]: [256, 176],
  [GgmlType.Q6_K]: [256, 210],
  [GgmlType.Q8_K]: [256, 292],
  [GgmlType.IQ2_XXS]: [256, 66],
  [GgmlType.IQ2_XS]: [256, 74],
  [GgmlType.IQ3_XXS]: [256, 98],
  [GgmlType.IQ1_S]: [256, 50],
  [GgmlType.IQ4_NL]: [32, 18],
  [GgmlType.IQ3_S]: [256, 110],
  [GgmlType.IQ2_S]: [256, 82],
  [GgmlType.IQ4_XS]: [256, 136],
  [GgmlType.I8]: [1, 1],
  [GgmlType.I16]: [1, 2],
  [GgmlType.I32]: [1, 4],
  [GgmlType.I64]: [1, 8],
  [GgmlType.F64]: [1, 8],
  [GgmlType.IQ1_M]: [256, 56],
  [GgmlType.BF16]: [1, 2],
  [GgmlType.TQ1_0]: [256, 54],
  [GgmlType.TQ2_0]: [256, 66],
  [GgmlType.MXFP4]: [32, 17],
};

/** The ggml types whose bytes this reader hands out and dequantizes. */
export const GGUF_SUPPORTED_TYPES: readonly GgmlType[] = [
  GgmlType.F32,
  GgmlType.F16,
  GgmlType.BF16,
  GgmlType.Q8_0,
  GgmlType.Q4_0,
  GgmlType.Q4_1,
];

/** True if tensors of `type` can be read and dequantized. */
export function isSupportedGgmlType(type: GgmlType): boolean {
  return GGUF_SUPPORTED_TYPES.includes(type);
}

/** Name of a ggml type id (`"Q4_1"`), or `"type<id>"` for an id ggml does not define. */
export function ggmlTypeName(type: number): string {
  return GgmlType[type] ?? `type${type}`;
}

/** `[elementsPerBlock, bytesPerBlock]` of ggml type `type`, or undefined for an unknown id. */
export function ggmlBlockSize(type: number): readonly [number, number] | undefined {
  return Object.hasOwn(GGML_BLOCK, type) ? GGML_BLOCK[type] : undefined;
}

/** Which rule a {@link GgufError} reports. */
export type GgufRule =
  | 'io' // the file could not be read
  | 'magic' // not "GGUF"
  | 'version' // not 2 or 3
  | 'truncated' // a field runs past the end of the file
  | 'count' // a count/length cannot fit in the bytes that remain
  | 'utf8' // a string is not valid UTF-8
  | 'value-type' // unknown metadata value type / bad array nesting
  | 'duplicate-key' // a metadata key appears twice
  | 'alignment' // general.alignment is not a u32 power of two
  | 'tensor-info' // n_dims, ne, or type invalid; duplicate tensor name
  | 'tensor-offset' // offset misaligned, out of order, or outside the file
  | 'metadata-missing' // a getter found no such key
  | 'metadata-type' // a getter found another type
  | 'tensor-not-found' // a tensor name not in the file
  | 'unsupported-type'; // reading a tensor whose ggml type we do not decode

/** The one error type of the GGUF reader. The message names the file, the byte offset and the field. */
export class GgufError extends Error {
  override readonly name = 'GgufError';
  constructor(
    /** Path (or label, for in-memory files). */
    readonly file: string,
    /** The rule broken. */
    readonly rule: GgufRule,
    /** Human-readable detail. */
    readonly detail: string,
    /** The field concerned (`metadata "general.alignment"`, `tensor "blk.0.attn_q.weight" ne[1]`, …). */
    readonly field?: string,
    /** Absolute byte offset in the file where the field starts, when there is one. */
    readonly offsetBytes?: number,
    options?: { cause?: unknown },
  ) {
    super(
      `${file}: ${offsetBytes === undefined ? '' : `at byte ${offsetBytes}: `}${field === undefined ? '' : `${field}: `}${detail} [${rule}]`,
      options,
    );
  }
}

/** A metadata array: its element type and its items (typed arrays for numbers; copies, aligned). */
export type GgufArrayValue =
  | { readonly elementType: GgufValueType.UINT8; readonly items: Uint8Array }
  | { readonly elementType: GgufValueType.INT8; readonly items: Int8Array }
  | { readonly elementType: GgufValueType.UINT16; readonly items: Uint16Array }
  | { readonly elementType: GgufValueType.INT16; readonly items: Int16Array }
  | { readonly elementType: GgufValueType.UINT32; readonly items: Uint32Array }
  | { readonly elementType: GgufValueType.INT32; readonly items: Int32Array }
  | { readonly elementType: GgufValueType.FLOAT32; readonly items: Float32Array }
  | { readonly elementType: GgufValueType.FLOAT64; readonly items: Float64Array }
  | { readonly elementType: GgufValueType.UINT64; readonly items: BigUint64Array }
  | { readonly elementType: GgufValueType.INT64; readonly items: BigInt64Array }
  | { readonly elementType: GgufValueType.BOOL; readonly items: readonly boolean[] }
  | { readonly elementType: GgufValueType.STRING; readonly items: readonly string[] }
  | { readonly elementType: GgufValueType.ARRAY; readonly items: readonly GgufArrayValue[] };

/** A metadata value: numbers for ≤ 32-bit ints and floats, bigint for (U)INT64, or an array. */
export type GgufValue = number | bigint | boolean | string | GgufArrayValue;

/** One metadata key/value pair. */
export interface GgufMetadataEntry {
  readonly key: string;
  readonly type: GgufValueType;
  readonly value: GgufValue;
  /** Absolute byte offset of the entry's key in the file. */
  readonly offsetBytes: number;
}

/** One tensor's info, validated. */
export interface GgufTensorInfo {
  readonly name: string;
  /** ggml type id (see {@link GgmlType}); may be a type we list but cannot read. */
  readonly type: GgmlType;
  /** ggml type name (`"Q4_1"`). */
  readonly typeName: string;
  /** Dimensions in ggml order: `ne[0]` first, the contiguous (fastest-varying) one. */
  readonly ggmlShape: readonly number[];
  /** Dimensions in row-major order (ggmlShape reversed): a 2-D weight is `[rows, cols]` = `[ne[1], ne[0]]`. */
  readonly shape: readonly number[];
  /** product(shape) (1 for n_dims = 0). */
  readonly numElements: number;
  /** Offset of the tensor's bytes relative to the data section, in bytes (the file's `offset` field). */
  readonly offsetBytes: number;
  /** Absolute offset of the tensor's bytes in the file, in bytes. */
  readonly fileOffsetBytes: number;
  /** Size of the tensor's data in bytes: numElements / blockSize × bytesPerBlock (padding excluded). */
  readonly byteLength: number;
}

/** A parsed header: version, metadata, tensor infos and where the data section starts. */
export interface GgufHeader {
  readonly version: number;
  /** Metadata in file order. */
  readonly metadata: ReadonlyMap<string, GgufMetadataEntry>;
  /** Tensor infos in file order. */
  readonly tensors: ReadonlyMap<string, GgufTensorInfo>;
  /** `general.alignment` or 32, in bytes. */
  readonly alignment: number;
  /** Absolute offset of the data section, in bytes (end of the tensor infos, padded to `alignment`). */
  readonly dataStartBytes: number;
}

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
        `shape [${ggmlShape.join(', ')}] × ${ggmlTypeName(type)} = ${byteLength} bytes, more than the whole file (${bytes.length})`,
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
        `offset ${info.offsetBytes}, expected ${expected} (tensors are laid out in table order, each padded to ${alignment} bytes)`,
        field,
        at,
      );
    const fileOffsetBytes = dataStartBytes + info.offsetBytes;
    if (fileOffsetBytes + info.byteLength > bytes.length) {
      throw new GgufError(
        file,
        'tensor-offset',
        `data [${fileOffsetBytes}, ${fileOffsetBytes + info.byteLength}) runs past the end of the file (${bytes.length} bytes)`,
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
