/**
 * Paged KV pool for attention-style caches (MLA latent + k_pe, or K/V heads): fixed-size pages of
 * `pageSize` tokens, one f32 store per cached layer, per-sequence block tables (vLLM's
 * PagedAttention layout, Kwon et al. 2023).
 *
 * Layout of one layer's store, f32: `[numPages, pageSize, floatsPerToken]`; token `pos` of a
 * sequence lives in page `blockTable[floor(pos / pageSize)]` at row `pos % pageSize`. Every layer
 * uses the same page ids for a sequence (one block table per sequence, shared by all layers), so
 * a page id names `layers.length` byte ranges, one per layer ({@link PagedKvPool.describePages}).
 *
 * Pages are handed out lowest id first and recycled LIFO; nothing is zeroed (a sequence only reads
 * rows it wrote).
 */

/** Thrown when the pool has no free page (or slot) left, or a sequence id is unknown / duplicated. */
export class CacheError extends Error {
  override readonly name = 'CacheError';
  constructor(
    /** `'full'` (no capacity left), `'unknown-sequence'`, `'duplicate-sequence'`, `'range'`. */
    readonly code: 'full' | 'unknown-sequence' | 'duplicate-sequence' | 'range',
    message: string,
  ) {
    super(message);
  }
}

/** Identifies one sequence (request) in the caches. */
export type SequenceId = string | number;

/**
 * A zeroed `[length]` f32 array over a `SharedArrayBuffer`: the memory of every cache store (KV pages, state
 * slots, draft KV), so that a prefill/decode transfer running on the driver's thread can address the stores of
 * the tensor-parallel worker ranks (threads) too — a typed array posted to another thread shares it, no copy.
 * The native kernels take it like any Float32Array.
 * @throws {RangeError} when the memory cannot be allocated.
 */
export function sharedFloat32(length: number): Float32Array {
  return new Float32Array(new SharedArrayBuffer(length * 4));
}

/** Shape of a {@link PagedKvPool}. */
export interface PagedKvPoolOptions {
  /** Absolute layer ids that keep paged KV (e.g. the MLA layers `[3, 7]`), each distinct. */
  readonly layers: readonly number[];
  /** f32 values cached per token per layer (MLA: `kv_lora_rank + qk_rope_head_dim`). */
  readonly floatsPerToken: number;
  /** Tokens per page (e.g. 16). */
  readonly pageSize: number;
  /** Pages in the pool (shared by all sequences). */
  readonly numPages: number;
  /**
   * Where the K/V values live (default `'host'`): `'device'` keeps only the page bookkeeping here (page ids, block
   * tables, slots) for a stage whose pages live in its own device memory (a GPU stage); {@link layerStore} and
   * transfers of such a pool throw.
   */
  readonly storage?: 'host' | 'device';
}

/** One page of one layer as a byte range of that layer's store ({@link PagedKvPool.layerStore}). */
export interface PageDescriptor {
  /** Absolute layer id. */
  readonly layer: number;
  /** Page id in [0, numPages). */
  readonly page: number;
  /** Offset of the page in the layer's store, bytes. */
  readonly byteOffset: number;
  /** Length of the page, bytes (`pageSize · floatsPerToken · 4`). */
  readonly byteLength: number;
}

interface SeqPages {
  /** Page ids in token order. */
  pages: number[];
  /** Tokens stored (positions [0, length) are valid). */
  length: number;
}

/** A paged KV pool. Not thread-safe; one per stage (or per TP rank). */
export class PagedKvPool {
  readonly layers: readonly number[];
  readonly floatsPerToken: number;
  readonly pageSize: number;
  readonly numPages: number;
  /** Where the K/V values live ({@link PagedKvPoolOptions.storage}). */
  readonly storage: 'host' | 'device';
  private readonly stores = new Map<number, Float32Array>();
  private readonly freePages: number[] = [];
  private readonly seqs = new Map<SequenceId, SeqPages>();

  /** @throws {RangeError} on a non-positive size or a repeated layer id. */
  constructor(options: PagedKvPoolOptions) {
    const { layers, floatsPerToken, pageSize, numPages } = options;
    for (const [name, v] of [
      ['floatsPerToken', floatsPerToken],
      ['pageSize', pageSize],
      ['numPages', numPages],
    ] as const) {
      if (!Number.isSafeInteger(v) || v < 1)
        throw new RangeError(`PagedKvPool: ${name}: expected an integer >= 1, got ${v}`);
    }
    if (new Set(layers).size !== layers.length)
      throw new RangeError(`PagedKvPool: layers: expected distinct ids, got [${layers.join(', ')}]`);
    this.layers = Object.freeze([...layers]);
    this.floatsPerToken = floatsPerToken;
    this.pageSize = pageSize;
    this.numPages = numPages;
    this.storage = options.storage ?? 'host';
    if (this.storage === 'host')
      for (const l of layers) this.stores.set(l, sharedFloat32(numPages * pageSize * floatsPerToken));
    for (let p = numPages - 1; p >= 0; p--) this.freePages.push(p);
  }

  /** Bytes of one page of one layer. */
  get pageBytes(): number {
    return this.pageSize * this.floatsPerToken * 4;
  }

  /** Pages currently owned by some sequence. */
  get pagesInUse(): number {
    return this.numPages - this.freePages.length;
  }

  /** Pages free. */
  get pagesFree(): number {
    return this.freePages.length;
  }

  /** Sequences registered. */
  get numSequences(): number {
    return this.seqs.size;
  }

  /** True if `id` is registered. */
  has(id: SequenceId): boolean {
    return this.seqs.has(id);
  }

  /** Registers an empty sequence (no pages yet). @throws {CacheError} `duplicate-sequence`. */
  addSequence(id: SequenceId): void {
    if (this.seqs.has(id))
      throw new CacheError('duplicate-sequence', `PagedKvPool: sequence ${String(id)} already exists`);
    this.seqs.set(id, { pages: [], length: 0 });
  }

  /** Tokens stored for `id`. @throws {CacheError} `unknown-sequence`. */
  length(id: SequenceId): number {
    return this.seq(id).length;
  }

  /** The block table of `id`: page ids in token order (a copy), `[ceil(length / pageSize)]` i32. */
  blockTable(id: SequenceId): Int32Array {
    return Int32Array.from(this.seq(id).pages);
  }

  /**
   * Writes the block table of `id` (page ids in token order, `[ceil(length / pageSize)]`) into `out` from element
   * `offset`, without allocating (a stage filling its per-step block tables). @returns the number of pages written.
   * @throws {CacheError} `unknown-sequence`; {@link RangeError} when `out` has no room for them past `offset`.
   */
  writeBlockTable(id: SequenceId, out: Int32Array, offset = 0): number {
    const pages = this.seq(id).pages;
    const n = pages.length;
    if (!(Number.isSafeInteger(offset) && offset >= 0 && offset + n <= out.length))
      throw new RangeError(
        `PagedKvPool.writeBlockTable: ${n} pages do not fit out (length ${out.length}) at offset ${offset}`,
      );
    for (let i = 0; i < n; i++) out[offset + i] = pages[i]!;
    return n;
  }

  /**
   * Grows `id` to `newLength` tokens, allocating pages as needed (all or nothing).
   * @throws {CacheError} `full` if not enough pages are free (nothing is allocated then);
   *   `range` if `newLength` < the current length.
   */
  extend(id: SequenceId, newLength: number): void {
    const s = this.seq(id);
    if (!Number.isSafeInteger(newLength) || newLength < s.length) {
      throw new CacheError(
        'range',
        `PagedKvPool.extend: newLength: expected an integer >= ${s.length}, got ${newLength}`,
      );
    }
    const need = Math.ceil(newLength / this.pageSize) - s.pages.length;
    if (need > this.freePages.length) {
      throw new CacheError(
        'full',
        `PagedKvPool: sequence ${String(id)} needs ${need} more page(s), ` +
          `${this.freePages.length} free of ${this.numPages}`,
      );
    }
    for (let i = 0; i < need; i++) s.pages.push(this.freePages.pop()!);
    s.length = newLength;
  }

  /**
   * Shrinks `id` to `newLength` tokens (rolls back rejected draft tokens), freeing pages past it.
   * @throws {CacheError} `range` if `newLength` is negative or above the current length.
   */
  truncate(id: SequenceId, newLength: number): void {
    const s = this.seq(id);
    if (!Number.isSafeInteger(newLength) || newLength < 0 || newLength > s.length) {
      throw new CacheError(
        'range',
        `PagedKvPool.truncate: newLength: expected an integer in [0, ${s.length}], got ${newLength}`,
      );
    }
    const keep = Math.ceil(newLength / this.pageSize);
    while (s.pages.length > keep) this.freePages.push(s.pages.pop()!);
    s.length = newLength;
  }

  /** Frees every page of `id` and forgets it. Idempotent (unknown ids are ignored). */
  free(id: SequenceId): void {
    const s = this.seqs.get(id);
    if (s === undefined) return;
    while (s.pages.length > 0) this.freePages.push(s.pages.pop()!);
    this.seqs.delete(id);
  }

  /**
   * The f32 store of `layer`, `[numPages, pageSize, floatsPerToken]`. @throws {RangeError} if the layer has no KV
   * here.
   */
  layerStore(layer: number): Float32Array {
    if (this.storage === 'device')
      throw new RangeError(`PagedKvPool: layer ${layer}: this pool's K/V live in device memory, not here`);
    const s = this.stores.get(layer);
    if (s === undefined)
      throw new RangeError(`PagedKvPool: layer ${layer} keeps no paged KV (layers [${this.layers.join(', ')}])`);
    return s;
  }

  /**
   * Offset, in f32 elements of a layer store, of token `pos` of `id` (same for every layer).
   * @throws {CacheError} `range` if `pos` is not in [0, length).
   */
  tokenOffset(id: SequenceId, pos: number): number {
    const s = this.seq(id);
    if (!(pos >= 0 && pos < s.length))
      throw new CacheError('range', `PagedKvPool.tokenOffset: pos: expected [0, ${s.length}), got ${pos}`);
    return (s.pages[Math.floor(pos / this.pageSize)]! * this.pageSize + (pos % this.pageSize)) * this.floatsPerToken;
  }

  /**
   * Token slots (page · pageSize + offset: the index of a token's row in a layer store viewed as
   * `[numPages · pageSize, floatsPerToken]`) of tokens [start, start + n) of each range's sequence,
   * concatenated — the slot mapping of @specd/native's `writeKvPages`, and the block table of a
   * one-token-per-page view of the pool (tree attention).
   * @returns `[Σ n]` i32. @throws {CacheError} `range` for a token outside its sequence.
   */
  tokenSlots(ranges: readonly { readonly id: SequenceId; readonly start: number; readonly n: number }[]): Int32Array {
    let total = 0;
    for (const r of ranges) total += r.n;
    const slots = new Int32Array(total);
    let at = 0;
    for (const r of ranges) at = this.writeTokenSlots(r.id, r.start, r.n, slots, at);
    return slots;
  }

  /**
   * The token slots of tokens [start, start + n) of `id` ({@link tokenSlots}) written into `out` from element
   * `offset`, without allocating. @returns the element after them.
   * @throws {CacheError} `range` for a token outside the sequence (nothing written), `unknown-sequence`;
   *   {@link RangeError} when `out` has no room for them.
   */
  writeTokenSlots(id: SequenceId, start: number, n: number, out: Int32Array, offset = 0): number {
    if (!(n > 0)) return offset;
    const s = this.seq(id);
    if (!(Number.isSafeInteger(start) && Number.isSafeInteger(n) && start >= 0 && start + n <= s.length)) {
      // the first token outside, as tokenOffset names it
      const bad = start >= 0 && start < s.length ? s.length : start;
      throw new CacheError('range', `PagedKvPool.tokenOffset: pos: expected [0, ${s.length}), got ${bad}`);
    }
    if (!(Number.isSafeInteger(offset) && offset >= 0 && offset + n <= out.length))
      throw new RangeError(
        `PagedKvPool.writeTokenSlots: ${n} slots do not fit out (length ${out.length}) at offset ${offset}`,
      );
    const ps = this.pageSize;
    const pages = s.pages;
    for (let i = 0; i < n; i++) {
      const pos = start + i;
      const page = (pos / ps) | 0;
      out[offset + i] = pages[page]! * ps + (pos - page * ps);
    }
    return offset + n;
  }

  /**
   * Byte ranges of the pages holding tokens [tokenStart, tokenEnd) of `id`, for every layer
   * (layer-major, then token order). Use for transfers (PD) and inspection.
   * @throws {CacheError} `range` if the range is not inside [0, length].
   */
  describePages(id: SequenceId, tokenStart = 0, tokenEnd?: number): PageDescriptor[] {
    const s = this.seq(id);
    const end = tokenEnd ?? s.length;
    if (!(tokenStart >= 0 && tokenStart <= end && end <= s.length)) {
      throw new CacheError(
        'range',
        `PagedKvPool.describePages: expected 0 <= tokenStart <= tokenEnd <= ${s.length}, got [${tokenStart}, ${end})`,
      );
    }
    const out: PageDescriptor[] = [];
    if (end === tokenStart) return out;
    const first = Math.floor(tokenStart / this.pageSize);
    const last = Math.floor((end - 1) / this.pageSize);
    for (const layer of this.layers) {
      for (let i = first; i <= last; i++) {
        const page = s.pages[i]!;
        out.push({ layer, page, byteOffset: page * this.pageBytes, byteLength: this.pageBytes });
      }
    }
    return out;
  }

  private seq(id: SequenceId): SeqPages {
    const s = this.seqs.get(id);
    if (s === undefined) throw new CacheError('unknown-sequence', `PagedKvPool: unknown sequence ${String(id)}`);
    return s;
  }
}
