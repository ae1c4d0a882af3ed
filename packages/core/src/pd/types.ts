/**
 * Prefill/decode disaggregation (PD): the shared vocabulary of the planner, the transfer manifest, the
 * transfer engine and the roles (docs/ARCHITECTURE.md "Prefill/decode disaggregation").
 *
 * A prefill instance (P) runs a request's prompt and hands its state to a decode instance (D), which
 * continues with the same speculative loop as aggregated serving. The state is a list of *entries*
 * (the transfer manifest): the target's KV pages per attention layer, the recurrent and conv states
 * per linear-attention layer, and the drafter's context (its draft KV pages per draft layer, or what
 * else it declares). D derives the entries it expects from its own model, drafter and layout; every
 * entry carries a checksum the sender computed over the bytes it sent.
 */

/** What state an entry carries. */
export type PdEntryKind =
  /** The target's paged KV of one attention layer (MLA latent + k_pe, or K and V of the KV heads). */
  | 'target-kv'
  /** The recurrent state of one linear-attention (KDA) layer, `[heads, dK, dV]` per sequence. */
  | 'linear-state'
  /** The short-conv states of one linear-attention layer, `[convStates, channels, convWidth]` per sequence. */
  | 'conv-state'
  /** Draft K (`part` `'k'`) or V (`part` `'v'`) pages of one draft attention layer. */
  | 'draft-kv'
  /** Per-sequence draft state other than KV (e.g. the last projected feature a drafter continues from). */
  | 'draft-state'
  /** Projected-feature pages of the draft context, from which D rebuilds the draft KV (`pd.draft_context`). */
  | 'draft-features';

/** The payload classes reported per request in `/metrics` (bytes by class). */
export type PdPayloadClass = 'target_kv' | 'linear_state' | 'draft_context';

/** The payload class of an entry kind. */
export function payloadClass(kind: PdEntryKind): PdPayloadClass {
  switch (kind) {
    case 'target-kv':
      return 'target_kv';
    case 'linear-state':
    case 'conv-state':
      return 'linear_state';
    case 'draft-kv':
    case 'draft-state':
    case 'draft-features':
      return 'draft_context';
  }
}

/** The identity of an entry: what D expects and P sends. */
export interface PdEntryKey {
  readonly kind: PdEntryKind;
  /**
   * Target kinds: the absolute target layer id. Draft kinds: the draft layer index (0 for a
   * per-sequence `'draft-state'` that belongs to no layer).
   */
  readonly layer: number;
  /** Sub-part of the layer: `'k'` / `'v'` for `'draft-kv'`, a drafter-chosen name for `'draft-state'`, else `''`. */
  readonly part: string;
  /** The receiving side's rank (D's TP rank; 0 without TP). */
  readonly rank: number;
}

/** `'draft-kv layer 2 (v) rank 0'`: an entry named for error messages. */
export function entryName(key: PdEntryKey): string {
  return `${key.kind} layer ${key.layer}${key.part === '' ? '' : ` (${key.part})`} rank ${key.rank}`;
}

/** A stable map key of an entry (`kind/layer/part/rank`). */
export function entryId(key: PdEntryKey): string {
  return `${key.kind}/${key.layer}/${key.part}/${key.rank}`;
}

/**
 * Local memory registered with a transfer engine: one contiguous buffer (a layer's KV page store, a
 * layer's state store, a drafter's per-sequence state). `id` is unique per process (e.g.
 * `'target-kv/3'`); a peer names it in the descriptors it writes.
 */
export interface MemoryRegion {
  readonly id: string;
  /** The memory (a view of a store's `ArrayBuffer`; writes land in the store). */
  readonly bytes: Uint8Array;
}

/** A byte range of a registered region. */
export interface RegionRange {
  readonly region: string;
  /** Bytes from the region's start. */
  readonly offset: number;
  /** Bytes. */
  readonly length: number;
}

/**
 * How an entry's bytes split over tensor-parallel ranks by head: the bytes (in send order) are `[units,
 * headsOfRank, bytes]` — per unit (a token row of a page, a conv state, one recurrent state) the rank's heads side
 * by side, `bytes` each. The rank's heads follow the Megatron rule the models and drafters shard by: with
 * `tp ≤ total` rank r holds `[r·total/tp, (r+1)·total/tp)`; with `tp > total` it holds head `⌊r·total/tp⌋`
 * (replicated).
 */
export interface EntryHeads {
  /** Heads over the whole tensor-parallel group. */
  readonly total: number;
  /** Bytes of one head in one unit. */
  readonly bytes: number;
}

/** Where one entry's bytes live on one side, in send order (the checksum covers them in this order). */
export interface LocalEntry {
  readonly key: PdEntryKey;
  readonly ranges: readonly RegionRange[];
  /**
   * How the entry splits over tensor-parallel ranks (pd/ranks.ts re-splits it when P's and D's TP differ);
   * absent: every rank that holds the entry holds the same bytes (the MLA latent, a drafter's last feature).
   */
  readonly heads?: EntryHeads;
  /**
   * Set when the entry's bytes in send order are the sequence's token rows from row 0 (`rowBytes` each: pages in
   * block-table order, rows in order inside a page): its first `n · rowBytes` bytes are final once rows [0, n) are
   * computed, so they may be sent while the prompt is still prefilling (pd/overlap.ts). Absent for per-sequence
   * state and for a sliding window's pages (which rows it starts at depends on the final length).
   */
  readonly rowBytes?: number;
}

/** A manifest row as P sends it in the completion notification: the entry, its length and checksum. */
export interface ManifestRow {
  readonly key: PdEntryKey;
  /** Bytes sent for the entry. */
  readonly byteLength: number;
  /** Checksum of the bytes sent, in send order (hex; pd/checksum.ts). */
  readonly checksum: string;
}

/** Thrown for any PD failure a request or a connection reports (named entry, field or peer in the message). */
export class PdError extends Error {
  override readonly name = 'PdError';
  constructor(
    /**
     * `'layout'` (a layout or plan that does not fit), `'digest'` (P and D differ in a setting),
     * `'manifest'` (a missing / extra / mis-sized entry), `'checksum'`, `'timeout'`, `'peer'` (a dead or
     * unreachable peer), `'abort'`, `'unsupported'` (a drafter or model without PD), `'capacity'`, `'conflict'`
     * (a room already in use).
     */
    readonly code:
      | 'layout'
      | 'digest'
      | 'manifest'
      | 'checksum'
      | 'timeout'
      | 'peer'
      | 'abort'
      | 'unsupported'
      | 'capacity'
      | 'conflict',
    message: string,
  ) {
    super(message);
  }
}
