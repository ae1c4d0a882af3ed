// Loading a DFlash checkpoint: config parsing (taps = target_layer_ids + 1), registration under
// core's DRAFTER_PLUGIN token and selection by `architectures`, and the specific rejections: mask
// token outside the target vocabulary, fc width ≠ taps × hidden, taps the target does not have;
// PD hand-over calls are refused clearly.
import 'reflect-metadata';
import { container } from 'tsyringe';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { DRAFTER_PLUGIN, DrafterRegistry, HfConfig, HfConfigError, type StageModel } from '@specd/core';

import { dflashPlugin, parseDFlashConfig, register } from '../src/index.js';
import { DFLASH_DIR, loadDrafter, loadTarget } from './helpers.js';

let target: StageModel;
beforeAll(() => {
  target = loadTarget();
});
afterAll(() => target.dispose());

describe('DFlash config', () => {
  it('parses the shipped checkpoint; taps are target_layer_ids + 1 (REFERENCE.md §2)', () => {
    const c = parseDFlashConfig(HfConfig.read(DFLASH_DIR));
    expect(c.targetLayerIds).toEqual([0, 2, 4, 6]);
    expect(c.taps).toEqual([1, 3, 5, 7]);
    expect(c.blockSize).toBe(16);
    expect(c.layerTypes).toEqual(['full_attention', 'full_attention', 'sliding_attention']);
    expect(c.slidingWindow).toBe(128);
  });
  it('names the bad field', () => {
    const base = HfConfig.read(DFLASH_DIR).raw as Record<string, unknown>;
    expect(() => parseDFlashConfig(HfConfig.fromObject({ ...base, architectures: ['LlamaForCausalLM'] }))).toThrow(
      HfConfigError,
    );
    expect(() => parseDFlashConfig(HfConfig.fromObject({ ...base, layer_types: ['full_attention'] }))).toThrow(
      /layer_types.*expected 3 entries/,
    );
    expect(() => parseDFlashConfig(HfConfig.fromObject({ ...base, num_key_value_heads: 3 }))).toThrow(
      /num_key_value_heads/,
    );
  });
});

describe('DFlash registration', () => {
  it('registers under DRAFTER_PLUGIN and is selected by architectures; others list the loaded methods', () => {
    const child = container.createChildContainer();
    register(child);
    const reg = DrafterRegistry.fromContainer(child);
    expect(reg.resolve(HfConfig.read(DFLASH_DIR))).toBe(dflashPlugin);
    expect(() =>
      reg.resolve(HfConfig.fromObject({ architectures: ['LlamaForCausalLMEagle3'] }, 'e/config.json')),
    ).toThrow(
      'e/config.json: no drafter plugin for architectures [LlamaForCausalLMEagle3]; ' +
        'loaded methods: dflash (architectures DFlashDraftModel)',
    );
    expect(child.resolveAll(DRAFTER_PLUGIN)).toEqual([dflashPlugin]);
    expect(dflashPlugin.schema.properties).toHaveProperty('method');
  });
});

describe('DFlash load rejections', () => {
  const dflashConfig = (over: Record<string, unknown>) => ({
    dflash_config: { mask_token_id: 1, target_layer_ids: [0, 2, 4, 6], ...over },
  });
  it('mask token outside the target vocabulary', async () => {
    await expect(loadDrafter(target, dflashConfig({ mask_token_id: 8192 }))).rejects.toThrow(
      /mask_token_id 8192 is outside the target vocabulary \[0, 8192\)/,
    );
  });
  it('fc width ≠ taps × hidden size', async () => {
    await expect(loadDrafter(target, dflashConfig({ target_layer_ids: [0, 2, 4] }))).rejects.toThrow(
      /fc\.weight is \[256, 1024\], expected \[256, 768\] \(hidden 256, taps × hidden = 3 × 256\)/,
    );
  });
  it('taps the target does not have', async () => {
    await expect(loadDrafter(target, dflashConfig({ target_layer_ids: [0, 2, 4, 8] }))).rejects.toThrow(
      /name taps \[9\] the target does not have \(it has taps 0\.\.8, 8 layers\)/,
    );
  });
  it("a hidden size other than the target's", async () => {
    await expect(loadDrafter(target, { hidden_size: 128 })).rejects.toThrow(
      /hidden_size 128 differs from the target's 256/,
    );
  });
  it('no PD hand-over in the contract (a later capability); captureSetter returns the pinned taps', async () => {
    const d = await loadDrafter(target);
    try {
      expect(d.captureSetter(target.info)).toEqual([1, 3, 5, 7]);
      expect(() => d.captureSetter({ ...target.info, numLayers: 4 })).toThrow(
        /taps \[5, 7\] are beyond the target's 4 layers/,
      );
      expect('buildPDInput' in d || 'acceptPDInput' in d).toBe(false);
      expect(d.maxDraftTokens).toBe(15);
    } finally {
      d.dispose();
    }
  });
});
