// The physical bound on speculative decoding's speed-up at C concurrent sequences (issue 16: a goal may be declared
// physically unreachable only with the bound computed from the measured FLOP rate or bandwidth). Bench-only.
//
//   node bench/spec-bound.mjs [--target kimi|smollm2] [--drafters eagle3] [--conc 1,8] [--prompts 16] [--tokens 64]
//                             [--settings 0|defaults]   (the acceptance greedy, or at the target's default sampling)
//   (bench:spec prints the same lines for its greedy rows)
//
// Both engines are taken at their floors, so per-step overheads (native calls, JavaScript, thread hand-offs) count
// for neither: the question is what the machine allows a speculative decoder against the best plain decoder it
// allows, not what this code does.
// - Work of a step, counted while the engines run (bench/native-timing.mjs's `onCall`, every kernel of a decode step):
//   multiply-adds per dot-product path (fp32 FMA; AMX-BF16 tiles with split bf16 activations, two tile rows a row and a
//   tile's 16 rows charged whole; int8 / int16 activations against quantized weights, one / two int8 products at the
//   VNNI rate, or on AMX-INT8 tiles where the addon takes them: 16 rows and more with int16, 96 with int8, a tile's 16
//   rows charged whole) and the bytes that must come from memory: each weight matrix read once per step (the MoE: the
//   experts some row of the step routes to, plus the shared one), each sequence's KDA state and conv state read and
//   written (the verify's kept copy too), its MLA latent KV and its draft KV read. The target's commits (the replays of
//   partly accepted blocks) are counted apart.
// - The machine: peak rates from registers (bench/dot-rate.c, best of 3; AVX-512 only) and the read bandwidth over a
//   buffer the size of a step's bytes (bench/read-bw.c; the sizes in turn, best of 3, a size never slower than a
//   larger one), on the engines' thread count. AMX paths only where the addon runs AMX.
// - floor(step) = max(Σ multiply-adds ÷ the rate of their path, bytes ÷ bandwidth): compute and memory overlapped
//   perfectly; the compute counted is the GEMMs, the MoE experts and the KDA recurrence only (attention's dot
//   products, norms and sampling left out).
// - Plain decoding: C tokens per floor(plain step at C). Drafting k tokens for every sequence: C·τ(k) tokens per
//   floor(speculative step at C, fixed k: the drafter's propose and draft-context writes, the verify of C·(k+1) rows,
//   the commit), with τ(k) = 1 + Σ_{j≤k} a_j from the measured per-position acceptance a_j (the engine's metric,
//   which also counts the last step of a request, where the budget cut the drafts: it reads a little low), and at
//   a_j = 1 (then without the commit's replays: every block is committed whole).
//   bound(k) = τ(k) · floor(plain) ÷ floor(spec, k); the bound at C is the best k. Beside it, the same against the
//   plain engine's measured step instead of its floor: what a speculative decoder at its floor could do against this
//   plain decoder. That one says how far the code is from the machine, not what the machine allows.
// Where the plain step is compute-bound (C rows of dot products outlast its memory reads), a verify row costs a plain
// row's dot products and brings at most one token, and the draft's own work comes on top: the bound stays below 1 even
// at a_j = 1. Where it is memory-bound, verify rows ride on the weight reads until m* = t_mem ÷ t_row rows. The bound
// is a ratio of floors: a measured speed-up can exceed it where plain decoding runs far above its floor and drafting
// spreads that cost over τ tokens (e.g. kimi-k3-tiny at one sequence, docs/BENCHMARKS.md).
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { dotRates, readBandwidthGBs } from './probes.mjs';
import { defaultSampling } from './prompts.mjs';
import { median } from './stats.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const CACHE = path.join(ROOT, '.cache', 'spec-bound');

/**
 * Peak rates of this machine on `threads` threads, best of `runs` (bench/dot-rate.c): multiply-adds per second by
 * path. `amx`: whether the addon runs AMX tiles. @returns { fma, bf16, int8, amxBf16, amxInt8 } MAC/s (the AMX
 * rates null without AMX; int8 = VNNI's: the quantized GEMMs take AMX-INT8 tiles only from {@link amxQuantMinRows}
 * rows, native/src/quant_i8_amx.cc).
 */
export function machineRates(threads, amx, runs = 3) {
  const best = dotRates(threads, CACHE, { runs, seconds: 1 });
  const mac = (gops) => (gops === undefined || gops === null ? null : (gops * 1e9) / 2);
  return {
    fma: mac(best.avx512_f32),
    bf16: mac(best.avx512_bf16),
    int8: mac(best.vnni_int8),
    amxBf16: amx ? mac(best.amx_bf16) : null,
    amxInt8: amx ? mac(best.amx_int8) : null,
  };
}

/**
 * Rows from which `gemmQuant` runs AMX-INT8 tiles on a machine with AMX, by activation: native/src/quant_kernels.h's
 * kAmxMinRowsWide (int16, 16) and kAmxMinRows (int8, 96), or the addon's overrides SPECD_QUANT_AMX_MIN_ROWS_WIDE /
 * SPECD_QUANT_AMX_MIN_ROWS (native/src/quant.cc reads the same variables at load).
 */
export function amxQuantMinRows(env = process.env) {
  const read = (name, dflt) => {
    const n = Number(env[name]);
    return Number.isInteger(n) && n >= 1 ? n : dflt;
  };
  return { int16: read('SPECD_QUANT_AMX_MIN_ROWS_WIDE', 16), int8: read('SPECD_QUANT_AMX_MIN_ROWS', 96) };
}
const AMX_QUANT_MIN_ROWS = amxQuantMinRows();

/**
 * Read bandwidth of `threads` threads re-reading buffers of each of `sizes` bytes (rounded up to MiB, ≥ 4;
 * bench/read-bw.c): a step that reads that many bytes every step, from whatever cache level holds them. The sizes are
 * measured in turn, `rounds` times (the best of each kept), so a change in the machine's state hits all of them, and
 * a size is never read slower than a larger one (the envelope from the largest down). @returns bytes → { bytesPerS,
 * mib }: a size not measured reads at the next larger measured size's rate.
 */
export function bandwidthTable(threads, sizes, rounds = 3) {
  const mibOf = (bytes) => Math.max(4, Math.ceil(bytes / 2 ** 20));
  const mibs = [...new Set(sizes.map(mibOf))].sort((a, b) => a - b);
  const best = new Map(mibs.map((m) => [m, 0]));
  for (let r = 0; r < rounds; r++)
    for (const mib of mibs) best.set(mib, Math.max(best.get(mib), readBandwidthGBs(threads, mib, CACHE) * 1e9));
  for (let i = mibs.length - 2; i >= 0; i--) best.set(mibs[i], Math.max(best.get(mibs[i]), best.get(mibs[i + 1])));
  return (bytes) => {
    // a size not measured reads at the next larger size's rate (never faster than measured)
    const want = mibOf(bytes);
    const mib = mibs.find((m) => m >= want) ?? mibs[mibs.length - 1];
    return { bytesPerS: best.get(mib), mib };
  };
}

/** A step's work: multiply-adds by path and bytes from memory. */
export function emptyWork() {
  return { macs: { fma: 0, amxSplit: 0, amxBf16: 0, amxInt8: 0, int8: 0, int16: 0 }, bytes: 0 };
}

/**
 * Adds one kernel call's work to `w` (`weights`: the weight arrays this step has read already, each counted once).
 * Kernels absent here (norms, RoPE, sampling, attention's dot products) count no compute.
 */
export function countCall(name, a, w, weights, amx) {
  const weight = (data) => {
    if (data === null || data === undefined || weights.has(data)) return;
    weights.add(data);
    w.bytes += data.byteLength;
  };
  if (name === 'gemmBf16' || name === 'gemmBf16Accumulate') {
    const [, m, pw, , act = 'f32'] = a;
    // AMX tiles hold 16 rows: a tile instruction costs the same for fewer (split bf16: hi and lo, two rows a row)
    if (amx && act === 'bf16x2') w.macs.amxSplit += (Math.ceil((2 * m) / 16) * 16 * pw.n * pw.k) / 2;
    else if (amx && act === 'bf16') w.macs.amxBf16 += Math.ceil(m / 16) * 16 * pw.n * pw.k;
    else w.macs.fma += m * pw.n * pw.k;
    weight(pw.data);
  } else if (name === 'gemmQuant') {
    const [, m, qw, , act = 'f32'] = a;
    const macs = m * qw.n * qw.k;
    const wide = act === 'int16';
    // AMX-INT8 tiles (16 rows, charged whole); int16 is two int8 planes, two tile products a tile
    if (amx && (wide || act === 'int8') && m >= AMX_QUANT_MIN_ROWS[wide ? 'int16' : 'int8'])
      w.macs.amxInt8 += (wide ? 2 : 1) * Math.ceil(m / 16) * 16 * qw.n * qw.k;
    else if (act === 'int8') w.macs.int8 += macs;
    else if (act === 'int16') w.macs.int16 += macs;
    else w.macs.fma += macs;
    weight(qw.data);
  } else if (name === 'moeExperts') {
    const [, n, ex, routing] = a;
    w.macs.fma += n * routing.topK * 3 * ex.hidden * ex.inter + (ex.sharedW13 ? n * 3 * ex.hidden * ex.sharedInter : 0);
    for (const e of new Set(routing.ids.subarray(0, n * routing.topK))) {
      weight(ex.w13[e]);
      weight(ex.w2[e]);
    }
    weight(ex.sharedW13);
    weight(ex.sharedW2);
  } else if (name === 'kdaRecurrent') {
    const [inputs, batch, , shape, options = {}] = a;
    const slot = 4 * (shape.heads * shape.headDim * shape.headDim + 9 * shape.heads * shape.headDim);
    let seqs = 0;
    let tokens = 0;
    for (const len of batch.seqLens) {
      if (len > 0) seqs++;
      tokens += len;
    }
    // the state S' = diag(exp g)·S, k̂ᵀS', the rank-1 update and Sᵀq̂: ~4·d² multiply-adds a head and token
    w.macs.fma += 4 * tokens * shape.heads * shape.headDim * shape.headDim;
    // each slot read and written (with `initial`, the kept state is read in the slot's place)
    w.bytes += 2 * seqs * slot;
    if (options.keepBefore) w.bytes += slot * options.keepBefore.rows.filter((r) => r >= 0).length;
    weight(inputs.convWeight);
  } else if (name === 'mlaAttention') {
    const [, , , mw, batch] = a;
    const perToken = 4 * (mw.dims.kvLoraRank + mw.dims.qkRopeHeadDim);
    for (const len of batch.kvLens) w.bytes += len * perToken;
    weight(mw.wUk);
    weight(mw.wUvT);
  } else if (name === 'pagedAttention') {
    const [, , , layout, batch] = a;
    for (const len of batch.kvLens) w.bytes += 2 * 4 * len * layout.numKvHeads * layout.headDim;
  }
}

/**
 * Work per decode step of an engine running `C` sequences (`drafter` with a fixed `k` drafts a sequence and step, or
 * plain decoding without a drafter), greedy, EOS ignored: the mean over `steps` batch steps after every prompt is
 * prefilled and `warm` steps more (the draft context's catch-up of the prompts left out). The requests' budgets reach
 * far past those steps, so no draft is cut short. The target's commits (`commitPrefix`, `commitPrefixes`: the replays
 * of partly accepted blocks) are counted apart as well, and `steps` further steps are timed without counting.
 * `amx`: whether the addon runs AMX tiles (`isa().amxAvailable` on the avx512 path).
 * @returns { macs, bytes, commit: { macs, bytes }, steps, wallS } per step (wallS: the median timed step, s).
 * @throws Error when a counted step ran fewer than C sequences.
 */
export function measureStepWork(core, nativeTiming, target, drafter, prompts, C, k, amx, { warm = 3, steps = 8 } = {}) {
  const maxTokensPerSequence = 4096;
  const opts = { maxSequences: C, maxTokensPerSequence };
  const e =
    drafter === undefined
      ? new core.SpecEngine(target.model, undefined, opts)
      : new core.SpecEngine(target.model, drafter, { ...opts, draftPolicy: core.fixedDraftPolicy(k) });
  for (let i = 0; i < C; i++) {
    const promptIds = Int32Array.from(prompts[i % prompts.length]);
    e.add({
      id: `bound-${i}`,
      promptIds,
      maxTokens: maxTokensPerSequence - promptIds.length - 64, // room for a draft block
      sampling: { temperature: 0 },
      seed: 1,
      ignoreEos: true,
    });
  }
  const model = target.model;
  const restore = [];
  let inCommit = false;
  for (const name of ['commitPrefix', 'commitPrefixes']) {
    const f = model[name];
    if (typeof f !== 'function') continue;
    model[name] = (...args) => {
      inCommit = true;
      try {
        return f.apply(model, args);
      } finally {
        inCommit = false;
      }
    };
    restore.push(() => {
      model[name] = f;
    });
  }
  const total = emptyWork();
  const commit = emptyWork();
  let counted = 0;
  const walls = [];
  try {
    let guard = 0;
    while (e.prefilling > 0 || e.pending > e.occupied) {
      e.step();
      if (++guard > 10_000) throw new Error('spec-bound: the prompts never finished prefilling');
    }
    for (let i = 0; i < warm; i++) e.step();
    for (let i = 0; i < steps; i++) {
      const w = emptyWork();
      const c = emptyWork();
      const weights = new Set();
      nativeTiming.onCall = (name, args) => countCall(name, args, inCommit ? c : w, weights, amx);
      e.step();
      nativeTiming.onCall = null;
      if (e.pending !== C) throw new Error(`spec-bound: a counted step ran ${e.pending} of ${C} sequences`);
      for (const p of Object.keys(total.macs)) {
        total.macs[p] += w.macs[p] + c.macs[p];
        commit.macs[p] += c.macs[p];
      }
      total.bytes += w.bytes + c.bytes;
      commit.bytes += c.bytes;
      counted++;
    }
    for (let i = 0; i < steps; i++) {
      const t0 = performance.now();
      e.step();
      walls.push((performance.now() - t0) / 1000);
    }
  } finally {
    nativeTiming.onCall = null;
    for (const r of restore) r();
    e.dispose();
  }
  for (const p of Object.keys(total.macs)) {
    total.macs[p] /= counted;
    commit.macs[p] /= counted;
  }
  return {
    macs: total.macs,
    bytes: total.bytes / counted,
    commit: { macs: commit.macs, bytes: commit.bytes / counted },
    steps: counted,
    wallS: median(walls),
  };
}

/** Seconds of dot products of a step's work at the machine's rates (paths the machine lacks at the fp32 rate). */
export function computeSeconds(work, rates) {
  if (!rates.fma)
    throw new Error('spec-bound: bench/dot-rate.c measured no fp32 FMA rate (its kernels need AVX-512): no bound here');
  const m = work.macs;
  const int8 = rates.int8 ?? rates.fma;
  return (
    m.fma / rates.fma +
    m.amxSplit / ((rates.amxBf16 ?? rates.fma * 2) / 2) +
    m.amxBf16 / (rates.amxBf16 ?? rates.fma) +
    m.int8 / int8 +
    m.int16 / (int8 / 2) +
    m.amxInt8 / (rates.amxInt8 ?? int8)
  );
}

/**
 * The bound at C sequences (file comment): `plain` and `spec[k]` from {@link measureStepWork}, `perPosition` the
 * measured a_j, `bandwidthOf(bytes)` the read bandwidth for a step of that many bytes ({@link bandwidthTable}).
 * @returns { plain: { computeS, memoryS, floorS, bytes, bw }, perK: [{ k, tau, computeS, memoryS, floorS, bound,
 *   boundPerfect }], best, bestPerfect } in seconds; bound = τ(k)·floor(plain) ÷ floor(spec, k), boundPerfect at
 *   τ = k + 1.
 */
export function speculationBound(plain, spec, perPosition, rates, bandwidthOf) {
  const floor = (w) => {
    const computeS = computeSeconds(w, rates);
    const bw = bandwidthOf(w.bytes);
    const memoryS = w.bytes / bw.bytesPerS;
    return { computeS, memoryS, floorS: Math.max(computeS, memoryS), bytes: w.bytes, bw };
  };
  /** The work without the commit's replays (a step whose every draft is accepted commits each block whole). */
  const withoutCommit = (w) => {
    if (w.commit === undefined) return w;
    const macs = Object.fromEntries(Object.entries(w.macs).map(([p, v]) => [p, v - (w.commit.macs[p] ?? 0)]));
    return { macs, bytes: w.bytes - w.commit.bytes };
  };
  const p = floor(plain);
  const perK = [];
  for (const [k, w] of [...spec].sort((a, b) => a[0] - b[0])) {
    let tau = 1;
    for (let j = 0; j < k; j++) tau += perPosition[j] ?? 0;
    const s = floor(w);
    const perfect = floor(withoutCommit(w));
    perK.push({
      k,
      tau,
      ...s,
      bound: (tau * p.floorS) / s.floorS,
      boundPerfect: ((k + 1) * p.floorS) / perfect.floorS,
      // against the plain engine as measured (its timed steps) rather than at its floor
      boundMeasured: plain.wallS === undefined ? undefined : (tau * plain.wallS) / s.floorS,
    });
  }
  const best = perK.reduce((a, b) => (b.bound > a.bound ? b : a));
  const bestPerfect = perK.reduce((a, b) => (b.boundPerfect > a.boundPerfect ? b : a));
  return { plain: { ...p, wallS: plain.wallS }, perK, best, bestPerfect };
}

/** The draft lengths measured for a drafter of `maxK`: 1, 2, 3, 4, 6 and maxK where ≤ maxK. */
export function boundKs(maxK) {
  return [...new Set([1, 2, 3, 4, 6, maxK])].filter((k) => k >= 1 && k <= maxK).sort((a, b) => a - b);
}

/** µs, one decimal. */
const us = (s) => (s * 1e6).toFixed(1);
/** "bytes MB at bandwidth GB/s" of a floor. */
const mb = (f) => `${(f.bytes / 1e6).toFixed(2)} MB at ${(f.bw.bytesPerS / 1e9).toFixed(1)} GB/s`;

/** One drafter's bound at C: lines to print (a table and a verdict); `at` names the acceptance's sampling. */
export function boundLines(name, C, b, cpu, at = 'greedy') {
  const vsMeasured = b.plain.wallS !== undefined;
  const lines = [
    `physical bound, ${name} at ${C} sequence(s), acceptance ${at} (both engines at their floors; ${cpu}):`,
    `  plain step: compute ${us(b.plain.computeS)} µs, memory ${us(b.plain.memoryS)} µs ` +
      `(${mb(b.plain)}; ${b.plain.computeS >= b.plain.memoryS ? 'compute-bound' : 'memory-bound'})` +
      (vsMeasured ? `; measured ${us(b.plain.wallS)} µs a step` : ''),
    '  k | τ(k) measured | spec step: compute µs | memory µs (MB at GB/s) | bound ×plain | at a_j = 1' +
      (vsMeasured ? ' | against the measured plain step' : ''),
  ];
  for (const r of b.perK)
    lines.push(
      `  ${r.k} | ${r.tau.toFixed(3)} | ${us(r.computeS)} | ${us(r.memoryS)} (${mb(r)}) | ` +
        `×${r.bound.toFixed(3)} | ×${r.boundPerfect.toFixed(3)}` +
        (r.boundMeasured === undefined ? '' : ` | ×${r.boundMeasured.toFixed(3)}`),
    );
  const never = (x) => (x < 1 ? ' (below not drafting, ×1.000)' : '');
  lines.push(
    `  best: ×${b.best.bound.toFixed(3)} at k = ${b.best.k} with the measured acceptance${never(b.best.bound)}, ` +
      `×${b.bestPerfect.boundPerfect.toFixed(3)} at k = ${b.bestPerfect.k} with every draft accepted` +
      never(b.bestPerfect.boundPerfect),
  );
  return lines;
}

/**
 * Measures and prints the bound for each drafter and C (bench:spec and this file's command line).
 * @param o.core `@specd/core`; o.nativeTiming bench/native-timing.mjs's; o.target a loaded target; o.drafters on it.
 * @param o.prompts prompt token ids (sequence i takes prompt i mod length); o.concs the loads C.
 * @param o.threads the engines' threads; o.amx whether the addon runs AMX tiles.
 * @param o.perPositionOf (drafter, C) → the measured a_j at greedy (max k), or undefined to skip.
 * @param o.labelOf a drafter's name; o.cpu the machine, as printed; o.acceptanceAt the sampling a_j was measured at
 *   (printed; default 'greedy').
 * @returns [{ drafter, C, bound }].
 */
export function printBounds({
  core,
  nativeTiming,
  target,
  drafters,
  prompts,
  concs,
  threads,
  amx,
  perPositionOf,
  labelOf,
  cpu,
  acceptanceAt = 'greedy',
}) {
  const rates = machineRates(threads, amx);
  const out = [];
  for (const C of concs) {
    const plain = measureStepWork(core, nativeTiming, target, undefined, prompts, C, 0, amx);
    const measured = [];
    for (const d of drafters) {
      const perPosition = perPositionOf(d, C);
      if (perPosition === undefined) continue;
      const spec = new Map(
        boundKs(d.maxDraftTokens).map((k) => [k, measureStepWork(core, nativeTiming, target, d, prompts, C, k, amx)]),
      );
      measured.push({ d, perPosition, spec });
    }
    // one bandwidth table for every step of this load (plain and each drafter's), measured after their work
    const bandwidthOf = bandwidthTable(threads, [
      plain.bytes,
      ...measured.flatMap((m) => [...m.spec.values()].map((w) => w.bytes)),
    ]);
    const rowMacs = Object.values(plain.macs).reduce((x, y) => x + y, 0) / C;
    for (const { d, perPosition, spec } of measured) {
      const b = speculationBound(plain, spec, perPosition, rates, bandwidthOf);
      for (const l of boundLines(labelOf(d), C, b, cpu, acceptanceAt)) console.log(l);
      out.push({ drafter: labelOf(d), C, bound: b });
    }
    if (measured.length > 0)
      console.log(
        `  rates (bench/dot-rate.c, ${threads} threads, G multiply-adds/s): fp32 FMA ${(rates.fma / 1e9).toFixed(0)}` +
          `${rates.int8 ? `, int8 ${(rates.int8 / 1e9).toFixed(0)}` : ''}` +
          `${rates.amxBf16 ? `, AMX-BF16 ${(rates.amxBf16 / 1e9).toFixed(0)}` : ''}` +
          `${rates.amxInt8 ? `, AMX-INT8 ${(rates.amxInt8 / 1e9).toFixed(0)}` : ''}; read bandwidth re-reading a ` +
          `buffer of the step's bytes, the sizes in turn, best of 3 (bench/read-bw.c); a plain row ` +
          `${(rowMacs / 1e6).toFixed(2)} M multiply-adds; work counted over ${plain.steps} steps each, ` +
          `${plain.steps} more timed`,
      );
  }
  return out;
}

// ---- command line ----------------------------------------------------------------------------------------------
if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const fs = await import('node:fs');
  const { register } = await import('node:module');
  const { cpus } = await import('node:os');
  register('./native-timing-hooks.mjs', import.meta.url);
  const core = await import('@specd/core');
  const { isa } = await import('@specd/native');
  const { nativeTiming } = await import('./native-timing.mjs');
  const argv = process.argv.slice(2);
  const arg = (n, d) => (argv.indexOf(`--${n}`) >= 0 ? argv[argv.indexOf(`--${n}`) + 1] : d);
  const TARGET = arg('target', 'kimi');
  const dir = TARGET === 'kimi' ? 'kimi-k3-tiny' : 'smollm2-135m-instruct';
  const concs = arg('conc', '1,8').split(',').map(Number);
  const N = Number(arg('prompts', '16'));
  const NEW = Number(arg('tokens', '64'));
  const target = await core.loadTarget(path.join(ROOT, 'models', dir), core.BUILTIN_PLUGIN_PACKAGES);
  const drafters = [];
  for (const m of arg('drafters', 'eagle3').split(','))
    drafters.push(
      (
        await core.loadDrafter(
          path.join(ROOT, 'models', `${dir}-${m}`),
          core.BUILTIN_PLUGIN_PACKAGES,
          target,
          4096,
          Math.max(...concs),
        )
      ).drafter,
    );
  const sets =
    TARGET === 'kimi' ? ['test/prompts', 'prose', 'code'] : ['tools/reference/smollm2/prompts', 'chat', 'plain'];
  const read = (n) =>
    fs
      .readFileSync(path.join(ROOT, sets[0], `${n}.jsonl`), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l).prompt_token_ids);
  const prompts = [...read(sets[1]).slice(0, Math.ceil(N / 2)), ...read(sets[2]).slice(0, N - Math.ceil(N / 2))];
  // a_j: a max-k run at one sequence, greedy with EOS ignored (`--settings 0`, the default), or at the target's default
  // sampling (its generation_config.json, as `specd serve` reads it) with EOS honoured (`--settings defaults`)
  const SETTING = arg('settings', '0');
  if (SETTING !== '0' && SETTING !== 'defaults')
    throw new Error(`bench:spec-bound: --settings: expected 0 or defaults, got ${SETTING}`);
  const sampling =
    SETTING === '0'
      ? { temperature: 0 }
      : defaultSampling(core.readModelSamplingDefaults(path.join(ROOT, 'models', dir)));
  console.log(
    `bench:spec-bound: acceptance measured at ${JSON.stringify(sampling)}, ` +
      `EOS ${SETTING === '0' ? 'ignored' : 'honoured'}`,
  );
  const acceptance = new Map();
  for (const d of drafters) {
    const e = new core.SpecEngine(target.model, d, { maxSequences: 1, maxTokensPerSequence: 4096, draftPolicy: 'max' });
    e.run(
      prompts.map((p, i) => ({
        id: `tau-${i}`,
        promptIds: Int32Array.from(p),
        maxTokens: NEW,
        sampling,
        seed: 1000 + i,
        ignoreEos: SETTING === '0',
      })),
    );
    acceptance.set(d, e.metrics.perPositionAcceptance);
    e.dispose();
  }
  const info = isa();
  printBounds({
    core,
    nativeTiming,
    target,
    drafters,
    prompts,
    concs,
    threads: info.threads,
    amx: info.amxAvailable && info.isa === 'avx512',
    perPositionOf: (d) => acceptance.get(d),
    labelOf: (d) => d.method,
    cpu: `${cpus()[0]?.model.trim()}, ${info.isa}${info.amxAvailable ? ' + AMX' : ''}, ${info.threads} threads`,
    acceptanceAt: SETTING === '0' ? 'greedy' : `at the defaults ${JSON.stringify(sampling)}, EOS honoured`,
  });
  for (const d of drafters) d.dispose();
  target.model.dispose();
}
