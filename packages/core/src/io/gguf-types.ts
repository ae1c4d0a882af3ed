/**
 * GGUF types: ggml tensor types and their block sizes, metadata value types, the reader's error type
 * and the parsed header records. The parser and its validation rules are in ./gguf-format.ts.
 *
 * Source: the GGUF spec, github.com/ggml-org/ggml `docs/gguf.md`, and ggml's `type_traits`.
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

/**
 * [elements per block, bytes per block] per ggml type (ggml `type_traits`; checked against pip `gguf`'s
 * GGML_QUANT_SIZES).
 */
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
      `${file}: ${offsetBytes === undefined ? '' : `at byte ${offsetBytes}: `}` +
        `${field === undefined ? '' : `${field}: `}${detail} [${rule}]`,
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
