/**
 * The `--config FILE` JSON of `specd generate` (CLI flags override it):
 *
 *   { "model": "models/kimi-k3-tiny",          // relative to the config file's directory
 *     "drafter": "models/kimi-k3-tiny-dflash",  // drafter checkpoint (speculative decoding)
 *     "plugins": ["@specd/model-kimi-k3"],     // plugin packages to import (default: built-ins)
 *     "generate": { "max_tokens": 64, "temperature": 0, "top_p": 1, "top_k": 0, "seed": 1 } }
 *
 * Every key is optional; an unknown key or a wrong type is an error naming the JSON path.
 */

import * as fs from 'node:fs';
import * as path from 'node:path';

import { isJsonObject, parseStrictJson, type JsonObject, type JsonValue } from '../io/strict-json.js';

/** Thrown for an unreadable or invalid config file (message names the file and the JSON path). */
export class CliConfigError extends Error {
  override readonly name = 'CliConfigError';
}

/** Generation settings (any may be absent). */
export interface GenerateSettings {
  readonly maxTokens?: number;
  readonly temperature?: number;
  readonly topP?: number;
  readonly topK?: number;
  readonly seed?: number;
}

/** A parsed config file. */
export interface CliConfig {
  /** Absolute model directory, if given. */
  readonly model?: string;
  /** Absolute drafter checkpoint directory, if given. */
  readonly drafter?: string;
  readonly plugins?: readonly string[];
  readonly generate: GenerateSettings;
}

const GENERATE_KEYS: Record<string, { key: keyof GenerateSettings; check: (v: number) => boolean; expected: string }> = {
  max_tokens: { key: 'maxTokens', check: (v) => Number.isSafeInteger(v) && v >= 1, expected: 'an integer >= 1' },
  temperature: { key: 'temperature', check: (v) => v >= 0 && Number.isFinite(v), expected: 'a number >= 0' },
  top_p: { key: 'topP', check: (v) => v > 0 && v <= 1, expected: 'a number in (0, 1]' },
  top_k: { key: 'topK', check: (v) => Number.isSafeInteger(v) && v >= 0, expected: 'an integer >= 0' },
  seed: { key: 'seed', check: (v) => Number.isSafeInteger(v) && v >= 0, expected: 'an integer >= 0' },
};

/** Reads and validates a config file. @throws {CliConfigError} naming the file and JSON path. */
export function readCliConfig(file: string): CliConfig {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (cause) {
    throw new CliConfigError(`${file}: cannot read: ${(cause as Error).message}`, { cause });
  }
  let root: JsonValue;
  try {
    root = parseStrictJson(text);
  } catch (cause) {
    throw new CliConfigError(`${file}: not valid JSON: ${(cause as Error).message}`, { cause });
  }
  const fail = (where: string, what: string): never => {
    throw new CliConfigError(`${file}: ${where}: ${what}`);
  };
  if (!isJsonObject(root)) fail('$', 'expected a JSON object');
  const obj = root as JsonObject;
  let model: string | undefined;
  let drafter: string | undefined;
  let plugins: string[] | undefined;
  const generate: Record<string, number> = {};
  for (const [k, v] of Object.entries(obj)) {
    if (k === 'model') {
      if (typeof v !== 'string' || v === '') fail('model', `expected a directory path, got ${JSON.stringify(v)}`);
      model = path.resolve(path.dirname(file), v as string);
    } else if (k === 'drafter') {
      if (typeof v !== 'string' || v === '') fail('drafter', `expected a directory path, got ${JSON.stringify(v)}`);
      drafter = path.resolve(path.dirname(file), v as string);
    } else if (k === 'plugins') {
      if (!Array.isArray(v) || v.some((p) => typeof p !== 'string' || p === '')) fail('plugins', 'expected an array of package names');
      plugins = v as string[];
    } else if (k === 'generate') {
      if (!isJsonObject(v)) fail('generate', 'expected an object');
      for (const [gk, gv] of Object.entries(v as JsonObject)) {
        const spec = GENERATE_KEYS[gk];
        if (spec === undefined) fail(`generate.${gk}`, `unknown key (known: ${Object.keys(GENERATE_KEYS).join(', ')})`);
        if (typeof gv !== 'number' || !spec!.check(gv)) fail(`generate.${gk}`, `expected ${spec!.expected}, got ${JSON.stringify(gv)}`);
        generate[spec!.key] = gv as number;
      }
    } else {
      fail(k, 'unknown key (known: model, drafter, plugins, generate)');
    }
  }
  return { model, drafter, plugins, generate: generate as GenerateSettings };
}
