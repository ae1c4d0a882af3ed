/**
 * The draft context of a drafter over all its sequences: the length of each sequence's draft context
 * and, for drafters with attention layers, their K and V in one {@link PagedKvPool}.
 *
 * Pool layout: "layer" 2j holds the keys and 2j + 1 the values of draft layer j, `numKvHeads · headDim`
 * f32 per token, NHD pages of `pageSize` tokens — the layout of @specd/native's `pagedAttention` and
 * `writeKvPages` ({@link DraftKvCache.layout}); one block table per sequence shared by every layer.
 *
 * Lifecycle per sequence: `add` → `extendAll` for context rows (kept) and for a propose's temporary
 * rows (`truncateAll` afterwards, or {@link DraftKvCache.withRows}) → `free` (idempotent). A drafter
 * without KV (e.g. n-gram lookup) creates one without geometry: it counts context lengths only and
 * holds no pages.
 */

import { writeKvPages, type KvPageLayout } from '@specd/native';

import { CacheError, PagedKvPool, type SequenceId } from './paged-kv-pool.js';

/** Tokens per draft KV page unless a drafter asks otherwise. */
export const DRAFT_PAGE_SIZE = 16;

/** Geometry and capacity of a {@link DraftKvCache} with KV. */
export interface DraftKvCacheOptions {
  /** Draft attention layers (≥ 1); each keeps K and V. */
  readonly numLayers: number;
  /** KV heads per layer this cache holds (under tensor parallelism: the rank's). */
  readonly numKvHeads: number;
  /**
   * KV heads of the draft model over its whole tensor-parallel group (default `numKvHeads`): a prefill/decode
   * transfer between different TP sizes re-splits the pages by head with it (`totalKvHeads`).
   */
  readonly totalKvHeads?: number;
  /** Elements per head. */
  readonly headDim: number;
  /** Tokens per page (default {@link DRAFT_PAGE_SIZE}). */
  readonly pageSize?: number;
  /** Pages in the pool, shared by every sequence (size it with {@link DraftKvCache.pagesFor}). */
  readonly numPages: number;
  /**
   * Also keep each context row's projected feature, `featureWidth` f32 (prefill/decode `pd.draft_context`
   * "features": P sends features, D rebuilds the K/V rows from them): a second page pool of the same page size
   * and count whose block tables grow and shrink with the KV's ({@link DraftKvCache.features}). Default: none.
   */
  readonly featureWidth?: number;
  /**
   * Where the K/V values live (default `'host'`): `'device'` keeps only the page bookkeeping here (block tables,
   * slots) for a drafter whose pages live in its own device memory (a GPU drafter); {@link DraftKvCache.keys},
   * {@link DraftKvCache.values} and {@link DraftKvCache.write} then throw (PagedKvPoolOptions.storage).
   */
  readonly storage?: 'host' | 'device';
}

/**
 * Rows of one sequence to grow or roll back: the sequence is at `position` tokens now and gains
 * `numTokens` (a {@link ContextSpan}-compatible shape, so context spans are passed as they are).
 */
export interface DraftRows {
  readonly id: SequenceId;
  /** Draft context length of the sequence before the rows (absolute position of the first row). */
  readonly position: number;
  /** Rows to add (≥ 0). */
  readonly numTokens: number;
}

/** The draft context (lengths, and K/V pages when the drafter has attention layers) of all sequences. */
export class DraftKvCache {
  private readonly kvLayout: KvPageLayout | undefined;
  private kvPool: PagedKvPool | undefined;
  private featurePool: PagedKvPool | undefined;
  private readonly lengths = new Map<SequenceId, number>();
  private disposed = false;

  /**
   * @param options the KV geometry; absent = a draft context without KV (lengths only, no pages).
   * @throws {RangeError} on a size that is not a positive integer.
   */
  constructor(options?: DraftKvCacheOptions) {
    if (options === undefined) {
      this.kvLayout = undefined;
      return;
    }
    const { numLayers, numKvHeads, headDim, numPages } = options;
    const pageSize = options.pageSize ?? DRAFT_PAGE_SIZE;
    for (const [name, v] of [
      ['numLayers', numLayers],
      ['numKvHeads', numKvHeads],
      ['headDim', headDim],
    ] as const) {
      if (!Number.isSafeInteger(v) || v < 1)
        throw new RangeError(`DraftKvCache: ${name}: expected an integer >= 1, got ${v}`);
    }
    this.kvPool = new PagedKvPool({
      layers: Array.from({ length: 2 * numLayers }, (_, i) => i),
      floatsPerToken: numKvHeads * headDim,
      pageSize,
      numPages,
      ...(options.storage === undefined ? {} : { storage: options.storage }),
    });
    this.kvLayout = Object.freeze({ numPages, pageSize, numKvHeads, headDim, kvLayout: 'NHD' });
    const fw = options.featureWidth;
    if (fw !== undefined) {
      if (!Number.isSafeInteger(fw) || fw < 1)
        throw new RangeError(`DraftKvCache: featureWidth: expected an integer >= 1, got ${fw}`);
      this.featurePool = new PagedKvPool({ layers: [0], floatsPerToken: fw, pageSize, numPages });
    }
    this.totalKvHeads = options.totalKvHeads ?? numKvHeads;
    if (!(Number.isSafeInteger(this.totalKvHeads) && this.totalKvHeads >= numKvHeads))
      throw new RangeError(`DraftKvCache: totalKvHeads: expected an integer >= numKvHeads, got ${this.totalKvHeads}`);
  }

  /** KV heads of the draft model over its tensor-parallel group (`numKvHeads` without TP; 0 without KV). */
  readonly totalKvHeads: number = 0;

  /**
   * Pages for `maxSequences` sequences of at most `tokensPerSequence` tokens each (context plus the
   * temporary rows of one propose): `maxSequences · (⌈tokensPerSequence / pageSize⌉ + 1)`.
   */
  static pagesFor(maxSequences: number, tokensPerSequence: number, pageSize = DRAFT_PAGE_SIZE): number {
    return maxSequences * (Math.ceil(tokensPerSequence / pageSize) + 1);
  }

  /** Whether the cache keeps K/V pages (it was created with a geometry and is not disposed). */
  get hasKv(): boolean {
    return this.kvPool !== undefined;
  }

  /**
   * The page pool (block tables, token offsets, stores).
   * @throws {RangeError} when the cache keeps no KV (created without a geometry, or disposed).
   */
  get pool(): PagedKvPool {
    if (this.kvPool === undefined) throw this.noKv();
    return this.kvPool;
  }

  /**
   * NHD page layout of every K and V store (@specd/native `KvPageLayout`).
   * @throws {RangeError} when the cache keeps no KV.
   */
  get layout(): KvPageLayout {
    if (this.kvLayout === undefined || this.kvPool === undefined) throw this.noKv();
    return this.kvLayout;
  }

  /**
   * The projected-feature pages (`[numPages, pageSize, featureWidth]` f32, layer 0; the same block-table growth as
   * the KV's), or undefined when the cache keeps none ({@link DraftKvCacheOptions.featureWidth}).
   */
  get features(): PagedKvPool | undefined {
    return this.featurePool;
  }

  /** Draft attention layers whose K and V the cache keeps (0 without KV). */
  get numLayers(): number {
    return this.kvPool === undefined ? 0 : this.kvPool.layers.length / 2;
  }

  /** Pages owned by some sequence (0 without KV). */
  get pagesInUse(): number {
    return this.kvPool?.pagesInUse ?? 0;
  }

  /** Sequences registered. */
  get numSequences(): number {
    return this.lengths.size;
  }

  /** True if `id` is registered. */
  has(id: SequenceId): boolean {
    return this.lengths.has(id);
  }

  /**
   * Registers `id` with an empty draft context.
   * @throws {CacheError} `duplicate-sequence`; {@link RangeError} after {@link dispose}.
   */
  add(id: SequenceId): void {
    if (this.disposed) throw new RangeError('DraftKvCache: disposed');
    if (this.lengths.has(id))
      throw new CacheError('duplicate-sequence', `DraftKvCache: sequence ${String(id)} already exists`);
    this.kvPool?.addSequence(id);
    this.featurePool?.addSequence(id);
    this.lengths.set(id, 0);
  }

  /** Frees every page of `id` and forgets it. Idempotent (unknown ids are ignored). */
  free(id: SequenceId): void {
    this.kvPool?.free(id);
    this.featurePool?.free(id);
    this.lengths.delete(id);
  }

  /** Draft context tokens of `id` (its next position). @throws {CacheError} `unknown-sequence`. */
  contextLength(id: SequenceId): number {
    const n = this.lengths.get(id);
    if (n === undefined) throw new CacheError('unknown-sequence', `DraftKvCache: unknown sequence ${String(id)}`);
    return n;
  }

  /**
   * Grows every sequence of a batch from `position` to `position + numTokens` tokens (allocating pages),
   * all or nothing: every position is checked first, and on an error the sequences already grown go
   * back to their `position` (their pages freed) before it is rethrown.
   * @throws {CacheError} `unknown-sequence`; `range` if a `position` is not the sequence's length or a
   *   `numTokens` is negative; `full` if the pool runs out of pages (nothing is left allocated).
   */
  extendAll(rows: readonly DraftRows[]): void {
    for (const r of rows) {
      const have = this.contextLength(r.id);
      if (r.position !== have || !Number.isSafeInteger(r.numTokens) || r.numTokens < 0)
        throw new CacheError(
          'range',
          `DraftKvCache.extendAll: sequence ${String(r.id)}: expected position ${have} and numTokens >= 0, ` +
            `got position ${r.position}, numTokens ${r.numTokens}`,
        );
    }
    const grown: DraftRows[] = [];
    try {
      for (const r of rows) {
        this.kvPool?.extend(r.id, r.position + r.numTokens);
        try {
          this.featurePool?.extend(r.id, r.position + r.numTokens);
        } catch (err) {
          this.kvPool?.truncate(r.id, r.position);
          throw err;
        }
        this.lengths.set(r.id, r.position + r.numTokens);
        grown.push(r);
      }
    } catch (err) {
      this.truncateAll(grown);
      throw err;
    }
  }

  /**
   * Returns every sequence of a batch to `position` tokens (freeing pages past it): undoes
   * {@link extendAll} of the same rows. Rows of a sequence that is already at `position` change nothing.
   * @throws {CacheError} `unknown-sequence`; `range` if a sequence is shorter than its `position`.
   */
  truncateAll(rows: readonly DraftRows[]): void {
    for (const r of rows) {
      const have = this.contextLength(r.id);
      if (!(Number.isSafeInteger(r.position) && r.position >= 0 && r.position <= have))
        throw new CacheError(
          'range',
          `DraftKvCache.truncateAll: sequence ${String(r.id)}: position: expected an integer in [0, ${have}], ` +
            `got ${r.position}`,
        );
      this.kvPool?.truncate(r.id, r.position);
      this.featurePool?.truncate(r.id, r.position);
      this.lengths.set(r.id, r.position);
    }
  }

  /**
   * Runs `body` with every sequence grown by its rows (temporary rows: a propose's block or chain) and
   * truncates them back afterwards, whether `body` returns or throws.
   * @throws {CacheError} as {@link extendAll} (then `body` does not run); what `body` throws.
   */
  withRows<T>(rows: readonly DraftRows[], body: () => T): T {
    this.extendAll(rows);
    try {
      return body();
    } finally {
      this.truncateAll(rows);
    }
  }

  /** Keys of draft layer `layer`, `[numPages, pageSize, numKvHeads, headDim]` f32. @throws {RangeError} no KV. */
  keys(layer: number): Float32Array {
    return this.pool.layerStore(2 * layer);
  }

  /** Values of draft layer `layer`, `[numPages, pageSize, numKvHeads, headDim]` f32. @throws {RangeError} no KV. */
  values(layer: number): Float32Array {
    return this.pool.layerStore(2 * layer + 1);
  }

  /**
   * Token slots of rows `[position, position + numTokens)` of each row set's sequence, concatenated
   * (`[Σ numTokens]` i32, the slot mapping of {@link write}).
   * @throws {CacheError} `range` for a row outside its sequence; {@link RangeError} without KV.
   */
  slots(rows: readonly DraftRows[]): Int32Array {
    return rowSlots(this.pool, rows);
  }

  /**
   * Writes K and V rows of draft layer `layer` into its pages (@specd/native `writeKvPages`).
   * @param k `[n, numKvHeads, headDim]` f32; @param v the same shape; @param slots `[n]` i32 ({@link slots}).
   * @throws {RangeError} without KV; the native call's errors on mis-shaped arrays.
   */
  write(layer: number, k: Float32Array, v: Float32Array, slots: Int32Array): void {
    writeKvPages(this.layout, k, v, this.keys(layer), this.values(layer), slots);
  }

  /**
   * Writes projected-feature rows into their pages.
   * @param rows the rows' sequences and positions (already grown by {@link extendAll}); @param features
   *   `[Σ numTokens, featureWidth]` f32, in `rows` order.
   * @throws {RangeError} without features or for a mis-shaped `features`; {@link CacheError} `range` for a row
   *   outside its sequence.
   */
  writeFeatures(rows: readonly DraftRows[], features: Float32Array): void {
    const pool = this.featurePool;
    if (pool === undefined) throw new RangeError('DraftKvCache.writeFeatures: the cache keeps no features');
    const slots = rowSlots(pool, rows);
    const w = pool.floatsPerToken;
    if (features.length !== slots.length * w)
      throw new RangeError(
        `DraftKvCache.writeFeatures: features: expected [${slots.length}, ${w}] f32, got length ${features.length}`,
      );
    const store = pool.layerStore(0);
    for (let i = 0; i < slots.length; i++) store.set(features.subarray(i * w, (i + 1) * w), (slots[i] as number) * w);
  }

  /**
   * Projected-feature rows `[from, to)` of `id`, `[to − from, featureWidth]` f32 (a copy).
   * @throws {RangeError} without features; {@link CacheError} `range` for rows outside the sequence.
   */
  readFeatures(id: SequenceId, from: number, to: number): Float32Array {
    const pool = this.featurePool;
    if (pool === undefined) throw new RangeError('DraftKvCache.readFeatures: the cache keeps no features');
    const slots = pool.tokenSlots([{ id, start: from, n: to - from }]);
    const w = pool.floatsPerToken;
    const store = pool.layerStore(0);
    const out = new Float32Array(slots.length * w);
    for (let i = 0; i < slots.length; i++)
      out.set(store.subarray((slots[i] as number) * w, ((slots[i] as number) + 1) * w), i * w);
    return out;
  }

  /** Frees every sequence and drops the page stores; afterwards `add` throws and `free` does nothing. */
  dispose(): void {
    this.lengths.clear();
    this.kvPool = undefined;
    this.featurePool = undefined;
    this.disposed = true;
  }

  private noKv(): RangeError {
    return new RangeError(`DraftKvCache: ${this.disposed ? 'disposed' : 'keeps no KV (created without a geometry)'}`);
  }
}

/** `pool`'s token slots of each row set's rows [position, position + numTokens), concatenated (`[Σ n]` i32). */
function rowSlots(pool: PagedKvPool, rows: readonly DraftRows[]): Int32Array {
  let total = 0;
  for (const r of rows) total += Math.max(0, r.numTokens);
  const slots = new Int32Array(total);
  let at = 0;
  for (const r of rows) at = pool.writeTokenSlots(r.id, r.position, r.numTokens, slots, at);
  return slots;
}
