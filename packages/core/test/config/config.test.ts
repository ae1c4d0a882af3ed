// The deployment config: merged schema (core + plugin drafter branches), defaults, errors that name
// the JSON path / rule / value, the shipped example configs, and `specd config` / `specd plugins`.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { main, type CliIo } from '../../src/cli/index.js';
import {
  buildConfigSchema,
  compileConfigSchema,
  ConfigError,
  jsonPath,
  loadConfig,
  loadPlugins,
  validateConfig,
  type LoadedPlugins,
} from '../../src/config/index.js';
import type { DrafterPlugin } from '../../src/plugin/drafter-plugin.js';
import { makeTempDir } from '../io/helpers.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const tmp = makeTempDir('config');
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

let plugins: LoadedPlugins;
beforeAll(async () => {
  plugins = await loadPlugins();
});

const check = (data: unknown) => validateConfig(data, plugins, { baseDir: '/base', file: 'c.json' });
const errorsOf = (data: unknown): readonly string[] => {
  try {
    check(data);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as ConfigError).errors;
  }
  throw new Error('expected a ConfigError');
};

async function run(args: string[]): Promise<{ code: number; out: string; err: string }> {
  let out = '';
  let err = '';
  const io: CliIo = {
    stdout: { write: (s: string) => (out += s) },
    stderr: { write: (s: string) => (err += s) },
    cwd: ROOT,
  };
  return { code: await main(args, io), out, err };
}

describe('config schema', () => {
  it('an empty config gets every default', () => {
    const c = check({});
    expect(c.model).toBeUndefined();
    expect(c.drafter).toBeUndefined();
    expect(c.plugins).toEqual([
      '@specd/model-kimi-k3',
      '@specd/model-llama',
      '@specd/plugin-dflash',
      '@specd/plugin-dspark',
      '@specd/plugin-eagle3',
    ]);
    // only what the file gives: the rest from the model's generation_config.json, else OpenAI's
    // (generation-config.test.ts)
    expect(c.sampling).toEqual({});
    expect(c.scheduler).toEqual({
      max_running_requests: 8,
      max_waiting_requests: 64,
      prefill_chunk_tokens: 64,
      max_tokens_in_flight: 16384,
      max_sequence_tokens: 2048,
      page_size: 16,
    });
    expect(c.server).toEqual({ host: '127.0.0.1', port: 8000, metrics_require_key: false, body_limit_bytes: 1048576 });
    expect(c.parallelism).toEqual({ tp: 1, pp: 1, transport: 'zmq' });
    expect(c.pd).toEqual({
      role: 'none',
      bootstrap_timeout_ms: 30000,
      transfer: 'zmq',
      draft_context: 'kv',
      overlap: true,
      transfer_timeout_ms: 60000,
    });
    expect(c.checkpoint_sanity).toBe('refuse');
    expect(check({ checkpoint_sanity: 'warn' }).checkpoint_sanity).toBe('warn');
    expect(c.device).toBe('cpu');
    expect(check({ device: 'cuda' }).device).toBe('cuda');
  });

  it('resolves model and drafter.path against the file; drafter branches by method', () => {
    const c = check({ model: 'm', drafter: { method: 'dflash', path: 'd', num_draft_tokens: 3 } });
    expect(c.model).toBe('/base/m');
    expect(c.drafter).toEqual({ method: 'dflash', path: '/base/d', num_draft_tokens: 3 });
    expect(check({ drafter: { method: 'none' } }).drafter).toEqual({ method: 'none' });
  });

  it.each([
    [{ server: { port: 70000 } }, '$.server.port: maximum: must be <= 65535, got 70000'],
    [{ server: { hots: 'x' } }, '$.server.hots: additionalProperties: unknown property, got "x"'],
    [{ sampling: { top_p: 0 } }, '$.sampling.top_p: exclusiveMinimum: must be > 0, got 0'],
    [{ sampling: { max_tokens: 1.5 } }, '$.sampling.max_tokens: type: must be integer, got 1.5'],
    [{ scheduler: { max_running_requests: 0 } }, '$.scheduler.max_running_requests: minimum: must be >= 1, got 0'],
    [
      { drafter: { method: 'eagle9' } },
      '$.drafter.method: discriminator: no drafter method of that name is loaded (see `specd plugins`), got "eagle9"',
    ],
    [{ drafter: { method: 'dflash' } }, '$.drafter.path: required: required property is missing'],
    [{ drafter: { method: 'none', path: 'x' } }, '$.drafter.path: additionalProperties: unknown property, got "x"'],
    [
      { drafter: { method: 'dflash', path: 'd', num_draft_tokens: 0 } },
      '$.drafter.num_draft_tokens: minimum: must be >= 1, got 0',
    ],
    [
      { plugins: ['a', 'a'] },
      '$.plugins: uniqueItems: must NOT have duplicate items (items ## 1 and 0 are identical), got ["a","a"]',
    ],
    [{ parallelism: { tp: 0 } }, '$.parallelism.tp: minimum: must be >= 1, got 0'],
    [
      { parallelism: { pp: 2, partition: [4] } },
      '$.parallelism.partition: pp: expected 2 entries (one per pipeline stage), got 1',
    ],
    [{ pd: { role: 'both' } }, '$.pd.role: enum: must be one of ["none","prefill","decode"], got "both"'],
    [{ checkpoint_sanity: 'off' }, '$.checkpoint_sanity: enum: must be one of ["refuse","warn"], got "off"'],
    [{ device: 'tpu' }, '$.device: enum: must be one of ["cpu","cuda"], got "tpu"'],
    [{ pd: { bootstrap: { host: 'h' } } }, '$.pd.bootstrap.port: required: required property is missing'],
    [[], '$: type: must be object, got []'],
  ])('%j → %s', (data, line) => {
    expect(errorsOf(data)).toContain(line);
  });

  it('every error is reported, each on its own; the message names the file', () => {
    try {
      check({ server: { port: -1 }, sampling: { temperature: -1 } });
      throw new Error('expected an error');
    } catch (e) {
      expect((e as ConfigError).errors).toHaveLength(2);
      expect((e as Error).message).toMatch(
        /^c\.json: \$\.sampling\.temperature: minimum: .*; \$\.server\.port: minimum: /,
      );
    }
  });

  it('each drafter plugin contributes its branch; a branch without method.const is refused', () => {
    const fake: DrafterPlugin = {
      method: 'toy',
      architectures: ['Toy'],
      schema: {
        type: 'object',
        additionalProperties: false,
        properties: { method: { const: 'toy' }, k: { type: 'integer' } },
      },
      load: () => Promise.reject(new Error('no')),
    };
    const validate = compileConfigSchema(buildConfigSchema([fake]));
    expect(validate({ drafter: { method: 'toy', k: 2 } })).toBe(true);
    expect(validate({ drafter: { method: 'toy', k: 'x' } })).toBe(false);
    expect(validate({ drafter: { method: 'dflash', path: 'x' } })).toBe(false);
    expect(() => buildConfigSchema([{ ...fake, schema: { properties: { method: { const: 'other' } } } }])).toThrow(
      /schema\.properties\.method\.const: expected "toy", got "other"/,
    );
  });

  it('jsonPath', () => {
    expect(jsonPath('')).toBe('$');
    expect(jsonPath('/a/0/b c/~1x')).toBe('$.a[0]["b c"]["/x"]');
  });
});

describe('config files', () => {
  const shipped = fs
    .readdirSync(path.join(ROOT, 'configs'))
    .filter((f) => f.endsWith('.json'))
    .sort();
  it('ships a config per shipped drafter', () => {
    for (const f of [
      'default.json',
      'kimi-k3-tiny-dflash.json',
      'kimi-k3-tiny-dflash-swa.json',
      'kimi-k3-tiny-dspark.json',
      'kimi-k3-tiny-eagle3.json',
      'kimi-k3-tiny-nospec.json',
      'smollm2-dflash.json',
      'smollm2-dspark.json',
      'smollm2-eagle3.json',
    ]) {
      expect(shipped).toContain(f);
    }
  });
  it.each(shipped)('configs/%s is valid and points at shipped checkpoints', async (name) => {
    const { config } = await loadConfig(path.join(ROOT, 'configs', name));
    // an HF folder (config.json) or a folder holding one GGUF file (fetched by `npm run models:fetch`)
    expect(
      fs.existsSync(path.join(config.model!, 'config.json')) ||
        fs.readdirSync(config.model!).some((f) => f.endsWith('.gguf')),
    ).toBe(true);
    if (config.drafter?.method !== 'none')
      expect(fs.existsSync(path.join(config.drafter!.path!, 'config.json'))).toBe(true);
    expect(config.server.host).toBe('127.0.0.1');
  });

  it('unreadable and malformed files name the file', async () => {
    await expect(loadConfig(path.join(tmp, 'none.json'))).rejects.toThrow(/none\.json: cannot read/);
    fs.writeFileSync(path.join(tmp, 'bad.json'), '{"model": ');
    await expect(loadConfig(path.join(tmp, 'bad.json'))).rejects.toThrow(/bad\.json: not valid JSON/);
    fs.writeFileSync(path.join(tmp, 'dup.json'), '{"model": "a", "model": "b"}');
    await expect(loadConfig(path.join(tmp, 'dup.json'))).rejects.toThrow(/dup\.json: not valid JSON/);
  });

  it('the "plugins" a file names are loaded before validation (their drafter branches only)', async () => {
    fs.writeFileSync(
      path.join(tmp, 'p.json'),
      JSON.stringify({ plugins: ['@specd/model-kimi-k3'], drafter: { method: 'dflash', path: 'x' } }),
    );
    await expect(loadConfig(path.join(tmp, 'p.json'))).rejects.toThrow(
      /\$\.drafter\.method: discriminator: .*got "dflash"/,
    );
    fs.writeFileSync(path.join(tmp, 'q.json'), JSON.stringify({ plugins: ['@specd/no-such-plugin'] }));
    await expect(loadConfig(path.join(tmp, 'q.json'))).rejects.toThrow(
      /plugin package "@specd\/no-such-plugin" cannot be imported/,
    );
  });
});

describe('specd config / specd plugins', () => {
  it('config schema prints the merged 2020-12 schema with the none branch and one per shipped drafter', async () => {
    const r = await run(['config', 'schema']);
    expect(r.code).toBe(0);
    const s = JSON.parse(r.out) as {
      $schema: string;
      properties: { drafter: { oneOf: { properties: { method: { const: string } } }[] } };
    };
    expect(s.$schema).toBe('https://json-schema.org/draft/2020-12/schema');
    expect(s.properties.drafter.oneOf.map((b) => b.properties.method.const)).toEqual([
      'none',
      'dflash',
      'dspark',
      'eagle3',
    ]);
  });

  it('config validate prints the filled-in config, or one error line and exit 1', async () => {
    const ok = await run(['config', 'validate', 'configs/kimi-k3-tiny-dflash.json']);
    expect(ok.code).toBe(0);
    expect((JSON.parse(ok.out) as { drafter: { path: string } }).drafter.path).toBe(
      path.join(ROOT, 'models/kimi-k3-tiny-dflash'),
    );
    fs.writeFileSync(path.join(tmp, 'v.json'), JSON.stringify({ server: { port: 'x' } }));
    const bad = await run(['config', 'validate', path.join(tmp, 'v.json')]);
    expect(bad.code).toBe(1);
    expect(bad.err).toMatch(/^specd: error: .*v\.json: \$\.server\.port: type: must be integer, got "x"\n$/);
  });

  it('plugins lists packages, model plugins and drafter methods', async () => {
    const r = await run(['plugins', '--json']);
    expect(r.code).toBe(0);
    const j = JSON.parse(r.out) as { packages: string[]; models: { name: string }[]; drafters: { method: string }[] };
    expect(j.packages).toEqual([
      '@specd/model-kimi-k3',
      '@specd/model-llama',
      '@specd/plugin-dflash',
      '@specd/plugin-dspark',
      '@specd/plugin-eagle3',
    ]);
    expect(j.models.map((m) => m.name)).toEqual(['kimi-k3', 'llama']);
    expect(j.drafters.map((d) => d.method)).toEqual(['none', 'dflash', 'dspark', 'eagle3']);
    const text = await run(['plugins']);
    expect(text.out).toMatch(/drafter methods:\n {2}none .*\n {2}dflash \(architectures DFlashDraftModel\)/);
  });
});
