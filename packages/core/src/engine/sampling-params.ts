/**
 * The ranges of the sampling settings and their one normalisation, shared by the server's request
 * parsing (serve/protocol.ts), `specd generate` and the engine's own request check, as vLLM's
 * `SamplingParams._verify_args` / `__post_init__` (vllm/sampling_params.py):
 * - `temperature`: finite, ≥ 0; below {@link SAMPLING_EPS} it is greedy (temperature 0, top-k and
 *   top-p off), so a temperature such as 1e-45 never divides the logits into ±Infinity. The API and the
 *   CLI also cap it at {@link MAX_TEMPERATURE}. Unlike vLLM, a temperature in [1e-5, 1e-2) is not raised
 *   to 1e-2: the sampler divides f32 logits and subtracts the row maximum before exp, finite for every
 *   temperature ≥ 1e-5 (logits below 1e33 in magnitude).
 * - `topP`: in (0, 1] (1: off). `topK`: an integer, 0 (or, in the API, −1) off, else ≥ 1 (≥ the vocabulary
 *   size keeps every token).
 * Sampling is defined in probs.ts; these are only the bounds of its inputs.
 */

import type { DraftSampling } from '../plugin/drafter-plugin.js';

/** Temperatures below this are greedy (vLLM's `_SAMPLING_EPS`). */
export const SAMPLING_EPS = 1e-5;

/** The largest temperature the API and the CLI accept (OpenAI's and vLLM's bound). */
export const MAX_TEMPERATURE = 2;

/**
 * The sampling a request runs with: a temperature below {@link SAMPLING_EPS} becomes greedy (temperature 0,
 * no top-k, no top-p, as vLLM resets them), anything else is returned unchanged. Check the ranges first
 * ({@link samplingProblem}).
 */
export function normalizeSampling(s: DraftSampling): DraftSampling {
  return s.temperature < SAMPLING_EPS ? { temperature: 0 } : s;
}

/**
 * The first setting of `s` outside its range, as `{field, message}` (`field`: `temperature`, `topK` or `topP`;
 * `message` says what was expected and what came), or undefined when every setting is valid. The engine's
 * ranges: temperature finite, 0 or ≥ {@link SAMPLING_EPS} (normalise first); topK an integer ≥ 0; topP in (0, 1].
 */
export function samplingProblem(s: DraftSampling): { field: string; message: string } | undefined {
  const { temperature, topK, topP } = s;
  if (!(Number.isFinite(temperature) && (temperature === 0 || temperature >= SAMPLING_EPS)))
    return {
      field: 'temperature',
      message: `expected 0 (greedy) or a finite number >= ${SAMPLING_EPS}, got ${temperature}`,
    };
  if (topK !== undefined && !(Number.isSafeInteger(topK) && topK >= 0))
    return { field: 'topK', message: `expected an integer >= 0 (0: off), got ${topK}` };
  if (topP !== undefined && !(topP > 0 && topP <= 1))
    return { field: 'topP', message: `expected a number in (0, 1] (1: off), got ${topP}` };
  return undefined;
}
