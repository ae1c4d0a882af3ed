// Drafter registry: every drafter under one DI token, selection by the checkpoint's
// `architectures`, and the error listing every loaded method.
import 'reflect-metadata';
import { container } from 'tsyringe';
import { describe, expect, it } from 'vitest';

import { HfConfig } from '../../src/io/index.js';
import {
  DRAFTER_PLUGIN,
  DrafterRegistry,
  PLUGIN_API_VERSION,
  PluginError,
  type DrafterPlugin,
} from '../../src/plugin/index.js';

const fake = (method: string, architectures: string[]): DrafterPlugin => ({
  apiVersion: PLUGIN_API_VERSION,
  method,
  architectures,
  schema: { properties: { method: { const: method } } },
  load: () => Promise.reject(new Error('not in this test')),
});

describe('DrafterRegistry', () => {
  it('resolves by architectures; all drafters live under DRAFTER_PLUGIN', () => {
    const child = container.createChildContainer();
    expect(DrafterRegistry.fromContainer(child).plugins()).toEqual([]);
    child.register(DRAFTER_PLUGIN, { useValue: fake('dflash', ['DFlashDraftModel']) });
    child.register(DRAFTER_PLUGIN, { useValue: fake('eagle3', ['LlamaForCausalLMEagle3']) });
    const reg = DrafterRegistry.fromContainer(child);
    expect(reg.resolve(HfConfig.fromObject({ architectures: ['LlamaForCausalLMEagle3'] })).method).toBe('eagle3');
    expect(reg.resolve(HfConfig.fromObject({ architectures: ['DFlashDraftModel'] })).method).toBe('dflash');
  });
  it('names the checkpoint and every loaded method when nothing matches', () => {
    const reg = new DrafterRegistry([fake('dflash', ['DFlashDraftModel'])]);
    expect(() => reg.resolve(HfConfig.fromObject({ architectures: ['DSparkDraftModel'] }, 'd/config.json'))).toThrow(
      'd/config.json: no drafter plugin for architectures [DSparkDraftModel]; ' +
        'loaded methods: dflash (architectures DFlashDraftModel)',
    );
    expect(() => new DrafterRegistry().resolve(HfConfig.fromObject({}))).toThrow(PluginError);
    expect(() => new DrafterRegistry().resolve(HfConfig.fromObject({}))).toThrow(/loaded methods: none/);
  });
});
