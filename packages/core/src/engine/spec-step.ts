/**
 * The speculative step of the engine (`SpecEngine`) as named phases over the sequences done prefilling:
 * - {@link propose}: each sequence's draft length (the policy or the `draftLength` hook), its deferred
 *   draft context written, ONE drafter call for all that draft, proposals checked and cut to their
 *   verify budgets;
 * - {@link verify}: ONE target forward over `[last verified token, drafts…]` of every sequence;
 * - {@link accept}: which drafts the target keeps (accept.ts: greedy, rejection sampling, trees);
 * - {@link commit}: the target keeps `accepted + 1` tokens per sequence, the committed tokens' taps
 *   become draft context (draft-context.ts).
 * The engine (engine.ts) times the phases and emits the committed tokens.
 */

import { argmaxChecked } from '@specd/native';

import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { SequenceCache, SequenceCheckpoint } from '../kv/sequence-cache.js';
import type { ContextSpan, DraftProposal, DraftSequence, Drafter } from '../plugin/drafter-plugin.js';
import type { ForwardResult, ForwardSequence, StageModel } from '../plugin/model-plugin.js';
import {
  type DeviceSampleSpec,
  type DeviceSampling,
  hasDeviceSampling,
  hasPrefixCommit,
  hasTreeCommit,
  type PrefixCommit,
  type PrefixCommitItem,
  type TreeCommit,
} from '../plugin/stage-capabilities.js';
import {
  acceptGreedyArgmax,
  acceptSampledRows,
  acceptTreeGreedy,
  isTree,
  type AcceptResult,
  type TargetProbsRow,
  type TreeProposal,
} from './accept.js';
import type { DraftContextWriter, PendingContext } from './draft-context.js';
import type { DraftPolicy } from './draft-policy.js';
import { type TokenLogprob, tokenLogprob } from './logprobs.js';
import type { LogitsProcessor } from './logits-processors.js';
import type { RequestMetrics, RunMetrics } from './metrics.js';
import { checkLogitsRow, NonFiniteLogitsError, samplingProbs, supportOf } from './probs.js';
import type { SeededRandom } from './random.js';
import { EngineError, SequenceError, type SpecEngineOptions, type SpecRequest } from './types.js';

/** What the phases read (and count into) of the engine; built by the engine for each step. */
export interface StepContext {
  readonly target: StageModel;
  readonly drafter: Drafter | undefined;
  /** Writes and defers the draft context; undefined without a drafter. */
  readonly context: DraftContextWriter | undefined;
  /** The target's caches. */
  readonly cache: SequenceCache;
  /** The batch-level draft policy (undefined: `draftLength` hook, or no drafter). */
  readonly policy: DraftPolicy | undefined;
  readonly options: SpecEngineOptions;
  readonly vocab: number;
  /** Tap ids the drafter captures (empty without a drafter). */
  readonly taps: readonly number[];
  readonly commitMode: 'snapshots' | 'replay';
  readonly metrics: RunMetrics;
  /** The running sequences by id. */
  readonly running: ReadonlyMap<SequenceId, Running>;
}

/** A request the engine runs (admitted: prefilling or decoding). */
export interface Running {
  readonly id: SequenceId;
  readonly req: SpecRequest;
  readonly rng: SeededRandom;
  readonly metrics: RequestMetrics;
  /**
   * Prompt tokens prefilled so far, in [0, P]. The sequence is prefilling while it is < P (one chunk
   * per step); at P its first token has been emitted and it takes part in every verify round.
   */
  prefilled: number;
  /**
   * Verified with k = 0 every step (a seeded sampled request under a timing-based policy;
   * {@link SpecRequest.seeded}).
   */
  readonly plainOnly: boolean;
  /** Prompt + committed tokens, the last verified token included. */
  history: Int32Array;
  historyLength: number;
  readonly out: number[];
  /** The request's logits processors (logits-processors.ts); undefined when its settings are all neutral. */
  readonly logits: LogitsProcessor | undefined;
  /** Where stop strings are searched in the output text (after the first min_tokens tokens' text); set lazily. */
  stopTextFrom?: number;
  /**
   * Committed tokens whose draft context is not written yet (steps with k = 0 defer it: a sequence
   * that is not drafting does not pay the projection; flushed in one call before it drafts again;
   * the taps and the pipeline's partial projection as draft-context.ts keeps them).
   */
  pending?: PendingContext;
  /** The prompt's logprobs so far (SpecRequest.promptLogprobs), one entry per prefilled token (entry 0 null). */
  promptLogprobs?: (TokenLogprob | null)[];
}

/** What propose hands to verify. */
export interface Proposed {
  /** The drafts of each sequence that drafted, cut to its verify budget. */
  readonly proposals: ReadonlyMap<SequenceId, DraftProposal>;
  /** Sequences that drafted (the size of the propose call; 0: no call). */
  readonly drafted: number;
  /** Drafts the propose call made, before the verify budgets cut them. */
  readonly proposedDrafts: number;
  /** Wall time of the drafter's propose call, ms (0 without a call; with the one-by-one retry, all its calls). */
  readonly proposeMs: number;
  /** Deferred draft-context rows written before the propose call (the drafting sequences' lazy catch-up). */
  readonly catchUpRows: number;
  /** Wall time of that catch-up write, ms (0 when nothing was deferred). */
  readonly catchUpMs: number;
  /** Sequences that failed alone in propose (they take no part in this step's verify). */
  readonly failed: ReadonlyMap<SequenceId, SequenceError>;
}

/** What verify hands to accept and commit. */
export interface Verified {
  /** The verify block of each sequence, in step order: `[last verified token, drafts…]` (+ `tree`). */
  readonly blocks: readonly ForwardSequence[];
  /** The verify forward: logits `[Σ block lengths, V]` f32, taps, state snapshots. */
  readonly res: ForwardResult;
  /** Target checkpoints before the verify forward (`'replay'` mode, sequences with drafts). */
  readonly checkpoints: ReadonlyMap<SequenceId, SequenceCheckpoint>;
  /** True when the forward kept per-token state snapshots (`commitPrefix` commits). */
  readonly snapshots: boolean;
  /**
   * Sampled sequences decided where the logits live ({@link DeviceSampling}): `[2 · sequences]` i32, per sequence
   * the accepted drafts and the token drawn (−1: a used row is not finite; −2: not sampled there).
   */
  readonly sampled?: Int32Array;
}

/** What accept decided for one sequence. */
export interface Outcome {
  readonly seq: Running;
  /** Its verify block. */
  readonly block: ForwardSequence;
  /** The verify forward's row of its block's first token (rows of logits and taps). */
  readonly row: number;
  readonly acc: AcceptResult;
  /** The drafts along the accepted path: a chain's drafts, or the drafts of a tree's root path. */
  readonly drafts: Int32Array;
  /** A tree's kept block rows (a root path, `rows[0] = 0`); undefined for a chain. */
  readonly path?: readonly number[];
}

/**
 * The drafts each sequence asks for this step, in [0, min(maxDraftTokens, tokens left)] (0 for a
 * plain-only sequence, and for all without a drafter): the `draftLength` hook, else the policy.
 */
function draftLengths(ctx: StepContext, seqs: readonly Running[]): number[] {
  const maxK = ctx.drafter?.maxDraftTokens ?? 0;
  const maxPosition = ctx.drafter?.maxPosition;
  const caps: number[] = [];
  for (const r of seqs) {
    let cap = r.plainOnly ? 0 : Math.max(0, Math.min(maxK, r.req.maxTokens - r.out.length));
    // past the draft model's trained positions its drafts are noise: stop drafting (the step decodes plainly)
    if (cap > 0 && maxPosition !== undefined && r.historyLength + maxK > maxPosition) {
      cap = 0;
      r.metrics.positionLimitedSteps++;
    }
    caps.push(cap);
  }
  const hook = ctx.options.draftLength;
  if (hook !== undefined)
    return seqs.map((r, i) => Math.min(caps[i]!, Math.max(0, Math.min(maxK, Math.floor(hook(r.id, r.metrics))))));
  const policy = ctx.policy;
  // the engine sets a policy whenever it has a drafter and no draftLength hook (step() calibrates 'cost' first)
  if (policy === undefined) throw new EngineError('propose: internal error: a drafter without a draft policy');
  const chosen = policy.choose(
    seqs.map((r, i) => ({
      id: r.id,
      maxDrafts: caps[i]!,
      metrics: r.metrics,
      pendingContextRows: r.pending?.numTokens ?? 0,
      remainingTokens: Math.max(0, r.req.maxTokens - r.out.length),
    })),
  );
  for (let i = 0; i < caps.length; i++) caps[i] = Math.max(0, Math.min(caps[i]!, Math.floor(chosen[i]!)));
  return caps;
}

/**
 * Propose: the draft length of every sequence ({@link draftLengths}); the deferred draft context
 * of those that draft is written, then ONE drafter call proposes for all of them. Each proposal is
 * checked (no more drafts than asked for; a tree must be verifiable, {@link checkTree}) and cut to
 * its verify budget ({@link applyBudgets}); a sequence whose proposal breaks these rules fails alone
 * (`failed`). When the batched call throws, every drafting sequence's PRNG is rewound and the drafter is
 * asked for each sequence alone: a sequence on which it throws again fails alone, the others keep their
 * proposals (drafters are batch-invariant, so these are the batched call's).
 * @throws {EngineError} for drafts of a sequence that is not in the step; what the draft context write throws.
 */
export function propose(ctx: StepContext, seqs: readonly Running[]): Proposed {
  const { drafter, context } = ctx;
  // (without a drafter every sequence asks for 0 drafts)
  if (drafter === undefined || context === undefined) return nothingProposed();
  const wants = draftLengths(ctx, seqs);
  /** The sequences that draft, with their index in `seqs`. */
  const asks: { readonly r: Running; readonly want: number; readonly at: number }[] = [];
  for (let i = 0; i < seqs.length; i++) {
    const want = wants[i];
    if (want !== undefined && want > 0) asks.push({ r: seqs[i]!, want, at: i });
  }
  if (asks.length === 0) return nothingProposed();
  const proposals = new Map<SequenceId, DraftProposal>();
  const failed = new Map<SequenceId, SequenceError>();
  // lazy catch-up: the context deferred while these sequences did not draft, written in one call
  const behind: Running[] = [];
  let catchUpRows = 0;
  for (const { r } of asks) {
    if (r.pending === undefined) continue;
    behind.push(r);
    catchUpRows += r.pending.numTokens;
  }
  let catchUpMs = 0;
  if (behind.length > 0) {
    const tc = performance.now();
    context.flush(behind);
    catchUpMs = performance.now() - tc;
  }
  const toDraft: DraftSequence[] = [];
  /** Each drafting sequence's PRNG draws before the call (rewound for the one-by-one retry). */
  const draws: number[] = [];
  for (const { r, want } of asks) {
    toDraft.push({
      id: r.id,
      position: r.historyLength - 1,
      lastToken: r.history[r.historyLength - 1]!,
      maxDrafts: want,
      history: r.history.subarray(0, r.historyLength),
      sampling: r.req.sampling,
      rng: r.rng,
    });
    draws.push(r.rng.draws);
  }
  ctx.metrics.proposeCalls++;
  const tp = performance.now();
  let proposed: readonly DraftProposal[];
  try {
    proposed = drafter.propose({ sequences: toDraft });
  } catch (err) {
    const only = toDraft.length === 1 ? toDraft[0] : undefined;
    if (only !== undefined) {
      failed.set(only.id, new SequenceError(only.id, 'propose', err));
      proposed = [];
    } else {
      for (let i = 0; i < asks.length; i++) asks[i]!.r.rng.rewind(draws[i]!);
      proposed = toDraft.flatMap((d) => {
        ctx.metrics.proposeCalls++;
        try {
          // each call's q on the device lives until the next propose: bring it to the host before that call
          return drafter.propose({ sequences: [d] }).map(detachDeviceProbs);
        } catch (one) {
          failed.set(d.id, new SequenceError(d.id, 'propose', one));
          return [];
        }
      });
    }
  }
  const proposeMs = performance.now() - tp;
  for (let i = 0; i < proposed.length; i++) {
    const p = proposed[i]!;
    // proposals come in the order asked (one-by-one retries skip the sequences that failed)
    const ask = asks[i];
    const at = ask !== undefined && ask.r.id === p.id ? ask.at : seqs.findIndex((r) => r.id === p.id);
    if (at < 0 && p.tokens.length > 0)
      throw new EngineError(`propose: ${String(p.id)}: drafts for a sequence that was not asked to draft`);
    try {
      if (p.tokens.length > (wants[at] ?? 0))
        throw new EngineError(`propose: ${String(p.id)}: more drafts than maxDrafts`);
      if (isTree(p)) checkTree(ctx, p, seqs[at]!);
      proposals.set(p.id, p);
    } catch (err) {
      failed.set(p.id, new SequenceError(p.id, 'propose', err));
    }
  }
  let proposedDrafts = 0;
  for (const p of proposals.values()) proposedDrafts += p.tokens.length;
  applyBudgets(ctx, proposals);
  return { proposals, drafted: toDraft.length, proposedDrafts, proposeMs, catchUpRows, catchUpMs, failed };
}

/**
 * `p` with its q in host memory: a proposal whose q lies on the device (`deviceProbs`, valid until the drafter's next
 * propose) gets it copied back now (reading `probs`), and the device address dropped; others as they are.
 */
function detachDeviceProbs(p: DraftProposal): DraftProposal {
  if (p.deviceProbs === undefined) return p;
  const probs = p.probs;
  return {
    id: p.id,
    tokens: p.tokens,
    ...(probs === undefined ? {} : { probs }),
    ...(p.probsIds === undefined ? {} : { probsIds: p.probsIds }),
    ...(p.parents === undefined ? {} : { parents: p.parents }),
    ...(p.confidence === undefined ? {} : { confidence: p.confidence }),
  };
}

/** What {@link propose} returns when no sequence drafts. */
function nothingProposed(): Proposed {
  return {
    proposals: new Map(),
    drafted: 0,
    proposedDrafts: 0,
    proposeMs: 0,
    catchUpRows: 0,
    catchUpMs: 0,
    failed: new Map(),
  };
}

/**
 * A tree proposal must be verifiable: a target with {@link TreeCommit} (attention-only; a tree over
 * linear-attention layers would need per-branch state), greedy sampling (trees are verified along
 * the argmax path; drafters propose chains at temperature > 0), parents before children.
 * @throws {EngineError} naming the sequence and the reason.
 */
function checkTree(ctx: StepContext, p: TreeProposal, r: Running): void {
  const id = String(p.id);
  if (!hasTreeCommit(ctx.target))
    throw new EngineError(
      `propose: ${id}: tree drafts need a target that verifies trees ` +
        '(StageModel.commitTreePath: attention-only stages); this one verifies chains only',
    );
  if (r.req.sampling.temperature !== 0)
    throw new EngineError(
      `propose: ${id}: tree drafts are verified greedily only (temperature 0); ` +
        `at temperature ${r.req.sampling.temperature} the drafter must propose a chain`,
    );
  if (p.parents.length !== p.tokens.length)
    throw new EngineError(`propose: ${id}: parents: expected [${p.tokens.length}], got ${p.parents.length}`);
  p.parents.forEach((v, j) => {
    if (!(Number.isInteger(v) && v >= -1 && v < j))
      throw new EngineError(`propose: ${id}: parents[${j}] = ${v}: expected −1 or an earlier draft`);
  });
}

/**
 * Verify: ONE target forward over `[last verified token, drafts…]` of every sequence (a tree
 * proposal as the block's `tree`: row 0 the root, draft j's parent row = parents[j] + 1), logits
 * for every row, the drafter's taps, and per-token state snapshots when some block has drafts in
 * `'snapshots'` mode. In `'replay'` mode a sequence with drafts is checkpointed first. A stage with
 * {@link DeviceSampling} decides sampled sequences where its logits live when every sequence of the batch can be
 * (greedy, or sampled without logits processors, logprobs or a tree): the forward then returns no logits and
 * `sampled` holds each sequence's accepted drafts and token, drawn with k + 1 draws of its PRNG.
 */
export function verify(
  ctx: StepContext,
  seqs: readonly Running[],
  proposals: ReadonlyMap<SequenceId, DraftProposal>,
): Verified {
  const blocks: ForwardSequence[] = [];
  const checkpoints = new Map<SequenceId, SequenceCheckpoint>();
  let drafted = false;
  let argmaxOnly = true;
  // sampled sequences are decided on the stage's device when it can (DeviceSampling) and every sequence of the
  // batch is greedy or sampled there (no processors, logprobs or tree): no logits come back
  const sampler = hasDeviceSampling(ctx.target) ? ctx.target : undefined;
  let allOnDevice = sampler !== undefined;
  let anySampled = false;
  for (const r of seqs) {
    const p = proposals.size === 0 ? undefined : proposals.get(r.id);
    const k = p === undefined ? 0 : p.tokens.length;
    const tokens = new Int32Array(k + 1);
    tokens[0] = r.history[r.historyLength - 1]!;
    if (k > 0) {
      tokens.set(p!.tokens, 1);
      drafted = true;
      if (ctx.commitMode === 'replay') checkpoints.set(r.id, ctx.cache.checkpoint(r.id));
    }
    const position = ctx.cache.length(r.id);
    if (p !== undefined && isTree(p)) {
      const tree = new Int32Array(k + 1);
      tree[0] = -1;
      for (let j = 0; j < k; j++) tree[j + 1] = p.parents[j]! + 1;
      blocks.push({ id: r.id, position, tokens, logits: 'all', tree });
      argmaxOnly = false;
      allOnDevice = false;
    } else {
      blocks.push({ id: r.id, position, tokens, logits: 'all' });
      if (!wantsArgmaxOnly(r)) {
        argmaxOnly = false;
        if (sampler !== undefined && sampledOnDevice(r, p, k, ctx.vocab, sampler)) anySampled = true;
        else allOnDevice = false;
      }
    }
  }
  const onDevice = sampler !== undefined && allOnDevice && anySampled;
  // A block of one token always commits whole: no snapshots (and no commitPrefix) when nobody drafted.
  const snapshots = ctx.commitMode === 'snapshots' && drafted;
  const res = ctx.target.forward({ sequences: blocks }, ctx.cache, {
    taps: ctx.taps,
    stateSnapshots: snapshots,
    argmaxOnly: argmaxOnly || onDevice,
    // accept and commit read the logits within this step
    logitsScratch: true,
  });
  ctx.metrics.verifyForwards++;
  ctx.metrics.decodeForwards++;
  if (!onDevice) return { blocks, res, checkpoints, snapshots };
  // q stays on the device when every sampled proposal's q is there and the stage reads it (a GPU drafter beside a
  // GPU target): one source for the whole batch
  let qOnDevice = true;
  for (const r of seqs) {
    const p = proposals.get(r.id);
    if (wantsArgmaxOnly(r) || p === undefined || p.tokens.length === 0) continue;
    if (p.deviceProbs === undefined || sampler.acceptsDeviceProbs?.(p.deviceProbs) !== true) qOnDevice = false;
  }
  // the draws are taken only here: a batch sampled on the host takes them in accept, as many as it examines
  const specs: (DeviceSampleSpec | undefined)[] = seqs.map((r, i) =>
    wantsArgmaxOnly(r)
      ? undefined
      : deviceSpec(r, blocks[i]!.tokens.subarray(1), proposals.get(r.id), ctx.vocab, qOnDevice),
  );
  const sampled = sampler.sampleOnDevice(res, specs);
  return { blocks, res, checkpoints, snapshots, sampled };
}

/**
 * True when sampled sequence `r` (temperature > 0) with `k` drafts (proposal `p`) can be decided by the stage's
 * {@link DeviceSampling}: no logits processors, no logprobs, a chain whose q (if any) is `[k, vocab]`.
 */
function sampledOnDevice(
  r: Running,
  p: DraftProposal | undefined,
  k: number,
  vocab: number,
  sampler: DeviceSampling,
): boolean {
  if (r.logits !== undefined || r.req.logprobs !== undefined) return false;
  // q on the device (not read here: reading `probs` would copy it back)
  if (k > 0 && p?.deviceProbs !== undefined && sampler.acceptsDeviceProbs?.(p.deviceProbs) === true) return true;
  return p?.probs === undefined || p.probs.length === k * (p.probsIds?.length ?? vocab);
}

/**
 * The device sampling request of sampled sequence `r`: its drafts, q (where it lies: `qOnDevice` and a proposal with
 * `deviceProbs` leave it on the device; a reduced q is written out over `vocab` tokens, {@link fullDraftProbs}) and
 * k + 1 draws from its PRNG.
 */
export function deviceSpec(
  r: Running,
  drafts: Int32Array,
  p: DraftProposal | undefined,
  vocab: number,
  qOnDevice = false,
): DeviceSampleSpec {
  const uniforms = new Float64Array(drafts.length + 1);
  for (let j = 0; j < uniforms.length; j++) uniforms[j] = r.rng.next();
  const { temperature, topK, topP } = r.req.sampling;
  if (drafts.length > 0 && qOnDevice && p?.deviceProbs !== undefined)
    return { temperature, topK, topP, drafts, q: undefined, qDevice: p.deviceProbs, uniforms };
  return { temperature, topK, topP, drafts, q: drafts.length === 0 ? undefined : fullDraftProbs(p, vocab), uniforms };
}

/**
 * A proposal's q over the whole vocabulary `[k, vocab]` f32: `probs` itself, or a reduced q (`probsIds`, `[k, W]`)
 * written out with zeros off its list (the device sampler reads full rows; tests read rows by token id).
 */
export function fullDraftProbs(p: DraftProposal | undefined, vocab: number): Float32Array | undefined {
  const q = p?.probs;
  const ids = p?.probsIds;
  if (q === undefined || ids === undefined) return q;
  const W = ids.length;
  const k = W === 0 ? 0 : q.length / W;
  const full = new Float32Array(k * vocab);
  for (let j = 0; j < k; j++) for (let e = 0; e < W; e++) full[j * vocab + ids[e]!] = q[j * W + e]!;
  return full;
}

/**
 * True when a sequence's verify needs the target's argmax only — greedy, no logits processors, no logprobs — so a
 * stage that computes the argmax where its logits live (a GPU stage: {@link ForwardResult.argmax}) need not return
 * the logits.
 */
export function wantsArgmaxOnly(r: Running): boolean {
  return r.req.sampling.temperature === 0 && r.logits === undefined && r.req.logprobs === undefined;
}

/** What accept hands to commit. */
export interface Accepted {
  /** The sequences accept decided for, in step order. */
  readonly outcomes: readonly Outcome[];
  /** Sequences that failed alone in accept (a row they used was not finite, or their sampling threw). */
  readonly failed: ReadonlyMap<SequenceId, SequenceError>;
}

/**
 * Accept (accept.ts), per sequence in step order: a tree is accepted greedily along the target's
 * argmax path (its kept block rows are the outcome's `path`); a chain greedily at temperature 0,
 * else by rejection sampling against the drafter's q with the request's PRNG (or as the stage decided it on its
 * device: `verified.sampled`). The rows a sequence used
 * (its kept path: rows 0 … accepted) must be finite ({@link checkLogitsRow}); a row it did not reach may
 * be anything (e.g. after a draft whose embedding is NaN). A sequence whose rows or sampling fail fails
 * alone (`failed`); the others are decided from their own rows only, so their tokens do not change.
 */
export function accept(
  ctx: StepContext,
  seqs: readonly Running[],
  verified: Verified,
  proposals: ReadonlyMap<SequenceId, DraftProposal>,
): Accepted {
  const { res } = verified;
  const outcomes: Outcome[] = [];
  const failed = new Map<SequenceId, SequenceError>();
  let row = 0;
  for (let i = 0; i < seqs.length; i++) {
    const r = seqs[i]!;
    const block = verified.blocks[i]!;
    const first = row;
    row += block.tokens.length;
    const sampled = verified.sampled;
    if (sampled !== undefined && sampled[2 * i + 1] !== -2) {
      // decided where the logits live (DeviceSampling): the accepted count and the token drawn
      const [accepted, bonus] = [sampled[2 * i]!, sampled[2 * i + 1]!];
      if (bonus < 0) {
        const why = `verify row ${accepted}: no token can be drawn (a logit is NaN or +Infinity, or none is finite)`;
        failed.set(r.id, new SequenceError(r.id, 'accept', new NonFiniteLogitsError(why)));
      } else {
        outcomes.push({ seq: r, block, row: first, acc: { accepted, bonus }, drafts: block.tokens.subarray(1) });
      }
      continue;
    }
    if (res.logits === undefined) {
      // an argmax-only forward (wantsArgmaxOnly: greedy, nothing processed): the stage's argmax of each row
      try {
        const drafts = block.tokens.subarray(1);
        const [start, end] = [res.logitRowStart[i]!, res.logitRowStart[i + 1]!];
        const acc = acceptGreedyArgmax(drafts, res.argmax!, 'verify row', start, end);
        outcomes.push({ seq: r, block, row: first, acc, drafts });
      } catch (err) {
        failed.set(r.id, new SequenceError(r.id, 'accept', err));
      }
      continue;
    }
    acceptRow(ctx, r, i, block, first, res, proposals, outcomes, failed);
  }
  return { outcomes, failed };
}

/** {@link accept} of sequence `i` (`r`, its block's first row `first`) from the forward's logits. */
function acceptRow(
  ctx: StepContext,
  r: Running,
  i: number,
  block: ForwardSequence,
  first: number,
  res: ForwardResult,
  proposals: ReadonlyMap<SequenceId, DraftProposal>,
  outcomes: Outcome[],
  failed: Map<SequenceId, SequenceError>,
): void {
  const V = ctx.vocab;
  const raw = res.logits!.subarray(res.logitRowStart[i]! * V, res.logitRowStart[i + 1]! * V);
  const checkRows = (rows: Iterable<number>): void => {
    for (const x of rows) checkLogitsRow(raw.subarray(x * V, (x + 1) * V), `verify row ${x}`);
  };
  try {
    // row x processed as plain decoding would after the drafts before it (logits-processors.ts)
    const lg = r.logits === undefined ? raw : r.logits.block(raw, V, block.tokens, block.tree);
    if (block.tree !== undefined) {
      const { rows, acc } = acceptTreeGreedy(block.tokens, block.tree, lg, V);
      checkRows(rows);
      const drafts = Int32Array.from(rows.slice(1), (x) => block.tokens[x]!);
      outcomes.push({ seq: r, block, row: first, acc, drafts, path: rows });
      return;
    }
    const drafts = block.tokens.subarray(1);
    if (r.req.sampling.temperature === 0) {
      // greedy: each row's argmax and its finiteness in one native pass (argmaxChecked: −1 for a row no token can be
      // chosen from); a used row that is not is named by checkLogitsRow's message (token id and value)
      const top = argmaxChecked(lg, V);
      try {
        outcomes.push({ seq: r, block, row: first, acc: acceptGreedyArgmax(drafts, top, 'verify row'), drafts });
      } catch (err) {
        // the row it failed on (every row before it was decidable), named with its token and value
        const bad = top.indexOf(-1);
        if (bad >= 0) checkRows([bad]);
        throw err;
      }
      return;
    }
    // the target's p of each row only as the decision reaches it (τ rows on average, not k + 1), each into the same
    // scratch row: acceptSampledRows reads row j only until it asks for row j + 1. A row with a support passed
    // checkLogitsRow's test in the kernel (no NaN, no +Infinity, a finite value) — the raw row's own test only when
    // no logits processor stands between them (a processor's −Infinity could hide a NaN); the others are checked
    // below.
    const checked: boolean[] = [];
    const pRow = (j: number) => {
      const row = targetRow(lg.subarray(j * V, (j + 1) * V), V, r.req.sampling);
      checked[j] = lg === raw && !(row instanceof Float32Array);
      return row;
    };
    const p = proposals.get(r.id);
    const acc = acceptSampledRows(drafts, p?.probs, pRow, V, r.rng, p?.probsIds);
    checkRows(Array.from({ length: acc.accepted + 1 }, (_, x) => x).filter((x) => checked[x] !== true));
    outcomes.push({ seq: r, block, row: first, acc, drafts });
  } catch (err) {
    failed.set(r.id, new SequenceError(r.id, 'accept', err));
  }
}

/** The target's p of the verify row being decided ({@link targetRow}) and its support, reused row after row. */
let targetScratch = new Float32Array(0);
let targetSupport = new Int32Array(0);
const targetCount = new Int32Array(1);

/**
 * The target's p for one verify row's logits `[V]` f32 ({@link samplingProbs}) with its support (the ids of its
 * positive entries ascending: acceptance then reads only those), in scratch rows that the next call overwrites. A row
 * holding a NaN, or one the sampler refuses (no finite value), comes back as a bare row of NaN instead of failing the
 * others, so rejection sampling fails only if it reaches that row (sampleFromProbs throws on it).
 */
function targetRow(lg: Float32Array, V: number, sampling: SpecRequest['sampling']): TargetProbsRow {
  if (targetScratch.length < V) {
    targetScratch = new Float32Array(V);
    targetSupport = new Int32Array(V);
  }
  const row = targetScratch.subarray(0, V);
  const support = { ids: targetSupport.subarray(0, V), counts: targetCount };
  try {
    samplingProbs(lg, V, sampling, row, support);
  } catch {
    return row.fill(Number.NaN);
  }
  const ids = supportOf(support, 0, V);
  return ids === undefined ? row : { probs: row, support: ids };
}

/**
 * Commit: every sequence (in step order) keeps `accepted + 1` tokens of its block. Target: {@link commitTarget}.
 * Draft: the block KV was never kept; the verify pass's taps of the committed tokens become new
 * draft context — written now (one projection) for the sequences that drafted, deferred for those
 * with k = 0. Records each sequence's step in its metrics and the policy. A sequence whose target commit
 * throws fails alone: it is left out of the draft context write.
 * @returns the sequences that failed alone.
 */
export function commit(
  ctx: StepContext,
  verified: Verified,
  outcomes: readonly Outcome[],
): ReadonlyMap<SequenceId, SequenceError> {
  const { res } = verified;
  const spans: ContextSpan[] = [];
  const spanRows: Int32Array[] = [];
  const failed = new Map<SequenceId, SequenceError>();
  const together = commitPrefixesTogether(ctx, verified, outcomes);
  for (const { seq: r, block, row, acc, drafts, path } of outcomes) {
    const k = block.tokens.length - 1;
    const committed = acc.accepted + 1;
    try {
      if (!together.has(r.id)) commitTarget(ctx, r, verified, block, committed, path);
    } catch (err) {
      failed.set(r.id, new SequenceError(r.id, 'commit', err));
      continue;
    }
    r.metrics.targetForwards++;
    r.metrics.recordStep(k, acc.accepted);
    ctx.policy?.observe(r.id, k, acc.accepted);
    if (k === 0) {
      // a plain-only sequence never drafts: its draft context is never needed
      if (ctx.context !== undefined && !r.plainOnly) ctx.context.defer(r, res, row, block.position, committed);
    } else {
      const next = new Int32Array(committed);
      next.set(drafts.subarray(0, acc.accepted));
      next[acc.accepted] = acc.bonus;
      spans.push({ id: r.id, position: block.position, numTokens: committed, nextTokens: next });
      const rows = new Int32Array(committed);
      for (let j = 0; j < committed; j++) rows[j] = row + (path === undefined ? j : path[j]!);
      spanRows.push(rows);
    }
  }
  if (ctx.context !== undefined && spans.length > 0) ctx.context.write(spans, res, spanRows);
  return failed;
}

/**
 * The snapshot commits of a step in one call where the target has {@link PrefixCommit.commitPrefixes} (a stage with
 * linear state replays them together) and the step has two or more chains to commit. @returns the ids committed
 * (empty when the call is not made or throws: each sequence is then committed alone by {@link commitTarget}, so that a
 * bad commit fails its sequence alone; a commit from snapshots may be redone).
 */
function commitPrefixesTogether(
  ctx: StepContext,
  verified: Verified,
  outcomes: readonly Outcome[],
): ReadonlySet<SequenceId> {
  const target = ctx.target;
  if (!verified.snapshots || !hasPrefixCommit(target) || target.commitPrefixes === undefined) return new Set();
  const commits: PrefixCommitItem[] = [];
  for (const o of outcomes) if (o.path === undefined) commits.push({ id: o.seq.id, committed: o.acc.accepted + 1 });
  if (commits.length < 2) return new Set();
  try {
    target.commitPrefixes(ctx.cache, verified.res, commits);
  } catch {
    return new Set();
  }
  return new Set(commits.map((c) => c.id));
}

/**
 * Keeps `committed` tokens of one verify block in the target cache: a tree's root `path`
 * ({@link TreeCommit}), the prefix with the verify pass's state snapshots ({@link PrefixCommit}: KV
 * truncated, linear state restored from the snapshot after the last committed token), or in
 * `'replay'` mode after a rejection the checkpoint restored and the committed tokens re-run (one
 * more forward). A block committed whole needs nothing more in `'replay'` mode.
 */
function commitTarget(
  ctx: StepContext,
  r: Running,
  verified: Verified,
  block: ForwardSequence,
  committed: number,
  path: readonly number[] | undefined,
): void {
  const id = r.id;
  const target = ctx.target;
  if (path !== undefined) {
    // propose refused tree drafts on a target without TreeCommit (checkTree)
    if (!hasTreeCommit(target)) throw new EngineError(`commit: ${String(id)}: a tree path on a target without trees`);
    target.commitTreePath(ctx.cache, verified.res, id, path);
  } else if (verified.snapshots) {
    // 'snapshots' mode needs PrefixCommit (the engine's constructor checks it)
    if (!hasPrefixCommit(target)) throw new EngineError(`commit: ${String(id)}: snapshots need commitPrefix`);
    target.commitPrefix(ctx.cache, verified.res, id, committed);
  } else if (committed < block.tokens.length) {
    const checkpoint = verified.checkpoints.get(id);
    // 'replay' mode: verify checkpointed every block with drafts, and only such a block commits less than all
    if (checkpoint === undefined)
      throw new EngineError(`commit: ${String(id)}: internal error: a partial commit without a checkpoint`);
    ctx.cache.rollback(id, checkpoint);
    ctx.target.forward(
      { sequences: [{ id, position: block.position, tokens: block.tokens.subarray(0, committed), logits: 'none' }] },
      ctx.cache,
    );
    ctx.metrics.decodeForwards++;
    r.metrics.targetForwards++;
  }
}

/**
 * Verify budgets (see {@link SpecEngineOptions.verifyBudget}): offers the proposals with
 * `confidence` to the policy's `budgets` hook and cuts each to its budget in place (in `proposals`).
 */
function applyBudgets(ctx: StepContext, proposals: Map<SequenceId, DraftProposal>): void {
  const hook = ctx.policy?.budgets;
  if (hook === undefined || (ctx.options.verifyBudget ?? 'survival') === 'all' || ctx.options.draftLength !== undefined)
    return;
  const items = [...proposals.values()].filter(
    (p): p is DraftProposal & { readonly confidence: Float32Array } =>
      p.confidence !== undefined && p.tokens.length > 0,
  );
  if (items.length === 0) return;
  for (const p of items) {
    if (p.confidence.length !== p.tokens.length)
      throw new EngineError(
        `propose: ${String(p.id)}: confidence has ${p.confidence.length} entries for ${p.tokens.length} drafts`,
      );
  }
  const budgets = hook.call(
    ctx.policy,
    items.map((p) => ({ id: p.id, confidence: p.confidence })),
  );
  const V = ctx.vocab;
  items.forEach((p, i) => {
    const k = p.tokens.length;
    const b = Math.max(0, Math.min(k, Math.floor(budgets[i] ?? k)));
    ctx.running.get(p.id)?.metrics.recordBudget(k, b);
    if (b === k) return;
    const trimmed: DraftProposal = {
      id: p.id,
      tokens: p.tokens.subarray(0, b),
      // q on the device keeps its first row; its host copy is made only if read
      ...(p.deviceProbs !== undefined
        ? { deviceProbs: p.deviceProbs }
        : p.probs === undefined
          ? {}
          : { probs: p.probs.subarray(0, b * (p.probsIds?.length ?? V)) }),
      ...(p.probsIds === undefined ? {} : { probsIds: p.probsIds }),
      ...(p.parents === undefined ? {} : { parents: p.parents.subarray(0, b) }),
      confidence: p.confidence.subarray(0, b),
    };
    if (p.deviceProbs !== undefined)
      Object.defineProperty(trimmed, 'probs', { enumerable: true, get: () => p.probs?.subarray(0, b * V) });
    proposals.set(p.id, trimmed);
  });
}

/**
 * The logprobs of a sequence's committed tokens this step (SpecRequest.logprobs; logprobs.ts): committed token j
 * (drafts[0, accepted) then the bonus) from the verify row before it — block row j of a chain, `path[j]` of a
 * tree — whether the token is an accepted draft, the recovered token or a fresh bonus. Undefined for a request
 * that did not ask.
 */
export function committedLogprobs(ctx: StepContext, verified: Verified, o: Outcome): TokenLogprob[] | undefined {
  const topN = o.seq.req.logprobs;
  if (topN === undefined) return undefined;
  const V = ctx.vocab;
  // every verify block asks for all its logits, so the block's logit rows start at its first row
  const lg = verified.res.logits!;
  const committed = [...o.drafts.subarray(0, o.acc.accepted), o.acc.bonus];
  return committed.map((t, j) => {
    const x = o.row + (o.path?.[j] ?? j);
    return tokenLogprob(lg.subarray(x * V, (x + 1) * V), t, topN);
  });
}
