export * from './types.js';
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
