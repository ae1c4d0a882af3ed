/**
 * Reading safetensors files: {@link SafetensorsFile}.
 *
 * How bytes are read: the file is opened once (`fs.openSync`), the 8-byte prefix and the header are
 * read and validated, and each tensor's bytes are read on demand with positioned `fs.readSync`
 * calls (or `fs.read` for the async variants) into a fresh `ArrayBuffer` of exactly the tensor's size.
 * Nothing else of the file is held in the JS heap. We do not mmap: Node has no built-in mmap, an
 * addon-backed mapping would make a
 * truncated file a SIGBUS (a process crash) instead of an error, and weights are repacked into
 * kernel layouts anyway, so one copy per tensor is needed regardless.
 * A fresh ArrayBuffer starts at offset 0, so typed views of it are always aligned. For in-memory
 * files ({@link SafetensorsFile.fromBytes}) views share the caller's memory when aligned and copy
 * otherwise.
 *
 * All reads are bounds-checked against the validated header, and a short read (the file shrank
 * after opening) is an error, never a partially filled tensor.
 */

import * as fs from 'node:fs';
import { endianness } from 'node:os';

import {
  checkHeaderLength,
  dtypeBits,
  parseHeader,
  SafetensorsError,
  viewAs,
  type SafetensorsDtype,
  type SafetensorsHeader,
  type TensorData,
  type TensorInfo,
  type TypedArrayFor,
} from './safetensors-format.js';

/** A tensor read from a file: its header entry plus its data. */
export interface LoadedTensor<D extends TensorData = TensorData> {
  readonly name: string;
  readonly dtype: SafetensorsDtype;
  /** Dimensions of `data`, outermost first (for {@link SafetensorsFile.readRows}, dim 0 is the row count read). */
  readonly shape: readonly number[];
  /** Elements in row-major order, little-endian; see {@link TypedArrayFor} for the array type per dtype. */
  readonly data: D;
}

/** Largest single read, in bytes (fs.readSync takes an int32 length). */
const MAX_READ_CHUNK_BYTES = 1 << 30;

/** Where the bytes come from: a file descriptor or an in-memory copy of the file. */
interface ByteSource {
  readonly byteLength: number;
  /** Reads exactly `target.length` bytes at absolute `positionBytes` into `target`. */
  readInto(target: Uint8Array, positionBytes: number): void;
  /** Async {@link readInto}: does not block the event loop; reads of one file may run concurrently. */
  readIntoAsync(target: Uint8Array, positionBytes: number): Promise<void>;
  /** Returns the bytes [positionBytes, positionBytes+length) without copying, if possible. */
  borrow?(positionBytes: number, length: number): { buffer: ArrayBuffer; byteOffset: number };
  close(): void;
}

class FdSource implements ByteSource {
  private fd: number | undefined;
  /** Async reads in flight; close() defers the real close until they finish (no fd reuse races). */
  private inFlight = 0;
  private closeRequested = false;
  constructor(
    private readonly file: string,
    fd: number,
    readonly byteLength: number,
  ) {
    this.fd = fd;
  }
  readInto(target: Uint8Array, positionBytes: number): void {
    if (this.fd === undefined || this.closeRequested)
      throw new SafetensorsError(this.file, 'closed', 'file was closed');
    let done = 0;
    while (done < target.length) {
      const want = Math.min(target.length - done, MAX_READ_CHUNK_BYTES);
      let got: number;
      try {
        got = fs.readSync(this.fd, target, done, want, positionBytes + done);
      } catch (cause) {
        throw new SafetensorsError(
          this.file,
          'io',
          `read of ${want} bytes at ${positionBytes + done} failed: ${String(cause)}`,
          undefined,
          { cause },
        );
      }
      if (got === 0) {
        throw new SafetensorsError(
          this.file,
          'io',
          `unexpected end of file at byte ${positionBytes + done} (file shrank after opening?)`,
        );
      }
      done += got;
    }
  }
  async readIntoAsync(target: Uint8Array, positionBytes: number): Promise<void> {
    if (this.fd === undefined || this.closeRequested)
      throw new SafetensorsError(this.file, 'closed', 'file was closed');
    const fd = this.fd;
    this.inFlight++;
    try {
      let done = 0;
      while (done < target.length) {
        const want = Math.min(target.length - done, MAX_READ_CHUNK_BYTES);
        const at = positionBytes + done;
        const got = await new Promise<number>((resolve, reject) => {
          fs.read(fd, target, done, want, at, (err, n) =>
            err
              ? reject(
                  new SafetensorsError(
                    this.file,
                    'io',
                    `read of ${want} bytes at ${at} failed: ${String(err)}`,
                    undefined,
                    { cause: err },
                  ),
                )
              : resolve(n),
          );
        });
        if (got === 0)
          throw new SafetensorsError(
            this.file,
            'io',
            `unexpected end of file at byte ${at} (file shrank after opening?)`,
          );
        done += got;
      }
    } finally {
      this.inFlight--;
      if (this.closeRequested && this.inFlight === 0) this.closeNow();
    }
  }
  close(): void {
    this.closeRequested = true;
    if (this.inFlight === 0) this.closeNow();
  }
  private closeNow(): void {
    if (this.fd !== undefined) {
      const fd = this.fd;
      this.fd = undefined;
      fs.closeSync(fd);
    }
  }
}

class MemorySource implements ByteSource {
  constructor(private readonly bytes: Uint8Array) {}
  get byteLength(): number {
    return this.bytes.length;
  }
  readInto(target: Uint8Array, positionBytes: number): void {
    target.set(this.bytes.subarray(positionBytes, positionBytes + target.length));
  }
  readIntoAsync(target: Uint8Array, positionBytes: number): Promise<void> {
    this.readInto(target, positionBytes);
    return Promise.resolve();
  }
  borrow(positionBytes: number): { buffer: ArrayBuffer; byteOffset: number } {
    return { buffer: this.bytes.buffer as ArrayBuffer, byteOffset: this.bytes.byteOffset + positionBytes };
  }
  close(): void {}
}

function checkHostEndianness(file: string): void {
  if (endianness() !== 'LE') {
    throw new SafetensorsError(file, 'io', 'safetensors data is little-endian; big-endian hosts are not supported');
  }
}

/**
 * One safetensors file, header validated at open, tensors read on demand.
 * Call {@link close} when done (releases the file descriptor).
 */
export class SafetensorsFile {
  private closed = false;

  private constructor(
    /** Path of the file (or the label given to {@link fromBytes}). */
    readonly path: string,
    private readonly source: ByteSource,
    /** The validated header. */
    readonly header: SafetensorsHeader,
  ) {}

  /**
   * Opens `path`, reads and validates the header; tensor data is not read yet.
   * @throws {SafetensorsError} `io` if the file cannot be opened; any header rule (see safetensors-format.ts).
   */
  static open(path: string): SafetensorsFile {
    checkHostEndianness(path);
    let fd: number;
    try {
      fd = fs.openSync(path, 'r');
    } catch (cause) {
      throw new SafetensorsError(path, 'io', `cannot open: ${(cause as Error).message}`, undefined, { cause });
    }
    try {
      const stat = fs.fstatSync(fd);
      if (!stat.isFile()) throw new SafetensorsError(path, 'io', 'not a regular file');
      const source = new FdSource(path, fd, stat.size);
      return SafetensorsFile.fromSource(path, source);
    } catch (err) {
      fs.closeSync(fd);
      throw err;
    }
  }

  /**
   * Parses a whole safetensors file already in memory. Tensor views share `bytes` when the tensor's
   * absolute byte offset is a multiple of the element size, and are copies otherwise.
   * @param label names the file in error messages.
   * @throws {SafetensorsError} any header rule.
   */
  static fromBytes(bytes: Uint8Array, label = '<memory>'): SafetensorsFile {
    checkHostEndianness(label);
    return SafetensorsFile.fromSource(label, new MemorySource(bytes));
  }

  private static fromSource(path: string, source: ByteSource): SafetensorsFile {
    const prefix = new Uint8Array(8);
    if (source.byteLength >= 8) source.readInto(prefix, 0);
    const headerByteLength = checkHeaderLength(path, prefix, source.byteLength);
    const headerBytes = new Uint8Array(headerByteLength);
    source.readInto(headerBytes, 8);
    const header = parseHeader(path, headerBytes, source.byteLength - 8 - headerByteLength);
    return new SafetensorsFile(path, source, header);
  }

  /** `__metadata__` of the file (string → string); empty if absent. */
  get metadata(): Readonly<Record<string, string>> {
    return this.header.metadata;
  }

  /** Tensor names in header order. */
  names(): string[] {
    return [...this.header.tensors.keys()];
  }

  /** True if the file holds a tensor called `name`. */
  has(name: string): boolean {
    return this.header.tensors.has(name);
  }

  /**
   * The header entry of `name`.
   * @throws {SafetensorsError} `tensor-not-found`.
   */
  info(name: string): TensorInfo {
    const info = this.header.tensors.get(name);
    if (info === undefined)
      throw new SafetensorsError(this.path, 'tensor-not-found', 'no such tensor in this file', name);
    return info;
  }

  /**
   * Reads the raw bytes of `name` (or of its byte range [startBytes, endBytes), relative to the
   * tensor) into a fresh, 0-offset buffer.
   * @throws {SafetensorsError} `tensor-not-found`, `range`, `too-large`, `io`, `closed`.
   */
  readBytes(name: string, startBytes = 0, endBytes?: number): Uint8Array {
    const info = this.info(name);
    const end = endBytes ?? info.byteLength;
    if (
      !Number.isSafeInteger(startBytes) ||
      !Number.isSafeInteger(end) ||
      startBytes < 0 ||
      end < startBytes ||
      end > info.byteLength
    ) {
      throw new SafetensorsError(
        this.path,
        'range',
        `byte range [${startBytes}, ${end}) outside [0, ${info.byteLength})`,
        name,
      );
    }
    const out = this.allocate(name, end - startBytes);
    this.readIntoChecked(out, this.header.dataStartBytes + info.dataOffsets[0] + startBytes);
    return out;
  }

  /**
   * Reads `target.length` bytes of `name`, starting `startBytes` into the tensor, into `target`
   * (a caller-owned buffer: e.g. a SharedArrayBuffer view that worker threads share, or a
   * pre-allocated staging buffer). No allocation.
   * @throws {SafetensorsError} `range` if the span leaves the tensor; `tensor-not-found`, `io`, `closed`.
   */
  readInto(name: string, target: Uint8Array, startBytes = 0): void {
    const info = this.info(name);
    if (!Number.isSafeInteger(startBytes) || startBytes < 0 || startBytes + target.length > info.byteLength) {
      throw new SafetensorsError(
        this.path,
        'range',
        `byte range [${startBytes}, ${startBytes + target.length}) outside [0, ${info.byteLength})`,
        name,
      );
    }
    this.readIntoChecked(target, this.header.dataStartBytes + info.dataOffsets[0] + startBytes);
  }

  /**
   * Reads the whole tensor `name` as its typed array (see {@link TypedArrayFor}).
   * @throws {SafetensorsError} `tensor-not-found`, `too-large`, `io`, `closed`.
   */
  read(name: string): LoadedTensor {
    const info = this.info(name);
    return { name, dtype: info.dtype, shape: info.shape, data: this.viewRange(info, 0, info.byteLength) };
  }

  /**
   * Async {@link read}: the event loop stays free while the bytes arrive, and reads of several
   * tensors (or shards) can be awaited together (`Promise.all`) to keep the disk busy.
   * @throws {SafetensorsError} as {@link read} (as a rejected promise).
   */
  async readAsync(name: string): Promise<LoadedTensor> {
    const info = this.info(name);
    if (this.closed) throw new SafetensorsError(this.path, 'closed', 'file was closed', name);
    const position = this.header.dataStartBytes + info.dataOffsets[0];
    if (this.source.borrow !== undefined) return this.read(name);
    const bytes = this.allocate(name, info.byteLength);
    await this.source.readIntoAsync(bytes, position);
    return {
      name,
      dtype: info.dtype,
      shape: info.shape,
      data: viewAs(info.dtype, bytes.buffer as ArrayBuffer, 0, info.byteLength),
    };
  }

  /**
   * Async {@link readInto}.
   * @throws {SafetensorsError} as {@link readInto} (as a rejected promise).
   */
  async readIntoAsync(name: string, target: Uint8Array, startBytes = 0): Promise<void> {
    const info = this.info(name);
    if (!Number.isSafeInteger(startBytes) || startBytes < 0 || startBytes + target.length > info.byteLength) {
      throw new SafetensorsError(
        this.path,
        'range',
        `byte range [${startBytes}, ${startBytes + target.length}) outside [0, ${info.byteLength})`,
        name,
      );
    }
    if (this.closed) throw new SafetensorsError(this.path, 'closed', 'file was closed', name);
    await this.source.readIntoAsync(target, this.header.dataStartBytes + info.dataOffsets[0] + startBytes);
  }

  /**
   * Reads `name`, checking its dtype (and shape, if given) first; the result is typed for `dtype`.
   * For model loaders: `file.readTyped('fc.weight', 'BF16', [hidden, 3 * hidden])` → Uint16Array.
   * @throws {SafetensorsError} `dtype-mismatch`, `shape-mismatch`, plus those of {@link read}.
   */
  readTyped<D extends SafetensorsDtype>(
    name: string,
    dtype: D,
    expectShape?: readonly number[],
  ): LoadedTensor<TypedArrayFor<D>> {
    const info = this.info(name);
    checkExpected(this.path, info, dtype, expectShape);
    return this.read(name) as LoadedTensor<TypedArrayFor<D>>;
  }

  /**
   * Reads rows [rowStart, rowEnd) along dimension 0 of `name` (for tensor/pipeline-parallel shards:
   * a rank reads only its block). The result's shape is `[rowEnd − rowStart, ...shape[1:]]`.
   * @throws {SafetensorsError} `range` if the tensor is a scalar, the range is outside `[0, shape[0]]`,
   *   or a row is not a whole number of bytes (packed sub-byte dtypes); plus those of {@link read}.
   */
  readRows(name: string, rowStart: number, rowEnd: number): LoadedTensor {
    const info = this.info(name);
    const rows = info.shape[0];
    if (rows === undefined) throw new SafetensorsError(this.path, 'range', 'readRows needs a tensor of rank ≥ 1', name);
    if (
      !Number.isSafeInteger(rowStart) ||
      !Number.isSafeInteger(rowEnd) ||
      rowStart < 0 ||
      rowEnd < rowStart ||
      rowEnd > rows
    ) {
      throw new SafetensorsError(this.path, 'range', `rows [${rowStart}, ${rowEnd}) outside [0, ${rows})`, name);
    }
    const rowElements = info.shape.slice(1).reduce((a, b) => a * b, 1);
    const rowBits = rowElements * dtypeBits(info.dtype);
    if (rowBits % 8 !== 0) {
      throw new SafetensorsError(
        this.path,
        'range',
        `a row of ${info.dtype} × ${rowElements} is not a whole number of bytes`,
        name,
      );
    }
    const rowBytes = rowBits / 8;
    return {
      name,
      dtype: info.dtype,
      shape: [rowEnd - rowStart, ...info.shape.slice(1)],
      data: this.viewRange(info, rowStart * rowBytes, rowEnd * rowBytes),
    };
  }

  /** Releases the file descriptor (after any async reads in flight finish). Later reads throw `closed`. Idempotent. */
  close(): void {
    this.closed = true;
    this.source.close();
  }

  private viewRange(info: TensorInfo, startBytes: number, endBytes: number): TensorData {
    const position = this.header.dataStartBytes + info.dataOffsets[0] + startBytes;
    const length = endBytes - startBytes;
    if (this.closed) throw new SafetensorsError(this.path, 'closed', 'file was closed', info.name);
    if (this.source.borrow !== undefined) {
      const { buffer, byteOffset } = this.source.borrow(position, length);
      return viewAs(info.dtype, buffer, byteOffset, length);
    }
    const bytes = this.allocate(info.name, length);
    this.readIntoChecked(bytes, position);
    return viewAs(info.dtype, bytes.buffer as ArrayBuffer, 0, length);
  }

  private allocate(name: string, byteLength: number): Uint8Array {
    try {
      return new Uint8Array(new ArrayBuffer(byteLength));
    } catch (cause) {
      throw new SafetensorsError(
        this.path,
        'too-large',
        `cannot allocate ${byteLength} bytes in one buffer; read it in row blocks with readRows`,
        name,
        { cause },
      );
    }
  }

  private readIntoChecked(target: Uint8Array, positionBytes: number): void {
    if (this.closed) throw new SafetensorsError(this.path, 'closed', 'file was closed');
    // The header validation guarantees this; keep the invariant explicit for hostile inputs.
    if (positionBytes < 0 || positionBytes + target.length > this.source.byteLength) {
      throw new SafetensorsError(
        this.path,
        'offsets',
        `read [${positionBytes}, ${positionBytes + target.length}) outside the file`,
      );
    }
    this.source.readInto(target, positionBytes);
  }
}

/** Checks `info` against an expected dtype and shape. @throws {SafetensorsError} `dtype-mismatch`, `shape-mismatch`. */
export function checkExpected(
  file: string,
  info: TensorInfo,
  dtype: SafetensorsDtype,
  expectShape?: readonly number[],
): void {
  if (info.dtype !== dtype) {
    throw new SafetensorsError(file, 'dtype-mismatch', `expected dtype ${dtype}, file has ${info.dtype}`, info.name);
  }
  if (
    expectShape !== undefined &&
    (expectShape.length !== info.shape.length || expectShape.some((d, i) => d !== info.shape[i]))
  ) {
    throw new SafetensorsError(
      file,
      'shape-mismatch',
      `expected shape [${expectShape.join(', ')}], file has [${info.shape.join(', ')}]`,
      info.name,
    );
  }
}
