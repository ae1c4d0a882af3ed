/**
 * Plugin registration (tsyringe) and resolution.
 *
 * A plugin package exports `register(container)` which registers its {@link ModelPlugin} under
 * {@link MODEL_PLUGIN}. The CLI imports the configured package names (defaults:
 * {@link BUILTIN_PLUGIN_PACKAGES}) with a dynamic `import()`: core never imports a plugin statically.
 */

import { createRequire } from 'node:module';
import * as path from 'node:path';
import { pathToFileURL } from 'node:url';

import 'reflect-metadata';
import { container as rootContainer, type DependencyContainer, type InjectionToken } from 'tsyringe';

import type { GgufFile } from '../io/gguf.js';
import type { HfConfig } from '../io/hf-config.js';
import type { DrafterPlugin } from './drafter-plugin.js';
import type { ModelPlugin } from './model-plugin.js';

/**
 * The plugin API version of this core: the version of the contracts a plugin implements (model-plugin.ts,
 * drafter-plugin.ts, drafter-base.ts). Every {@link ModelPlugin} and {@link DrafterPlugin} declares the
 * version it was built for (`apiVersion`); {@link loadPluginPackages} refuses a package whose plugins declare
 * another. It grows by one whenever a contract changes in a way a built plugin would not follow
 * (a method added, removed or changed in meaning); a change a built plugin keeps working with leaves it.
 */
export const PLUGIN_API_VERSION = 1;

/** DI token under which every model plugin is registered (`container.resolveAll`). */
export const MODEL_PLUGIN: InjectionToken<ModelPlugin> = 'specd:ModelPlugin';

/** DI token under which every drafter plugin is registered (`container.resolveAll`). */
export const DRAFTER_PLUGIN: InjectionToken<DrafterPlugin> = 'specd:DrafterPlugin';

/** Plugin packages loaded when the config names none. */
export const BUILTIN_PLUGIN_PACKAGES: readonly string[] = Object.freeze([
  '@specd/model-kimi-k3',
  '@specd/model-llama',
  '@specd/plugin-dflash',
  '@specd/plugin-dspark',
  '@specd/plugin-eagle3',
]);

/** Thrown when no plugin matches a config, or a plugin package cannot be loaded (or targets another API version). */
export class PluginError extends Error {
  override readonly name = 'PluginError';
}

/** The model plugins registered in a container. */
export class ModelRegistry {
  private readonly list: ModelPlugin[];

  constructor(plugins: readonly ModelPlugin[] = []) {
    this.list = [...plugins];
  }

  /** All model plugins registered in `container` under {@link MODEL_PLUGIN}. */
  static fromContainer(container: DependencyContainer = rootContainer): ModelRegistry {
    return new ModelRegistry(container.isRegistered(MODEL_PLUGIN, true) ? container.resolveAll(MODEL_PLUGIN) : []);
  }

  /** Adds a plugin. */
  register(plugin: ModelPlugin): void {
    this.list.push(plugin);
  }

  /** Registered plugins, in registration order. */
  plugins(): readonly ModelPlugin[] {
    return this.list;
  }

  /**
   * The plugin for a config: the first whose `modelTypes` contains `model_type`, else the first
   * whose `architectures` intersects the config's.
   * @throws {PluginError} naming the config's model_type / architectures and every loaded plugin.
   */
  resolve(config: HfConfig): ModelPlugin {
    const type = config.modelType;
    const archs = config.architectures;
    const byType = type === undefined ? undefined : this.list.find((p) => p.modelTypes.includes(type));
    const found = byType ?? this.list.find((p) => p.architectures.some((a) => archs.includes(a)));
    if (found !== undefined) return found;
    const loaded =
      this.list.length === 0
        ? 'none'
        : this.list
            .map((p) => `${p.name} (model_type ${p.modelTypes.join('|')}; architectures ${p.architectures.join('|')})`)
            .join(', ');
    throw new PluginError(
      `${config.file}: no model plugin for model_type ${JSON.stringify(type ?? null)} / ` +
        `architectures [${archs.join(', ')}]; loaded: ${loaded}`,
    );
  }

  /**
   * The plugin for a GGUF file: the first whose `ggufArchitectures` contains its `general.architecture`.
   * @throws {PluginError} naming the file's architecture and every loaded plugin's GGUF architectures.
   */
  resolveGguf(file: GgufFile): ModelPlugin & Pick<Required<ModelPlugin>, 'loadGguf'> {
    const arch = file.has('general.architecture') ? file.getString('general.architecture') : undefined;
    const found =
      arch === undefined
        ? undefined
        : this.list.find(
            (p): p is ModelPlugin & Pick<Required<ModelPlugin>, 'loadGguf'> =>
              p.loadGguf !== undefined && (p.ggufArchitectures ?? []).includes(arch),
          );
    if (found !== undefined) return found;
    const loaded =
      this.list.length === 0
        ? 'none'
        : this.list
            .map((p) => `${p.name} (GGUF architectures ${(p.ggufArchitectures ?? []).join('|') || 'none'})`)
            .join(', ');
    throw new PluginError(
      `${file.file}: no model plugin loads GGUF architecture ${JSON.stringify(arch ?? null)}; loaded: ${loaded}`,
    );
  }
}

/**
 * Where `name` resolves from the project directory `from` (its node_modules and those above), or
 * undefined when it is not installed there (then core's own resolution applies).
 */
function resolveFromProject(name: string, from: string): string | undefined {
  try {
    return pathToFileURL(createRequire(path.join(from, 'package.json')).resolve(name)).href;
  } catch {
    return undefined;
  }
}

/**
 * Imports plugin packages by name and calls each one's exported `register(container)`. A name is
 * resolved first from the project (`from`, default the working directory: a package installed next
 * to specd), then from core's own location (the built-ins).
 * @throws {PluginError} naming the package that cannot be imported or has no `register` function, or
 *   one of whose plugins was built for another plugin API version (nothing of that package is registered).
 */
export async function loadPluginPackages(
  names: readonly string[],
  container: DependencyContainer = rootContainer,
  from: string = process.cwd(),
): Promise<void> {
  for (const name of names) {
    let mod: { register?: unknown };
    try {
      mod = (await import(resolveFromProject(name, from) ?? name)) as { register?: unknown };
    } catch (cause) {
      throw new PluginError(`plugin package ${JSON.stringify(name)} cannot be imported: ${(cause as Error).message}`, {
        cause,
      });
    }
    if (typeof mod.register !== 'function')
      throw new PluginError(`plugin package ${JSON.stringify(name)} exports no register(container) function`);
    const register = mod.register as (c: DependencyContainer) => void;
    // the package registers into a scratch child first: a plugin built for another API version is refused
    // before anything of the package reaches `container`
    const probe = container.createChildContainer();
    register(probe);
    for (const plugin of ownPlugins(probe)) checkApiVersion(plugin, name);
    register(container);
  }
}

/** The model and drafter plugins registered in `container` itself (not its parents). */
function ownPlugins(container: DependencyContainer): (ModelPlugin | DrafterPlugin)[] {
  return [
    ...(container.isRegistered(MODEL_PLUGIN, false) ? container.resolveAll<ModelPlugin>(MODEL_PLUGIN) : []),
    ...(container.isRegistered(DRAFTER_PLUGIN, false) ? container.resolveAll<DrafterPlugin>(DRAFTER_PLUGIN) : []),
  ];
}

/**
 * Refuses a plugin built for another plugin API version than {@link PLUGIN_API_VERSION}.
 * @param packageName the package that registered it (for the message).
 * @throws {PluginError} naming the package, the plugin and both versions.
 */
export function checkApiVersion(plugin: ModelPlugin | DrafterPlugin, packageName: string): void {
  const version = (plugin as { apiVersion?: unknown }).apiVersion;
  if (version === PLUGIN_API_VERSION) return;
  const what = 'method' in plugin ? `drafter plugin "${plugin.method}"` : `model plugin "${plugin.name}"`;
  const built = typeof version === 'number' ? `plugin API version ${version}` : 'no plugin API version (apiVersion)';
  throw new PluginError(
    `plugin package ${JSON.stringify(packageName)}: ${what} was built for ${built}; ` +
      `this specd implements plugin API version ${PLUGIN_API_VERSION}: use a release of the package built for it`,
  );
}

/** The drafter plugins registered in a container; a checkpoint picks one by its `architectures`. */
export class DrafterRegistry {
  private readonly list: DrafterPlugin[];

  constructor(plugins: readonly DrafterPlugin[] = []) {
    this.list = [...plugins];
  }

  /** All drafter plugins registered in `container` under {@link DRAFTER_PLUGIN}. */
  static fromContainer(container: DependencyContainer = rootContainer): DrafterRegistry {
    return new DrafterRegistry(
      container.isRegistered(DRAFTER_PLUGIN, true) ? container.resolveAll(DRAFTER_PLUGIN) : [],
    );
  }

  /** Adds a plugin. */
  register(plugin: DrafterPlugin): void {
    this.list.push(plugin);
  }

  /** Registered plugins, in registration order. */
  plugins(): readonly DrafterPlugin[] {
    return this.list;
  }

  /**
   * The drafter for a checkpoint config: the first plugin whose `architectures` intersects the config's.
   * @throws {PluginError} naming the config's architectures and every loaded method.
   */
  resolve(config: HfConfig): DrafterPlugin {
    const archs = config.architectures;
    const found = this.list.find((p) => p.architectures.some((a) => archs.includes(a)));
    if (found !== undefined) return found;
    const loaded =
      this.list.length === 0
        ? 'none'
        : this.list.map((p) => `${p.method} (architectures ${p.architectures.join('|')})`).join(', ');
    throw new PluginError(
      `${config.file}: no drafter plugin for architectures [${archs.join(', ')}]; loaded methods: ${loaded}`,
    );
  }

  /**
   * The drafter for a method name (a config's `drafter.method`), used when there is no checkpoint to resolve by.
   * @throws {PluginError} listing every loaded method.
   */
  resolveMethod(method: string): DrafterPlugin {
    const found = this.list.find((p) => p.method === method);
    if (found !== undefined) return found;
    throw new PluginError(
      `no drafter plugin for method ${JSON.stringify(method)}; ` +
        `loaded methods: ${this.list.length === 0 ? 'none' : this.list.map((p) => p.method).join(', ')}`,
    );
  }
}
