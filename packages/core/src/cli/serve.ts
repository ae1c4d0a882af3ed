/**
 * `specd serve [--config FILE] [--model DIR] [--drafter DIR | --no-spec] [--host H] [--port P] [--api-key K]
 * [--allowed-hosts a,b] [--metrics-require-key] [--tp T] [--pp P [--pp-partition 3,5]] [--device cpu|cuda]`: the
 * OpenAI-compatible server (packages/core/src/serve). Flags override the config; with neither --config nor --model
 * it reads the shipped configs/default.json (SmolLM2-135M-Instruct with its fastest drafter on CPU) and serves on
 * 127.0.0.1:8000. `--device cuda` (config `device`) runs the target on one NVIDIA GPU (cli/device.ts): its device
 * line (GPU, memory, KV pool, CUDA graphs) is logged at info once the server listens.
 * vLLM's names --num-draft-tokens, --served-model-name, --max-model-len and --max-num-seqs override the config's
 * drafter.num_draft_tokens, server.model_name, scheduler.max_sequence_tokens and scheduler.max_running_requests.
 * Sampling defaults: the config's, else the model's generation_config.json, else OpenAI's
 * (config/generation-config.ts). Logs: text (pino-pretty) on a TTY, JSON lines otherwise (`--log-format`).
 * The API key comes from --api-key, else `SPECD_API_KEY`, else the config.
 * Before loading anything: a busy port, a `max_sequence_tokens` above the model's context length and a 0.0.0.0
 * bind without a key or allowed hosts are refused, and a bind beyond loopback without a key prints a warning.
 * Under pipeline parallelism the stage processes are killed when the server closes (and on SIGINT / SIGTERM /
 * exit); a dead stage makes /health answer 503 and every request fail with 500 naming the stage (the server stays
 * up).
 * On stderr: one line per start-up stage with its time (load target, load drafter, calibrate, listen), then the
 * serving line (model, tp / pp, drafter), and on SIGINT / SIGTERM a shutdown line and a stopped line; the periodic
 * stats line goes to the log (serve/stats-log.ts; `--disable-log-stats`).
 */

import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';

import { InvalidArgumentError, Option, type Command } from 'commander';
import { type Logger, pino } from 'pino';
import pinoPretty from 'pino-pretty';

import { describeSampling, resolveSamplingDefaults } from '../config/generation-config.js';
import { loadConfig } from '../config/load.js';
import type { CheckpointSanityMode } from '../io/checkpoint-sanity.js';
import type { SpecdConfig } from '../config/load.js';
import type { Device } from '../plugin/model-plugin.js';
import { DRAFT_PAGE_SIZE } from '../kv/draft-kv-cache.js';
import { pdDigest } from '../pd/digest.js';
import { hasDraftContextFeatures, hasDraftContextTransfer } from '../plugin/drafter-plugin.js';
import { type AccessPolicy, apiKeyFrom, checkBind } from '../serve/http-guard.js';
import { checkServerContextLength, modelContextLength } from '../serve/limits.js';
import { SpecdServer, type SpecdServerOptions } from '../serve/server.js';
import { checkModelPath, chooseDrafter, CliError } from './config-file.js';
import { checkDeviceRows, deviceLine, deviceMaxTokens, deviceOption, draftTokensBound } from './device.js';
import { type DrafterChoice, loadDrafter, type LoadedDrafter } from '../runtime/drafter.js';
import { checkParallelism, loadParallelTarget } from '../runtime/parallel.js';
import type { LoadedTarget } from '../runtime/target.js';
import { type CliIo, checkpointSanityOption } from './main.js';
import { defaultModelDir, defaultServeConfig } from './paths.js';

/** Flags of `specd serve`. */
export interface ServeFlags {
  config?: string;
  model?: string;
  drafter?: string;
  spec?: boolean;
  host?: string;
  port?: number;
  apiKey?: string;
  /** Host names accepted besides the bound address and loopback (overrides config server.allowed_hosts). */
  allowedHosts?: string[];
  /** /metrics needs the API key (or config server.metrics_require_key). */
  metricsRequireKey?: boolean;
  logLevel?: string;
  /** Tensor-parallel ranks (overrides config parallelism.tp). */
  tp?: number;
  /** Pipeline stages (overrides config parallelism.pp). */
  pp?: number;
  /** Layers per pipeline stage (overrides config parallelism.partition). */
  ppPartition?: number[];
  /** Prefill/decode disaggregation role (overrides config pd.role). */
  role?: 'prefill' | 'decode' | 'none';
  /** The prefill role's bootstrap port (overrides config pd.bootstrap.port; 0 = ephemeral). */
  bootstrapPort?: number;
  /** `--disable-log-stats` (vLLM's name): no periodic stats line. */
  disableLogStats?: boolean;
  /** Period of the stats line, ms (default 10 000; no flag: for tests and embedders). */
  statsIntervalMs?: number;
  /** Checkpoint sanity at load (overrides config checkpoint_sanity). */
  checkpointSanity?: CheckpointSanityMode;
  /** `--log-format`: `text` (pino-pretty) or `json` (default: text when stderr is a TTY, else json). */
  logFormat?: 'text' | 'json';
  /** vLLM's `--num-draft-tokens`: a fixed draft length (overrides config drafter.num_draft_tokens). */
  numDraftTokens?: number;
  /** vLLM's `--served-model-name` (overrides config server.model_name). */
  servedModelName?: string;
  /** vLLM's `--max-model-len` (overrides config scheduler.max_sequence_tokens). */
  maxModelLen?: number;
  /** vLLM's `--max-num-seqs` (overrides config scheduler.max_running_requests). */
  maxNumSeqs?: number;
  /** vLLM's `--device`: where the target runs (overrides config device). */
  device?: Device;
}

/** A started server and what it loaded (close with {@link StartedServer.close}). */
export interface StartedServer {
  readonly server: SpecdServer;
  readonly url: string;
  readonly target: LoadedTarget;
  readonly drafter?: LoadedDrafter;
  /** Tensor-parallel ranks and pipeline stages of the target. */
  readonly parallelism: { readonly tp: number; readonly pp: number };
  close(): Promise<void>;
}

/** Writes a start-up stage line on stderr (`specd: …`). */
const stage = (io: CliIo, text: string): void => {
  io.stderr.write(`specd: ${text}\n`);
};

/** Seconds since `t0` (performance.now), as `1.23 s`. */
const since = (t0: number): string => `${((performance.now() - t0) / 1000).toFixed(2)} s`;

/**
 * Loads the config (flags override it), the target and the drafter, calibrates the cost-based draft
 * policy when it is in use ({@link SpecdServer.listen}: before listening, so no request pays it), and
 * starts listening.
 * @throws {ConfigError} / {CliError} / {ParallelismError} / the plugins' errors.
 */
export async function startServe(flags: ServeFlags, io: CliIo): Promise<StartedServer> {
  // neither --config nor --model: the shipped default config (configs/default.json: SmolLM2 + its best drafter)
  const configFile =
    flags.config !== undefined
      ? path.resolve(io.cwd, flags.config)
      : flags.model === undefined
        ? defaultServeConfig(io.cwd)
        : undefined;
  if (configFile !== undefined && flags.config === undefined && !fs.existsSync(configFile))
    throw new CliError(
      `no --config and no --model, and the default config ${configFile} is missing (give --config FILE or --model DIR)`,
    );
  const { config: cfg } = await loadConfig(configFile, io.cwd);
  const par = cfg.parallelism;
  const tp = flags.tp ?? par.tp;
  const pp = flags.pp ?? par.pp;
  const partition = flags.ppPartition ?? (flags.pp === undefined || flags.pp === par.pp ? par.partition : undefined);
  checkParallelism(tp, pp, partition);
  const role = flags.role ?? cfg.pd.role;
  const device = flags.device ?? cfg.device;
  // a GPU stage keeps its KV in device memory, which the PD transfer engines do not read yet
  if (device !== 'cpu' && role !== 'none')
    throw new CliError(
      `--device ${device}: prefill/decode disaggregation (--role / pd.role ${role}) is not available with it yet ` +
        '(the KV stays on the GPU)',
    );
  // a prefill instance may be a pipeline (each stage process sends its layers) or a TP group, either side may be a
  // TP group of any size (P's entries are re-split for D's ranks); a pipelined decode side and tp × pp on P are not
  // built yet
  if (role === 'decode' && pp > 1)
    throw new CliError(
      `role decode (--role / pd.role): a decode instance runs with pp = 1 for now (got pp ${pp}; --tp is allowed, ` +
        'and the prefill instance may use --pp)',
    );
  if (role === 'prefill' && pp > 1 && tp > 1)
    throw new CliError(
      `role prefill (--role / pd.role): a prefill instance uses --tp or --pp, not both, for now (got tp ${tp}, ` +
        `pp ${pp})`,
    );
  if (role === 'prefill' && pp > 1 && par.transport !== 'zmq')
    throw new CliError(
      `role prefill with pp ${pp}: parallelism.transport must be "zmq" (got ${JSON.stringify(par.transport)}): ` +
        'each stage process sends its layers on its own event loop, which the "fifo" transport never yields to',
    );
  if (flags.spec === false && flags.drafter !== undefined)
    throw new CliError('--drafter and --no-spec cannot be used together');
  const modelDir =
    flags.model !== undefined ? path.resolve(io.cwd, flags.model) : (cfg.model ?? defaultModelDir(io.cwd));
  checkModelPath(modelDir);
  const chosen = chooseDrafter(
    cfg,
    { model: flags.model, drafter: flags.drafter, noSpec: flags.spec === false },
    io.cwd,
  );
  if (flags.numDraftTokens !== undefined && chosen === undefined)
    throw new CliError('--num-draft-tokens needs a drafter (the config has none, or --no-spec was given)');
  const choice =
    chosen === undefined || flags.numDraftTokens === undefined
      ? chosen
      : { ...chosen, numDraftTokens: flags.numDraftTokens };
  // vLLM's names override the config's fields
  const sched = {
    ...cfg.scheduler,
    ...(flags.maxModelLen === undefined ? {} : { max_sequence_tokens: flags.maxModelLen }),
    ...(flags.maxNumSeqs === undefined ? {} : { max_running_requests: flags.maxNumSeqs }),
  };
  // config, else the model's generation_config.json, else OpenAI's: read before loading (a bad file is refused)
  const sampling = resolveSamplingDefaults(cfg.sampling, modelDir);
  // refused before loading: a context the model cannot hold, a bind no check can protect
  const contextLength = modelContextLength(modelDir);
  checkServerContextLength(sched.max_sequence_tokens, contextLength);
  const host = flags.host ?? cfg.server.host;
  const access = accessPolicy(flags, cfg, io);
  const warning = checkBind(host, access);
  if (warning !== undefined) io.stderr.write(`specd: warning: ${warning}\n`);
  const port = flags.port ?? cfg.server.port;
  await checkPortFree(host, port);
  // the largest forward: a prefill chunk, or a verify step of every running sequence (cli/device.ts)
  const deviceRows =
    device === 'cpu'
      ? undefined
      : deviceMaxTokens({
          prefillChunk: sched.prefill_chunk_tokens,
          maxSequences: sched.max_running_requests,
          draftTokens: draftTokensBound(choice !== undefined, choice?.numDraftTokens),
        });
  let t0 = performance.now();
  stage(io, `loading target ${modelDir} (tp ${tp}, pp ${pp}${device === 'cpu' ? '' : `, device ${device}`})`);
  const sanity = {
    checkpointSanity: flags.checkpointSanity ?? cfg.checkpoint_sanity,
    onWarning: (m: string) => {
      if (flags.logLevel !== 'silent') io.stderr.write(`specd: warning: ${m}\n`);
    },
  };
  const target = await loadParallelTarget(modelDir, cfg.plugins, {
    ...sanity,
    ...(deviceRows === undefined ? {} : { device, maxTokens: deviceRows }),
    tp,
    pp,
    ...(partition === undefined ? {} : { partition }),
    lastStageEmbedding: choice !== undefined,
    transport: par.transport,
    ...(par.stage_hosts === undefined ? {} : { stageHosts: par.stage_hosts, bindHost: host }),
  });
  stage(io, `target loaded in ${since(t0)} (plugin ${target.pluginName})`);
  let drafter: LoadedDrafter | undefined;
  try {
    if (choice !== undefined) {
      t0 = performance.now();
      stage(io, `loading drafter ${choice.dir ?? choice.method ?? ''}`);
      drafter = await loadDrafter(choice, cfg.plugins, target, sched.max_sequence_tokens, sched.max_running_requests, {
        // a prefill instance never drafts: only the context path (projection, draft KV) where the method has the mode
        contextOnly: role === 'prefill',
        // P keeps each context row's projected feature when D may ask for features instead of draft KV
        pdFeatures: role !== 'none' && cfg.pd.draft_context !== 'kv',
        ...sanity,
      });
      if (choice.method !== undefined && drafter.drafter.method !== choice.method) {
        throw new CliError(
          `drafter ${choice.dir ?? choice.method}: the config says method ${JSON.stringify(choice.method)}, ` +
            `the checkpoint is ${JSON.stringify(drafter.drafter.method)}`,
        );
      }
      stage(io, `drafter ${drafter.drafter.method} loaded in ${since(t0)}`);
      if (deviceRows !== undefined)
        checkDeviceRows(device, deviceRows, sched.max_running_requests, drafter.drafter, choice.numDraftTokens);
    }
    const logger =
      flags.logLevel === 'silent'
        ? undefined
        : serveLogger(flags.logLevel ?? 'info', flags.logFormat ?? (io.stderr.isTTY === true ? 'text' : 'json'));
    logger?.info(
      { sampling: sampling.defaults, sources: sampling.sources },
      `sampling defaults: ${describeSampling(sampling)}`,
    );
    const pd = role === 'none' ? undefined : pdOptions(role, cfg, flags, host, modelDir, choice, drafter, { tp, pp });
    const server = new SpecdServer({
      target,
      ...(drafter === undefined ? {} : { drafter: drafter.drafter }),
      modelName: flags.servedModelName ?? cfg.server.model_name ?? path.basename(modelDir),
      sampling: sampling.defaults,
      scheduler: sched,
      ...access,
      ...(contextLength === undefined ? {} : { modelContextLength: contextLength }),
      bodyLimitBytes: cfg.server.body_limit_bytes,
      ...(choice?.numDraftTokens === undefined ? {} : { numDraftTokens: choice.numDraftTokens }),
      ...(logger === undefined ? {} : { logger }),
      ...(pd === undefined ? {} : { pd }),
      ...(flags.disableLogStats === true
        ? { statsIntervalMs: 0 }
        : flags.statsIntervalMs === undefined
          ? {}
          : { statsIntervalMs: flags.statsIntervalMs }),
    });
    // the cost policy (a drafter, no fixed draft length, not a prefill instance) calibrates in listen()
    const calibrates = drafter !== undefined && choice?.numDraftTokens === undefined && role !== 'prefill';
    t0 = performance.now();
    if (calibrates) stage(io, 'calibrating the draft policy (measuring draft and verify step costs)');
    const calibrationBefore = server.engine.metrics.calibrationMs;
    const url = await server.listen(host, port);
    if (server.engine.metrics.calibrationMs > calibrationBefore) stage(io, `calibrated in ${since(t0)}`);
    // after the engine allocated the KV pool and calibration captured the first CUDA graphs
    const line = deviceLine(device, target.model);
    if (line !== undefined) logger?.info({ device }, line);
    stage(io, `listening on ${url}`);
    return {
      server,
      url,
      target,
      ...(drafter === undefined ? {} : { drafter }),
      parallelism: { tp, pp },
      async close() {
        await server.close();
        drafter?.drafter.dispose();
        target.model.dispose();
      },
    };
  } catch (err) {
    drafter?.drafter.dispose();
    target.model.dispose();
    throw err;
  }
}

/**
 * Who may use the server: the API key (--api-key, else `SPECD_API_KEY`, else server.api_key), the allowed hosts and
 * whether /metrics needs the key (flags over server.allowed_hosts / server.metrics_require_key).
 */
export function accessPolicy(
  flags: Pick<ServeFlags, 'apiKey' | 'allowedHosts' | 'metricsRequireKey'>,
  cfg: SpecdConfig,
  io: CliIo,
): AccessPolicy {
  const apiKey = apiKeyFrom(flags.apiKey, io.env ?? process.env, cfg.server.api_key);
  const allowedHosts = flags.allowedHosts ?? cfg.server.allowed_hosts;
  return {
    ...(apiKey === undefined ? {} : { apiKey }),
    ...(allowedHosts === undefined ? {} : { allowedHosts }),
    metricsNeedKey: flags.metricsRequireKey ?? cfg.server.metrics_require_key,
  };
}

/**
 * The server's logger on `destination` (default fd 2): `json` (pino's lines, for log collectors) or `text`
 * (pino-pretty: time, level, message and fields on one line; colours only on a TTY).
 */
export function serveLogger(
  level: string,
  format: 'text' | 'json',
  destination: number | NodeJS.WritableStream = 2,
): Logger {
  if (format === 'json')
    return pino({ level }, typeof destination === 'number' ? pino.destination(destination) : destination);
  const colorize = destination === 2 && process.stderr.isTTY === true;
  return pino(
    { level },
    pinoPretty({
      destination,
      colorize,
      singleLine: true,
      translateTime: 'SYS:HH:MM:ss.l',
      ignore: 'pid,hostname',
      sync: true,
    }),
  );
}

/**
 * Refuses a port another process holds before anything loads (loading takes seconds): binds `host:port`
 * exclusively and releases it at once. Port 0 (ephemeral) is not checked. The real listen can still fail if
 * another process takes the port in between; it reports the same way.
 * @throws {CliError} naming the address: `EADDRINUSE` (in use), `EACCES` (a privileged port), `EADDRNOTAVAIL`.
 */
export async function checkPortFree(host: string, port: number): Promise<void> {
  if (port === 0) return;
  await new Promise<void>((resolve, reject) => {
    const probe = net.createServer();
    probe.once('error', (err: NodeJS.ErrnoException) => {
      const why =
        err.code === 'EADDRINUSE'
          ? 'is in use by another process'
          : err.code === 'EACCES'
            ? 'needs privileges (ports below 1024)'
            : err.code === 'EADDRNOTAVAIL'
              ? 'is not an address of this machine'
              : `cannot be bound (${err.code ?? err.message})`;
      reject(new CliError(`--port / server.port: ${host}:${port} ${why}; pick another with --port (0 = any free)`));
    });
    probe.listen({ host, port, exclusive: true }, () => probe.close(() => resolve()));
  });
}

/** `--allowed-hosts a,b`: host names without ports (`*`: any). */
export const hostsArg = (v: string): string[] => {
  const names = v.split(',').map((x) => x.trim());
  if (names.some((x) => x === '' || /[/\s]/.test(x)))
    throw new InvalidArgumentError('expected host names separated by commas, e.g. llm.example.com,10.0.0.5');
  return names;
};

/** The PD role's settings: bootstrap, timeouts and this side's digest (pd/digest.ts). */
function pdOptions(
  role: 'prefill' | 'decode',
  cfg: SpecdConfig,
  flags: ServeFlags,
  host: string,
  modelDir: string,
  choice: DrafterChoice | undefined,
  drafter: LoadedDrafter | undefined,
  par: { tp: number; pp: number },
): SpecdServerOptions['pd'] {
  const d = drafter?.drafter;
  if (cfg.pd.draft_context !== 'kv' && d !== undefined) {
    const form = `pd.draft_context ${JSON.stringify(cfg.pd.draft_context)}`;
    if (par.tp > 1 || par.pp > 1)
      throw new CliError(`${form} needs tp = pp = 1 on both sides (got tp ${par.tp}, pp ${par.pp}): use "kv"`);
    if (!hasDraftContextFeatures(d))
      throw new CliError(
        `${form}: the ${d.method} drafter cannot send its context as features (it does not declare ` +
          'DraftContextFeatures, docs/PLUGINS.md): use "kv"',
      );
  }
  const draftKv = d !== undefined && hasDraftContextTransfer(d) && d.pdRegions().length > 0;
  const digest = pdDigest({
    target: modelDir,
    ...(d === undefined
      ? {}
      : {
          drafter: {
            method: d.method,
            ...(drafter?.dir === undefined ? {} : { path: drafter.dir }),
            ...(choice?.settings === undefined ? {} : { settings: choice.settings }),
          },
        }),
    pageSize: cfg.scheduler.page_size,
    transfer: cfg.pd.transfer,
    draftContext: cfg.pd.draft_context,
    ...(draftKv ? { draftPageSize: DRAFT_PAGE_SIZE, draftDtype: 'f32' } : {}),
    dtype: 'f32',
    tp: par.tp,
    pp: par.pp,
  });
  const options = {
    host: cfg.pd.bootstrap?.host ?? host,
    bootstrapTimeoutMs: cfg.pd.bootstrap_timeout_ms,
    transferTimeoutMs: cfg.pd.transfer_timeout_ms,
    transfer: cfg.pd.transfer,
    draftContext: cfg.pd.draft_context,
    overlap: cfg.pd.overlap,
    digest,
  };
  // test-only fault point: the prefill role's transfers stop after N descriptors (tests kill it there)
  const pause = process.env.SPECD_PD_TEST_PAUSE_AFTER_DESCRIPTORS;
  const testHooks =
    pause === undefined || !/^\d+$/.test(pause)
      ? undefined
      : {
          transfer: {
            pauseAfterDescriptors: Number(pause),
            onPause: (room: string) =>
              process.stderr.write(`specd: pd test hook: paused after ${pause} descriptors of room ${room}\n`),
          },
        };
  return role === 'prefill'
    ? {
        role,
        options: {
          ...options,
          bootstrapPort: flags.bootstrapPort ?? cfg.pd.bootstrap?.port ?? 0,
          ...(testHooks === undefined ? {} : { testHooks }),
        },
      }
    : { role, options };
}

const tpArg = (v: string): number => {
  if (!/^\d+$/.test(v.trim()) || Number(v) < 1) throw new InvalidArgumentError('expected an integer >= 1');
  return Number(v);
};

const minArg =
  (min: number) =>
  (v: string): number => {
    if (!/^\d+$/.test(v.trim()) || Number(v) < min) throw new InvalidArgumentError(`expected an integer >= ${min}`);
    return Number(v);
  };

const listArg = (v: string): number[] => {
  const parts = v.split(',').map((x) => x.trim());
  if (parts.length === 0 || parts.some((x) => !/^\d+$/.test(x) || Number(x) < 1))
    throw new InvalidArgumentError('expected layer counts per stage, e.g. 3,5 (each >= 1)');
  return parts.map(Number);
};

const portArg = (v: string): number => {
  const n = Number(v);
  if (!/^\d+$/.test(v.trim()) || n > 65535) throw new InvalidArgumentError('expected a port in [0, 65535]');
  return n;
};

const roleArg = (v: string): 'prefill' | 'decode' | 'none' => {
  if (v !== 'prefill' && v !== 'decode' && v !== 'none')
    throw new InvalidArgumentError('expected prefill, decode or none');
  return v;
};

/** Adds `serve` to the program; it runs until SIGINT / SIGTERM. */
export function registerServeCommand(program: Command, io: CliIo): void {
  program
    .command('serve')
    .description(
      'serve the OpenAI-compatible API (default: configs/default.json, SmolLM2-135M-Instruct with its fastest ' +
        'drafter, on 127.0.0.1:8000)',
    )
    .option('--config <file>', 'deployment config (JSON; `specd config schema`)')
    .option('--model <dir>', 'target checkpoint directory (overrides the config)')
    .option('--drafter <dir>', 'drafter checkpoint directory (overrides the config)')
    .option('--no-spec', 'no speculative decoding')
    .option('--host <host>', 'address to bind (default 127.0.0.1)')
    .option('--port <port>', 'port (default 8000; 0 = ephemeral)', portArg)
    .option(
      '--tp <n>',
      'tensor parallelism: ranks (default: config parallelism.tp, 1); rank 0 in the server thread, ' +
        'the others as worker threads',
      tpArg,
    )
    .option(
      '--pp <n>',
      "pipeline parallelism: stages (default: config parallelism.pp, 1; a --pp other than the config's also drops " +
        "the config's partition); stages 0 … n−2 run as processes, the last one in the server process",
      tpArg,
    )
    .option(
      '--pp-partition <list>',
      "layers per pipeline stage, e.g. 3,5 (default: vLLM's even split, the remainder on the stages before the last)",
      listArg,
    )
    .option(
      '--role <role>',
      'prefill/decode disaggregation: prefill | decode | none (default: config pd.role, none); run `specd router` ' +
        'in front of the prefill and decode instances',
      roleArg,
    )
    .option(
      '--bootstrap-port <port>',
      "the prefill role's bootstrap port for decode instances (default: config pd.bootstrap.port, 0 = ephemeral)",
      portArg,
    )
    .option(
      '--api-key <key>',
      'require "Authorization: Bearer <key>" on everything but /health and /metrics (default: SPECD_API_KEY, else ' +
        'config server.api_key; prefer the variable: arguments are visible in ps)',
    )
    .option(
      '--allowed-hosts <names>',
      'Host names (comma-separated, no port; "*" = any) accepted besides the bound address, localhost, 127.0.0.1 ' +
        'and [::1]: checked without an API key (DNS rebinding) and whenever given; a 0.0.0.0 bind without a key ' +
        'needs it',
      hostsArg,
    )
    .option('--metrics-require-key', '/metrics needs the API key too (/health stays open)')
    .option('--log-level <level>', 'pino log level: fatal|error|warn|info|debug|silent (default info)')
    .addOption(
      new Option(
        '--log-format <format>',
        'log lines as text (pino-pretty) or json (default: text on a TTY, else json)',
      ).choices(['text', 'json']),
    )
    .option(
      '--num-draft-tokens <n>',
      "vLLM's name: a fixed number of drafts per verify step (default: config drafter.num_draft_tokens, else the " +
        'cost policy chooses every step)',
      tpArg,
    )
    .option(
      '--served-model-name <name>',
      "vLLM's name: the model id of /v1/models and responses (default: config server.model_name, else the folder name)",
    )
    .option(
      '--max-model-len <n>',
      "vLLM's name: the context length, prompt + max_tokens per request (default: config " +
        "scheduler.max_sequence_tokens, 2048; at most the model's max_position_embeddings)",
      minArg(2),
    )
    .option(
      '--max-num-seqs <n>',
      "vLLM's name: sequences decoded together (default: config scheduler.max_running_requests, 8)",
      tpArg,
    )
    .option('--disable-log-stats', 'no periodic stats line (default: one every 10 s on the log, as vLLM)')
    .addOption(deviceOption())
    .addOption(checkpointSanityOption())
    .action(async (flags: ServeFlags) => {
      // the signal handlers are in place before anything loads: a SIGINT / SIGTERM during start-up stops the
      // server as soon as it is up, instead of killing the process half-way
      let signalled: NodeJS.Signals | undefined;
      let onSignal = (signal: NodeJS.Signals): void => {
        signalled ??= signal;
      };
      const handler = (signal: NodeJS.Signals): void => onSignal(signal);
      process.on('SIGINT', handler);
      process.on('SIGTERM', handler);
      let s: StartedServer;
      try {
        s = await startServe(flags, io);
      } catch (err) {
        process.off('SIGINT', handler);
        process.off('SIGTERM', handler);
        throw err;
      }
      io.stderr.write(`${servingLine(s)}\n`);
      await new Promise<void>((resolve) => {
        onSignal = (signal: NodeJS.Signals): void => {
          process.off('SIGINT', handler);
          process.off('SIGTERM', handler);
          io.stderr.write(`${shutdownLine(s, signal)}\n`);
          const t0 = performance.now();
          void s
            .close()
            .then(
              () => io.stderr.write(`specd: stopped in ${since(t0)}\n`),
              (err: Error) => io.stderr.write(`specd: stopped with an error: ${err.message}\n`),
            )
            .then(() => resolve());
        };
        if (signalled !== undefined) onSignal(signalled);
      });
    });
}

/**
 * The start-up line: `specd: serving MODEL (tp T, pp P) with drafter METHOD (DIR; k N | cost policy) [as …] on URL`,
 * or `… without a drafter …`.
 */
export function servingLine(s: StartedServer): string {
  const d = s.drafter;
  const k = s.server.options.numDraftTokens;
  const pd = s.server.pd;
  const drafts =
    pd !== undefined && 'bootstrap' in pd
      ? 'context only'
      : k === undefined
        ? `up to ${d?.drafter.maxDraftTokens} drafts, cost policy`
        : `${k} drafts per step`;
  const using =
    d === undefined
      ? ' without a drafter'
      : ` with drafter ${d.drafter.method} (${d.dir ?? 'no checkpoint'}; ${drafts})`;
  const as = pd === undefined ? '' : 'bootstrap' in pd ? ` as prefill (bootstrap ${pd.bootstrap})` : ' as decode';
  const { tp, pp } = s.parallelism;
  return `specd: serving ${s.server.options.modelName} (tp ${tp}, pp ${pp})${using}${as} on ${s.url}`;
}

/** The shutdown line: `specd: SIGINT: shutting down (R running and W waiting requests aborted)`. */
export function shutdownLine(s: StartedServer, signal: string): string {
  const loop = s.server.loop;
  return `specd: ${signal}: shutting down (${loop.running} running and ${loop.waiting} waiting requests aborted)`;
}
