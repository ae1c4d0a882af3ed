/**
 * `specd serve [--config FILE] [--model DIR] [--drafter DIR | --no-spec] [--host H] [--port P] [--api-key K]
 * [--tp T] [--pp P [--pp-partition 3,5]]`: the OpenAI-compatible server (packages/core/src/serve).
 * Flags override the config; with no arguments it serves the shipped target with the shipped DFlash
 * on 127.0.0.1:8000. Under pipeline parallelism the stage processes are killed when the server
 * closes (and on SIGINT / SIGTERM / exit); a dead stage makes /health answer 503 and every request
 * fail with 500 naming the stage (the server stays up).
 */

import * as path from 'node:path';

import { InvalidArgumentError, type Command } from 'commander';
import { pino } from 'pino';

import { loadConfig } from '../config/load.js';
import { SpecdServer } from '../serve/server.js';
import { checkModelPath, chooseDrafter, CliError } from './config-file.js';
import { loadDrafter, type LoadedDrafter } from '../runtime/drafter.js';
import { checkParallelism, loadParallelTarget } from '../runtime/parallel.js';
import type { LoadedTarget } from '../runtime/target.js';
import type { CliIo } from './main.js';
import { defaultModelDir } from './paths.js';

/** Flags of `specd serve`. */
export interface ServeFlags {
  config?: string;
  model?: string;
  drafter?: string;
  spec?: boolean;
  host?: string;
  port?: number;
  apiKey?: string;
  logLevel?: string;
  /** Tensor-parallel ranks (overrides config parallelism.tp). */
  tp?: number;
  /** Pipeline stages (overrides config parallelism.pp). */
  pp?: number;
  /** Layers per pipeline stage (overrides config parallelism.partition). */
  ppPartition?: number[];
}

/** A started server and what it loaded (close with {@link StartedServer.close}). */
export interface StartedServer {
  readonly server: SpecdServer;
  readonly url: string;
  readonly target: LoadedTarget;
  readonly drafter?: LoadedDrafter;
  close(): Promise<void>;
}

/**
 * Loads the config (flags override it), the target and the drafter, calibrates the cost-based draft
 * policy when it is in use ({@link SpecdServer.listen}: before listening, so no request pays it), and
 * starts listening.
 * @throws {ConfigError} / {CliError} / {ParallelismError} / the plugins' errors.
 */
export async function startServe(flags: ServeFlags, io: CliIo): Promise<StartedServer> {
  const { config: cfg } = await loadConfig(
    flags.config === undefined ? undefined : path.resolve(io.cwd, flags.config),
    io.cwd,
  );
  const par = cfg.parallelism;
  const tp = flags.tp ?? par.tp;
  const pp = flags.pp ?? par.pp;
  const partition = flags.ppPartition ?? (flags.pp === undefined || flags.pp === par.pp ? par.partition : undefined);
  checkParallelism(tp, pp, partition);
  if (cfg.pd.role !== 'none')
    throw new CliError(
      `pd.role: ${JSON.stringify(cfg.pd.role)}: prefill/decode disaggregation is not wired yet (use "none")`,
    );
  if (flags.spec === false && flags.drafter !== undefined)
    throw new CliError('--drafter and --no-spec cannot be used together');
  const modelDir =
    flags.model !== undefined ? path.resolve(io.cwd, flags.model) : (cfg.model ?? defaultModelDir(io.cwd));
  checkModelPath(modelDir);
  const choice = chooseDrafter(
    cfg,
    { model: flags.model, drafter: flags.drafter, noSpec: flags.spec === false },
    io.cwd,
  );
  const sched = cfg.scheduler;
  const target = await loadParallelTarget(modelDir, cfg.plugins, {
    tp,
    pp,
    ...(partition === undefined ? {} : { partition }),
    lastStageEmbedding: choice !== undefined,
    transport: par.transport,
  });
  let drafter: LoadedDrafter | undefined;
  try {
    if (choice !== undefined) {
      drafter = await loadDrafter(choice, cfg.plugins, target, sched.max_sequence_tokens, sched.max_running_requests);
      if (choice.method !== undefined && drafter.drafter.method !== choice.method) {
        throw new CliError(
          `drafter ${choice.dir ?? choice.method}: the config says method ${JSON.stringify(choice.method)}, ` +
            `the checkpoint is ${JSON.stringify(drafter.drafter.method)}`,
        );
      }
    }
    const logger =
      flags.logLevel === 'silent' ? undefined : pino({ level: flags.logLevel ?? 'info' }, pino.destination(2));
    const server = new SpecdServer({
      target,
      ...(drafter === undefined ? {} : { drafter: drafter.drafter }),
      modelName: cfg.server.model_name ?? path.basename(modelDir),
      sampling: cfg.sampling,
      scheduler: sched,
      ...((flags.apiKey ?? cfg.server.api_key) === undefined ? {} : { apiKey: (flags.apiKey ?? cfg.server.api_key)! }),
      bodyLimitBytes: cfg.server.body_limit_bytes,
      ...(choice?.numDraftTokens === undefined ? {} : { numDraftTokens: choice.numDraftTokens }),
      ...(logger === undefined ? {} : { logger }),
    });
    const url = await server.listen(flags.host ?? cfg.server.host, flags.port ?? cfg.server.port);
    return {
      server,
      url,
      target,
      ...(drafter === undefined ? {} : { drafter }),
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

const tpArg = (v: string): number => {
  if (!/^\d+$/.test(v.trim()) || Number(v) < 1) throw new InvalidArgumentError('expected an integer >= 1');
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

/** Adds `serve` to the program; it runs until SIGINT / SIGTERM. */
export function registerServeCommand(program: Command, io: CliIo): void {
  program
    .command('serve')
    .description('serve the OpenAI-compatible API (default: the shipped target + DFlash on 127.0.0.1:8000)')
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
    .option('--api-key <key>', 'require "Authorization: Bearer <key>" on /v1/*')
    .option('--log-level <level>', 'pino log level: fatal|error|warn|info|debug|silent (default info)')
    .action(async (flags: ServeFlags) => {
      const s = await startServe(flags, io);
      const using =
        s.drafter === undefined ? '' : ` with ${s.drafter.drafter.method} (${s.drafter.dir ?? 'no checkpoint'})`;
      io.stderr.write(`specd: serving ${s.server.options.modelName}${using} on ${s.url}\n`);
      await new Promise<void>((resolve) => {
        const stop = (): void => {
          process.off('SIGINT', stop);
          process.off('SIGTERM', stop);
          void s.close().then(resolve, resolve);
        };
        process.on('SIGINT', stop);
        process.on('SIGTERM', stop);
      });
    });
}
