/**
 * The transfer manifest: which bytes make up a request's state on one side of a prefill/decode transfer
 * (pd/types.ts), for the target and for the drafter, and the checks D runs on what P says it sent.
 *
 * - Target (generic over core's {@link SequenceCache}, so every model plugin is covered by its cache
 *   geometry): per paged layer L an entry `'target-kv'` layer L — the sequence's pages of that layer's store,
 *   block-table order, adjacent pages coalesced; per linear-attention layer L an entry `'linear-state'` (its
 *   slot's recurrent state `[heads, dK, dV]` f32) and `'conv-state'` (its slot's conv states
 *   `[convStates, channels, convWidth]` f32). The layer is the cache's layer id (model-llama keeps K of layer l
 *   in cache layer 2l and V in 2l + 1; Kimi-K3 its MLA / KDA layer ids). How a row splits under tensor
 *   parallelism is the geometry's (`PagedKvGeometry.kvHeads`), which the planner reads.
 * - Drafter: what it declares ({@link DraftContextTransfer}); a drafter without the capability is refused
 *   ({@link checkPdDrafter}).
 *
 * Regions (registered once with the transfer engine): `target-kv/<layer>`, `linear-state/<layer>`,
 * `conv-state/<layer>` (one per store of the cache), and the drafter's own (`draft-kv/<j>/<k|v>`, …).
 * Every region is a byte view of a store: writes into it land in the cache.
 *
 * D derives the entries it expects from its own cache and drafter ({@link allEntries}), never from P's
 * message, and checks P's rows against them ({@link checkManifest}).
 */

import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { SequenceCache } from '../kv/sequence-cache.js';
import {
  hasDraftContextFeatures,
  hasDraftContextTransfer,
  type DraftContextFeatures,
  type DraftContextTransfer,
  type Drafter,
} from '../plugin/drafter-plugin.js';
import {
  entryId,
  entryName,
  PdError,
  type LocalEntry,
  type ManifestRow,
  type MemoryRegion,
  type RegionRange,
} from './types.js';

// ---- regions and ranges ------------------------------------------------------------------------

/** A store of f32 values as a region: a byte view of the same memory (no copy). */
export function f32Region(id: string, store: Float32Array): MemoryRegion {
  return { id, bytes: new Uint8Array(store.buffer, store.byteOffset, store.byteLength) };
}

/** Region id of draft layer `layer`'s K (`'k'`) or V (`'v'`) page store: `draft-kv/<layer>/<part>`. */
export function draftKvRegionId(layer: number, part: 'k' | 'v'): string {
  return `draft-kv/${layer}/${part}`;
}

/** Region id of a drafter's projected-feature page store ({@link DraftContextFeatures}). */
export const DRAFT_FEATURES_REGION = 'draft-features';

/**
 * Merges each range into the previous one when it is of the same region and starts where the previous
 * ends; the order (send order) is kept. A sequence whose pages were handed out consecutively becomes one
 * range per region.
 */
export function coalesceRanges(ranges: readonly RegionRange[]): RegionRange[] {
  const out: RegionRange[] = [];
  for (const r of ranges) {
    const last = out[out.length - 1];
    if (last !== undefined && last.region === r.region && last.offset + last.length === r.offset)
      out[out.length - 1] = { region: last.region, offset: last.offset, length: last.length + r.length };
    else out.push(r);
  }
  return out;
}

/**
 * Byte ranges of `pages` (page ids in block-table order) of a page store whose page p lies at bytes
 * `[p · pageBytes, (p + 1) · pageBytes)`, coalesced ({@link coalesceRanges}).
 */
export function pageRanges(region: string, pages: ArrayLike<number>, pageBytes: number): RegionRange[] {
  return coalesceRanges(Array.from(pages, (page) => ({ region, offset: page * pageBytes, length: pageBytes })));
}

/** Bytes of an entry (Σ of its ranges' lengths). */
export function entryByteLength(entry: LocalEntry): number {
  return entry.ranges.reduce((a, r) => a + r.length, 0);
}

/**
 * A lookup from region id to bytes over `regions`.
 * @throws {PdError} `'layout'` for two regions with one id; the lookup throws `'layout'` for an unknown id.
 */
export function regionLookup(regions: readonly MemoryRegion[]): (id: string) => Uint8Array {
  const byId = new Map<string, Uint8Array>();
  for (const r of regions) {
    if (byId.has(r.id)) throw new PdError('layout', `PD regions: region ${JSON.stringify(r.id)} is registered twice`);
    byId.set(r.id, r.bytes);
  }
  return (id) => {
    const bytes = byId.get(id);
    if (bytes === undefined)
      throw new PdError(
        'layout',
        `PD regions: unknown region ${JSON.stringify(id)} (have ${[...byId.keys()].join(', ')})`,
      );
    return bytes;
  };
}

// ---- the target's part -------------------------------------------------------------------------

/**
 * Every store of a target stage's cache as a region: per paged layer `target-kv/<layer>`
 * (`[numPages, pageSize, floatsPerToken]` f32), per linear-attention layer `linear-state/<layer>`
 * (`[numSlots, heads, dK, dV]` f32) and `conv-state/<layer>` (`[numSlots, convStates·channels, convWidth]` f32).
 */
export function targetRegions(cache: SequenceCache): MemoryRegion[] {
  const out: MemoryRegion[] = [];
  const kv = cache.kv;
  if (kv !== undefined) for (const l of kv.layers) out.push(f32Region(`target-kv/${l}`, kv.layerStore(l)));
  const state = cache.state;
  if (state !== undefined) {
    for (const l of state.layers) {
      out.push(f32Region(`linear-state/${l}`, state.recurrentStore(l)));
      if (state.convFloats > 0) out.push(f32Region(`conv-state/${l}`, state.convStore(l)));
    }
  }
  return out;
}

/**
 * The target's entries of sequence `id` in `cache` (module comment), keys of rank `rank` of a `tp`-rank group
 * (each entry's {@link LocalEntry.heads} over the group, from the cache's per-rank geometry): `'target-kv'` per
 * paged layer (`⌈length / pageSize⌉ · pageBytes` bytes), then per linear layer `'linear-state'`
 * (`heads · dK · dV · 4` bytes) and `'conv-state'` (`convStates · channels · convWidth · 4` bytes; none when
 * the layer has no conv state).
 * @throws `CacheError` `unknown-sequence`.
 */
export function targetEntries(cache: SequenceCache, id: SequenceId, rank = 0, tp = 1): LocalEntry[] {
  cache.length(id); // an unknown sequence throws
  const out: LocalEntry[] = [];
  const kv = cache.kv;
  if (kv !== undefined) {
    const pages = kv.blockTable(id);
    // GQA rows split by KV head; MLA rows (no kvHeads) are whole on every rank
    const kvHeads = cache.geometry.pagedKv.kvHeads;
    const heads = kvHeads === undefined ? undefined : { total: kvHeads * tp, bytes: (kv.floatsPerToken / kvHeads) * 4 };
    for (const l of kv.layers) {
      out.push({
        key: { kind: 'target-kv', layer: l, part: '', rank },
        ranges: pageRanges(`target-kv/${l}`, pages, kv.pageBytes),
        rowBytes: kv.floatsPerToken * 4,
        ...(heads === undefined ? {} : { heads }),
      });
    }
  }
  const state = cache.state;
  if (state !== undefined) {
    const slot = state.slotOf(id);
    const recurrentBytes = state.recurrentFloats * 4;
    const convBytes = state.convFloats * 4;
    const g = cache.geometry.linearState;
    // [heads, dK, dV]: one unit; conv [convStates, channels, convWidth]: a head's channels are adjacent
    const recurrentHeads = { total: g.heads * tp, bytes: g.keyDim * g.valueDim * 4 };
    const convHeads =
      g.convChannels % g.heads === 0
        ? { heads: { total: g.heads * tp, bytes: (g.convChannels / g.heads) * g.convWidth * 4 } }
        : {};
    for (const l of state.layers) {
      out.push({
        key: { kind: 'linear-state', layer: l, part: '', rank },
        ranges: [{ region: `linear-state/${l}`, offset: slot * recurrentBytes, length: recurrentBytes }],
        heads: recurrentHeads,
      });
      if (convBytes > 0)
        out.push({
          key: { kind: 'conv-state', layer: l, part: '', rank },
          ranges: [{ region: `conv-state/${l}`, offset: slot * convBytes, length: convBytes }],
          ...convHeads,
        });
    }
  }
  return out;
}

// ---- the drafter's part ------------------------------------------------------------------------

/**
 * Refuses a drafter that does not declare {@link DraftContextTransfer} (both P and D call it at startup).
 * @throws {PdError} `'unsupported'`: `<method>: no prefill/decode transfer (…)`.
 */
export function checkPdDrafter(drafter: Drafter): asserts drafter is Drafter & DraftContextTransfer {
  if (!hasDraftContextTransfer(drafter))
    throw new PdError(
      'unsupported',
      `${drafter.method}: no prefill/decode transfer (the drafter does not declare DraftContextTransfer: ` +
        'pdRegions / pdContextEntries / pdReserveContext, docs/PLUGINS.md)',
    );
}

/**
 * The drafter's regions ({@link DraftContextTransfer.pdRegions}).
 * @throws {PdError} `'unsupported'` as {@link checkPdDrafter}.
 */
export function drafterRegions(drafter: Drafter): readonly MemoryRegion[] {
  checkPdDrafter(drafter);
  return drafter.pdRegions();
}

/**
 * The form of a request's draft context in a transfer (`pd.draft_context`): `'kv'` the drafter's entries as they
 * are (its draft KV pages, window-aware, and any `'draft-state'`); `'features'` its projected features instead of
 * the draft KV (`'draft-features'`, plus any `'draft-state'`; D rebuilds the KV, {@link DraftContextFeatures});
 * `'both'` every entry of both forms (what P offers when D may ask for either).
 */
export type DraftContextForm = 'kv' | 'features' | 'both';

/**
 * The drafter's entries of sequence `id` in `form` ({@link DraftContextForm}; default `'kv'`:
 * {@link DraftContextTransfer.pdContextEntries}), keys of rank `rank`.
 * @throws {PdError} `'unsupported'` as {@link checkPdDrafter}, or for `'features'` from a drafter without
 *   {@link DraftContextFeatures} (or loaded without features); `CacheError` `unknown-sequence`.
 */
export function drafterEntries(
  drafter: Drafter,
  id: SequenceId,
  rank = 0,
  form: DraftContextForm = 'kv',
): LocalEntry[] {
  checkPdDrafter(drafter);
  const kv = drafter.pdContextEntries(id);
  let entries: readonly LocalEntry[] = kv;
  if (form !== 'kv') {
    if (!hasDraftContextFeatures(drafter))
      throw new PdError(
        'unsupported',
        `${drafter.method}: no draft context as features (the drafter does not declare DraftContextFeatures, or ` +
          'was loaded without pdFeatures): use pd.draft_context "kv"',
      );
    const features = drafter.pdFeatureEntries(id);
    entries = form === 'both' ? [...kv, ...features] : [...kv.filter((e) => e.key.kind !== 'draft-kv'), ...features];
  }
  return entries.map((e) => ({ ...e, key: { ...e.key, rank } }));
}

/**
 * A sequence's whole state on one side: the target's entries ({@link targetEntries}), then the drafter's
 * ({@link drafterEntries}; none without a drafter).
 * @throws as {@link targetEntries} and {@link drafterEntries}; {@link PdError} `'manifest'` for a key declared twice.
 */
export function allEntries(
  cache: SequenceCache,
  drafter: Drafter | undefined,
  id: SequenceId,
  rank = 0,
  tp = 1,
  form: DraftContextForm = 'kv',
): LocalEntry[] {
  const target = targetEntries(cache, id, rank, tp);
  const entries = drafter === undefined ? target : [...target, ...drafterEntries(drafter, id, rank, form)];
  const seen = new Set<string>();
  for (const e of entries) {
    const name = entryName(e.key);
    if (seen.has(name)) throw new PdError('manifest', `${name}: declared twice`);
    seen.add(name);
  }
  return entries;
}

/** Every region of one side: the target cache's, then the drafter's (none without a drafter). */
export function allRegions(cache: SequenceCache, drafter: Drafter | undefined): MemoryRegion[] {
  return [...targetRegions(cache), ...(drafter === undefined ? [] : drafterRegions(drafter))];
}

// ---- manifest rows and their check -------------------------------------------------------------

/**
 * A checksum over byte ranges in order (pd/checksum.ts `checksumRanges`): `regionBytes` maps a region id to
 * its bytes.
 */
export type ChecksumRanges = (regionBytes: (id: string) => Uint8Array, ranges: readonly RegionRange[]) => string;

/**
 * P's manifest rows of `entries`: each entry's key, byte length and checksum over its ranges in order.
 * @param regionBytes region id → its bytes ({@link regionLookup}).
 * @throws {PdError} `'layout'` for a range outside its region (naming the entry); `regionBytes`' errors.
 */
export function manifestRows(
  entries: readonly LocalEntry[],
  regionBytes: (id: string) => Uint8Array,
  checksum: ChecksumRanges,
): ManifestRow[] {
  return entries.map((e) => {
    for (const r of e.ranges) {
      const size = regionBytes(r.region).byteLength;
      if (!(r.offset >= 0 && r.length >= 0 && r.offset + r.length <= size))
        throw new PdError(
          'layout',
          `manifest: ${entryName(e.key)}: range [${r.offset}, ${r.offset + r.length}) is outside region ` +
            `${JSON.stringify(r.region)} (${size} bytes)`,
        );
    }
    return { key: e.key, byteLength: entryByteLength(e), checksum: checksum(regionBytes, e.ranges) };
  });
}

/**
 * D's check of P's manifest against the entries D expects (derived from its own cache and drafter): every
 * expected entry received once with the expected byte length, nothing else. Checksums are checked separately,
 * over the bytes that arrived.
 * @throws {PdError} `'manifest'` naming every entry (kind, layer, part, rank) that is missing, sent twice,
 *   not expected, or of another length (bytes sent and expected).
 */
export function checkManifest(expected: readonly LocalEntry[], received: readonly ManifestRow[]): void {
  const want = new Map<string, LocalEntry>();
  for (const e of expected) want.set(entryId(e.key), e);
  const got = new Map<string, ManifestRow>();
  const problems: string[] = [];
  for (const row of received) {
    const key = entryId(row.key);
    if (got.has(key)) problems.push(`${entryName(row.key)} sent twice`);
    got.set(key, row);
    const e = want.get(key);
    if (e === undefined) problems.push(`${entryName(row.key)} (${row.byteLength} bytes) is not expected`);
    else if (row.byteLength !== entryByteLength(e))
      problems.push(`${entryName(row.key)}: ${row.byteLength} bytes sent, ${entryByteLength(e)} expected`);
  }
  for (const [key, e] of want)
    if (!got.has(key)) problems.push(`${entryName(e.key)} (${entryByteLength(e)} bytes) is missing`);
  if (problems.length > 0) throw new PdError('manifest', `manifest: ${problems.join('; ')}`);
}
