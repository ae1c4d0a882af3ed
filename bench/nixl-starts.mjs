#!/usr/bin/env node
// Start/stop stress of processes that load NIXL: `specd serve --role prefill|decode` on kimi-k3-tiny with
// `pd.transfer: "nixl"`, started `--count` times, `--concurrency` at a time, each stopped (SIGTERM) once it reported
// its URL. Counts how each ended: a clean stop, or a signal/exit code before or after reporting. This is how the
// crashes of UCX's memory hooks were counted (packages/core/src/pd/nixl-library.ts): `--ucx-hooks` runs with
// UCX's defaults (malloc hooks, bistro mmap hooks, memory events) instead of the hooks off that loading sets.
//
//   npm run bench:nixl-starts -- [--count 60] [--concurrency 4] [--role prefill|decode|both] [--ucx-hooks]
//
// Exits 1 when any process crashed. Needs the models and `npm run nixl:fetch`.
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const BIN = path.join(ROOT, 'packages/core/src/cli/bin.js');
const { values: opt } = parseArgs({
  options: {
    count: { type: 'string', default: '60' },
    concurrency: { type: 'string', default: '4' },
    role: { type: 'string', default: 'both' },
    'ucx-hooks': { type: 'boolean', default: false },
  },
});
const count = Number(opt.count);
const concurrency = Number(opt.concurrency);
if (!(count >= 1 && concurrency >= 1)) throw new Error('--count and --concurrency must be positive integers');
const roles = opt.role === 'both' ? ['prefill', 'decode'] : [opt.role];
if (!roles.every((r) => r === 'prefill' || r === 'decode')) throw new Error('--role: prefill, decode or both');

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-nixl-starts-'));
const config = path.join(dir, 'config.json');
const model = path.join(ROOT, 'models/kimi-k3-tiny');
fs.writeFileSync(config, JSON.stringify({ model, drafter: { method: 'none' }, pd: { transfer: 'nixl' } }));
// UCX's own defaults, which loading leaves alone when the variables are set
const hooks = opt['ucx-hooks']
  ? { UCX_MEM_MALLOC_HOOKS: 'yes', UCX_MEM_MMAP_HOOK_MODE: 'bistro', UCX_MEM_EVENTS: 'yes' }
  : {};

/** Starts one process with `role`, stops it once it reported its URL; resolves with how it ended. */
function once(role) {
  return new Promise((resolve) => {
    const args = [BIN, 'serve', '--config', config, '--role', role, '--port', '0', '--log-level', 'warn'];
    const child = spawn(process.execPath, args, {
      cwd: dir,
      stdio: ['ignore', 'ignore', 'pipe'],
      env: { ...process.env, ...hooks },
    });
    let err = '';
    let up = false;
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (chunk) => {
      err += chunk;
      if (!up && / on http:\/\//.test(err)) {
        up = true;
        child.kill('SIGTERM');
      }
    });
    child.on('exit', (code, signal) => {
      const how = code ?? signal;
      const outcome = !up ? `died before reporting (${how})` : code === 0 ? 'clean' : `died after reporting (${how})`;
      if (outcome !== 'clean') console.log(`${role}: ${outcome}; stderr tail:\n${err.slice(-400)}`);
      resolve(`${role}: ${outcome}`);
    });
  });
}

const tally = new Map();
let started = 0;
const t0 = performance.now();
await Promise.all(
  Array.from({ length: concurrency }, async () => {
    while (started < count * roles.length) {
      const role = roles[started++ % roles.length];
      const outcome = await once(role);
      tally.set(outcome, (tally.get(outcome) ?? 0) + 1);
    }
  }),
);
fs.rmSync(dir, { recursive: true, force: true });
const crashed = [...tally].filter(([k]) => !k.endsWith('clean')).reduce((s, [, n]) => s + n, 0);
console.log(
  `${count * roles.length} starts (${roles.join(' + ')}), ${concurrency} at a time, UCX memory hooks ` +
    `${opt['ucx-hooks'] ? 'on (UCX defaults)' : 'as loading sets them'}, ${os.cpus()[0]?.model}, ` +
    `load ${os.loadavg()[0].toFixed(1)}, ${((performance.now() - t0) / 1000).toFixed(0)} s`,
);
for (const [k, n] of [...tally].sort()) console.log(`  ${k}: ${n}`);
console.log(`crashed: ${crashed}`);
process.exitCode = crashed > 0 ? 1 : 0;
