/**
 * The DFlash drafter on the GPU (issue 18): the same drafter contract and the same math as {@link DFlashDrafter}
 * (dflash.ts, module comment; oracle tools/reference/specd_ref/dflash.py), with the draft model in
 * @specd/native-cuda's DFlash runner (packages/native-cuda/src/dflash_runner.cc) beside a target that runs on the same
 * GPU (the CUDA Llama stage). Chosen by the plugin when the target stage exposes its CUDA device
 * ({@link dflashCudaDeviceOf}: a stage with `cudaDevice()` whose addon has the DFlash runner — core names no device
 * capability) and the config's `device` setting is `"auto"` (default) or `"cuda"`.
 *
 * What lives where:
 * - on the device (the runner): bf16 weights (fc `[D, T·D]`, per layer q|k|v `[(H + 2·KV)·hd, D]`, o, gate|up, down),
 *   the norms, the draft head (the target lm_head's rows of the draft vocabulary `[Vd, D]`, gathered once at load
 *   through the target's `lmHead`, and their token ids), a copy of the target's bf16 token embedding, the draft KV
 *   values (every layer's fp32 K and V pages);
 * - here: the page bookkeeping (core's {@link DraftKvCache} with storage `'device'`: one block table per sequence
 *   shared by the layers, slots, context lengths).
 *
 * Context: `projectTargetHiddenPartial` returns the rows' taps packed (core's {@link PackedTaps}, no arithmetic here)
 * and `writeProjectedContextKV` hands them to the device, where fc, hidden_norm and every layer's K/V are computed and
 * written in one call that is not waited for. A sum from elsewhere (`[n, D]` f32, the contract's projection) is
 * written as the projected features directly.
 *
 * Propose: one device call for the whole batch. The block's B rows per sequence are temporary rows of the draft KV,
 * reserved here before the call and dropped after it, whether it returns or throws. Greedy sequences get their drafts
 * as token ids (the argmax over the draft vocabulary on the device). Sampled sequences' drafts are drawn on the device
 * too, from the same block's logits (a second call, `dflashSample`, through the target's sampling kernels): q after
 * the request's temperature / top-k / top-p over the draft vocabulary, one draw of the request's generator per draft
 * handed over, and q over the whole vocabulary (zero outside the draft vocabulary) kept on the device: the proposal's
 * `deviceProbs` points the CUDA stage's sampler at it, so rejection sampling stays lossless without q crossing to the
 * host; reading the proposal's `probs` copies it back (the host path). A draft row whose logits are not finite ends
 * that sequence's drafts there (fewer drafts, nothing fails).
 *
 * Not here: tensor parallelism (the CUDA stage is one GPU), prefill/decode disaggregation (the draft context lives in
 * device memory: this drafter does not declare DraftContextTransfer, so PD refuses it at startup), sliding-window
 * draft layers (refused at load: the CPU drafter runs them), and block drafters built on DFlash's backbone (DSpark's
 * `runBlocks` stays on the CPU drafter).
 */

import {
  DrafterBase,
  DeviceQRows,
  DrafterError,
  DraftKvCache,
  Int32RowViews,
  PackedTaps,
  lentCudaDevice,
  type LentCudaDevice,
  type ContextSpan,
  type DraftBatch,
  type DraftProposal,
  type SequenceId,
  type StageInfo,
  type StageModel,
} from '@specd/core';

import { dflashTaps, type DFlashConfig } from './config.js';

/** An opaque device object of the CUDA addon (a runner). */
export type DFlashCudaHandle = { readonly __device: unique symbol };

/**
 * The functions of @specd/native-cuda's DFlash runner this drafter calls (src/dflash_runner.cc has each contract; its
 * index.d.ts the same signatures). Structural: the addon object comes from the target stage, so this plugin never
 * imports @specd/native-cuda and machines without CUDA never load it.
 */
export interface DFlashCudaAddon {
  dflashCreate(options: {
    readonly hiddenSize: number;
    readonly numHeads: number;
    readonly numKvHeads: number;
    readonly headDim: number;
    readonly intermediateSize: number;
    readonly numLayers: number;
    readonly vocabSize: number;
    readonly draftVocabSize: number;
    readonly numTaps: number;
    readonly blockSize: number;
    readonly maskTokenId: number;
    readonly ropeTheta: number;
    readonly rmsNormEps: number;
    readonly maxSequences: number;
  }): DFlashCudaHandle;
  dflashAllocKv(runner: DFlashCudaHandle, pageSize: number, numPages: number, maxModelLen: number): void;
  dflashSetWeight(
    runner: DFlashCudaHandle,
    name: string,
    layer: number,
    data: Uint16Array | Float32Array | Int32Array,
  ): void;
  dflashContextWrite(
    runner: DFlashCudaHandle,
    rows: Float32Array,
    fromTaps: boolean,
    positions: Int32Array,
    slots: Int32Array,
  ): void;
  dflashBlock(
    runner: DFlashCudaHandle,
    tokens: Int32Array,
    positions: Int32Array,
    blockTables: Int32Array,
    slots: Int32Array,
    useGraph: boolean,
    wantLogits: boolean,
  ): { readonly ids: Int32Array; readonly logits?: Float32Array };
  dflashSample(
    runner: DFlashCudaHandle,
    request: {
      readonly groups: Int32Array;
      readonly temperature: Float64Array;
      readonly topP: Float64Array;
      readonly drafts: Int32Array;
      readonly uniforms: Float64Array;
    },
    copyProbs: boolean,
  ): { readonly results: Int32Array; readonly qAddress: bigint; readonly probs?: Float32Array };
  dflashProbs(runner: DFlashCudaHandle, row: number, rows: number): Float32Array;
  dflashSynchronize(runner: DFlashCudaHandle): void;
  dflashReplayMs(runner: DFlashCudaHandle, reps: number): number;
  dflashInfo(runner: DFlashCudaHandle): {
    readonly weightBytes: number;
    readonly kvBytes: number;
    readonly activationBytes: number;
    readonly maxBlocks: number;
    readonly graphs: string[];
  };
  dflashDispose(runner: DFlashCudaHandle): void;
}

/** What a target stage on a CUDA GPU lends drafters that run beside it (core's {@link LentCudaDevice}). */
export type DFlashCudaDevice = LentCudaDevice<DFlashCudaAddon>;

/**
 * The CUDA device of `target` when it runs on one: a stage with a `cudaDevice()` method (the CUDA Llama stage) whose
 * addon has the DFlash runner; undefined otherwise (a CPU stage, or an addon built before the runner).
 */
export function dflashCudaDeviceOf(target: StageModel): DFlashCudaDevice | undefined {
  return lentCudaDevice<DFlashCudaAddon>(target, 'dflashCreate');
}

/** One draft layer's weights for the device: bf16 bits row-major, norms f32. */
export interface DFlashCudaLayerWeights {
  /** q_proj ; k_proj ; v_proj stacked `[(H + 2·KV)·hd, D]`. */
  readonly qkv: Uint16Array;
  /** o_proj `[D, H·hd]`. */
  readonly o: Uint16Array;
  /** gate_proj ; up_proj stacked `[2I, D]`. */
  readonly gateUp: Uint16Array;
  /** down_proj `[D, I]`. */
  readonly down: Uint16Array;
  readonly inputNorm: Float32Array;
  readonly postNorm: Float32Array;
  /** `[hd]` each. */
  readonly qNorm: Float32Array;
  readonly kNorm: Float32Array;
}

/** The draft model's weights for the device. */
export interface DFlashCudaWeights {
  /** fc `[D, T·D]` (column block i: tap `config.taps[i]`). */
  readonly fc: Uint16Array;
  readonly hiddenNorm: Float32Array;
  readonly finalNorm: Float32Array;
  readonly layers: readonly DFlashCudaLayerWeights[];
  /** The draft head: the target lm_head's rows of the draft vocabulary `[Vd, D]` bf16 bits. */
  readonly head: Uint16Array;
  /** The token id of each draft-head row `[Vd]` i32 (undefined: the whole vocabulary, row = id). */
  readonly ids: Int32Array | undefined;
}

/** Sizes of {@link DFlashCudaDrafter.create}. */
export interface DFlashCudaSizes {
  /** Sequences at once, at most. */
  readonly maxSequences: number;
  /** Tokens per sequence, at most (prompt + generated). */
  readonly maxTokensPerSequence: number;
}

/** The DFlash drafter with its draft model on the GPU (module comment). */
export class DFlashCudaDrafter extends DrafterBase {
  readonly method = 'dflash';
  /** Where the draft model runs. */
  readonly device = 'cuda';
  readonly maxDraftTokens: number;
  /** The draft model's `max_position_embeddings` (the engine stops drafting before a block would reach it). */
  readonly maxPosition?: number;
  /** The draft KV page bookkeeping (values on the device). */
  readonly kv: DraftKvCache;
  /** Run blocks as CUDA graphs (default true; false launches every kernel, for benches). */
  graphs = true;
  private runner: DFlashCudaHandle | undefined;
  /** Block-table entries per sequence of a block call. */
  private readonly maxBlocks: number;
  private readonly packedTaps: PackedTaps;
  /** The sampled proposals' q rows on the device (valid until the next dflashSample). */
  private readonly qRows: DeviceQRows;
  /** Block tables of block calls, `[S, maxBlocks]` views refilled each call (the runner copies its arguments). */
  private readonly tables: Int32RowViews;

  private constructor(
    readonly config: DFlashConfig,
    private readonly addon: DFlashCudaAddon,
    runner: DFlashCudaHandle,
    /** The draft vocabulary's token ids (undefined: the whole vocabulary). */
    readonly draftIds: Int32Array | undefined,
    private readonly vocabSize: number,
    kv: DraftKvCache,
    /** Positions below which blocks run (the runner's RoPE table). */
    readonly maxModelLen: number,
  ) {
    super(kv);
    this.kv = kv;
    this.runner = runner;
    this.maxDraftTokens = config.blockSize - 1;
    if (config.maxPositionEmbeddings !== undefined) this.maxPosition = config.maxPositionEmbeddings;
    this.maxBlocks = addon.dflashInfo(runner).maxBlocks;
    this.tables = new Int32RowViews(this.maxBlocks);
    this.packedTaps = new PackedTaps('dflash', config.taps, config.hiddenSize, config.blockSize);
    this.qRows = new DeviceQRows('dflash', vocabSize, (row, rows) => addon.dflashProbs(this.live(), row, rows));
  }

  /**
   * Creates the runner on `device`, uploads the weights and the target's embedding, and allocates the draft KV pool:
   * `DraftKvCache.pagesFor(maxSequences, maxTokensPerSequence + blockSize)` pages of 16 tokens (the context plus a
   * block's temporary rows), positions below maxTokensPerSequence + blockSize.
   * @throws {DrafterError} for sizes that are not positive integers or a sliding-window layer; the addon's RangeError
   *   / Error (a failed CUDA allocation, named) — the runner is freed first.
   */
  static create(
    config: DFlashConfig,
    device: DFlashCudaDevice,
    w: DFlashCudaWeights,
    sizes: DFlashCudaSizes,
  ): DFlashCudaDrafter {
    const c = config;
    for (const [name, v] of Object.entries(sizes))
      if (!(Number.isSafeInteger(v) && v >= 1))
        throw new DrafterError(`dflash: ${name}: expected an integer >= 1, got ${String(v)}`);
    if (c.layerTypes.some((t) => t !== 'full_attention'))
      throw new DrafterError(
        'dflash: the GPU drafter runs full-attention draft layers only (layer_types has sliding_attention); ' +
          'set the drafter\'s device to "cpu"',
      );
    const V = device.embedding.length / c.hiddenSize;
    const Vd = w.ids?.length ?? V;
    const a = device.addon;
    const runner = a.dflashCreate({
      hiddenSize: c.hiddenSize,
      numHeads: c.numHeads,
      numKvHeads: c.numKvHeads,
      headDim: c.headDim,
      intermediateSize: c.intermediateSize,
      numLayers: c.numLayers,
      vocabSize: V,
      draftVocabSize: Vd,
      numTaps: c.taps.length,
      blockSize: c.blockSize,
      maskTokenId: c.maskTokenId,
      ropeTheta: c.ropeTheta,
      rmsNormEps: c.rmsNormEps,
      maxSequences: sizes.maxSequences,
    });
    try {
      const set = (name: string, layer: number, data: Uint16Array | Float32Array | Int32Array) =>
        a.dflashSetWeight(runner, name, layer, data);
      set('embed', -1, device.embedding);
      set('fc', -1, w.fc);
      set('hiddenNorm', -1, w.hiddenNorm);
      set('finalNorm', -1, w.finalNorm);
      set('lmHead', -1, w.head);
      set('ids', -1, w.ids ?? Int32Array.from({ length: V }, (_, i) => i));
      w.layers.forEach((l, j) => {
        set('qkv', j, l.qkv);
        set('o', j, l.o);
        set('gateUp', j, l.gateUp);
        set('down', j, l.down);
        set('inputNorm', j, l.inputNorm);
        set('postNorm', j, l.postNorm);
        set('qNorm', j, l.qNorm);
        set('kNorm', j, l.kNorm);
      });
      const tokens = sizes.maxTokensPerSequence + c.blockSize;
      const kv = new DraftKvCache({
        numLayers: c.numLayers,
        numKvHeads: c.numKvHeads,
        headDim: c.headDim,
        numPages: DraftKvCache.pagesFor(sizes.maxSequences, tokens),
        storage: 'device',
      });
      a.dflashAllocKv(runner, kv.layout.pageSize, kv.layout.numPages, tokens);
      return new DFlashCudaDrafter(c, a, runner, w.ids, V, kv, tokens);
    } catch (err) {
      a.dflashDispose(runner);
      throw err;
    }
  }

  override captureSetter(target: StageInfo): readonly number[] {
    return dflashTaps(this.config, target);
  }

  /**
   * The rows' taps packed for {@link writeProjectedContextKV}, which projects them on the device (core's
   * {@link PackedTaps}: `[numTokens, T·D]` f32; not a projection).
   * @throws {DrafterError} with an accumulator (pipeline stages), for a missing or foreign tap, or a mis-shaped one.
   */
  override projectTargetHiddenPartial(
    stageTaps: ReadonlyMap<number, Float32Array>,
    numTokens: number,
    accumulator?: Float32Array,
  ): Float32Array {
    return this.packedTaps.pack(stageTaps, numTokens, accumulator);
  }

  /**
   * The spans' context rows on the device (module comment), pages allocated here first (all or nothing: given back if
   * the device call is refused).
   * @param sum what {@link projectTargetHiddenPartial} returned (`[Σ numTokens, T·D]` f32), or projected features
   *   `[Σ numTokens, D]` f32 from elsewhere.
   * @throws {DrafterError} if the drafter was disposed, a position is not the sequence's draft context length, or
   *   `sum` has the wrong length; `CacheError` `full` (nothing allocated); the addon's errors.
   */
  override writeProjectedContextKV(sum: Float32Array, spans: readonly ContextSpan[]): void {
    const fromTaps = this.packedTaps.handOver(sum);
    const runner = this.live();
    const width = fromTaps ? this.packedTaps.width : this.config.hiddenSize;
    let n = 0;
    for (const s of spans) n += s.numTokens;
    if (sum.length !== n * width)
      throw new DrafterError(
        `dflash: writeProjectedContextKV: sum: expected [${n}, ${width}] f32, got length ${sum.length}`,
      );
    for (const s of spans) this.checkContextPosition(s, 'writeProjectedContextKV');
    if (n === 0) return;
    const positions = new Int32Array(n);
    let at = 0;
    for (const s of spans) for (let i = 0; i < s.numTokens; i++) positions[at++] = s.position + i;
    this.kv.extendAll(spans);
    try {
      this.addon.dflashContextWrite(runner, sum, fromTaps, positions, this.kv.slots(spans));
    } catch (err) {
      this.kv.truncateAll(spans.map((s) => ({ id: s.id, position: s.position, numTokens: 0 })));
      throw err;
    }
    this.packedTaps.written(sum);
  }

  /**
   * One draft block per sequence on the device (module comment): `maxDrafts` drafts each, greedy as token ids, sampled
   * with q over the whole vocabulary. Leaves the draft context unchanged (the block's rows are dropped on every path).
   * @throws {DrafterError} if the drafter was disposed, maxDrafts is outside [1, blockSize − 1], a position is not the
   *   draft context length, or a block would pass the runner's positions; `CacheError` `full` when the draft KV has no
   *   page for the block.
   */
  propose(batch: DraftBatch): DraftProposal[] {
    this.live();
    const c = this.config;
    const B = c.blockSize;
    const seqs = batch.sequences;
    const S = seqs.length;
    if (S === 0) return [];
    let sampled = false;
    for (let i = 0; i < S; i++) {
      const s = seqs[i]!;
      this.checkMaxDrafts(s, i, B - 1);
      this.checkProposePosition(s, i);
      if (s.position + B > this.maxModelLen)
        throw new DrafterError(
          `dflash: propose: sequences[${i}] (${String(s.id)}): a block from position ${s.position} passes the GPU ` +
            `drafter's ${this.maxModelLen} positions`,
        );
      if (s.sampling.temperature > 0) sampled = true;
    }
    const { ids } = this.runBlock(seqs, false);
    const drawn = sampled ? this.sampleDrafts(seqs) : undefined;
    const out: DraftProposal[] = [];
    for (let r = 0; r < S; r++) {
      const s = seqs[r]!;
      const d = drawn?.get(r);
      if (d !== undefined) {
        out.push(d);
        continue;
      }
      const at = r * (B - 1);
      const tokens = ids.slice(at, at + s.maxDrafts);
      // a row whose logits are not finite ends the drafts there (fewer drafts: still lossless; nothing fails)
      const bad = tokens.indexOf(-1);
      out.push({ id: s.id, tokens: bad < 0 ? tokens : tokens.slice(0, bad) });
    }
    return out;
  }

  /**
   * The sampled sequences' drafts drawn on the device from the last block's logits (`dflashSample`: q after the
   * request's temperature / top-k / top-p over the draft vocabulary, one draw of the request's generator per draft, as
   * the CPU drafter consumes it) → proposal by batch index, its q `[k, V]` over the whole vocabulary (0 outside the
   * draft vocabulary) on the device (core's {@link DeviceQRows}). A row that is not finite ends that sequence's drafts
   * there.
   */
  private sampleDrafts(seqs: DraftBatch['sequences']): Map<number, DraftProposal> {
    const B = this.config.blockSize;
    const V = this.vocabSize;
    const Vd = this.draftIds?.length ?? V;
    const rows: { r: number; j: number }[] = [];
    seqs.forEach((s, r) => {
      if (s.sampling.temperature > 0) for (let j = 0; j < s.maxDrafts; j++) rows.push({ r, j });
    });
    const G = rows.length;
    const groups = new Int32Array(4 * G);
    const temperature = new Float64Array(G);
    const topP = new Float64Array(G);
    const uniforms = new Float64Array(G);
    rows.forEach(({ r, j }, g) => {
      const sp = seqs[r]!.sampling;
      groups[4 * g] = r * (B - 1) + j;
      groups[4 * g + 2] = -1;
      groups[4 * g + 3] = sp.topK !== undefined && sp.topK < Vd ? sp.topK : 0;
      temperature[g] = sp.temperature;
      topP[g] = sp.topP ?? 1;
      uniforms[g] = seqs[r]!.rng.next();
    });
    const runner = this.live();
    // the q of earlier proposals is overwritten from here on, whether this call returns or throws
    this.qRows.rewrite();
    const { results, qAddress } = this.addon.dflashSample(
      runner,
      { groups, temperature, topP, drafts: new Int32Array(0), uniforms },
      false,
    );
    const out = new Map<number, DraftProposal>();
    let g = 0;
    while (g < G) {
      const r = rows[g]!.r;
      const s = seqs[r]!;
      let k = 0;
      const tokens = new Int32Array(s.maxDrafts);
      for (; k < s.maxDrafts; k++) {
        const d = results[2 * (g + k) + 1]!;
        if (d < 0) break;
        tokens[k] = this.draftIds === undefined ? d : this.draftIds[d]!;
      }
      out.set(r, this.qRows.proposal(s.id, tokens.subarray(0, k), qAddress, g));
      g += s.maxDrafts;
    }
    return out;
  }

  /**
   * Test hook (internal): the draft-head logits `[B − 1, Vd]` f32 of one block of `seq` (slots 1 … B − 1; the sampled
   * path's logits). Leaves the draft context unchanged.
   * @internal
   */
  blockLogits(seq: { readonly id: SequenceId; readonly position: number; readonly lastToken: number }): Float32Array {
    this.checkProposePosition(seq, 0);
    return this.runBlock([seq], true).logits!;
  }

  /**
   * One device block call for `seqs` (checked by the caller) with their B temporary rows reserved and dropped
   * afterwards: the greedy draft token ids `[S · (B − 1)]` and, with `wantLogits`, the logits.
   */
  private runBlock(
    seqs: readonly { readonly id: SequenceId; readonly position: number; readonly lastToken: number }[],
    wantLogits: boolean,
  ): { readonly ids: Int32Array; readonly logits?: Float32Array } {
    const runner = this.live();
    const B = this.config.blockSize;
    const S = seqs.length;
    const rows = seqs.map((s) => ({ id: s.id, position: s.position, numTokens: B }));
    return this.kv.withRows(rows, () => {
      const pool = this.kv.pool;
      const MB = this.maxBlocks;
      const tables = this.tables.view(S);
      const tokens = new Int32Array(S);
      const positions = new Int32Array(S);
      for (let r = 0; r < S; r++) {
        const s = seqs[r]!;
        tokens[r] = s.lastToken;
        positions[r] = s.position;
        const pages = pool.writeBlockTable(s.id, tables, r * MB);
        tables.fill(0, r * MB + pages, (r + 1) * MB);
      }
      return this.addon.dflashBlock(runner, tokens, positions, tables, this.kv.slots(rows), this.graphs, wantLogits);
    });
  }

  /** GPU ms per replay of the last block's CUDA graph (−1 without one), for benches: right after a propose. */
  replayMs(reps = 20): number {
    return this.addon.dflashReplayMs(this.live(), reps);
  }

  /** The runner's sizes and captured graphs. */
  runnerInfo(): ReturnType<DFlashCudaAddon['dflashInfo']> {
    return this.addon.dflashInfo(this.live());
  }

  /** dispose: frees the runner's device memory and the page bookkeeping (later calls throw). Idempotent. */
  override dispose(): void {
    const runner = this.runner;
    this.runner = undefined;
    if (runner !== undefined) this.addon.dflashDispose(runner);
    super.dispose();
  }

  /** The runner. @throws {DrafterError} once disposed. */
  private live(): DFlashCudaHandle {
    if (this.runner === undefined) throw new DrafterError('dflash: the drafter was disposed');
    return this.runner;
  }
}
