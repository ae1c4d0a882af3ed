/**
 * Starting a pipeline: fork the stage processes (each loads its layer range), connect each over its
 * transport (ZeroMQ or FIFOs), load the last stage here, and assemble the {@link PipelineModel}.
 */

import { execFileSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as nodePath from 'node:path';

import type { LoadProgress, StageInfo, StageModel } from '../plugin/model-plugin.js';
import { startTensorParallel, type RankReport } from '../tensor-parallel/tp-model.js';
import { defaultPartition, partitionRanges } from './partition.js';
import { PipelineModel } from './pipeline-model.js';
import { RemoteStage, type StageReport } from './remote-stage.js';
import { loadStage, numHiddenLayers } from './stage-loader.js';
import { exitDescription, forkStage, PipelineStageError, untrack } from './stage-process.js';
import type { StageInit } from './stage-worker.js';
import { FifoChannel } from './transport.js';
import { processAlive, ZmqChannel } from './zmq-channel.js';

/** Options of {@link startPipeline}. */
export interface PipelineOptions {
  /** Hugging Face checkpoint directory of the target. */
  readonly modelDir: string;
  /** Plugin packages (the stage processes import the same ones). */
  readonly plugins: readonly string[];
  /** Stages (≥ 2). */
  readonly pp: number;
  /** Layers per stage (length pp, each ≥ 1, sum = num_hidden_layers); default {@link defaultPartition}. */
  readonly partition?: readonly number[];
  /**
   * Load the token embedding on the last stage too (default true): drafters reuse the target's
   * embedding (`embedTokens`), and they live with the last stage. Plain decoding does not need it.
   */
  readonly lastStageEmbedding?: boolean;
  /** Progress of the last stage's load (the driver's own; not reported under TP × PP). */
  readonly onProgress?: (p: LoadProgress) => void;
  /**
   * TP × PP: every stage runs as a tensor-parallel group of `tp` ranks (default 1) — worker threads
   * of the stage process (the last stage's in the driver). Kernel threads per process:
   * max(1, ⌊CPUs / (tp · pp)⌋) unless `SPECD_NUM_THREADS` is set.
   */
  readonly tp?: number;
  /**
   * Driver ↔ stage transport: `'zmq'` (default) — ZeroMQ PAIR sockets over `ipc://` in a private temp
   * dir (the issue's choice; a `tcp://` endpoint would let a stage live on another host later);
   * `'fifo'` — a pair of named pipes per stage (same host only; lower latency, docs/BENCHMARKS.md).
   */
  readonly transport?: StageTransport;
  /**
   * Stage processes on other hosts (transport `'zmq'`): entry k for stage k (0 … pp−2; absent: this host). The
   * driver then binds every stage's PAIR socket on `tcp://<bindHost>:*` (not `ipc://`), so the stages reach it over
   * the network. Each host's `exec` starts the stage there (a command prefix that execs node in place: the stage
   * stays a child of this process, which watches its pid — another network namespace, a container sharing the
   * process table); `address` is where the stage's PD transfer agent binds (default: the server's host).
   */
  readonly stageHosts?: readonly StageHost[];
  /** The driver's address for {@link stageHosts}' TCP sockets (required with them). */
  readonly bindHost?: string;
}

/** Where a stage process runs ({@link PipelineOptions.stageHosts}). */
export interface StageHost {
  /** Command prefix that starts the stage process there, e.g. `['ip', 'netns', 'exec', 'ns1']`. */
  readonly exec?: readonly string[];
  /** The stage's own address (its PD transfer agent binds there). */
  readonly address?: string;
}

/** How the driver and a stage process talk (see {@link PipelineOptions.transport}). */
export type StageTransport = 'zmq' | 'fifo';

type Ready = { info: StageInfo; tensors: string[]; cacheLayers: number[]; ranks?: RankReport[] };

/** Sends `init` to a forked stage and waits for its `ready` (or its load error / exit) over the IPC channel. */
function stageReady(
  child: ChildProcess,
  stage: number,
  init: Omit<StageInit, 'type' | 'stage'>,
  where: string,
  onWaiting?: (reject: (err: unknown) => void) => () => void,
): Promise<Ready> {
  return new Promise<Ready>((resolve, reject) => {
    let stop: (() => void) | undefined;
    const onExit = (code: number | null, sig: NodeJS.Signals | null) => {
      stop?.();
      reject(
        new PipelineStageError(
          `${where} ${code !== null ? `exited with code ${code}` : `was killed by ${sig}`} while loading`,
        ),
      );
    };
    child.once('exit', onExit);
    child.once('message', (m: Ready & { type: string; name?: string; message?: string }) => {
      child.off('exit', onExit);
      if (m.type === 'ready') resolve(m);
      else reject(new PipelineStageError(`${where}: ${m.name}: ${m.message}`));
    });
    stop = onWaiting?.(reject);
    child.send({ type: 'init', stage, ...init } satisfies StageInit);
  });
}

function stageReport(
  stage: number,
  init: Omit<StageInit, 'type' | 'stage'>,
  child: ChildProcess,
  ready: Ready,
): StageReport {
  return {
    stage,
    layerStart: init.layerStart,
    layerEnd: init.layerEnd,
    pid: child.pid,
    tensors: ready.tensors,
    cacheLayers: ready.cacheLayers,
    ...(ready.ranks === undefined ? {} : { ranks: ready.ranks }),
  };
}

/** Unix socket paths are limited to ~107 bytes: a longer temp dir falls back to local TCP. */
function zmqEndpoint(tmp: string, stage: number): string {
  const p = nodePath.join(tmp, `stage${stage}.zmq`);
  return Buffer.byteLength(p) <= 100 ? `ipc://${p}` : 'tcp://127.0.0.1:*';
}

/**
 * Forks stage `stage` connected over ZeroMQ and waits for it to load: the driver binds a PAIR socket
 * (on its bridge thread), the stage connects and sends `hello` first, which the driver receives
 * after `ready` — so the connection exists before startPipeline removes the temp dir holding the
 * `ipc://` socket file. A dead stage is seen by its process's liveness.
 */
async function spawnStageZmq(
  stage: number,
  init: Omit<StageInit, 'type' | 'stage'>,
  tmp: string,
  remote?: { readonly bindHost: string; readonly host: StageHost },
): Promise<RemoteStage> {
  let pid: number | undefined;
  const endpoint = remote === undefined ? zmqEndpoint(tmp, stage) : `tcp://${remote.bindHost}:*`;
  const channel = ZmqChannel.bind(endpoint, { isPeerAlive: () => processAlive(pid) });
  let child: ChildProcess | undefined;
  try {
    child = forkStage(['zmq', channel.endpoint], remote?.host.exec);
    pid = child.pid;
    const where = `pipeline stage ${stage} (layers ${init.layerStart}–${init.layerEnd - 1}, pid ${child.pid})`;
    const ready = await stageReady(child, stage, init, where);
    let hello: ReturnType<typeof channel.receive>;
    try {
      hello = channel.receive();
    } catch (err) {
      throw new PipelineStageError(`${where} ${exitDescription(child)} before connecting`, { cause: err });
    }
    if (hello.header.type !== 'hello')
      throw new PipelineStageError(`${where}: expected hello, got ${String(hello.header.type)}`);
    child.channel?.unref();
    child.unref();
    const r = new RemoteStage(stage, ready.info, child, channel, stageReport(stage, init, child, ready));
    if (remote?.host.address !== undefined) r.pdHost = remote.host.address;
    return r;
  } catch (err) {
    if (child !== undefined) {
      child.kill('SIGKILL');
      untrack(child);
    }
    channel.close();
    throw err;
  }
}

/** Forks stage `stage` connected by a pair of FIFOs and waits for it to load. */
async function spawnStageFifo(
  stage: number,
  init: Omit<StageInit, 'type' | 'stage'>,
  tmp: string,
): Promise<RemoteStage> {
  const req = nodePath.join(tmp, `stage${stage}.req`);
  const resp = nodePath.join(tmp, `stage${stage}.resp`);
  execFileSync('mkfifo', [req, resp]);
  // the response FIFO's read end first (non-blocking): the stage's blocking open for writing then succeeds at once
  const readFd = fs.openSync(resp, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  const child = forkStage(['fifo', req, resp]);
  let writeFd: number | undefined;
  const where = `pipeline stage ${stage} (layers ${init.layerStart}–${init.layerEnd - 1}, pid ${child.pid})`;
  try {
    const ready = await stageReady(child, stage, init, where, (reject) => {
      // the request FIFO's write end: succeeds once the stage has opened it for reading
      let opening: NodeJS.Timeout | undefined;
      const open = (): void => {
        try {
          writeFd = fs.openSync(req, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'ENXIO') {
            reject(err);
            return;
          }
          opening = setTimeout(open, 5);
        }
      };
      open();
      return () => clearTimeout(opening);
    });
    if (writeFd === undefined) throw new PipelineStageError(`${where}: ready before its request channel opened`);
    child.channel?.unref();
    child.unref();
    return new RemoteStage(
      stage,
      ready.info,
      child,
      new FifoChannel(readFd, writeFd),
      stageReport(stage, init, child, ready),
    );
  } catch (err) {
    child.kill('SIGKILL');
    untrack(child);
    fs.closeSync(readFd);
    if (writeFd !== undefined) fs.closeSync(writeFd);
    throw err;
  } finally {
    fs.rmSync(req, { force: true });
    fs.rmSync(resp, { force: true });
  }
}

/**
 * Starts a pipeline: forks stages 0 … pp−2 (each loads only its layers) and loads the last stage
 * here, all at once. @throws {PartitionError} for a bad partition; {@link PipelineStageError} when a
 * stage fails to load (the others are killed).
 */
export async function startPipeline(options: PipelineOptions): Promise<PipelineModel> {
  const L = numHiddenLayers(options.modelDir);
  const partition = options.partition ?? defaultPartition(L, options.pp);
  const ranges = partitionRanges(partition, L, options.pp);
  if (ranges.length < 2)
    throw new PipelineStageError('startPipeline: pp must be >= 2 (pp = 1 is the plain in-process model)');
  const tp = options.tp ?? 1;
  if (!Number.isInteger(tp) || tp < 1)
    throw new PipelineStageError(`startPipeline: tp must be an integer >= 1, got ${tp}`);
  const env = process.env.SPECD_NUM_THREADS;
  const kernelThreads =
    tp > 1 && (env === undefined || env === '')
      ? Math.max(1, Math.floor(os.availableParallelism() / (tp * ranges.length)))
      : undefined;
  const par = tp > 1 ? { tp, ...(kernelThreads === undefined ? {} : { kernelThreads }) } : {};
  const tmp = fs.mkdtempSync(nodePath.join(os.tmpdir(), 'specd-pp-'));
  const [ls, le] = ranges[ranges.length - 1]!;
  const transport = options.transport ?? 'zmq';
  if (transport !== 'zmq' && transport !== 'fifo')
    throw new PipelineStageError(`startPipeline: transport must be 'zmq' or 'fifo', got ${String(transport)}`);
  const hosts = options.stageHosts ?? [];
  if (hosts.length > 0 && (transport !== 'zmq' || options.bindHost === undefined))
    throw new PipelineStageError("startPipeline: stage hosts need transport 'zmq' and the driver's bindHost");
  if (hosts.length > ranges.length - 1)
    throw new PipelineStageError(`startPipeline: ${hosts.length} stage hosts for ${ranges.length - 1} stage processes`);
  const remotes = ranges.slice(0, -1).map(([a, b], k) => {
    const init = { modelDir: options.modelDir, plugins: options.plugins, layerStart: a, layerEnd: b, ...par };
    const host = hosts[k];
    if (transport === 'fifo') return spawnStageFifo(k, init, tmp);
    const bindHost = options.bindHost ?? '127.0.0.1';
    return spawnStageZmq(k, init, tmp, host === undefined ? undefined : { bindHost, host });
  });
  const embedding = options.lastStageEmbedding ?? true;
  const lastP: Promise<{ model: StageModel; tensors: string[]; ranks?: readonly RankReport[] }> =
    tp > 1
      ? startTensorParallel({
          modelDir: options.modelDir,
          plugins: options.plugins,
          tp,
          ...(kernelThreads === undefined ? {} : { kernelThreads }),
          range: { layerStart: ls, layerEnd: le, ...(embedding ? { embedding: true } : {}) },
        }).then((m) => ({ model: m, tensors: [...new Set(m.ranks[0]!.reads.map((r) => r.name))], ranks: m.ranks }))
      : loadStage(
          { modelDir: options.modelDir, plugins: options.plugins, layerStart: ls, layerEnd: le, embedding },
          options.onProgress,
        );
  const settled = await Promise.allSettled([...remotes, lastP]);
  fs.rmSync(tmp, { recursive: true, force: true });
  const failed = settled.find((s) => s.status === 'rejected');
  if (failed !== undefined) {
    for (const s of settled) {
      if (s.status === 'fulfilled') ('index' in s.value ? s.value : s.value.model).dispose();
    }
    throw (failed as PromiseRejectedResult).reason;
  }
  const stages = settled.slice(0, -1).map((s) => (s as PromiseFulfilledResult<RemoteStage>).value);
  const last = (settled[settled.length - 1] as PromiseFulfilledResult<Awaited<typeof lastP>>).value;
  return new PipelineModel(stages, last.model, [
    ...stages.map((s) => s.report),
    {
      stage: stages.length,
      layerStart: ls,
      layerEnd: le,
      pid: undefined,
      tensors: last.tensors,
      cacheLayers: [...last.model.cacheGeometry.pagedKv.layers, ...last.model.cacheGeometry.linearState.layers],
      ...(last.ranks === undefined ? {} : { ranks: last.ranks }),
    },
  ]);
}
