/** The DFlash {@link DrafterPlugin}: chosen for checkpoints with `architectures ["DFlashDraftModel"]`. */
import {
  draftWeightFormat,
  type Drafter,
  type DrafterLoadOptions,
  type DrafterPlugin,
  type DrafterShardLoadOptions,
  type DrafterSource,
  type PartialProjection,
  type ProjectionLoadOptions,
} from '@specd/core';

import { DFLASH_ARCHITECTURES, DFLASH_SCHEMA, dflashConfidence, dflashDevice, parseDFlashConfig } from './config.js';
import { loadDFlash, loadDFlashProjection, loadDFlashShard } from './dflash.js';

export const dflashPlugin: DrafterPlugin = Object.freeze({
  // the plugin API version (core's PLUGIN_API_VERSION) this plugin is built for
  apiVersion: 1,
  method: 'dflash',
  architectures: DFLASH_ARCHITECTURES,
  schema: DFLASH_SCHEMA,
  load(source: DrafterSource, options: DrafterLoadOptions): Promise<Drafter> {
    return Promise.resolve().then(() =>
      loadDFlash(source, parseDFlashConfig(source.config), options, {
        contextOnly: options.contextOnly === true,
        packedHead: options.settings?.draft_head === 'packed',
        wholeVocab: options.settings?.draft_vocab === 'whole',
        device: dflashDevice(options.settings?.device),
        weights: draftWeightFormat('dflash', options.settings?.weights),
        confidence: dflashConfidence(options.settings?.confidence),
      }),
    );
  },
  loadShard(source: DrafterSource, options: DrafterShardLoadOptions): Promise<Drafter> {
    return Promise.resolve().then(() =>
      loadDFlashShard(source, parseDFlashConfig(source.config), options, {
        contextOnly: options.contextOnly === true,
        wholeVocab: options.settings?.draft_vocab === 'whole',
        weights: draftWeightFormat('dflash', options.settings?.weights),
        confidence: dflashConfidence(options.settings?.confidence),
      }),
    );
  },
  loadProjection(source: DrafterSource, options: ProjectionLoadOptions): PartialProjection {
    return loadDFlashProjection(source, parseDFlashConfig(source.config), options);
  },
});
