/**
 * Draft-length policies for {@link SpecEngineOptions.draftLength}: how many drafts a sequence
 * verifies this step. Shorter blocks cost less to verify (fewer target rows) but cap the tokens a
 * step can commit; the policy follows each request's recent acceptance.
 */

import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { RequestMetrics } from './metrics.js';

/** Options of {@link adaptiveDraftLength}. */
export interface AdaptiveDraftLengthOptions {
  /** Fewest drafts (≥ 1; default 2). */
  readonly min?: number;
  /** Most drafts (default: the drafter's maximum — the engine clamps). */
  readonly max?: number;
  /** Weight of the newest step in the moving average of accepted drafts, (0, 1] (default 0.5). */
  readonly alpha?: number;
  /** Drafts beyond the expected accepted count (default 2). */
  readonly margin?: number;
}

/**
 * A per-request policy: k = clamp(round(EMA(accepted per step)) + margin, min, max), starting at
 * `max`. Pure bookkeeping on the request's metrics: it never sees tokens, so it cannot affect
 * which tokens are committed (losslessness holds for any k).
 */
export function adaptiveDraftLength(
  options: AdaptiveDraftLengthOptions = {},
): (id: SequenceId, metrics: RequestMetrics) => number {
  const min = options.min ?? 2;
  const max = options.max ?? Number.MAX_SAFE_INTEGER;
  const alpha = options.alpha ?? 0.5;
  const margin = options.margin ?? 2;
  if (!(Number.isInteger(min) && min >= 1 && max >= min))
    throw new RangeError(`adaptiveDraftLength: expected integers 1 <= min <= max, got min ${min}, max ${max}`);
  if (!(alpha > 0 && alpha <= 1)) throw new RangeError(`adaptiveDraftLength: alpha: expected (0, 1], got ${alpha}`);
  const state = new Map<SequenceId, { steps: number; accepted: number; ema: number }>();
  return (id, m) => {
    let s = state.get(id);
    if (s === undefined || m.verifySteps < s.steps) {
      s = { steps: m.verifySteps, accepted: m.accepted, ema: Number.NaN };
      state.set(id, s);
    }
    if (m.verifySteps > s.steps) {
      const last = (m.accepted - s.accepted) / (m.verifySteps - s.steps);
      s.ema = Number.isNaN(s.ema) ? last : alpha * last + (1 - alpha) * s.ema;
      s.steps = m.verifySteps;
      s.accepted = m.accepted;
    }
    if (Number.isNaN(s.ema)) return max;
    return Math.max(min, Math.min(max, Math.round(s.ema) + margin));
  };
}
