/**
 * The `specd` command line (commander). Commands: `generate` (the target, with a drafter by
 * default: the embedded default is models/kimi-k3-tiny + models/kimi-k3-tiny-dflash; `--no-spec`
 * turns drafting off; `--drafter DIR` picks a drafter checkpoint for any target).
 * Errors are one line on stderr (`specd: error: …`) and a non-zero exit code: 2 for usage errors
 * (unknown option, malformed value), 1 for everything else (missing model, bad config, …).
 *
 *   specd generate --prompt "The history of the" --max-tokens 32 [--temperature 0.8 --top-p 0.9 --seed 1] [--json]
 *   specd generate --drafter models/kimi-k3-tiny-dflash [--num-draft-tokens 7] --prompt … | --no-spec
 *   specd generate --model models/smollm2-135m-instruct --device cuda --prompt …   (one NVIDIA GPU; cli/device.ts)
 *   specd --version
 *   specd pd plan configs/pd/kimi-k3-draft-tp4pp8-to-tp32.json [--json] [--prompt-tokens N]   (cli/pd.ts)
 */

import * as fs from 'node:fs';
import { createRequire } from 'node:module';
import * as path from 'node:path';

import cliProgress from 'cli-progress';
import { Command, CommanderError, InvalidArgumentError, Option } from 'commander';

import { resolveSamplingDefaults } from '../config/generation-config.js';
import { loadConfig } from '../config/load.js';
import { CHECKPOINT_SANITY_MODES, type CheckpointSanityMode } from '../io/checkpoint-sanity.js';
import { MAX_TEMPERATURE, normalizeSampling, SAMPLING_EPS } from '../engine/sampling-params.js';
import { checkModelPath, chooseDrafter, CliError } from './config-file.js';
import { checkDeviceRows, deviceLine, deviceMaxTokens, deviceOption, draftTokensBound } from './device.js';
import { registerConfigCommands } from './config-commands.js';
import { registerPdCommands } from './pd.js';
import { registerRouterCommand } from './router.js';
import { registerServeCommand } from './serve.js';
import { loadDrafter } from '../runtime/drafter.js';
import type { Device } from '../plugin/model-plugin.js';
import { loadParallelTarget } from '../runtime/parallel.js';
import type { LoadedTarget } from '../runtime/target.js';
import {
  generateSpeculative,
  generateTokens,
  type GenerateResult,
  PREFILL_CHUNK_TOKENS,
  type SpecGenerateResult,
} from './generate.js';
import { defaultModelDir } from './paths.js';

/** The version of `@specd/core` (its package.json, next to src/ and dist/ alike): what `specd --version` prints. */
export const SPECD_VERSION: string = (createRequire(import.meta.url)('../../package.json') as { version: string })
  .version;

/** `--checkpoint-sanity refuse|warn` (generate and serve): what a non-finite weight does at load. */
export function checkpointSanityOption(): Option {
  return new Option(
    '--checkpoint-sanity <mode>',
    'a non-finite weight in a checkpoint: refuse it, or warn and load anyway (default: config checkpoint_sanity, ' +
      'refuse)',
  ).choices(CHECKPOINT_SANITY_MODES);
}

/** Where the CLI writes (injectable for tests). */
export interface CliIo {
  readonly stdout: { write(s: string): unknown; isTTY?: boolean };
  readonly stderr: { write(s: string): unknown; isTTY?: boolean };
  readonly cwd: string;
  /** Environment variables read (`SPECD_API_KEY`); default `process.env`. */
  readonly env?: Readonly<Record<string, string | undefined>>;
}

const intArg =
  (min: number) =>
  (v: string): number => {
    const n = Number(v);
    if (!/^\s*-?\d+\s*$/.test(v) || !Number.isSafeInteger(n) || n < min)
      throw new InvalidArgumentError(`expected an integer >= ${min}`);
    return n;
  };
const numArg =
  (check: (n: number) => boolean, expected: string) =>
  (v: string): number => {
    const n = Number(v);
    if (v.trim() === '' || !Number.isFinite(n) || !check(n)) throw new InvalidArgumentError(`expected ${expected}`);
    return n;
  };

interface GenerateFlags {
  config?: string;
  model?: string;
  drafter?: string;
  spec?: boolean;
  numDraftTokens?: number;
  prompt?: string;
  promptFile?: string;
  maxTokens?: number;
  temperature?: number;
  topP?: number;
  topK?: number;
  seed?: number;
  ignoreEos?: boolean;
  json?: boolean;
  pp?: number;
  ppPartition?: number[];
  tp?: number;
  checkpointSanity?: CheckpointSanityMode;
  device?: Device;
}

const listArg = (v: string): number[] => {
  const parts = v.split(',').map((x) => x.trim());
  if (parts.length === 0 || parts.some((x) => !/^\d+$/.test(x) || Number(x) < 1))
    throw new InvalidArgumentError('expected layer counts per stage, e.g. 3,5 (each >= 1)');
  return parts.map(Number);
};

async function runGenerate(flags: GenerateFlags, io: CliIo): Promise<void> {
  const { config: cfg } = await loadConfig(
    flags.config === undefined ? undefined : path.resolve(io.cwd, flags.config),
    io.cwd,
  );
  if ((flags.prompt === undefined) === (flags.promptFile === undefined))
    throw new CliError('give exactly one of --prompt TEXT or --prompt-file FILE');
  let prompt: string;
  if (flags.promptFile !== undefined) {
    try {
      prompt = fs.readFileSync(path.resolve(io.cwd, flags.promptFile), 'utf8');
    } catch (cause) {
      throw new CliError(`--prompt-file: cannot read ${flags.promptFile}: ${(cause as Error).message}`);
    }
  } else {
    prompt = flags.prompt!;
  }
  const modelDir =
    flags.model !== undefined ? path.resolve(io.cwd, flags.model) : (cfg.model ?? defaultModelDir(io.cwd));
  checkModelPath(modelDir);
  if (flags.spec === false && flags.drafter !== undefined)
    throw new CliError('--drafter and --no-spec cannot be used together');
  const choice = chooseDrafter(
    cfg,
    { model: flags.model, drafter: flags.drafter, noSpec: flags.spec === false },
    io.cwd,
  );
  const drafterDir = choice?.dir;
  // config, else the model's generation_config.json, else OpenAI's (config/generation-config.ts)
  const s = resolveSamplingDefaults(cfg.sampling, modelDir).defaults;
  const maxTokens = flags.maxTokens ?? s.max_tokens ?? 64;
  const temperature = flags.temperature ?? s.temperature;
  const topP = flags.topP ?? s.top_p;
  const topK = flags.topK ?? s.top_k;
  const seed = flags.seed ?? s.seed ?? (Math.random() * 2 ** 32) >>> 0;
  const numDraftTokens = flags.numDraftTokens ?? choice?.numDraftTokens;

  const showBar = io.stdout.isTTY === true && flags.json !== true;
  const bar = showBar
    ? new cliProgress.SingleBar(
        { format: 'loading {bar} {value}/{total} tensors', clearOnComplete: true, hideCursor: true },
        cliProgress.Presets.shades_classic,
      )
    : undefined;
  let started = false;
  const onProgress = (p: { done: number; total: number }) => {
    if (bar === undefined) return;
    if (!started) {
      bar.start(p.total, 0);
      started = true;
    }
    bar.update(p.done);
  };
  const par = cfg.parallelism;
  const tp = flags.tp ?? par.tp;
  const pp = flags.pp ?? par.pp;
  const partition = flags.ppPartition ?? (flags.pp === undefined || flags.pp === par.pp ? par.partition : undefined);
  const sanity = {
    checkpointSanity: flags.checkpointSanity ?? cfg.checkpoint_sanity,
    onWarning: (m: string) => io.stderr.write(`specd: warning: ${m}\n`),
  };
  const device = flags.device ?? cfg.device;
  // one sequence: the largest forward is a prefill chunk, or a verify block (cli/device.ts)
  const deviceRows =
    device === 'cpu'
      ? undefined
      : deviceMaxTokens({
          prefillChunk: PREFILL_CHUNK_TOKENS,
          maxSequences: 1,
          draftTokens: draftTokensBound(choice !== undefined, numDraftTokens),
        });
  const target: LoadedTarget = await loadParallelTarget(modelDir, cfg.plugins, {
    ...sanity,
    ...(deviceRows === undefined ? {} : { device, maxTokens: deviceRows }),
    tp,
    pp,
    ...(partition === undefined ? {} : { partition }),
    lastStageEmbedding: choice !== undefined,
    onProgress,
    transport: par.transport,
  });
  if (started) bar!.stop();
  try {
    await generateWith(target);
  } finally {
    target.model.dispose();
  }
  async function generateWith(target: LoadedTarget): Promise<void> {
    const promptIds = target.tokenizer.encode(prompt, { addSpecialTokens: false });
    if (promptIds.length === 0) throw new CliError('the prompt encodes to no tokens');
    const loaded =
      choice === undefined
        ? undefined
        : await loadDrafter(choice, cfg.plugins, target, promptIds.length + maxTokens + 64, 1, sanity);
    if (loaded !== undefined && choice?.method !== undefined && loaded.drafter.method !== choice.method) {
      throw new CliError(
        `drafter ${drafterDir ?? choice.method}: the config says method ${JSON.stringify(choice.method)}, ` +
          `the checkpoint is ${JSON.stringify(loaded.drafter.method)}`,
      );
    }
    if (loaded !== undefined && deviceRows !== undefined)
      checkDeviceRows(device, deviceRows, 1, loaded.drafter, numDraftTokens);
    const detok = target.tokenizer.createDetokenizer({ skipSpecialTokens: true, promptIds });
    const stream = flags.json !== true;
    const sampling = normalizeSampling({ temperature, topK, topP }); // below 1e-5: greedy, as the server
    // a greedy run draws no random number: its seed means nothing, so it is not reported
    const greedy = sampling.temperature === 0;
    const genOptions = {
      promptIds,
      maxTokens,
      sampling,
      seed,
      seeded: flags.seed !== undefined || s.seed !== undefined,
      ignoreEos: flags.ignoreEos === true,
      onToken: stream ? (id: number) => io.stdout.write(detok.push(id)) : undefined,
    };
    const result: GenerateResult =
      loaded === undefined
        ? generateTokens(target, genOptions)
        : generateSpeculative(target, loaded.drafter, { ...genOptions, numDraftTokens });
    const m = (result as Partial<SpecGenerateResult>).metrics;
    // the device's line once the run has sized its KV pool and captured its CUDA graphs
    const line = deviceLine(device, target.model);
    if (line !== undefined) io.stderr.write(`specd: ${line}\n`);
    const text = target.tokenizer.decode(result.tokenIds, { skipSpecialTokens: true });
    const n = result.tokenIds.length;
    const tps = result.seconds > 0 ? n / result.seconds : 0;
    if (flags.json === true) {
      io.stdout.write(
        `${JSON.stringify({
          text,
          token_ids: result.tokenIds,
          num_prompt_tokens: promptIds.length,
          num_output_tokens: n,
          seconds: result.seconds,
          output_tokens_per_s: tps,
          ...(greedy ? {} : { seed }),
          stopped_at_eos: result.stoppedAtEos,
          model: modelDir,
          plugin: target.pluginName,
          ...(m === undefined || loaded === undefined
            ? {}
            : {
                drafter: loaded.dir,
                method: loaded.drafter.method,
                drafted: m.drafted,
                accepted: m.accepted,
                verify_steps: m.verifySteps,
                acceptance_length: m.tauPerStep,
                per_position_acceptance: m.perPositionAcceptance,
                // the /metrics counters' names and denominators (docs/METRICS.md): per draft step, as vLLM
                num_drafts: m.draftSteps,
                num_drafted: m.drafted,
                num_accepted: m.accepted,
                acceptance_rate: m.acceptanceRate,
                acceptance_length_per_draft: m.tauPerDraft,
                per_position_acceptance_rate: m.perDraftAcceptance,
              }),
        })}\n`,
      );
    } else {
      io.stdout.write(`${detok.flush()}\n`);
      const spec =
        m === undefined || loaded === undefined
          ? ''
          : `; ${loaded.drafter.method} τ ${m.tauPerStep.toFixed(2)} over ${m.verifySteps} verify steps`;
      io.stderr.write(
        `[${n} tokens in ${result.seconds.toFixed(3)} s, ${tps.toFixed(1)} tok/s; ` +
          `prompt ${promptIds.length} tokens${greedy ? '' : `; seed ${seed}`}${spec}]\n`,
      );
    }
    loaded?.drafter.dispose();
  }
}

/** Builds the commander program. */
export function buildProgram(io: CliIo): Command {
  const program = new Command('specd')
    .description('speculative decoding with pluggable drafters')
    .version(SPECD_VERSION, '-V, --version', 'print the version of specd (@specd/core) and exit')
    .exitOverride()
    .configureOutput({
      writeOut: (s) => io.stdout.write(s),
      writeErr: (s) => io.stderr.write(s),
      outputError: (s, write) => write(`specd: ${s.replace(/^error: /, 'error: ').trimEnd()}\n`),
    });
  program
    .command('generate')
    .description('generate text with the target model, speculatively with a drafter (default: the shipped DFlash)')
    .option(
      '--config <file>',
      'deployment config (JSON; `specd config schema`): model, drafter, plugins, sampling defaults; flags override it',
    )
    .option('--model <dir>', 'HF checkpoint directory (default: models/kimi-k3-tiny of this repository)')
    .option(
      '--drafter <dir>',
      'drafter checkpoint directory (default with the default model: models/kimi-k3-tiny-dflash)',
    )
    .option('--no-spec', 'no speculative decoding: plain decoding with the target alone')
    .option(
      '--num-draft-tokens <n>',
      'a fixed number of drafts per verify step (default: chosen every step from measured draft/verify costs and ' +
        'acceptance, down to none when drafting does not pay on this machine)',
      intArg(1),
    )
    .addOption(new Option('--prompt <text>', 'prompt text').conflicts('promptFile'))
    .option('--prompt-file <file>', 'read the prompt from a file')
    .option('--max-tokens <n>', 'new tokens at most (default 64)', intArg(1))
    .option(
      '--temperature <t>',
      `0 = greedy, as is anything below ${SAMPLING_EPS} (default: config sampling, else the model's ` +
        'generation_config.json (do_sample false: 0), else 1)',
      numArg((n) => n >= 0 && n <= MAX_TEMPERATURE, `a number in [0, ${MAX_TEMPERATURE}]`),
    )
    .option(
      '--top-p <p>',
      'nucleus sampling mass in (0, 1] (default: config, else generation_config.json, else 1)',
      numArg((n) => n > 0 && n <= 1, 'a number in (0, 1]'),
    )
    .option(
      '--top-k <k>',
      'keep the k most likely tokens, 0 = off (default: config, else generation_config.json, else 0)',
      intArg(0),
    )
    .option('--seed <s>', 'PRNG seed for sampling (default: random, reported unless the run is greedy)', intArg(0))
    .option('--ignore-eos', 'do not stop at EOS')
    .option(
      '--pp <n>',
      "pipeline parallelism: stages (default: config parallelism.pp, 1; a --pp other than the config's also drops " +
        "the config's partition); stages 0 … n−2 run as processes, the last one here",
      intArg(1),
    )
    .option(
      '--tp <n>',
      'tensor parallelism: ranks (default: config parallelism.tp, 1); rank 0 here, the others as worker threads; ' +
        "must divide the model's head and expert counts",
      intArg(1),
    )
    .option(
      '--pp-partition <list>',
      "layers per pipeline stage, e.g. 3,5 (default: vLLM's even split, the remainder on the stages before the last)",
      listArg,
    )
    .addOption(deviceOption())
    .addOption(checkpointSanityOption())
    .option(
      '--json',
      'print one JSON object {text, token_ids, num_prompt_tokens, num_output_tokens, seconds, output_tokens_per_s, ' +
        '…; with a drafter also drafted, accepted, verify_steps, acceptance_length, per_position_acceptance and, ' +
        "with /metrics' names and denominators (docs/METRICS.md), num_drafts, num_drafted, num_accepted, " +
        'acceptance_rate, acceptance_length_per_draft, per_position_acceptance_rate}; seed only when sampling',
    )
    .action(async (flags: GenerateFlags) => runGenerate(flags, io));
  registerConfigCommands(program, io);
  registerServeCommand(program, io);
  registerPdCommands(program, io);
  registerRouterCommand(program, io);
  for (const c of program.commands) c.exitOverride().configureOutput(program.configureOutput());
  return program;
}

/**
 * Runs the CLI on `argv` (user arguments, without `node` and the script).
 * @returns the exit code (0 ok, 1 failure, 2 usage error).
 */
export async function main(
  argv: readonly string[],
  io: CliIo = { stdout: process.stdout, stderr: process.stderr, cwd: process.cwd() },
): Promise<number> {
  const program = buildProgram(io);
  try {
    await program.parseAsync([...argv], { from: 'user' });
    return 0;
  } catch (err) {
    if (err instanceof CommanderError) {
      if (err.code === 'commander.helpDisplayed' || err.code === 'commander.version' || err.exitCode === 0) return 0;
      return err.code === 'commander.help' || err.code === 'commander.executeSubCommandAsync' ? 1 : 2;
    }
    const msg = (err as Error).message ?? String(err);
    io.stderr.write(`specd: error: ${msg.split('\n')[0]}\n`);
    return 1;
  }
}
