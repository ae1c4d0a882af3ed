/**
 * The safetensors on-disk format: dtypes, the error type, and header parsing + validation.
 *
 * Layout (all integers little-endian), per huggingface/safetensors `safetensors/src/tensor.rs`:
 *   bytes [0, 8)        u64 N = header length in bytes
 *   bytes [8, 8+N)      UTF-8 JSON object
 *                       `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__"?: {str: str}}`
 *                       (writers pad it with spaces to a multiple of 8 bytes)
 *   bytes [8+N, EOF)    the data region; `data_offsets` are relative to its start, `end` exclusive
 *
 * Validation rules (same acceptance as the reference crate, plus duplicate-key rejection):
 * - N ≤ 100_000_000 (the crate's MAX_HEADER_SIZE) and 8 + N ≤ file size;
 * - the header is valid UTF-8 and one JSON object, no duplicate keys;
 * - `__metadata__` is absent, null, or an object whose values are all strings;
 * - every dtype is known; every shape is an array of non-negative safe integers; `data_offsets` is
 *   `[begin, end]` with 0 ≤ begin ≤ end ≤ data-region length;
 * - product(shape) × dtype bits = (end − begin) × 8 exactly, computed in BigInt (no overflow);
 * - sorted by offset, tensors are contiguous: no overlap, no gap, and the last `end` equals the
 *   data-region length (the crate's `InvalidOffset` / `MetadataIncompleteBuffer`: it is strict about
 *   gaps and trailing bytes, so are we).
 * Unknown extra fields inside a tensor entry are ignored, as the crate's serde derive does.
 */

import {
  describeJsonValue,
  isJsonObject,
  own,
  parseStrictJson,
  StrictJsonError,
  type JsonValue,
} from './strict-json.js';

/** Largest accepted header, in bytes (the reference crate's `MAX_HEADER_SIZE`). */
export const SAFETENSORS_MAX_HEADER_BYTES = 100_000_000;

/** Per-dtype facts: element size in bits and the typed array used to view the data. */
const DTYPE_TABLE = {
  BOOL: { bits: 8, array: 'Uint8Array' },
  U8: { bits: 8, array: 'Uint8Array' },
  I8: { bits: 8, array: 'Int8Array' },
  F8_E5M2: { bits: 8, array: 'Uint8Array' },
  F8_E4M3: { bits: 8, array: 'Uint8Array' },
  F8_E8M0: { bits: 8, array: 'Uint8Array' },
  I16: { bits: 16, array: 'Int16Array' },
  U16: { bits: 16, array: 'Uint16Array' },
  F16: { bits: 16, array: 'Uint16Array' },
  BF16: { bits: 16, array: 'Uint16Array' },
  I32: { bits: 32, array: 'Int32Array' },
  U32: { bits: 32, array: 'Uint32Array' },
  F32: { bits: 32, array: 'Float32Array' },
  F64: { bits: 64, array: 'Float64Array' },
  I64: { bits: 64, array: 'BigInt64Array' },
  U64: { bits: 64, array: 'BigUint64Array' },
  // Sub-byte floats (packed, viewed as raw bytes).
  F4: { bits: 4, array: 'Uint8Array' },
  F6_E2M3: { bits: 6, array: 'Uint8Array' },
  F6_E3M2: { bits: 6, array: 'Uint8Array' },
} as const;

/** A safetensors dtype name as written in headers (`"BF16"`, `"F32"`, …). */
export type SafetensorsDtype = keyof typeof DTYPE_TABLE;

/** All dtype names this reader accepts. */
export const SAFETENSORS_DTYPES: readonly SafetensorsDtype[] = Object.keys(DTYPE_TABLE) as SafetensorsDtype[];

interface ArrayTypes {
  Uint8Array: Uint8Array;
  Int8Array: Int8Array;
  Uint16Array: Uint16Array;
  Int16Array: Int16Array;
  Uint32Array: Uint32Array;
  Int32Array: Int32Array;
  Float32Array: Float32Array;
  Float64Array: Float64Array;
  BigInt64Array: BigInt64Array;
  BigUint64Array: BigUint64Array;
}

/**
 * The typed array a dtype is viewed as: F32 → Float32Array, F64 → Float64Array, BF16/F16/U16 →
 * Uint16Array (raw bit patterns), I64 → BigInt64Array, BOOL/U8/F8_* and packed sub-byte dtypes →
 * Uint8Array, and so on. Elements are little-endian (the format's byte order).
 */
export type TypedArrayFor<D extends SafetensorsDtype> = ArrayTypes[(typeof DTYPE_TABLE)[D]['array']];

/** Any typed array a tensor can be viewed as. */
export type TensorData = ArrayTypes[keyof ArrayTypes];

const ARRAY_CTORS: {
  [K in keyof ArrayTypes]: {
    new (buffer: ArrayBuffer, byteOffset: number, length: number): ArrayTypes[K];
    BYTES_PER_ELEMENT: number;
  };
} = {
  Uint8Array,
  Int8Array,
  Uint16Array,
  Int16Array,
  Uint32Array,
  Int32Array,
  Float32Array,
  Float64Array,
  BigInt64Array,
  BigUint64Array,
};

/** True if `name` is a dtype this reader knows. */
export function isSafetensorsDtype(name: string): name is SafetensorsDtype {
  return Object.hasOwn(DTYPE_TABLE, name);
}

/** Element size of `dtype` in bits (4 for F4, 6 for F6_*, otherwise 8 × bytes). */
export function dtypeBits(dtype: SafetensorsDtype): number {
  return DTYPE_TABLE[dtype].bits;
}

/** Bytes per element of the typed array that `dtype` is viewed as (1 for packed sub-byte dtypes). */
export function dtypeViewBytes(dtype: SafetensorsDtype): number {
  return ARRAY_CTORS[DTYPE_TABLE[dtype].array].BYTES_PER_ELEMENT;
}

/**
 * Views `byteLength` bytes of `buffer` starting at `byteOffset` as the typed array of `dtype`.
 * Copies when `byteOffset` is not a multiple of the element size (typed arrays require alignment);
 * otherwise shares memory with `buffer`.
 */
export function viewAs<D extends SafetensorsDtype>(
  dtype: D,
  buffer: ArrayBuffer,
  byteOffset: number,
  byteLength: number,
): TypedArrayFor<D> {
  const ctor = ARRAY_CTORS[DTYPE_TABLE[dtype].array];
  const size = ctor.BYTES_PER_ELEMENT;
  if (byteOffset % size !== 0) {
    const copy = buffer.slice(byteOffset, byteOffset + byteLength);
    return new ctor(copy, 0, byteLength / size) as TypedArrayFor<D>;
  }
  return new ctor(buffer, byteOffset, byteLength / size) as TypedArrayFor<D>;
}

/** Which rule a {@link SafetensorsError} reports. */
export type SafetensorsRule =
  | 'io' // the file could not be opened/read, or changed size under us
  | 'file-too-small' // fewer than 8 bytes
  | 'header-too-large' // N > SAFETENSORS_MAX_HEADER_BYTES
  | 'header-length' // 8 + N > file size
  | 'header-utf8' // header bytes are not valid UTF-8
  | 'header-json' // header is not valid JSON (or has duplicate keys, or nests too deep)
  | 'header-not-object' // header JSON is not an object
  | 'metadata' // __metadata__ is not an object of strings
  | 'tensor-info' // a tensor entry is not an object or lacks a field
  | 'dtype' // unknown dtype
  | 'shape' // shape is not an array of non-negative safe integers
  | 'offsets' // data_offsets malformed, reversed, or outside the data region
  | 'byte-length' // product(shape) × dtype size ≠ end − begin
  | 'overlap' // two tensors share bytes
  | 'gap' // bytes between two tensors belong to none
  | 'incomplete-buffer' // data region longer than the tensors cover (trailing bytes)
  | 'tensor-not-found' // a name not in the file
  | 'dtype-mismatch' // caller expected another dtype
  | 'shape-mismatch' // caller expected another shape
  | 'range' // caller asked for rows/bytes outside the tensor
  | 'too-large' // a read does not fit in one JS ArrayBuffer
  | 'closed' // read after close()
  | 'index' // model.safetensors.index.json is malformed or disagrees with the shards
  | 'write'; // writeSafetensors was given inconsistent tensors

/**
 * The one error type thrown by the safetensors reader, writer and index loader. The message names
 * the file, the tensor (when there is one) and the rule broken.
 */
export class SafetensorsError extends Error {
  override readonly name = 'SafetensorsError';
  constructor(
    /** Path (or label, for in-memory buffers) of the file concerned. */
    readonly file: string,
    /** The rule broken. */
    readonly rule: SafetensorsRule,
    /** Human-readable detail. */
    readonly detail: string,
    /** The tensor concerned, if any. */
    readonly tensor?: string,
    options?: { cause?: unknown },
  ) {
    super(`${file}: ${tensor === undefined ? '' : `tensor ${JSON.stringify(tensor)}: `}${detail} [${rule}]`, options);
  }
}

/** One tensor's header entry, validated. */
export interface TensorInfo {
  /** Tensor name as in the header. */
  readonly name: string;
  readonly dtype: SafetensorsDtype;
  /** Dimensions, outermost first (row-major). `[]` for a scalar. */
  readonly shape: readonly number[];
  /** Number of elements, product(shape). */
  readonly numElements: number;
  /** [begin, end) in bytes, relative to the start of the data region. */
  readonly dataOffsets: readonly [number, number];
  /** end − begin, in bytes. */
  readonly byteLength: number;
}

/** A parsed, validated header. */
export interface SafetensorsHeader {
  /** N, the JSON header length in bytes. */
  readonly headerByteLength: number;
  /** 8 + N: absolute file offset of the data region, in bytes. */
  readonly dataStartBytes: number;
  /** Length of the data region in bytes (file size − 8 − N). */
  readonly dataByteLength: number;
  /** `__metadata__` (string → string), empty if absent. */
  readonly metadata: Readonly<Record<string, string>>;
  /** Tensors by name, in header order. */
  readonly tensors: ReadonlyMap<string, TensorInfo>;
}

/**
 * Reads N from the first 8 bytes and checks it against the file size.
 * @param prefix the first 8 bytes of the file.
 * @param fileByteLength total file size in bytes.
 * @returns N, the header length in bytes.
 * @throws {SafetensorsError} `file-too-small`, `header-too-large`, `header-length`.
 */
export function checkHeaderLength(file: string, prefix: Uint8Array, fileByteLength: number): number {
  if (fileByteLength < 8 || prefix.length < 8) {
    throw new SafetensorsError(
      file,
      'file-too-small',
      `file is ${fileByteLength} bytes; a safetensors file has at least 8`,
    );
  }
  const view = new DataView(prefix.buffer, prefix.byteOffset, 8);
  const n = view.getBigUint64(0, true);
  if (n > BigInt(SAFETENSORS_MAX_HEADER_BYTES)) {
    throw new SafetensorsError(
      file,
      'header-too-large',
      `header length ${n} bytes exceeds the limit of ${SAFETENSORS_MAX_HEADER_BYTES}`,
    );
  }
  const headerByteLength = Number(n);
  if (headerByteLength > fileByteLength - 8) {
    throw new SafetensorsError(
      file,
      'header-length',
      `header length ${headerByteLength} bytes exceeds file size ${fileByteLength} − 8`,
    );
  }
  return headerByteLength;
}

const UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/**
 * Parses and validates the JSON header (see the module comment for the rules).
 * @param headerBytes the N header bytes.
 * @param dataByteLength length of the data region in bytes (file size − 8 − N).
 * @throws {SafetensorsError} for every rule broken (first one found).
 */
export function parseHeader(file: string, headerBytes: Uint8Array, dataByteLength: number): SafetensorsHeader {
  let text: string;
  try {
    text = UTF8.decode(headerBytes);
  } catch (cause) {
    throw new SafetensorsError(file, 'header-utf8', 'header is not valid UTF-8', undefined, { cause });
  }
  let root: JsonValue;
  try {
    root = parseStrictJson(text, { maxDepth: 16 });
  } catch (cause) {
    if (!(cause instanceof StrictJsonError)) throw cause;
    throw new SafetensorsError(file, 'header-json', `header is not valid JSON: ${cause.message}`, undefined, { cause });
  }
  if (!isJsonObject(root)) {
    throw new SafetensorsError(
      file,
      'header-not-object',
      `header JSON must be an object, got ${describeJsonValue(root)}`,
    );
  }

  const metadata: Record<string, string> = Object.create(null) as Record<string, string>;
  const tensors = new Map<string, TensorInfo>();
  for (const [name, entry] of Object.entries(root)) {
    if (name === '__metadata__') {
      if (entry === null) continue;
      if (!isJsonObject(entry)) {
        throw new SafetensorsError(
          file,
          'metadata',
          `__metadata__ must be an object of strings, got ${describeJsonValue(entry)}`,
        );
      }
      for (const [k, v] of Object.entries(entry)) {
        if (typeof v !== 'string') {
          throw new SafetensorsError(
            file,
            'metadata',
            `__metadata__.${k} must be a string, got ${describeJsonValue(v)}`,
          );
        }
        metadata[k] = v;
      }
      continue;
    }
    tensors.set(name, parseTensorInfo(file, name, entry, dataByteLength));
  }
  checkLayout(file, [...tensors.values()], dataByteLength);
  return {
    headerByteLength: headerBytes.length,
    dataStartBytes: 8 + headerBytes.length,
    dataByteLength,
    metadata,
    tensors,
  };
}

function parseTensorInfo(file: string, name: string, entry: JsonValue, dataByteLength: number): TensorInfo {
  if (!isJsonObject(entry)) {
    throw new SafetensorsError(file, 'tensor-info', `entry must be an object, got ${describeJsonValue(entry)}`, name);
  }
  const dtype = own(entry, 'dtype');
  const shape = own(entry, 'shape');
  const offsets = own(entry, 'data_offsets');
  if (typeof dtype !== 'string') {
    throw new SafetensorsError(file, 'tensor-info', `dtype must be a string, got ${describeJsonValue(dtype)}`, name);
  }
  if (!isSafetensorsDtype(dtype)) {
    throw new SafetensorsError(
      file,
      'dtype',
      `unknown dtype ${JSON.stringify(dtype)}; known: ${SAFETENSORS_DTYPES.join(', ')}`,
      name,
    );
  }
  if (!Array.isArray(shape)) {
    throw new SafetensorsError(file, 'shape', `shape must be an array, got ${describeJsonValue(shape)}`, name);
  }
  // Element count: plain numbers while the product stays a safe integer, BigInt past that
  // (a hostile shape like [2^40, 2^40, 2^40] must not wrap or lose precision).
  let count = 1;
  let bigCount: bigint | undefined;
  const dims: number[] = new Array<number>(shape.length);
  for (let i = 0; i < shape.length; i++) {
    const d = shape[i];
    if (typeof d !== 'number' || !Number.isSafeInteger(d) || d < 0) {
      throw new SafetensorsError(
        file,
        'shape',
        `shape[${i}] must be a non-negative safe integer, got ${describeJsonValue(d)}`,
        name,
      );
    }
    dims[i] = d;
    if (bigCount !== undefined) bigCount *= BigInt(d);
    else if (d !== 0 && count > Number.MAX_SAFE_INTEGER / d) bigCount = BigInt(count) * BigInt(d);
    else count *= d;
  }
  const numElements = bigCount ?? BigInt(count);
  if (!Array.isArray(offsets) || offsets.length !== 2) {
    throw new SafetensorsError(
      file,
      'offsets',
      `data_offsets must be [begin, end], got ${describeJsonValue(offsets)}`,
      name,
    );
  }
  const b = offsets[0];
  const e = offsets[1];
  if (typeof b !== 'number' || !Number.isSafeInteger(b) || b < 0) {
    throw new SafetensorsError(
      file,
      'offsets',
      `data_offsets begin must be a non-negative safe integer, got ${describeJsonValue(b)}`,
      name,
    );
  }
  if (typeof e !== 'number' || !Number.isSafeInteger(e) || e < 0) {
    throw new SafetensorsError(
      file,
      'offsets',
      `data_offsets end must be a non-negative safe integer, got ${describeJsonValue(e)}`,
      name,
    );
  }
  if (e < b) throw new SafetensorsError(file, 'offsets', `data_offsets [${b}, ${e}] has end < begin`, name);
  if (e > dataByteLength) {
    throw new SafetensorsError(
      file,
      'offsets',
      `data_offsets [${b}, ${e}] exceed the data region of ${dataByteLength} bytes`,
      name,
    );
  }
  // Exact check in BigInt only when the fast Number product could be inexact.
  const bitsPerElement = dtypeBits(dtype);
  const fast = bigCount === undefined && count * bitsPerElement <= Number.MAX_SAFE_INTEGER;
  if (fast ? count * bitsPerElement !== (e - b) * 8 : numElements * BigInt(bitsPerElement) !== BigInt(e - b) * 8n) {
    const bits = numElements * BigInt(bitsPerElement);
    throw new SafetensorsError(
      file,
      'byte-length',
      `shape [${dims.join(', ')}] × ${dtype} (${dtypeBits(dtype)} bits) = ${bits} bits, ` +
        `but data_offsets span ${e - b} bytes`,
      name,
    );
  }
  return {
    name,
    dtype,
    shape: Object.freeze(dims),
    numElements: Number(numElements), // ≤ 8 × (e − b) bits ≤ 8 × file size: safe
    dataOffsets: Object.freeze([b, e] as [number, number]),
    byteLength: e - b,
  };
}

function checkLayout(file: string, infos: TensorInfo[], dataByteLength: number): void {
  infos.sort((x, y) => x.dataOffsets[0] - y.dataOffsets[0] || x.dataOffsets[1] - y.dataOffsets[1]);
  let cursor = 0;
  let previous: TensorInfo | undefined;
  for (const info of infos) {
    const [b, e] = info.dataOffsets;
    if (b < cursor) {
      throw new SafetensorsError(
        file,
        'overlap',
        `data_offsets [${b}, ${e}] overlap tensor ${JSON.stringify(previous?.name)} ending at ${cursor}`,
        info.name,
      );
    }
    if (b > cursor) {
      throw new SafetensorsError(
        file,
        'gap',
        `data_offsets begin at ${b} but the previous tensor ends at ${cursor}: ${b - cursor} bytes unaccounted`,
        info.name,
      );
    }
    cursor = e;
    previous = info;
  }
  if (cursor !== dataByteLength) {
    throw new SafetensorsError(
      file,
      'incomplete-buffer',
      `tensors cover ${cursor} bytes of a ${dataByteLength}-byte data region ` +
        `(${dataByteLength - cursor} trailing bytes)`,
    );
  }
}
