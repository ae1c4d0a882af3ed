// Model plugin registry: resolution by model_type / architectures, the error listing what is
// loaded, tsyringe registration, and dynamic loading of plugin packages by name.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

import 'reflect-metadata';
import { container } from 'tsyringe';
import { describe, expect, it } from 'vitest';

import { HfConfig } from '../../src/io/index.js';
import {
  checkApiVersion,
  DrafterRegistry,
  loadPluginPackages,
  MODEL_PLUGIN,
  ModelRegistry,
  PLUGIN_API_VERSION,
  PluginError,
  type ModelPlugin,
} from '../../src/plugin/index.js';

const fake = (name: string, modelTypes: string[], architectures: string[]): ModelPlugin => ({
  apiVersion: PLUGIN_API_VERSION,
  name,
  modelTypes,
  architectures,
  load: () => Promise.reject(new Error('not in this test')),
});

describe('ModelRegistry', () => {
  const reg = new ModelRegistry([
    fake('a', ['llama'], ['LlamaForCausalLM']),
    fake('b', ['kimi_k3', 'kimi_linear'], ['KimiLinearForCausalLM']),
  ]);
  it('resolves by model_type first, then by architectures', () => {
    expect(reg.resolve(HfConfig.fromObject({ model_type: 'kimi_linear' })).name).toBe('b');
    expect(reg.resolve(HfConfig.fromObject({ architectures: ['LlamaForCausalLM'] })).name).toBe('a');
    expect(reg.resolve(HfConfig.fromObject({ model_type: 'x', architectures: ['KimiLinearForCausalLM'] })).name).toBe(
      'b',
    );
  });
  it('names the config and every loaded plugin when nothing matches', () => {
    expect(() =>
      reg.resolve(HfConfig.fromObject({ model_type: 'qwen3', architectures: ['Qwen3ForCausalLM'] }, 'm/config.json')),
    ).toThrow(
      'm/config.json: no model plugin for model_type "qwen3" / architectures ' +
        '[Qwen3ForCausalLM]; loaded: a (model_type llama; architectures LlamaForCausalLM), ' +
        'b (model_type kimi_k3|kimi_linear; architectures KimiLinearForCausalLM)',
    );
    expect(() => new ModelRegistry().resolve(HfConfig.fromObject({}))).toThrow(/loaded: none/);
  });
  it('collects plugins registered in a tsyringe container', () => {
    const child = container.createChildContainer();
    expect(ModelRegistry.fromContainer(child).plugins()).toEqual([]);
    child.register(MODEL_PLUGIN, { useValue: fake('c', ['c'], []) });
    child.register(MODEL_PLUGIN, { useValue: fake('d', ['d'], []) });
    expect(
      ModelRegistry.fromContainer(child)
        .plugins()
        .map((p) => p.name),
    ).toEqual(['c', 'd']);
  });
});

describe('loadPluginPackages', () => {
  it('imports a package and calls its register(container)', async () => {
    const child = container.createChildContainer();
    await loadPluginPackages(['@specd/model-kimi-k3'], child);
    const reg = ModelRegistry.fromContainer(child);
    expect(reg.resolve(HfConfig.fromObject({ model_type: 'kimi_k3' })).name).toBe('kimi-k3');
  });
  it('names a package that cannot be imported or has no register()', async () => {
    await expect(loadPluginPackages(['@specd/no-such-plugin'])).rejects.toThrow(
      /plugin package "@specd\/no-such-plugin" cannot be imported/,
    );
    await expect(loadPluginPackages(['node:path'])).rejects.toThrow(PluginError);
  });
});

describe('plugin API version', () => {
  /** A project directory with a plugin package `name` whose register() adds a drafter declaring `version`. */
  function project(name: string, version: string): string {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-api-version-'));
    const pkg = path.join(dir, 'node_modules', name);
    fs.mkdirSync(pkg, { recursive: true });
    fs.writeFileSync(path.join(dir, 'package.json'), '{"name": "p", "private": true}');
    fs.writeFileSync(path.join(pkg, 'package.json'), JSON.stringify({ name, type: 'module', main: 'index.js' }));
    fs.writeFileSync(
      path.join(pkg, 'index.js'),
      `export function register(c) {
  c.register('specd:DrafterPlugin', { useValue: { ${version} method: 'old', architectures: [], schema: {} } });
}
`,
    );
    return dir;
  }

  it('is 1; the built-in packages declare it and load', async () => {
    expect(PLUGIN_API_VERSION).toBe(1);
    const child = container.createChildContainer();
    await loadPluginPackages(
      [
        '@specd/model-kimi-k3',
        '@specd/model-llama',
        '@specd/plugin-dflash',
        '@specd/plugin-dspark',
        '@specd/plugin-eagle3',
      ],
      child,
    );
    const all = [...ModelRegistry.fromContainer(child).plugins(), ...DrafterRegistry.fromContainer(child).plugins()];
    expect(all).toHaveLength(5);
    for (const p of all) expect(p.apiVersion).toBe(PLUGIN_API_VERSION);
  });

  it('a package whose plugin declares another version is refused at load, naming both and the package', async () => {
    const dir = project('specd-old-drafter', 'apiVersion: 0,');
    try {
      const child = container.createChildContainer();
      const load = loadPluginPackages(['specd-old-drafter'], child, dir);
      await expect(load).rejects.toThrow(PluginError);
      // nothing of the refused package was registered
      expect(
        DrafterRegistry.fromContainer(child)
          .plugins()
          .map((p) => p.method),
      ).not.toContain('old');
      await expect(loadPluginPackages(['specd-old-drafter'], container.createChildContainer(), dir)).rejects.toThrow(
        'plugin package "specd-old-drafter": drafter plugin "old" was built for plugin API version 0; ' +
          'this specd implements plugin API version 1: use a release of the package built for it',
      );
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a plugin that declares no version is refused; checkApiVersion names model plugins by name', async () => {
    const dir = project('specd-unversioned', '');
    try {
      await expect(loadPluginPackages(['specd-unversioned'], container.createChildContainer(), dir)).rejects.toThrow(
        /"specd-unversioned": drafter plugin "old" was built for no plugin API version \(apiVersion\)/,
      );
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
    expect(() => checkApiVersion({ ...fake('m', ['m'], []), apiVersion: 2 }, 'pkg')).toThrow(
      'plugin package "pkg": model plugin "m" was built for plugin API version 2; ' +
        'this specd implements plugin API version 1',
    );
    expect(() => checkApiVersion(fake('m', ['m'], []), 'pkg')).not.toThrow();
  });
});
