// Plugin registration and config parsing: the built-in plugin list resolves the shipped DSpark
// checkpoint (architectures ["DSparkDraftModel"]) to this plugin, and bad configs are refused.
import { describe, expect, it } from 'vitest';

import { HfConfig, loadPlugins } from '@specd/core';

import { dsparkPlugin, parseDSparkConfig } from '../src/index.js';
import { DSPARK_DIR } from './helpers.js';

describe('DSpark plugin', () => {
  it('the built-in plugins resolve the DSpark checkpoint to method dspark (and DFlash stays DFlash)', async () => {
    const p = await loadPlugins();
    const cfg = HfConfig.read(DSPARK_DIR);
    expect(p.drafters.resolve(cfg).method).toBe('dspark');
    expect(p.drafters.resolveMethod('dspark').architectures).toEqual(dsparkPlugin.architectures);
    expect(
      p.drafters.resolve(HfConfig.fromObject({ ...(cfg.raw as object), architectures: ['DFlashDraftModel'] }, 'x'))
        .method,
    ).toBe('dflash');
  });

  it(
    'parses block 7, markov rank 64, the DFlash backbone fields; ' +
      'refuses a DFlash checkpoint or a missing dspark_config',
    () => {
      const raw = HfConfig.read(DSPARK_DIR).raw as Record<string, unknown>;
      const c = parseDSparkConfig(HfConfig.fromObject(raw, 'config.json'));
      expect(c.blockSize).toBe(7);
      expect(c.markovRank).toBe(64);
      expect(c.taps).toEqual([2, 4, 6, 7]);
      expect(() =>
        parseDSparkConfig(HfConfig.fromObject({ ...raw, architectures: ['DFlashDraftModel'] }, 'config.json')),
      ).toThrow(/architectures/);
      const { dspark_config: _, ...noSection } = raw;
      expect(() => parseDSparkConfig(HfConfig.fromObject(noSection, 'config.json'))).toThrow(/dspark_config/);
    },
  );
});
