// bench/pd-report.mjs, the production report's tables and waterfall chart of `npm run bench:pd` (section 4), on
// hand-made rows: the statistics (means, nearest-rank P95, TPOT, throughput, τ), the mean waterfall and payload
// ratios, and the SVG (one stacked bar per PD configuration whose segments are the phases in ms, a legend).
import { WATERFALL_PHASES } from '@specd/core';
import { describe, expect, it } from 'vitest';

// a plain ES module of the benches (no declarations; vitest transpiles without type-checking)
import * as report from '../bench/pd-report.mjs';

const PHASES = WATERFALL_PHASES;
/** A waterfall whose phases are 1, 2, …, 7 ms × `k`, TTFT = 30 k ms, payload (1024, 0, `draft`) bytes. */
const waterfall = (k: number, draft: number, early = 0) => ({
  ttft_ms: 30 * k,
  phases_ms: Object.fromEntries(PHASES.map((p, i) => [p, (i + 1) * k])),
  payload_bytes: { target_kv: 1024, linear_state: 0, draft_context: draft },
  descriptors: 4,
  overlapped_bytes: early,
  decode_reserve_ms: 0.5,
});
const request = (ttft: number, e2e: number, w?: ReturnType<typeof waterfall>) => ({
  ok: true,
  ttft,
  e2e,
  inputTokens: 100,
  outputTokens: 11,
  waterfall: w,
});
const rows = [
  {
    path: 'agg',
    drafter: 'none',
    concurrency: 1,
    durationMs: 2000,
    requests: [request(10, 110), request(30, 230)],
    sameAsAggregated: 2,
  },
  {
    path: 'pd',
    drafter: 'none',
    engine: 'zmq',
    concurrency: 1,
    durationMs: 1000,
    requests: [request(20, 120, waterfall(1, 0, 512)), request(40, 240, waterfall(3, 0))],
    sameAsAggregated: 2,
  },
  {
    path: 'pd',
    drafter: 'dflash',
    engine: 'zmq',
    concurrency: 1,
    durationMs: 1000,
    tau: 2.5,
    requests: [request(20, 120, waterfall(2, 1024)), { ok: false, error: '503' }],
    sameAsAggregated: 1,
  },
];
const cells = (table: string, name: string): string[] =>
  (table.split('\n').find((l) => l.startsWith(`| ${name} |`)) ?? '')
    .split('|')
    .slice(1, -1)
    .map((c) => c.trim());

describe('bench/pd-report.mjs', () => {
  it('serving table: counts, throughput, TTFT/TPOT statistics, τ', () => {
    const t = report.servingTable(rows) as string;
    // ok, duration s, in/s, out/s, TTFT mean, median, P95, TPOT mean, P95, E2E mean, τ, = aggregated
    expect(cells(t, 'aggregated C=1').slice(1)).toEqual([
      '2/2',
      '2.0',
      '100',
      '11.0',
      '20',
      '10',
      '30',
      '15.0',
      '20.0',
      '170',
      '—',
      '2/2',
    ]);
    expect(cells(t, 'PD dflash zmq C=1').slice(1, 4)).toEqual(['1/2', '1.0', '100']);
    expect(cells(t, 'PD dflash zmq C=1')[11]).toBe('2.50');
  });

  it('waterfall and payload tables: means per phase, Σ, × PD no-spec', () => {
    const w = report.waterfallTable(rows) as string;
    expect(w).not.toContain('aggregated');
    // PD no-spec: phases (1..7) × mean(1, 3) = 2, 4, …, 14; Σ 56; TTFT 60
    expect(cells(w, 'PD no-spec zmq C=1').slice(1, 11)).toEqual([
      '2.0',
      '4.0',
      '6.0',
      '8.0',
      '10.0',
      '12.0',
      '14.0',
      '56.0',
      '60.0',
      '0.5',
    ]);
    const p = report.payloadTable(rows) as string;
    // kinds, total, sent while prefilling (overlapped_bytes: 0.5 KiB in one of no-spec's two), descriptors, ×
    expect(cells(p, 'PD no-spec zmq C=1').slice(1, 8)).toEqual(['1.0', '0.0', '0.0', '1.0', '0.3', '4.0', '1.00']);
    expect(cells(p, 'PD dflash zmq C=1').slice(1, 8)).toEqual(['1.0', '0.0', '1.0', '2.0', '0.0', '4.0', '2.00']);
  });

  it('goals table: payload, transfer wait and output tok/s as ratios to PD no-spec, each judged', () => {
    const g = report.goalsTable(rows, undefined) as string;
    expect(g).not.toContain('no-spec zmq');
    // payload 2048 / 1024; transfer wait 10 / 10 ms (no link: not judged); output 11 / 22 tok/s at C = 1
    expect(cells(g, 'PD dflash zmq C=1').slice(1)).toEqual([
      '2.00 NOT met',
      '1.00 (n/a: loopback, no link)',
      '0.50 NOT met',
    ]);
    expect(cells(report.goalsTable(rows, 'tbf 1gbit') as string, 'PD dflash zmq C=1')[2]).toBe('1.00 met');
    // an overlap-off row compares with the overlap-off no-spec row, and its wait is not judged
    const off = rows.filter((r) => r.path === 'pd').map((r) => ({ ...r, overlap: false }));
    const g2 = report.goalsTable([...rows, ...off], 'tbf 1gbit') as string;
    expect(cells(g2, 'PD dflash zmq C=1 overlap off')[2]).toBe('1.00 (n/a: not overlapped)');
  });

  it('SVG: a stacked bar per PD configuration, segments in ms on a shared axis, a legend', () => {
    const svg = report.waterfallSvg(rows, 'title <x>') as string;
    expect(svg.startsWith('<svg xmlns="http://www.w3.org/2000/svg"')).toBe(true);
    expect(svg).toContain('<title>title &lt;x&gt;: mean TTFT waterfall');
    const segs = [...svg.matchAll(/<rect x="([\d.]+)" y="(\d+)" width="([\d.]+)"[^>]*><title>([^<]*)<\/title>/g)];
    // PD no-spec: 7 phases + the gap (60 − 56 ms); dflash: 7 phases + the gap (60 − 56 ms)
    expect(segs.length).toBe(16);
    const noSpec = segs.filter((s) => s[4]?.startsWith('PD no-spec'));
    const widths = noSpec.map((s) => Number(s[3]));
    const msPerPx = 2 / (widths[0] ?? 1); // the first phase is 2 ms
    expect(widths.map((px) => Math.round(px * msPerPx * 10) / 10)).toEqual([2, 4, 6, 8, 10, 12, 14, 4]);
    // stacked: each segment starts where the previous ends
    for (let i = 1; i < noSpec.length; i++)
      expect(Number(noSpec[i]?.[1])).toBeCloseTo(Number(noSpec[i - 1]?.[1]) + Number(noSpec[i - 1]?.[3]), 1);
    for (const p of PHASES) expect(svg).toContain(`>${p}</text>`);
    expect(svg).toContain('>gap (HTTP, hops)</text>');
  });
});
