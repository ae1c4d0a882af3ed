// bench:spec's draft-cost split: where one propose's time goes, per drafter and draft length k, on a scratch
// sequence with a real draft context (the target's prefill taps → projection → draft KV, as calibrateStepCosts).
//
//   layers    the block forward (DFlash / DSpark `runBlocks`: embedding, draft layers, final norm), of which the
//             native calls by family (bench/native-timing.mjs: GEMM, attention, the rest) and the JS between them;
//   lm_head   the draft head's logits (`draftHead.logits`: the target's lm_head `[k, V]`, or FR-Spec's packed rows
//             `[k, Vd]`); drafters without a draft head: the target's `lmHead` calls;
//   sampling  choosing the drafts from the logits (`draftHead.drafts`: argmax, or q and a draw);
//   JS rest   propose's own work outside those (argument checks, row copies; EAGLE-3: all of its chain loop).
// The target step (one decode token, logits of its row, the drafter's taps) is timed in the same alternation, so
// every figure is also a ratio to it. Each round visits the step and every k; reported: the fastest round of each k
// (its parts add up) and the fastest step, with the medians beside them (a shared VM preempts at random).
import { nativeTiming } from './native-timing.mjs';
import { median } from './stats.mjs';

/** The part of a propose running now: the native timer files each call under it (`${phase}:${family}`). */
let phase = 'rest';

/** Wraps `obj[name]` (an own or inherited method): its time adds into `acc.ms`, its native calls go to `part`. */
function timeMethod(obj, name, acc, part) {
  const orig = obj[name];
  obj[name] = function timed(...args) {
    const outer = phase;
    phase = part;
    const t0 = performance.now();
    try {
      return orig.apply(this, args);
    } finally {
      acc.ms += performance.now() - t0;
      phase = outer;
    }
  };
  return () => {
    delete obj[name];
    if (obj[name] !== orig) obj[name] = orig;
  };
}

/** Native family of a timed call, filed under the running part. */
function classify(name) {
  const fam = name.startsWith('gemm')
    ? 'gemm'
    : name === 'pagedAttention' || name === 'writeKvPages'
      ? 'attention'
      : 'other';
  return `${phase}:${fam}`;
}

/**
 * Splits the propose time of `drafter` (bound to `target.model`) at draft lengths `ks` (1 sequence, greedy).
 * @param core `@specd/core` (its `SequenceCache`, `SeededRandom`), imported after the timing hook.
 * @returns `{ stepMs, stepMedianMs, rows: [{ k, totalMs, medianMs, layersMs, gemmMs, attentionMs, otherNativeMs,
 *   layersJsMs, headMs, samplingMs, restMs }] }`, ms per propose (the fastest round's; medianMs: the median total).
 */
export function draftCostSplit(core, target, drafter, ks, { reps = 15, contextTokens = 64 } = {}) {
  const m = target.model;
  const D = m.info.hiddenSize;
  const P = contextTokens;
  const V = m.info.vocabSize;
  const cache = new core.SequenceCache(m.cacheGeometry, {
    pageSize: 16,
    numPages: Math.ceil((P + 64) / 16) + 2,
    numSlots: 1,
  });
  const id = '__draft_split';
  const prompt = Int32Array.from({ length: P }, (_, i) => 2 + ((3 + 7 * i) % Math.max(1, V - 4)));
  const taps = drafter.captureSetter(m.info);
  cache.add(id);
  drafter.addSequence(id);
  const undo = [];
  try {
    const res = m.forward(
      { sequences: [{ id, position: 0, tokens: prompt, logits: 'none', phase: 'prefill' }] },
      cache,
      {
        taps,
      },
    );
    const sum = drafter.projectTargetHiddenPartial(
      new Map([...res.taps].map(([t, h]) => [t, h.subarray(0, P * D)])),
      P,
      res.projection?.slice(0, P * D),
    );
    drafter.writeProjectedContextKV(sum, [{ id, position: 0, numTokens: P, nextTokens: prompt }]);
    const acc = { layers: { ms: 0 }, head: { ms: 0 }, sampling: { ms: 0 } };
    const backbone = drafter.backbone ?? drafter;
    if (typeof backbone.runBlocks === 'function') undo.push(timeMethod(backbone, 'runBlocks', acc.layers, 'layers'));
    const head = backbone.draftHead;
    if (head !== undefined) {
      undo.push(timeMethod(head, 'logits', acc.head, 'head'));
      undo.push(timeMethod(head, 'drafts', acc.sampling, 'sampling'));
    } else {
      undo.push(timeMethod(m, 'lmHead', acc.head, 'head'));
    }
    const rng = new core.SeededRandom(1);
    const propose = (k) =>
      drafter.propose({
        sequences: [
          {
            id,
            position: P,
            lastToken: prompt[P - 1],
            maxDrafts: k,
            history: prompt,
            sampling: { temperature: 0 },
            rng,
          },
        ],
      });
    const step = () => {
      const cp = cache.checkpoint(id);
      m.forward({ sequences: [{ id, position: P, tokens: prompt.subarray(0, 1), logits: 'all' }] }, cache, { taps });
      cache.rollback(id, cp);
    };
    const per = ks.map(() => []);
    const steps = [];
    const prevClassify = nativeTiming.classify;
    nativeTiming.classify = classify;
    for (let r = 0; r < reps + 2; r++) {
      const t0 = performance.now();
      step();
      if (r >= 2) steps.push(performance.now() - t0);
      ks.forEach((k, i) => {
        for (const a of Object.values(acc)) a.ms = 0;
        nativeTiming.reset();
        nativeTiming.enabled = true;
        const t1 = performance.now();
        propose(k);
        const totalMs = performance.now() - t1;
        nativeTiming.enabled = false;
        const nat = (f) => nativeTiming.totals.get(`layers:${f}`)?.ms ?? 0;
        if (r >= 2)
          per[i].push({
            totalMs,
            acc: Object.fromEntries(Object.entries(acc).map(([n, a]) => [n, a.ms])),
            gemm: nat('gemm'),
            attention: nat('attention'),
            other: nat('other'),
          });
      });
    }
    nativeTiming.classify = prevClassify;
    // the least disturbed round of each k (on a shared VM other processes preempt at random: the fastest round's
    // parts add up and are the closest to the machine's own cost), and the fastest target step
    const rows = ks.map((k, i) => {
      const x = per[i].reduce((a, b) => (b.totalMs < a.totalMs ? b : a));
      const layersMs = x.acc.layers;
      return {
        k,
        totalMs: x.totalMs,
        medianMs: median(per[i].map((y) => y.totalMs)),
        layersMs,
        gemmMs: x.gemm,
        attentionMs: x.attention,
        otherNativeMs: x.other,
        layersJsMs: Math.max(0, layersMs - x.gemm - x.attention - x.other),
        headMs: x.acc.head,
        samplingMs: x.acc.sampling,
        restMs: Math.max(0, x.totalMs - layersMs - x.acc.head - x.acc.sampling),
      };
    });
    return { stepMs: Math.min(...steps), stepMedianMs: median(steps), rows };
  } finally {
    for (const u of undo.reverse()) u();
    drafter.freeSequence(id);
    cache.abort(id);
  }
}
