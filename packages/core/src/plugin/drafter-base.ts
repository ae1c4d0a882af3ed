/**
 * The base class of a loaded drafter: the {@link Drafter} lifecycle with defaults, so a method writes
 * only what is its own — `method`, `maxDraftTokens` and `propose`, plus the context path (`captureSetter`,
 * `projectTargetHiddenPartial`, `writeProjectedContextKV`) when it reads the target's hidden states.
 *
 * Defaults:
 * - add / free / contextLength / pagesInUse: the {@link DraftKvCache} passed to the constructor (a
 *   drafter without one has no draft context: add and free do nothing, every context length is 0);
 * - capture: no taps (`[]`); project: nothing to add (the accumulator is returned as it is, or an empty
 *   array); materialise: each span checked against the draft context length and appended to it (rows
 *   counted, nothing stored), or nothing without a cache;
 * - dispose: the draft KV cache is dropped (subclasses drop their weights, then call `super.dispose()`).
 *
 * Prefill/decode disaggregation is not a default (a drafter with more per-sequence state would lose it):
 * a drafter declares {@link DraftContextTransfer} itself, in a few lines over the protected helpers
 * {@link DrafterBase.draftKvRegions}, {@link DrafterBase.draftKvEntries} and {@link DrafterBase.reserveDraftContext}
 * (its draft KV pages; a drafter that keeps more per sequence adds its own regions and entries).
 *
 * Errors thrown by the helpers are {@link DrafterError}s prefixed with the method name, as the drafters'
 * own (`dflash: propose: …`).
 */

import type { DraftKvCache } from '../kv/draft-kv-cache.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import { DRAFT_FEATURES_REGION, draftKvRegionId, f32Region, pageRanges } from '../pd/manifest.js';
import type { LocalEntry, MemoryRegion } from '../pd/types.js';
import {
  DrafterError,
  type ContextSpan,
  type DraftBatch,
  type Drafter,
  type DraftProposal,
  type DraftContextFeatures,
  type DraftContextTransfer,
  type DraftSequence,
} from './drafter-plugin.js';
import type { StageInfo } from './model-plugin.js';

/** A loaded drafter with the default lifecycle (module comment). */
export abstract class DrafterBase implements Drafter {
  /** Method name, e.g. `'dflash'` (prefixes every error). */
  abstract readonly method: string;
  /** Drafts per step at most. */
  abstract readonly maxDraftTokens: number;

  /** @param draftKv the draft context (lengths, and K/V pages when the drafter attends); absent = none. */
  protected constructor(protected readonly draftKv?: DraftKvCache) {}

  /** propose: drafts for every sequence of the batch (same order). Leaves the draft context unchanged. */
  abstract propose(batch: DraftBatch): DraftProposal[];

  /** capture: no taps. Override to name the target taps the drafter reads. */
  captureSetter(_target: StageInfo): readonly number[] {
    return [];
  }

  /** project: no taps, nothing to add: returns `accumulator`, or an empty array when there is none. */
  projectTargetHiddenPartial(
    _stageTaps: ReadonlyMap<number, Float32Array>,
    _numTokens: number,
    accumulator?: Float32Array,
  ): Float32Array {
    return accumulator ?? new Float32Array(0);
  }

  /**
   * materialise, for a drafter without a context projection: appends each span's rows to its sequence's
   * draft context (counted; nothing stored). A no-op without a draft KV cache.
   * @throws {DrafterError} if a span's position is not its sequence's draft context length;
   *   `CacheError` `unknown-sequence` for a sequence never added.
   */
  writeProjectedContextKV(_sum: Float32Array, spans: readonly ContextSpan[]): void {
    if (this.draftKv === undefined) return;
    for (const s of spans) this.checkContextPosition(s, 'writeProjectedContextKV');
    this.draftKv.extendAll(spans);
  }

  /** add: registers `id` with an empty draft context. @throws `CacheError` `duplicate-sequence`. */
  addSequence(id: SequenceId): void {
    this.draftKv?.add(id);
  }

  /** Draft context tokens of `id` (0 without a draft KV cache). @throws `CacheError` `unknown-sequence`. */
  contextLength(id: SequenceId): number {
    return this.draftKv === undefined ? 0 : this.draftKv.contextLength(id);
  }

  /** free: drops everything `id` holds. Idempotent. Subclasses that keep more per sequence extend it. */
  freeSequence(id: SequenceId): void {
    this.draftKv?.free(id);
  }

  /** Draft KV pages in use over all sequences (0 without KV). */
  get pagesInUse(): number {
    return this.draftKv?.pagesInUse ?? 0;
  }

  /** dispose: drops the draft KV cache. Subclasses drop their weights and call it. */
  dispose(): void {
    this.draftKv?.dispose();
  }

  /**
   * Checks that a context span starts at its sequence's draft context length.
   * @param call the method name for the message (e.g. `'writeProjectedContextKV'`).
   * @throws {DrafterError} `<method>: <call>: sequence <id>: position <p> is not the draft context length <n>`;
   *   `CacheError` `unknown-sequence`.
   */
  protected checkContextPosition(span: { readonly id: SequenceId; readonly position: number }, call: string): void {
    const have = this.contextLength(span.id);
    if (span.position !== have)
      throw new DrafterError(
        `${this.method}: ${call}: sequence ${String(span.id)}: position ${span.position} ` +
          `is not the draft context length ${have}`,
      );
  }

  /**
   * Checks that sequence `index` of a propose batch drafts from its draft context length.
   * @throws {DrafterError} `<method>: propose: sequences[<i>] (<id>): position <p> is not the draft context …`.
   */
  protected checkProposePosition(s: Pick<DraftSequence, 'id' | 'position'>, index: number): void {
    const have = this.contextLength(s.id);
    if (s.position !== have)
      throw new DrafterError(
        `${this.method}: propose: sequences[${index}] (${String(s.id)}): position ${s.position} ` +
          `is not the draft context length ${have}`,
      );
  }

  /**
   * Checks that sequence `index` of a propose batch asks for 1 … `max` drafts.
   * @throws {DrafterError} `<method>: propose: sequences[<i>].maxDrafts: expected [1, <max>], got <k>`.
   */
  protected checkMaxDrafts(s: Pick<DraftSequence, 'maxDrafts'>, index: number, max: number): void {
    if (!(s.maxDrafts >= 1 && s.maxDrafts <= max))
      throw new DrafterError(
        `${this.method}: propose: sequences[${index}].maxDrafts: expected [1, ${max}], got ${s.maxDrafts}`,
      );
  }

  /**
   * PD helper ({@link DraftContextTransfer.pdRegions}): the K and V page stores of every draft layer j as
   * regions `draft-kv/<j>/k` and `draft-kv/<j>/v` (`[numPages, pageSize, numKvHeads, headDim]` f32, as bytes);
   * `[]` without draft KV.
   */
  protected draftKvRegions(): MemoryRegion[] {
    const kv = this.draftKv;
    if (kv === undefined || !kv.hasKv) return [];
    const out: MemoryRegion[] = [];
    for (let j = 0; j < kv.numLayers; j++)
      out.push(f32Region(draftKvRegionId(j, 'k'), kv.keys(j)), f32Region(draftKvRegionId(j, 'v'), kv.values(j)));
    return out;
  }

  /**
   * PD helper ({@link DraftContextTransfer.pdContextEntries}): per draft layer j, entries `'draft-kv'` layer j
   * part `'k'` then `'v'` (rank 0), each the sequence's pages in block-table order, adjacent pages coalesced,
   * split by KV head (`heads`: the draft model's KV heads over its tensor-parallel group, `headDim · 4` bytes each);
   * `[]` without draft KV.
   *
   * Window-aware: a layer whose attention slides over `window(j) = W > 0` positions reads, for a query at
   * position p ≥ L (the context length L and every later draft or verify row), only keys in (p − W, p]; rows before
   * L − W are never read again. Its entries hold only the pages of rows [max(0, L − W), L)
   * (`⌈L / pageSize⌉ − ⌊max(0, L − W) / pageSize⌋` pages, where a full layer sends `⌈L / pageSize⌉`); the earlier
   * pages D reserved keep whatever they held, which the sliding attention kernel never reads.
   * @param window the sliding window of layer j, positions (0 or absent: full attention, every page).
   * @throws `CacheError` `unknown-sequence`.
   */
  protected draftKvEntries(id: SequenceId, window?: (layer: number) => number): LocalEntry[] {
    const kv = this.draftKv;
    if (kv === undefined) return [];
    const length = kv.contextLength(id); // an unknown sequence throws, with or without KV
    if (!kv.hasKv) return [];
    const pages = kv.pool.blockTable(id);
    // a row is [kvHeads, headDim]: split by KV head over the tensor-parallel group
    const heads = { total: kv.totalKvHeads, bytes: kv.layout.headDim * 4 };
    const out: LocalEntry[] = [];
    for (let j = 0; j < kv.numLayers; j++) {
      const w = window?.(j) ?? 0;
      const first = w > 0 ? Math.floor(Math.max(0, length - w) / kv.pool.pageSize) : 0;
      const sent = first > 0 ? pages.subarray(first) : pages;
      for (const part of ['k', 'v'] as const) {
        out.push({
          key: { kind: 'draft-kv', layer: j, part, rank: 0 },
          ranges: pageRanges(draftKvRegionId(j, part), sent, kv.pool.pageBytes),
          heads,
          // a full layer's rows from row 0: sendable while the prompt prefills (pd/overlap.ts)
          ...(w > 0 ? {} : { rowBytes: kv.pool.floatsPerToken * 4 }),
        });
      }
    }
    return out;
  }

  /**
   * PD helper ({@link DraftContextFeatures}): the projected-feature page store as region `draft-features`
   * (`[numPages, pageSize, featureWidth]` f32, as bytes); `[]` when the draft KV cache keeps no features.
   */
  protected draftFeatureRegions(): MemoryRegion[] {
    const pool = this.draftKv?.features;
    return pool === undefined ? [] : [f32Region(DRAFT_FEATURES_REGION, pool.layerStore(0))];
  }

  /**
   * PD helper ({@link DraftContextFeatures.pdFeatureEntries}): the `'draft-features'` entry of `id` (layer 0, part
   * `''`, rank 0, no head split: every rank's rebuild reads whole rows), the feature pages of rows
   * [max(0, L − W), L) where W is the widest window of `window(j)` over the draft layers — every row (W = ∞) when a
   * layer attends the whole context (`window(j)` 0) — in block-table order, coalesced. `[]` without features.
   * @throws `CacheError` `unknown-sequence`.
   */
  protected draftFeatureEntries(id: SequenceId, window?: (layer: number) => number): LocalEntry[] {
    const kv = this.draftKv;
    if (kv === undefined) return [];
    const first = this.featureRowsFrom(id, window);
    const pool = kv.features;
    if (pool === undefined) return [];
    const pages = pool.blockTable(id).subarray(Math.floor(first / pool.pageSize));
    // rows from row 0 whatever the length when some layer attends the whole context: sendable while prefilling
    const full = Array.from({ length: Math.max(kv.numLayers, 1) }, (_, j) => window?.(j) ?? 0).some((w) => w <= 0);
    return [
      {
        key: { kind: 'draft-features', layer: 0, part: '', rank: 0 },
        ranges: pageRanges(DRAFT_FEATURES_REGION, pages, pool.pageBytes),
        ...(full ? { rowBytes: pool.floatsPerToken * 4 } : {}),
      },
    ];
  }

  /**
   * The first row whose feature page {@link draftFeatureEntries} sends, rounded down to its page: D rebuilds rows
   * [that, L). @throws `CacheError` `unknown-sequence`.
   */
  protected featureRowsFrom(id: SequenceId, window?: (layer: number) => number): number {
    const kv = this.draftKv;
    if (kv === undefined) return 0;
    const length = kv.contextLength(id); // an unknown sequence throws
    const layers = Math.max(kv.numLayers, 1);
    let widest = 0;
    for (let j = 0; j < layers; j++) {
      const w = window?.(j) ?? 0;
      if (w <= 0) return 0;
      widest = Math.max(widest, w);
    }
    const pageSize = kv.features?.pageSize ?? 1;
    return Math.floor(Math.max(0, length - widest) / pageSize) * pageSize;
  }

  /**
   * PD helper ({@link DraftContextTransfer.pdReserveContext}): grows the empty draft context of `id` to
   * `length` rows (pages allocated, all or nothing; without KV only counted), for a transfer to fill.
   * @throws {DrafterError} `<method>: pdReserveContext: …` if the context is not empty or `length` is not an
   *   integer ≥ 0; `CacheError` `full` (nothing allocated), `unknown-sequence`.
   */
  protected reserveDraftContext(id: SequenceId, length: number): void {
    if (!Number.isSafeInteger(length) || length < 0)
      throw new DrafterError(`${this.method}: pdReserveContext: length: expected an integer >= 0, got ${length}`);
    const have = this.contextLength(id);
    if (have !== 0)
      throw new DrafterError(
        `${this.method}: pdReserveContext: sequence ${String(id)}: the draft context already has ${have} rows ` +
          '(a transfer fills a freshly added sequence)',
      );
    this.draftKv?.extendAll([{ id, position: 0, numTokens: length }]);
  }
}
