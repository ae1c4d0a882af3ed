/**
 * The EAGLE-3 drafter on the GPU (issue 18): the same drafter contract and the same math as {@link Eagle3Drafter}
 * (eagle3.ts, module comment; oracle tools/reference/specd_ref/eagle3.py), with the draft model in
 * @specd/native-cuda's EAGLE-3 runner (packages/native-cuda/src/eagle3_runner.cc) beside a target that runs on the
 * same GPU (the CUDA Llama stage). Chosen by the plugin when the target stage exposes its CUDA device
 * ({@link cudaDeviceOf}: a stage with `cudaDevice()`, found by shape — core names no device capability) and the
 * deployment config's `drafter.device` is `"auto"` (default) or `"cuda"`.
 *
 * What lives where:
 * - on the device (the runner): bf16 weights (fc `[D, T·D]`, q|k|v `[(H + 2·KV)·hd, 2D]`, o, gate|up, down,
 *   lm_head `[draftVocab, D]`), the four norms, d2t, its own copy of the target's bf16 token embedding (uploaded
 *   once at load), the draft KV values (one layer, fp32 K and V pages) and the last-feature slots g
 *   `[maxSequences, D]` f32;
 * - here: the page bookkeeping (core's {@link DraftKvCache} with storage `'device'`: block tables, slots, context
 *   lengths) and which g slot each sequence holds.
 *
 * Context entries: the engine calls `projectTargetHiddenPartial` then `writeProjectedContextKV` with what it
 * returned. Here projecting does no arithmetic on the host: it returns the rows' taps concatenated in the
 * drafter's tap order, `[n, T·D]` f32 (fc's column blocks), remembered by identity, and `writeProjectedContextKV`
 * hands them to the device, where fc, the layer input, K/V (RoPE at the rows' positions) and the g slots are
 * computed in one call that is not waited for. A sum that did not come from this drafter's `projectTargetHiddenPartial`
 * (`[n, D]` f32, the contract's projection) is written as g directly.
 *
 * Propose: greedy sequences (temperature 0) draft their chain on the device in one call — every step, the argmax
 * over the draft vocabulary mapped through d2t into the next step's token, a CUDA graph per (padded sequences, k)
 * — and only the draft ids come back. Sampled sequences (temperature > 0) run the same steps one call per step, each
 * drawing its draft on the device (`eagle3StepSample`, the target's sampling kernels: temperature / top-k / top-p over
 * the draft vocabulary, as the CPU drafter, with one draw of the request's generator handed over); q, in the target
 * vocabulary, stays on the device for the CUDA stage's rejection sampling (the proposal's `deviceProbs`), so it stays
 * lossless with only draft ids crossing to the host; reading the proposal's `probs` copies q back. The chain's
 * entries are temporary rows of the draft KV, reserved here before the call and dropped after it, whether it returns
 * or throws.
 *
 * Not here: trees (the CUDA stage cannot verify them, so the plugin refuses `tree` for it at load), tensor
 * parallelism (the CUDA stage is one GPU) and prefill/decode disaggregation (the draft context lives in device
 * memory: this drafter does not declare {@link DraftContextTransfer}, so PD refuses it at startup).
 */

import {
  DeviceQRows,
  DrafterBase,
  DrafterError,
  CacheError,
  DraftKvCache,
  Int32RowViews,
  PackedTaps,
  lentCudaDevice,
  type LentCudaDevice,
  type ContextSpan,
  type DraftBatch,
  type DraftProposal,
  type DraftSequence,
  type SequenceId,
  type StageInfo,
  type StageModel,
} from '@specd/core';

import { eagle3Taps, type Eagle3Config } from './config.js';

/** An opaque device object of the CUDA addon (a runner). */
export type CudaHandle = { readonly __device: unique symbol };

/**
 * The functions of @specd/native-cuda's EAGLE-3 runner this drafter calls (src/eagle3_runner.cc has each
 * contract; its index.d.ts the same signatures). Structural: the addon object comes from the target stage, so this
 * plugin never imports @specd/native-cuda and machines without CUDA never load it.
 */
export interface Eagle3CudaAddon {
  eagle3Create(options: {
    readonly hiddenSize: number;
    readonly numHeads: number;
    readonly numKvHeads: number;
    readonly headDim: number;
    readonly intermediateSize: number;
    readonly vocabSize: number;
    readonly draftVocabSize: number;
    readonly numTaps: number;
    readonly ropeTheta: number;
    readonly rmsNormEps: number;
    readonly normBeforeResidual: boolean;
    readonly maxSequences: number;
    readonly maxDraftTokens: number;
  }): CudaHandle;
  eagle3AllocKv(runner: CudaHandle, pageSize: number, numPages: number, maxModelLen: number): void;
  eagle3SetWeight(runner: CudaHandle, name: string, data: Uint16Array | Float32Array | Int32Array): void;
  eagle3ContextWrite(
    runner: CudaHandle,
    rows: Float32Array,
    fromTaps: boolean,
    nextTokens: Int32Array,
    positions: Int32Array,
    slots: Int32Array,
    gSlotOfRow: Int32Array,
  ): void;
  eagle3Chain(
    runner: CudaHandle,
    gSlots: Int32Array,
    tokens: Int32Array,
    positions: Int32Array,
    blockTables: Int32Array,
    stepSlots: Int32Array,
    lengths: Int32Array,
    k: number,
    useGraph: boolean,
  ): Int32Array;
  eagle3Step(
    runner: CudaHandle,
    j: number,
    gSlots: Int32Array,
    tokens: Int32Array,
    positions: Int32Array,
    blockTables: Int32Array,
    stepSlots: Int32Array,
    lengths: Int32Array,
  ): { readonly argmax: Int32Array; readonly logits: Float32Array };
  eagle3StepSample(
    runner: CudaHandle,
    j: number,
    gSlots: Int32Array,
    tokens: Int32Array,
    positions: Int32Array,
    blockTables: Int32Array,
    stepSlots: Int32Array,
    lengths: Int32Array,
    request: {
      readonly groups: Int32Array;
      readonly temperature: Float64Array;
      readonly topP: Float64Array;
      readonly drafts: Int32Array;
      readonly uniforms: Float64Array;
    },
  ): { readonly ids: Int32Array; readonly qAddress: bigint };
  eagle3Probs(runner: CudaHandle, row: number, rows: number): Float32Array;
  eagle3Synchronize(runner: CudaHandle): void;
  eagle3ReplayMs(runner: CudaHandle, reps: number, k?: number, sequences?: number): number;
  eagle3Info(runner: CudaHandle): {
    readonly weightBytes: number;
    readonly kvBytes: number;
    readonly activationBytes: number;
    readonly maxBlocks: number;
    readonly graphs: string[];
  };
  eagle3Dispose(runner: CudaHandle): void;
}

/** What a target stage on a CUDA GPU lends drafters that run beside it (core's {@link LentCudaDevice}). */
export type CudaTargetDevice = LentCudaDevice<Eagle3CudaAddon>;

/**
 * The CUDA device of `target` when it runs on one: a stage with a `cudaDevice()` method (the CUDA Llama stage)
 * whose addon has the EAGLE-3 runner; undefined otherwise (a CPU stage, or an addon built before the runner).
 */
export function cudaDeviceOf(target: StageModel): CudaTargetDevice | undefined {
  return lentCudaDevice<Eagle3CudaAddon>(target, 'eagle3Create');
}

/** The draft model's weights for the device, row-major bf16 bits (norms f32), as the runner takes them. */
export interface Eagle3CudaWeights {
  /** fc `[D, T·D]` (column block i: tap `config.taps[i]`). */
  readonly fc: Uint16Array;
  /** q_proj ; k_proj ; v_proj stacked `[(H + 2·KV)·hd, 2D]`. */
  readonly qkv: Uint16Array;
  /** o_proj `[D, H·hd]`. */
  readonly o: Uint16Array;
  /** gate_proj ; up_proj stacked `[2I, D]`. */
  readonly gateUp: Uint16Array;
  /** down_proj `[D, I]`. */
  readonly down: Uint16Array;
  /** lm_head `[draftVocab, D]`. */
  readonly lmHead: Uint16Array;
  readonly inputNorm: Float32Array;
  readonly hiddenNorm: Float32Array;
  readonly postNorm: Float32Array;
  readonly finalNorm: Float32Array;
  /** Target id of each draft id, `[draftVocab]` i32. */
  readonly draftToTarget: Int32Array;
}

/** Sizes of {@link Eagle3CudaDrafter.create}. */
export interface Eagle3CudaSizes {
  /** Drafts per step at most (the chain length). */
  readonly maxDraftTokens: number;
  /** Sequences at once, at most. */
  readonly maxSequences: number;
  /** Tokens per sequence, at most (prompt + generated). */
  readonly maxTokensPerSequence: number;
}

/** The EAGLE-3 drafter with its draft model on the GPU (module comment). */
export class Eagle3CudaDrafter extends DrafterBase {
  readonly method = 'eagle3';
  /** Where the draft model runs. */
  readonly device = 'cuda';
  readonly maxDraftTokens: number;
  /** The draft KV page bookkeeping (values on the device). */
  readonly kv: DraftKvCache;
  /** Run greedy chains as CUDA graphs (default true; false launches every kernel, for benches). */
  graphs = true;
  private runner: CudaHandle | undefined;
  /** Block-table entries per sequence of a chain call. */
  private readonly maxBlocks: number;
  private readonly freeGSlots: number[] = [];
  private readonly gSlots = new Map<SequenceId, number>();
  /** The sampled chains' q rows on the device (valid until the next sampled chain). */
  private readonly qRows: DeviceQRows;
  /** Sequences whose g slot holds the g of their last context row. */
  private readonly hasG = new Set<SequenceId>();
  /** Packed taps {@link projectTargetHiddenPartial} returns (core's {@link PackedTaps}). */
  private readonly packedTaps: PackedTaps;
  /**
   * Block tables of chain calls, `[S, maxBlocks]` views of one buffer refilled each call (the runner copies its
   * arguments before it returns).
   */
  private readonly tables: Int32RowViews;

  private constructor(
    readonly config: Eagle3Config,
    private readonly addon: Eagle3CudaAddon,
    runner: CudaHandle,
    /** Target id of each draft id, `[draftVocab]` i32. */
    readonly draftToTarget: Int32Array,
    sizes: Eagle3CudaSizes,
    kv: DraftKvCache,
    /** Positions below which chains run (the runner's RoPE table). */
    readonly maxModelLen: number,
  ) {
    super(kv);
    this.kv = kv;
    this.runner = runner;
    this.maxDraftTokens = sizes.maxDraftTokens;
    this.maxBlocks = addon.eagle3Info(runner).maxBlocks;
    this.tables = new Int32RowViews(this.maxBlocks);
    for (let s = sizes.maxSequences - 1; s >= 0; s--) this.freeGSlots.push(s);
    this.packedTaps = new PackedTaps('eagle3', config.taps, config.hiddenSize, sizes.maxDraftTokens + 1);
    this.qRows = new DeviceQRows('eagle3', config.vocabSize, (row, rows) => addon.eagle3Probs(this.live(), row, rows));
  }

  /**
   * Creates the runner on `device`, uploads the weights and the target's embedding, and allocates the draft KV
   * pool: `DraftKvCache.pagesFor(maxSequences, maxTokensPerSequence + maxDraftTokens)` pages of 16 tokens (the
   * context plus a chain's temporary entries), positions below maxTokensPerSequence + maxDraftTokens.
   * @throws {DrafterError} for sizes that are not positive integers; the addon's RangeError / Error (a failed CUDA
   *   allocation, named) — the runner is freed first.
   */
  static create(
    config: Eagle3Config,
    device: CudaTargetDevice,
    w: Eagle3CudaWeights,
    sizes: Eagle3CudaSizes,
  ): Eagle3CudaDrafter {
    const c = config;
    for (const [name, v] of Object.entries(sizes))
      if (!(Number.isSafeInteger(v) && v >= 1))
        throw new DrafterError(`eagle3: ${name}: expected an integer >= 1, got ${String(v)}`);
    const a = device.addon;
    const runner = a.eagle3Create({
      hiddenSize: c.hiddenSize,
      numHeads: c.numHeads,
      numKvHeads: c.numKvHeads,
      headDim: c.headDim,
      intermediateSize: c.intermediateSize,
      vocabSize: c.vocabSize,
      draftVocabSize: c.draftVocabSize,
      numTaps: c.taps.length,
      ropeTheta: c.ropeTheta,
      rmsNormEps: c.rmsNormEps,
      normBeforeResidual: c.normBeforeResidual,
      maxSequences: sizes.maxSequences,
      maxDraftTokens: sizes.maxDraftTokens,
    });
    try {
      const set = (name: string, data: Uint16Array | Float32Array | Int32Array) =>
        a.eagle3SetWeight(runner, name, data);
      set('embed', device.embedding);
      set('fc', w.fc);
      set('qkv', w.qkv);
      set('o', w.o);
      set('gateUp', w.gateUp);
      set('down', w.down);
      set('lmHead', w.lmHead);
      set('inputNorm', w.inputNorm);
      set('hiddenNorm', w.hiddenNorm);
      set('postNorm', w.postNorm);
      set('finalNorm', w.finalNorm);
      set('d2t', w.draftToTarget);
      const tokens = sizes.maxTokensPerSequence + sizes.maxDraftTokens;
      const kv = new DraftKvCache({
        numLayers: 1,
        numKvHeads: c.numKvHeads,
        headDim: c.headDim,
        numPages: DraftKvCache.pagesFor(sizes.maxSequences, tokens),
        storage: 'device',
      });
      a.eagle3AllocKv(runner, kv.layout.pageSize, kv.layout.numPages, tokens);
      return new Eagle3CudaDrafter(c, a, runner, w.draftToTarget, sizes, kv, tokens);
    } catch (err) {
      a.eagle3Dispose(runner);
      throw err;
    }
  }

  override captureSetter(target: StageInfo): readonly number[] {
    return eagle3Taps(this.config, target);
  }

  /**
   * The rows' taps for {@link writeProjectedContextKV}, which projects them on the device (module comment): every
   * tap of the drafter, `[numTokens, D]` f32 each → `[numTokens, T·D]` f32, row r = the taps' rows r in the
   * drafter's tap order. Not a projection: only this drafter's writeProjectedContextKV reads it.
   * @throws {DrafterError} with an accumulator (a partial projection from pipeline stages: the GPU drafter projects
   *   every tap at once), for a missing or foreign tap, or a tap that is not `[numTokens, D]`.
   */
  override projectTargetHiddenPartial(
    stageTaps: ReadonlyMap<number, Float32Array>,
    numTokens: number,
    accumulator?: Float32Array,
  ): Float32Array {
    return this.packedTaps.pack(stageTaps, numTokens, accumulator);
  }

  /**
   * Context entries of the spans' rows on the device (module comment; eagle3.ts "Context entry"), pages allocated
   * here first (all or nothing: given back if the device call is refused); each span's last row's g kept in its
   * sequence's slot.
   * @param sum what {@link projectTargetHiddenPartial} returned (`[Σ numTokens, T·D]` f32), or a projection
   *   `[Σ numTokens, D]` f32 from elsewhere.
   * @throws {DrafterError} if the drafter was disposed, a span lacks `nextTokens` (or it is not `[numTokens]`), a
   *   position is not the sequence's draft context length, or `sum` has the wrong length; `CacheError` `full`
   *   (nothing allocated); the addon's errors.
   */
  override writeProjectedContextKV(sum: Float32Array, spans: readonly ContextSpan[]): void {
    // a packed buffer is handed over by this call, written or refused (a later projection may reuse it)
    const fromTaps = this.packedTaps.handOver(sum);
    const runner = this.live();
    const c = this.config;
    const width = (fromTaps ? c.taps.length : 1) * c.hiddenSize;
    let n = 0;
    for (const s of spans) n += s.numTokens;
    if (sum.length !== n * width)
      throw new DrafterError(
        `eagle3: writeProjectedContextKV: sum: expected [${n}, ${width}] f32, got length ${sum.length}`,
      );
    for (const s of spans) {
      this.checkContextPosition(s, 'writeProjectedContextKV');
      if (s.nextTokens === undefined)
        throw new DrafterError(
          `eagle3: writeProjectedContextKV: sequence ${String(s.id)}: nextTokens is missing ` +
            "(EAGLE-3's context entry of position t reads the token x_{t+1})",
        );
      if (s.nextTokens.length !== s.numTokens)
        throw new DrafterError(
          `eagle3: writeProjectedContextKV: sequence ${String(s.id)}: nextTokens: expected [${s.numTokens}] i32, ` +
            `got length ${s.nextTokens.length}`,
        );
    }
    if (n === 0) return;
    const positions = new Int32Array(n);
    const next = new Int32Array(n);
    const gSlotOfRow = new Int32Array(n).fill(-1);
    let at = 0;
    for (const s of spans) {
      next.set(s.nextTokens!, at);
      for (let i = 0; i < s.numTokens; i++) positions[at + i] = s.position + i;
      at += s.numTokens;
      if (s.numTokens > 0) gSlotOfRow[at - 1] = this.gSlotOf(s.id);
    }
    this.kv.extendAll(spans);
    try {
      this.addon.eagle3ContextWrite(runner, sum, fromTaps, next, positions, this.kv.slots(spans), gSlotOfRow);
    } catch (err) {
      this.kv.truncateAll(spans.map((s) => ({ id: s.id, position: s.position, numTokens: 0 })));
      throw err;
    }
    this.packedTaps.written(sum);
    for (const s of spans) if (s.numTokens > 0) this.hasG.add(s.id);
  }

  /**
   * Drafts a chain of `maxDrafts` for every sequence (module comment): greedy ones in one device call, sampled ones
   * one call per step with q. Leaves the draft context unchanged (the chain's entries are dropped on every path).
   * @throws {DrafterError} if the drafter was disposed, maxDrafts is outside [1, maxDraftTokens], a position is not
   *   the draft context length, a sequence has no context yet, its chain would pass the runner's positions, or a
   *   step's logits are not finite (greedy); `CacheError` `full` when the draft KV has no page for the chain.
   */
  propose(batch: DraftBatch): DraftProposal[] {
    this.live();
    const seqs = batch.sequences;
    let allGreedy = true;
    for (let i = 0; i < seqs.length; i++) {
      const s = seqs[i]!;
      if (s.sampling.temperature > 0) allGreedy = false;
      this.checkMaxDrafts(s, i, this.maxDraftTokens);
      this.checkProposePosition(s, i);
      if (s.position < 1 || !this.hasG.has(s.id))
        throw new DrafterError(
          `eagle3: propose: sequences[${i}] (${String(s.id)}): no draft context yet ` +
            '(EAGLE-3 drafts from the last context entry)',
        );
      if (s.position + s.maxDrafts - 1 > this.maxModelLen)
        throw new DrafterError(
          `eagle3: propose: sequences[${i}] (${String(s.id)}): a chain of ${s.maxDrafts} from position ` +
            `${s.position} passes the GPU drafter's ${this.maxModelLen} positions`,
        );
    }
    if (allGreedy) {
      const drafts = this.greedyChain(seqs);
      const out: DraftProposal[] = [];
      for (let i = 0; i < seqs.length; i++) out.push({ id: seqs[i]!.id, tokens: drafts[i]! });
      return out;
    }
    const out = new Array<DraftProposal>(seqs.length);
    const greedy: number[] = [];
    const sampled: number[] = [];
    seqs.forEach((s, i) => {
      (s.sampling.temperature > 0 ? sampled : greedy).push(i);
    });
    if (greedy.length > 0) {
      const gs = greedy.map((i) => seqs[i]!);
      const drafts = this.greedyChain(gs);
      greedy.forEach((i, r) => {
        out[i] = { id: seqs[i]!.id, tokens: drafts[r]! };
      });
    }
    if (sampled.length > 0) {
      const ss = sampled.map((i) => seqs[i]!);
      const props = this.sampledChain(ss);
      sampled.forEach((i, r) => {
        out[i] = props[r]!;
      });
    }
    return out;
  }

  /**
   * Test hook (internal), as {@link Eagle3Drafter.forcedChainLogits}: the draft-vocabulary logits
   * `[forced.length + 1, draftVocab]` f32 of the chain steps 1 … forced.length + 1 of `seq` with step j > 1 fed the
   * draft id forced[j − 2] (the stepwise device path). Leaves the draft context unchanged.
   * @internal
   */
  forcedChainLogits(seq: DraftSequence, forced: ArrayLike<number>): Float32Array {
    this.live();
    const Vd = this.config.draftVocabSize;
    if (seq.position !== this.contextLength(seq.id) || seq.position < 1 || !this.hasG.has(seq.id))
      throw new DrafterError(
        `eagle3: forcedChainLogits: sequence ${String(seq.id)}: position ${seq.position} is not a drafting position`,
      );
    const out = new Float32Array((forced.length + 1) * Vd);
    this.stepwiseChain([seq], [forced.length + 1], (_r, j, lg) => {
      out.set(lg, (j - 1) * Vd);
      return j <= forced.length ? forced[j - 1]! : 0;
    });
    return out;
  }

  /**
   * GPU milliseconds per replay of the last greedy chain's CUDA graph (−1 without one), for benches: call it right
   * after a propose (the replays rewrite that chain's temporary entries, which no later write has reused yet). With
   * `k`: the captured chain of k drafts for one sequence instead (−1 if none was captured) — replayed over the last
   * chain's metadata, so only after the run, when no sequence's draft context is needed any more.
   */
  replayMs(reps = 20, k?: number): number {
    return k === undefined
      ? this.addon.eagle3ReplayMs(this.live(), reps)
      : this.addon.eagle3ReplayMs(this.live(), reps, k, 1);
  }

  /** The runner's sizes and captured graphs. */
  runnerInfo(): ReturnType<Eagle3CudaAddon['eagle3Info']> {
    return this.addon.eagle3Info(this.live());
  }

  /**
   * add: registers `id` with an empty draft context and a g slot.
   * @throws `CacheError` `duplicate-sequence`, or `full` when every g slot is taken (maxSequences in use).
   */
  override addSequence(id: SequenceId): void {
    super.addSequence(id);
    const slot = this.freeGSlots.pop();
    if (slot === undefined) {
      super.freeSequence(id);
      throw new CacheError('full', `eagle3: addSequence: no free g slot (${this.gSlots.size} sequences in use)`);
    }
    this.gSlots.set(id, slot);
  }

  /** free: drops the sequence's pages and its g slot. Idempotent. */
  override freeSequence(id: SequenceId): void {
    super.freeSequence(id);
    this.hasG.delete(id);
    const slot = this.gSlots.get(id);
    if (slot === undefined) return;
    this.gSlots.delete(id);
    this.freeGSlots.push(slot);
  }

  /** dispose: frees the runner's device memory and the page bookkeeping (later calls throw). Idempotent. */
  override dispose(): void {
    const runner = this.runner;
    this.runner = undefined;
    if (runner !== undefined) this.addon.eagle3Dispose(runner);
    this.hasG.clear();
    this.gSlots.clear();
    super.dispose();
  }

  /** The runner. @throws {DrafterError} once disposed. */
  private live(): CudaHandle {
    if (this.runner === undefined) throw new DrafterError('eagle3: the drafter was disposed');
    return this.runner;
  }

  /** The g slot of `id`. @throws `CacheError` `unknown-sequence`. */
  private gSlotOf(id: SequenceId): number {
    const slot = this.gSlots.get(id);
    if (slot === undefined) throw new CacheError('unknown-sequence', `eagle3: unknown sequence ${String(id)}`);
    return slot;
  }

  /**
   * The per-sequence arguments of a chain call for `seqs` with `lengths[r]` steps, their temporary entries already
   * reserved: gSlots, last tokens, positions, lengths `[S]`, block tables `[S, maxBlocks]`, and the slot of each
   * sequence's entry of step j ≥ 2, `stepSlots[(j − 2)·S + r]` `[(K − 1)·S]` (−1 past its length; `slotOf(j, r)`,
   * −1 for j = 1).
   */
  private chainArgs(seqs: readonly DraftSequence[], lengths: Int32Array, K: number) {
    const S = seqs.length;
    const MB = this.maxBlocks;
    const pool = this.kv.pool;
    const tables = this.tables.view(S);
    const gSlots = new Int32Array(S);
    const tokens = new Int32Array(S);
    const positions = new Int32Array(S);
    const stepSlots = new Int32Array(Math.max(0, K - 1) * S).fill(-1);
    const temp = new Int32Array(Math.max(0, K - 1));
    for (let r = 0; r < S; r++) {
      const s = seqs[r]!;
      gSlots[r] = this.gSlotOf(s.id);
      tokens[r] = s.lastToken;
      positions[r] = s.position;
      const pages = pool.writeBlockTable(s.id, tables, r * MB);
      tables.fill(0, r * MB + pages, (r + 1) * MB);
      const extra = lengths[r]! - 1;
      pool.writeTokenSlots(s.id, s.position, extra, temp, 0);
      for (let j = 0; j < extra; j++) stepSlots[j * S + r] = temp[j]!;
    }
    return {
      gSlots,
      tokens,
      positions,
      tables,
      lengths,
      stepSlots,
      slotOf: (j: number, r: number): number => (j >= 2 ? stepSlots[(j - 2) * S + r]! : -1),
    };
  }

  /** Runs `body` with each sequence's `lengths[r] − 1` temporary chain entries reserved (dropped afterwards). */
  private withChainRows<T>(seqs: readonly DraftSequence[], lengths: Int32Array, body: () => T): T {
    const rows: { id: SequenceId; position: number; numTokens: number }[] = [];
    for (let r = 0; r < seqs.length; r++)
      rows.push({ id: seqs[r]!.id, position: seqs[r]!.position, numTokens: lengths[r]! - 1 });
    return this.kv.withRows(rows, body);
  }

  /** Greedy chains of `maxDrafts` on the device in one call → target ids `[maxDrafts]` i32 per sequence. */
  private greedyChain(seqs: readonly DraftSequence[]): Int32Array[] {
    const runner = this.live();
    const S = seqs.length;
    const lengths = new Int32Array(S);
    let K = 0;
    for (let r = 0; r < S; r++) {
      lengths[r] = seqs[r]!.maxDrafts;
      K = Math.max(K, lengths[r]!);
    }
    const ids = this.withChainRows(seqs, lengths, () => {
      const a = this.chainArgs(seqs, lengths, K);
      return this.addon.eagle3Chain(
        runner,
        a.gSlots,
        a.tokens,
        a.positions,
        a.tables,
        a.stepSlots,
        a.lengths,
        K,
        this.graphs,
      );
    });
    const out: Int32Array[] = [];
    for (let r = 0; r < S; r++) {
      const drafts = new Int32Array(lengths[r]!);
      for (let j = 0; j < drafts.length; j++) {
        const d = ids[r * K + j]!;
        if (d < 0)
          throw new DrafterError(
            `eagle3: propose: sequence ${String(seqs[r]!.id)}: the draft logits of step ${j + 1} are not finite`,
          );
        drafts[j] = this.draftToTarget[d]!;
      }
      out.push(drafts);
    }
    return out;
  }

  /**
   * Sampled chains on the device, one call per step (`eagle3StepSample`): each step's draft drawn from its
   * draft-vocabulary logits after the request's temperature / top-k / top-p with one draw of its generator (as the
   * CPU drafter consumes them), fed to the next step mapped through d2t; q stays on the device (the proposal's
   * `deviceProbs`, rows s · maxDraftTokens … of the runner's lent buffer) and comes back only if `probs` is read. A
   * row that is not finite ends that sequence's chain there.
   */
  private sampledChain(seqs: readonly DraftSequence[]): DraftProposal[] {
    const runner = this.live();
    const S = seqs.length;
    const Vd = this.config.draftVocabSize;
    const lengths = Int32Array.from(seqs, (s) => s.maxDrafts);
    const K = Math.max(...lengths);
    const drafts = seqs.map((s) => new Int32Array(s.maxDrafts));
    const got = new Int32Array(S).fill(-1); // drafts made so far; −1: still drafting
    const groups = new Int32Array(4 * S);
    const temperature = new Float64Array(S);
    const topP = new Float64Array(S);
    seqs.forEach((s, r) => {
      groups[4 * r] = r;
      groups[4 * r + 2] = -1;
      groups[4 * r + 3] = s.sampling.topK !== undefined && s.sampling.topK < Vd ? s.sampling.topK : 0;
      temperature[r] = s.sampling.temperature;
      topP[r] = s.sampling.topP ?? 1;
    });
    let address = 0n;
    // the q of earlier proposals is overwritten from here on, whether the chain returns or throws
    this.qRows.rewrite();
    this.withChainRows(seqs, lengths, () => {
      const a = this.chainArgs(seqs, lengths, K);
      const tokens = Int32Array.from(a.tokens);
      for (let j = 1; j <= K; j++) {
        const slots = Int32Array.from({ length: S }, (_, r) => a.slotOf(j, r));
        const uniforms = Float64Array.from(seqs, (s, r) => (j <= lengths[r]! && got[r]! < 0 ? s.rng.next() : 0.5));
        const res = this.addon.eagle3StepSample(runner, j, a.gSlots, tokens, a.positions, a.tables, slots, a.lengths, {
          groups,
          temperature,
          topP,
          drafts: new Int32Array(0),
          uniforms,
        });
        address = res.qAddress;
        for (let r = 0; r < S; r++) {
          if (j > lengths[r]! || got[r]! >= 0) continue;
          const d = res.ids[r]!;
          if (d < 0) {
            got[r] = j - 1;
            continue;
          }
          drafts[r]![j - 1] = this.draftToTarget[d]!;
          tokens[r] = this.draftToTarget[d]!;
        }
      }
    });
    return seqs.map((s, r) => {
      const k = got[r]! >= 0 ? got[r]! : lengths[r]!;
      return this.qRows.proposal(s.id, drafts[r]!.subarray(0, k), address, r * this.maxDraftTokens);
    });
  }

  /**
   * Chains of `lengths[r]` steps computed one device call per step; `pick(r, j, logits)` chooses step j's draft id
   * (draft vocabulary) of sequence r from its draft-vocabulary logits `[draftVocab]` f32. → draft ids per sequence.
   */
  private stepwiseChain(
    seqs: readonly DraftSequence[],
    lengths: readonly number[],
    pick: (r: number, j: number, logits: Float32Array) => number,
  ): Int32Array[] {
    const runner = this.live();
    const Vd = this.config.draftVocabSize;
    const K = Math.max(...lengths);
    const S = seqs.length;
    const drafts = lengths.map((k) => new Int32Array(k));
    const lens = Int32Array.from(lengths);
    this.withChainRows(seqs, lens, () => {
      const a = this.chainArgs(seqs, lens, K);
      const tokens = Int32Array.from(a.tokens);
      for (let j = 1; j <= K; j++) {
        const slots = Int32Array.from({ length: S }, (_, r) => a.slotOf(j, r));
        const { logits } = this.addon.eagle3Step(runner, j, a.gSlots, tokens, a.positions, a.tables, slots, a.lengths);
        for (let r = 0; r < S; r++) {
          if (j > lengths[r]!) continue;
          const d = pick(r, j, logits.subarray(r * Vd, (r + 1) * Vd));
          drafts[r]![j - 1] = d;
          tokens[r] = this.draftToTarget[d]!;
        }
      }
    });
    return drafts;
  }
}
