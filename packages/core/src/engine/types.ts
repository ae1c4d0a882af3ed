/** The engine's request, result and option types, and its error class. */

import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { DraftSampling } from '../plugin/drafter-plugin.js';
import type { CostDraftPolicy, CostDraftPolicyOptions, DraftPolicy } from './draft-policy.js';
import type { TokenLogprob } from './logprobs.js';
import type { RequestMetrics } from './metrics.js';
import type { StepCosts } from './step-costs.js';

/**
 * Sampling settings. First the request's logits processors on the target's logits (logits-processors.ts, vLLM's
 * order): `logitBias`, `minTokens`, `repetitionPenalty`, `frequencyPenalty` and `presencePenalty` (all optional,
 * undefined: off). Then the record a drafter sees too ({@link DraftSampling}), applied in this order
 * (probs.ts): `temperature` — 0 → greedy; otherwise > 0 (logits are divided by it); `topK` — keep
 * the k most likely tokens (undefined or 0: no top-k); `topP` — keep the smallest set of tokens
 * whose probability reaches p, in (0, 1] (undefined or 1: no top-p).
 * Drafters see the penalties but need not apply them: verification applies them to the target's rows, so the
 * output is the target's whatever the drafts (a drafter that applies them only drafts better).
 */
export interface SamplingParams extends DraftSampling {
  /** vLLM `presence_penalty`, in [−2, 2] (0: off): subtracted from the logit of every token generated so far. */
  readonly presencePenalty?: number;
  /** vLLM `frequency_penalty`, in [−2, 2] (0: off): times its count subtracted from a generated token's logit. */
  readonly frequencyPenalty?: number;
  /**
   * vLLM `repetition_penalty`, finite > 0 (1: off), over prompt + generated tokens: a logit > 0 is divided by it,
   * any other multiplied.
   */
  readonly repetitionPenalty?: number;
  /** OpenAI `logit_bias`: token id (in [0, vocab)) → bias in [−100, 100], added to the target's logit. */
  readonly logitBias?: ReadonlyMap<number, number>;
  /**
   * vLLM `min_tokens`, an integer ≥ 0: until this many tokens are generated the EOS ids (unless ignoreEos) and
   * {@link SpecRequest.stopTokenIds} are masked and stop strings are not checked.
   */
  readonly minTokens?: number;
}

/** One generation request. */
export interface SpecRequest {
  readonly id: SequenceId;
  /** Prompt token ids `[P]` i32, P ≥ 1. */
  readonly promptIds: Int32Array;
  /** New tokens at most (≥ 1). */
  readonly maxTokens: number;
  readonly sampling: SamplingParams;
  /** PRNG seed of the request (drafts and verification draw from one stream). */
  readonly seed: number;
  /**
   * The client fixed `seed` (OpenAI `seed`, `specd generate --seed`, a configured default seed) and
   * expects the same output for the same request. With temperature > 0 under a timing-based draft
   * policy (`'cost'`, or any {@link CostDraftPolicy}) the engine then verifies this request with
   * k = 0 every step: plain decoding, one PRNG draw per token, so its tokens depend only on the seed
   * and the target's logits (batch-invariant) — a k picked from measured timings would consume the
   * PRNG stream differently run to run. No effect at temperature 0 (greedy output never depends on
   * k), under `'max'`, a fixed policy or the `draftLength` hook (their k is not timing-based).
   * Default false.
   */
  readonly seeded?: boolean;
  /** Keep going after EOS. */
  readonly ignoreEos?: boolean;
  /** EOS ids (ignored with ignoreEos). */
  readonly eosTokenIds?: readonly number[];
  /**
   * vLLM `stop_token_ids`: generating one of these ends the request with finish reason `'stop'` (ignoreEos does
   * not apply; the id is the last of `tokenIds`).
   */
  readonly stopTokenIds?: readonly number[];
  /** Stop when the generated text contains one of these (needs the engine's `decode`). */
  readonly stopStrings?: readonly string[];
  /**
   * Called with each committed token, in order; with {@link logprobs} set, with its logprob too (logprobs.ts).
   */
  readonly onToken?: (id: number, logprob?: TokenLogprob) => void;
  /**
   * Logprobs of each generated token under the target's raw distribution (logprobs.ts), with this many most
   * likely alternatives per position, an integer in [0, 20]; passed to `onToken`. Undefined (default): none are
   * computed, the request pays nothing.
   */
  readonly logprobs?: number;
  /**
   * Logprobs of the prompt tokens (the API's `echo` with `logprobs`), with this many alternatives per position, in
   * [0, 20]: the prefill forwards then return every row's logits, and `onPromptLogprobs` gets `[P]` entries once
   * the prompt is prefilled, before the first token (entry 0 is null: the first token has no context). Undefined
   * (default): none.
   */
  readonly promptLogprobs?: number;
  /** Called once with the prompt's logprobs when {@link promptLogprobs} is set. */
  readonly onPromptLogprobs?: (logprobs: readonly (TokenLogprob | null)[]) => void;
  /**
   * Called once, just before the forward of the prompt's first prefill chunk (the end of the request's queue wait:
   * the prefill role's waterfall, pd/waterfall.ts).
   */
  readonly onPrefillStart?: () => void;
  /**
   * A {@link handoff} request only (the prefill role, pd/overlap.ts): called after each of its prefill chunks but
   * the last, with `rows` the prompt rows done — their target KV final and, with a drafter, their draft context
   * written (set, it makes the engine write a handoff request's draft context chunk by chunk instead of at the
   * handoff, so that the finished rows can be sent while the prompt still prefills; the same rows, the same bits).
   * `lastNext`: the next chunk is the prompt's last.
   */
  readonly onPrefillChunk?: (rows: number, lastNext: boolean) => void;
  /**
   * Prefill only, for prefill/decode disaggregation (the prefill role): after the prompt's last chunk and
   * the first token, the draft context is written and the request ends with finish reason `'handoff'`
   * while its target pages, state slot and draft context stay allocated for the transfer to a decode
   * instance, until {@link SpecEngine.release} (or `abort`). A request that finishes on its first token
   * (EOS, a stop string, maxTokens 1) ends as usual and keeps nothing. Default false.
   */
  readonly handoff?: boolean;
}

/**
 * Where a handed-off request stands (prefill/decode disaggregation): everything a decode instance needs
 * besides the caches to continue it exactly as the prefill instance would have.
 */
export interface HandoffState {
  /** The first generated token (sampled after the prompt's last position). */
  readonly firstToken: number;
  /** Prompt tokens in the caches (= the draft context length): the position of the first token. */
  readonly position: number;
  /** The request's PRNG seed and the draws it has taken ({@link SeededRandom.resume}). */
  readonly seed: number;
  readonly draws: number;
  /** The first token's logprob, when the request asks for logprobs (the prefill instance computed it). */
  readonly firstLogprob?: TokenLogprob;
  /** The prompt's logprobs (`[numPromptTokens]`, null first), when the request asks for them. */
  readonly promptLogprobs?: readonly (TokenLogprob | null)[];
}

/**
 * Why a request ended. `'error'`: this request alone failed (its {@link SpecResult.error}); its caches are
 * freed and the other requests go on.
 */
export type FinishReason = 'eos' | 'stop' | 'length' | 'abort' | 'handoff' | 'error';

/** A finished request. */
export interface SpecResult {
  readonly id: SequenceId;
  /** Generated ids (the EOS / stop-completing token included). */
  readonly tokenIds: number[];
  readonly finishReason: FinishReason;
  readonly metrics: RequestMetrics;
  /** With finish reason `'handoff'`: the state a decode instance continues from. */
  readonly handoff?: HandoffState;
  /** With finish reason `'error'`: why this request failed. */
  readonly error?: SequenceError;
}

/** Options of {@link SpecEngine}. */
export interface SpecEngineOptions {
  /** Running sequences at most (default 8). */
  readonly maxSequences?: number;
  /** Prompt + generated + one draft block, per sequence, at most (sizes the KV pools; default 4096). */
  readonly maxTokensPerSequence?: number;
  /** Target KV page size, tokens (default 16). */
  readonly pageSize?: number;
  /**
   * Tokens per prefill forward (default 64). A prompt of P tokens is prefilled over ⌈P / prefillChunk⌉
   * steps, one chunk per step (chunk i = prompt tokens [i·prefillChunk, (i+1)·prefillChunk)), while
   * the sequences already decoding take their propose → verify round in every one of those steps.
   */
  readonly prefillChunk?: number;
  /** How to commit a partially accepted block (default: 'snapshots' when the stage supports it, else 'replay'). */
  readonly commit?: 'snapshots' | 'replay';
  /** Detokenizer for stop strings. */
  readonly decode?: (ids: readonly number[]) => string;
  /**
   * How many drafts each sequence verifies per step (draft-policy.ts). `'cost'` (default, see
   * {@link DEFAULT_DRAFT_POLICY}): the cost-based policy — at the first step (before any request is
   * admitted) the engine measures t_verify / t_draft for its batch-size buckets on this machine
   * (step-costs.ts; cached per target/drafter, thread count and commit mode), then each step picks
   * per sequence the k that maximises expected committed tokens per second, k = 0 (a plain decode
   * step) included; with proposal confidences it also cuts each proposal to its survival budget
   * ({@link verifyBudget}). `'max'`: always the drafter's maximum (fixed k = maxDraftTokens; τ tests
   * compare with the reference at the full block, and sampled outputs stay reproducible per seed,
   * which a timing-based policy does not guarantee).
   * Or any {@link DraftPolicy}, e.g. `fixedDraftPolicy(7)`. Ignored when `draftLength` is given.
   */
  readonly draftPolicy?: 'cost' | 'max' | DraftPolicy;
  /** Options of the `'cost'` policy. */
  readonly costPolicy?: CostDraftPolicyOptions;
  /**
   * The `'cost'` policy's step costs, taken instead of measuring them at the first step (a calibration kept from an
   * earlier engine of the same target, drafter and threads, or a bench's deliberately skewed copy of one); the
   * policy corrects them online as it does its own.
   */
  readonly stepCosts?: StepCosts;
  /**
   * Verify budgets for proposals with `confidence` (adaptive verification): `'survival'` (default)
   * asks the policy's `budgets` hook — the `'cost'` policy verifies the drafts whose survival
   * Π c_l ≥ λ; `'max'` and fixed policies have no hook and verify everything — `'all'` never cuts.
   */
  readonly verifyBudget?: 'survival' | 'all';
  /**
   * Per-sequence draft length hook (fixed k: `() => 7`; EMA: `adaptiveDraftLength()`), clamped to
   * [0, drafter.maxDraftTokens]; takes precedence over `draftPolicy`.
   */
  readonly draftLength?: (id: SequenceId, metrics: RequestMetrics) => number;
}

/** The engine's draft policy when none is given (see {@link SpecEngineOptions.draftPolicy}). */
export const DEFAULT_DRAFT_POLICY: 'cost' | 'max' = 'cost';

/** Thrown for a bad request (names the field) or a misuse of the engine. */
export class EngineError extends Error {
  override readonly name = 'EngineError';
}

/** The phase of a step in which one sequence failed. */
export type SequencePhase = 'prefill' | 'propose' | 'accept' | 'commit';

/**
 * One request failed alone (its {@link SpecResult.error}, finish reason `'error'`): a prefill forward or a
 * draft context write of that request threw, the drafter threw on it alone, a verify row it used was not finite
 * (probs.ts NonFiniteLogitsError), or its commit threw. The message names the request and the phase; `cause` is
 * the original error. Not an {@link EngineError} (a bad request): the request was valid, the server answers 500.
 */
export class SequenceError extends Error {
  override readonly name = 'SequenceError';
  constructor(
    readonly id: SequenceId,
    readonly phase: SequencePhase,
    cause: unknown,
  ) {
    super(`request ${String(id)}: ${phase}: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
  }
}
