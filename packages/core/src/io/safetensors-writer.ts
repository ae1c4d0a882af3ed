/**
 * Writing safetensors files (used by tests and tools to make small checkpoints).
 *
 * Follows the reference writer's layout: tensors ordered by descending element size, then by name
 * (so every tensor's data offset is aligned to its element size when the header is padded), the
 * header padded with spaces to a multiple of 8 bytes, data contiguous with no gaps.
 */

import * as fs from 'node:fs';

import { dtypeBits, SafetensorsError, type SafetensorsDtype } from './safetensors-format.js';

/** One tensor to write. `data` holds exactly product(shape) × dtype size bytes, little-endian. */
export interface TensorToWrite {
  readonly dtype: SafetensorsDtype;
  readonly shape: readonly number[];
  /** Any typed array or DataView; its bytes are written as they are. */
  readonly data: ArrayBufferView;
}

/** Tensors by name: a plain object or a Map. */
export type TensorsToWrite = Readonly<Record<string, TensorToWrite>> | ReadonlyMap<string, TensorToWrite>;

interface Prepared {
  header: Uint8Array;
  order: { name: string; bytes: Uint8Array }[];
}

function prepare(file: string, tensors: TensorsToWrite, metadata?: Readonly<Record<string, string>>): Prepared {
  const entries =
    tensors instanceof Map ? [...tensors.entries()] : Object.entries(tensors as Record<string, TensorToWrite>);
  entries.sort(([an, a], [bn, b]) => dtypeBits(b.dtype) - dtypeBits(a.dtype) || (an < bn ? -1 : an > bn ? 1 : 0));
  const json: Record<string, unknown> = {};
  if (metadata !== undefined) {
    for (const [k, v] of Object.entries(metadata)) {
      if (typeof v !== 'string')
        throw new SafetensorsError(file, 'write', `metadata value for ${JSON.stringify(k)} must be a string`);
    }
    json.__metadata__ = metadata;
  }
  const order: Prepared['order'] = [];
  let offset = 0;
  for (const [name, t] of entries) {
    if (name === '__metadata__') throw new SafetensorsError(file, 'write', 'the name __metadata__ is reserved', name);
    let elements = 1n;
    for (const d of t.shape) {
      if (!Number.isSafeInteger(d) || d < 0)
        throw new SafetensorsError(file, 'write', `shape [${t.shape.join(', ')}] has an invalid dimension`, name);
      elements *= BigInt(d);
    }
    const bits = elements * BigInt(dtypeBits(t.dtype));
    if (bits !== BigInt(t.data.byteLength) * 8n) {
      throw new SafetensorsError(
        file,
        'write',
        `shape [${t.shape.join(', ')}] × ${t.dtype} needs ${bits} bits; data has ${t.data.byteLength} bytes`,
        name,
      );
    }
    const bytes = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    json[name] = { dtype: t.dtype, shape: [...t.shape], data_offsets: [offset, offset + bytes.length] };
    offset += bytes.length;
    order.push({ name, bytes });
  }
  let text = JSON.stringify(json);
  const encoded = new TextEncoder().encode(text);
  const pad = (8 - (encoded.length % 8)) % 8;
  if (pad > 0) text += ' '.repeat(pad);
  return { header: new TextEncoder().encode(text), order };
}

/**
 * Serialises tensors to an in-memory safetensors file.
 * @throws {SafetensorsError} `write` if a tensor's byte length disagrees with its shape and dtype.
 */
export function serializeSafetensors(tensors: TensorsToWrite, metadata?: Readonly<Record<string, string>>): Uint8Array {
  const { header, order } = prepare('<memory>', tensors, metadata);
  const total = 8 + header.length + order.reduce((s, t) => s + t.bytes.length, 0);
  const out = new Uint8Array(total);
  new DataView(out.buffer).setBigUint64(0, BigInt(header.length), true);
  out.set(header, 8);
  let pos = 8 + header.length;
  for (const t of order) {
    out.set(t.bytes, pos);
    pos += t.bytes.length;
  }
  return out;
}

/**
 * Writes tensors to `path` as a safetensors file, streaming each tensor (no whole-file buffer).
 * Writes to `path + '.tmp'` and renames, so a crash never leaves a half-written file at `path`.
 * @throws {SafetensorsError} `write` for inconsistent tensors, `io` if the file cannot be written.
 */
export function writeSafetensors(
  path: string,
  tensors: TensorsToWrite,
  metadata?: Readonly<Record<string, string>>,
): void {
  const { header, order } = prepare(path, tensors, metadata);
  const tmp = `${path}.tmp`;
  try {
    const fd = fs.openSync(tmp, 'w');
    try {
      const prefix = new Uint8Array(8);
      new DataView(prefix.buffer).setBigUint64(0, BigInt(header.length), true);
      writeAll(fd, prefix);
      writeAll(fd, header);
      for (const t of order) writeAll(fd, t.bytes);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, path);
  } catch (cause) {
    fs.rmSync(tmp, { force: true });
    throw new SafetensorsError(path, 'io', `cannot write: ${(cause as Error).message}`, undefined, { cause });
  }
}

function writeAll(fd: number, bytes: Uint8Array): void {
  let done = 0;
  while (done < bytes.length) done += fs.writeSync(fd, bytes, done, Math.min(bytes.length - done, 1 << 30));
}
