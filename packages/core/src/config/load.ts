/**
 * Reading a deployment config: parse (strict JSON), import the plugin packages it names (or the
 * built-ins), merge their drafter branches into the schema, validate with defaults applied, and
 * resolve paths relative to the file. {@link SpecdConfig} is the typed result.
 */

import * as fs from 'node:fs';
import * as path from 'node:path';

import 'reflect-metadata';
import { container as rootContainer, type DependencyContainer } from 'tsyringe';

import type { CheckpointSanityMode } from '../io/checkpoint-sanity.js';
import type { Device } from '../plugin/model-plugin.js';
import { parseStrictJson } from '../io/strict-json.js';
import { BUILTIN_PLUGIN_PACKAGES, DrafterRegistry, loadPluginPackages, ModelRegistry } from '../plugin/registry.js';
import { buildConfigSchema } from './schema.js';
import { compileConfigSchema, ConfigError, formatConfigErrors } from './validate.js';

/** `drafter`: a method and its plugin's fields (`path` resolved to an absolute directory). */
export interface DrafterConfig {
  readonly method: string;
  /** Checkpoint directory (absolute), when the method has one. */
  readonly path?: string;
  /** Drafts per step at most, when given. */
  readonly num_draft_tokens?: number;
  readonly [field: string]: unknown;
}

/** A validated config with every default filled in (snake_case, as in the file). */
export interface SpecdConfig {
  /** The file it came from (absent for a config built in code). */
  readonly file?: string;
  /** Absolute target directory; absent: the shipped default. */
  readonly model?: string;
  /** Where the target runs (default `'cpu'`; `--device` overrides it). */
  readonly device: Device;
  /** Checkpoint sanity at load (io/checkpoint-sanity.ts): refuse (default) or warn about a non-finite weight. */
  readonly checkpoint_sanity: CheckpointSanityMode;
  /** Absent: the shipped DFlash with the shipped target, else none. */
  readonly drafter?: DrafterConfig;
  readonly plugins: readonly string[];
  /**
   * Only the fields the file gives: the rest come from the model's generation_config.json, else OpenAI's
   * defaults (resolveSamplingDefaults, config/generation-config.ts).
   */
  readonly sampling: {
    temperature?: number;
    top_p?: number;
    top_k?: number;
    repetition_penalty?: number;
    max_tokens?: number;
    seed?: number;
  };
  readonly scheduler: {
    max_running_requests: number;
    max_waiting_requests: number;
    prefill_chunk_tokens: number;
    max_tokens_in_flight: number;
    max_sequence_tokens: number;
    page_size: number;
  };
  readonly server: {
    host: string;
    port: number;
    api_key?: string;
    allowed_hosts?: string[];
    metrics_require_key: boolean;
    body_limit_bytes: number;
    model_name?: string;
  };
  readonly parallelism: {
    tp: number;
    pp: number;
    partition?: number[];
    transport: 'zmq' | 'fifo';
    /** Stage processes on other hosts (schema.ts `parallelism.stage_hosts`). */
    stage_hosts?: { exec?: string[]; address?: string }[];
  };
  readonly pd: {
    role: 'none' | 'prefill' | 'decode';
    bootstrap?: { host: string; port: number };
    /** `specd router`'s upstreams and listening address (absent: flags only). */
    router?: {
      prefill: string[];
      decode: string[];
      host: string;
      port: number;
      policy: 'round_robin' | 'random';
      health_interval_ms: number;
    };
    bootstrap_timeout_ms: number;
    transfer: 'zmq' | 'nixl';
    draft_context: 'kv' | 'features' | 'auto';
    overlap: boolean;
    transfer_timeout_ms: number;
  };
}

/** Plugin packages imported into one container, and what they registered. */
export interface LoadedPlugins {
  readonly packages: readonly string[];
  readonly container: DependencyContainer;
  readonly models: ModelRegistry;
  readonly drafters: DrafterRegistry;
}

/** Imports `packages` into a fresh child container. @throws {PluginError} naming a bad package. */
export async function loadPlugins(packages: readonly string[] = BUILTIN_PLUGIN_PACKAGES): Promise<LoadedPlugins> {
  const container = rootContainer.createChildContainer();
  await loadPluginPackages(packages, container);
  return {
    packages,
    container,
    models: ModelRegistry.fromContainer(container),
    drafters: DrafterRegistry.fromContainer(container),
  };
}

/** The merged schema for a set of loaded plugins. */
export function configSchemaFor(plugins: LoadedPlugins): Record<string, unknown> {
  return buildConfigSchema(plugins.drafters.plugins());
}

/**
 * Validates a parsed config object (defaults are filled in place) and resolves `model` and
 * `drafter.path` against `baseDir`.
 * @throws {ConfigError} listing every error as `$.path: rule: message, got value`.
 */
export function validateConfig(
  data: unknown,
  plugins: LoadedPlugins,
  options: { baseDir: string; file?: string },
): SpecdConfig {
  const where = options.file ?? 'config';
  const validate = compileConfigSchema(configSchemaFor(plugins));
  if (!validate(data)) {
    const lines = formatConfigErrors(validate.errors ?? [], data);
    throw new ConfigError(`${where}: ${lines.join('; ')}`, lines);
  }
  const c = data as Record<string, unknown> & Omit<SpecdConfig, 'file'>;
  const par = c.parallelism;
  if (par.partition !== undefined && par.partition.length !== par.pp) {
    const line =
      `$.parallelism.partition: pp: expected ${par.pp} entries (one per pipeline stage), ` +
      `got ${par.partition.length}`;
    throw new ConfigError(`${where}: ${line}`, [line]);
  }
  const resolve = (p: string): string => path.resolve(options.baseDir, p);
  const drafter =
    c.drafter === undefined
      ? undefined
      : typeof c.drafter.path === 'string'
        ? { ...c.drafter, path: resolve(c.drafter.path) }
        : c.drafter;
  return {
    ...(options.file === undefined ? {} : { file: options.file }),
    ...(c.model === undefined ? {} : { model: resolve(c.model) }),
    device: c.device,
    checkpoint_sanity: c.checkpoint_sanity,
    ...(drafter === undefined ? {} : { drafter }),
    plugins: c.plugins,
    sampling: c.sampling,
    scheduler: c.scheduler,
    server: c.server,
    parallelism: c.parallelism,
    pd: c.pd,
  };
}

/** Parses a config file's text. @throws {ConfigError} naming the file. */
function readJson(file: string): unknown {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (cause) {
    throw new ConfigError(`${file}: cannot read: ${(cause as Error).message}`, [], { cause });
  }
  try {
    return parseStrictJson(text) as unknown;
  } catch (cause) {
    throw new ConfigError(`${file}: not valid JSON: ${(cause as Error).message}`, [], { cause });
  }
}

/**
 * Reads, validates and resolves a config file (or the all-defaults config when `file` is
 * undefined): the `plugins` it names are imported first (their drafter branches join the schema).
 * @returns the config and the loaded plugins.
 * @throws {ConfigError} (file, JSON path, rule, value) or {PluginError}.
 */
export async function loadConfig(
  file: string | undefined,
  cwd: string = process.cwd(),
): Promise<{ config: SpecdConfig; plugins: LoadedPlugins }> {
  const data = file === undefined ? {} : readJson(file);
  let packages: readonly string[] = BUILTIN_PLUGIN_PACKAGES;
  if (data !== null && typeof data === 'object' && !Array.isArray(data) && 'plugins' in data) {
    const p = (data as { plugins: unknown }).plugins;
    if (Array.isArray(p) && p.every((x) => typeof x === 'string' && x !== '')) packages = p as string[];
    // otherwise the schema reports it (with the built-ins loaded)
  }
  const plugins = await loadPlugins(packages);
  const config = validateConfig(data, plugins, {
    baseDir: file === undefined ? cwd : path.dirname(file),
    ...(file === undefined ? {} : { file }),
  });
  return { config, plugins };
}
