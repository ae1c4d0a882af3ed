/** @specd/core kv: paged KV pools, linear-attention state slots, per-stage sequence caches, the draft KV cache. */
export {
  CacheError,
  PagedKvPool,
  type PageDescriptor,
  type PagedKvPoolOptions,
  type SequenceId,
  sharedFloat32,
} from './paged-kv-pool.js';
export { StateSlotPool, type StateSlotPoolOptions, type StateSnapshot } from './state-slot-pool.js';
export {
  SequenceCache,
  type CacheGeometry,
  type LinearStateGeometry,
  type PagedKvGeometry,
  type SequenceCacheOptions,
  type SequenceCheckpoint,
} from './sequence-cache.js';
export {
  DRAFT_PAGE_SIZE,
  DraftKvCache,
  type DraftKvCacheOptions,
  type DraftRows,
} from './draft-kv-cache.js';
