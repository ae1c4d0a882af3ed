/**
 * `specd config schema` (the merged JSON Schema: core + every loaded drafter branch),
 * `specd config validate FILE` (prints the config with defaults filled in), and `specd plugins`
 * (loaded packages, model plugins, drafter methods).
 */

import * as path from 'node:path';

import type { Command } from 'commander';

import { configSchemaFor, loadConfig, loadPlugins } from '../config/load.js';
import { BUILTIN_PLUGIN_PACKAGES } from '../plugin/registry.js';
import type { CliIo } from './main.js';

const pluginOption = ['--plugins <names>', 'comma-separated plugin packages to load (default: the built-ins)'] as const;
const parseList = (v: string | undefined): readonly string[] =>
  v === undefined
    ? BUILTIN_PLUGIN_PACKAGES
    : v
        .split(',')
        .map((s) => s.trim())
        .filter((s) => s !== '');

/** Adds `config schema|validate` and `plugins` to the program. */
export function registerConfigCommands(program: Command, io: CliIo): void {
  const config = program.command('config').description('the deployment config: schema and validation');
  config
    .command('schema')
    .description('print the merged JSON Schema (2020-12) of the config file')
    .option(...pluginOption)
    .action(async (flags: { plugins?: string }) => {
      const plugins = await loadPlugins(parseList(flags.plugins));
      io.stdout.write(`${JSON.stringify(configSchemaFor(plugins), null, 2)}\n`);
    });
  config
    .command('validate')
    .description('validate a config file (its "plugins" are loaded first); prints it with defaults filled in')
    .argument('<file>', 'config file (JSON)')
    .option('--quiet', 'print nothing when valid')
    .action(async (file: string, flags: { quiet?: boolean }) => {
      const { config: c } = await loadConfig(path.resolve(io.cwd, file), io.cwd);
      if (flags.quiet !== true) io.stdout.write(`${JSON.stringify(c, null, 2)}\n`);
    });
  program
    .command('plugins')
    .description('list the loaded plugin packages, model plugins and drafter methods')
    .option(...pluginOption)
    .option('--json', 'one JSON object')
    .action(async (flags: { plugins?: string; json?: boolean }) => {
      const p = await loadPlugins(parseList(flags.plugins));
      const models = p.models
        .plugins()
        .map((m) => ({ name: m.name, model_types: m.modelTypes, architectures: m.architectures }));
      const drafters = p.drafters.plugins().map((d) => ({ method: d.method, architectures: d.architectures }));
      if (flags.json === true) {
        const all = [{ method: 'none', architectures: [] }, ...drafters];
        io.stdout.write(`${JSON.stringify({ packages: p.packages, models, drafters: all })}\n`);
        return;
      }
      io.stdout.write(`packages:\n${p.packages.map((n) => `  ${n}\n`).join('')}`);
      const modelLine = (m: (typeof models)[number]): string =>
        `  ${m.name} (model_type ${m.model_types.join('|')}; architectures ${m.architectures.join('|')})\n`;
      io.stdout.write(`model plugins:\n${models.map(modelLine).join('')}`);
      const drafterLine = (d: (typeof drafters)[number]): string =>
        `  ${d.method} (architectures ${d.architectures.join('|')})\n`;
      io.stdout.write(
        `drafter methods:\n  none (built in: no speculative decoding)\n${drafters.map(drafterLine).join('')}`,
      );
    });
}
