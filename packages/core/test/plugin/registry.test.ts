// Model plugin registry: resolution by model_type / architectures, the error listing what is
// loaded, tsyringe registration, and dynamic loading of plugin packages by name.
import 'reflect-metadata';
import { container } from 'tsyringe';
import { describe, expect, it } from 'vitest';

import { HfConfig } from '../../src/io/index.js';
import {
  loadPluginPackages,
  MODEL_PLUGIN,
  ModelRegistry,
  PluginError,
  type ModelPlugin,
} from '../../src/plugin/index.js';

const fake = (name: string, modelTypes: string[], architectures: string[]): ModelPlugin => ({
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
