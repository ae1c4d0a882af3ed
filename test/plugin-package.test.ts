// Plugins as packages, exactly as docs/PLUGINS.md §5 says: `npm run pack` makes specd's tarballs (core with its
// dependencies bundled, native with its built addon, the model and drafter packages), the example drafter
// examples/drafter-prompt-lookup is packed with `npm pack`, all are installed offline with `--ignore-scripts` into a
// fresh folder (`npm init -y`), and `npx specd` there loads the drafter by name from a config's `plugins`; core
// itself never names it.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const EXAMPLE = path.join(ROOT, 'examples/drafter-prompt-lookup');
const MODEL = path.join(ROOT, 'models/kimi-k3-tiny');
const PKG = 'specd-drafter-prompt-lookup';
// Repetitive, so n-gram lookup finds matches in the prompt and in the (looping) greedy output.
const PROMPT = 'one two three four five one two three four five one two three four five one two three';
// npm pack, install and a cold start of the installed CLI on a busy machine
const SETUP_MS = 600_000;

let scratch: string;
let project: string;

const NPM = process.platform === 'win32' ? 'npm.cmd' : 'npm';
const NPX = process.platform === 'win32' ? 'npx.cmd' : 'npx';
// no registry: every install below must come from the tarballs alone
const OFFLINE = {
  ...process.env,
  npm_config_audit: 'false',
  npm_config_fund: 'false',
  npm_config_update_notifier: 'false',
  npm_config_offline: 'true',
};

function npm(args: readonly string[], cwd: string): string {
  const r = spawnSync(NPM, [...args], { cwd, encoding: 'utf8', env: OFFLINE });
  if (r.status !== 0)
    throw new Error(`npm ${args.join(' ')} (in ${cwd}) failed: ${r.status}\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

/** `npx specd ARGS` in the project: the installed package's bin, not the repository's. */
function specd(args: readonly string[]): { stdout: string; stderr: string; status: number | null } {
  const r = spawnSync(NPX, ['specd', ...args], { cwd: project, encoding: 'utf8', env: OFFLINE });
  return { stdout: r.stdout, stderr: r.stderr, status: r.status };
}

function listFiles(dir: string): string[] {
  return fs
    .readdirSync(dir, { withFileTypes: true })
    .flatMap((e) => (e.isDirectory() ? listFiles(path.join(dir, e.name)) : [path.join(dir, e.name)]));
}

describe('specd and a drafter plugin as npm packages (docs/PLUGINS.md §5)', () => {
  beforeAll(() => {
    // a fresh folder whose name is a valid package name (npm init -y takes it)
    scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-plugin-package-'));
    project = path.join(scratch, 'project');
    fs.mkdirSync(project);
    const packs = path.join(project, 'packs');
    // in the repository: specd's tarballs, then the example's (its prepack script builds dist/)
    npm(['run', 'pack', '--', '--out', packs], ROOT);
    const packed = npm(['pack', '--silent', '--pack-destination', project], EXAMPLE).trim().split('\n').pop() ?? '';
    expect(packed).toBe(`${PKG}-0.1.0.tgz`);
    // in the fresh folder
    npm(['init', '-y'], project);
    npm(
      [
        'install',
        '--offline',
        '--ignore-scripts',
        './packs/specd-core-0.1.0.tgz',
        './packs/specd-native-0.1.0.tgz',
        './packs/specd-model-kimi-k3-0.1.0.tgz',
        './packs/specd-plugin-dflash-0.1.0.tgz',
        `./${packed}`,
      ],
      project,
    );
    fs.writeFileSync(
      path.join(project, 'specd.json'),
      JSON.stringify({
        model: MODEL,
        drafter: { method: 'prompt-lookup', num_draft_tokens: 4, min_ngram: 1, max_ngram: 3 },
        plugins: [PKG, '@specd/model-kimi-k3', '@specd/plugin-dflash'],
      }),
    );
  }, SETUP_MS);

  afterAll(() => {
    if (scratch !== undefined) fs.rmSync(scratch, { recursive: true, force: true });
  });

  it('installs from the tarballs alone: real folders (no links), the built addon inside, dist/ built', () => {
    const modules = path.join(project, 'node_modules');
    for (const name of ['@specd/core', '@specd/native', '@specd/model-kimi-k3', '@specd/plugin-dflash', PKG])
      expect(fs.lstatSync(path.join(modules, name)).isSymbolicLink(), name).toBe(false);
    expect(fs.existsSync(path.join(modules, '@specd/native/build/Release/specd_native.node'))).toBe(true);
    expect(fs.existsSync(path.join(modules, '@specd/core/node_modules/fastify/package.json'))).toBe(true);
    expect(fs.existsSync(path.join(modules, PKG, 'dist/index.js'))).toBe(true);
    expect(fs.existsSync(path.join(modules, PKG, 'dist/index.d.ts'))).toBe(true);
    expect(fs.existsSync(path.join(ROOT, 'node_modules', PKG))).toBe(false);
    const root = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { workspaces: string[] };
    expect(root.workspaces.some((w) => w.startsWith('examples'))).toBe(false);
    const v = specd(['--version']);
    expect(v.status, v.stderr).toBe(0);
    expect(v.stdout).toMatch(/0\.1\.0/);
  });

  it('is loaded by name: `specd plugins` lists its method and the config validates', () => {
    const r = specd(['plugins', '--plugins', `${PKG},@specd/model-kimi-k3`, '--json']);
    expect(r.status, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout) as { drafters: { method: string }[] };
    expect(out.drafters.map((d) => d.method)).toContain('prompt-lookup');
    const v = specd(['config', 'validate', 'specd.json']);
    expect(v.status, v.stderr + v.stdout).toBe(0);
    fs.writeFileSync(
      path.join(project, 'bad.json'),
      JSON.stringify({ drafter: { method: 'prompt-lookup', min_ngram: 0 }, plugins: [PKG, '@specd/model-kimi-k3'] }),
    );
    const bad = specd(['config', 'validate', 'bad.json']);
    expect(bad.status).toBe(1);
    expect(bad.stderr).toMatch(/min_ngram/);
  });

  it('declares the plugin API version it is built for; a build for another version is refused at load', () => {
    const installed = path.join(project, 'node_modules', PKG);
    const index = fs.readFileSync(path.join(installed, 'dist/index.js'), 'utf8');
    expect(index).toMatch(/apiVersion: 1,/);
    // the same package as if built for a future core: another directory name, apiVersion 2
    const old = path.join(project, 'node_modules', `${PKG}-v2`);
    fs.cpSync(installed, old, { recursive: true });
    fs.writeFileSync(path.join(old, 'dist/index.js'), index.replace('apiVersion: 1,', 'apiVersion: 2,'));
    const r = specd(['plugins', '--plugins', `${PKG}-v2,@specd/model-kimi-k3`, '--json']);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain(
      `plugin package "${PKG}-v2": drafter plugin "prompt-lookup" was built for plugin API version 2; ` +
        'this specd implements plugin API version 1',
    );
  });

  it('greedy output equals --no-spec output, with drafts made and some accepted', () => {
    const common = [
      'generate',
      '--config',
      'specd.json',
      '--prompt',
      PROMPT,
      '--max-tokens',
      '48',
      '--temperature',
      '0',
      '--ignore-eos',
      '--json',
    ];
    const spec = specd(common);
    expect(spec.status, spec.stderr).toBe(0);
    const plain = specd([...common, '--no-spec']);
    expect(plain.status, plain.stderr).toBe(0);
    const s = JSON.parse(spec.stdout) as {
      token_ids: number[];
      method?: string;
      drafted?: number;
      accepted?: number;
      verify_steps?: number;
    };
    const p = JSON.parse(plain.stdout) as { token_ids: number[]; method?: string };
    expect(s.method).toBe('prompt-lookup');
    expect(p.method).toBeUndefined();
    expect(s.token_ids).toHaveLength(48);
    expect(s.token_ids).toEqual(p.token_ids);
    expect(s.drafted ?? 0).toBeGreaterThan(0);
    expect(s.accepted ?? 0).toBeGreaterThan(0);
    expect(s.verify_steps ?? Number.POSITIVE_INFINITY).toBeLessThan(48);
  });

  it("the packed DFlash package loads by name from the project: the drafter's greedy output equals --no-spec", () => {
    fs.writeFileSync(
      path.join(project, 'dflash.json'),
      JSON.stringify({
        model: MODEL,
        drafter: { method: 'dflash', path: path.join(ROOT, 'models/kimi-k3-tiny-dflash'), num_draft_tokens: 4 },
        plugins: ['@specd/model-kimi-k3', '@specd/plugin-dflash'],
      }),
    );
    const common = ['generate', '--config', 'dflash.json', '--prompt', PROMPT, '--max-tokens', '16'];
    const args = [...common, '--temperature', '0', '--ignore-eos', '--json'];
    const spec = specd(args);
    expect(spec.status, spec.stderr).toBe(0);
    const plain = specd([...args, '--no-spec']);
    expect(plain.status, plain.stderr).toBe(0);
    const s = JSON.parse(spec.stdout) as { token_ids: number[]; method?: string; drafted?: number };
    const p = JSON.parse(plain.stdout) as { token_ids: number[] };
    expect(s.method).toBe('dflash');
    expect(s.drafted ?? 0).toBeGreaterThan(0);
    expect(s.token_ids).toHaveLength(16);
    expect(s.token_ids).toEqual(p.token_ids);
  });

  it('a method without a checkpoint that the loaded plugins do not provide is a one-line error', () => {
    fs.writeFileSync(
      path.join(project, 'missing.json'),
      JSON.stringify({ model: MODEL, drafter: { method: 'prompt-lookup' }, plugins: ['@specd/model-kimi-k3'] }),
    );
    const r = specd(['generate', '--config', 'missing.json', '--prompt', 'x', '--max-tokens', '2']);
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/^specd: error: /);
  });

  it(
    'drafts as vLLM ngram: longest suffix n-gram first, ' + 'most recent match, at most k, none without a match',
    async () => {
      const mod = (await import(pathToFileURL(path.join(project, 'node_modules', PKG, 'dist/index.js')).href)) as {
        lookupDrafts(h: Int32Array, k: number, minN: number, maxN: number): Int32Array;
      };
      const d = (h: number[], k: number, minN: number, maxN: number): number[] => [
        ...mod.lookupDrafts(Int32Array.from(h), k, minN, maxN),
      ];
      // suffix [1, 2]: earlier at 0 (→ 3, 4) and at 4 (→ 5, 1); the most recent wins
      expect(d([1, 2, 3, 4, 1, 2, 5, 1, 2], 2, 1, 3)).toEqual([5, 1]);
      // the 3-gram [9, 1, 2] matches at 0 (→ 7) before the more recent 2-gram match
      expect(d([9, 1, 2, 7, 1, 2, 8, 9, 1, 2], 1, 1, 3)).toEqual([7]);
      expect(d([9, 1, 2, 7, 1, 2, 8, 9, 1, 2], 1, 1, 2)).toEqual([8]);
      expect(d([1, 2, 3, 1], 8, 1, 3)).toEqual([2, 3, 1]);
      expect(d([1, 2, 3, 4], 4, 1, 3)).toEqual([]);
      expect(d([1, 2, 3, 4, 2, 3], 4, 3, 3)).toEqual([]);
    },
  );

  it("core's sources never name the example", () => {
    const offenders = listFiles(path.join(ROOT, 'packages/core/src')).filter((f) =>
      /prompt-lookup|specd-drafter-prompt-lookup/.test(fs.readFileSync(f, 'utf8')),
    );
    expect(offenders).toEqual([]);
  });
});
