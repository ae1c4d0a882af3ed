/**
 * The PD transfer planner: a pure function from the prefill (P) and decode (D) layouts and the unit
 * mapping to the list of copies that moves a request's state from P to D, every copy checked against
 * both layouts before it is returned (docs/PD-PLANNER.md; REFERENCE.md §8 "Heterogeneous TP").
 *
 * Model. A *region* is one kind of state (the target's KV pages, a KDA layer's recurrent state, the
 * draft KV, …). On every rank that holds it, a region has one buffer per (layer, part), laid out
 * `[numUnits, rowsPerUnit, headsPerRank, headBytes]`: a unit is a page (`rowsPerUnit` = page size,
 * tokens) or a state slot (`rowsPerUnit` = e.g. 1 for a recurrent state, the number of conv states for
 * conv states); a row holds the rank's heads side by side. How heads spread over a side's TP ranks
 * (`split`):
 * - `'heads'`: `headsPerRank = max(1, H / tp)`; tp ≤ H must divide H (rank r holds heads
 *   `[r·H/tp, (r+1)·H/tp)`); tp > H must be a multiple of H (each head replicated on `tp / H` ranks,
 *   rank r holds head `⌊r·H / tp⌋`). GQA / draft KV by KV head, KDA state by head.
 * - `'replicated'`: every rank holds all heads (the MLA latent + rope slice: one "head").
 * - `'rank0'`: rank 0 alone holds it (a per-sequence blob such as a drafter's last hidden state).
 *
 * Placement. Each side runs `pp` pipeline stages of `tp` ranks; every (stage, rank) is its own address
 * space starting at `baseAddress`. A stage holds the target layers of its partition range (the engine's
 * split, pipeline/partition.ts) and, when it is the last stage, the drafter's regions. Its buffers sit
 * back to back from `baseAddress` in (region order, layer order, part order), skipping what it does not
 * hold; a buffer's length is `numUnits · rowsPerUnit · headsPerRank · headBytes` of *that* side.
 *
 * Plan. For every (region, layer, part) and every D rank that holds it, the D rank's head block is cut
 * into pieces, each held by one P rank; a piece becomes one copy per run of consecutive units (units
 * `s, s+1, …` → `d, d+1, …` adjacent in the mapping). A copy moves `count` rows of `bytes` each,
 * reading every `srcStride` bytes and writing every `dstStride` bytes: the strides are each side's
 * own row length, so when the piece is a whole row on both sides (same head block) the copy is one
 * contiguous range of `bytes · count` ({@link forEachRange}). Source and destination offsets each use
 * their own side's row length — a planner that used P's item size for D's offsets or lengths (the
 * incident of REFERENCE.md §1: 32 KiB written at twice the offset) fails {@link validatePlan}.
 *
 * Replicas. When P holds a head on several ranks (P's tp > H, or a replicated region), the copy for D
 * rank d reads replica `d mod replication` of that head (for `'replicated'`: P rank `d mod P.tp`), so
 * D's ranks spread their reads over P's replicas deterministically.
 */

import {
  bufferStart,
  firstHead,
  holdsRegion,
  isCount,
  layoutError,
  type PdRegionPlacement,
  type PdRegionSpec,
  type PdSideLayout,
  type PdSidePlacement,
  placeSide,
} from './placement.js';
import { type PdEntryKey, type PdEntryKind, type PdError, type PdPayloadClass, payloadClass } from './types.js';

/** `[sourceUnit, destinationUnit]`: P's unit (page / slot) id and the D unit it lands in. */
export type PdUnitPair = readonly [number, number];

/** The unit mapping of one request, per region name (regions that share a pool may share a list). */
export type PdUnitMapping = Readonly<Record<string, readonly PdUnitPair[]>>;

/** One copy: `count` rows of `bytes`, read every `srcStride` bytes on P and written every `dstStride` on D. */
export interface PdCopy {
  readonly region: string;
  readonly kind: PdEntryKind;
  readonly layer: number;
  readonly part: string;
  readonly srcStage: number;
  readonly srcRank: number;
  readonly dstStage: number;
  readonly dstRank: number;
  /** First head moved (a global head id: in `[0, heads)` of the region). */
  readonly head: number;
  /** Heads moved (consecutive from `head`). */
  readonly heads: number;
  /** Absolute source address of the first row, bytes (P's base + buffer start + `srcBufferOffset`). */
  readonly srcOffset: number;
  /** Absolute destination address of the first row, bytes (D's base + buffer start + `dstBufferOffset`). */
  readonly dstOffset: number;
  /** Offset of the first row within the P (layer, part) buffer, bytes. */
  readonly srcBufferOffset: number;
  /** Offset of the first row within the D (layer, part) buffer, bytes. */
  readonly dstBufferOffset: number;
  /** Bytes per row (`heads · headBytes`). */
  readonly bytes: number;
  /** Rows. */
  readonly count: number;
  /** Bytes from one source row to the next (P's row length; `=== bytes` when contiguous). */
  readonly srcStride: number;
  /** Bytes from one destination row to the next (D's row length; `=== bytes` when contiguous). */
  readonly dstStride: number;
}

// ---------------------------------------------------------------------------------------------
// Planning
// ---------------------------------------------------------------------------------------------

/** Checks a region's mapping (integer units in range on both sides, no destination unit twice); returns it. */
function checkMapping(
  p: PdRegionPlacement,
  d: PdRegionPlacement,
  pairs: readonly PdUnitPair[] | undefined,
): readonly PdUnitPair[] {
  const name = p.spec.name;
  if (pairs === undefined) throw layoutError(`mapping: region ${name}: no unit mapping given`);
  const seen = new Map<number, number>();
  pairs.forEach(([src, dst], i) => {
    if (!isCount(src, 0) || src >= p.numUnits)
      throw layoutError(`mapping: region ${name}: [${i}] source unit ${src}: out of range (prefill has ${p.numUnits})`);
    if (!isCount(dst, 0) || dst >= d.numUnits)
      throw layoutError(
        `mapping: region ${name}: [${i}] destination unit ${dst}: out of range (decode has ${d.numUnits})`,
      );
    const before = seen.get(dst);
    if (before !== undefined)
      throw layoutError(`mapping: region ${name}: [${i}] destination unit ${dst}: also the destination of [${before}]`);
    seen.set(dst, i);
  });
  return pairs;
}

/** Runs of a mapping: adjacent pairs `(s, d), (s+1, d+1), …` merged, in mapping order: `[src, dst, units]`. */
function unitRuns(pairs: readonly PdUnitPair[]): [number, number, number][] {
  const runs: [number, number, number][] = [];
  for (const [src, dst] of pairs) {
    const last = runs[runs.length - 1];
    if (last !== undefined && src === last[0] + last[2] && dst === last[1] + last[2]) last[2]++;
    else runs.push([src, dst, 1]);
  }
  return runs;
}

/** P rank that serves `head` to D rank `dstRank` (replica `dstRank mod replication`; module comment). */
function sourceRank(p: PdRegionPlacement, prefillTp: number, head: number, dstRank: number): number {
  switch (p.spec.split) {
    case 'rank0':
      return 0;
    case 'replicated':
      return dstRank % prefillTp;
    case 'heads':
      return prefillTp <= p.spec.heads
        ? Math.floor(head / p.headsPerRank)
        : head * p.replication + (dstRank % p.replication);
  }
}

/**
 * The copy list that moves the mapped units of every region from P to D (module comment), validated
 * with {@link validatePlan} before it is returned.
 * Order: region, layer, part, D rank, head piece, run of units (in mapping order).
 * @param regions the state that crosses, in buffer order (the same on both sides).
 * @param mapping per region name, `[P unit, D unit]` pairs (e.g. a request's pages in token order).
 * @throws {PdError} `'layout'` naming region, layer, part, ranks and numbers: from {@link placeSide}, a
 *   region without a mapping, a unit out of range, a destination unit mapped twice, or a copy that fails
 *   validation.
 */
export function planTransfer(
  regions: readonly PdRegionSpec[],
  prefill: PdSideLayout,
  decode: PdSideLayout,
  mapping: PdUnitMapping,
): PdCopy[] {
  const P = placeSide(regions, prefill, 'prefill');
  const D = placeSide(regions, decode, 'decode');
  const copies: PdCopy[] = [];
  P.regions.forEach((p, ri) => {
    const d = D.regions[ri]!;
    const spec = p.spec;
    const runs = unitRuns(checkMapping(p, d, mapping[spec.name]));
    const srcRow = p.rowBytes;
    const dstRow = d.rowBytes;
    const rows = spec.rowsPerUnit;
    spec.layers.forEach((layer, li) => {
      const srcStage = p.stageOf[li]!;
      const dstStage = d.stageOf[li]!;
      spec.parts.forEach((part, pi) => {
        for (let dstRank = 0; dstRank < D.tp; dstRank++) {
          if (!holdsRegion(d, dstRank)) continue;
          const dstFirst = firstHead(d, dstRank, D.tp);
          const dstStart = D.baseAddress + bufferStart(d, dstRank, li, pi);
          for (let head = dstFirst; head < dstFirst + d.headsPerRank; ) {
            const srcRank = sourceRank(p, P.tp, head, dstRank);
            const srcFirst = firstHead(p, srcRank, P.tp);
            const heads = Math.min(dstFirst + d.headsPerRank, srcFirst + p.headsPerRank) - head;
            const srcStart = P.baseAddress + bufferStart(p, srcRank, li, pi);
            for (const [srcUnit, dstUnit, units] of runs) {
              const srcBufferOffset = srcUnit * rows * srcRow + (head - srcFirst) * spec.headBytes;
              const dstBufferOffset = dstUnit * rows * dstRow + (head - dstFirst) * spec.headBytes;
              copies.push({
                region: spec.name,
                kind: spec.kind,
                layer,
                part,
                srcStage,
                srcRank,
                dstStage,
                dstRank,
                head,
                heads,
                srcOffset: srcStart + srcBufferOffset,
                dstOffset: dstStart + dstBufferOffset,
                srcBufferOffset,
                dstBufferOffset,
                bytes: heads * spec.headBytes,
                count: units * rows,
                srcStride: srcRow,
                dstStride: dstRow,
              });
            }
            head += heads;
          }
        }
      });
    });
  });
  validatePlan(regions, prefill, decode, mapping, copies);
  return copies;
}

/**
 * Visits the contiguous byte ranges of a copy, as offsets within its two (layer, part) buffers: one range
 * of `bytes · count` when the rows are contiguous on both sides (`srcStride === bytes === dstStride`),
 * else one range of `bytes` per row. Allocates nothing (a transfer engine turns each into a descriptor).
 */
export function forEachRange(
  c: PdCopy,
  visit: (srcBufferOffset: number, dstBufferOffset: number, bytes: number) => void,
): void {
  if (c.srcStride === c.bytes && c.dstStride === c.bytes) {
    visit(c.srcBufferOffset, c.dstBufferOffset, c.bytes * c.count);
    return;
  }
  for (let row = 0; row < c.count; row++)
    visit(c.srcBufferOffset + row * c.srcStride, c.dstBufferOffset + row * c.dstStride, c.bytes);
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

interface RowSpan {
  /** First destination row (unit · rowsPerUnit + row) written, inclusive. */
  readonly start: number;
  /** Last row written + 1 (exclusive). */
  readonly end: number;
  /** Index of the copy in the plan. */
  readonly copy: number;
}

/**
 * Checks a copy list against both layouts and the mapping (planTransfer calls it on its own result; it
 * is exported for plans built elsewhere). Every copy: a known region / layer / part of the right kind;
 * stages that hold the layer on each side; ranks that hold the region; heads `[head, head + heads)` held
 * by both ranks; `bytes` = heads × the per-head item size; strides = each side's own row length;
 * absolute offsets = base + buffer start + in-buffer offset; in-buffer offsets at the copy's head in a
 * row, every row inside both buffers; each row read from the source unit the mapping pairs with the
 * destination unit it lands in, at the same row. Then on every D rank: no two copies write the same
 * bytes, and every byte of every mapped destination unit is written exactly once.
 * @throws {PdError} `'layout'` naming the copy (index, region, layer, part, stages and ranks) and the
 *   offending numbers, or the unwritten / doubly written destination rows.
 */
export function validatePlan(
  regions: readonly PdRegionSpec[],
  prefill: PdSideLayout,
  decode: PdSideLayout,
  mapping: PdUnitMapping,
  copies: readonly PdCopy[],
): void {
  const P = placeSide(regions, prefill, 'prefill');
  const D = placeSide(regions, decode, 'decode');
  const index = new Map(regions.map((r, i) => [r.name, i]));
  /** Per region index: destination unit → source unit. */
  const sourceOf = P.regions.map((p, ri) => {
    const pairs = checkMapping(p, D.regions[ri]!, mapping[p.spec.name]);
    return new Map(pairs.map(([src, dst]) => [dst, src]));
  });
  const writes = new Map<string, RowSpan[]>();
  copies.forEach((c, ci) => {
    // the message is built only on failure (a plan has up to ~10^5 copies)
    const fail = (what: string): PdError =>
      layoutError(
        `plan: copy ${ci}: region ${c.region} layer ${c.layer}${c.part === '' ? '' : ` (${c.part})`}: ` +
          `prefill stage ${c.srcStage} rank ${c.srcRank} → decode stage ${c.dstStage} rank ${c.dstRank}: ${what}`,
      );
    const ri = index.get(c.region);
    if (ri === undefined) throw fail('no such region');
    const p = P.regions[ri]!;
    const d = D.regions[ri]!;
    const spec = p.spec;
    const li = spec.layers.indexOf(c.layer);
    const pi = spec.parts.indexOf(c.part);
    if (c.kind !== spec.kind) throw fail(`kind ${c.kind}: the region's is ${spec.kind}`);
    if (li < 0) throw fail(`the region has no layer ${c.layer}`);
    if (pi < 0) throw fail(`the region has no part ${JSON.stringify(c.part)}`);
    if (!isCount(c.count, 1)) throw fail(`count ${c.count}: expected an integer >= 1`);
    if (!isCount(c.heads, 1)) throw fail(`heads ${c.heads}: expected an integer >= 1`);
    if (c.bytes !== c.heads * spec.headBytes)
      throw fail(
        `bytes ${c.bytes}: expected ${c.heads} heads × ${spec.headBytes} bytes = ${c.heads * spec.headBytes} ` +
          `(the destination's per-head item size × heads)`,
      );
    const rowSpan = (
      s: PdSidePlacement,
      r: PdRegionPlacement,
      stage: number,
      rank: number,
      offset: number,
      bufferOffset: number,
      stride: number,
    ): number => {
      const label = s.side;
      if (stage !== r.stageOf[li])
        throw fail(`${label} stage ${stage} does not hold layer ${c.layer} (stage ${r.stageOf[li]} does)`);
      if (!isCount(rank, 0) || rank >= s.tp || !holdsRegion(r, rank))
        throw fail(`${label} rank ${rank} does not hold the region (tp ${s.tp}, split ${spec.split})`);
      const first = firstHead(r, rank, s.tp);
      if (c.head < first || c.head + c.heads > first + r.headsPerRank)
        throw fail(
          `heads [${c.head}, ${c.head + c.heads}) are not all on ${label} rank ${rank} ` +
            `(it holds [${first}, ${first + r.headsPerRank}))`,
        );
      if (stride !== r.rowBytes)
        throw fail(`${label} stride ${stride}: expected the ${label} row length ${r.rowBytes} bytes`);
      const start = s.baseAddress + bufferStart(r, rank, li, pi);
      if (offset !== start + bufferOffset)
        throw fail(`${label} offset ${offset}: expected base + buffer start ${start} + ${bufferOffset}`);
      const headAt = (c.head - first) * spec.headBytes;
      const rowStart = bufferOffset - headAt;
      if (!isCount(rowStart, 0) || rowStart % r.rowBytes !== 0)
        throw fail(
          `${label} buffer offset ${bufferOffset}: not head ${c.head} of a row ` +
            `(rows of ${r.rowBytes} bytes, the head at +${headAt})`,
        );
      const end = bufferOffset + (c.count - 1) * stride + c.bytes;
      if (end > r.bufferBytes)
        throw fail(`${label} rows end at byte ${end} of a ${r.bufferBytes}-byte buffer (${r.numUnits} units)`);
      return rowStart / r.rowBytes;
    };
    const srcRow = rowSpan(P, p, c.srcStage, c.srcRank, c.srcOffset, c.srcBufferOffset, c.srcStride);
    const dstRow = rowSpan(D, d, c.dstStage, c.dstRank, c.dstOffset, c.dstBufferOffset, c.dstStride);
    const rows = spec.rowsPerUnit;
    for (let t = 0; t < c.count; ) {
      const srcUnit = Math.floor((srcRow + t) / rows);
      const dstUnit = Math.floor((dstRow + t) / rows);
      const at = (srcRow + t) % rows;
      if ((dstRow + t) % rows !== at)
        throw fail(
          `row ${t}: source row ${at} of unit ${srcUnit} lands in row ${(dstRow + t) % rows} of unit ${dstUnit}`,
        );
      const mapped = sourceOf[ri]!.get(dstUnit);
      if (mapped !== srcUnit)
        throw fail(
          `destination unit ${dstUnit} is written from source unit ${srcUnit}; ` +
            `the mapping says ${mapped === undefined ? 'it is not a destination' : `source unit ${mapped}`}`,
        );
      t += rows - at;
    }
    for (let h = c.head; h < c.head + c.heads; h++) {
      const key = `${ri}/${li}/${pi}/${c.dstRank}/${h}`;
      const span = { start: dstRow, end: dstRow + c.count, copy: ci };
      const spans = writes.get(key);
      if (spans === undefined) writes.set(key, [span]);
      else spans.push(span);
    }
  });
  D.regions.forEach((d, ri) => {
    const spec = d.spec;
    const units = [...sourceOf[ri]!.keys()].sort((a, b) => a - b);
    const rows = spec.rowsPerUnit;
    spec.layers.forEach((layer, li) => {
      spec.parts.forEach((part, pi) => {
        for (let rank = 0; rank < D.tp; rank++) {
          if (!holdsRegion(d, rank)) continue;
          const first = firstHead(d, rank, D.tp);
          for (let h = first; h < first + d.headsPerRank; h++) {
            const where = (): string =>
              `plan: region ${spec.name} layer ${layer}${part === '' ? '' : ` (${part})`}: decode stage ` +
              `${d.stageOf[li]} rank ${rank} head ${h}`;
            const spans = (writes.get(`${ri}/${li}/${pi}/${rank}/${h}`) ?? []).sort((a, b) => a.start - b.start);
            for (let k = 1; k < spans.length; k++) {
              const a = spans[k - 1]!;
              const b = spans[k]!;
              if (b.start < a.end)
                throw layoutError(
                  `${where()}: copies ${a.copy} and ${b.copy} both write rows [${b.start}, ${Math.min(a.end, b.end)})`,
                );
            }
            // the spans are disjoint and sorted: merge adjacent ones, then walk the sorted units beside them
            const merged: [number, number][] = [];
            for (const s of spans) {
              const last = merged[merged.length - 1];
              if (last !== undefined && last[1] === s.start) last[1] = s.end;
              else merged.push([s.start, s.end]);
            }
            let k = 0;
            for (const u of units) {
              while (k < merged.length && merged[k]![1] <= u * rows) k++;
              const m = merged[k];
              if (m === undefined || m[0] > u * rows || m[1] < (u + 1) * rows)
                throw layoutError(
                  `${where()}: destination unit ${u} (rows [${u * rows}, ${(u + 1) * rows})) is not written in full`,
                );
            }
          }
        }
      });
    });
  });
}

// ---------------------------------------------------------------------------------------------
// What D expects, and the payload per request
// ---------------------------------------------------------------------------------------------

/** An entry D expects: its key (D's rank), the D stage that receives it, and its length. */
export interface PdExpectedEntry {
  readonly key: PdEntryKey;
  /** D's pipeline stage holding the entry's layer. */
  readonly stage: number;
  /** Bytes (`units · rowsPerUnit · headsPerRank · headBytes` of D's rank). */
  readonly byteLength: number;
}

/**
 * Units a request of `numTokens` tokens sends per region: a page region `⌈numTokens / rowsPerUnit⌉` pages, a slot
 * region 1 slot. A page region with a sliding `window` W sends only the pages of its last W rows,
 * `⌈numTokens / rowsPerUnit⌉ − ⌊max(0, numTokens − W) / rowsPerUnit⌋` (the drafter's window-aware draft context;
 * core `DrafterBase.draftKvEntries`), unless `windows` is false (every page: what a window-blind sender sends).
 * @throws {PdError} `'layout'` for a negative or fractional token count.
 */
export function unitsForTokens(
  regions: readonly PdRegionSpec[],
  numTokens: number,
  options: { readonly windows?: boolean } = {},
): Record<string, number> {
  if (!isCount(numTokens, 0)) throw layoutError(`numTokens: expected an integer >= 0, got ${numTokens}`);
  const windows = options.windows ?? true;
  return Object.fromEntries(
    regions.map((r) => {
      if (r.unit === 'slot') return [r.name, 1] as const;
      const all = Math.ceil(numTokens / r.rowsPerUnit);
      const w = windows ? (r.window ?? 0) : 0;
      return [r.name, w > 0 ? all - Math.floor(Math.max(0, numTokens - w) / r.rowsPerUnit) : all] as const;
    }),
  );
}

/**
 * The entries D expects for one request, from D's own layout only (never from P's message): one per
 * (region, layer, part, D rank holding the region), in plan order.
 * @param unitsUsed units per region name the request occupies on D (e.g. {@link unitsForTokens}).
 * @throws {PdError} `'layout'` from {@link placeSide}, or for a region whose units are missing, negative or
 *   more than D has.
 */
export function expectedEntries(
  regions: readonly PdRegionSpec[],
  decode: PdSideLayout,
  unitsUsed: Readonly<Record<string, number>>,
): PdExpectedEntry[] {
  const D = placeSide(regions, decode, 'decode');
  const out: PdExpectedEntry[] = [];
  for (const d of D.regions) {
    const { spec } = d;
    const used = unitsUsed[spec.name];
    if (used === undefined || !isCount(used, 0) || used > d.numUnits)
      throw layoutError(`region ${spec.name}: units used ${used}: expected an integer in [0, ${d.numUnits}]`);
    const byteLength = used * spec.rowsPerUnit * d.rowBytes;
    spec.layers.forEach((layer, li) => {
      for (const part of spec.parts) {
        for (let rank = 0; rank < D.tp; rank++) {
          if (holdsRegion(d, rank))
            out.push({ key: { kind: spec.kind, layer, part, rank }, stage: d.stageOf[li]!, byteLength });
        }
      }
    });
  }
  return out;
}

/** Bytes D receives for one request per payload class (`/metrics`; types.ts payloadClass). */
export function payloadBytes(
  regions: readonly PdRegionSpec[],
  decode: PdSideLayout,
  unitsUsed: Readonly<Record<string, number>>,
): Record<PdPayloadClass, number> {
  const out: Record<PdPayloadClass, number> = { target_kv: 0, linear_state: 0, draft_context: 0 };
  for (const e of expectedEntries(regions, decode, unitsUsed)) out[payloadClass(e.key.kind)] += e.byteLength;
  return out;
}
