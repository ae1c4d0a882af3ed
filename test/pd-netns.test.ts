// Prefill/decode disaggregation across hosts: the router, P and D each in its own network namespace (test/netns.ts:
// veth pairs on a bridge in the router's namespace, private addresses inside the namespaces only), each spawned with
// `ip netns exec`, kimi-k3-tiny + DFlash at a fixed draft length. Greedy output through the router equals an
// aggregated server's (on loopback outside the namespaces), streamed and not; every request's TTFT waterfall is
// measured (pd/waterfall.ts: phases ≥ 0, their sum within the TTFT); every page, slot and transfer is freed. One
// case shapes the traffic leaving P (the P → D payload) with `tc qdisc … tbf` at two rates and checks that the
// transfer wait grows at the lower rate (the ratio is printed); another puts a delay relay (test/delay-relay.mjs, a
// TCP proxy in the router's namespace holding each chunk 100 ms) on a second router's link to P and checks that the
// time no waterfall phase covers (TTFT − Σ phases: the links) grows by that. Both transfer engines: ZeroMQ, and NIXL
// with UCX over TCP (`UCX_TLS=tcp`; it runs when `npm run nixl:fetch` brought the library, which pd-nixl.test.ts
// requires under CI). Under CI (root) a namespace that cannot be made fails the file; elsewhere it skips loudly.
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

import { nixlAvailable } from '@specd/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  checkWaterfall,
  drafterBranch,
  metric,
  MODELS,
  processStates,
  ROOT,
  type SpecdProcess,
  startSpecd,
  startSpecdNixl,
  stopAll,
  type WaterfallJson,
} from './pd-cluster.js';
import { NetnsLab, netnsUnavailable, removeStaleNamespaces } from './netns.js';
import { isCi, skipWithoutFiles } from './require-files.js';

const DFLASH = path.join(MODELS, 'kimi-k3-tiny-dflash');
const HAVE_MODELS = !skipWithoutFiles('PD across network namespaces', [
  path.join(MODELS, 'kimi-k3-tiny/config.json'),
  path.join(DFLASH, 'config.json'),
]);

/** Why namespaces cannot be made (undefined: they can). Under CI that fails the file instead of skipping it. */
const NO_NETNS = HAVE_MODELS ? netnsUnavailable() : undefined;
if (NO_NETNS !== undefined) {
  const message = `"PD across network namespaces" needs \`ip netns\` (root, iproute2, tc): ${NO_NETNS}`;
  if (isCi()) throw new Error(`${message} (CI runs as root: a namespace that cannot be made fails the suite)`);
  console.warn(`\n!!! SKIPPED ${message}\n`);
}

/** The transfer engines run: NIXL when its library was fetched (pd-nixl.test.ts fails under CI without it). */
const TRANSFERS = ['zmq', ...(nixlAvailable() ? ['nixl'] : [])];
if (TRANSFERS.length === 1) console.warn('pd-netns.test.ts: no NIXL library (`npm run nixl:fetch`): ZeroMQ only');

let tmp: string;
beforeAll(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-pd-netns-'));
  const stale = removeStaleNamespaces();
  if (stale.length > 0) console.log(`removed stale namespaces of earlier runs: ${stale.join(', ')}`);
});
afterAll(() => {
  if (tmp !== undefined) fs.rmSync(tmp, { recursive: true, force: true });
});

/** Prints the router's retries of a P/D request whose connection dropped before an answer (pd/router.ts), if any. */
function reportRetries(what: string, procs: readonly (SpecdProcess | undefined)[]): void {
  for (const q of procs) {
    const retried = (q?.stderr() ?? '').split('\n').filter((l) => l.includes('retrying once'));
    if (retried.length > 0) console.warn(`pd-netns (${what}): ${q?.url} retried:\n${retried.join('\n')}`);
  }
}

describe.skipIf(!HAVE_MODELS || NO_NETNS !== undefined).each(TRANSFERS)(
  'PD across network namespaces (%s)',
  (transfer) => {
    let lab: NetnsLab | undefined;
    const procs: (SpecdProcess | undefined)[] = [];
    afterAll(async () => {
      try {
        reportRetries(transfer, procs);
      } finally {
        await stopAll(procs);
        lab?.close();
      }
    });
    let router = '';
    let prefill = '';
    let decode = '';
    let model = '';
    let config = '';
    let agg: SpecdProcess;
    const prompts = ['The quick brown fox', 'def fibonacci(n):\n    if n < 2:\n        return n\n'];

    beforeAll(async () => {
      lab = new NetnsLab(['router', 'prefill', 'decode']);
      const cfg = path.join(tmp, `kimi-dflash-${transfer}.json`);
      const drafter = drafterBranch(DFLASH);
      fs.writeFileSync(cfg, JSON.stringify({ model: path.join(MODELS, 'kimi-k3-tiny'), drafter, pd: { transfer } }));
      config = cfg;
      const l = lab;
      // NIXL: UCX over TCP only (its shared-memory transports would bypass the namespaces' links)
      const env: Record<string, string> = transfer === 'nixl' ? { UCX_TLS: 'tcp' } : {};
      const serve = (role: string, host: string): Promise<SpecdProcess> =>
        (transfer === 'nixl' ? startSpecdNixl : startSpecd)(
          [
            'serve',
            '--config',
            cfg,
            '--role',
            role,
            '--host',
            l.host(host).address,
            '--port',
            '0',
            '--log-level',
            'warn',
            // the delay relay case reaches P under the relay's address (the router's host) as well
            '--allowed-hosts',
            `${l.host(host).address},${l.host('router').address}`,
          ],
          120_000,
          env,
          (argv) => l.wrap(host, argv),
        );
      const started = await Promise.all([
        serve('prefill', 'prefill'),
        serve('decode', 'decode'),
        startSpecd(['serve', '--config', cfg, '--port', '0', '--log-level', 'warn']),
      ]);
      procs.push(...started);
      const [p, d, a] = started;
      agg = a;
      prefill = p.url;
      decode = d.url;
      const r = await startSpecd(
        ['router', '--prefill', p.url, '--decode', d.url, '--host', l.host('router').address, '--port', '0'].concat([
          '--config',
          cfg,
          '--log-level',
          'warn',
        ]),
        120_000,
        {},
        (argv) => l.wrap('router', argv),
      );
      procs.push(r);
      router = r.url;
      for (const [u, h] of [
        [p.url, 'prefill'],
        [d.url, 'decode'],
        [r.url, 'router'],
      ] as const)
        expect(u, `${h} listens on its namespace's address`).toContain(l.host(h).address);
      model = (await (await fetch(`${a.url}/v1/models`)).json()).data[0].id as string;
    }, 180_000);

    /** Completions through the router (`at`) from inside the router's namespace, each with its waterfall. */
    const viaRouter = (
      bodies: readonly Record<string, unknown>[],
      at = router,
    ): { text: string; waterfall: WaterfallJson }[] => {
      const l = lab as NetnsLab;
      const answers = l.fetch(
        'router',
        bodies.map((body) => ({ url: `${at}/v1/completions`, body })),
      );
      const ids = answers.map((a, i) => {
        if (a.status !== 200) {
          // what each process said and whether it is alive (a dead upstream and a dropped connection look alike)
          throw new Error(`request ${i}: router answered ${a.status}: ${a.text}\n${processStates(procs)}`);
        }
        return a.headers['x-request-id'] ?? '';
      });
      const waterfalls = l.fetch(
        'router',
        ids.map((id) => ({ url: `${at}/pd/waterfall/${encodeURIComponent(id)}` })),
      );
      return answers.map((a, i) => {
        let text = '';
        if (bodies[i]?.stream === true) {
          for (const line of a.text.split('\n'))
            if (line.startsWith('data: ') && line !== 'data: [DONE]')
              text += (JSON.parse(line.slice(6)) as { choices: { text: string }[] }).choices[0]?.text ?? '';
        } else text = (JSON.parse(a.text) as { choices: { text: string }[] }).choices[0]?.text ?? '';
        const w = waterfalls[i];
        if (w?.status !== 200) throw new Error(`waterfall ${ids[i]}: ${w?.status} ${w?.text}`);
        return { text, waterfall: JSON.parse(w.text) as WaterfallJson };
      });
    };

    /** Whether P's and D's pages, slots and transfers are all free (their /metrics, read from the router's host). */
    const allFree = (): boolean =>
      (lab as NetnsLab).fetch('router', [{ url: `${prefill}/metrics` }, { url: `${decode}/metrics` }]).every((m) => {
        const t = m.text;
        return (
          metric(t, 'specd_kv_pages_used', 'cache="target"') === 0 &&
          metric(t, 'specd_kv_pages_used', 'cache="draft"') === 0 &&
          metric(t, 'specd_state_slots_used') === 0 &&
          metric(t, 'specd_pd_transfers_inflight') === 0 &&
          metric(t, 'specd_num_requests_running') === 0
        );
      });

    const waitFree = async (): Promise<void> => {
      for (let i = 0; i < 100 && !allFree(); i++) await new Promise((r) => setTimeout(r, 100));
      expect(allFree(), 'every page, slot and transfer freed on P and D').toBe(true);
    };

    it('greedy output equals aggregated; the waterfall is measured; every page is freed', async () => {
      const bodies = prompts.flatMap((prompt) => [
        { model, prompt, max_tokens: 16, temperature: 0 },
        { model, prompt, max_tokens: 16, temperature: 0, stream: true },
      ]);
      const got = viaRouter(bodies);
      for (const [i, body] of bodies.entries()) {
        const want = (await (
          await fetch(`${agg.url}/v1/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ ...body, stream: false }),
          })
        ).json()) as { choices: { text: string }[] };
        const what = `${JSON.stringify(body.prompt)}${body.stream === true ? ' (streamed)' : ''}`;
        expect(got[i]?.text, what).toBe(want.choices[0]?.text);
        checkWaterfall(got[i]?.waterfall as WaterfallJson, what, transfer === 'nixl');
      }
      await waitFree();
    }, 120_000);

    it('a tbf-limited P → D link: the transfer wait grows at the lower rate', async () => {
      const l = lab as NetnsLab;
      // a longer prompt: ~1 MB of payload (target KV, KDA state, DFlash context)
      const prompt = 'Once upon a time, in a land far away, there lived a '.repeat(6);
      const bodies = [0, 1].map((i) => ({ model, prompt: `${i} ${prompt}`, max_tokens: 4, temperature: 0 }));
      const wait: Record<string, number> = {};
      const rates = ['100mbit', '10mbit'];
      try {
        for (const rate of rates) {
          l.shape('prefill', rate);
          const runs = viaRouter(bodies);
          for (const [i, r] of runs.entries()) checkWaterfall(r.waterfall, `${rate} request ${i}`);
          const waits = runs.map((r) => r.waterfall.phases_ms.transfer_wait ?? 0);
          wait[rate] = Math.min(...waits);
          const bytes = Object.values(runs[0]?.waterfall.payload_bytes ?? {}).reduce((a, b) => a + b, 0);
          const shown = waits.map((w) => w.toFixed(1)).join(', ');
          console.log(`${transfer}, tbf ${rate}: payload ${bytes} B, transfer wait ${shown} ms`);
        }
      } finally {
        l.shape('prefill', undefined);
      }
      const [fast, slow] = rates.map((r) => wait[r] ?? 0) as [number, number];
      console.log(
        `${transfer}: transfer wait ${rates[1]} / ${rates[0]}: ×${(slow / fast).toFixed(2)} (best of 2 each)`,
      );
      expect(slow).toBeGreaterThan(fast);
      await waitFree();
    }, 120_000);

    // the relay is on the router's HTTP link, not the transfer's: one engine is enough (no skipped twin)
    if (transfer === 'zmq')
      it('a delay relay on the router → P link: the time between hosts grows by its delay', async () => {
        const l = lab as NetnsLab;
        const DELAY_MS = 100;
        // test/delay-relay.mjs in the router's namespace holds every chunk between the router and P for DELAY_MS
        const relay = spawn(
          'ip',
          l
            .wrap('router', [
              process.execPath,
              path.join(ROOT, 'test/delay-relay.mjs'),
              l.host('router').address,
              new URL(prefill).host,
              String(DELAY_MS),
            ])
            .slice(1),
          { stdio: ['ignore', 'pipe', 'pipe'] },
        );
        try {
          const at = await new Promise<string>((resolve, reject) => {
            let out = '';
            relay.stdout?.on('data', (c: Buffer) => {
              out += c.toString();
              const m = /relay listening on (\S+)/.exec(out);
              if (m?.[1] !== undefined) resolve(m[1]);
            });
            relay.once('exit', (code) => reject(new Error(`delay relay exited (${code})`)));
          });
          const slow = await startSpecd(
            ['router', '--prefill', `http://${at}`, '--decode', decode, '--host', l.host('router').address].concat([
              '--port',
              '0',
              '--config',
              config,
              '--log-level',
              'warn',
            ]),
            120_000,
            {},
            (argv) => l.wrap('router', argv),
          );
          procs.push(slow);
          const bodies = [0, 1].map((i) => ({
            model,
            prompt: `${i} The quick brown fox`,
            max_tokens: 4,
            temperature: 0,
          }));
          // the time no phase covers (TTFT − Σ phases: the links between the hosts; each phase is measured on its
          // own host): the relay holds the router's request to P for DELAY_MS, so it is at least that much longer
          const gap: Record<string, number> = {};
          for (const [name, url] of [
            ['direct', router],
            ['relayed', slow.url],
          ] as const) {
            const runs = viaRouter(bodies, url);
            for (const [i, r] of runs.entries()) checkWaterfall(r.waterfall, `${name} request ${i}`);
            const gaps = runs.map(
              (r) => r.waterfall.ttft_ms - Object.values(r.waterfall.phases_ms).reduce((a, b) => a + (b ?? 0), 0),
            );
            gap[name] = Math.min(...gaps);
            const shown = runs.map((r, i) => `${r.waterfall.ttft_ms.toFixed(1)} (gap ${gaps[i]?.toFixed(1)})`);
            console.log(`${name}: TTFT ${shown.join(', ')} ms`);
          }
          console.log(
            `delay relay ${DELAY_MS} ms, router → P: the time between hosts ${gap.direct?.toFixed(1)} → ` +
              `${gap.relayed?.toFixed(1)} ms (best of 2)`,
          );
          expect(gap.relayed).toBeGreaterThanOrEqual(0.95 * DELAY_MS);
          await waitFree();
        } finally {
          relay.kill('SIGKILL');
        }
      }, 120_000);
  },
);

// P at pp 2 with its stage 0 on a host of its own: the stage process starts in its namespace (`ip netns exec`, from
// parallelism.stage_hosts), talks to P's driver over TCP across the bridge and writes its layers to D from its own
// address; greedy output through the router equals aggregated, and every page is freed.
describe.skipIf(!HAVE_MODELS || NO_NETNS !== undefined)(
  'PD across network namespaces: P stage 0 on its own host',
  () => {
    let lab: NetnsLab | undefined;
    const procs: (SpecdProcess | undefined)[] = [];
    afterAll(async () => {
      try {
        reportRetries('pp 2', procs);
      } finally {
        await stopAll(procs);
        lab?.close();
      }
    });

    it('pp 2 over TCP between hosts: greedy output equals aggregated; every page is freed', async () => {
      lab = new NetnsLab(['router', 'prefill', 'stage0', 'decode']);
      const l = lab;
      const base = { model: path.join(MODELS, 'kimi-k3-tiny'), drafter: drafterBranch(DFLASH) };
      const cfg = path.join(tmp, 'kimi-dflash-pp.json');
      fs.writeFileSync(cfg, JSON.stringify(base));
      const pCfg = path.join(tmp, 'kimi-dflash-pp-prefill.json');
      const stage0 = { exec: l.wrap('stage0', []), address: l.host('stage0').address };
      fs.writeFileSync(pCfg, JSON.stringify({ ...base, parallelism: { pp: 2, stage_hosts: [stage0] } }));
      const inNs = (host: string) => (argv: readonly string[]) => l.wrap(host, argv);
      const serve = (c: string, host: string, ...extra: string[]): Promise<SpecdProcess> =>
        startSpecd(
          ['serve', '--config', c, '--host', l.host(host).address, '--port', '0', '--log-level', 'warn', ...extra],
          120_000,
          {},
          inNs(host),
        );
      const started = await Promise.all([
        serve(pCfg, 'prefill', '--role', 'prefill'),
        serve(cfg, 'decode', '--role', 'decode'),
        startSpecd(['serve', '--config', cfg, '--port', '0', '--log-level', 'warn']),
      ]);
      procs.push(...started);
      const [p, d, a] = started;
      const r = await startSpecd(
        ['router', '--prefill', p.url, '--decode', d.url, '--host', l.host('router').address, '--port', '0'].concat([
          '--config',
          cfg,
          '--log-level',
          'warn',
        ]),
        120_000,
        {},
        inNs('router'),
      );
      procs.push(r);
      const model = (await (await fetch(`${a.url}/v1/models`)).json()).data[0].id as string;
      const prompts = ['The quick brown fox', 'Once upon a time, in a'];
      const bodies = prompts.map((prompt) => ({ model, prompt, max_tokens: 16, temperature: 0 }));
      const answers = l.fetch(
        'router',
        bodies.map((body) => ({ url: `${r.url}/v1/completions`, body })),
      );
      for (const [i, body] of bodies.entries()) {
        const want = (await (
          await fetch(`${a.url}/v1/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify(body),
          })
        ).json()) as { choices: { text: string }[] };
        expect(answers[i]?.status, answers[i]?.text).toBe(200);
        const got = JSON.parse(answers[i]?.text ?? '{}') as { choices: { text: string }[] };
        expect(got.choices[0]?.text, body.prompt).toBe(want.choices[0]?.text);
      }
      // P's stages: stage 0 is a process in its own namespace, and both stages hold nothing now
      const free = (): boolean =>
        l.fetch('router', [{ url: `${p.url}/pd/stages` }, { url: `${d.url}/metrics` }]).every((m, i) => {
          if (i === 0) {
            const st = (JSON.parse(m.text) as { stages: { kv_pages_used: number; transfers_inflight: number }[] })
              .stages;
            return st.length === 2 && st.every((s) => s.kv_pages_used === 0 && s.transfers_inflight === 0);
          }
          return (
            metric(m.text, 'specd_kv_pages_used', 'cache="target"') === 0 &&
            metric(m.text, 'specd_pd_transfers_inflight') === 0
          );
        });
      for (let i = 0; i < 100 && !free(); i++) await new Promise((res) => setTimeout(res, 100));
      expect(free(), 'every page freed on both P stages and on D').toBe(true);
      const ns = l.host('stage0').ns;
      const pids = spawnSync('ip', ['netns', 'pids', ns], { encoding: 'utf8' }).stdout.trim().split('\n');
      expect(pids.filter((x) => x !== '').length, `a stage process runs in ${ns}`).toBeGreaterThan(0);
    }, 180_000);
  },
);
