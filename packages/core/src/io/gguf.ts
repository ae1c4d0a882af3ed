/**
 * Reading GGUF files: {@link GgufFile} (format and validation rules: ./gguf-format.ts; spec:
 * github.com/ggml-org/ggml `docs/gguf.md`).
 *
 * How bytes are read: {@link GgufFile.open} reads the whole file into one Buffer (`fs.readFileSync`)
 * and parses it in memory; tensor bytes are zero-copy `subarray` views of that buffer. This suits
 * the models we target (SmolLM2-135M Q4_1 is 98 MB) and means a file truncated or changed after
 * opening cannot produce a short read later. A file larger than {@link GGUF_MAX_IN_MEMORY_BYTES} is
 * refused (an fd-based reader like SafetensorsFile's would be the next step for multi-GB files).
 * Views stay valid as long as the GgufFile is referenced; there is nothing to close.
 */

import * as fs from 'node:fs';
import { endianness } from 'node:os';

import { dequantize, type GgufTensorView } from './gguf-dequant.js';
import {
  GgmlType,
  GgufError,
  GgufValueType,
  isSupportedGgmlType,
  type GgufArrayValue,
  type GgufHeader,
  type GgufMetadataEntry,
  type GgufTensorInfo,
  type GgufValue,
} from './gguf-types.js';
import { describeValue, parseGguf } from './gguf-format.js';

/** Largest file {@link GgufFile.open} reads into memory, in bytes (2 GiB − 1: one Node Buffer). */
export const GGUF_MAX_IN_MEMORY_BYTES = 2 ** 31 - 1;

/** A parsed GGUF file held in memory. Immutable. */
export class GgufFile {
  /** GGUF version (2 or 3). */
  readonly version: number;
  /** `general.alignment` (default 32), in bytes. */
  readonly alignment: number;
  /** Absolute offset of the data section, in bytes. */
  readonly dataStartBytes: number;
  /** Metadata in file order. */
  readonly metadata: ReadonlyMap<string, GgufMetadataEntry>;
  /** File size in bytes. */
  readonly byteLength: number;

  private readonly tensorInfos: ReadonlyMap<string, GgufTensorInfo>;

  private constructor(
    /** The path (or label) used in errors. */
    readonly file: string,
    private readonly bytes: Uint8Array,
    header: GgufHeader,
  ) {
    this.version = header.version;
    this.alignment = header.alignment;
    this.dataStartBytes = header.dataStartBytes;
    this.metadata = header.metadata;
    this.tensorInfos = header.tensors;
    this.byteLength = bytes.length;
  }

  /**
   * Reads and parses the GGUF file at `path`.
   * @throws {GgufError} `io` if it cannot be read or is larger than {@link GGUF_MAX_IN_MEMORY_BYTES};
   *   any parse rule otherwise (see gguf-format.ts).
   */
  static open(path: string): GgufFile {
    if (endianness() !== 'LE') throw new GgufError(path, 'io', 'this reader needs a little-endian host');
    let bytes: Buffer;
    try {
      const size = fs.statSync(path).size;
      if (size > GGUF_MAX_IN_MEMORY_BYTES)
        throw new GgufError(
          path,
          'io',
          `file is ${size} bytes; GgufFile reads files of at most ${GGUF_MAX_IN_MEMORY_BYTES} bytes into memory`,
        );
      bytes = fs.readFileSync(path);
    } catch (cause) {
      if (cause instanceof GgufError) throw cause;
      throw new GgufError(path, 'io', `cannot read: ${(cause as Error).message}`, undefined, undefined, { cause });
    }
    return new GgufFile(path, bytes, parseGguf(path, bytes));
  }

  /**
   * Parses a GGUF file already in memory. Tensor views share `bytes` (do not mutate it afterwards).
   * @throws {GgufError} as {@link open}.
   */
  static fromBytes(bytes: Uint8Array, label = '<memory>'): GgufFile {
    return new GgufFile(label, bytes, parseGguf(label, bytes));
  }

  // ---- metadata ----------------------------------------------------------------------------

  /** True if metadata `key` exists. */
  has(key: string): boolean {
    return this.metadata.has(key);
  }

  /** The raw value of `key`, or undefined. */
  get(key: string): GgufValue | undefined {
    return this.metadata.get(key)?.value;
  }

  /** STRING value of `key`. @throws {GgufError} `metadata-missing` / `metadata-type`. */
  getString(key: string): string {
    return this.typed(key, GgufValueType.STRING) as string;
  }

  /** UINT32 value of `key`. @throws {GgufError} `metadata-missing` / `metadata-type`. */
  getU32(key: string): number {
    return this.typed(key, GgufValueType.UINT32) as number;
  }

  /** FLOAT32 value of `key` (as a JS number, exact). @throws {GgufError} `metadata-missing` / `metadata-type`. */
  getF32(key: string): number {
    return this.typed(key, GgufValueType.FLOAT32) as number;
  }

  /** BOOL value of `key`. @throws {GgufError} `metadata-missing` / `metadata-type`. */
  getBool(key: string): boolean {
    return this.typed(key, GgufValueType.BOOL) as boolean;
  }

  /**
   * ARRAY value of `key`; with `elementType`, also checks the element type.
   * @throws {GgufError} `metadata-missing` / `metadata-type`.
   */
  getArray(key: string, elementType?: GgufValueType): GgufArrayValue {
    const entry = this.entry(key);
    const v = entry.value;
    if (
      entry.type !== GgufValueType.ARRAY ||
      typeof v !== 'object' ||
      (elementType !== undefined && v.elementType !== elementType)
    ) {
      const want = elementType === undefined ? 'ARRAY' : `ARRAY of ${GgufValueType[elementType]}`;
      throw new GgufError(
        this.file,
        'metadata-type',
        `expected ${want}, got ${this.describeEntry(entry)}`,
        `metadata ${JSON.stringify(key)}`,
        entry.offsetBytes,
      );
    }
    return v;
  }

  /** ARRAY of STRING value of `key`. @throws {GgufError} `metadata-missing` / `metadata-type`. */
  getStringArray(key: string): readonly string[] {
    return this.getArray(key, GgufValueType.STRING).items as readonly string[];
  }

  private entry(key: string): GgufMetadataEntry {
    const e = this.metadata.get(key);
    if (e === undefined)
      throw new GgufError(this.file, 'metadata-missing', 'no such metadata key', `metadata ${JSON.stringify(key)}`);
    return e;
  }

  private typed(key: string, type: GgufValueType): GgufValue {
    const entry = this.entry(key);
    if (entry.type !== type) {
      throw new GgufError(
        this.file,
        'metadata-type',
        `expected ${GgufValueType[type]}, got ${this.describeEntry(entry)}`,
        `metadata ${JSON.stringify(key)}`,
        entry.offsetBytes,
      );
    }
    return entry.value;
  }

  private describeEntry(e: GgufMetadataEntry): string {
    return `${GgufValueType[e.type]} ${describeValue(e.value)}`;
  }

  // ---- tensors -----------------------------------------------------------------------------

  /** All tensor infos in file order (including types we cannot read). */
  tensors(): GgufTensorInfo[] {
    return [...this.tensorInfos.values()];
  }

  /** The info of tensor `name`. @throws {GgufError} `tensor-not-found`. */
  info(name: string): GgufTensorInfo {
    const t = this.tensorInfos.get(name);
    if (t === undefined)
      throw new GgufError(
        this.file,
        'tensor-not-found',
        `no such tensor (${this.tensorInfos.size} tensors in the file)`,
        `tensor ${JSON.stringify(name)}`,
      );
    return t;
  }

  /**
   * Tensor `name`'s encoded bytes, zero-copy: `[info.byteLength]` u8 (ggml blocks for Q types,
   * little-endian elements otherwise).
   * @throws {GgufError} `tensor-not-found`; `unsupported-tensor type` (rule `unsupported-type`) for
   *   types other than F32, F16, BF16, Q8_0, Q4_0, Q4_1.
   */
  tensor(name: string): GgufTensorView {
    const info = this.info(name);
    if (!isSupportedGgmlType(info.type)) {
      throw new GgufError(
        this.file,
        'unsupported-type',
        `unsupported tensor type ${info.typeName} (id ${info.type}); supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1`,
        `tensor ${JSON.stringify(name)}`,
        info.fileOffsetBytes,
      );
    }
    return { info, bytes: this.bytes.subarray(info.fileOffsetBytes, info.fileOffsetBytes + info.byteLength) };
  }

  /**
   * An F32 tensor as `[numElements]` f32 (row-major over `info.shape`); zero-copy when the data is
   * 4-byte aligned in memory, else a copy.
   * @throws {GgufError} `tensor-not-found`, `metadata-type` if the tensor is not F32.
   */
  f32(name: string): Float32Array {
    const { info, bytes } = this.tensor(name);
    if (info.type !== GgmlType.F32)
      throw new GgufError(
        this.file,
        'metadata-type',
        `tensor is ${info.typeName}, not F32 (use dequantize)`,
        `tensor ${JSON.stringify(name)}`,
        info.fileOffsetBytes,
      );
    if (bytes.byteOffset % 4 === 0) return new Float32Array(bytes.buffer, bytes.byteOffset, info.numElements);
    return new Float32Array(bytes.slice().buffer);
  }

  /**
   * Tensor `name` dequantized to f32: `[numElements]` in row-major order of `info.shape`.
   * @throws {GgufError} `tensor-not-found`, `unsupported-type`.
   */
  dequantize(name: string): Float32Array {
    return dequantize(this.tensor(name));
  }
}
