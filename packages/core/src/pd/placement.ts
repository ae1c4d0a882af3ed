/**
 * Placement for the PD transfer planner (planner.ts): the regions that cross from P to D, one side's
 * layout, and where each side keeps every (layer, part) buffer of every region (the model is described
 * in planner.ts and docs/PD-PLANNER.md; REFERENCE.md §8).
 */

import { defaultPartition, PartitionError, partitionRanges } from '../pipeline/partition.js';
import { PdError, type PdEntryKind } from './types.js';

// ---------------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------------

/** How a region's heads are spread over a side's TP ranks (module comment). */
export type PdSplit = 'heads' | 'replicated' | 'rank0';

/** One region: a kind of state, its layers and parts, and the shape of one (layer, part) buffer. */
export interface PdRegionSpec {
  /** Unique name (keys of {@link PdSideLayout.numUnits} and of the mapping), e.g. `'draft-kv'`. */
  readonly name: string;
  readonly kind: PdEntryKind;
  /** Target regions: absolute target layer ids; drafter regions: draft layer indices. Distinct, ascending. */
  readonly layers: readonly number[];
  /** Parts per layer, in buffer order: `['k', 'v']`, or `['']` for one buffer per layer. */
  readonly parts: readonly string[];
  /** `'page'` (rows are tokens) or `'slot'` (a per-sequence state slot). */
  readonly unit: 'page' | 'slot';
  /** Rows per unit: the page size in tokens, or rows per slot (1; conv states: their count). */
  readonly rowsPerUnit: number;
  /** Heads in all (over all ranks); `'replicated'` / `'rank0'`: the heads every holder keeps (often 1). */
  readonly heads: number;
  /** Bytes of one head in one row (e.g. `headDim · 2` for bf16 KV). */
  readonly headBytes: number;
  readonly split: PdSplit;
  /** Sliding-window length, tokens: a request sends only the pages of its last `window` rows (planner.ts). */
  readonly window?: number;
  /** A drafter region: it lives on the last pipeline stage (and `layers` are draft layer indices). */
  readonly drafter?: boolean;
}

/** One side's layout (P or D). */
export interface PdSideLayout {
  /** TP ranks per stage (≥ 1). */
  readonly tp: number;
  /** Pipeline stages (≥ 1; default 1). */
  readonly pp?: number;
  /** Target layers per stage (length pp, sum numLayers); default the engine's split (defaultPartition). */
  readonly partition?: readonly number[];
  /** Target layers in all (for the PP split). */
  readonly numLayers: number;
  /** Where every (stage, rank)'s first buffer starts, bytes (each its own address space). */
  readonly baseAddress: number;
  /** Units (pages or slots) per region name, on every rank of this side. */
  readonly numUnits: Readonly<Record<string, number>>;
}

// ---------------------------------------------------------------------------------------------
// Placement of one side
// ---------------------------------------------------------------------------------------------

/** A region as one side holds it. */
export interface PdRegionPlacement {
  readonly spec: PdRegionSpec;
  readonly numUnits: number;
  /** Heads each holding rank keeps. */
  readonly headsPerRank: number;
  /** Ranks holding each head (`'heads'` with tp > H: tp / H; `'replicated'`: tp; else 1). */
  readonly replication: number;
  /** Bytes per row on a holding rank (`headsPerRank · headBytes`). */
  readonly rowBytes: number;
  /** Bytes per (layer, part) buffer on a holding rank. */
  readonly bufferBytes: number;
  /** Stage holding each layer (by index in `spec.layers`). */
  readonly stageOf: readonly number[];
  /** Buffer start relative to the base per [layer index][part index], on rank 0 and on ranks ≥ 1 (NaN: not held). */
  readonly startRank0: readonly (readonly number[])[];
  readonly startOther: readonly (readonly number[])[];
}

/** One side resolved: stages, layer ranges and where every buffer sits. */
export interface PdSidePlacement {
  readonly side: 'prefill' | 'decode';
  readonly tp: number;
  readonly pp: number;
  /** Target layer range `[start, end)` per stage. */
  readonly ranges: readonly (readonly [number, number])[];
  readonly baseAddress: number;
  /** Per region, in spec order. */
  readonly regions: readonly PdRegionPlacement[];
  /** Bytes used from the base per stage on rank 0 and on ranks ≥ 1. */
  readonly stageBytesRank0: readonly number[];
  readonly stageBytesOther: readonly number[];
}

/** A `PdError('layout', msg)`. */
export const layoutError = (msg: string): PdError => new PdError('layout', msg);
/** Is `n` a safe integer >= `min`? */
export const isCount = (n: number, min: number): boolean => Number.isSafeInteger(n) && n >= min;

/**
 * Why `tp` ranks cannot split `heads` heads (REFERENCE.md §8), or undefined when they can: tp ≤ H must
 * divide H, tp > H must be a multiple of H.
 */
export function tpFitsHeads(heads: number, tp: number): string | undefined {
  if (tp <= heads) {
    return heads % tp === 0 ? undefined : `tp ${tp} does not divide ${heads} heads`;
  }
  return tp % heads === 0 ? undefined : `tp ${tp} is above ${heads} heads but not a multiple of it (replication)`;
}

/** Does `rank` hold region `r`? */
export function holdsRegion(r: PdRegionPlacement, rank: number): boolean {
  return r.spec.split !== 'rank0' || rank === 0;
}

/** First (global) head held by `rank` of a side holding `r`. */
export function firstHead(r: PdRegionPlacement, rank: number, tp: number): number {
  if (r.spec.split !== 'heads') return 0;
  return tp <= r.spec.heads ? rank * r.headsPerRank : Math.floor((rank * r.spec.heads) / tp);
}

/** Buffer start of (layer index, part index) of `r` on `rank`, relative to the base (NaN: not held). */
export function bufferStart(r: PdRegionPlacement, rank: number, layerIndex: number, partIndex: number): number {
  return (rank === 0 ? r.startRank0 : r.startOther)[layerIndex]?.[partIndex] ?? NaN;
}

function checkRegions(regions: readonly PdRegionSpec[]): void {
  const names = new Set<string>();
  const keys = new Map<string, string>();
  for (const r of regions) {
    const where = `region ${JSON.stringify(r.name)}`;
    if (r.name === '' || names.has(r.name)) throw layoutError(`${where}: the name is empty or used twice`);
    names.add(r.name);
    for (const [field, v] of [
      ['rowsPerUnit', r.rowsPerUnit],
      ['heads', r.heads],
      ['headBytes', r.headBytes],
    ] as const) {
      if (!isCount(v, 1)) throw layoutError(`${where}: ${field}: expected an integer >= 1, got ${v}`);
    }
    if (r.window !== undefined && !isCount(r.window, 1))
      throw layoutError(`${where}: window: expected an integer >= 1 (tokens), got ${r.window}`);
    if (r.parts.length === 0 || new Set(r.parts).size !== r.parts.length)
      throw layoutError(`${where}: parts [${r.parts.join(', ')}]: expected at least one, each distinct`);
    r.layers.forEach((l, i) => {
      if (!isCount(l, 0) || l <= (r.layers[i - 1] ?? -1))
        throw layoutError(`${where}: layers[${i}] ${l}: expected distinct ascending integers >= 0`);
      for (const part of r.parts) {
        const k = `${r.kind}/${l}/${part}`;
        const other = keys.get(k);
        if (other !== undefined)
          throw layoutError(`${where}: ${r.kind} layer ${l} (${part}) is also an entry of region ${other}`);
        keys.set(k, r.name);
      }
    });
  }
}

/**
 * Resolves one side: its stages' layer ranges, each region's heads per rank and buffers.
 * @throws {PdError} `'layout'` naming the side and field: tp / pp / numLayers / baseAddress not integers
 *   in range, a partition that does not fit (pipeline/partition.ts), a tp that does not fit a region's
 *   heads, a missing or negative unit count, a target layer outside the model, addresses beyond 2^53.
 */
export function placeSide(
  regions: readonly PdRegionSpec[],
  layout: PdSideLayout,
  side: 'prefill' | 'decode',
): PdSidePlacement {
  checkRegions(regions);
  const { tp, numLayers, baseAddress } = layout;
  const pp = layout.pp ?? 1;
  if (!isCount(tp, 1)) throw layoutError(`${side}: tp: expected an integer >= 1, got ${tp}`);
  if (!isCount(numLayers, 1)) throw layoutError(`${side}: numLayers: expected an integer >= 1, got ${numLayers}`);
  if (!isCount(baseAddress, 0))
    throw layoutError(`${side}: baseAddress: expected a safe integer >= 0, got ${baseAddress}`);
  let ranges: [number, number][];
  try {
    ranges = partitionRanges(layout.partition ?? defaultPartition(numLayers, pp), numLayers, pp);
  } catch (e) {
    if (e instanceof PartitionError) throw layoutError(`${side}: ${e.message}`);
    throw e;
  }
  const stageBytesRank0 = new Array<number>(pp).fill(0);
  const stageBytesOther = new Array<number>(pp).fill(0);
  const placed: PdRegionPlacement[] = [];
  for (const spec of regions) {
    const where = `${side}: region ${spec.name}`;
    const numUnits = layout.numUnits[spec.name];
    if (numUnits === undefined || !isCount(numUnits, 0))
      throw layoutError(`${where}: numUnits: expected an integer >= 0, got ${numUnits}`);
    let headsPerRank = spec.heads;
    let replication = spec.split === 'replicated' ? tp : 1;
    if (spec.split === 'heads') {
      const why = tpFitsHeads(spec.heads, tp);
      if (why !== undefined) throw layoutError(`${where}: ${why}`);
      headsPerRank = Math.max(1, spec.heads / tp);
      replication = tp > spec.heads ? tp / spec.heads : 1;
    }
    const rowBytes = headsPerRank * spec.headBytes;
    const bufferBytes = numUnits * spec.rowsPerUnit * rowBytes;
    const stageOf = spec.layers.map((l) => {
      if (spec.drafter === true) return pp - 1;
      const s = ranges.findIndex(([a, b]) => l >= a && l < b);
      if (s < 0) throw layoutError(`${where}: layer ${l} is outside the target's ${numLayers} layers`);
      return s;
    });
    const startRank0: number[][] = [];
    const startOther: number[][] = [];
    /** Takes the next buffer of stage `stage` from `used` (bytes per stage): its start. */
    const take = (used: number[], stage: number): number => {
      const start = used[stage] ?? 0;
      used[stage] = start + bufferBytes;
      return start;
    };
    stageOf.forEach((stage) => {
      startRank0.push(spec.parts.map(() => take(stageBytesRank0, stage)));
      startOther.push(spec.parts.map(() => (spec.split === 'rank0' ? NaN : take(stageBytesOther, stage))));
    });
    placed.push({ spec, numUnits, headsPerRank, replication, rowBytes, bufferBytes, stageOf, startRank0, startOther });
  }
  const top = Math.max(...stageBytesRank0, ...stageBytesOther);
  if (!Number.isSafeInteger(baseAddress + top))
    throw layoutError(`${side}: baseAddress ${baseAddress} + ${top} bytes of buffers passes 2^53`);
  return { side, tp, pp, ranges, baseAddress, regions: placed, stageBytesRank0, stageBytesOther };
}
