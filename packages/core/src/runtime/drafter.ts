/**
 * Loading a drafter bound to a loaded target: from a checkpoint (its plugin resolved by the
 * config.json `architectures`) or by method for a drafter without one; spread over the target's
 * tensor-parallel ranks when the target can, and with the context projection distributed over the
 * stages of a pipeline target (REFERENCE.md §8).
 */

import 'reflect-metadata';
import { container as rootContainer } from 'tsyringe';

import { HfConfig } from '../io/hf-config.js';
import { SafetensorsCheckpoint } from '../io/safetensors-checkpoint.js';
import type { Drafter } from '../plugin/drafter-plugin.js';
import { DrafterRegistry, loadPluginPackages, PluginError } from '../plugin/registry.js';
import { hasProjectionDistribution, isDistributedStage } from '../plugin/stage-capabilities.js';
import type { LoadedTarget } from './target.js';

/**
 * The drafter to load: its checkpoint (absent: a method without one, chosen by `method`), the method
 * the config asked for (checked after loading), its draft cap, the config's `drafter` object.
 */
export interface DrafterChoice {
  readonly dir?: string;
  readonly method?: string;
  readonly numDraftTokens?: number;
  readonly settings?: Readonly<Record<string, unknown>>;
}

/** A loaded drafter bound to a target. */
export interface LoadedDrafter {
  readonly drafter: Drafter;
  /** Its checkpoint directory; absent for a method without one. */
  readonly dir?: string;
}

/**
 * Imports the plugin packages and loads a drafter for `target` (room for `maxSequences` sequences of
 * `maxTokensPerSequence`): from a checkpoint directory (a string, or a choice with `dir`), resolving
 * the plugin by its config.json `architectures`; or, for a choice without `dir`, the plugin of
 * `choice.method` through its `loadWithoutCheckpoint`. A {@link DistributedStage} target (tensor
 * parallel, or a pipeline whose last stage is) loads the drafter spread over its ranks when the plugin
 * has `loadShard`; otherwise the drafter is loaded whole here. On a target split into stages (a
 * pipeline: {@link ProjectionDistribution}) whose drafter plugin has `loadProjection`, every stage that
 * produces taps then loads its share of the projection and projects its taps itself.
 * @throws {PluginError} naming the loaded methods when none matches, a method that needs a checkpoint, or a
 *   `choice.method` other than the plugin that claims the checkpoint; the plugin's errors.
 */
export async function loadDrafter(
  choice: string | DrafterChoice,
  plugins: readonly string[],
  target: LoadedTarget,
  maxTokensPerSequence: number,
  maxSequences = 1,
  extra: { readonly contextOnly?: boolean } = {},
): Promise<LoadedDrafter> {
  const c: DrafterChoice = typeof choice === 'string' ? { dir: choice } : choice;
  const container = rootContainer.createChildContainer();
  await loadPluginPackages(plugins, container);
  const options = {
    target: target.model,
    maxSequences,
    maxTokensPerSequence,
    ...(c.settings === undefined ? {} : { settings: c.settings }),
    ...(extra.contextOnly === true ? { contextOnly: true } : {}),
  };
  const drafterDir = c.dir;
  if (drafterDir === undefined) {
    if (c.method === undefined) throw new PluginError('drafter: neither a checkpoint directory nor a method');
    const plugin = DrafterRegistry.fromContainer(container).resolveMethod(c.method);
    if (plugin.loadWithoutCheckpoint === undefined)
      throw new PluginError(`drafter: method ${JSON.stringify(c.method)} needs a checkpoint: give "path"`);
    return { drafter: await plugin.loadWithoutCheckpoint(options) };
  }
  const config = HfConfig.read(drafterDir);
  const plugin = DrafterRegistry.fromContainer(container).resolve(config);
  if (c.method !== undefined && c.method !== plugin.method) {
    throw new PluginError(
      `drafter: method ${JSON.stringify(c.method)}, but ${config.file} ` +
        `(architectures [${config.architectures.join(', ')}]) is a ${JSON.stringify(plugin.method)} checkpoint; ` +
        `set "method": ${JSON.stringify(plugin.method)} or point "path" at a ${c.method} checkpoint`,
    );
  }
  // a target spread over tensor-parallel ranks loads the drafter spread the same way (if its plugin can)
  const { target: _whole, ...spreadOptions } = options;
  const model = target.model;
  let drafter = isDistributedStage(model) ? await model.loadDrafter(drafterDir, plugins, spreadOptions) : undefined;
  if (drafter === undefined) {
    const weights = SafetensorsCheckpoint.open(drafterDir);
    try {
      drafter = await plugin.load({ dir: drafterDir, config, weights }, options);
    } finally {
      weights.close();
    }
  }
  // A pipeline: the stages that produce taps project them in place (REFERENCE.md §8).
  // (A plugin without loadProjection resets the stages to shipping raw taps.)
  const taps = drafter.captureSetter(model.info);
  if (hasProjectionDistribution(model)) {
    try {
      model.distributeProjection(
        plugin.loadProjection !== undefined && taps.length > 0 ? { dir: drafterDir, taps } : undefined,
      );
    } catch (err) {
      drafter.dispose();
      throw err;
    }
  }
  return { drafter, dir: drafterDir };
}
