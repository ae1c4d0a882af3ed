/**
 * Sampling defaults, as vLLM's `--generation-config auto` (its default) and OpenAI's API: for each field a
 * request leaves out, the deployment config's `sampling` value when the file gives one, else the model's
 * `generation_config.json`, else OpenAI's default (temperature 1, top_p 1; top_k off).
 *
 * Read from `generation_config.json` (the fields of vLLM's `ModelConfig.get_diff_sampling_param`,
 * vllm/config/model.py): `temperature`, `top_p`, `top_k`, `repetition_penalty`. Two differences from vLLM:
 * - `do_sample: false` (transformers' greedy decoding, e.g. models/kimi-k3-tiny) makes the default temperature 0;
 *   vLLM ignores `do_sample` and would sample such a model at temperature 1.
 * - `max_new_tokens` is not read: an absent `max_tokens` runs to the end of the context (serve/limits.ts).
 * `repetition_penalty` is passed through as a default only (the server's request parsing applies it).
 * The file sits in the model's folder (a Hugging Face folder, or the folder of a `.gguf`; `npm run models:fetch`
 * writes one next to SmolLM2's GGUF with its model card's sampling).
 */

import * as fs from 'node:fs';
import * as path from 'node:path';

import { MAX_TEMPERATURE } from '../engine/sampling-params.js';
import { parseStrictJson } from '../io/strict-json.js';
import type { SpecdConfig } from './load.js';
import { ConfigError } from './validate.js';

/** OpenAI's defaults for what neither the config nor the model says (top_k 0: off). */
export const OPENAI_SAMPLING_DEFAULTS = Object.freeze({ temperature: 1, top_p: 1, top_k: 0 });

/** The sampling fields a model's `generation_config.json` gave (each absent when the file does not say). */
export interface ModelSamplingDefaults {
  readonly temperature?: number;
  readonly top_p?: number;
  readonly top_k?: number;
  readonly repetition_penalty?: number;
}

/** Where one resolved default came from. */
export type SamplingSource = 'config' | 'generation_config' | 'openai';

/** The sampling defaults a server or `specd generate` runs with (the shape of serve/protocol.ts' defaults). */
export interface ResolvedSampling {
  readonly temperature: number;
  readonly top_p: number;
  readonly top_k: number;
  /** Absent: none (1, off). */
  readonly repetition_penalty?: number;
  readonly max_tokens?: number;
  readonly seed?: number;
}

/** The folder whose `generation_config.json` belongs to `modelPath` (the folder itself, or a `.gguf` file's). */
export function modelFolder(modelPath: string): string {
  return modelPath.endsWith('.gguf') && fs.existsSync(modelPath) && fs.statSync(modelPath).isFile()
    ? path.dirname(modelPath)
    : modelPath;
}

/**
 * The sampling fields of `<model folder>/generation_config.json`, or undefined when there is none.
 * @throws {ConfigError} naming the file and the field: unreadable or invalid JSON, not an object, or a value
 *   out of range (temperature finite in [0, 2], top_p in (0, 1], top_k an integer (≤ 0: off),
 *   repetition_penalty finite > 0, do_sample a boolean).
 */
export function readModelSamplingDefaults(modelPath: string): ModelSamplingDefaults | undefined {
  const file = path.join(modelFolder(modelPath), 'generation_config.json');
  if (!fs.existsSync(file)) return undefined;
  let data: unknown;
  try {
    data = parseStrictJson(fs.readFileSync(file, 'utf8'));
  } catch (cause) {
    throw new ConfigError(`${file}: cannot read: ${(cause as Error).message}`, [], { cause });
  }
  if (data === null || typeof data !== 'object' || Array.isArray(data))
    throw new ConfigError(`${file}: expected a JSON object, got ${JSON.stringify(data)}`);
  const g = data as Record<string, unknown>;
  const bad = (field: string, expected: string): never => {
    throw new ConfigError(`${file}: ${field}: expected ${expected}, got ${JSON.stringify(g[field])}`);
  };
  const num = (field: string, ok: (n: number) => boolean, expected: string): number | undefined => {
    const v = g[field];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== 'number' || !Number.isFinite(v) || !ok(v)) return bad(field, expected);
    return v;
  };
  const doSample = g.do_sample;
  if (doSample !== undefined && doSample !== null && typeof doSample !== 'boolean') bad('do_sample', 'a boolean');
  const temperature = num('temperature', (n) => n >= 0 && n <= MAX_TEMPERATURE, `a number in [0, ${MAX_TEMPERATURE}]`);
  const topP = num('top_p', (n) => n > 0 && n <= 1, 'a number in (0, 1]');
  const topK = num('top_k', Number.isSafeInteger, 'an integer (0 or less: off)');
  const repetitionPenalty = num('repetition_penalty', (n) => n > 0, 'a number > 0');
  return {
    // transformers: do_sample false is greedy whatever the temperature says
    ...(doSample === false ? { temperature: 0 } : temperature === undefined ? {} : { temperature }),
    ...(topP === undefined ? {} : { top_p: topP }),
    ...(topK === undefined ? {} : { top_k: Math.max(0, topK) }),
    ...(repetitionPenalty === undefined ? {} : { repetition_penalty: repetitionPenalty }),
  };
}

/**
 * The sampling defaults for `modelPath` under `sampling` (the config's section, whose fields are set only where
 * the file gave them): per field the config, else the model's generation_config.json, else OpenAI's.
 * @param modelPath the target (folder or `.gguf`); undefined: no model (e.g. `specd router` without `model`).
 * @returns the defaults and, per field, where each came from.
 * @throws {ConfigError} from {@link readModelSamplingDefaults}.
 */
export function resolveSamplingDefaults(
  sampling: SpecdConfig['sampling'],
  modelPath: string | undefined,
): { defaults: ResolvedSampling; sources: Record<'temperature' | 'top_p' | 'top_k', SamplingSource> } {
  const model = modelPath === undefined ? undefined : readModelSamplingDefaults(modelPath);
  const pick = <K extends 'temperature' | 'top_p' | 'top_k'>(key: K): [number, SamplingSource] => {
    const fromConfig = sampling[key];
    if (fromConfig !== undefined) return [fromConfig, 'config'];
    const fromModel = model?.[key];
    if (fromModel !== undefined) return [fromModel, 'generation_config'];
    return [OPENAI_SAMPLING_DEFAULTS[key], 'openai'];
  };
  const [temperature, t] = pick('temperature');
  const [topP, p] = pick('top_p');
  const [topK, k] = pick('top_k');
  const repetitionPenalty = sampling.repetition_penalty ?? model?.repetition_penalty;
  return {
    defaults: {
      temperature,
      top_p: topP,
      top_k: topK,
      ...(repetitionPenalty === undefined ? {} : { repetition_penalty: repetitionPenalty }),
      ...(sampling.max_tokens === undefined ? {} : { max_tokens: sampling.max_tokens }),
      ...(sampling.seed === undefined ? {} : { seed: sampling.seed }),
    },
    sources: { temperature: t, top_p: p, top_k: k },
  };
}

/** `temperature 0.2 (generation_config), top_p 0.9 (generation_config), top_k 0 (openai)`: for start-up lines. */
export function describeSampling(r: ReturnType<typeof resolveSamplingDefaults>): string {
  const { defaults: d, sources: s } = r;
  const rp = d.repetition_penalty === undefined ? '' : `, repetition_penalty ${d.repetition_penalty}`;
  const field = (name: string, value: number, source: SamplingSource): string => `${name} ${value} (${source})`;
  return (
    `${field('temperature', d.temperature, s.temperature)}, ${field('top_p', d.top_p, s.top_p)}, ` +
    `${field('top_k', d.top_k, s.top_k)}${rp}`
  );
}
