#!/usr/bin/env node
// `npm run pack [-- --out DIR]`: npm tarballs of specd's packages, installable offline and without install scripts
// (docs/PLUGINS.md §5): @specd/native (its built addon build/Release/specd_native.node inside, so nothing compiles
// at install), @specd/core (its third-party dependencies bundled, so no registry is needed), the model packages
// (@specd/model-kimi-k3, @specd/model-llama) and the drafter packages (@specd/plugin-dflash, @specd/plugin-dspark,
// @specd/plugin-eagle3). Run `npm run build` first: the tarballs carry the built dist/ folders, not sources.
//
// Each package is staged in a scratch folder (under the OS temp folder, removed at the end), its package.json
// rewritten for publishing — the workspaces' `"*"` versions of @specd packages pinned to the packed version,
// @specd/native added to core's dependencies (a workspace finds it by hoisting), native's build tools dropped
// (cmake-js, node-addon-api: the addon is built) and its scripts removed — then `npm pack --ignore-scripts` writes
// `<out>/specd-<name>-<version>.tgz` (default out: .cache/packs, git-ignored). The repository's own package.json
// files are not changed.
// Core's bundled dependencies are copied from the repository's node_modules (npm ci's tree) with Node's resolution:
// each dependency from the folder of the package that requires it, hoisted to the staged node_modules unless
// another version already sits there (then nested under the package that requires it).
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const outArg = argv.indexOf('--out');
const OUT = path.resolve(outArg < 0 ? path.join(ROOT, '.cache/packs') : argv[outArg + 1]);
// a scratch folder of its own, so two runs never share one
const STAGE = fs.mkdtempSync(path.join(tmpdir(), 'specd-pack-'));

/** The packages packed, by folder. */
const PACKAGES = [
  'native',
  'packages/core',
  'packages/model-kimi-k3',
  'packages/model-llama',
  'packages/plugin-dflash',
  'packages/plugin-dspark',
  'packages/plugin-eagle3',
];

const readJson = (file) => JSON.parse(fs.readFileSync(file, 'utf8'));
const versions = Object.fromEntries(
  PACKAGES.map((dir) => readJson(path.join(ROOT, dir, 'package.json'))).map((p) => [p.name, p.version]),
);

/** The folder of package `name` as Node resolves it from `fromDir` (node_modules of it and its parents). */
function packageDir(name, fromDir) {
  for (let dir = fromDir; ; dir = path.dirname(dir)) {
    const candidate = path.join(dir, 'node_modules', name);
    if (fs.existsSync(path.join(candidate, 'package.json'))) return fs.realpathSync(candidate);
    if (path.dirname(dir) === dir) throw new Error(`pack: ${name} (required from ${fromDir}) is not installed`);
  }
}

/**
 * Copies the dependency closure of `deps` (resolved from `fromDir`) into `stageDir`'s node_modules: hoisted to
 * `stageDir/node_modules` unless another version is there, else nested in `nestDir/node_modules`.
 * `placed` maps a staged folder to the source folder copied there.
 */
function copyClosure(deps, fromDir, stageDir, nestDir, placed) {
  for (const name of deps) {
    const src = packageDir(name, fromDir);
    const hoisted = path.join(stageDir, 'node_modules', name);
    let dest = hoisted;
    if (placed.has(hoisted) && placed.get(hoisted) !== src) dest = path.join(nestDir, 'node_modules', name);
    if (placed.get(dest) === src) continue;
    if (placed.has(dest)) throw new Error(`pack: two versions of ${name} would sit at ${dest}`);
    placed.set(dest, src);
    fs.cpSync(src, dest, {
      recursive: true,
      dereference: true,
      // a package's own node_modules is re-created from the closure
      filter: (f) => !path.relative(src, f).split(path.sep).includes('node_modules'),
    });
    const pkg = readJson(path.join(src, 'package.json'));
    const own = [...Object.keys(pkg.dependencies ?? {}), ...Object.keys(pkg.optionalDependencies ?? {})].filter((d) => {
      try {
        packageDir(d, src);
        return true;
      } catch (err) {
        if (pkg.optionalDependencies?.[d] !== undefined) return false; // an optional one not installed here
        throw err;
      }
    });
    copyClosure(own, src, stageDir, dest, placed);
  }
}

/** The package.json to publish for workspace folder `dir` (see the header). */
function publishedManifest(dir, pkg) {
  const out = { ...pkg };
  const pin = (deps) =>
    deps === undefined
      ? undefined
      : Object.fromEntries(Object.entries(deps).map(([n, v]) => [n, versions[n] === undefined ? v : versions[n]]));
  out.dependencies = pin(pkg.dependencies);
  out.peerDependencies = pin(pkg.peerDependencies);
  delete out.devDependencies;
  if (dir === 'native') {
    delete out.dependencies['cmake-js'];
    delete out.dependencies['node-addon-api'];
    delete out.scripts;
    out.gypfile = false;
    out.files = ['dist', 'build/Release/specd_native.node', 'README.md'];
  }
  if (dir === 'packages/core') {
    out.dependencies = { ...out.dependencies, '@specd/native': versions['@specd/native'] };
    out.files = [...(pkg.files ?? ['dist']), 'src/cli/bin.js'];
    out.bundleDependencies = Object.keys(out.dependencies).filter((n) => versions[n] === undefined);
  }
  return out;
}

fs.mkdirSync(OUT, { recursive: true });
for (const dir of PACKAGES) {
  const src = path.join(ROOT, dir);
  const pkg = readJson(path.join(src, 'package.json'));
  if (!fs.existsSync(path.join(src, 'dist/index.js')))
    throw new Error(`pack: ${dir}/dist/index.js is missing: run \`npm run build\` first`);
  if (dir === 'native' && !fs.existsSync(path.join(src, 'build/Release/specd_native.node')))
    throw new Error('pack: native/build/Release/specd_native.node is missing: run `npm run build:native` first');
  const stage = path.join(STAGE, pkg.name.replace('/', '+'));
  const manifest = publishedManifest(dir, pkg);
  fs.mkdirSync(stage, { recursive: true });
  for (const f of manifest.files ?? ['dist'])
    if (fs.existsSync(path.join(src, f))) fs.cpSync(path.join(src, f), path.join(stage, f), { recursive: true });
  for (const f of ['README.md', 'LICENSE'])
    if (fs.existsSync(path.join(src, f))) fs.cpSync(path.join(src, f), path.join(stage, f));
  if (!fs.existsSync(path.join(stage, 'LICENSE'))) fs.cpSync(path.join(ROOT, 'LICENSE'), path.join(stage, 'LICENSE'));
  fs.writeFileSync(path.join(stage, 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`);
  if (manifest.bundleDependencies !== undefined) copyClosure(manifest.bundleDependencies, src, stage, stage, new Map());
  const name = execFileSync('npm', ['pack', '--ignore-scripts', '--silent', '--offline', '--pack-destination', OUT], {
    cwd: stage,
    encoding: 'utf8',
  })
    .trim()
    .split('\n')
    .pop();
  const bytes = fs.statSync(path.join(OUT, name)).size;
  console.log(`pack: ${path.join(path.relative(ROOT, OUT) || '.', name)} (${(bytes / 1024 / 1024).toFixed(1)} MiB)`);
}
fs.rmSync(STAGE, { recursive: true, force: true });
