/**
 * specd-drafter-prompt-lookup — a drafter shipped as its own npm package. specd imports it by name
 * (the config's `plugins`) and calls `register(container)`, which puts {@link promptLookupPlugin}
 * under core's DRAFTER_PLUGIN token. It needs no checkpoint: a config selects it with
 * `"drafter": {"method": "prompt-lookup", …}` and core calls `loadWithoutCheckpoint`.
 */
import { DRAFTER_PLUGIN, DrafterError, type Drafter, type DrafterLoadOptions, type DrafterPlugin } from '@specd/core';
import type { DependencyContainer } from 'tsyringe';

import { parseSettings, PROMPT_LOOKUP_METHOD, PROMPT_LOOKUP_SCHEMA } from './config.js';
import { PromptLookupDrafter } from './drafter.js';

export const promptLookupPlugin: DrafterPlugin = Object.freeze({
  // the plugin API version (core's PLUGIN_API_VERSION) this plugin is built for
  apiVersion: 1,
  method: PROMPT_LOOKUP_METHOD,
  architectures: Object.freeze([]) as readonly string[],
  schema: PROMPT_LOOKUP_SCHEMA,
  load(): Promise<Drafter> {
    return Promise.reject(
      new DrafterError('prompt-lookup needs no checkpoint: select it with "drafter": {"method": "prompt-lookup"}'),
    );
  },
  loadWithoutCheckpoint(options: DrafterLoadOptions): Promise<Drafter> {
    return Promise.resolve().then(() => new PromptLookupDrafter(parseSettings(options.settings)));
  },
});

/** Registers the plugin in a tsyringe container (called by specd's plugin loader). */
export function register(container: DependencyContainer): void {
  container.register(DRAFTER_PLUGIN, { useValue: promptLookupPlugin });
}

export {
  DEFAULT_SETTINGS,
  parseSettings,
  PROMPT_LOOKUP_METHOD,
  PROMPT_LOOKUP_SCHEMA,
  type PromptLookupSettings,
} from './config.js';
export { lookupDrafts, PromptLookupDrafter } from './drafter.js';
