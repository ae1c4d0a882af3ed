/**
 * The drafter contract: a package that owns a speculative-decoding method (`dflash`, `dspark`,
 * `eagle3`, prompt lookup, …) implements {@link DrafterPlugin} (the factory, registered under
 * `DRAFTER_PLUGIN`) and returns a {@link Drafter} (the loaded instance), usually a subclass of
 * `DrafterBase` (drafter-base.ts: the lifecycle with defaults over core's `DraftKvCache`).
 * The engine knows only these types and never branches on a method name. A plugin declares the
 * `apiVersion` it was built for; a package whose plugins declare another version than core's
 * `PLUGIN_API_VERSION` is refused at load (registry.ts).
 *
 * Lifecycle of a loaded drafter:
 * - load: `DrafterPlugin.load(source, {target, …})` validates the checkpoint against the target and packs weights;
 * - capture: `captureSetter(target)` names the target taps it needs (pinned convention, REFERENCE.md §2), or none;
 * - add: `addSequence(id)` before a sequence's prefill;
 * - project: `projectTargetHiddenPartial(stageTaps, …)` on every stage that owns taps (Σ h_i·W_iᵀ, fp32);
 * - materialise: `writeProjectedContextKV(sum, spans)` on the last stage, for prefill chunks and committed tokens;
 * - propose: `propose(batch)` → drafts per sequence (+ q for sampling, or a tree);
 * - free: `freeSequence(id)` when a sequence finishes or is aborted (idempotent);
 * - dispose: `dispose()` drops weights and pools.
 * Prefill/decode disaggregation (handing a draft context from a prefill to a decode instance) is not part
 * of this contract: it is the capability {@link DraftContextTransfer}, which a drafter declares with
 * `implements` (a drafter without it is refused by PD at startup, pd/manifest.ts `checkPdDrafter`).
 *
 * Glossary (used by the engine and metrics): a *draft* is a proposed token; *verify* is the one
 * target forward over `[last verified token, drafts…]`; *accepted* drafts are the longest prefix
 * the verifier keeps; the *bonus* is the target's own token after them (recovered at a rejection,
 * or after the last draft); *committed* = accepted + 1. τ (acceptance length) has two definitions,
 * never mixed: `tauPerStep` = mean over verify steps of (accepted + 1), and `tauPerDraft` = 1 + accepted /
 * draft steps (verify steps with ≥ 1 draft; vLLM's mean acceptance length); `tauMeanOfRequests` = mean over
 * requests of each request's `tauPerStep` is an average of averages (REFERENCE.md §1, §6; docs/ARCHITECTURE.md).
 */

import type { CheckpointSanity } from '../io/checkpoint-sanity.js';
import type { HfConfig } from '../io/hf-config.js';
import type { SafetensorsCheckpoint } from '../io/safetensors-checkpoint.js';
import type { TensorRead } from '../io/weight-reader.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { LocalEntry, MemoryRegion } from '../pd/types.js';
import type { StageInfo, StageModel, TpComm } from './model-plugin.js';

/** A drafter checkpoint to load: its directory, parsed `config.json` and weights. */
export interface DrafterSource {
  readonly dir: string;
  readonly config: HfConfig;
  readonly weights: SafetensorsCheckpoint;
  /**
   * The load's checkpoint sanity policy (io/checkpoint-sanity.ts): the plugin hands it to its `WeightReader`
   * and reports its own config and vocabulary findings through it. Absent: mode `'refuse'`.
   */
  readonly sanity?: CheckpointSanity;
}

/** Options of {@link DrafterPlugin.load}. */
export interface DrafterLoadOptions {
  /**
   * The target stage whose embedding / lm_head a drafter may reuse (`embedTokens`, `lmHead`) and
   * whose geometry it must match (hidden size, vocabulary, taps).
   */
  readonly target: StageModel;
  /** Sequences drafted at once, at most (sizes the draft KV pool). */
  readonly maxSequences: number;
  /** Tokens per sequence, at most (prompt + generated; sizes the draft KV pool). */
  readonly maxTokensPerSequence: number;
  /**
   * The deployment config's `drafter` object (its method's schema branch, validated, defaults filled in),
   * when the drafter was chosen by a config; absent otherwise.
   */
  readonly settings?: Readonly<Record<string, unknown>>;
  /**
   * Context-KV-only (a prefill-only producer, REFERENCE.md §4 / §8): load only what
   * `projectTargetHiddenPartial` and `writeProjectedContextKV` need (projection, per-layer draft KV
   * path); `propose` then throws a {@link DrafterError}. A drafter without such a mode loads fully.
   * Default false.
   */
  readonly contextOnly?: boolean;
  /**
   * Keep each context row's projected feature besides its draft KV, for prefill/decode disaggregation that sends
   * features instead of draft KV (`pd.draft_context` "features" or "auto"; {@link DraftContextFeatures}). A
   * drafter without that capability ignores it. Default false.
   */
  readonly pdFeatures?: boolean;
}

/**
 * Options of {@link DrafterPlugin.loadShard}: the load options plus the rank's collectives. `target`
 * is the rank's shard of the target: on rank 0 it embeds (`embedTokens`); on every rank it has the
 * vocab-parallel `lmHead`, a collective (each rank computes its vocabulary slice, all-gathered), so
 * a drafter that reuses it calls it on every rank at once with the same rows.
 */
export interface DrafterShardLoadOptions extends DrafterLoadOptions {
  /** The rank's collectives (rank, size, allReduce, broadcast, allGather) — the target's group. */
  readonly comm: TpComm;
  /** Called with the rank's weight reads once loaded (tensors and row / column blocks, in order). */
  readonly onReads?: (reads: readonly TensorRead[]) => void;
}

/** JSON-schema fragment of a method's config branch (validation lives elsewhere; discriminator `method`). */
export type DrafterSchema = Readonly<Record<string, unknown>>;

/**
 * A drafting method. Registered under `DRAFTER_PLUGIN`; chosen by the checkpoint's `architectures`,
 * or — for a method without a checkpoint (prompt lookup) — by the config's `drafter.method`.
 */
export interface DrafterPlugin {
  /** The plugin API version it was built for: core's `PLUGIN_API_VERSION` (a mismatch is refused at load). */
  readonly apiVersion: number;
  /** Method name, e.g. `'dflash'`. */
  readonly method: string;
  /** `config.json` `architectures` entries it accepts (e.g. `DFlashDraftModel`). */
  readonly architectures: readonly string[];
  /** Its branch of the specd config schema (`{ properties: { method: { const } , … } }`). */
  readonly schema: DrafterSchema;
  /** load: validates the checkpoint against the target and builds a drafter. */
  load(source: DrafterSource, options: DrafterLoadOptions): Promise<Drafter>;
  /**
   * load, for methods that need no checkpoint (their `architectures` may be empty): builds a drafter
   * from the options alone (`settings` = the config's `drafter` branch). Absent: the method needs a checkpoint.
   */
  loadWithoutCheckpoint?(options: DrafterLoadOptions): Promise<Drafter>;
  /**
   * load, tensor-parallel (optional): rank `options.comm.rank`'s shard of the drafter, Megatron layout
   * (docs/ARCHITECTURE.md "Tensor parallelism", Drafters): q_proj rows of the rank's heads, k/v_proj rows
   * of its KV heads (replicated when comm.size exceeds the KV heads), o_proj columns, gate/up rows and
   * down columns of its 1/size of the intermediate width; norms replicated; the context projection
   * (fc), the drafter's own heads and sampling on rank 0 only. The result is SPMD: core
   * (tensor-parallel/tp-drafter.ts) calls `addSequence`, `freeSequence`, `writeProjectedContextKV`,
   * `propose` and `dispose` with the same arguments on every rank at once — they run collectives of
   * `comm` inside (all-reduce after o_proj and down_proj; rank 0's embeddings broadcast) — and uses
   * rank 0's return values; `projectTargetHiddenPartial` and `captureSetter` are called on rank 0 only.
   * Worker ranks get propose sequences without a usable `rng` and `history` (they never sample).
   * @throws {DrafterError} when comm.size does not fit the drafter (naming the head / KV head /
   *   intermediate counts), plus {@link load}'s errors.
   */
  loadShard?(source: DrafterSource, options: DrafterShardLoadOptions): Promise<Drafter>;
  /**
   * project on a pipeline stage (optional): loads only the projection blocks of `options.taps` — the
   * taps one stage produces (`stageTaps`) — so the stage adds its share `Σ_{i ∈ stage} h_i·W_iᵀ` into
   * the fp32 accumulator it hands on instead of shipping its taps (REFERENCE.md §8). The result must
   * add, tap by tap in ascending order, exactly what the loaded drafter's `projectTargetHiddenPartial`
   * adds for those taps (bit for bit), so the sum does not depend on the partition.
   * Absent: stages ship their raw taps and the last stage projects them all.
   * @throws {DrafterError} for a tap the drafter does not read, or a bad checkpoint.
   */
  loadProjection?(source: DrafterSource, options: ProjectionLoadOptions): PartialProjection;
}

/**
 * The weight format of a context projection (core's TapProjection): `'bf16'`, the checkpoint's blocks; `'q8_0'`, GGUF
 * Q8_0 blocks with int16 activations.
 */
export type ProjectionFormat = 'bf16' | 'q8_0';

/** Options of {@link DrafterPlugin.loadProjection}. */
export interface ProjectionLoadOptions {
  /** The taps to load blocks for (a subset of the drafter's `captureSetter`; may be empty). */
  readonly taps: readonly number[];
  /** The target's hidden size (checked against the checkpoint). */
  readonly hiddenSize: number;
  /** The loaded drafter's {@link Drafter.projectionFormat} (default `'bf16'`): the partial sums' bits depend on it. */
  readonly format?: ProjectionFormat;
}

/** A stage's share of a drafter's context projection ({@link DrafterPlugin.loadProjection}). */
export interface PartialProjection {
  /** The taps it has weights for, ascending. */
  readonly taps: readonly number[];
  /** Tensor reads that built it (what the stage loaded: e.g. `fc.weight` columns of its taps). */
  readonly reads: readonly TensorRead[];
  /** As {@link Drafter.projectTargetHiddenPartial}, for {@link taps} only. */
  projectTargetHiddenPartial(
    stageTaps: ReadonlyMap<number, Float32Array>,
    numTokens: number,
    accumulator?: Float32Array,
  ): Float32Array;
  /** Drops the weights. */
  dispose(): void;
}

/** Rows of a context batch that belong to one sequence (`[numTokens, ·]` tensors are concatenated in span order). */
export interface ContextSpan {
  readonly id: SequenceId;
  /** Absolute position of the span's first token; must equal the sequence's draft context length. */
  readonly position: number;
  /** Tokens of the span (rows). */
  readonly numTokens: number;
  /**
   * The committed token that follows each row, `[numTokens]` i32: `nextTokens[i]` is the token at
   * absolute position `position + i + 1` (for the last row: the next prompt token, the first
   * generated token, or the step's bonus). Drafters whose context entry of position t also reads
   * x_{t+1} (EAGLE-3: [embed(x_{t+1}); fc(taps_t)], REFERENCE.md §5) need it; the engine always
   * supplies it. Other drafters ignore it.
   */
  readonly nextTokens?: Int32Array;
}

/** A uniform random source in [0, 1) (the engine's seeded PRNG of the request). */
export interface RandomSource {
  next(): number;
}

/** Temperature / top-k / top-p of a request (REFERENCE.md §6: applied to q and to p alike). */
export interface DraftSampling {
  /** 0 = greedy (argmax drafts, no q). */
  readonly temperature: number;
  readonly topK?: number;
  readonly topP?: number;
}

/** Where a proposal's q lies in device memory ({@link DraftProposal.deviceProbs}). Immutable. */
export interface DeviceDraftProbs {
  /** The device, as the stages name it (`'cuda'`). */
  readonly device: string;
  /** The device address of q's first row, `[k, vocabSize]` f32 row-major (a buffer the device's addon lends). */
  readonly address: bigint;
}

/** One sequence to draft for. Immutable. */
export interface DraftSequence {
  readonly id: SequenceId;
  /** Position of the last verified token (= tokens already committed to the target and the draft context). */
  readonly position: number;
  /** The last verified token id (the bonus of the previous step, or the first generated token). */
  readonly lastToken: number;
  /** Drafts wanted at most for this sequence this step (≥ 1; chosen by the engine each step). */
  readonly maxDrafts: number;
  /**
   * Every token of the sequence so far, prompt + generated, `[position + 1]` i32 (n-gram / prompt lookup drafters read
   * it; a view valid during the call).
   */
  readonly history: Int32Array;
  readonly sampling: DraftSampling;
  /** The request's PRNG (sampled drafts). */
  readonly rng: RandomSource;
}

/** A propose batch. Immutable. */
export interface DraftBatch {
  readonly sequences: readonly DraftSequence[];
}

/** Drafts of one sequence. */
export interface DraftProposal {
  readonly id: SequenceId;
  /** Draft token ids in the target vocabulary, `[k]` i32, 0 ≤ k ≤ maxDrafts. */
  readonly tokens: Int32Array;
  /**
   * Draft distributions q, after temperature / top-k / top-p, `[k, vocabSize]` f32 (target
   * vocabulary), when drafts were sampled; absent for argmax drafts (a point mass, REFERENCE.md §6).
   */
  readonly probs?: Float32Array;
  /**
   * The token ids q's columns stand for, `[W]` i32, distinct, each in [0, vocabSize), when the drafter samples over a
   * reduced vocabulary (FR-Spec, EAGLE-3's draft vocabulary): `probs` is then `[k, W]` f32 and q is 0 for every token
   * not listed. Absent: `probs` covers the whole target vocabulary. Pass the same array with every proposal (the
   * engine keeps its inverse by identity); the W floats a draft spare writing out `[k, vocabSize]` (and the allocation
   * of them) on every sampled step.
   */
  readonly probsIds?: Int32Array;
  /**
   * q kept in device memory by a drafter that runs beside its target on the same device (a GPU drafter): the
   * target's {@link DeviceSampling} stage reads it there when it accepts it (`acceptsDeviceProbs`), so the k · vocab
   * floats never cross to the host. A proposal with it still answers `probs` (copied back on demand) for the host
   * path; the engine reads one or the other. Valid until the drafter's next propose.
   */
  readonly deviceProbs?: DeviceDraftProbs;
  /** Tree drafts: parent index of each draft (−1 = the last verified token), `[k]` i32; absent = a chain. */
  readonly parents?: Int32Array;
  /**
   * Per-draft confidence in (0, 1), `[k]` f32, from drafters with a confidence head (e.g. DSpark:
   * P(draft j accepted | drafts before it accepted)); absent when the drafter has none. Informational.
   */
  readonly confidence?: Float32Array;
}

/**
 * The taps a pipeline stage produces, of those a drafter needs (REFERENCE.md §2, §8): tap t is the
 * output of layer t − 1, so the stage owning layer t − 1 (`layerStart < t ≤ layerEnd`) produces it;
 * tap 0 (the embeddings) belongs to the first stage. A tap on a stage boundary goes to the earlier
 * stage; a stage may produce none (an empty capture stage).
 */
export function stageTaps(
  taps: readonly number[],
  stage: Pick<StageInfo, 'layerStart' | 'layerEnd' | 'isFirst'>,
): number[] {
  return taps.filter((t) => (t === 0 ? stage.isFirst : t > stage.layerStart && t <= stage.layerEnd));
}

/** Thrown by drafters: bad checkpoint for this target, unsupported call, unknown sequence. */
export class DrafterError extends Error {
  override readonly name = 'DrafterError';
}

/** A loaded drafter (one method instance bound to one target). */
export interface Drafter {
  readonly method: string;
  /** Drafts per step at most (e.g. DFlash: block_size − 1). */
  readonly maxDraftTokens: number;
  /**
   * Positions the draft model handles (its `max_position_embeddings`: RoPE as trained); absent: no limit. The
   * engine stops drafting for a sequence once a full draft step would use a position at or past it — its drafts
   * would be noise (DFlash's τ fell to 1.03 there) — and counts those steps (`RunMetrics.positionLimitedSteps`).
   */
  readonly maxPosition?: number;
  /**
   * capture: tap ids the drafter needs, pinned convention (REFERENCE.md §2); `[]` for none.
   * @throws {DrafterError} if the target lacks one.
   */
  captureSetter(target: StageInfo): readonly number[];
  /**
   * The weight format of its context projection (core's TapProjection), which the stages of a pipeline must load
   * theirs in for the partial sums to add up bit for bit ({@link ProjectionLoadOptions.format}); absent: `'bf16'`.
   */
  readonly projectionFormat?: ProjectionFormat;
  /**
   * project: this stage's share of the context projection, `Σ_{i ∈ stage} h_i · W_iᵀ`, added into
   * `accumulator` (`[numTokens, hiddenSize]` f32, created zeroed when absent) and returned.
   * @param stageTaps tap id → `[numTokens, hiddenSize]` f32, the taps this stage owns (may be none); read only
   *   and not kept after the call (the engine may pass views of a forward's taps).
   */
  projectTargetHiddenPartial(
    stageTaps: ReadonlyMap<number, Float32Array>,
    numTokens: number,
    accumulator?: Float32Array,
  ): Float32Array;
  /**
   * materialise: norm after the sum, per draft layer K/V, k-norm, RoPE at the spans' absolute
   * positions, written into the draft KV pages (appended to each sequence's context).
   * @param sum `[Σ numTokens, hiddenSize]` f32, the full projection.
   */
  writeProjectedContextKV(sum: Float32Array, spans: readonly ContextSpan[]): void;
  /** propose: drafts for every sequence of the batch (same order). Leaves the draft context unchanged. */
  propose(batch: DraftBatch): DraftProposal[];
  /** add: registers a sequence (empty draft context). */
  addSequence(id: SequenceId): void;
  /** Draft context tokens of `id`. */
  contextLength(id: SequenceId): number;
  /** free: drops everything `id` holds (pages). Idempotent. */
  freeSequence(id: SequenceId): void;
  /** Draft KV pages in use over all sequences (0 for drafters without KV). */
  readonly pagesInUse: number;
  /** dispose: drops weights and pools. */
  dispose(): void;
}

/**
 * Prefill/decode disaggregation (PD, pd/types.ts): a drafter that declares this capability says which bytes
 * make up a sequence's draft context, so a prefill instance (P) can hand it to a decode instance (D) that
 * continues drafting exactly where an aggregated run would. It is opt-in: a drafter that keeps per-sequence
 * state core does not know of would silently lose it under a default, so a drafter without it is refused
 * (pd/manifest.ts `checkPdDrafter`). DrafterBase has helpers that build all three from its DraftKvCache.
 *
 * Protocol: P runs the prompt (P tokens), writes the draft context (`writeProjectedContextKV`, P rows), then
 * sends the bytes of `pdContextEntries(id)`; D calls `addSequence(id)`, `pdReserveContext(id, P)`, receives
 * the bytes into the ranges of its own `pdContextEntries(id)`, then drafts from position P.
 */
export interface DraftContextTransfer {
  /**
   * Every memory region that holds some sequence's draft context (the K and V page stores of each draft
   * layer, a per-slot state pool, …), registered once with the transfer engine: the same regions for the
   * drafter's whole life (until `dispose`). Ids are unique within the drafter (`'draft-kv/0/k'`, …).
   */
  pdRegions(): readonly MemoryRegion[];
  /**
   * Where `id`'s draft context lives, in send order, keys of rank 0: `'draft-kv'` layer j part `'k'` / `'v'`
   * (the sequence's pages, block-table order, adjacent pages coalesced), `'draft-state'` for other
   * per-sequence state (part named by the drafter). `[]` for a drafter whose context is the token ids alone.
   * @throws `CacheError` `unknown-sequence` for a sequence never added.
   */
  pdContextEntries(id: SequenceId): readonly LocalEntry[];
  /**
   * D: grows the freshly added `id` to a draft context of `length` rows whose contents the transfer writes:
   * pages allocated (all or nothing), per-sequence state made present. The context is not usable until the
   * bytes of every entry of `pdContextEntries(id)` arrived.
   * @throws {DrafterError} if `id`'s context is not empty or `length` is not an integer ≥ 0; `CacheError`
   *   `full` (nothing allocated) or `unknown-sequence`.
   */
  pdReserveContext(id: SequenceId, length: number): void;
}

/**
 * Optional capability of a {@link DraftContextTransfer} drafter whose draft KV rows are a function of one
 * projected feature per context row (DFlash, DSpark: K = RoPE(k_norm(k_proj f)), V = v_proj f per layer): P may
 * send the features `[rows, featureWidth]` instead of every layer's K and V, and D rebuild the rows (prefill/decode
 * `pd.draft_context` "features" / "auto"; docs/PLUGINS.md). Needs the drafter loaded with
 * {@link DrafterLoadOptions.pdFeatures}.
 */
export interface DraftContextFeatures {
  /** Floats per feature row (the drafter's hidden size); 0 when the drafter was loaded without features. */
  readonly pdFeatureWidth: number;
  /**
   * The `'draft-features'` entry of `id` (layer 0, part `''`, rank 0): the feature pages of the rows D must rebuild
   * — every row when some draft layer attends the whole context, else the rows of the widest window — in
   * block-table order. `[]` when loaded without features.
   * @throws `CacheError` `unknown-sequence`.
   */
  pdFeatureEntries(id: SequenceId): readonly LocalEntry[];
  /**
   * D, once the features of `pdFeatureEntries(id)` arrived: computes each draft layer's K/V of those rows into the
   * pages `pdReserveContext` allocated, exactly (the same bits) as P computed them. Returns the rows rebuilt.
   * @throws {DrafterError} when loaded without features; `CacheError` `unknown-sequence`.
   */
  pdRebuildFromFeatures(id: SequenceId): number;
}

/** Whether `drafter` can send its context as features ({@link DraftContextFeatures}, loaded with them). */
export function hasDraftContextFeatures<D extends Drafter>(drafter: D): drafter is D & DraftContextFeatures {
  const d = drafter as Partial<DraftContextFeatures>;
  return (
    typeof d.pdFeatureWidth === 'number' &&
    d.pdFeatureWidth > 0 &&
    typeof d.pdFeatureEntries === 'function' &&
    typeof d.pdRebuildFromFeatures === 'function'
  );
}

/** Whether `drafter` declares {@link DraftContextTransfer} (all three methods present). */
export function hasDraftContextTransfer<D extends Drafter>(drafter: D): drafter is D & DraftContextTransfer {
  const d = drafter as Partial<DraftContextTransfer>;
  return (
    typeof d.pdRegions === 'function' &&
    typeof d.pdContextEntries === 'function' &&
    typeof d.pdReserveContext === 'function'
  );
}
