/**
 * `specd router --prefill URL… --decode URL… [--host H] [--port N] [--policy round_robin|random]
 * [--health-interval-ms N] [--model DIR | --config FILE] [--log-level L]`: the prefill/decode router
 * (packages/core/src/pd/router.ts). Flags override the config's `pd.router`; the tokenizer (no weights) comes
 * from `--model`, else the config's `model`, else the shipped target, as `specd serve` finds it; with neither
 * `--config` nor `--model` the config is `specd serve`'s default, configs/default.json. Sampling defaults (request
 * checking only) resolve as the servers' do (config/generation-config.ts). Access (API key from
 * --api-key, `SPECD_API_KEY` or the config; `--allowed-hosts`; `--metrics-require-key`) as `specd serve`; prompts
 * longer than the config's `scheduler.max_sequence_tokens` can hold are refused before tokenizing.
 */

import * as fs from 'node:fs';
import * as path from 'node:path';

import { InvalidArgumentError, type Command } from 'commander';
import { pino } from 'pino';

import { resolveSamplingDefaults } from '../config/generation-config.js';
import { loadConfig } from '../config/load.js';
import { createPdPolicy, PD_POLICIES } from '../pd/policy.js';
import { PdRouter } from '../pd/router.js';
import { loadPromptBuilder } from '../serve/prompt.js';
import { checkBind } from '../serve/http-guard.js';
import { checkModelPath, CliError } from './config-file.js';
import type { CliIo } from './main.js';
import { defaultModelDir, defaultServeConfig } from './paths.js';
import { accessPolicy, hostsArg } from './serve.js';

/** Flags of `specd router`. */
export interface RouterFlags {
  config?: string;
  model?: string;
  prefill?: string[];
  decode?: string[];
  host?: string;
  port?: number;
  policy?: string;
  healthIntervalMs?: number;
  logLevel?: string;
  apiKey?: string;
  allowedHosts?: string[];
  metricsRequireKey?: boolean;
}

/** A started router (close with {@link StartedRouter.close}). */
export interface StartedRouter {
  readonly router: PdRouter;
  readonly url: string;
  close(): Promise<void>;
}

/**
 * Loads the config (flags override its `pd.router`) and the model's tokenizer, checks every upstream and
 * starts listening.
 * @throws {ConfigError} / {CliError} (no prefill or decode URL, a bad model path) / {PdError} (an upstream
 *   answering the other role) / the tokenizer's errors.
 */
export async function startRouter(flags: RouterFlags, io: CliIo): Promise<StartedRouter> {
  // neither --config nor --model: the default config of `specd serve` (the servers it routes to, by default)
  const fallback = defaultServeConfig(io.cwd);
  const configFile =
    flags.config !== undefined
      ? path.resolve(io.cwd, flags.config)
      : flags.model === undefined && fs.existsSync(fallback)
        ? fallback
        : undefined;
  const { config: cfg } = await loadConfig(configFile, io.cwd);
  const rc = cfg.pd.router;
  const prefill = flags.prefill ?? rc?.prefill ?? [];
  const decode = flags.decode ?? rc?.decode ?? [];
  for (const [name, urls] of [
    ['prefill', prefill],
    ['decode', decode],
  ] as const)
    if (urls.length === 0)
      throw new CliError(`no ${name} server: give --${name} URL (or the config's pd.router.${name})`);
  const modelDir =
    flags.model !== undefined ? path.resolve(io.cwd, flags.model) : (cfg.model ?? defaultModelDir(io.cwd));
  checkModelPath(modelDir);
  const host = flags.host ?? rc?.host ?? '127.0.0.1';
  const access = accessPolicy(flags, cfg, io);
  const warning = checkBind(host, access);
  if (warning !== undefined) io.stderr.write(`specd: warning: ${warning}\n`);
  const logger =
    flags.logLevel === 'silent' ? undefined : pino({ level: flags.logLevel ?? 'info' }, pino.destination(2));
  const router = new PdRouter({
    prefill,
    decode,
    prompts: loadPromptBuilder(modelDir, { maxContextTokens: cfg.scheduler.max_sequence_tokens }),
    sampling: resolveSamplingDefaults(cfg.sampling, modelDir).defaults,
    policy: createPdPolicy(flags.policy ?? rc?.policy ?? 'round_robin'),
    healthIntervalMs: flags.healthIntervalMs ?? rc?.health_interval_ms ?? 5000,
    bodyLimitBytes: cfg.server.body_limit_bytes,
    ...(logger === undefined ? {} : { logger }),
    ...access,
  });
  const url = await router.listen(host, flags.port ?? rc?.port ?? 8000);
  return { router, url, close: () => router.close() };
}

const urlArg = (v: string, previous: string[] | undefined): string[] => {
  let u: URL;
  try {
    u = new URL(v);
  } catch {
    throw new InvalidArgumentError(`expected a base URL such as http://127.0.0.1:30001, got ${JSON.stringify(v)}`);
  }
  if ((u.protocol !== 'http:' && u.protocol !== 'https:') || u.pathname.replace(/\/+$/, '') !== '')
    throw new InvalidArgumentError(`expected a base URL such as http://127.0.0.1:30001, got ${JSON.stringify(v)}`);
  return [...(previous ?? []), v];
};

const portArg = (v: string): number => {
  const n = Number(v);
  if (!/^\d+$/.test(v.trim()) || n > 65535) throw new InvalidArgumentError('expected a port in [0, 65535]');
  return n;
};

const msArg = (v: string): number => {
  if (!/^\d+$/.test(v.trim())) throw new InvalidArgumentError('expected an integer >= 0 (milliseconds)');
  return Number(v);
};

const policyArg = (v: string): string => {
  if (!Object.hasOwn(PD_POLICIES, v))
    throw new InvalidArgumentError(`expected one of ${Object.keys(PD_POLICIES).join(', ')}`);
  return v;
};

/** Adds `router` to the program; it runs until SIGINT / SIGTERM. */
export function registerRouterCommand(program: Command, io: CliIo): void {
  program
    .command('router')
    .description('route OpenAI requests to prefill and decode servers (prefill/decode disaggregation)')
    .option('--prefill <url...>', 'a prefill server (`specd serve --role prefill`); repeat for several', urlArg)
    .option('--decode <url...>', 'a decode server (`specd serve --role decode`); repeat for several', urlArg)
    .option('--config <file>', 'deployment config (JSON; `specd config schema`): pd.router, model, sampling')
    .option('--model <dir>', 'the checkpoint P and D serve, for its tokenizer (default: the shipped target)')
    .option('--host <host>', 'address to bind (default 127.0.0.1)')
    .option('--port <port>', 'port (default 8000; 0 = ephemeral)', portArg)
    .option('--policy <name>', 'how to pick P and D: round_robin (default) or random', policyArg)
    .option('--health-interval-ms <ms>', 'between health checks of every upstream (default 5000; 0 = off)', msArg)
    .option(
      '--api-key <key>',
      "the deployment's API key (default: SPECD_API_KEY, else config server.api_key): clients must send it, and the " +
        'router sends it to P and D (start them with the same key)',
    )
    .option(
      '--allowed-hosts <names>',
      'Host names (comma-separated; "*" = any) accepted besides the bound address and loopback, as in specd serve',
      hostsArg,
    )
    .option('--metrics-require-key', '/metrics needs the API key too (/health stays open)')
    .option('--log-level <level>', 'pino log level: fatal|error|warn|info|debug|silent (default info)')
    .action(async (flags: RouterFlags) => {
      const s = await startRouter(flags, io);
      io.stderr.write(`specd: routing on ${s.url} (policy ${s.router.policy.name})\n`);
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
