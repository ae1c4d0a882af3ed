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
  payloadBytes,
  planTransfer,
  unitsForTokens,
  validatePlan,
  type PdCopy,
  type PdExpectedEntry,
  type PdUnitMapping,
  type PdUnitPair,
} from './planner.js';
