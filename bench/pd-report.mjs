// The production report's tables and the TTFT waterfall chart for bench/pd.mjs (section 4): pure functions of
// the measured rows, no I/O. A row is one configuration (path, drafter, transfer engine, concurrency) with its
// requests' client-side timings (ms), token counts, the router's waterfalls (`GET /pd/waterfall/<id>`,
// packages/core/src/pd/waterfall.ts) and τ from the decoding server's counters.
import { WATERFALL_PHASES } from '@specd/core';

/** The chart's colour of each waterfall phase. */
const COLOURS = {
  router: '#8c564b',
  prefill_queue: '#bcbd22',
  prefill_forward: '#1f77b4',
  bootstrap: '#9467bd',
  transfer_wait: '#d62728',
  decode_queue: '#ff7f0e',
  decode_first_step: '#2ca02c',
};
/** The waterfall phases in order (pd/waterfall.ts WATERFALL_PHASES), with the chart's colours. */
export const PHASES = WATERFALL_PHASES.map((p) => [p, COLOURS[p]]);
/** TTFT − Σ phases: network hops and HTTP plumbing (not a phase; drawn after them in grey). */
const GAP = ['gap (HTTP, hops)', '#c7c7c7'];
export const PAYLOAD_KINDS = ['target_kv', 'linear_state', 'draft_context'];

const mean = (xs) => (xs.length === 0 ? Number.NaN : xs.reduce((a, b) => a + b, 0) / xs.length);
/** The q-quantile (0..1) by nearest rank. */
const quantile = (xs, q) => {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
};
const f = (x, digits = 0) => (Number.isFinite(x) ? x.toFixed(digits) : '—');
const table = (head, rows) =>
  [
    `| ${head.join(' | ')} |`,
    `| ${head.map(() => '---').join(' | ')} |`,
    ...rows.map((r) => `| ${r.join(' | ')} |`),
  ].join('\n');

/** The row's label: `aggregated C=1`, `PD dflash zmq C=8` (`… overlap off` for a PD row with `overlap: false`). */
export const label = (r) =>
  r.path === 'agg'
    ? `aggregated C=${r.concurrency}`
    : `PD ${r.drafter === 'none' ? 'no-spec' : r.drafter} ${r.engine} C=${r.concurrency}` +
      `${r.overlap === false ? ' overlap off' : ''}`;

/** The PD no-spec row `r` compares with: same engine, concurrency and overlap setting. */
const baseOf = (rows, r) =>
  rows.find(
    (b) =>
      b.path === 'pd' &&
      b.drafter === 'none' &&
      b.engine === r.engine &&
      b.concurrency === r.concurrency &&
      (b.overlap ?? true) === (r.overlap ?? true),
  );

/**
 * The serving table (the production report's columns). Per request: TTFT = send → first streamed text, E2E = send →
 * last byte, TPOT = (E2E − TTFT) / (output tokens − 1); duration = first send → last answer of the run.
 */
export function servingTable(rows) {
  return table(
    [
      'configuration',
      'ok',
      'duration s',
      'input tok/s',
      'output tok/s',
      'TTFT mean ms',
      'TTFT median',
      'TTFT P95',
      'TPOT mean ms',
      'TPOT P95',
      'E2E mean ms',
      'τ',
      '= aggregated',
    ],
    rows.map((r) => {
      const ok = r.requests.filter((q) => q.ok);
      const ttft = ok.map((q) => q.ttft);
      const tpot = ok.filter((q) => q.outputTokens > 1).map((q) => (q.e2e - q.ttft) / (q.outputTokens - 1));
      const sum = (k) => ok.reduce((a, q) => a + q[k], 0);
      const s = r.durationMs / 1000;
      return [
        label(r),
        `${ok.length}/${r.requests.length}`,
        f(s, 1),
        f(sum('inputTokens') / s),
        f(sum('outputTokens') / s, 1),
        f(mean(ttft)),
        f(quantile(ttft, 0.5)),
        f(quantile(ttft, 0.95)),
        f(mean(tpot), 1),
        f(quantile(tpot, 0.95), 1),
        f(mean(ok.map((q) => q.e2e))),
        r.tau === undefined ? '—' : f(r.tau, 2),
        r.sameAsAggregated === undefined ? '' : `${r.sameAsAggregated}/${ok.length}`,
      ];
    }),
  );
}

/** Mean of each phase (ms) over a row's waterfalls, the router's TTFT and the gap TTFT − Σ phases. */
export function meanWaterfall(r) {
  const ws = r.requests.filter((q) => q.waterfall !== undefined).map((q) => q.waterfall);
  const phases = Object.fromEntries(PHASES.map(([p]) => [p, mean(ws.map((w) => w.phases_ms[p]))]));
  const ttft = mean(ws.map((w) => w.ttft_ms));
  const sum = PHASES.reduce((a, [p]) => a + phases[p], 0);
  return { n: ws.length, phases, ttft, gap: ttft - sum, reserve: mean(ws.map((w) => w.decode_reserve_ms)) };
}

/** The waterfall table: mean ms per phase per PD configuration. */
export function waterfallTable(rows) {
  return table(
    ['configuration', ...PHASES.map(([p]) => p), 'Σ phases', "router's TTFT", 'D reserve (not summed)'],
    rows
      .filter((r) => r.path === 'pd')
      .map((r) => {
        const w = meanWaterfall(r);
        return [
          label(r),
          ...PHASES.map(([p]) => f(w.phases[p], 1)),
          f(w.ttft - w.gap, 1),
          f(w.ttft, 1),
          f(w.reserve, 1),
        ];
      }),
  );
}

/**
 * A row's payload per request (bytes, means over its waterfalls): by kind, the total, the part sent while P prefilled
 * (`overlapped_bytes`) and the descriptors of P's last write.
 */
export function meanPayload(r) {
  const ws = r.requests.filter((q) => q.waterfall !== undefined).map((q) => q.waterfall);
  const kinds = Object.fromEntries(PAYLOAD_KINDS.map((k) => [k, mean(ws.map((w) => w.payload_bytes[k] ?? 0))]));
  return {
    kinds,
    total: PAYLOAD_KINDS.reduce((a, k) => a + kinds[k], 0),
    early: mean(ws.map((w) => w.overlapped_bytes ?? 0)),
    desc: mean(ws.map((w) => w.descriptors)),
  };
}

/** Payload per request by kind (KiB, the means over the row's waterfalls), sent early, descriptors, × PD no-spec. */
export function payloadTable(rows) {
  const pd = rows.filter((r) => r.path === 'pd');
  return table(
    [
      'configuration',
      ...PAYLOAD_KINDS.map((k) => `${k} KiB`),
      'total KiB',
      'sent while prefilling KiB',
      'descriptors',
      '× PD no-spec',
    ],
    pd.map((r) => {
      const p = meanPayload(r);
      const base = baseOf(pd, r);
      return [
        label(r),
        ...PAYLOAD_KINDS.map((k) => f(p.kinds[k] / 1024, 1)),
        f(p.total / 1024, 1),
        f(p.early / 1024, 1),
        f(p.desc, 1),
        base === undefined ? '' : f(p.total / meanPayload(base).total, 2),
      ];
    }),
  );
}

/** Output tokens per second of a row's successful requests over its duration. */
const outputTps = (r) => r.requests.filter((q) => q.ok).reduce((a, q) => a + q.outputTokens, 0) / (r.durationMs / 1000);

/**
 * Issue 17's goals as ratios to PD no-spec (same engine, concurrency and overlap), per PD configuration with a
 * drafter: payload (goal ≤ 1.25), mean transfer wait (goal ≤ 1.10, on a 1 Gbit/s tbf link with the transfer
 * overlapped: `link` names the link the run had, e.g. `'tbf 1gbit'`, or undefined for loopback), output tokens/s
 * (goal ≥ 1.2 at C = 1). Each cell: the ratio, then `met` / `NOT met`, or `(n/a: why)` where the goal does not apply.
 */
export function goalsTable(rows, link) {
  const pd = rows.filter((r) => r.path === 'pd');
  const verdict = (x, ok, applies) =>
    !Number.isFinite(x) ? '—' : `${f(x, 2)} ${applies === true ? (ok ? 'met' : 'NOT met') : `(n/a: ${applies})`}`;
  return table(
    [
      'configuration',
      'payload × no-spec (≤ 1.25)',
      'transfer wait × no-spec (≤ 1.10)',
      'output tok/s × no-spec (≥ 1.2, C = 1)',
    ],
    pd
      .filter((r) => r.drafter !== 'none')
      .map((r) => {
        const base = baseOf(pd, r);
        if (base === undefined) return [label(r), '—', '—', '—'];
        const payload = meanPayload(r).total / meanPayload(base).total;
        const wait = meanWaterfall(r).phases.transfer_wait / meanWaterfall(base).phases.transfer_wait;
        const tps = outputTps(r) / outputTps(base);
        const waitApplies = link === undefined ? 'loopback, no link' : r.overlap === false ? 'not overlapped' : true;
        return [
          label(r),
          verdict(payload, payload <= 1.25, true),
          verdict(wait, wait <= 1.1, waitApplies),
          verdict(tps, tps >= 1.2, r.concurrency === 1 ? true : `C = ${r.concurrency}`),
        ];
      }),
  );
}

const esc = (s) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
/** A round axis step (1, 2 or 5 × 10^k ms) giving about 6 ticks up to `max`. */
const tickStep = (max) => {
  const raw = max / 6;
  const p = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw) ?? raw;
};

/**
 * The waterfall as an SVG (hand-written): one stacked horizontal bar per PD configuration, one colour per phase in
 * waterfall order, then the grey gap up to the router's TTFT; a legend and an axis in ms. @param title first line.
 */
export function waterfallSvg(rows, title) {
  const bars = rows.filter((r) => r.path === 'pd').map((r) => ({ name: label(r), w: meanWaterfall(r) }));
  const left = 190;
  const plotW = 640;
  const barH = 18;
  const gapY = 8;
  const top = 46;
  const max = Math.max(1, ...bars.map((b) => b.w.ttft).filter(Number.isFinite));
  const step = tickStep(max);
  const axisMax = Math.ceil(max / step) * step;
  const x = (ms) => left + (ms / axisMax) * plotW;
  const plotH = bars.length * (barH + gapY);
  const legendY = top + plotH + 40;
  const legend = [...PHASES, GAP];
  const height = legendY + Math.ceil(legend.length / 4) * 20 + 10;
  const width = left + plotW + 30;
  const out = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" ` +
      `font-family="sans-serif" font-size="12">`,
    `<title>${esc(title)}: mean TTFT waterfall per configuration (ms)</title>`,
    `<rect width="${width}" height="${height}" fill="#fff"/>`,
    `<text x="${left}" y="20" font-size="14" font-weight="bold">${esc(title)}</text>`,
    `<text x="${left}" y="36" fill="#555">mean TTFT waterfall per configuration (ms)</text>`,
  ];
  for (let t = 0; t <= axisMax + 1e-9; t += step) {
    out.push(`<line x1="${x(t)}" y1="${top - 4}" x2="${x(t)}" y2="${top + plotH}" stroke="#e5e5e5"/>`);
    out.push(`<text x="${x(t)}" y="${top + plotH + 16}" text-anchor="middle">${+t.toFixed(3)}</text>`);
  }
  out.push(`<text x="${left + plotW / 2}" y="${top + plotH + 32}" text-anchor="middle">ms</text>`);
  bars.forEach((b, i) => {
    const y = top + i * (barH + gapY);
    out.push(`<text x="${left - 6}" y="${y + barH - 5}" text-anchor="end">${esc(b.name)}</text>`);
    let at = 0;
    const segs = [...PHASES.map(([p, c]) => [p, c, b.w.phases[p]]), [GAP[0], GAP[1], Math.max(0, b.w.gap)]];
    for (const [p, c, ms] of segs) {
      if (!Number.isFinite(ms) || ms <= 0) continue;
      out.push(
        `<rect x="${x(at).toFixed(2)}" y="${y}" width="${(x(at + ms) - x(at)).toFixed(2)}" height="${barH}" ` +
          `fill="${c}"><title>${esc(`${b.name}: ${p} ${ms.toFixed(1)} ms`)}</title></rect>`,
      );
      at += ms;
    }
    out.push(`<text x="${x(at) + 4}" y="${y + barH - 5}" fill="#333">${f(b.w.ttft)}</text>`);
  });
  legend.forEach(([p, c], i) => {
    const lx = left + (i % 4) * 165;
    const ly = legendY + Math.floor(i / 4) * 20;
    out.push(`<rect x="${lx}" y="${ly - 10}" width="12" height="12" fill="${c}"/>`);
    out.push(`<text x="${lx + 16}" y="${ly}">${esc(p)}</text>`);
  });
  out.push('</svg>', '');
  return out.join('\n');
}
