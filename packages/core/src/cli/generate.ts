/**
 * Generation on a loaded target (runtime/: `loadParallelTarget`, `loadDrafter`): plain and
 * speculative generation both run the spec-decode engine (propose → verify → accept → commit;
 * without a drafter every step is a plain decode step, one token per forward, greedy or seeded
 * sampling; the prompt is prefilled in chunks). What `specd generate` runs.
 */

import { SpecEngine } from '../engine/engine.js';
import type { SpecRequest } from '../engine/types.js';
import type { RequestMetrics } from '../engine/metrics.js';
import type { SamplingParams } from '../engine/types.js';
import type { Drafter } from '../plugin/drafter-plugin.js';
import type { LoadedTarget } from '../runtime/target.js';

/** Tokens per prefill forward. */
export const PREFILL_CHUNK_TOKENS = 64;
/** KV page size used by generate. */
const PAGE_SIZE = 16;

/** Options of {@link generateTokens}. */
export interface GenerateOptions {
  readonly promptIds: Int32Array;
  /** New tokens at most (≥ 1). */
  readonly maxTokens: number;
  readonly sampling: SamplingParams;
  readonly seed: number;
  /**
   * The user fixed `seed` (`--seed`, or the config's `sampling.seed`): speculative generation under
   * the timing-based default policy then decodes a sampled request plainly (k = 0) so the output is
   * reproducible per seed ({@link SpecRequest.seeded}). Plain generation is reproducible regardless.
   */
  readonly seeded?: boolean;
  /** Keep going after EOS. */
  readonly ignoreEos?: boolean;
  /** Called with each new token id, in order. */
  readonly onToken?: (id: number) => void;
}

/** What {@link generateTokens} returns. */
export interface GenerateResult {
  readonly tokenIds: number[];
  /** Wall time of prefill + decode, seconds (loading excluded). */
  readonly seconds: number;
  /** True if generation stopped at an EOS token (included in tokenIds). */
  readonly stoppedAtEos: boolean;
}

/**
 * Generates up to `maxTokens` tokens after the prompt (prefill in {@link PREFILL_CHUNK_TOKENS}
 * chunks; one forward per new token): one request through {@link SpecEngine} without a drafter,
 * so plain decoding and speculative decoding share one decode loop and one sampler (probs.ts).
 * @throws {RangeError} for an empty prompt or a bad maxTokens.
 */
export function generateTokens(target: LoadedTarget, options: GenerateOptions): GenerateResult {
  const { promptIds, maxTokens } = options;
  if (promptIds.length === 0) throw new RangeError('generate: the prompt encodes to no tokens');
  if (!Number.isSafeInteger(maxTokens) || maxTokens < 1)
    throw new RangeError(`generate: maxTokens: expected an integer >= 1, got ${maxTokens}`);
  const engine = new SpecEngine(target.model, undefined, {
    maxSequences: 1,
    maxTokensPerSequence: promptIds.length + maxTokens + 1,
    pageSize: PAGE_SIZE,
    prefillChunk: PREFILL_CHUNK_TOKENS,
  });
  const t0 = performance.now();
  try {
    const [r] = engine.run([
      {
        id: 0,
        promptIds,
        maxTokens,
        sampling: options.sampling,
        seed: options.seed,
        ignoreEos: options.ignoreEos,
        eosTokenIds: target.eosTokenIds,
        onToken: options.onToken,
      },
    ]);
    if (r!.error !== undefined) throw r!.error;
    return { tokenIds: r!.tokenIds, seconds: (performance.now() - t0) / 1000, stoppedAtEos: r!.finishReason === 'eos' };
  } finally {
    engine.dispose(); // a failed decode step leaves the sequence running: free its cache
  }
}

/** What {@link generateSpeculative} returns: the plain result plus the spec-decode counters. */
export interface SpecGenerateResult extends GenerateResult {
  readonly metrics: RequestMetrics;
}

/**
 * {@link generateTokens} with speculative decoding (one request through {@link SpecEngine}).
 * Greedy output is token-for-token plain greedy decoding's; sampled output follows the same
 * distribution (rejection sampling) but not the same random stream (with `seeded` and no
 * `numDraftTokens` it decodes plainly, k = 0, reproducible per seed).
 * @throws {RangeError} for an empty prompt or a bad maxTokens.
 */
export function generateSpeculative(
  target: LoadedTarget,
  drafter: Drafter,
  options: GenerateOptions & { readonly numDraftTokens?: number },
): SpecGenerateResult {
  const { promptIds, maxTokens } = options;
  if (promptIds.length === 0) throw new RangeError('generate: the prompt encodes to no tokens');
  if (!Number.isSafeInteger(maxTokens) || maxTokens < 1)
    throw new RangeError(`generate: maxTokens: expected an integer >= 1, got ${maxTokens}`);
  const engine = new SpecEngine(target.model, drafter, {
    maxSequences: 1,
    maxTokensPerSequence: promptIds.length + maxTokens + drafter.maxDraftTokens + 1,
    pageSize: PAGE_SIZE,
    prefillChunk: PREFILL_CHUNK_TOKENS,
    ...(options.numDraftTokens === undefined ? {} : { draftLength: () => options.numDraftTokens! }),
  });
  // The cost policy measures draft/verify costs once per process; that is start-up (like loading),
  // not generation, so it happens before the clock starts.
  engine.calibrate();
  const t0 = performance.now();
  const [r] = engine.run([
    {
      id: 0,
      promptIds,
      maxTokens,
      sampling: options.sampling,
      seed: options.seed,
      seeded: options.seeded,
      ignoreEos: options.ignoreEos,
      eosTokenIds: target.eosTokenIds,
      onToken: options.onToken,
    },
  ]);
  if (r!.error !== undefined) throw r!.error;
  return {
    tokenIds: r!.tokenIds,
    seconds: (performance.now() - t0) / 1000,
    stoppedAtEos: r!.finishReason === 'eos',
    metrics: r!.metrics,
  };
}
