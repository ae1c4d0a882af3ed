export * from './types.js';
export * from './checksum.js';
export * from './transfer-engine.js';
export * from './zmq-transfer.js';
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
export * from './pairing.js';
export * from './local-state.js';
export * from './protocol.js';
export * from './control.js';
export * from './prefill-role.js';
export * from './decode-role.js';
