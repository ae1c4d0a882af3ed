// Where a batch step's time goes at C concurrent sequences: plain decoding and fixed draft lengths of one drafter,
// every native call of the engine's loop timed and attributed to the phase it ran in (issue 16: "engine or JS
// overhead is not a physical limit": this names what is not physics). Bench-only.
//
//   node bench/batch-phases.mjs [--target kimi|smollm2] [--drafter eagle3] [--conc 8] [--ks plain,1]
//                               [--prompts 64] [--tokens 128] [--reps 1] [--top 12] [--json FILE]
//                               [--sampling greedy|defaults] [--shapes]
//
// One process: the target and the drafter are loaded once; one engine per entry of `--ks` ('plain': no drafter;
// K >= 0: the drafter with `fixedDraftPolicy(K)`, every sequence drafting K tokens at every step it can; 'cost': the
// drafter with the engine's default cost policy, calibrated before the warm-up, the calibration not timed). Each engine
// first runs C prompts (warm-up, not timed), then `--reps` times all `--prompts` prompts, C at a time (the engine's
// continuous batching), 128 new tokens, greedy (`--sampling defaults`: the target's generation_config.json defaults,
// as `specd serve` reads them, one seed a request), EOS ignored; the engines alternate per repetition. Prompts:
// SmolLM2 — tools/reference/smollm2/prompts/{chat,plain}.jsonl alternately (chat template applied); kimi —
// test/prompts/{prose,code}.jsonl alternately. Models: models/<target> and models/<target>-<drafter>.
//
// Phases (wall time of the calls, µs per batch step = per verify forward):
//   verify    the target's forwards in which every sequence decodes (plain steps and verify blocks)
//   prefill   the target's forwards with a prefill chunk (a new request joining the batch)
//   propose   the drafter's propose
//   project   the drafter's projection of the target's taps (projectTargetHiddenPartial)
//   ctxkv     the drafter's draft-context K/V writes (writeProjectedContextKV; EAGLE-3 also catches up lazily there)
//   commit    the target's commits of partly accepted blocks (commitPrefixes / commitPrefix: KDA replays)
//   rest      the run's wall time outside those: the engine's loop, acceptance, sampling, bookkeeping (JavaScript)
// Inside each phase, every synchronous kernel of '@specd/native' (bench/native-timing.mjs) by name (`--shapes`:
// gemmQuant also by weight shape and rows, `gemmQuant:NxK:mM`); a phase's time beyond its kernels is JavaScript.
// "decode" = the wall time less prefill: the same requests' tokens, so ×plain = plain's decode time ÷ this engine's
// (> 1: faster than plain decoding).
import * as fs from 'node:fs';
import { cpus, loadavg } from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { defaultSampling, promptSets } from './prompts.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** Phases in print order (module comment). */
export const PHASES = ['verify', 'prefill', 'propose', 'project', 'ctxkv', 'commit'];

/**
 * The per-step view of measured runs.
 * @param runs [{ name, steps, wallMs, phaseMs: { [phase]: ms }, kernelMs: { ['phase:kernel']: { ms, calls } } }]:
 *   one per engine, the first the baseline ('plain'); steps = verify forwards (> 0), times in ms over the whole run.
 * @returns { engines: [{ name, steps, stepUs, decodeUs, decodeMs, vsFirst, phasesUs: { [phase|'rest']: µs },
 *   kernels: [{ phase, kernel, us, calls, usPerCall }] (µs and calls per step, by time descending) }] }: stepUs =
 *   wall ÷ steps; decodeUs = (wall − prefill) ÷ steps; vsFirst = the first engine's decode ms ÷ this one's.
 * @throws {RangeError} on an empty list or a run without steps.
 */
export function phaseTable(runs) {
  if (!Array.isArray(runs) || runs.length === 0) throw new RangeError('phaseTable: expected at least one run');
  const decodeMs = (r) => r.wallMs - (r.phaseMs.prefill ?? 0);
  const base = decodeMs(runs[0]);
  const engines = runs.map((r) => {
    if (!(r.steps > 0)) throw new RangeError(`phaseTable: run ${r.name}: expected steps > 0, got ${r.steps}`);
    const perStep = (ms) => (1000 * ms) / r.steps;
    const phasesUs = {};
    let inPhases = 0;
    for (const p of PHASES) {
      phasesUs[p] = perStep(r.phaseMs[p] ?? 0);
      inPhases += r.phaseMs[p] ?? 0;
    }
    phasesUs.rest = perStep(r.wallMs - inPhases);
    const kernels = Object.entries(r.kernelMs)
      .map(([key, v]) => {
        const at = key.indexOf(':');
        return {
          phase: key.slice(0, at),
          kernel: key.slice(at + 1),
          us: perStep(v.ms),
          calls: v.calls / r.steps,
          usPerCall: (1000 * v.ms) / v.calls,
        };
      })
      .sort((a, b) => b.us - a.us);
    return {
      name: r.name,
      steps: r.steps,
      stepUs: perStep(r.wallMs),
      decodeUs: perStep(decodeMs(r)),
      decodeMs: decodeMs(r),
      vsFirst: base / decodeMs(r),
      phasesUs,
      kernels,
    };
  });
  return { engines };
}

/** Markdown lines of {@link phaseTable}'s result: the phases, then each engine's `top` kernels by time. */
export function formatPhaseTable(table, top = 12) {
  const es = table.engines;
  const f = (x) => Math.round(x).toLocaleString('en-US');
  const lines = [
    `| µs a batch step | ${es.map((e) => e.name).join(' | ')} |`,
    `|---|${es.map(() => '---:').join('|')}|`,
  ];
  for (const p of [...PHASES, 'rest']) lines.push(`| ${p} | ${es.map((e) => f(e.phasesUs[p])).join(' | ')} |`);
  lines.push(`| **step (wall)** | ${es.map((e) => `**${f(e.stepUs)}**`).join(' | ')} |`);
  lines.push(`| decode step (prefill left out) | ${es.map((e) => f(e.decodeUs)).join(' | ')} |`);
  lines.push(`| batch steps | ${es.map((e) => e.steps).join(' | ')} |`);
  lines.push(`| decode time ×${es[0].name} | ${es.map((e) => `×${e.vsFirst.toFixed(3)}`).join(' | ')} |`);
  for (const e of es) {
    lines.push('', `${e.name}: the ${top} kernels that took the most time (µs a batch step, calls a step, µs a call):`);
    for (const k of e.kernels.slice(0, top))
      lines.push(
        `  ${k.phase}:${k.kernel} ${k.us.toFixed(1)} µs, ${k.calls.toFixed(1)} calls, ` +
          `${k.usPerCall.toFixed(1)} µs/call`,
      );
  }
  return lines;
}

// ---- command line ----------------------------------------------------------------------------------------------
if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const { register } = await import('node:module');
  // the native timing shim must be in place before the packages are imported
  register('./native-timing-hooks.mjs', import.meta.url);
  const { BUILTIN_PLUGIN_PACKAGES, SpecEngine, fixedDraftPolicy, loadDrafter, loadTarget, readModelSamplingDefaults } =
    await import('@specd/core');
  const { isa } = await import('@specd/native');
  const { nativeTiming } = await import('./native-timing.mjs');
  const argv = process.argv.slice(2);
  const arg = (n, d) => (argv.indexOf(`--${n}`) >= 0 ? argv[argv.indexOf(`--${n}`) + 1] : d);
  const TARGET = arg('target', 'kimi');
  if (TARGET !== 'kimi' && TARGET !== 'smollm2')
    throw new Error(`bench:batch-phases: --target ${TARGET}: kimi or smollm2`);
  const dir = TARGET === 'kimi' ? 'kimi-k3-tiny' : 'smollm2-135m-instruct';
  const DRAFTER = arg('drafter', 'eagle3');
  const C = Number(arg('conc', '8'));
  const KS = arg('ks', 'plain,1').split(',');
  for (const k of KS)
    if (k !== 'plain' && k !== 'cost' && !(Number.isSafeInteger(Number(k)) && Number(k) >= 0))
      throw new Error(`bench:batch-phases: --ks: expected 'plain', 'cost' or integers >= 0, got ${k}`);
  const N = Number(arg('prompts', '64'));
  const NEW = Number(arg('tokens', '128'));
  const REPS = Number(arg('reps', '1'));
  const TOP = Number(arg('top', '12'));
  const SHAPES = argv.includes('--shapes');
  const SAMPLING = arg('sampling', 'greedy');
  if (SAMPLING !== 'greedy' && SAMPLING !== 'defaults')
    throw new Error(`bench:batch-phases: --sampling ${SAMPLING}: greedy or defaults`);
  for (const [name, v] of [
    ['conc', C],
    ['prompts', N],
    ['tokens', NEW],
    ['reps', REPS],
  ])
    if (!(Number.isSafeInteger(v) && v >= 1))
      throw new Error(`bench:batch-phases: --${name}: expected an integer >= 1`);

  const target = await loadTarget(path.join(ROOT, 'models', dir), BUILTIN_PLUGIN_PACKAGES);
  const maxTokensPerSequence = 2048;
  const { drafter } = await loadDrafter(
    path.join(ROOT, 'models', `${dir}-${DRAFTER}`),
    BUILTIN_PLUGIN_PACKAGES,
    target,
    maxTokensPerSequence,
    C,
  );
  const sampling =
    SAMPLING === 'greedy'
      ? { temperature: 0 }
      : defaultSampling(readModelSamplingDefaults(path.join(ROOT, 'models', dir)));
  const samplingName =
    SAMPLING === 'greedy'
      ? 'greedy'
      : `defaults (T ${sampling.temperature}, top_p ${sampling.topP}` +
        `${sampling.topK > 0 ? `, top_k ${sampling.topK}` : ''})`;
  const sets = promptSets(TARGET);
  const prompts = Array.from({ length: N }, (_, i) => sets[i % 2][(i >> 1) % sets[i % 2].length]);

  // phase attribution: the phase a call runs in, and the engine whose run is being timed. A phase entered inside
  // another (a drafter method calling another) keeps its own time: the outer one is charged the rest (exclusive).
  let phase = 'rest';
  let acc; // the timed engine's { phaseMs }, or undefined while warming up
  const open = []; // nested phases: the time their inner phases took, ms
  const timePhase = (label, f) => {
    const prev = phase;
    phase = label;
    open.push(0);
    const t0 = performance.now();
    try {
      return f();
    } finally {
      const ms = performance.now() - t0;
      const inner = open.pop();
      if (open.length > 0) open[open.length - 1] += ms;
      if (acc !== undefined) acc.phaseMs[label] = (acc.phaseMs[label] ?? 0) + ms - inner;
      phase = prev;
    }
  };
  const wrap = (obj, method, label) => {
    if (typeof obj[method] !== 'function') return;
    const f = obj[method].bind(obj);
    obj[method] = (...a) => timePhase(label, () => f(...a));
  };
  wrap(drafter, 'propose', 'propose');
  wrap(drafter, 'projectTargetHiddenPartial', 'project');
  wrap(drafter, 'writeProjectedContextKV', 'ctxkv');
  wrap(target.model, 'commitPrefixes', 'commit');
  wrap(target.model, 'commitPrefix', 'commit');
  const forward = target.model.forward.bind(target.model);
  target.model.forward = (batch, ...rest) =>
    timePhase(batch.sequences.every((s) => s.phase !== 'prefill') ? 'verify' : 'prefill', () =>
      forward(batch, ...rest),
    );
  // --shapes: gemmQuant by weight shape and rows (`gemmQuant:NxK:mM`)
  nativeTiming.classify = (name, a) =>
    SHAPES && name === 'gemmQuant' ? `${phase}:${name}:${a[2].n}x${a[2].k}:m${a[1]}` : `${phase}:${name}`;

  const opts = { maxSequences: C, maxTokensPerSequence };
  /** The default cost policy, calibrated now, before the warm-up (nothing is timed yet). */
  const costEngine = () => {
    const e = new SpecEngine(target.model, drafter, { ...opts, draftPolicy: 'cost' });
    e.calibrate();
    return e;
  };
  const engines = KS.map((k) => ({
    name: k === 'plain' || k === 'cost' ? k : `k = ${k}`,
    engine:
      k === 'plain'
        ? new SpecEngine(target.model, undefined, opts)
        : k === 'cost'
          ? costEngine()
          : new SpecEngine(target.model, drafter, { ...opts, draftPolicy: fixedDraftPolicy(Number(k)) }),
    steps: 0,
    wallMs: 0,
    phaseMs: {},
    kernelMs: {},
  }));
  let id = 0;
  const requests = (ps) =>
    ps.map((p, i) => ({
      id: `b${id++}`,
      promptIds: Int32Array.from(p.prompt_token_ids),
      maxTokens: NEW,
      sampling,
      seed: 1000 + i, // the same seeds for every engine
      ignoreEos: true,
    }));
  const info = isa();
  const [l1, l5] = loadavg();
  console.log(
    `bench:batch-phases — ${dir} + ${DRAFTER}; ${C} sequences; engines ${engines.map((e) => e.name).join(', ')}; ` +
      `${N} prompts × ${NEW} tokens, ${samplingName}, ${REPS} rep(s); threads ${info.threads}, isa ${info.isa}` +
      `${info.amxAvailable ? ' + AMX' : ''}, ${cpus().length} vCPUs (${cpus()[0]?.model ?? '?'}); ` +
      `load ${l1.toFixed(2)} / ${l5.toFixed(2)} (1/5 min)`,
  );
  for (const e of engines) e.engine.run(requests(prompts.slice(0, C)));
  for (let rep = 0; rep < REPS; rep++)
    for (const e of engines) {
      nativeTiming.reset();
      nativeTiming.enabled = true;
      acc = e;
      const steps0 = e.engine.metrics.verifyForwards;
      const t0 = performance.now();
      e.engine.run(requests(prompts));
      e.wallMs += performance.now() - t0;
      acc = undefined;
      nativeTiming.enabled = false;
      e.steps += e.engine.metrics.verifyForwards - steps0;
      for (const [key, v] of nativeTiming.totals) {
        const k = e.kernelMs[key] ?? { ms: 0, calls: 0 };
        e.kernelMs[key] = { ms: k.ms + v.ms, calls: k.calls + v.calls };
      }
    }
  const table = phaseTable(engines);
  for (const line of formatPhaseTable(table, TOP)) console.log(line);
  const jsonOut = arg('json', undefined);
  if (jsonOut !== undefined) {
    const meta = { target: dir, drafter: DRAFTER, conc: C, prompts: N, tokens: NEW, reps: REPS, isa: info };
    fs.writeFileSync(jsonOut, `${JSON.stringify({ ...meta, ...table }, null, 1)}\n`);
  }
}
