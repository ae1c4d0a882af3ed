/**
 * Attention over a paged KV cache (vLLM PagedAttention layout, fp32 pages), GQA, for decode,
 * verification blocks, DFlash draft blocks and prefill, batched over sequences.
 *
 * KV pool of one layer (K and V each): Float32Array of `numPages` pages, little-endian f32, no
 * padding. Page `p` is the contiguous byte range `[p·pageBytes, (p+1)·pageBytes)`,
 * `pageBytes = pageSize·numKvHeads·headDim·4`. Inside a page (`layout.kvLayout`):
 * - `'NHD'` (default; vLLM): `[pageSize, numKvHeads, headDim]`, i.e. the pool is
 *   `[numPages, pageSize, numKvHeads, headDim]`; slot `o`, KV head `h` at byte
 *   `(o·numKvHeads + h)·headDim·4` of the page; one head's share of a page is `pageSize` runs of
 *   `headDim·4` bytes with stride `numKvHeads·headDim·4`;
 * - `'HND'` (FlashInfer's name): `[numKvHeads, pageSize, headDim]`; head `h`, slot `o` at byte
 *   `(h·pageSize + o)·headDim·4`; one head's share of a page is ONE run of `pageSize·headDim·4`
 *   bytes (a head-aware PD copy planner moves single runs, REFERENCE.md §1, §8), and decode reads
 *   stream ~1.7× faster on CPU (docs/BENCHMARKS.md, "Attention"). Prefer it for new pools.
 * A sequence's key `j` (position `j`) lives in page `blockTable[j / pageSize]`, slot `j % pageSize`.
 * fp32 pages keep the kernel exact to fp32 (bf16 pages, half the bytes, may come later as an option).
 *
 * Masks (key j has position j; a query has its absolute position p):
 * - `'causal'`: keys `j <= p` (target verification/prefill; draft sliding-window layers);
 * - `'non-causal'`: every key `j < kvLen` (DFlash full-attention draft layers: the block sees the
 *   whole context and its own keys, which the caller has written into the cache first);
 * - `slidingWindow: W` (> 0): additionally `p − j < W` (causal), `|p − j| < W` (non-causal),
 *   matching dflash.py `dpos < sliding_window` on context and block keys.
 * A query with no visible key gets an all-zero output.
 *
 * Numerics: fp32 dot products, online (flash) softmax in fp32 over 16-key chunks aligned to the
 * absolute key index. Batch invariance: a query's output is bit-identical whether computed alone,
 * in a block, or batched with other sequences, for any thread count, on one ISA path (work splits
 * over sequences, heads and queries, never over keys; native/src/attention_kernels.h).
 */
import { addon } from './addon.js';
import { expectArray, expectInt, expectNumber, expectOneOf, fail, outArray } from './validate.js';

/** Order inside a page: `'NHD'` = [pageSize, numKvHeads, headDim], `'HND'` = [numKvHeads, pageSize, headDim]. */
export type KvLayout = 'NHD' | 'HND';

/** Geometry of one layer's K (or V) pool: `numPages` pages of `pageSize·numKvHeads·headDim` f32. */
export interface KvPageLayout {
  readonly numPages: number;
  /** Tokens per page. */
  readonly pageSize: number;
  readonly numKvHeads: number;
  readonly headDim: number;
  /** Order inside a page; default `'NHD'` (module comment). */
  readonly kvLayout?: KvLayout;
}

/** Which keys a query sees (module comment). */
export type AttentionMask = 'causal' | 'non-causal';

/**
 * Batch metadata (cu_seqlens style), shared by `pagedAttention` and `mlaAttention`.
 * Build it with `makePagedBatch` in tests and simple callers.
 */
export interface PagedBatch {
  /** Int32Array [numSeqs + 1]: queries of sequence s are rows [cuSeqlensQ[s], cuSeqlensQ[s+1]); [0] = 0. */
  readonly cuSeqlensQ: Int32Array;
  /** Int32Array [numSeqs]: keys in the cache of each sequence, this step's keys included once written. */
  readonly kvLens: Int32Array;
  /** Int32Array [numSeqs, maxBlocksPerSeq]: page ids; only the first ceil(kvLen/pageSize) per row are read. */
  readonly blockTables: Int32Array;
  /** Int32Array [totalQ]: absolute position of each query (>= 0). */
  readonly positions: Int32Array;
}

/** One sequence for `makePagedBatch`. */
export interface PagedSequence {
  /** Queries of this sequence in the batch (>= 0). */
  readonly qLen: number;
  /** Keys in its cache. */
  readonly kvLen: number;
  /** Page ids holding keys 0..kvLen−1 (at least ceil(kvLen/pageSize)). */
  readonly pages: ArrayLike<number>;
  /** Query positions [qLen]; default kvLen − qLen + i (the queries are the cache's last tokens). */
  readonly positions?: ArrayLike<number>;
}

/** Builds a `PagedBatch` (block tables padded with 0 to the longest page list). */
export function makePagedBatch(seqs: readonly PagedSequence[]): PagedBatch {
  const maxBlocks = seqs.reduce((m, s) => Math.max(m, s.pages.length), 0);
  const cu = new Int32Array(seqs.length + 1);
  seqs.forEach((s, i) => {
    cu[i + 1] = cu[i]! + expectInt('makePagedBatch', `seqs[${i}].qLen`, s.qLen, 0);
  });
  const positions = new Int32Array(cu[seqs.length]!);
  const tables = new Int32Array(seqs.length * maxBlocks);
  seqs.forEach((s, i) => {
    tables.set(Array.from(s.pages), i * maxBlocks);
    for (let t = 0; t < s.qLen; t++) positions[cu[i]! + t] = s.positions ? s.positions[t]! : s.kvLen - s.qLen + t;
  });
  return Object.freeze({
    cuSeqlensQ: cu,
    kvLens: Int32Array.from(seqs, (s) => s.kvLen),
    blockTables: tables,
    positions,
  });
}

/** Elements of one page of one pool: `pageSize·numKvHeads·headDim` (bytes = 4×). */
export function kvPageElements(layout: KvPageLayout): number {
  return checkLayout('kvPageElements', layout) / layout.numPages;
}

/** A zero-filled pool of `numPages` pages f32 (one of K or V of one layer; same length for NHD and HND). */
export function createKvPool(layout: KvPageLayout): Float32Array {
  return new Float32Array(checkLayout('createKvPool', layout));
}

/** Options of `pagedAttention`. */
export interface PagedAttentionOptions {
  /** Query heads (a multiple of layout.numKvHeads; head h reads KV head h / (numHeads/numKvHeads)). */
  readonly numHeads: number;
  /** Softmax scale, e.g. headDim^−0.5. */
  readonly scale: number;
  readonly mask: AttentionMask;
  /** Sliding window W in positions (> 0), or undefined/0 for none. */
  readonly slidingWindow?: number;
}

function checkLayout(call: string, l: KvPageLayout): number {
  if (typeof l !== 'object' || l === null) fail(call, 'layout', 'a KvPageLayout object', l);
  expectInt(call, 'layout.numPages', l.numPages, 0);
  expectInt(call, 'layout.pageSize', l.pageSize, 1);
  expectInt(call, 'layout.numKvHeads', l.numKvHeads, 1);
  expectInt(call, 'layout.headDim', l.headDim, 1);
  if (l.kvLayout !== undefined) expectOneOf(call, 'layout.kvLayout', l.kvLayout, ['NHD', 'HND'] as const);
  return l.numPages * l.pageSize * l.numKvHeads * l.headDim;
}

/**
 * @internal Validates the batch's types and lengths; returns [totalQ, maxBlocksPerSeq]. Contents are checked natively.
 */
export function checkBatch(call: string, b: PagedBatch): [number, number] {
  if (typeof b !== 'object' || b === null) fail(call, 'batch', 'a PagedBatch object', b);
  const kv = expectArray(call, 'batch.kvLens', b.kvLens, Int32Array);
  const cu = expectArray(call, 'batch.cuSeqlensQ', b.cuSeqlensQ, Int32Array, kv.length + 1, 'kvLens.length+1');
  const tables = expectArray(call, 'batch.blockTables', b.blockTables, Int32Array);
  if (kv.length === 0 ? tables.length !== 0 : tables.length % kv.length !== 0) {
    fail(call, 'batch.blockTables', `a length divisible by kvLens.length = ${kv.length}`, tables);
  }
  const totalQ = cu[kv.length]!;
  expectArray(call, 'batch.positions', b.positions, Int32Array, Math.max(0, totalQ), 'cuSeqlensQ[numSeqs]');
  return [totalQ, kv.length === 0 ? 0 : tables.length / kv.length];
}

/** @internal Mask and window, validated. */
export function checkMask(call: string, mask: unknown, window: unknown): [AttentionMask, number] {
  const m = expectOneOf(call, 'options.mask', mask, ['causal', 'non-causal'] as const);
  const w = window === undefined ? 0 : expectInt(call, 'options.slidingWindow', window, 0, 2 ** 31 - 1);
  return [m, w];
}

function attentionArgs(
  call: string,
  q: Float32Array,
  kPool: Float32Array,
  vPool: Float32Array,
  layout: KvPageLayout,
  batch: PagedBatch,
  options: PagedAttentionOptions,
  out: Float32Array | undefined,
) {
  const poolLength = checkLayout(call, layout);
  expectArray(call, 'kPool', kPool, Float32Array, poolLength, 'numPages*pageSize*numKvHeads*headDim');
  expectArray(call, 'vPool', vPool, Float32Array, poolLength, 'numPages*pageSize*numKvHeads*headDim');
  if (typeof options !== 'object' || options === null) fail(call, 'options', 'a PagedAttentionOptions object', options);
  const numHeads = expectInt(call, 'options.numHeads', options.numHeads, 1);
  if (numHeads % layout.numKvHeads !== 0) {
    fail(call, 'options.numHeads', `a multiple of layout.numKvHeads = ${layout.numKvHeads}`, numHeads);
  }
  const scale = expectNumber(call, 'options.scale', options.scale);
  const [mask, window] = checkMask(call, options.mask, options.slidingWindow);
  const [totalQ, maxBlocks] = checkBatch(call, batch);
  const rows = totalQ * numHeads * layout.headDim;
  expectArray(call, 'q', q, Float32Array, rows, 'totalQ*numHeads*headDim');
  const y = outArray(call, out, Float32Array, rows, 'totalQ*numHeads*headDim');
  return [
    q,
    kPool,
    vPool,
    y,
    layout.numPages,
    layout.pageSize,
    layout.numKvHeads,
    layout.headDim,
    numHeads,
    scale,
    batch.cuSeqlensQ,
    batch.kvLens,
    batch.blockTables,
    maxBlocks,
    batch.positions,
    mask,
    window,
    layout.kvLayout === 'HND' ? 1 : 0,
  ] as const;
}

/**
 * Paged attention: `out[t, h] = softmax_j(q[t, h]·k[j, h/g]·scale) · v[j, h/g]` over the keys query t
 * sees (module comment), g = numHeads / numKvHeads. Synchronous.
 * @param q Float32Array [totalQ, numHeads, headDim].
 * @param kPool Float32Array of numPages pages (layout.kvLayout); @param vPool the same shape.
 * @param layout the pools' geometry; @param batch sequences (cu_seqlens, kvLens, block tables, positions).
 * @param options numHeads, scale, mask, slidingWindow.
 * @param out optional Float32Array [totalQ, numHeads, headDim] (must not alias q or the pools).
 * @returns Float32Array [totalQ, numHeads, headDim].
 * @throws SpecdArgumentError on a wrong type, length or option; RangeError (code ERR_SPECD_INVALID_ARG)
 *   on bad batch contents (offsets, kvLen beyond the table, page id out of range, negative position).
 */
export function pagedAttention(
  q: Float32Array,
  kPool: Float32Array,
  vPool: Float32Array,
  layout: KvPageLayout,
  batch: PagedBatch,
  options: PagedAttentionOptions,
  out?: Float32Array,
): Float32Array {
  const args = attentionArgs('pagedAttention', q, kPool, vPool, layout, batch, options, out);
  addon.pagedAttention(...args);
  return args[3];
}

/**
 * `pagedAttention` on a libuv thread (long prefill calls from the main thread). The buffers are
 * referenced, not copied: do not write q, the pools or the batch, nor read out, before it resolves.
 */
export async function pagedAttentionAsync(
  q: Float32Array,
  kPool: Float32Array,
  vPool: Float32Array,
  layout: KvPageLayout,
  batch: PagedBatch,
  options: PagedAttentionOptions,
  out?: Float32Array,
): Promise<Float32Array> {
  const args = attentionArgs('pagedAttentionAsync', q, kPool, vPool, layout, batch, options, out);
  await addon.pagedAttentionAsync(...args);
  return args[3];
}

/**
 * Low-level page write (`reshape_and_cache`): pool row `slots[t]` (= page·pageSize + offset; −1 =
 * skip, e.g. padding) gets `src` row t at columns [colOffset, colOffset + cols).
 * @param src Float32Array [tokens, cols]; @param pool Float32Array [numPages, pageSize, rowElements].
 * @param slots Int32Array [tokens], distinct (except −1); duplicates race.
 */
export function writePagedRows(
  src: Float32Array,
  cols: number,
  pool: Float32Array,
  pageSize: number,
  rowElements: number,
  colOffset: number,
  slots: Int32Array,
): void {
  const call = 'writePagedRows';
  expectInt(call, 'cols', cols, 1);
  expectInt(call, 'pageSize', pageSize, 1);
  expectInt(call, 'rowElements', rowElements, 1);
  expectInt(call, 'colOffset', colOffset, 0);
  const s = expectArray(call, 'slots', slots, Int32Array);
  expectArray(call, 'src', src, Float32Array, s.length * cols, 'slots.length*cols');
  const p = expectArray(call, 'pool', pool, Float32Array);
  if (p.length % (pageSize * rowElements) !== 0)
    fail(call, 'pool', `a length divisible by pageSize*rowElements = ${pageSize * rowElements}`, p);
  addon.writePagedRows(
    src,
    s.length,
    cols,
    p,
    p.length / (pageSize * rowElements),
    pageSize,
    rowElements,
    colOffset,
    s,
  );
}

/**
 * Writes this step's K and V rows into the pools (vLLM `reshape_and_cache`).
 * @param k Float32Array [numTokens, numKvHeads, headDim]; @param v the same shape.
 * @param slotMapping Int32Array [numTokens]: slot = page·pageSize + offset, −1 = skip; distinct.
 */
export function writeKvPages(
  layout: KvPageLayout,
  k: Float32Array,
  v: Float32Array,
  kPool: Float32Array,
  vPool: Float32Array,
  slotMapping: Int32Array,
): void {
  const call = 'writeKvPages';
  const poolLength = checkLayout(call, layout);
  const row = layout.numKvHeads * layout.headDim;
  expectArray(call, 'kPool', kPool, Float32Array, poolLength, 'numPages*pageSize*numKvHeads*headDim');
  expectArray(call, 'vPool', vPool, Float32Array, poolLength, 'numPages*pageSize*numKvHeads*headDim');
  const n = expectArray(call, 'slotMapping', slotMapping, Int32Array).length;
  expectArray(call, 'k', k, Float32Array, n * row, 'numTokens*numKvHeads*headDim');
  expectArray(call, 'v', v, Float32Array, n * row, 'numTokens*numKvHeads*headDim');
  if (layout.kvLayout === 'HND') {
    const { numKvHeads: kvH, headDim: hd } = layout;
    addon.writePagedRows(k, n, hd, kPool, layout.numPages, layout.pageSize, hd, 0, slotMapping, kvH);
    addon.writePagedRows(v, n, hd, vPool, layout.numPages, layout.pageSize, hd, 0, slotMapping, kvH);
  } else {
    addon.writePagedRows(k, n, row, kPool, layout.numPages, layout.pageSize, row, 0, slotMapping);
    addon.writePagedRows(v, n, row, vPool, layout.numPages, layout.pageSize, row, 0, slotMapping);
  }
}

/**
 * Asks the CPU to bring whole pages of a pool into its caches (prefetch hints, `prefetcht1`), returning at once:
 * a decode step calls it for a layer's K and V pages before the layer's q/k/v projection, so that the pages arrive
 * while that GEMM streams its weights instead of stalling `pagedAttention` (the weights streamed since the layer's
 * last step evicted them). Reads nothing into a register and writes nothing: results never change.
 * Measured (SmolLM2 decode, context ~200, 2 threads, AMD EPYC Zen 5; `npm run bench:calls`): pagedAttention 15–20 →
 * 12.7–13.5 µs a call, the hints ~1.5 µs a call (docs/BENCHMARKS.md, issue 16, 2026-12-04).
 * @param pool Float32Array [numPages, pageElements] (a K or V pool, any layout). @param pageElements floats per page.
 * @param pages Int32Array [n] page ids. @param pool2 optional second pool of the same page size (the layer's V beside
 *   its K): the same pages of both in one call.
 * @throws {RangeError} naming the argument (a page id outside a pool).
 */
export function prefetchPages(pool: Float32Array, pageElements: number, pages: Int32Array, pool2?: Float32Array): void {
  const call = 'prefetchPages';
  expectInt(call, 'pageElements', pageElements, 1);
  expectArray(call, 'pool', pool, Float32Array);
  expectArray(call, 'pages', pages, Int32Array);
  if (pool2 === undefined) addon.prefetchPages(pool, pageElements, pages);
  else addon.prefetchPages(pool, pageElements, pages, expectArray(call, 'pool2', pool2, Float32Array));
}

/**
 * Copies whole pages (prefix sharing, PD hand-over): `dst` page `dstPages[i]` = `src` page
 * `srcPages[i]`. Works for any pool (K, V, MLA latent). `dst` may be `src` if no page is both a
 * source and a destination; destinations must be distinct.
 * @param src Float32Array [srcPagesTotal, pageElements]; @param dst Float32Array [dstPagesTotal, pageElements].
 * @param pageElements floats per page (`kvPageElements(layout)`, or pageSize·(r+rope) for MLA).
 * @param srcPages Int32Array [n]; @param dstPages Int32Array [n].
 */
export function copyPages(
  src: Float32Array,
  dst: Float32Array,
  pageElements: number,
  srcPages: Int32Array,
  dstPages: Int32Array,
): void {
  const call = 'copyPages';
  expectInt(call, 'pageElements', pageElements, 1);
  expectArray(call, 'src', src, Float32Array);
  expectArray(call, 'dst', dst, Float32Array);
  const s = expectArray(call, 'srcPages', srcPages, Int32Array);
  expectArray(call, 'dstPages', dstPages, Int32Array, s.length, 'srcPages.length');
  addon.copyPages(src, dst, pageElements, srcPages, dstPages);
}
