/**
 * Pairs the ranges one entry occupies on the sending side with the ranges it goes to on the receiving side
 * (same total length, possibly cut differently: pages of another size, coalesced runs), as the descriptor
 * lists of a transfer: `local[i]` is written to `remote[i]`, equal lengths. Used when both sides hold an entry
 * in the same layout (the same TP on both sides); heterogeneous TP goes through the planner (planner.ts).
 */

import { checksumRanges } from './checksum.js';
import {
  entryId,
  entryName,
  type LocalEntry,
  type ManifestRow,
  PdError,
  type PdEntryKey,
  type RegionRange,
} from './types.js';

/** Descriptor lists of one entry: `local[i]` → `remote[i]`, equal lengths pairwise. */
export interface PairedRanges {
  readonly local: RegionRange[];
  readonly remote: RegionRange[];
}

/** Bytes covered by `ranges`. */
export function rangeBytes(ranges: readonly RegionRange[]): number {
  let n = 0;
  for (const r of ranges) n += r.length;
  return n;
}

/**
 * The byte range [from, to) of the concatenation of `ranges` (in order), as ranges: the entry's bytes `from` to
 * `to` in send order. `from` and `to` are clamped to [0, Σ lengths].
 */
export function sliceRanges(ranges: readonly RegionRange[], from: number, to: number): RegionRange[] {
  const out: RegionRange[] = [];
  let at = 0; // bytes before ranges[i]
  for (const r of ranges) {
    const a = Math.max(from, at);
    const b = Math.min(to, at + r.length);
    if (b > a) out.push({ region: r.region, offset: r.offset + (a - at), length: b - a });
    at += r.length;
    if (at >= to) break;
  }
  return out;
}

/**
 * Cuts `local` and `remote` at each other's boundaries so that they pair up one to one.
 * @param key the entry (named in the error).
 * @throws {PdError} `'manifest'` when the two sides' byte lengths differ (naming the entry and both lengths).
 */
export function pairRanges(
  key: PdEntryKey,
  local: readonly RegionRange[],
  remote: readonly RegionRange[],
): PairedRanges {
  const a = rangeBytes(local);
  const b = rangeBytes(remote);
  if (a !== b) throw new PdError('manifest', `${entryName(key)}: ${a} bytes here, the decode side expects ${b} bytes`);
  const out: PairedRanges = { local: [], remote: [] };
  let i = 0;
  let j = 0;
  let offI = 0; // bytes of local[i] already paired
  let offJ = 0;
  while (i < local.length && j < remote.length) {
    const l = local[i] as RegionRange;
    const r = remote[j] as RegionRange;
    const n = Math.min(l.length - offI, r.length - offJ);
    if (n > 0) {
      out.local.push({ region: l.region, offset: l.offset + offI, length: n });
      out.remote.push({ region: r.region, offset: r.offset + offJ, length: n });
    }
    offI += n;
    offJ += n;
    if (offI === l.length) {
      i++;
      offI = 0;
    }
    if (offJ === r.length) {
      j++;
      offJ = 0;
    }
  }
  return out;
}

/** The sending side of one transfer ({@link planSend}). */
export interface SendPlan {
  /** Descriptor lists: `local[i]` is written to `remote[i]`. */
  readonly local: RegionRange[];
  readonly remote: RegionRange[];
  /** The manifest rows of the entries sent: key, bytes, checksum over the sender's bytes in order. */
  readonly rows: ManifestRow[];
}

/**
 * Pairs the entries the receiver asked for (`wanted`, with the ranges they go to) with the sender's own (`mine`),
 * in the receiver's order, and computes each sent entry's manifest row — what P's driver and each P stage
 * process send.
 * @param lookup region id → the sender's bytes (manifest.ts `regionLookup`).
 * @param who names the sender in the error (e.g. `'the prefill instance'`, `'pipeline stage 0'`).
 * @param withhold test-only: entries left out of both the descriptors and the rows.
 * @param sentBefore entry id (types.ts `entryId`) → bytes of the entry already sent from its start (pd/overlap.ts,
 *   while the prompt prefilled): the descriptors cover only the rest; the rows (checksums) the whole entry.
 * @throws {PdError} `'manifest'` for an entry the sender does not have, or of another length (naming it).
 */
export function planSend(
  wanted: readonly { readonly key: PdEntryKey; readonly ranges: readonly RegionRange[] }[],
  mine: readonly LocalEntry[],
  lookup: (id: string) => Uint8Array,
  who: string,
  withhold?: (key: PdEntryKey) => boolean,
  sentBefore?: ReadonlyMap<string, number>,
): SendPlan {
  const have = new Map(mine.map((e) => [entryId(e.key), e]));
  const plan: SendPlan = { local: [], remote: [], rows: [] };
  for (const want of wanted) {
    const own = have.get(entryId(want.key));
    if (own === undefined)
      throw new PdError('manifest', `${entryName(want.key)}: the decode instance expects it, ${who} has none`);
    if (withhold?.(want.key) === true) continue;
    const total = rangeBytes(own.ranges);
    const done = sentBefore?.get(entryId(want.key)) ?? 0;
    const theirs = rangeBytes(want.ranges);
    if (done > 0 && theirs !== total)
      throw new PdError(
        'manifest',
        `${entryName(want.key)}: ${total} bytes here, the decode side expects ${theirs} bytes`,
      );
    const pairs =
      done === 0
        ? pairRanges(want.key, own.ranges, want.ranges)
        : pairRanges(want.key, sliceRanges(own.ranges, done, total), sliceRanges(want.ranges, done, total));
    plan.local.push(...pairs.local);
    plan.remote.push(...pairs.remote);
    plan.rows.push({ key: want.key, byteLength: total, checksum: checksumRanges(lookup, own.ranges) });
  }
  return plan;
}
