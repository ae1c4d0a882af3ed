/**
 * `--device cpu|cuda` (vLLM's flag) on `specd generate` and `specd serve`, and the deployment config's `device`:
 * where the target runs. `cuda` asks the model plugin for its GPU path (one NVIDIA GPU, the whole model: the Llama
 * plugin through @specd/native-cuda); core refuses it for a plugin without one (runtime/target.ts) and with tp or
 * pp > 1 (runtime/parallel.ts). A GPU stage allocates its activations at load for the largest forward the engine
 * will run ({@link deviceMaxTokens}), before the drafter that decides the verify blocks' size is loaded.
 */

import { Option } from 'commander';

import type { Drafter } from '../plugin/drafter-plugin.js';
import type { Device, StageModel } from '../plugin/model-plugin.js';
import { CliError } from './config-file.js';

/** The devices `--device` and the config's `device` accept. */
export const DEVICES: readonly Device[] = Object.freeze(['cpu', 'cuda'] as const);

/** `--device <device>` (generate and serve). */
export function deviceOption(): Option {
  return new Option(
    '--device <device>',
    'where the target runs: cpu, or cuda (one NVIDIA GPU through @specd/native-cuda, `npm run build:cuda`; Llama ' +
      'targets, tp = pp = 1) (default: config device, cpu)',
  ).choices(DEVICES);
}

/**
 * Rows a device's activations hold at least: the CUDA stage's own default, so that every forward the engine runs
 * at the default settings (a prefill chunk of 64, 8 sequences × a verify block) fits with room to spare.
 */
export const DEVICE_MIN_ROWS = 2048;

/**
 * Drafts per sequence and verify step assumed when the draft length is not fixed: the drafter, which decides it
 * (its `maxDraftTokens`), loads after the target. Above every shipped drafter's (DFlash 15, DSpark 7, EAGLE-3's
 * chain); {@link checkDeviceRows} refuses a drafter that drafts more.
 */
export const DEVICE_DRAFT_TOKENS_BOUND = 32;

/** The engine settings that bound a forward's rows. */
export interface DeviceRowsOptions {
  /** Tokens per prefill forward (the engine's `prefillChunk`: one chunk per step). */
  readonly prefillChunk: number;
  /** Sequences decoded together (the engine's `maxSequences`). */
  readonly maxSequences: number;
  /** Drafts per sequence and step at most: 0 without a drafter, the fixed draft length, else the bound. */
  readonly draftTokens: number;
}

/**
 * The drafts per step a GPU stage is sized for: 0 without a drafter, the fixed draft length (`--num-draft-tokens`,
 * `drafter.num_draft_tokens`) when there is one, else {@link DEVICE_DRAFT_TOKENS_BOUND}.
 */
export function draftTokensBound(hasDrafter: boolean, numDraftTokens: number | undefined): number {
  return hasDrafter ? (numDraftTokens ?? DEVICE_DRAFT_TOKENS_BOUND) : 0;
}

/**
 * The rows of the largest forward (StageLoadOptions.maxTokens): max({@link DEVICE_MIN_ROWS}, prefill chunk,
 * sequences × (drafts + 1)). A prefill chunk and a verify step are separate forwards (one chunk per step); the
 * draft-cost calibration's forwards are at most a verify step's.
 */
export function deviceMaxTokens(o: DeviceRowsOptions): number {
  return Math.max(DEVICE_MIN_ROWS, o.prefillChunk, o.maxSequences * (o.draftTokens + 1));
}

/**
 * Checks, once the drafter is loaded, that its verify steps fit the rows the device was sized for.
 * @throws {CliError} naming the device, the rows needed and `--num-draft-tokens` (and how many fit).
 */
export function checkDeviceRows(
  device: Device,
  maxTokens: number,
  maxSequences: number,
  drafter: Drafter,
  numDraftTokens: number | undefined,
): void {
  const k = Math.min(numDraftTokens ?? drafter.maxDraftTokens, drafter.maxDraftTokens);
  const rows = maxSequences * (k + 1);
  if (rows <= maxTokens) return;
  const fits = Math.floor(maxTokens / maxSequences) - 1;
  throw new CliError(
    `--device ${device}: the ${drafter.method} drafter drafts up to ${k} tokens a step: ${maxSequences} ` +
      `sequence${maxSequences === 1 ? '' : 's'} × ${k + 1} rows = ${rows} rows, more than the ${maxTokens} the ` +
      `device's activations were sized for; fix the draft length with --num-draft-tokens (at most ${fits} here)`,
  );
}

/** A stage that describes its device (the CUDA stage: GPU, memory, weights, KV pool, activations, CUDA graphs). */
interface DescribedStage {
  describe(): string;
}

const isDescribed = (model: StageModel): model is StageModel & DescribedStage =>
  'describe' in model && typeof model.describe === 'function';

/** The device line of a target loaded on `device` (`model.describe()`), or undefined on the CPU or without it. */
export function deviceLine(device: Device, model: StageModel): string | undefined {
  return device !== 'cpu' && isDescribed(model) ? model.describe() : undefined;
}
