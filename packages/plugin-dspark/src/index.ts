/**
 * @specd/plugin-dspark — the DSpark drafter (DFlash backbone from @specd/plugin-dflash + next-token
 * slots, Markov head, confidence head).
 * Registration: `register(container)` puts {@link dsparkPlugin} under core's DRAFTER_PLUGIN token.
 */
import { DRAFTER_PLUGIN } from '@specd/core';
import type { DependencyContainer } from 'tsyringe';

import { dsparkPlugin } from './plugin.js';

/** Registers the plugin in a tsyringe container. */
export function register(container: DependencyContainer): void {
  container.register(DRAFTER_PLUGIN, { useValue: dsparkPlugin });
}

export { dsparkPlugin } from './plugin.js';
export { DSPARK_ARCHITECTURES, DSPARK_SCHEMA, parseDSparkConfig, type DSparkConfig } from './config.js';
export { DSparkDrafter, loadDSparkDrafter, loadDSparkShard, type DSparkHeads } from './dspark.js';
