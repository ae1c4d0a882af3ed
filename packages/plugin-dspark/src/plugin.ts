/** The DSpark {@link DrafterPlugin}: chosen for checkpoints with `architectures ["DSparkDraftModel"]`. */
import type {
  Drafter,
  DrafterLoadOptions,
  DrafterPlugin,
  DrafterShardLoadOptions,
  DrafterSource,
  PartialProjection,
  ProjectionLoadOptions,
} from '@specd/core';
import { loadDFlashProjection } from '@specd/plugin-dflash';

import { DSPARK_ARCHITECTURES, DSPARK_SCHEMA, parseDSparkConfig } from './config.js';
import { loadDSparkDrafter, loadDSparkShard } from './dspark.js';

export const dsparkPlugin: DrafterPlugin = Object.freeze({
  // the plugin API version (core's PLUGIN_API_VERSION) this plugin is built for
  apiVersion: 1,
  method: 'dspark',
  architectures: DSPARK_ARCHITECTURES,
  schema: DSPARK_SCHEMA,
  load(source: DrafterSource, options: DrafterLoadOptions): Promise<Drafter> {
    return Promise.resolve().then(() => loadDSparkDrafter(source, parseDSparkConfig(source.config), options));
  },
  loadShard(source: DrafterSource, options: DrafterShardLoadOptions): Promise<Drafter> {
    return Promise.resolve().then(() => loadDSparkShard(source, parseDSparkConfig(source.config), options));
  },
  /** The backbone's fc blocks of the stage's taps (DSpark's context projection is DFlash's). */
  loadProjection(source: DrafterSource, options: ProjectionLoadOptions): PartialProjection {
    return loadDFlashProjection(source, parseDSparkConfig(source.config), options, 'dspark');
  },
});
