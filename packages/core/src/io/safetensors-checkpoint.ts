/**
 * A checkpoint's weights as one name space: a single `model.safetensors`, or shards listed by
 * `model.safetensors.index.json` (`{"metadata": {...}, "weight_map": {tensor name: shard file}}`).
 *
 * Index validation at open: the index is a strict JSON object (no duplicate keys); `weight_map` maps
 * every name to a plain file name (no directories, no `..`: a hostile index cannot point outside the
 * checkpoint directory); every shard exists and has a valid header; every name in the index is in
 * its shard's header, and every tensor in a shard's header is mapped to that shard by the index (so
 * no tensor lives in two shards and none is orphaned). `metadata.total_size` is exposed, not
 * enforced (published checkpoints do not all agree with it).
 */

import * as fs from 'node:fs';
import * as nodePath from 'node:path';

import { SafetensorsError, type SafetensorsDtype, type TensorInfo, type TypedArrayFor } from './safetensors-format.js';
import { SafetensorsFile, type LoadedTensor } from './safetensors.js';
import {
  describeJsonValue,
  isJsonObject,
  own,
  parseStrictJson,
  type JsonObject,
  type JsonValue,
} from './strict-json.js';

/** Conventional file names inside an HF checkpoint directory. */
export const SAFETENSORS_SINGLE_FILE = 'model.safetensors';
export const SAFETENSORS_INDEX_FILE = 'model.safetensors.index.json';

/** A parsed, validated `model.safetensors.index.json`. */
export interface SafetensorsIndex {
  /** Path of the index file. */
  readonly path: string;
  /** The index's `metadata` object (e.g. `total_size` in bytes), empty if absent. */
  readonly metadata: Readonly<JsonObject>;
  /** Tensor name → shard file name (relative to the index's directory). */
  readonly weightMap: ReadonlyMap<string, string>;
}

/**
 * Reads and validates an index file's JSON (shards are not opened here).
 * @throws {SafetensorsError} rule `index` (or `io`) naming the index file and the bad entry.
 */
export function readSafetensorsIndex(path: string): SafetensorsIndex {
  let text: string;
  try {
    text = fs.readFileSync(path, 'utf8');
  } catch (cause) {
    throw new SafetensorsError(path, 'io', `cannot read index: ${(cause as Error).message}`, undefined, { cause });
  }
  let root: JsonValue;
  try {
    root = parseStrictJson(text);
  } catch (cause) {
    throw new SafetensorsError(path, 'index', `not valid JSON: ${(cause as Error).message}`, undefined, { cause });
  }
  if (!isJsonObject(root))
    throw new SafetensorsError(path, 'index', `index must be a JSON object, got ${describeJsonValue(root)}`);
  const metadata = own(root, 'metadata') ?? ({} as JsonObject);
  if (!isJsonObject(metadata))
    throw new SafetensorsError(path, 'index', `metadata must be an object, got ${describeJsonValue(metadata)}`);
  const wm = own(root, 'weight_map');
  if (!isJsonObject(wm))
    throw new SafetensorsError(path, 'index', `weight_map must be an object, got ${describeJsonValue(wm)}`);
  const weightMap = new Map<string, string>();
  for (const [name, shard] of Object.entries(wm)) {
    if (typeof shard !== 'string') {
      throw new SafetensorsError(
        path,
        'index',
        `weight_map entry must be a shard file name, got ${describeJsonValue(shard)}`,
        name,
      );
    }
    if (
      shard === '' ||
      shard === '.' ||
      shard === '..' ||
      shard.includes('/') ||
      shard.includes('\\') ||
      shard.includes('\0')
    ) {
      throw new SafetensorsError(
        path,
        'index',
        `shard ${JSON.stringify(shard)} must be a plain file name in the checkpoint directory`,
        name,
      );
    }
    weightMap.set(name, shard);
  }
  return { path, metadata, weightMap };
}

/**
 * All tensors of a checkpoint, whichever file they live in. Open with {@link open}; call
 * {@link close} when done (closes every shard's file descriptor).
 */
export class SafetensorsCheckpoint {
  /** Names read so far (see {@link unreadNames}). */
  private readonly touched = new Set<string>();

  private constructor(
    /** The shards (one for an unsharded checkpoint), in index order of first appearance. */
    readonly files: readonly SafetensorsFile[],
    private readonly byName: ReadonlyMap<string, SafetensorsFile>,
    /** The index, if the checkpoint is sharded. */
    readonly index: SafetensorsIndex | undefined,
  ) {}

  /**
   * Opens a checkpoint. `path` is a directory (uses `model.safetensors.index.json` if present,
   * else `model.safetensors`), an index file (`*.index.json`), or a single `.safetensors` file.
   * @throws {SafetensorsError} `io` if nothing loadable is found; `index` if index and shards
   *   disagree; any header rule of any shard.
   */
  static open(path: string): SafetensorsCheckpoint {
    let stat: fs.Stats;
    try {
      stat = fs.statSync(path);
    } catch (cause) {
      throw new SafetensorsError(path, 'io', `cannot open checkpoint: ${(cause as Error).message}`, undefined, {
        cause,
      });
    }
    if (stat.isDirectory()) {
      const index = nodePath.join(path, SAFETENSORS_INDEX_FILE);
      if (fs.existsSync(index)) return SafetensorsCheckpoint.openIndex(index);
      const single = nodePath.join(path, SAFETENSORS_SINGLE_FILE);
      if (fs.existsSync(single)) return SafetensorsCheckpoint.openSingle(single);
      throw new SafetensorsError(
        path,
        'io',
        `directory has neither ${SAFETENSORS_INDEX_FILE} nor ${SAFETENSORS_SINGLE_FILE}`,
      );
    }
    if (path.endsWith('.index.json')) return SafetensorsCheckpoint.openIndex(path);
    return SafetensorsCheckpoint.openSingle(path);
  }

  private static openSingle(path: string): SafetensorsCheckpoint {
    const file = SafetensorsFile.open(path);
    return new SafetensorsCheckpoint([file], new Map(file.names().map((n) => [n, file])), undefined);
  }

  private static openIndex(indexPath: string): SafetensorsCheckpoint {
    const index = readSafetensorsIndex(indexPath);
    const dir = nodePath.dirname(indexPath);
    const shards = new Map<string, SafetensorsFile>();
    try {
      for (const shard of new Set(index.weightMap.values())) {
        const shardPath = nodePath.join(dir, shard);
        if (!fs.existsSync(shardPath)) {
          const example = [...index.weightMap].find(([, s]) => s === shard)?.[0];
          throw new SafetensorsError(indexPath, 'index', `shard ${JSON.stringify(shard)} does not exist`, example);
        }
        shards.set(shard, SafetensorsFile.open(shardPath));
      }
      const byName = new Map<string, SafetensorsFile>();
      for (const [name, shard] of index.weightMap) {
        const file = shards.get(shard)!;
        if (!file.has(name)) {
          throw new SafetensorsError(
            indexPath,
            'index',
            `index maps it to ${JSON.stringify(shard)}, whose header does not contain it`,
            name,
          );
        }
        byName.set(name, file);
      }
      for (const [shard, file] of shards) {
        for (const name of file.names()) {
          const mapped = index.weightMap.get(name);
          if (mapped !== shard) {
            throw new SafetensorsError(
              indexPath,
              'index',
              mapped === undefined
                ? `shard ${JSON.stringify(shard)} contains it but the index does not list it`
                : `shard ${JSON.stringify(shard)} contains it but the index maps it to ${JSON.stringify(mapped)} ` +
                    '(tensor in two shards)',
              name,
            );
          }
        }
      }
      return new SafetensorsCheckpoint([...shards.values()], byName, index);
    } catch (err) {
      for (const f of shards.values()) f.close();
      throw err;
    }
  }

  /** All tensor names (index order for sharded checkpoints, header order otherwise). */
  names(): string[] {
    return [...this.byName.keys()];
  }

  /** True if the checkpoint holds `name`. */
  has(name: string): boolean {
    return this.byName.has(name);
  }

  /** The file holding `name`. @throws {SafetensorsError} `tensor-not-found`. */
  fileOf(name: string): SafetensorsFile {
    const file = this.byName.get(name);
    if (file === undefined) {
      throw new SafetensorsError(
        this.index?.path ?? this.files[0]?.path ?? '<checkpoint>',
        'tensor-not-found',
        'no such tensor in this checkpoint',
        name,
      );
    }
    return file;
  }

  /** Header entry of `name`. @throws {SafetensorsError} `tensor-not-found`. */
  info(name: string): TensorInfo {
    return this.fileOf(name).info(name);
  }

  /** See {@link SafetensorsFile.read}. */
  read(name: string): LoadedTensor {
    this.touched.add(name);
    return this.fileOf(name).read(name);
  }

  /** See {@link SafetensorsFile.readTyped}. */
  readTyped<D extends SafetensorsDtype>(
    name: string,
    dtype: D,
    expectShape?: readonly number[],
  ): LoadedTensor<TypedArrayFor<D>> {
    this.touched.add(name);
    return this.fileOf(name).readTyped(name, dtype, expectShape);
  }

  /** See {@link SafetensorsFile.readRows}. */
  readRows(name: string, rowStart: number, rowEnd: number): LoadedTensor {
    this.touched.add(name);
    return this.fileOf(name).readRows(name, rowStart, rowEnd);
  }

  /** See {@link SafetensorsFile.readBytes}. */
  readBytes(name: string, startBytes?: number, endBytes?: number): Uint8Array {
    this.touched.add(name);
    return this.fileOf(name).readBytes(name, startBytes, endBytes);
  }

  /** See {@link SafetensorsFile.readAsync}. */
  readAsync(name: string): Promise<LoadedTensor> {
    this.touched.add(name);
    return this.fileOf(name).readAsync(name);
  }

  /** See {@link SafetensorsFile.readIntoAsync}. */
  readIntoAsync(name: string, target: Uint8Array, startBytes?: number): Promise<void> {
    this.touched.add(name);
    return this.fileOf(name).readIntoAsync(name, target, startBytes);
  }

  /** See {@link SafetensorsFile.readInto}. */
  readInto(name: string, target: Uint8Array, startBytes?: number): void {
    this.touched.add(name);
    this.fileOf(name).readInto(name, target, startBytes);
  }

  /**
   * Tensors of the checkpoint no read has touched yet (any read method, whole or in part), sorted: after
   * a load, the tensors the loader ignored (checkpoint sanity warns about them).
   */
  unreadNames(): string[] {
    return [...this.byName.keys()].filter((n) => !this.touched.has(n)).sort();
  }

  /** Closes every shard. Idempotent. */
  close(): void {
    for (const f of this.files) f.close();
  }
}
