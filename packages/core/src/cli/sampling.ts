/**
 * Token selection for plain generation: greedy (argmax) and sampling with temperature, top-k and
 * top-p (applied in that order, as vLLM), drawn with a seeded PRNG so runs are reproducible.
 * Greedy and sampling are separate functions; temperature 0 means greedy.
 */

import { argmax, softmax, topKMask, topPMask } from '@specd/native';

/** Sampling settings. */
export interface SamplingParams {
  /** 0 → greedy; otherwise > 0 (logits are divided by it). */
  readonly temperature: number;
  /** Keep the k most likely tokens (undefined or 0: no top-k). */
  readonly topK?: number;
  /** Keep the smallest set of tokens whose probability reaches p, in (0, 1] (undefined or 1: no top-p). */
  readonly topP?: number;
}

/** mulberry32: a small, fast, seeded PRNG; `next()` returns a float in [0, 1). */
export class SeededRandom {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0;
  }
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
}

/** Greedy: the first most likely token of `logits [vocab]` f32. */
export function greedyToken(logits: Float32Array): number {
  return argmax(logits, logits.length)[0]!;
}

/**
 * Samples one token from `logits [vocab]` f32 (not modified).
 * @throws {RangeError} if temperature ≤ 0 (use {@link greedyToken}), topK < 0 or topP outside (0, 1].
 */
export function sampleToken(logits: Float32Array, params: SamplingParams, rng: SeededRandom): number {
  const { temperature, topK, topP } = params;
  if (!(temperature > 0))
    throw new RangeError(`sampleToken: temperature: expected > 0 (0 is greedy), got ${temperature}`);
  const V = logits.length;
  const x = new Float32Array(V);
  for (let i = 0; i < V; i++) x[i] = logits[i]! / temperature;
  if (topK !== undefined && topK > 0 && topK < V) topKMask(x, V, topK, x);
  if (topP !== undefined && topP < 1) {
    if (!(topP > 0)) throw new RangeError(`sampleToken: topP: expected a number in (0, 1], got ${topP}`);
    topPMask(x, V, topP, x);
  }
  const p = softmax(x, V, 1, x);
  const u = rng.next();
  let acc = 0;
  let last = -1;
  for (let i = 0; i < V; i++) {
    if (p[i]! <= 0) continue;
    acc += p[i]!;
    last = i;
    if (u < acc) return i;
  }
  return last;
}

/** Picks the next token: greedy when temperature is 0, else sampled. */
export function nextToken(logits: Float32Array, params: SamplingParams, rng: SeededRandom): number {
  return params.temperature === 0 ? greedyToken(logits) : sampleToken(logits, params, rng);
}
