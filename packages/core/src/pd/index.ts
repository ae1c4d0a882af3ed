export * from './types.js';
export {
  allEntries,
  allRegions,
  checkManifest,
  checkPdDrafter,
  coalesceRanges,
  draftKvRegionId,
  drafterEntries,
  drafterRegions,
  entryByteLength,
  f32Region,
  manifestRows,
  pageRanges,
  regionLookup,
  targetEntries,
  targetRegions,
  type ChecksumRanges,
} from './manifest.js';
export { hasDraftContextTransfer, type DraftContextTransfer } from '../plugin/drafter-plugin.js';
export {
  canonicalJson,
  compareDigests,
  DIGEST_IGNORED_SETTINGS,
  PD_DIGEST_FIELDS,
  pdDigest,
  type PdDigest,
  type PdDigestField,
  type PdDigestInputs,
  type PdDrafterIdentity,
  type PdParallelism,
} from './digest.js';
