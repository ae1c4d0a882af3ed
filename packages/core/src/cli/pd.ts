/**
 * `specd pd plan LAYOUT.json [--json] [--prompt-tokens N]`: prints the transfer plan of a PD layout file
 * (pd/layout-file.ts; docs/PD-PLANNER.md) — by default a summary per region (each side's heads, row and
 * page sizes; copies and bytes per rank pair) and the payload D receives per request of N prompt tokens
 * by entry kind and payload class; with `--json` one JSON object per copy and line. A layout that does
 * not fit fails with `FILE: $.path: reason` or the planner's message (region, layer, ranks) and exit 1.
 */

import * as path from 'node:path';

import { type Command, InvalidArgumentError } from 'commander';

import { loadLayoutFile, PD_DTYPE_BYTES, type PdLayout } from '../pd/layout-file.js';
import { type PdRegionPlacement, type PdSidePlacement, placeSide } from '../pd/placement.js';
import { expectedEntries, type PdCopy, payloadBytes, planTransfer, unitsForTokens } from '../pd/planner.js';
import { payloadClass } from '../pd/types.js';
import type { CliIo } from './main.js';

const countArg = (v: string): number => {
  const n = Number(v);
  if (!/^\s*\d+\s*$/.test(v) || !Number.isSafeInteger(n)) throw new InvalidArgumentError('expected an integer >= 0');
  return n;
};

/** `786432 B (768 KiB)`. */
export function formatBytes(n: number): string {
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let u = -1;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return u < 0 ? `${n} B` : `${n} B (${Number(v.toFixed(2))} ${units[u]})`;
}

/** `rank 3`, `ranks 0-7`, `ranks 1, 9, 17` (sorted, runs collapsed). */
function rankList(ranks: number[]): string {
  const sorted = ranks.sort((a, b) => a - b);
  const runs: string[] = [];
  for (let i = 0; i < sorted.length; ) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === (sorted[j] ?? 0) + 1) j++;
    runs.push(j > i ? `${sorted[i]}-${sorted[j]}` : `${sorted[i]}`);
    i = j + 1;
  }
  return `${sorted.length === 1 ? 'rank' : 'ranks'} ${runs.join(', ')}`;
}

/** A copy as one JSON line (snake_case, as the other `--json` outputs). */
function copyJson(c: PdCopy): string {
  return JSON.stringify({
    region: c.region,
    kind: c.kind,
    layer: c.layer,
    part: c.part,
    src_stage: c.srcStage,
    src_rank: c.srcRank,
    dst_stage: c.dstStage,
    dst_rank: c.dstRank,
    head: c.head,
    heads: c.heads,
    src_offset: c.srcOffset,
    dst_offset: c.dstOffset,
    src_buffer_offset: c.srcBufferOffset,
    dst_buffer_offset: c.dstBufferOffset,
    bytes: c.bytes,
    count: c.count,
    src_stride: c.srcStride,
    dst_stride: c.dstStride,
  });
}

const sideLine = (s: PdSidePlacement): string =>
  `${s.side}: tp ${s.tp}, pp ${s.pp} (target layers per stage ${s.ranges.map(([a, b]) => b - a).join(', ')}), ` +
  `base address 0x${s.baseAddress.toString(16)}`;

function holdLine(r: PdRegionPlacement, tp: number): string {
  const { spec } = r;
  const who =
    spec.split === 'rank0'
      ? 'rank 0 only'
      : spec.split === 'replicated'
        ? 'whole on every rank'
        : `${r.headsPerRank} head${r.headsPerRank === 1 ? '' : 's'} per rank` +
          (r.replication > 1 ? `, each on ${r.replication} of ${tp} ranks` : '');
  return (
    `${who}; row ${r.rowBytes} B, ${spec.unit} ${formatBytes(r.rowBytes * spec.rowsPerUnit)}, ` +
    `${r.numUnits} ${spec.unit}s`
  );
}

/** The human summary of a plan. */
function summary(file: string, layout: PdLayout, copies: readonly PdCopy[], promptTokens: number): string {
  const P = placeSide(layout.regions, layout.prefill, 'prefill');
  const D = placeSide(layout.regions, layout.decode, 'decode');
  const out: string[] = [];
  const mapped = Object.values(layout.mapping)[0]?.length ?? 0;
  out.push(`${file}: ${layout.dtype}, pages of ${layout.pageSize} tokens, ${mapped} pages mapped`);
  out.push(sideLine(P), sideLine(D));
  let total = 0;
  P.regions.forEach((p, ri) => {
    const d = D.regions[ri];
    if (d === undefined) return;
    const { spec } = p;
    const parts = spec.parts.join(', ');
    const where = spec.drafter === true ? 'last stage (drafter)' : 'stage owning the layer';
    out.push('');
    out.push(
      `region ${spec.name} (${spec.kind}): ${spec.layers.length} layers${parts === '' ? '' : ` × ${parts}`}, ` +
        `${spec.heads} head${spec.heads === 1 ? '' : 's'} × ${spec.headBytes} B, split ${spec.split}, ` +
        `${spec.rowsPerUnit} row${spec.rowsPerUnit === 1 ? '' : 's'} per ${spec.unit}, on the ${where}`,
    );
    if (spec.window !== undefined)
      out.push(
        `  sliding window ${spec.window} tokens: a request sends only the pages of its last ${spec.window} rows`,
      );
    out.push(`  prefill: ${holdLine(p, P.tp)}`);
    out.push(`  decode:  ${holdLine(d, D.tp)}`);
    const mine = copies.filter((c) => c.region === spec.name);
    // one line per P (stage, rank) and D stage: the D ranks it feeds, copies and bytes
    const groups = new Map<string, { ranks: Set<number>; copies: number; bytes: number }>();
    let bytes = 0;
    for (const c of mine) {
      const key = `prefill stage ${c.srcStage} rank ${c.srcRank} → decode stage ${c.dstStage}`;
      const g = groups.get(key) ?? { ranks: new Set<number>(), copies: 0, bytes: 0 };
      g.ranks.add(c.dstRank);
      g.copies++;
      g.bytes += c.bytes * c.count;
      groups.set(key, g);
      bytes += c.bytes * c.count;
    }
    total += bytes;
    const strided = (side: 'src' | 'dst') =>
      mine.filter((c) => c.bytes !== (side === 'src' ? c.srcStride : c.dstStride)).length;
    out.push(
      `  ${mine.length} copies (rows strided on prefill: ${strided('src')}, on decode: ${strided('dst')}), ` +
        `${formatBytes(bytes)}; by rank pair:`,
    );
    for (const [key, g] of groups)
      out.push(`    ${key} ${rankList([...g.ranks])}: ${g.copies} copies, ${formatBytes(g.bytes)}`);
  });
  out.push('', `plan: ${copies.length} copies, ${formatBytes(total)}`);
  const units = unitsForTokens(layout.regions, promptTokens);
  const windowed = layout.regions.some((r) => r.window !== undefined);
  out.push(
    `payload per request of ${promptTokens} prompt tokens (bytes decode receives` +
      `${windowed ? '; sliding regions send their window' : ''}):`,
  );
  const byKind = new Map<string, number>();
  for (const e of expectedEntries(layout.regions, layout.decode, units))
    byKind.set(e.key.kind, (byKind.get(e.key.kind) ?? 0) + e.byteLength);
  for (const [kind, n] of byKind) out.push(`  ${kind} (${payloadClass(kind as PdCopy['kind'])}): ${formatBytes(n)}`);
  const classes = payloadBytes(layout.regions, layout.decode, units);
  out.push(
    `  by class: ${Object.entries(classes)
      .map(([k, n]) => `${k} ${formatBytes(n)}`)
      .join(', ')}`,
  );
  if (classes.draft_context > 0) {
    // the draft context's modes against the payload without a drafter (target KV + linear-attention state)
    const whole = payloadBytes(
      layout.regions,
      layout.decode,
      unitsForTokens(layout.regions, promptTokens, { windows: false }),
    );
    const noSpec = classes.target_kv + classes.linear_state;
    const vs = (draft: number) =>
      noSpec > 0 ? `, ×${((noSpec + draft) / noSpec).toFixed(3)} the payload without a drafter` : '';
    out.push(
      `draft context: kv (every page) ${formatBytes(whole.draft_context)}${vs(whole.draft_context)}; ` +
        `kv + window ${formatBytes(classes.draft_context)}${vs(classes.draft_context)}`,
    );
    const width = layout.featureWidth;
    const drafterRegion = layout.regions.find((r) => r.drafter === true);
    if (width !== undefined && drafterRegion !== undefined) {
      // pd.draft_context "features": the rows' projected features (the window's rows when the layers slide), whole
      // rows on every D rank that rebuilds draft KV (each rebuilds its own heads from the whole feature)
      const ps = layout.pageSize;
      const w = layout.window ?? 0;
      const pages = Math.ceil(promptTokens / ps) - (w > 0 ? Math.floor(Math.max(0, promptTokens - w) / ps) : 0);
      const ranks = layout.decode.tp;
      const features = pages * ps * width * PD_DTYPE_BYTES[layout.dtype] * ranks;
      const best = Math.min(features, classes.draft_context);
      out.push(
        `  features (${width} elements a row, ${w > 0 ? 'the window' : 'every row'}, to each of D's ${ranks} ` +
          `rank${ranks === 1 ? '' : 's'}) ${formatBytes(features)}${vs(features)}; auto by bytes (at run time D ` +
          `also weighs the rebuild it measures): ${best === features ? 'features' : 'kv + window'}, ` +
          `${formatBytes(best)}${vs(best)}`,
      );
    }
  }
  return `${out.join('\n')}\n`;
}

/** Adds `pd plan` to the program. */
export function registerPdCommands(program: Command, io: CliIo): void {
  const pd = program.command('pd').description('prefill/decode disaggregation tools');
  pd.command('plan')
    .description('print the P → D transfer plan of a layout file (docs/PD-PLANNER.md), every copy validated')
    .argument('<layout>', 'layout file (JSON): dtype, page_size, region, prefill, decode, pages')
    .option('--json', 'one JSON object per copy and line')
    .option(
      '--prompt-tokens <n>',
      'prompt length for the payload per request (default: the mapped pages × page_size)',
      countArg,
    )
    .action((file: string, flags: { json?: boolean; promptTokens?: number }) => {
      const layout = loadLayoutFile(path.resolve(io.cwd, file));
      const copies = planTransfer(layout.regions, layout.prefill, layout.decode, layout.mapping);
      if (flags.json === true) {
        io.stdout.write(copies.map((c) => `${copyJson(c)}\n`).join(''));
        return;
      }
      const mapped = Object.values(layout.mapping)[0]?.length ?? 0;
      io.stdout.write(summary(file, layout, copies, flags.promptTokens ?? mapped * layout.pageSize));
    });
}
