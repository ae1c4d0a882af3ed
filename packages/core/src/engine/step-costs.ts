/**
 * Measured step costs for the cost-based draft length ({@link CostDraftPolicy}): on this machine,
 * thread count and commit mode, how long a target verify forward of `b` sequences × (k + 1) tokens
 * takes (`verifyMs`), and how long the drafter's propose of k drafts for `b` sequences takes
 * (`draftMs`), for a few batch-size buckets b and draft lengths k (lower median of a few repetitions).
 * k = 0 is a plain decode step (one token per sequence, no propose). REFERENCE.md §11: the speed-up
 * of speculation is bounded by τ(k)·t_step / (t_draft(k) + t_verify(k)).
 *
 * Calibration runs scratch sequences through the engine's own cache and drafter (prefill, then
 * timed propose / verify forwards undone by checkpoint + rollback), before any request is admitted,
 * and is cached per (target, drafter, threads, commit mode, buckets).
 */

import { isa } from '@specd/native';

import type { SequenceCache } from '../kv/sequence-cache.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { Drafter } from '../plugin/drafter-plugin.js';
import type { StageModel } from '../plugin/model-plugin.js';
import { SeededRandom } from './random.js';

/** Costs of one batch-size bucket. Immutable. */
export interface BucketCosts {
  /** Sequences in the batch. */
  readonly sequences: number;
  /** Draft lengths measured, ascending, `ks[0] = 0`. */
  readonly ks: readonly number[];
  /** `verifyMs[i]`: one target forward of `sequences` × (ks[i] + 1) tokens, logits for every row, ms. */
  readonly verifyMs: readonly number[];
  /** `draftMs[i]`: one propose of ks[i] drafts for each of `sequences` sequences, ms (0 at k = 0). */
  readonly draftMs: readonly number[];
  /**
   * The verify cost by the batch's total rows T (ascending, from `sequences`), `verifyRowsMs[i]` ms for a forward of
   * `verifyRows[i]` rows: the uniform blocks above (T = sequences × (k + 1)) merged with partial ones (T = sequences
   * + d, d < sequences: d sequences verify one draft, the others none), as the batch rule spreads drafts. Absent:
   * the uniform points alone (linear in k between them).
   */
  readonly verifyRows?: readonly number[];
  readonly verifyRowsMs?: readonly number[];
}

/** Calibrated costs for every bucket, ascending by `sequences`. */
export class StepCosts {
  constructor(readonly buckets: readonly BucketCosts[]) {
    if (buckets.length === 0) throw new RangeError('StepCosts: buckets: expected at least one');
  }

  /** Plain decode step of `sequences` sequences (one token each), ms. */
  stepMs(sequences: number): number {
    return this.verifyMs(sequences, sequences);
  }

  /**
   * Verify forward of `sequences` sequences holding `tokens` rows in all (≥ sequences), ms: within a bucket by its
   * rows curve (`verifyRows`, at the same drafts per sequence), else linear in k; between buckets linear in the
   * batch size.
   */
  verifyMs(sequences: number, tokens: number): number {
    const k = tokens / sequences - 1;
    return this.interpolateBy(sequences, (b) =>
      b.verifyRows !== undefined && b.verifyRowsMs !== undefined
        ? interpolate1(b.verifyRows, b.verifyRowsMs, b.sequences * (k + 1))
        : interpolate1(b.ks, b.verifyMs, k),
    );
  }

  /** Propose for `sequences` drafting sequences, `drafts` drafts in all, ms (0 when nothing is drafted). */
  draftMs(sequences: number, drafts: number): number {
    if (sequences === 0 || drafts === 0) return 0;
    return this.interpolate(sequences, drafts / sequences, (b) => b.draftMs);
  }

  /** Linear in k within a bucket, then linear in the batch size between buckets (clamped at the ends). */
  private interpolate(sequences: number, k: number, of: (b: BucketCosts) => readonly number[]): number {
    return this.interpolateBy(sequences, (b) => interpolate1(b.ks, of(b), k));
  }

  /** `at(bucket)` linear in the batch size between buckets (scaled by the batch size beyond the ends). */
  private interpolateBy(sequences: number, at: (b: BucketCosts) => number): number {
    const bs = this.buckets;
    if (sequences <= bs[0]!.sequences) return at(bs[0]!) * (sequences / bs[0]!.sequences);
    for (let i = 1; i < bs.length; i++) {
      const lo = bs[i - 1]!,
        hi = bs[i]!;
      if (sequences <= hi.sequences) {
        const f = (sequences - lo.sequences) / (hi.sequences - lo.sequences);
        return at(lo) * (1 - f) + at(hi) * f;
      }
    }
    const last = bs[bs.length - 1]!;
    return at(last) * (sequences / last.sequences);
  }

  /** A plain JSON view (benches print it). */
  toJSON(): unknown {
    return this.buckets;
  }
}

function interpolate1(xs: readonly number[], ys: readonly number[], x: number): number {
  if (x <= xs[0]!) return ys[0]!;
  for (let i = 1; i < xs.length; i++) {
    if (x <= xs[i]!) {
      const f = (x - xs[i - 1]!) / (xs[i]! - xs[i - 1]!);
      return ys[i - 1]! * (1 - f) + ys[i]! * f;
    }
  }
  const n = xs.length;
  if (n < 2) return ys[n - 1]!;
  const slope = (ys[n - 1]! - ys[n - 2]!) / (xs[n - 1]! - xs[n - 2]!);
  return ys[n - 1]! + slope * (x - xs[n - 1]!);
}

/** Options of {@link calibrateStepCosts}. */
export interface CalibrateOptions {
  /** Largest batch measured (the engine's maxSequences). */
  readonly maxSequences: number;
  /** Largest draft length (the drafter's maxDraftTokens). */
  readonly maxDrafts: number;
  /** Whether verify forwards keep per-token linear-state snapshots (the engine's commit mode). */
  readonly stateSnapshots: boolean;
  /** Tap ids the engine captures (verify forwards capture them too). */
  readonly taps: readonly number[];
  /**
   * Repetitions per point, the lower median is kept (default 5, after 2 warm-up rounds; 1 from the second bucket on).
   */
  readonly repetitions?: number;
  /**
   * Wall-time budget per batch-size bucket, ms (default 1500): once a bucket has kept one full
   * round and spent this long, its remaining repetitions are skipped (large buckets of a slow target
   * otherwise hold a server's start-up for tens of seconds; the policy's online recalibration
   * corrects the scale of a noisier measurement).
   */
  readonly bucketBudgetMs?: number;
  /** Scratch prompt tokens per sequence (default 32). */
  readonly contextTokens?: number;
  /**
   * Wall-time budget per bucket for re-timing the verify points that jumped ({@link recheckJumps}), ms (default 500;
   * 0: no re-check).
   */
  readonly recheckBudgetMs?: number;
}

const cache = new WeakMap<Drafter, Map<string, StepCosts>>();

/** Batch-size buckets measured: 1, 2, 4, … and maxSequences. */
export function costBuckets(maxSequences: number): number[] {
  const out: number[] = [];
  for (let b = 1; b < maxSequences; b *= 2) out.push(b);
  out.push(maxSequences);
  return out;
}

/**
 * The non-decreasing sequence closest to `ys` in least squares (isotonic regression by pool-adjacent-violators:
 * Barlow et al., "Statistical Inference under Order Restrictions", 1972): a run of points that decreases is replaced
 * by its mean. `[n]` → `[n]`.
 */
export function isotonic(ys: readonly number[]): number[] {
  const blocks: { sum: number; n: number }[] = [];
  for (const y of ys) {
    let block = { sum: y, n: 1 };
    for (
      let prev = blocks.at(-1);
      prev !== undefined && prev.sum / prev.n > block.sum / block.n;
      prev = blocks.at(-1)
    ) {
      blocks.pop();
      block = { sum: prev.sum + block.sum, n: prev.n + block.n };
    }
    blocks.push(block);
  }
  return blocks.flatMap((b) => new Array<number>(b.n).fill(b.sum / b.n));
}

/** The lower median of `xs` (the lower of the two middle values for an even count). @throws RangeError on `[]`. */
export function lowerMedian(xs: readonly number[]): number {
  if (xs.length === 0) throw new RangeError('lowerMedian: no samples');
  return [...xs].sort((a, b) => a - b)[(xs.length - 1) >> 1]!;
}

/** A verify point of a calibration bucket: its rows in all, its timed samples and those of a re-check (ms). */
export interface VerifyPoint {
  readonly rows: number;
  readonly samples: number[];
  /** Samples taken by {@link recheckJumps}, beside the previous point's (empty unless it re-timed this point). */
  readonly fresh: number[];
}

/** A point's time: the lower median of its samples, or of its re-check's when that is lower (ms). */
export function pointMs(p: VerifyPoint): number {
  const ms = lowerMedian(p.samples);
  return p.fresh.length === 0 ? ms : Math.min(ms, lowerMedian(p.fresh));
}

/**
 * Re-times the verify points of one bucket whose time grew faster than their rows: with the points sorted by rows, a
 * point i is a jump when `pointMs(i) > jump × pointMs(i − 1) × rows(i) / rows(i − 1)` (a forward of more rows costs at
 * most proportionally more, but for the step of a kernel's tile size). Each jump and the point before it are timed
 * again, alternately, `perRound` times each round, into their `fresh` samples, for at most `rounds` rounds or until
 * `budgetMs` is spent; a jump that persists in its fresh samples is kept (a real tile boundary: SmolLM2 at 16
 * sequences, 17.1 → 19.8 ms from 16 to 17 rows), one that was load goes. Why: on a shared 2-vCPU host the start-up
 * calibration read EAGLE-3's 6-row verify at 17.3 ms after 9.8 ms for 5 rows, and 66.0 ms for 24 rows at 4 sequences
 * after 32.3 for 20 (bench:load, docs/BENCHMARKS.md): the cost policy then priced every deeper draft out, and the
 * online correction (draft-policy.ts costScale, one factor per kind of step) cannot see a spike at one shape it never
 * runs again.
 * @param points one bucket's points (any order); their `fresh` arrays are appended to.
 * @param time times one forward of the point's shape, ms.
 * @returns how many forwards it timed.
 */
export function recheckJumps<P extends VerifyPoint>(
  points: readonly P[],
  time: (p: P) => number,
  options: { jump?: number; rounds?: number; perRound?: number; budgetMs?: number; now?: () => number } = {},
): number {
  const { jump = 1.2, rounds = 3, perRound = 3, budgetMs = 500, now = () => performance.now() } = options;
  const sorted = [...points].sort((a, b) => a.rows - b.rows);
  const t0 = now();
  let timed = 0;
  for (let round = 0; round < rounds; round++) {
    const jumps: [P, P][] = [];
    for (let i = 1; i < sorted.length; i++) {
      const [prev, p] = [sorted[i - 1]!, sorted[i]!];
      if (pointMs(p) > jump * pointMs(prev) * (p.rows / prev.rows)) jumps.push([prev, p]);
    }
    if (jumps.length === 0) break;
    for (let r = 0; r < perRound; r++) {
      for (const [prev, p] of jumps) {
        if (now() - t0 > budgetMs) return timed;
        prev.fresh.push(time(prev));
        p.fresh.push(time(p));
        timed += 2;
      }
    }
  }
  return timed;
}

/** Drafting sequences of the partial verify blocks measured in a bucket of `sequences`: 1, 2, 4, … below it. */
export function partialDrafts(sequences: number): number[] {
  const out: number[] = [];
  for (let d = 1; d < sequences; d *= 2) out.push(d);
  return out;
}

/** Draft lengths measured: dense at small k, sparser above (the costs are close to linear in k). */
export function costDraftLengths(maxDrafts: number): number[] {
  return [0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 24, 31]
    .filter((k) => k < maxDrafts)
    .concat(maxDrafts > 0 ? [maxDrafts] : []);
}

/**
 * Measures (or returns the cached) {@link StepCosts} using free sequences of `seqCache` and the
 * drafter: needs `maxSequences` free sequences; leaves the cache and the drafter as it found them.
 */
export function calibrateStepCosts(
  target: StageModel,
  drafter: Drafter,
  seqCache: SequenceCache,
  options: CalibrateOptions,
): StepCosts {
  const buckets = costBuckets(options.maxSequences);
  const ks = costDraftLengths(options.maxDrafts);
  const key = `${isa().threads}|${String(options.stateSnapshots)}|${buckets.join(',')}|${ks.join(',')}`;
  let perDrafter = cache.get(drafter);
  if (perDrafter === undefined) {
    perDrafter = new Map();
    cache.set(drafter, perDrafter);
  }
  const hit = perDrafter.get(key);
  if (hit !== undefined) return hit;
  const reps = options.repetitions ?? 5;
  const budgetMs = options.bucketBudgetMs ?? 1500;
  const P = options.contextTokens ?? 32;
  const vocab = target.info.vocabSize;
  const D = target.info.hiddenSize;
  const maxB = buckets[buckets.length - 1]!;
  const ids: SequenceId[] = Array.from({ length: maxB }, (_, i) => `__specd_cost_${i}`);
  const rng = new SeededRandom(1);
  const prompt = (s: number): Int32Array =>
    Int32Array.from({ length: P }, (_, i) => 2 + ((3 + 7 * i + 13 * s) % Math.max(1, vocab - 4)));
  const added: SequenceId[] = [];
  try {
    // Scratch sequences with a real draft context (prefill with taps → projection → draft KV).
    ids.forEach((id, s) => {
      seqCache.add(id);
      drafter.addSequence(id);
      added.push(id);
      const res = target.forward(
        { sequences: [{ id, position: 0, tokens: prompt(s), logits: 'none', phase: 'prefill' }] },
        seqCache,
        { taps: options.taps },
      );
      const sum = drafter.projectTargetHiddenPartial(
        new Map([...res.taps].map(([t, h]) => [t, h.subarray(0, P * D)])),
        P,
        res.projection?.slice(0, P * D),
      );
      const tokens = prompt(s);
      const next = new Int32Array(P);
      next.set(tokens.subarray(1));
      next[P - 1] = tokens[0]!; // any token: the scratch context only has to exist
      drafter.writeProjectedContextKV(sum, [{ id, position: 0, numTokens: P, nextTokens: next }]);
    });
    // the lower median: timing noise on a shared machine only adds time (preemption, GC), and a bucket cut short by
    // the budget keeps two samples, whose upper one was a spike's whenever there was one (bench:load saw a 16-sequence
    // bucket read 38 ms for 17 rows where 17.9 was measured in the next run)
    const median = lowerMedian;
    const recheckBudgetMs = options.recheckBudgetMs ?? 500;
    /**
     * One timed verify forward, sequence s holding 1 + drafts(s) rows (logits for every row, as the engine), ms. As a
     * greedy batch runs (`argmaxOnly`): a stage that computes the argmax on its device then returns no logits, and a
     * verify of k + 1 rows costs there what the engine's greedy steps pay (copying every row's logits back instead
     * made the GPU's verify look 0.1–0.2 ms dearer per 7 rows than it runs); other stages ignore the option.
     */
    const timeVerify = (seqs: readonly SequenceId[], drafts: (s: number) => number): number => {
      const cps = seqs.map((id) => ({ id, cp: seqCache.checkpoint(id) }));
      const fseqs = seqs.map((id, s) => {
        // Verify rows: the scratch prompt again (valid ids for any target; the cost of a row does
        // not depend on whether it would be accepted).
        const tokens = Int32Array.from({ length: drafts(s) + 1 }, (_, j) => prompt(s)[(P - 1 + j) % P]!);
        return { id, position: seqCache.length(id), tokens, logits: 'all' as const };
      });
      const t2 = performance.now();
      target.forward({ sequences: fseqs }, seqCache, {
        taps: options.taps,
        stateSnapshots: options.stateSnapshots && fseqs.some((f) => f.tokens.length > 1),
        argmaxOnly: true,
      }); // as the engine
      const ms = performance.now() - t2;
      for (const { id, cp } of cps) seqCache.rollback(id, cp);
      return ms;
    };
    const out: BucketCosts[] = [];
    for (const B of buckets) {
      const seqs = ids.slice(0, B);
      // per k: the verify and the propose times (ms)
      const times = ks.map((k) => ({ k, verify: [] as number[], draft: [] as number[] }));
      // partial blocks: d < B sequences verify one draft, the others none (T = B + d rows)
      const partial = ks.includes(1) ? partialDrafts(B).map((d) => ({ d, verify: [] as number[] })) : [];
      // Round-robin over k (every repetition visits every k), so a change in the machine's load
      // hits all k alike; the first `warmup` rounds are not kept (JIT, first-touch allocations:
      // two for the first bucket, one after it).
      const warmup = B === buckets[0] ? 2 : 1;
      const tBucket = performance.now();
      for (let r = 0; r < reps + warmup; r++) {
        if (r > warmup && performance.now() - tBucket > budgetMs) break;
        times.forEach(({ k, verify, draft }) => {
          if (k > 0) {
            const t0 = performance.now();
            const props = drafter.propose({
              sequences: seqs.map((id, s) => ({
                id,
                position: P,
                lastToken: prompt(s)[P - 1]!,
                maxDrafts: k,
                history: Int32Array.of(...prompt(s), prompt(s)[P - 1]!),
                sampling: { temperature: 0 },
                rng,
              })),
            });
            const t1 = performance.now();
            if (r >= warmup) draft.push(t1 - t0);
            if (props.length !== B)
              throw new Error(`calibrateStepCosts: propose returned ${props.length} proposals for ${B} sequences`);
          }
          const ms = timeVerify(seqs, () => k);
          if (r >= warmup) verify.push(ms);
        });
        partial.forEach(({ d, verify }) => {
          const ms = timeVerify(seqs, (s) => (s < d ? 1 : 0));
          if (r >= warmup) verify.push(ms);
        });
      }
      // A verify time that grew faster than its rows is timed again beside the point before it (recheckJumps).
      // each point with its drafts per sequence s
      type Point = VerifyPoint & { readonly drafts: (s: number) => number };
      const uniform: Point[] = times.map(({ k, verify }) => ({
        rows: B * (k + 1),
        samples: verify,
        fresh: [],
        drafts: () => k,
      }));
      const all: Point[] = [
        ...uniform,
        ...partial.map(({ d, verify }) => ({
          rows: B + d,
          samples: verify,
          fresh: [],
          drafts: (s: number) => (s < d ? 1 : 0),
        })),
      ];
      if (recheckBudgetMs > 0) recheckJumps(all, (p) => timeVerify(seqs, p.drafts), { budgetMs: recheckBudgetMs });
      // Medians, made non-decreasing in k (more rows never cost less) by the least-squares monotone fit: a noise
      // spike is pooled with the points after it instead of raising all of them (a running max would).
      const rawVerifyMs = uniform.map(pointMs);
      const verifyMs = isotonic(rawVerifyMs);
      const draftMs = [0, ...isotonic(times.slice(1).map((t) => median(t.draft)))];
      const points = all.map((p) => ({ rows: p.rows, ms: pointMs(p) })).sort((a, b) => a.rows - b.rows);
      const verifyRowsMs = isotonic(points.map((x) => x.ms));
      out.push({ sequences: B, ks, verifyMs, draftMs, verifyRows: points.map((x) => x.rows), verifyRowsMs });
    }
    const costs = new StepCosts(out);
    perDrafter.set(key, costs);
    return costs;
  } finally {
    for (const id of added) {
      seqCache.finish(id);
      drafter.freeSequence(id);
    }
  }
}
