// Plugins as packages: the example drafter examples/drafter-prompt-lookup is packed
// with `npm pack` (offline), installed into a temporary project next to specd, and loaded by name
// from a config's `plugins`; core itself never names it.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const EXAMPLE = path.join(ROOT, 'examples/drafter-prompt-lookup');
const BIN = path.join(ROOT, 'packages/core/src/cli/bin.js');
const MODEL = path.join(ROOT, 'models/kimi-k3-tiny');
const PKG = 'specd-drafter-prompt-lookup';
// Repetitive, so n-gram lookup finds matches in the prompt and in the (looping) greedy output.
const PROMPT = 'one two three four five one two three four five one two three four five one two three';

let project: string;

function npm(args: readonly string[], cwd: string): string {
  const env = {
    ...process.env,
    npm_config_audit: 'false',
    npm_config_fund: 'false',
    npm_config_update_notifier: 'false',
    npm_config_offline: 'true',
  };
  const r = spawnSync(process.platform === 'win32' ? 'npm.cmd' : 'npm', [...args], { cwd, encoding: 'utf8', env });
  if (r.status !== 0)
    throw new Error(`npm ${args.join(' ')} (in ${cwd}) failed: ${r.status}\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

function specd(args: readonly string[]): { stdout: string; stderr: string; status: number | null } {
  const r = spawnSync(process.execPath, [BIN, ...args], { cwd: project, encoding: 'utf8' });
  return { stdout: r.stdout, stderr: r.stderr, status: r.status };
}

function listFiles(dir: string): string[] {
  return fs
    .readdirSync(dir, { withFileTypes: true })
    .flatMap((e) => (e.isDirectory() ? listFiles(path.join(dir, e.name)) : [path.join(dir, e.name)]));
}

describe('a drafter plugin as an npm package (examples/drafter-prompt-lookup)', () => {
  beforeAll(() => {
    project = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-plugin-package-'));
    // `npm pack` runs the example's prepack script (tsc → dist/); the tarball goes to the project.
    const packed = npm(['pack', '--offline', '--silent', '--pack-destination', project], EXAMPLE)
      .trim()
      .split('\n')
      .pop()!;
    const tarball = path.join(project, packed);
    expect(fs.existsSync(tarball)).toBe(true);
    fs.writeFileSync(
      path.join(project, 'package.json'),
      JSON.stringify({ name: 'specd-plugin-project', version: '0.0.0', private: true, type: 'module' }),
    );
    // --legacy-peer-deps: the peer @specd/core is not fetched from a registry; it is linked below.
    npm(
      [
        'install',
        '--offline',
        '--no-audit',
        '--no-fund',
        '--legacy-peer-deps',
        '--ignore-scripts',
        '--no-package-lock',
        tarball,
      ],
      project,
    );
    fs.mkdirSync(path.join(project, 'node_modules/@specd'), { recursive: true });
    fs.symlinkSync(path.join(ROOT, 'packages/core'), path.join(project, 'node_modules/@specd/core'), 'dir');
    fs.writeFileSync(
      path.join(project, 'specd.json'),
      JSON.stringify({
        model: MODEL,
        drafter: { method: 'prompt-lookup', num_draft_tokens: 4, min_ngram: 1, max_ngram: 3 },
        plugins: [PKG, '@specd/model-kimi-k3', '@specd/plugin-dflash'],
      }),
    );
  });

  afterAll(() => {
    if (project !== undefined) fs.rmSync(project, { recursive: true, force: true });
  });

  it('is installed in the project (not in the repository) with a built dist/', () => {
    const installed = path.join(project, 'node_modules', PKG);
    expect(fs.existsSync(path.join(installed, 'dist/index.js'))).toBe(true);
    expect(fs.existsSync(path.join(installed, 'dist/index.d.ts'))).toBe(true);
    expect(fs.existsSync(path.join(ROOT, 'node_modules', PKG))).toBe(false);
    const root = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { workspaces: string[] };
    expect(root.workspaces.some((w) => w.startsWith('examples'))).toBe(false);
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
    expect(s.drafted!).toBeGreaterThan(0);
    expect(s.accepted!).toBeGreaterThan(0);
    expect(s.verify_steps!).toBeLessThan(48);
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
