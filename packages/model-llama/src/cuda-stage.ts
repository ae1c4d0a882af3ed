/**
 * A whole Llama model on an NVIDIA GPU (issue 18): the same {@link StageModel} contract as the CPU stage, its
 * forward one native call into @specd/native-cuda's runner (src/llama_runner.cc: bf16 weights uploaded once, fp32
 * KV pages in device memory, cuBLASLt GEMMs with fp32 accumulation, CUDA graphs for batches of ≤ 256 rows). The
 * engine's {@link SequenceCache} keeps the page bookkeeping on the host (`kvStorage: 'device'`: page ids, block
 * tables, slots) and the runner the K/V values. With {@link ForwardOptions.argmaxOnly} (greedy requests) a forward
 * returns each logit row's argmax computed on the device and no logits.
 *
 * Loaded only when asked for (`--device cuda`, the model config's `device`); @specd/native-cuda is imported then,
 * so machines without CUDA never load it.
 */
import {
  type CacheGeometry,
  type DeviceDraftProbs,
  type DeviceSampleSpec,
  type DeviceSampling,
  type ForwardBatch,
  type ForwardOptions,
  type ForwardResult,
  forwardPrologue,
  Int32RowViews,
  type ForwardPrologueSpec,
  type PrefixCommit,
  SequenceCache,
  type SequenceCacheOptions,
  type StageInfo,
  type SequenceId,
  type StageModel,
} from '@specd/core';
import { bf16ToF32 } from '@specd/native';
import type { CudaAddon, DeviceHandle, LlamaRunnerInfo } from '@specd/native-cuda';

import type { LlamaConfig } from './config.js';
import { LlamaForwardError } from './model.js';
import { LlamaWeightError, type LlamaTensorSource } from './weights.js';

/** Options of {@link loadLlamaCudaStage}. */
export interface CudaStageOptions {
  /**
   * Rows of the largest forward (a prefill chunk, or a batch of verify blocks); default 2048. Activations for this
   * many rows are allocated at load (the logits alone take rows · vocab · 4 bytes).
   */
  readonly maxTokens?: number;
  /** Replay batches of ≤ 256 rows as CUDA graphs (default true); false launches every kernel each forward. */
  readonly graphs?: boolean;
  /** Called after each layer's upload, for progress bars. */
  readonly onLayer?: (done: number, total: number) => void;
}

interface Span {
  readonly id: SequenceId;
  readonly position: number;
  readonly numNew: number;
  readonly row: number;
  readonly logits: 'all' | 'last' | 'none';
}

/** A forward's result with where each sequence's rows are (for commitPrefix). */
interface CudaForwardResult extends ForwardResult {
  readonly spans: readonly Span[];
}

/** A Llama model on the GPU. Whole model only (no pipeline stages, no tensor parallelism, no token trees yet). */
export class CudaLlamaStageModel implements StageModel, PrefixCommit, DeviceSampling {
  readonly info: StageInfo;
  readonly cacheGeometry: CacheGeometry;
  private cache: SequenceCache | undefined;
  private maxModelLen = 0;
  private maxBlocks = 0;
  private disposed = false;
  /**
   * The block tables of every forward, `[S, maxBlocks]` views of one buffer refilled each time (the runner copies its
   * arguments before llamaForward returns, so one buffer serves every call).
   */
  private tables = new Int32RowViews(0);
  /** The last forward's tap ids (the engine asks for the same taps every step). */
  private lastTaps: Int32Array | undefined;
  /** The latest forward's result: the one whose logits the device holds (sampleOnDevice). */
  private lastResult: ForwardResult | undefined;
  /** The forward prologue's checks and span records (built once). */
  private readonly prologueSpec: ForwardPrologueSpec<Span>;

  constructor(
    readonly config: LlamaConfig,
    private readonly cuda: CudaAddon,
    private readonly runner: DeviceHandle,
    /** The token embedding as bf16 bits `[vocab, hidden]`, for drafters that embed with the target's table. */
    private readonly embedBits: Uint16Array,
    readonly maxTokens: number,
    /** Replay batches of ≤ 256 rows as CUDA graphs (benches turn it off to measure the launch gaps). */
    public graphs: boolean,
  ) {
    const c = config;
    this.info = Object.freeze({
      numLayers: c.numLayers,
      layerStart: 0,
      layerEnd: c.numLayers,
      hiddenSize: c.hiddenSize,
      vocabSize: c.vocabSize,
      isFirst: true,
      isLast: true,
      layerKinds: Object.freeze(new Array<string>(c.numLayers).fill('attention')),
      treeVerificationBlocker: 'the CUDA stage (token trees are not implemented on the GPU yet)',
    });
    const layers: number[] = [];
    for (let l = 0; l < c.numLayers; l++) layers.push(2 * l, 2 * l + 1);
    this.cacheGeometry = Object.freeze({
      pagedKv: { layers, floatsPerToken: c.numKvHeads * c.headDim, kvHeads: c.numKvHeads },
      linearState: { layers: [], heads: 1, keyDim: 1, valueDim: 1, convStates: 0, convChannels: 0, convWidth: 0 },
    });
    const error = (m: string) => new LlamaForwardError(m);
    this.prologueSpec = {
      info: this.info,
      error,
      span: (s, i, row): Span => {
        if (s.tree !== undefined) throw error(`forward: sequences[${i}].tree: token trees are not supported on CUDA`);
        if (row + s.tokens.length > this.maxTokens)
          throw error(`forward: the batch has more than maxTokens ${this.maxTokens} rows (the CUDA stage's limit)`);
        if (s.position + s.tokens.length > this.maxModelLen)
          throw error(
            `forward: sequences[${i}]: ${s.position + s.tokens.length} tokens, more than the CUDA KV pool's ` +
              `${this.maxModelLen} per sequence`,
          );
        return { id: s.id, position: s.position, numNew: s.tokens.length, row, logits: s.logits };
      },
      // no embedRow: the runner embeds on the device (no residual stream on the host)
      hiddenOnFirstStage: 'ignore',
    };
  }

  /** The runner's sizes (bytes of weights, KV pool, activations) and the CUDA graphs captured so far. */
  runnerInfo(): LlamaRunnerInfo {
    return this.cuda.llamaInfo(this.runner);
  }

  /** GPU ms per replay of the last forward's CUDA graph, `reps` back to back (−1: it ran without a graph). */
  replayMs(reps = 20): number {
    return this.cuda.llamaReplayMs(this.runner, reps);
  }

  /**
   * Launch choices for later forwards (A/B benches; the captured graphs are dropped): `smallGemm` — batches of ≤ 32
   * rows use the row-invariant small GEMM with RMSNorm / SwiGLU fused (default true); `pdl` — programmatic dependent
   * launch on sm_90+ (default true).
   */
  setLaunchOptions(options: { readonly smallGemm?: boolean; readonly pdl?: boolean }): void {
    this.cuda.llamaSetOptions(this.runner, { ...options });
  }

  /**
   * GPU µs of each launch of layer 0 and of the head at the last forward's batch shape (each replayed as a graph of
   * `reps` copies). Overwrites activations and that batch's KV slots: for benches, after their last forward.
   */
  profile(reps = 50): { name: string; us: number }[] {
    return this.cuda.llamaProfile(this.runner, reps);
  }

  /** The device's name and memory, the runner's sizes and the CUDA graphs captured so far (for the log line). */
  describe(): string {
    const i = this.cuda.info;
    const r = this.runnerInfo();
    const gib = (b: number) => `${(b / 2 ** 30).toFixed(2)} GiB`;
    return (
      `cuda: ${i.name} (compute ${i.computeCapability}, ${gib(i.totalBytes)}): weights ${gib(r.weightBytes)}, ` +
      `KV pool ${gib(r.kvBytes)}, activations ${gib(r.activationBytes)}; CUDA graphs ` +
      (this.graphs ? `captured for [${r.graphs.join(', ')}]` : 'off')
    );
  }

  /**
   * The stage's cache: page bookkeeping here, the K/V pages allocated now in device memory (numPages · pageSize
   * tokens). The stage serves one cache at a time: a new one replaces the previous (whose engine is then done),
   * which must hold no sequence. Sequences hold at most `maxSequenceLength` (+ one page) tokens.
   * @throws {LlamaForwardError} while the previous cache holds sequences; Error naming the failed CUDA allocation
   *   (the pool does not fit).
   */
  createCache(options: SequenceCacheOptions): SequenceCache {
    if (this.cache !== undefined && this.cache.numSequences > 0)
      throw new LlamaForwardError(
        `createCache: the CUDA stage serves one cache at a time and the previous one holds ` +
          `${this.cache.numSequences} sequences`,
      );
    this.cache = undefined;
    const pageSize = options.pageSize ?? 16;
    const pool = options.numPages * pageSize;
    const perSeq =
      options.maxSequenceLength === undefined ? pool : (Math.ceil(options.maxSequenceLength / pageSize) + 1) * pageSize;
    this.maxModelLen = Math.min(pool, perSeq);
    this.cuda.llamaAllocKv(this.runner, pageSize, options.numPages, this.maxModelLen);
    this.maxBlocks = this.cuda.llamaInfo(this.runner).maxBlocks;
    this.tables = new Int32RowViews(this.maxBlocks);
    this.cache = new SequenceCache(this.cacheGeometry, { ...options, pageSize, kvStorage: 'device' });
    return this.cache;
  }

  /**
   * Runs the model over a batch on the GPU (prefill chunks, decode tokens and verify blocks alike): the same
   * checks and cache extension as the CPU stage, then one native call.
   * @returns logits `[rows, vocabSize]` f32 of the rows each sequence asked for (undefined with `argmaxOnly`),
   *   `argmax` `[rows]` i32 of the same rows, hidden `[N, hiddenSize]` and the asked taps `[N, hiddenSize]` f32.
   * @throws {LlamaForwardError} as the CPU stage, and for a cache not from {@link createCache}, a token tree, a
   *   batch of more than `maxTokens` rows or a sequence longer than the pool's `maxModelLen` — all before the
   *   cache is touched; Error naming a failed CUDA call.
   * @throws {CacheError} `full` when the KV pool has no room (nothing was extended).
   */
  forward(batch: ForwardBatch, cache: SequenceCache, options: ForwardOptions = {}): ForwardResult {
    if (this.disposed) throw new LlamaForwardError('forward: the CUDA stage was disposed');
    if (cache !== this.cache || this.cache === undefined)
      throw new LlamaForwardError("forward: cache: expected the cache from this stage's createCache()");
    const { spans, numTokens: N, taps } = forwardPrologue<Span>(batch, cache, options, this.prologueSpec);
    const kv = cache.kv!;
    const S = spans.length;
    const MB = this.maxBlocks;
    const ids = new Int32Array(N);
    const positions = new Int32Array(N);
    const slots = new Int32Array(N);
    const cu = new Int32Array(S + 1);
    const kvLens = new Int32Array(S);
    const tables = this.tables.view(S);
    const logitRowStart = new Int32Array(S + 1);
    let R = 0;
    for (let i = 0; i < S; i++) {
      const sp = spans[i]!;
      R += sp.logits === 'all' ? sp.numNew : sp.logits === 'last' ? 1 : 0;
    }
    const rows = new Int32Array(R === 0 ? 1 : R);
    R = 0;
    for (let i = 0; i < S; i++) {
      const sp = spans[i]!;
      const n = sp.numNew;
      ids.set(batch.sequences[i]!.tokens, sp.row);
      for (let t = 0; t < n; t++) positions[sp.row + t] = sp.position + t;
      kv.writeTokenSlots(sp.id, sp.position, n, slots, sp.row);
      cu[i + 1] = sp.row + n;
      kvLens[i] = sp.position + n;
      const pages = kv.writeBlockTable(sp.id, tables, i * MB);
      tables.fill(0, i * MB + pages, (i + 1) * MB);
      if (sp.logits === 'all') for (let t = 0; t < n; t++) rows[R++] = sp.row + t;
      else if (sp.logits === 'last') rows[R++] = sp.row + n - 1;
      logitRowStart[i + 1] = R;
    }
    const argmaxOnly = options.argmaxOnly === true;
    const r = this.cuda.llamaForward(
      this.runner,
      ids,
      positions,
      slots,
      cu,
      kvLens,
      tables,
      rows,
      this.tapIds(taps),
      R > 0 && !argmaxOnly,
      this.graphs,
    );
    const captured = new Map<number, Float32Array>();
    for (let i = 0; i < taps.length; i++) captured.set(taps[i]!, r.taps[i]!);
    const result: CudaForwardResult = {
      spans,
      logits: R === 0 ? new Float32Array(0) : argmaxOnly ? undefined : r.logits,
      argmax: R === 0 ? new Int32Array(0) : r.tokens,
      logitRowStart,
      hidden: r.hidden,
      taps: captured,
    };
    this.lastResult = R === 0 ? undefined : result;
    return result;
  }

  /**
   * {@link DeviceSampling}: temperature / top-k / top-p sampling and rejection acceptance on the GPU over the
   * logits of `result` (@specd/native-cuda's llamaSample, src/sampling.cu); the logits never leave the device,
   * only `[2 · specs.length]` i32 (accepted drafts, token) come back: the token −1 when a row used is not finite,
   * both −2 for a sequence without a spec.
   * @throws {LlamaForwardError} when `result` is not this stage's latest forward, or a spec's drafts do not match
   *   its sequence's logit rows or its uniforms; Error naming a failed CUDA call.
   */
  sampleOnDevice(result: ForwardResult, specs: readonly (DeviceSampleSpec | undefined)[]): Int32Array {
    if (this.disposed) throw new LlamaForwardError('sampleOnDevice: the CUDA stage was disposed');
    if (result !== this.lastResult || result === undefined)
      throw new LlamaForwardError("sampleOnDevice: result: expected this stage's latest forward");
    const S = result.logitRowStart.length - 1;
    if (specs.length !== S)
      throw new LlamaForwardError(
        `sampleOnDevice: specs: expected ${S} entries (one per sequence), got ${specs.length}`,
      );
    const V = this.config.vocabSize;
    let G = 0;
    let D = 0;
    let Q = 0;
    // q rows on the device (a GPU drafter's): the lowest address, each group's rows counted from it
    let qBase: bigint | undefined;
    for (let s = 0; s < S; s++) {
      const sp = specs[s];
      if (sp === undefined) continue;
      const k = sp.drafts.length;
      const rows = result.logitRowStart[s + 1]! - result.logitRowStart[s]!;
      if (rows !== k + 1 && !(k === 0 && rows >= 1))
        throw new LlamaForwardError(`sampleOnDevice: sequence ${s}: ${k} drafts for ${rows} logit rows`);
      if (sp.uniforms.length !== k + 1)
        throw new LlamaForwardError(`sampleOnDevice: sequence ${s}: expected ${k + 1} uniforms`);
      if (sp.q !== undefined && sp.q.length !== k * V)
        throw new LlamaForwardError(`sampleOnDevice: sequence ${s}: q: expected [${k}, ${V}] f32`);
      if (sp.qDevice !== undefined) {
        if (!this.acceptsDeviceProbs(sp.qDevice))
          throw new LlamaForwardError(`sampleOnDevice: sequence ${s}: qDevice: on ${sp.qDevice.device}, not cuda`);
        const at = sp.qDevice.address;
        if (qBase === undefined || at < qBase) qBase = at;
      }
      G++;
      D += k;
      if (sp.q !== undefined) Q += k;
    }
    if (qBase !== undefined && Q > 0)
      throw new LlamaForwardError('sampleOnDevice: specs: q in host memory and on the device in one batch');
    const out = new Int32Array(2 * S).fill(-2);
    if (G === 0) return out;
    const groups = new Int32Array(4 * G);
    const temperature = new Float64Array(G);
    const topP = new Float64Array(G);
    const drafts = new Int32Array(D);
    const uniforms = new Float64Array(D + G);
    // one sequence's q goes as it is (the common case, 1 sequence: no copy of k · vocab floats on the step's path)
    const qOnly = Q === 0 ? undefined : specs.filter((sp) => sp?.q !== undefined);
    const q = qOnly === undefined ? undefined : qOnly.length === 1 ? qOnly[0]!.q! : new Float32Array(Q * V);
    const who: number[] = [];
    const rowBytes = BigInt(V * 4);
    let qRows = 0;
    let [g, d, u, qr] = [0, 0, 0, 0];
    for (let s = 0; s < S; s++) {
      const sp = specs[s];
      if (sp === undefined) continue;
      const k = sp.drafts.length;
      // k = 0: the sequence's last logit row (a prefill chunk asked for 'last' has one)
      groups[4 * g] = result.logitRowStart[s + 1]! - 1 - k;
      groups[4 * g + 1] = k;
      if (sp.qDevice !== undefined) {
        const off = sp.qDevice.address - qBase!;
        if (off % rowBytes !== 0n)
          throw new LlamaForwardError(`sampleOnDevice: sequence ${s}: qDevice: not a whole row from the others`);
        groups[4 * g + 2] = Number(off / rowBytes);
        qRows = Math.max(qRows, groups[4 * g + 2]! + k);
      } else groups[4 * g + 2] = sp.q === undefined ? -1 : qr;
      groups[4 * g + 3] = sp.topK !== undefined && sp.topK < V ? sp.topK : 0;
      temperature[g] = sp.temperature;
      topP[g] = sp.topP ?? 1;
      drafts.set(sp.drafts, d);
      uniforms.set(sp.uniforms, u);
      if (sp.q !== undefined) {
        if (q !== sp.q) q!.set(sp.q, qr * V);
        qr += k;
      }
      d += k;
      u += k + 1;
      who.push(s);
      g++;
    }
    const res = this.cuda.llamaSample(
      this.runner,
      qBase === undefined
        ? { groups, temperature, topP, drafts, uniforms, q }
        : { groups, temperature, topP, drafts, uniforms, qAddress: qBase, qRows: Math.max(1, qRows) },
    );
    for (let i = 0; i < G; i++) {
      out[2 * who[i]!] = res[2 * i]!;
      out[2 * who[i]! + 1] = res[2 * i + 1]!;
    }
    return out;
  }

  /**
   * {@link DeviceSampling}: a drafter's q on this GPU is read where it lies (the addon checks the address is one of
   * its lent buffers).
   */
  acceptsDeviceProbs(probs: DeviceDraftProbs): boolean {
    return probs.device === 'cuda';
  }

  /** `taps` as the Int32Array llamaForward takes (the last one reused while the engine asks for the same taps). */
  private tapIds(taps: readonly number[]): Int32Array {
    const last = this.lastTaps;
    let same = last !== undefined && last.length === taps.length;
    for (let i = 0; same && i < taps.length; i++) same = last![i] === taps[i];
    if (same) return last!;
    const ids = Int32Array.from(taps);
    this.lastTaps = ids;
    return ids;
  }

  /**
   * {@link PrefixCommit}: keeps the first `committed` tokens of `id`'s rows of `result` (attention only: the KV
   * length is truncated in the page bookkeeping; the device rows past it are overwritten by later tokens).
   * @throws {LlamaForwardError} if `id` was not in the forward or `committed` is outside [1, its rows].
   */
  commitPrefix(cache: SequenceCache, result: ForwardResult, id: SequenceId, committed: number): void {
    const s = (result as CudaForwardResult).spans?.find((x) => x.id === id);
    if (s === undefined) throw new LlamaForwardError(`commitPrefix: sequence ${String(id)} was not in this forward`);
    if (!(Number.isInteger(committed) && committed >= 1 && committed <= s.numNew))
      throw new LlamaForwardError(`commitPrefix: committed: expected an integer in [1, ${s.numNew}], got ${committed}`);
    cache.rollback(id, { length: s.position + committed, state: undefined });
  }

  /** Token embeddings `[tokens.length, hiddenSize]` f32 (from a host copy of the bf16 table). */
  embedTokens(tokens: Int32Array): Float32Array {
    const D = this.config.hiddenSize;
    const out = new Float32Array(tokens.length * D);
    tokens.forEach((id, i) => {
      if (!(id >= 0 && id < this.config.vocabSize))
        throw new LlamaForwardError(`embedTokens: id ${id} outside [0, ${this.config.vocabSize})`);
      bf16ToF32(this.embedBits.subarray(id * D, (id + 1) * D), out.subarray(i * D, (i + 1) * D));
    });
    return out;
  }

  /**
   * The GPU this stage runs on, for drafters that run their draft model beside it (the EAGLE-3 plugin's GPU
   * drafter finds it by shape: a stage with `cudaDevice()`): the loaded addon and the token embedding as bf16 bits
   * `[vocabSize, hiddenSize]` (a drafter uploads its own copy; the runner's device buffer is not shared).
   * @throws {LlamaForwardError} once the stage was disposed.
   */
  cudaDevice(): { readonly addon: CudaAddon; readonly embedding: Uint16Array } {
    if (this.disposed) throw new LlamaForwardError('cudaDevice: the CUDA stage was disposed');
    return { addon: this.cuda, embedding: this.embedBits };
  }

  /** The output projection alone on the GPU: `x [rows, hiddenSize]` f32 → logits `[rows, vocabSize]` f32. */
  lmHead(x: Float32Array, rows: number): Float32Array {
    return this.cuda.llamaLmHead(this.runner, x, rows);
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.cuda.llamaDispose(this.runner);
  }
}

/**
 * Loads a Llama model onto the GPU from `src` (a GGUF file or a safetensors folder: quantized tensors are
 * dequantized and rounded to bf16, norms kept f32).
 * @throws {Error} with one message when the CUDA backend is not available (not built, or no device);
 *   {@link LlamaWeightError} for what the GPU path does not implement (attention bias) or a bad tensor;
 *   Error naming a failed CUDA call (e.g. the activations do not fit).
 */
export async function loadLlamaCudaStage(
  c: LlamaConfig,
  src: LlamaTensorSource,
  options: CudaStageOptions = {},
): Promise<CudaLlamaStageModel> {
  if (c.attentionBias) throw new LlamaWeightError(`llama: ${src.label}: q/k/v biases are not implemented on CUDA`);
  const { loadCuda } = await import('@specd/native-cuda');
  const cuda = loadCuda();
  const maxTokens = options.maxTokens ?? 2048;
  const D = c.hiddenSize;
  const I = c.intermediateSize;
  const qw = c.numHeads * c.headDim;
  const kw = c.numKvHeads * c.headDim;
  const runner = cuda.llamaCreate({
    numLayers: c.numLayers,
    hiddenSize: D,
    intermediateSize: I,
    numHeads: c.numHeads,
    numKvHeads: c.numKvHeads,
    headDim: c.headDim,
    vocabSize: c.vocabSize,
    ropeTheta: c.ropeTheta,
    rmsNormEps: c.rmsNormEps,
    neox: c.ropeStyle === 'neox',
    tiedEmbeddings: c.tieWordEmbeddings,
    maxTokens,
  });
  try {
    const embedBits = src.bf16Rows(['model.embed_tokens.weight'], [c.vocabSize], D);
    cuda.llamaSetWeight(runner, 'embed', -1, embedBits);
    if (!c.tieWordEmbeddings)
      cuda.llamaSetWeight(runner, 'lmHead', -1, src.bf16Rows(['lm_head.weight'], [c.vocabSize], D));
    cuda.llamaSetWeight(runner, 'finalNorm', -1, src.vector('model.norm.weight', D));
    for (let l = 0; l < c.numLayers; l++) {
      const p = `model.layers.${l}.`;
      const set = (name: string, data: Uint16Array | Float32Array) => cuda.llamaSetWeight(runner, name, l, data);
      set('attnNorm', src.vector(`${p}input_layernorm.weight`, D));
      set('mlpNorm', src.vector(`${p}post_attention_layernorm.weight`, D));
      set(
        'qkv',
        src.bf16Rows(
          [`${p}self_attn.q_proj.weight`, `${p}self_attn.k_proj.weight`, `${p}self_attn.v_proj.weight`],
          [qw, kw, kw],
          D,
        ),
      );
      set('o', src.bf16Rows([`${p}self_attn.o_proj.weight`], [D], qw));
      set('gateUp', src.bf16Rows([`${p}mlp.gate_proj.weight`, `${p}mlp.up_proj.weight`], [I, I], D));
      set('down', src.bf16Rows([`${p}mlp.down_proj.weight`], [D], I));
      options.onLayer?.(l + 1, c.numLayers);
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
    return new CudaLlamaStageModel(c, cuda, runner, embedBits, maxTokens, options.graphs ?? true);
  } catch (err) {
    cuda.llamaDispose(runner);
    throw err;
  }
}
