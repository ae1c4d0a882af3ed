/**
 * A drafter spread over the ranks of a tensor-parallel target (tp ranks as worker
 * threads, each holding its shard of the weights: attention heads, …; draft KV heads replicated
 * when tp > heads; docs/ARCHITECTURE.md "Tensor parallelism", Drafters).
 *
 * Every rank holds its shard of the draft model, loaded through the drafter plugin's `loadShard`
 * (Megatron layout: its query heads, its KV heads — replicated when tp exceeds them — its block of
 * the MLP; fc, the drafter's own heads and sampling on rank 0 only; a drafter that reuses the
 * target's lm_head calls every rank's target shard's vocab-parallel `lmHead` together) with its own
 * draft KV pool (its KV heads only). {@link TensorParallelDrafter} is the engine's {@link Drafter}: the calls that
 * change draft state or run the draft model — `addSequence`, `freeSequence`,
 * `writeProjectedContextKV`, `propose`, `dispose` — are posted to every worker rank (the forward's
 * request / reply words, tp-model.ts) and run on rank 0 here at the same time (their all-reduces and
 * broadcasts meet in shared memory); the result is rank 0's. The rest — `projectTargetHiddenPartial`
 * (fc is rank 0's), `captureSetter`, `contextLength`, `pagesInUse`, `maxDraftTokens`, `method` — is
 * rank 0's alone. Worker ranks get propose sequences without `rng` and `history` (they never sample).
 * Prefill/decode disaggregation: when rank 0's shard declares `DraftContextTransfer`, so does the wrapper —
 * `pdRegions` and `pdContextEntries` are rank 0's (the other ranks' regions come from
 * `TensorParallelModel.syncRanks`, their entries mirror rank 0's block tables: pd/ranks.ts) and
 * `pdReserveContext` runs on every rank.
 */

import type { SequenceId } from '../kv/paged-kv-pool.js';
import {
  type ContextSpan,
  type DraftBatch,
  type DraftContextTransfer,
  type Drafter,
  type DrafterLoadOptions,
  type DraftProposal,
  type ProjectionFormat,
  hasDraftContextTransfer,
} from '../plugin/drafter-plugin.js';
import type { LocalEntry, MemoryRegion } from '../pd/types.js';
import type { StageInfo } from '../plugin/model-plugin.js';
import { loadDrafterShardOf, type TpDrafterCallRequest } from './rank.js';
import { TensorParallelError, type RankReport, type TensorParallelModel } from './tp-model.js';

let nextDrafterId = 1;

/**
 * Loads the drafter checkpoint `dir` spread over `model`'s ranks: rank 0's shard here first (so a tp
 * that does not fit the drafter is refused before any worker loads), then every worker rank's
 * concurrently. Undefined when the claiming plugin has no `loadShard`.
 * @throws {PluginError} when no plugin claims the checkpoint; the plugin's errors; {@link TensorParallelError}
 *   naming a worker rank that failed (the shards already loaded are dropped).
 */
export async function loadTensorParallelDrafter(
  model: TensorParallelModel,
  dir: string,
  plugins: readonly string[],
  options: Omit<DrafterLoadOptions, 'target'>,
): Promise<TensorParallelDrafter | undefined> {
  const local = await loadDrafterShardOf(dir, plugins, model, model.comm, options);
  if (local === undefined) return undefined;
  const id = nextDrafterId++;
  const opts: Omit<DrafterLoadOptions, 'target'> = {
    maxSequences: options.maxSequences,
    maxTokensPerSequence: options.maxTokensPerSequence,
    ...(options.settings === undefined ? {} : { settings: options.settings }),
    ...(options.contextOnly === undefined ? {} : { contextOnly: options.contextOnly }),
  };
  let replies: ReturnType<typeof model.runOnRanks>['replies'];
  try {
    ({ replies } = model.runOnRanks({ type: 'drafter.load', id, dir, plugins, options: opts }, () => undefined));
  } catch (err) {
    local.drafter.dispose();
    try {
      model.runOnRanks({ type: 'drafter.call', id, name: 'dispose', args: [] }, () => undefined);
    } catch {
      // best effort: the load error is the one to report
    }
    throw err instanceof TensorParallelError
      ? new TensorParallelError(`tensor parallel: loading drafter ${dir}: ${err.message}`, { cause: err })
      : err;
  }
  const ranks: RankReport[] = [
    { rank: 0, threadId: undefined, reads: local.reads },
    ...replies.map((r, k) => ({ rank: r.rank, threadId: model.threadIds[k], reads: r.reads ?? [] })),
  ];
  return new TensorParallelDrafter(model, id, local.drafter, ranks);
}

/** The engine's drafter over a tensor-parallel group (see the module comment). */
export class TensorParallelDrafter implements Drafter, Partial<DraftContextTransfer> {
  private broken: Error | undefined;
  private disposed = false;
  /** PD: rank 0's regions (present when rank 0's shard declares DraftContextTransfer). */
  readonly pdRegions?: () => readonly MemoryRegion[];
  /** PD: rank 0's entries of a sequence (the other ranks' mirror them). */
  readonly pdContextEntries?: (id: SequenceId) => readonly LocalEntry[];
  /** PD (decode side): every rank reserves the draft context's rows. */
  readonly pdReserveContext?: (id: SequenceId, length: number) => void;

  constructor(
    /** The target's group (its ranks run the drafter's shards). */
    private readonly group: TensorParallelModel,
    /** Id of the shards on the worker ranks (`TensorParallelModel.syncRanks` names it). */
    readonly id: number,
    /** Rank 0's shard (this thread): its results are the drafter's. */
    readonly rank0: Drafter,
    /** What each rank's shard read, in rank order (tests assert the blocks). */
    readonly ranks: readonly RankReport[],
  ) {
    if (hasDraftContextTransfer(rank0)) {
      this.pdRegions = () => rank0.pdRegions();
      this.pdContextEntries = (id) => rank0.pdContextEntries(id);
      this.pdReserveContext = (id, length) =>
        this.onAll('pdReserveContext', [id, length], () => rank0.pdReserveContext(id, length));
    }
  }

  get method(): string {
    return this.rank0.method;
  }

  get maxDraftTokens(): number {
    return this.rank0.maxDraftTokens;
  }

  get maxPosition(): number | undefined {
    return this.rank0.maxPosition;
  }

  get pagesInUse(): number {
    return this.rank0.pagesInUse;
  }

  /** Rank 0's (fc lives there). */
  get projectionFormat(): ProjectionFormat | undefined {
    return this.rank0.projectionFormat;
  }

  /** Ranks (tp). */
  get size(): number {
    return this.group.size;
  }

  /** The error that left the drafter's ranks out of step, if any (every later call throws it). */
  failure(): Error | undefined {
    return this.broken;
  }

  captureSetter(target: StageInfo): readonly number[] {
    return this.rank0.captureSetter(target);
  }

  /** Rank 0 only (fc lives there): `[numTokens, hiddenSize]` f32 partial projection. */
  projectTargetHiddenPartial(
    stageTaps: ReadonlyMap<number, Float32Array>,
    numTokens: number,
    accumulator?: Float32Array,
  ): Float32Array {
    return this.rank0.projectTargetHiddenPartial(stageTaps, numTokens, accumulator);
  }

  /** Every rank writes its KV heads' context entries from the same `sum` `[Σ numTokens, hiddenSize]` f32. */
  writeProjectedContextKV(sum: Float32Array, spans: readonly ContextSpan[]): void {
    this.onAll('writeProjectedContextKV', [sum, spans], () => this.rank0.writeProjectedContextKV(sum, spans));
  }

  /** Every rank runs the draft model; rank 0 embeds, samples and returns the proposals. */
  propose(batch: DraftBatch): DraftProposal[] {
    const sequences = batch.sequences.map((s) => ({
      id: s.id,
      position: s.position,
      lastToken: s.lastToken,
      maxDrafts: s.maxDrafts,
      sampling: s.sampling,
    }));
    return this.onAll('propose', [{ sequences }], () => this.rank0.propose(batch));
  }

  addSequence(id: SequenceId): void {
    this.onAll('addSequence', [id], () => this.rank0.addSequence(id));
  }

  contextLength(id: SequenceId): number {
    return this.rank0.contextLength(id);
  }

  freeSequence(id: SequenceId): void {
    this.onAll('freeSequence', [id], () => this.rank0.freeSequence(id));
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    try {
      if (this.group.failure() === undefined)
        this.group.runOnRanks(this.request('dispose', []), () => this.rank0.dispose());
      else this.rank0.dispose();
    } catch {
      // the group is gone or broken: rank 0's shard is dropped regardless
      this.rank0.dispose();
    }
  }

  /**
   * Test hook: calls `name(...args)` on every rank's shard at once (e.g. DFlash's `runBlocks`) and
   * returns rank 0's result. `args` must be structured-cloneable.
   * @internal
   */
  invoke(name: string, args: readonly unknown[]): unknown {
    const f = (this.rank0 as unknown as Record<string, unknown>)[name];
    if (typeof f !== 'function')
      throw new TensorParallelError(`tensor parallel: drafter ${this.method} has no method ${name}`);
    return this.onAll(name, args, () => (f as (...a: unknown[]) => unknown).apply(this.rank0, args as unknown[]));
  }

  private request(name: string, args: readonly unknown[]): TpDrafterCallRequest {
    return { type: 'drafter.call', id: this.id, name, args };
  }

  private onAll<T>(name: string, args: readonly unknown[], local: () => T): T {
    if (this.broken !== undefined) throw this.broken;
    if (this.disposed) throw new TensorParallelError(`tensor parallel: drafter ${this.method}: disposed`);
    return this.group.runOnRanks(this.request(name, args), local, (err) => {
      this.broken = new TensorParallelError(
        `tensor parallel: drafter ${this.method}: ranks out of step after a failed ${name}: ${err.message}`,
        { cause: err },
      );
    }).value;
  }
}
