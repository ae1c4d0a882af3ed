/**
 * The checksum of a transfer entry: XXH64 (seed 0) over the entry's bytes in send order, as 16 lowercase
 * hex digits in canonical (big-endian) order — the form `xxhsum -H64` prints. The sender computes it over
 * the bytes it sends and puts it in the entry's {@link ManifestRow}; the receiver recomputes it over the
 * bytes that landed in its regions and refuses the request on a difference.
 *
 * Algorithm: xxHash64 (Yann Collet, github.com/Cyan4973/xxHash, doc/xxhash_spec.md), computed by the
 * `hash-wasm` package (WebAssembly, no native binary, no install script). Its hashers are created
 * asynchronously, so this module creates one at load (top-level await) and every call here is synchronous;
 * incremental hashers share it by saving and restoring its state between updates.
 */

import { createXXHash64, type IHasher } from 'hash-wasm';

import type { RegionRange } from './types.js';

/** The process's one XXH64 hasher (seed 0); callers reset it (`init`) or restore a state (`load`) first. */
const shared: IHasher = await createXXHash64();

/** The name of the algorithm, for messages and manifests. */
export const CHECKSUM_ALGORITHM = 'xxh64';

/**
 * An incremental XXH64: `update` with the bytes in order, then `digest()` once. Hashers may interleave
 * (each keeps its own state between calls); none is usable after `digest()`.
 */
export class ChecksumHasher {
  private state: Uint8Array | undefined;
  private bytes = 0;

  constructor() {
    this.state = shared.init().save();
  }

  /** Bytes hashed so far. */
  get byteLength(): number {
    return this.bytes;
  }

  /** Adds `data` (any length, including 0). Throws after {@link digest}. */
  update(data: Uint8Array): this {
    if (this.state === undefined) throw new Error('ChecksumHasher.update: the hasher was already digested');
    shared.load(this.state).update(data);
    this.state = shared.save();
    this.bytes += data.byteLength;
    return this;
  }

  /** The checksum of everything passed to {@link update} (16 hex digits). Throws when called twice. */
  digest(): string {
    if (this.state === undefined) throw new Error('ChecksumHasher.digest: the hasher was already digested');
    const hex = shared.load(this.state).digest('hex');
    this.state = undefined;
    return hex;
  }
}

/** XXH64 (seed 0) of `data`, 16 hex digits. */
export function checksumBytes(data: Uint8Array): string {
  return shared.init().update(data).digest('hex');
}

/**
 * The checksum of the bytes of `ranges`, concatenated in the given order (no copy is made): what a
 * {@link ManifestRow}'s `checksum` holds for a {@link LocalEntry}. `regionBytes(id)` returns a region's
 * memory. Throws (naming the range) for a negative, fractional or out-of-bounds range.
 */
export function checksumRanges(regionBytes: (id: string) => Uint8Array, ranges: readonly RegionRange[]): string {
  const views: Uint8Array[] = [];
  for (const [i, r] of ranges.entries()) {
    const bytes = regionBytes(r.region);
    if (
      !Number.isSafeInteger(r.offset) ||
      !Number.isSafeInteger(r.length) ||
      r.offset < 0 ||
      r.length < 0 ||
      r.offset + r.length > bytes.byteLength
    ) {
      throw new RangeError(
        `checksumRanges: range ${i} (region '${r.region}', offset ${r.offset}, length ${r.length}) ` +
          `is outside the region's ${bytes.byteLength} bytes`,
      );
    }
    views.push(bytes.subarray(r.offset, r.offset + r.length));
  }
  // the views are taken before hashing so that a throwing regionBytes leaves the shared hasher untouched
  shared.init();
  for (const v of views) shared.update(v);
  return shared.digest('hex');
}
