/**
 * The entry script of a pipeline stage process (forked by {@link startPipeline}; `dist/pipeline/stage-worker.js`).
 *
 * argv: `zmq <endpoint>` (the default transport: a ZeroMQ PAIR socket connected to the driver's,
 * served on this process's event loop, zmq-stage.ts) or `fifo <request fifo> <response fifo>`
 * ({@link FifoChannel}, served synchronously). Over the IPC channel it receives one `init`
 * (`{modelDir, plugins, layerStart, layerEnd, stage, tp?}`), loads ONLY that layer range through the
 * model plugin — with tp > 1 (TP × PP) as a tensor-parallel group whose ranks each load their shard of
 * the range (`startTensorParallel` with `range`; rank 0 on this thread, ranks 1 … tp−1 worker threads
 * of this process) — opens its channel and answers `ready` (`{info, tensors, ranks?}`) or `error`. From
 * then on it serves requests one at a time:
 *   `projection` — load this stage's share of a drafter's context projection (`{dir, taps}`:
 *               `DrafterPlugin.loadProjection` for the taps this stage produces, through the plugin
 *               packages of `init`), or drop it (no `dir`); reply `{reads}`;
 *   `forward` — apply the queued cache operations, then run the stage; reply `{taps, projection}` +
 *               frames `[hidden, projection?, …taps]`: once a projection is loaded, the stage adds
 *               its taps' products into the fp32 accumulator it received (frame after `hidden`, or
 *               zeros) and sends that instead of the taps (REFERENCE.md §8; a stage with no tap
 *               passes the accumulator through);
 *   `usage`   — apply the queued cache operations; reply the pages and slots its caches hold and its PD writes in
 *               flight (`{pagesInUse, slotsInUse, transfersInFlight}`: what the driver freed is free here too);
 *   `pd-start`, `pd-send`, `pd-abort` — a prefill instance's stage sends the layers it owns to the decode
 *               instance (stage-pd.ts; the ZeroMQ transport only: a write goes on on this process's event loop,
 *               which the FIFO loop never yields to); a write's end reaches the driver over the IPC channel;
 *   `exit`    — close and exit.
 * The driver's death (even by SIGKILL) exits the process: under FIFOs as end of file on the request
 * FIFO; under ZeroMQ (which hides a vanished peer) as the IPC channel's `disconnect`, with a check
 * of the parent pid every 500 ms as a second line.
 *
 * Cache operations mirror what the driver's engine did to its own cache since the last request
 * (see pipeline-model.ts, `PipelineCache`): `cache` (create, with the driver's options), `drop`,
 * `add`, `finish`, `checkpoint`, `rollback` (to the sequence's latest checkpoint), `commitPrefix`
 * and `commitTreePath` (on this stage's latest forward result).
 */

import 'reflect-metadata';

import * as fs from 'node:fs';

import { container as rootContainer } from 'tsyringe';

import { HfConfig } from '../io/hf-config.js';
import { SafetensorsCheckpoint } from '../io/safetensors-checkpoint.js';
import { stageTaps, type PartialProjection } from '../plugin/drafter-plugin.js';
import { DrafterRegistry, loadPluginPackages, PluginError } from '../plugin/registry.js';
import { PdError } from '../pd/types.js';

import type { SequenceCacheOptions } from '../kv/sequence-cache.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { ForwardSequence, StageModel } from '../plugin/model-plugin.js';
import { startTensorParallel, type RankReport } from '../tensor-parallel/tp-model.js';
import { CacheReplica } from './cache-replica.js';
import { StagePdSender, type StagePdStart } from './stage-pd.js';
import { loadStage, type StageSpec } from './stage-loader.js';
import { FifoChannel, PeerGoneError, type Frame, type Message } from './transport.js';
import type { StageSendRequest } from '../pd/stages.js';

/** A cache operation (driver → stage), in program order. */
export type CacheOp =
  | { readonly op: 'cache'; readonly cache: number; readonly options: SequenceCacheOptions }
  | { readonly op: 'drop'; readonly cache: number }
  | { readonly op: 'add' | 'finish' | 'checkpoint' | 'rollback'; readonly cache: number; readonly id: SequenceId }
  | { readonly op: 'commitPrefix'; readonly cache: number; readonly id: SequenceId; readonly committed: number }
  /** The caller grew a sequence outside a forward (a decode instance reserving a transferred prompt's pages). */
  | { readonly op: 'extend'; readonly cache: number; readonly id: SequenceId; readonly length: number }
  | {
      readonly op: 'commitTreePath';
      readonly cache: number;
      readonly id: SequenceId;
      readonly rows: readonly number[];
    };

/** A sequence of a forward request (tokens travel as one i32 frame). */
export interface WireSequence {
  readonly id: SequenceId;
  readonly position: number;
  readonly n: number;
  readonly phase?: 'prefill';
  readonly tree?: number[];
}

/** The `init` message. */
export interface StageInit extends StageSpec {
  readonly type: 'init';
  readonly stage: number;
  /** TP × PP: run the stage as a TP group of this many ranks (worker threads of the stage process); default 1. */
  readonly tp?: number;
  /** Kernel threads of the stage process under TP (default: startTensorParallel's choice). */
  readonly kernelThreads?: number;
}

class StageServer extends CacheReplica {
  /** This stage's share of the drafter's context projection, once loaded. */
  private projection: PartialProjection | undefined;

  /** The prefill/decode sender (a prefill instance's stage). */
  readonly pd: StagePdSender;

  constructor(
    model: StageModel,
    private readonly drafterPlugins: DrafterRegistry,
    stage: number,
  ) {
    super(model, 'stage');
    // a driver that is gone cannot be told (this process exits on the IPC channel's disconnect)
    this.pd = new StagePdSender(stage, (done) => process.send?.(done, undefined, {}, () => undefined));
  }

  /** Applies one recorded operation; a sequence freed stops its PD writes first. */
  override apply(op: CacheOp): void {
    if (op.op === 'finish') this.pd.freed(op.cache, op.id);
    else if (op.op === 'drop') this.pd.freed(op.cache);
    super.apply(op);
  }

  /** `usage`: applies the queued operations; replies the pages and slots held. */
  usage(h: Record<string, unknown>): Message {
    for (const op of h.ops as CacheOp[]) this.apply(op);
    return { header: { type: 'ok', ...this.held(), transfersInFlight: this.pd.inflight }, frames: [] };
  }

  /** `pd-send`: applies the queued operations, then starts the write (stage-pd.ts). */
  pdSend(h: Record<string, unknown>): Message {
    for (const op of h.ops as CacheOp[]) this.apply(op);
    const cacheId = h.cache as number;
    this.pd.send(this.cache(cacheId), cacheId, h.seq as SequenceId, h.request as StageSendRequest);
    return { header: { type: 'ok' }, frames: [] };
  }

  /** Loads the fc blocks of the taps this stage produces (`DrafterPlugin.loadProjection`). */
  loadProjection(h: Record<string, unknown>): Message {
    this.projection?.dispose();
    this.projection = undefined;
    if (h.dir === undefined) return { header: { type: 'ok', reads: [] }, frames: [] };
    const dir = h.dir as string;
    const config = HfConfig.read(dir);
    const plugin = this.drafterPlugins.resolve(config);
    if (plugin.loadProjection === undefined)
      throw new PluginError(`drafter plugin ${plugin.method} has no loadProjection: stages cannot project their taps`);
    const format = h.format ?? 'bf16';
    if (format !== 'bf16' && format !== 'q8_0')
      throw new PluginError(`projection: format: expected "bf16" or "q8_0", got ${JSON.stringify(format)}`);
    const weights = SafetensorsCheckpoint.open(dir);
    try {
      this.projection = plugin.loadProjection(
        { dir, config, weights },
        {
          taps: stageTaps(h.taps as number[], this.model.info),
          hiddenSize: this.model.info.hiddenSize,
          format,
        },
      );
    } finally {
      weights.close();
    }
    return { header: { type: 'ok', reads: this.projection.reads }, frames: [] };
  }

  forward(h: Record<string, unknown>, frames: readonly Frame[]): Message {
    for (const op of h.ops as CacheOp[]) this.apply(op);
    const cacheId = h.cache as number;
    const tokens = frames[0] as Int32Array;
    const hidden = h.hasHidden === true ? (frames[1] as Float32Array) : undefined;
    const incoming = h.hasProjection === true ? (frames[h.hasHidden === true ? 2 : 1] as Float32Array) : undefined;
    let at = 0;
    const sequences: ForwardSequence[] = (h.seqs as WireSequence[]).map((s) => {
      const seq: ForwardSequence = {
        id: s.id,
        position: s.position,
        tokens: tokens.subarray(at, at + s.n),
        logits: 'none',
        ...(s.phase === undefined ? {} : { phase: s.phase }),
        ...(s.tree === undefined ? {} : { tree: Int32Array.from(s.tree) }),
      };
      at += s.n;
      return seq;
    });
    const result = this.runForward(cacheId, (cache) =>
      this.model.forward({ sequences, ...(hidden === undefined ? {} : { hidden }) }, cache, {
        taps: h.taps as number[],
        stateSnapshots: h.snapshots === true,
      }),
    );
    if (this.projection !== undefined && (result.taps.size > 0 || incoming !== undefined)) {
      const acc =
        result.taps.size > 0
          ? this.projection.projectTargetHiddenPartial(result.taps, tokens.length, incoming)
          : incoming;
      return {
        header: { type: 'ok', taps: [], projection: acc !== undefined },
        frames: acc === undefined ? [result.hidden] : [result.hidden, acc],
      };
    }
    const tapIds = [...result.taps.keys()];
    return {
      header: { type: 'ok', taps: tapIds, projection: false },
      frames: [result.hidden, ...tapIds.map((t) => result.taps.get(t)!)],
    };
  }
}

/** An error as a reply (a PD error keeps its code). */
function errorReply(err: unknown): Message {
  const e = err as Error & { code?: unknown };
  const code = e instanceof PdError ? { code: e.code } : {};
  return { header: { type: 'error', name: e.name, message: e.message, ...code }, frames: [] };
}

/** One request → its reply, or `'exit'` (`pd-start` answers once the transfer agent is bound). */
function handle(server: StageServer, msg: Message): Message | 'exit' | Promise<Message> {
  const h = msg.header;
  const type = h.type;
  if (type === 'exit') return 'exit';
  try {
    switch (type) {
      case 'projection':
        return server.loadProjection(h);
      case 'forward':
        return server.forward(h, msg.frames);
      case 'usage':
        return server.usage(h);
      case 'pd-start':
        return server.pd
          .start(h.options as StagePdStart)
          .then((agent) => ({ header: { type: 'ok', agent }, frames: [] }), errorReply);
      case 'pd-send':
        return server.pdSend(h);
      case 'pd-abort':
        server.pd.abort(h.transferId as string, h.reason as string);
        return { header: { type: 'ok' }, frames: [] };
      default:
        throw new Error(`stage: unknown request ${String(type)}`);
    }
  } catch (err) {
    return errorReply(err);
  }
}

/** The FIFO loop's handler: PD requests are refused (a write needs the event loop this loop never yields). */
function handleSync(server: StageServer, msg: Message): Message | 'exit' {
  const type = String(msg.header.type);
  if (type.startsWith('pd-'))
    return errorReply(
      new PdError(
        'unsupported',
        'a prefill instance under pipeline parallelism needs parallelism.transport "zmq" (its stages send their ' +
          'layers on their own event loop, which the "fifo" transport never yields to)',
      ),
    );
  return handle(server, msg) as Message | 'exit';
}

/** The FIFO transport's loop (synchronous: end of file on the request FIFO = the driver is gone). */
function serveFifo(server: StageServer, ch: FifoChannel): never {
  for (;;) {
    let msg: Message;
    try {
      msg = ch.receive();
    } catch (err) {
      if (err instanceof PeerGoneError) process.exit(0);
      throw err;
    }
    const reply = handleSync(server, msg);
    if (reply === 'exit') {
      ch.close();
      process.exit(0);
    }
    try {
      ch.send(reply);
    } catch (err) {
      if (err instanceof PeerGoneError) process.exit(0);
      throw err;
    }
  }
}

/** Exits when the driver is gone: its IPC channel closed, or this process re-parented. */
function exitWithDriver(): void {
  const driver = process.ppid;
  process.once('disconnect', () => process.exit(0));
  setInterval(() => {
    if (process.ppid !== driver) process.exit(0);
  }, 500).unref();
}

async function main(): Promise<void> {
  const [transport, reqPath, respPath] = process.argv.slice(2);
  const ok =
    transport === 'zmq'
      ? reqPath !== undefined
      : transport === 'fifo' && reqPath !== undefined && respPath !== undefined;
  if (!ok || process.send === undefined) {
    process.stderr.write(
      'stage-worker: run by startPipeline (argv: zmq <endpoint> | fifo <request fifo> <response fifo>; IPC channel)\n',
    );
    process.exit(2);
  }
  if (transport === 'zmq') exitWithDriver();
  const init = await new Promise<StageInit>((resolve) => process.once('message', (m) => resolve(m as StageInit)));
  let server: StageServer;
  let tensors: string[];
  try {
    let ranks: readonly RankReport[] | undefined;
    let model: StageModel;
    if ((init.tp ?? 1) > 1) {
      // TP × PP: this stage's layers over tp ranks (rank 0 on this thread, the others worker threads)
      const tpModel = await startTensorParallel({
        modelDir: init.modelDir,
        plugins: init.plugins,
        tp: init.tp!,
        ...(init.kernelThreads === undefined ? {} : { kernelThreads: init.kernelThreads }),
        range: {
          layerStart: init.layerStart,
          layerEnd: init.layerEnd,
          ...(init.embedding === true ? { embedding: true } : {}),
        },
      });
      model = tpModel;
      ranks = tpModel.ranks;
      tensors = [...new Set(tpModel.ranks[0]!.reads.map((r) => r.name))];
    } else {
      const loaded = await loadStage(init);
      model = loaded.model;
      tensors = loaded.tensors;
    }
    const container = rootContainer.createChildContainer();
    await loadPluginPackages(init.plugins, container);
    server = new StageServer(model, DrafterRegistry.fromContainer(container), init.stage);
    const info = model.info;
    const cacheLayers = [...model.cacheGeometry.pagedKv.layers, ...model.cacheGeometry.linearState.layers];
    if (transport === 'zmq') {
      const { serveZmq } = await import('./zmq-stage.js');
      const serving = serveZmq(reqPath!, (msg) => handle(server, msg));
      await new Promise<void>((resolve, reject) =>
        process.send!(
          { type: 'ready', info, tensors, pid: process.pid, cacheLayers, ...(ranks === undefined ? {} : { ranks }) },
          (err: Error | null) => (err ? reject(err) : resolve()),
        ),
      );
      await serving.catch((err: Error) => {
        process.stderr.write(`pipeline stage ${init.stage}: ${err.message}\n`);
        process.exit(1);
      });
      process.exit(0);
    }
    // the driver holds the response FIFO open for reading already; the request FIFO opens when it writes
    const writeFd = fs.openSync(respPath!, 'w');
    const readFd = fs.openSync(reqPath!, 'r');
    const ch = new FifoChannel(readFd, writeFd, 5);
    await new Promise<void>((resolve, reject) =>
      process.send!(
        { type: 'ready', info, tensors, pid: process.pid, cacheLayers, ...(ranks === undefined ? {} : { ranks }) },
        (err: Error | null) => (err ? reject(err) : resolve()),
      ),
    );
    serveFifo(server, ch);
  } catch (err) {
    const e = err as Error;
    await new Promise<void>((resolve) =>
      process.send!({ type: 'error', name: e.name, message: e.message }, () => resolve()),
    );
    process.exit(1);
  }
}

void main();
