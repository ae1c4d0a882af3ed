/**
 * Loading a drafter bound to a loaded target: from a checkpoint (its plugin resolved by the
 * config.json `architectures`) or by method for a drafter without one; spread over the target's
 * tensor-parallel ranks when the target can, and with the context projection distributed over the
 * stages of a pipeline target (REFERENCE.md §8).
 */

import 'reflect-metadata';
import { container as rootContainer } from 'tsyringe';

import * as fs from 'node:fs';
import * as nodePath from 'node:path';

import type { CheckpointSanity } from '../io/checkpoint-sanity.js';
import { HfConfig } from '../io/hf-config.js';
import { SafetensorsCheckpoint } from '../io/safetensors-checkpoint.js';
import { Tokenizer } from '../io/tokenizer.js';
import type { Drafter } from '../plugin/drafter-plugin.js';
import { DrafterRegistry, loadPluginPackages, PluginError } from '../plugin/registry.js';
import { hasProjectionDistribution, isDistributedStage } from '../plugin/stage-capabilities.js';
import { checkLoadedCheckpoint, sanityOf, type LoadedTarget, type SanityLoadOptions } from './target.js';

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
 * Checkpoint sanity (`extra.checkpointSanity`, io/checkpoint-sanity.ts): a tokenizer.json in the drafter's folder
 * must equal the target's token for token ({@link checkDrafterTokenizer}); the plugin checks its vocabulary maps
 * and sizes and its reads are scanned for non-finite values; tensors it never read are named in a warning.
 * @throws {PluginError} naming the loaded methods when none matches, a method that needs a checkpoint, or a
 *   `choice.method` other than the plugin that claims the checkpoint; {CheckpointSanityError}; the plugin's errors.
 */
export async function loadDrafter(
  choice: string | DrafterChoice,
  plugins: readonly string[],
  target: LoadedTarget,
  maxTokensPerSequence: number,
  maxSequences = 1,
  extra: { readonly contextOnly?: boolean; readonly pdFeatures?: boolean } & SanityLoadOptions = {},
): Promise<LoadedDrafter> {
  const c: DrafterChoice = typeof choice === 'string' ? { dir: choice } : choice;
  const sanity = sanityOf(extra);
  const container = rootContainer.createChildContainer();
  await loadPluginPackages(plugins, container);
  const options = {
    target: target.model,
    maxSequences,
    maxTokensPerSequence,
    ...(c.settings === undefined ? {} : { settings: c.settings }),
    ...(extra.contextOnly === true ? { contextOnly: true } : {}),
    ...(extra.pdFeatures === true ? { pdFeatures: true } : {}),
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
  checkDrafterTokenizer(sanity, drafterDir, target.tokenizer);
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
      drafter = await plugin.load({ dir: drafterDir, config, weights, sanity }, options);
      // a context-only drafter (asked by the runtime, or by the config's drafter.context_only) reads part of its
      // checkpoint on purpose: no ignored-tensor warning then
      const partial = extra.contextOnly === true || c.settings?.context_only === true;
      checkLoadedCheckpoint(sanity, drafterDir, model.info.vocabSize, undefined, partial ? undefined : weights);
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
        plugin.loadProjection !== undefined && taps.length > 0
          ? { dir: drafterDir, taps, format: drafter.projectionFormat ?? 'bf16' }
          : undefined,
      );
    } catch (err) {
      drafter.dispose();
      throw err;
    }
  }
  return { drafter, dir: drafterDir };
}

/**
 * A drafter folder that ships a tokenizer.json must tokenize as the target does: the same vocabulary size and
 * the same token string at every id (a drafter trained on another tokenizer drafts ids that mean other tokens).
 * A folder without one is taken to share the target's (the plugins compare `vocab_size`).
 * @throws {CheckpointSanityError} `'vocabulary'` naming the first id that differs.
 */
export function checkDrafterTokenizer(sanity: CheckpointSanity, drafterDir: string, target: Tokenizer): void {
  if (!fs.existsSync(nodePath.join(drafterDir, 'tokenizer.json'))) return;
  const own = Tokenizer.load(drafterDir);
  const where = `${nodePath.join(drafterDir, 'tokenizer.json')}`;
  if (own.vocabSize !== target.vocabSize)
    sanity.refuse(
      'vocabulary',
      where,
      `${where}: the drafter's tokenizer has ${own.vocabSize} token ids, the target's ${target.vocabSize}`,
    );
  for (let id = 0; id < own.vocabSize; id++) {
    if (own.idToToken(id) !== target.idToToken(id))
      sanity.refuse(
        'vocabulary',
        where,
        `${where}: the drafter's tokenizer differs from the target's at id ${id} ` +
          `(${JSON.stringify(own.idToToken(id))} vs ${JSON.stringify(target.idToToken(id))})`,
      );
  }
}
