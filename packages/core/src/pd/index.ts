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
  DRAFT_FEATURES_REGION,
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
  type DraftContextForm,
} from './manifest.js';
export { DraftFormChooser, type DraftContextMode } from './draft-form.js';
export {
  hasDraftContextFeatures,
  hasDraftContextTransfer,
  type DraftContextFeatures,
  type DraftContextTransfer,
} from '../plugin/drafter-plugin.js';
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
export * from './ranks.js';
export * from './protocol.js';
export * from './control.js';
export * from './prefill-role.js';
export * from './decode-role.js';
export * from './stages.js';
export {
  bufferStart,
  firstHead,
  holdsRegion,
  placeSide,
  tpFitsHeads,
  type PdRegionPlacement,
  type PdRegionSpec,
  type PdSideLayout,
  type PdSidePlacement,
  type PdSplit,
} from './placement.js';
export {
  expectedEntries,
  forEachRange,
  payloadBytes,
  planTransfer,
  unitsForTokens,
  validatePlan,
  type PdCopy,
  type PdExpectedEntry,
  type PdUnitMapping,
  type PdUnitPair,
} from './planner.js';
export {
  loadLayoutFile,
  parseLayout,
  PD_DTYPE_BYTES,
  PD_LAYOUT_SCHEMA,
  type PdDtype,
  type PdLayout,
} from './layout-file.js';
export {
  createPdPolicy,
  PD_POLICIES,
  RandomPolicy,
  RoundRobinPolicy,
  type PdCandidate,
  type PdPolicy,
  type PdRole,
} from './policy.js';
export { PdRouterMetrics } from './router-metrics.js';
export {
  PdRouter,
  randomRoom,
  type PdRouterOptions,
  type PdUpstreamState,
} from './router.js';
export * from './transfer-factory.js';
export { createNixlTransferEngine, type NixlTransferEngineOptions } from './nixl-transfer.js';
export { loadNixl, nixlAvailable, nixlDir } from './nixl-library.js';
export {
  assembleWaterfall,
  DECODE_TIMINGS_HEADER,
  type DecodeTimings,
  PAYLOAD_CLASSES,
  parseDecodeTimings,
  parsePrefillTimings,
  type PrefillTimings,
  WATERFALL_PHASES,
  type Waterfall,
  type WaterfallPhase,
} from './waterfall.js';
