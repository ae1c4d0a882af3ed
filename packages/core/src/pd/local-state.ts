/**
 * A request's state on one side of a PD pair, as manifest entries: the target's (its SequenceCache: KV
 * pages per attention layer, recurrent and conv state per linear-attention layer) and the drafter's (what
 * its {@link DraftContextTransfer} declares). Both sides call the same functions on their own engine, so D
 * derives what it expects from its own model, drafter and layout, never from P's message.
 */

import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { SequenceCache } from '../kv/sequence-cache.js';
import type { Drafter } from '../plugin/drafter-plugin.js';
import { hasDraftContextTransfer } from '../plugin/drafter-plugin.js';
import { targetEntries, targetRegions } from './manifest.js';
import { entryName, type LocalEntry, type MemoryRegion, PdError } from './types.js';

/** Every region of a side: the target cache's stores and the drafter's (registered once with the transfer engine). */
export function sideRegions(cache: SequenceCache, drafter: Drafter | undefined): MemoryRegion[] {
  const regions = [...targetRegions(cache)];
  if (drafter !== undefined && hasDraftContextTransfer(drafter)) regions.push(...drafter.pdRegions());
  return regions;
}

/**
 * The entries of sequence `id` on this side: the target's, then the drafter's (in that order).
 * @throws {PdError} `'unsupported'` for a drafter without {@link DraftContextTransfer}.
 */
export function sequenceEntries(cache: SequenceCache, drafter: Drafter | undefined, id: SequenceId): LocalEntry[] {
  const entries = [...targetEntries(cache, id, 0)];
  if (drafter !== undefined) {
    if (!hasDraftContextTransfer(drafter))
      throw new PdError('unsupported', `${drafter.method}: no prefill/decode transfer of its draft context`);
    entries.push(...drafter.pdContextEntries(id));
  }
  const seen = new Set<string>();
  for (const e of entries) {
    const name = entryName(e.key);
    if (seen.has(name)) throw new PdError('manifest', `${name}: declared twice`);
    seen.add(name);
  }
  return entries;
}
