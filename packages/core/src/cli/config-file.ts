/**
 * How the CLI commands turn a deployment config (packages/core/src/config) plus flags into what
 * to load. Flags override the config; the config overrides the shipped defaults.
 */

import * as fs from 'node:fs';
import * as path from 'node:path';

import type { SpecdConfig } from '../config/load.js';
import type { DrafterChoice } from '../runtime/drafter.js';
import { defaultDrafterDir } from './paths.js';

/** A failure to report as one line (exit code 1). */
export class CliError extends Error {
  override readonly name = 'CliError';
}

/**
 * Checks that `modelPath` is a model specd can load: a Hugging Face folder (config.json), a `.gguf`
 * file, or a folder holding one `.gguf` and no config.json (e.g. `npm run models:fetch`'s
 * models/smollm2-135m-instruct).
 * @throws {CliError} naming the path and what was expected (and `npm run models:fetch` for the SmolLM2 folder).
 */
export function checkModelPath(modelPath: string): void {
  if (fs.existsSync(path.join(modelPath, 'config.json'))) return;
  if (modelPath.endsWith('.gguf') && fs.existsSync(modelPath)) return;
  if (
    fs.existsSync(modelPath) &&
    fs.statSync(modelPath).isDirectory() &&
    fs.readdirSync(modelPath).some((f) => f.endsWith('.gguf'))
  )
    return;
  const hint = /smollm2/i.test(modelPath) ? ' (run `npm run models:fetch` to fetch SmolLM2-135M-Instruct)' : '';
  throw new CliError(
    `model ${modelPath}: neither a folder with config.json nor a .gguf file, nor a folder holding one${hint} ` +
      '(use --model DIR|FILE.gguf)',
  );
}

/**
 * The drafter: `--no-spec` → none; `--drafter DIR` → that checkpoint (method from its
 * architectures); else the config's `drafter` (`{"method": "none"}` → none; no `path` → the
 * method's plugin loads without a checkpoint); else the shipped
 * DFlash when the target is the shipped default (neither `--model` nor `model` given).
 * @throws {CliError} when the chosen directory has no config.json.
 */
export function chooseDrafter(
  cfg: SpecdConfig,
  flags: { readonly model?: string; readonly drafter?: string; readonly noSpec?: boolean },
  cwd: string,
): DrafterChoice | undefined {
  if (flags.noSpec === true) return undefined;
  let choice: DrafterChoice | undefined;
  const cap = cfg.drafter?.num_draft_tokens;
  if (flags.drafter !== undefined) {
    choice = { dir: path.resolve(cwd, flags.drafter), ...(cap === undefined ? {} : { numDraftTokens: cap }) };
  } else if (cfg.drafter !== undefined) {
    if (cfg.drafter.method === 'none') return undefined;
    // No "path": a method without a checkpoint, loaded by its name (the plugin says whether it can be).
    choice = {
      ...(typeof cfg.drafter.path === 'string' ? { dir: cfg.drafter.path } : {}),
      method: cfg.drafter.method,
      settings: cfg.drafter,
      ...(cap === undefined ? {} : { numDraftTokens: cap }),
    };
  } else if (flags.model === undefined && cfg.model === undefined) {
    const d = defaultDrafterDir(cwd);
    if (fs.existsSync(path.join(d, 'config.json'))) choice = { dir: d };
  }
  if (choice?.dir !== undefined && !fs.existsSync(path.join(choice.dir, 'config.json'))) {
    throw new CliError(`drafter directory ${choice.dir} has no config.json (use --drafter DIR, or --no-spec)`);
  }
  return choice;
}
