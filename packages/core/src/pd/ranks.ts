/**
 * Prefill/decode disaggregation over tensor-parallel ranks, and between different TP sizes on P and D
 * (docs/ARCHITECTURE.md "Prefill/decode disaggregation"; the head rule of docs/PD-PLANNER.md).
 *
 * One side's memory. A TP group's ranks are threads of one process (tensor-parallel/tp-model.ts) whose cache
 * stores live in shared memory (kv `sharedFloat32`), so the transfer engine on the driver's thread registers every
 * rank's regions: rank 0's under their own ids, rank r's as `rank<r>/<id>` ({@link rankRegionId}). The ranks'
 * block tables and state slots are the same (the driver's cache operations are mirrored to every rank), so rank
 * r's entries of a sequence are rank 0's with the regions renamed and `key.rank = r` — for every entry whose
 * regions rank r holds (a drafter loaded whole on rank 0 has none elsewhere).
 *
 * Re-splitting. P sends D what each D rank expects. When both sides have the same TP, P rank r's entry is D rank
 * r's. When they differ, D rank d's entry of a by-head kind ({@link EntryHeads}: GQA / draft KV by KV head, KDA
 * state and conv state by head) is cut per unit into pieces of consecutive heads each held by one P rank, read
 * from that P rank's entry at its own row length ({@link reshardEntries}); entries without heads (the MLA latent,
 * a drafter's last feature) are the same on every rank and are read from P rank 0. The byte lengths D expects are
 * derived from D's own layout and checked against what P sends (pairing.ts), so a plan that used one side's row
 * length for the other's fails by name instead of writing at the wrong offsets.
 */

import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { SequenceCache } from '../kv/sequence-cache.js';
import type { Drafter } from '../plugin/drafter-plugin.js';
import type { StageModel } from '../plugin/model-plugin.js';
import { allEntries, allRegions, coalesceRanges, type DraftContextForm, entryByteLength } from './manifest.js';
import {
  entryId,
  entryName,
  type EntryHeads,
  type LocalEntry,
  type MemoryRegion,
  PdError,
  type PdEntryKey,
  type RegionRange,
} from './types.js';

/** Region id of rank `rank`'s region `id`: `id` on rank 0, `rank<r>/<id>` elsewhere. */
export function rankRegionId(rank: number, id: string): string {
  return rank === 0 ? id : `rank${rank}/${id}`;
}

/** A target spread over tensor-parallel ranks, as this module needs it (tensor-parallel/tp-model.ts). */
interface RankGroup {
  readonly size: number;
  syncRanks(cache: SequenceCache, drafters: readonly number[]): MemoryRegion[][];
}

function isRankGroup(target: StageModel): target is StageModel & RankGroup {
  const t = target as Partial<RankGroup>;
  return typeof t.syncRanks === 'function' && typeof t.size === 'number';
}

/** The shard id of a drafter spread over the ranks (tensor-parallel/tp-drafter.ts), else undefined. */
function shardId(drafter: Drafter | undefined): number | undefined {
  const id = (drafter as { readonly id?: unknown; readonly rank0?: unknown } | undefined)?.id;
  return typeof id === 'number' && (drafter as { rank0?: unknown }).rank0 !== undefined ? id : undefined;
}

/**
 * One side's state over its tensor-parallel ranks (module comment): every rank's regions and a sequence's entries
 * on every rank. Without TP it is rank 0 alone (manifest.ts `allRegions` / `allEntries`).
 */
export class RankedState {
  /** Ranks (1 without tensor parallelism). */
  readonly tp: number;
  /** Per rank ≥ 1, the ids (unprefixed) of the regions it holds; filled by {@link regions}. */
  private held: Set<string>[] = [];

  constructor(
    private readonly target: StageModel,
    private readonly cache: SequenceCache,
    private readonly drafter: Drafter | undefined,
  ) {
    this.tp = isRankGroup(target) ? target.size : 1;
  }

  /**
   * Every rank's regions (rank r's renamed {@link rankRegionId}); syncs the worker ranks first. Call once, at
   * start: the regions stay for the life of the cache and drafter.
   * @throws the group's errors (a rank that fails).
   */
  regions(): MemoryRegion[] {
    const out = allRegions(this.cache, this.drafter);
    const target = this.target;
    if (!isRankGroup(target)) return out;
    const id = shardId(this.drafter);
    const workers = target.syncRanks(this.cache, id === undefined ? [] : [id]);
    this.held = workers.map((rs) => new Set(rs.map((r) => r.id)));
    workers.forEach((rs, k) => {
      for (const r of rs) out.push({ id: rankRegionId(k + 1, r.id), bytes: r.bytes });
    });
    return out;
  }

  /**
   * Applies the cache operations queued for the worker ranks now (D, after reserving a sequence: the transfer
   * writes into every rank's pages and slot, which must be the sequence's there before it lands). No-op without TP.
   */
  sync(): void {
    const target = this.target;
    if (!isRankGroup(target)) return;
    const id = shardId(this.drafter);
    target.syncRanks(this.cache, id === undefined ? [] : [id]);
  }

  /**
   * Sequence `id`'s entries on every rank, rank order: rank 0's (manifest.ts `allEntries`, heads over this
   * side's TP), then each worker rank's copy of those whose regions it holds; the draft context in `form`
   * (manifest.ts `DraftContextForm`, default `'kv'`).
   * @throws as `allEntries`.
   */
  entries(id: SequenceId, form: DraftContextForm = 'kv'): LocalEntry[] {
    const base = allEntries(this.cache, this.drafter, id, 0, this.tp, form);
    const out = [...base];
    this.held.forEach((held, k) => {
      const rank = k + 1;
      for (const e of base) {
        if (!e.ranges.every((r) => held.has(r.region))) continue;
        out.push({
          ...e,
          key: { ...e.key, rank },
          ranges: e.ranges.map((r) => ({ ...r, region: rankRegionId(rank, r.region) })),
        });
      }
    });
    return out;
  }
}

/** Heads a rank holds: `[first, count]` (the Megatron rule of {@link EntryHeads}). */
export function rankHeads(rank: number, tp: number, total: number): [number, number] {
  return tp <= total ? [(rank * total) / tp, total / tp] : [Math.floor((rank * total) / tp), 1];
}

/** @throws {PdError} `'layout'` unless `tp` divides `total` or is a multiple of it. */
function checkSplit(key: PdEntryKey, heads: EntryHeads, tp: number, side: string): void {
  const { total } = heads;
  if (!(Number.isSafeInteger(total) && total >= 1 && (total % tp === 0 || tp % total === 0)))
    throw new PdError(
      'layout',
      `${entryName(key)}: ${total} heads do not split over the ${side} instance's tp = ${tp} (tp must divide the ` +
        'heads, or be a multiple of them)',
    );
}

/** Byte-stream slicing of an entry: `[offset, offset + length)` of its bytes in send order, as region ranges. */
class EntryStream {
  private readonly starts: number[] = [];

  constructor(readonly entry: LocalEntry) {
    let at = 0;
    for (const r of entry.ranges) {
      this.starts.push(at);
      at += r.length;
    }
  }

  slice(offset: number, length: number, out: RegionRange[]): void {
    const { ranges } = this.entry;
    // the last range starting at or before offset
    let lo = 0;
    let hi = ranges.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.starts[mid]! <= offset) lo = mid;
      else hi = mid - 1;
    }
    let left = length;
    for (let i = lo; left > 0 && i < ranges.length; i++) {
      const r = ranges[i]!;
      const skip = Math.max(0, offset - this.starts[i]!);
      const n = Math.min(r.length - skip, left);
      if (n <= 0) continue;
      out.push({ region: r.region, offset: r.offset + skip, length: n });
      left -= n;
    }
    if (left > 0)
      throw new PdError('layout', `${entryName(this.entry.key)}: bytes [${offset}, ${offset + length}) past its end`);
  }
}

/**
 * P's entries re-split for D's ranks (module comment): for each entry D wants (`wanted`, keys of D ranks), the
 * ranges on P's ranks that make up D's bytes, in D's order, keyed as D's. `mine` holds P's entries on every P
 * rank (keys of P ranks, {@link RankedState.entries}). With the same TP on both sides, D rank r's entry is P rank
 * r's. An entry P does not have is left out (pairing.ts `planSend` then names it).
 * Source: the Megatron head split (Shoeybi et al. 2019), replicas read as in the planner (planner.ts).
 * @throws {PdError} `'layout'` for heads that do not split over either side's TP, or a P entry whose length is not
 *   a whole number of units (naming the entry).
 */
export function reshardEntries(
  mine: readonly LocalEntry[],
  fromTp: number,
  wanted: readonly { readonly key: PdEntryKey }[],
  toTp: number,
): LocalEntry[] {
  const byKey = new Map(mine.map((e) => [entryId(e.key), e]));
  const of = (key: PdEntryKey, rank: number) => byKey.get(entryId({ ...key, rank }));
  if (fromTp === toTp)
    return wanted.flatMap((w) => {
      const e = of(w.key, w.key.rank);
      return e === undefined ? [] : [e];
    });
  const streams = new Map<LocalEntry, EntryStream>();
  const stream = (e: LocalEntry) => {
    let s = streams.get(e);
    if (s === undefined) {
      s = new EntryStream(e);
      streams.set(e, s);
    }
    return s;
  };
  const out: LocalEntry[] = [];
  for (const w of wanted) {
    const base = of(w.key, 0);
    if (base === undefined) continue;
    const heads = base.heads;
    if (heads === undefined) {
      out.push({ key: w.key, ranges: base.ranges });
      continue;
    }
    checkSplit(w.key, heads, fromTp, 'prefill');
    checkSplit(w.key, heads, toTp, 'decode');
    const H = heads.total;
    const hb = heads.bytes;
    const [dFirst, dCount] = rankHeads(w.key.rank, toTp, H);
    const pLocal = rankHeads(0, fromTp, H)[1];
    const bytes = entryByteLength(base);
    const units = bytes / (pLocal * hb);
    if (!Number.isSafeInteger(units))
      throw new PdError(
        'layout',
        `${entryName(base.key)}: ${bytes} bytes are not whole units of ${pLocal} heads × ${hb} bytes`,
      );
    const replication = fromTp > H ? fromTp / H : 1;
    const ranges: RegionRange[] = [];
    for (let u = 0; u < units; u++) {
      for (let h = dFirst; h < dFirst + dCount; ) {
        // the P rank holding head h (its replica `d mod replication` when P replicates heads)
        const p = replication === 1 ? Math.floor(h / pLocal) : h * replication + (w.key.rank % replication);
        const [pFirst] = rankHeads(p, fromTp, H);
        const n = Math.min(dFirst + dCount, pFirst + pLocal) - h;
        const src = of(w.key, p);
        if (src === undefined)
          throw new PdError('manifest', `${entryName({ ...w.key, rank: p })}: the prefill instance has none`);
        stream(src).slice((u * pLocal + (h - pFirst)) * hb, n * hb, ranges);
        h += n;
      }
    }
    out.push({ key: w.key, ranges: coalesceRanges(ranges) });
  }
  return out;
}

/**
 * Gathers every entry of `entries` made of more than `minRanges` ranges (a TP re-split of per-token rows: one
 * range per head per token) into one new buffer, in the entry's byte order, so it crosses as one descriptor and is
 * checksummed in one call: a descriptor costs microseconds of bookkeeping whatever its size, a copy of a few hundred
 * bytes a fraction of one. The buffers are returned as regions `<prefix><k>` for the sender to register for the
 * write (and deregister after); the other entries are returned as they are.
 * @param lookup region id → the sender's bytes (manifest.ts `regionLookup`).
 * @throws the lookup's errors for an unknown region.
 */
export function gatherScattered(
  entries: readonly LocalEntry[],
  lookup: (id: string) => Uint8Array,
  prefix: string,
  minRanges = 64,
): { entries: LocalEntry[]; regions: MemoryRegion[] } {
  const regions: MemoryRegion[] = [];
  const out = entries.map((e) => {
    if (e.ranges.length <= minRanges) return e;
    const bytes = new Uint8Array(entryByteLength(e));
    let at = 0;
    for (const r of e.ranges) {
      bytes.set(lookup(r.region).subarray(r.offset, r.offset + r.length), at);
      at += r.length;
    }
    const id = `${prefix}${regions.length}`;
    regions.push({ id, bytes });
    const { heads: _heads, ...rest } = e;
    return { ...rest, ranges: [{ region: id, offset: 0, length: bytes.byteLength }] };
  });
  return { entries: out, regions };
}
