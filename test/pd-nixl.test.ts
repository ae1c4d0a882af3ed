// Prefill/decode disaggregation with the NIXL transfer engine (config `pd.transfer: "nixl"`) as real processes on
// loopback: `specd serve --role prefill`, `--role decode` and `specd router`, kimi-k3-tiny with plain decoding and
// with its DFlash drafter. Greedy completions through the router equal an aggregated server's; the decode instance
// prefills nothing; payload bytes arrived; every page, slot and transfer is free afterwards. P killed mid-transfer
// (its NIXL write paused after 1 descriptor by the test hook): the client gets an error, D frees everything at once
// (the control connection's close, not a timeout), and answers. A prefill instance at pp 2 (its stage processes
// write their layers over NIXL too) gives the aggregated output. Needs the models and
// `npm run nixl:fetch` (npm test runs it): without the library the case fails under CI=true, else skips loudly.
import * as fs from 'node:fs';
import * as path from 'node:path';

import { nixlAvailable, nixlDir } from '@specd/core';
import { describe, expect, it } from 'vitest';

import {
  allFree,
  clientOf,
  drafterBranch,
  drafterDirs,
  expectPrefillKilledMidTransfer,
  metric,
  metricsOf,
  MODELS,
  modelId,
  type SpecdProcess,
  startRouter,
  startSpecd,
  startSpecdNixl,
  stopAll,
  tempDir,
  until,
  withProcessStates,
} from './pd-cluster.js';
import { skipWithoutFiles } from './require-files.js';

const HAVE_MODEL = !skipWithoutFiles('PD over NIXL', [path.join(MODELS, 'kimi-k3-tiny/config.json')]);
const HAVE_NIXL = nixlAvailable();
if (!HAVE_NIXL) {
  const why = `the NIXL library is not at ${nixlDir()}: run \`npm run nixl:fetch\``;
  if (process.env.CI === 'true') throw new Error(`pd-nixl.test.ts: ${why}`);
  console.warn(`pd-nixl.test.ts: SKIPPING: ${why}`);
}

const tmp = tempDir('specd-pd-nixl-');

/** Writes the config `name` (kimi-k3-tiny, `drafter`, `pd.transfer: "nixl"` and `pd`) and returns its path. */
function config(name: string, drafter: string | undefined, pd: object = {}): string {
  const file = path.join(tmp(), `${name}.json`);
  const model = path.join(MODELS, 'kimi-k3-tiny');
  fs.writeFileSync(file, JSON.stringify({ model, drafter: drafterBranch(drafter), pd: { transfer: 'nixl', ...pd } }));
  return file;
}

const SERVE = (file: string): string[] => ['serve', '--config', file, '--port', '0', '--log-level', 'warn'];

/**
 * Starts an aggregated server, P (`--role prefill` and `prefillArgs`), D and a router on `file` (pushed to `procs`);
 * returns P, D, the model id and clients of the aggregated server and of the router.
 */
async function cluster(file: string, procs: (SpecdProcess | undefined)[], prefillArgs: string[] = []) {
  const [a, p, d] = await Promise.all([
    startSpecd(SERVE(file)),
    startSpecdNixl([...SERVE(file), '--role', 'prefill', ...prefillArgs]),
    startSpecdNixl([...SERVE(file), '--role', 'decode']),
  ]);
  procs.push(a, p, d);
  const r = await startRouter(p, d, file);
  procs.push(r);
  return { p, d, model: await modelId(a.url), agg: clientOf(a.url), pd: clientOf(r.url) };
}

const PROMPTS = [
  'The quick brown fox',
  'def fibonacci(n):\n    if n < 2:\n        return n\n',
  'Once upon a time, in a',
];

describe.skipIf(!HAVE_MODEL || !HAVE_NIXL)('PD through the router over NIXL: kimi-k3-tiny', () => {
  const dflash = HAVE_MODEL ? drafterDirs('kimi-k3-tiny').find((d) => d.endsWith('dflash')) : undefined;
  it.each([
    ['plain decoding', undefined],
    ['dflash', dflash],
  ] as const)(
    '%s: greedy output equals aggregated; D prefills nothing',
    async (name, dir) => {
      const procs: (SpecdProcess | undefined)[] = [];
      try {
        await withProcessStates(procs, async () => {
          const { p, d, model, agg, pd } = await cluster(config(name, dir), procs);
          let promptTokens = 0;
          for (const prompt of PROMPTS) {
            const body = { model, prompt, max_tokens: 24, temperature: 0 };
            const want = await agg.completions.create(body);
            const got = await pd.completions.create(body);
            expect(got.choices[0]?.text, prompt).toBe(want.choices[0]?.text);
            expect(got.usage?.completion_tokens).toBe(want.usage?.completion_tokens);
            promptTokens += got.usage?.prompt_tokens ?? 0;
          }
          const [dm, pm] = [await metricsOf(d.url), await metricsOf(p.url)];
          expect(metric(dm, 'specd_prompt_tokens_prefilled')).toBe(0);
          expect(metric(pm, 'specd_prompt_tokens_prefilled')).toBe(promptTokens);
          expect(metric(dm, 'specd_pd_payload_bytes_count', 'kind="target_kv"')).toBe(PROMPTS.length);
          if (dir !== undefined)
            expect(metric(dm, 'specd_pd_payload_bytes_sum', 'kind="draft_context"')).toBeGreaterThan(0);
          for (const m of [pm, dm]) {
            expect(metric(m, 'specd_kv_pages_used', 'cache="target"')).toBe(0);
            expect(metric(m, 'specd_pd_transfers_inflight')).toBe(0);
          }
        });
      } finally {
        await stopAll(procs);
      }
    },
    300_000,
  );

  it('P at pp 2 (each stage process sends its own layers over NIXL): greedy output equals aggregated', async () => {
    const procs: (SpecdProcess | undefined)[] = [];
    try {
      const { p, d, model, agg, pd } = await cluster(config('pp', dflash), procs, ['--pp', '2']);
      await withProcessStates(procs, async () => {
        for (const prompt of PROMPTS) {
          const body = { model, prompt, max_tokens: 16, temperature: 0 };
          const want = await agg.completions.create(body);
          expect((await pd.completions.create(body)).choices[0]?.text, prompt).toBe(want.choices[0]?.text);
        }
        expect(metric(await metricsOf(d.url), 'specd_prompt_tokens_prefilled')).toBe(0);
        await until('P and D free', async () => (await allFree(p.url)) && (await allFree(d.url)));
      });
    } finally {
      await stopAll(procs);
    }
  }, 300_000);

  it('P killed mid-transfer: the client gets an error, D frees everything and still answers', async () => {
    const file = config('fault', dflash, { bootstrap_timeout_ms: 20_000, transfer_timeout_ms: 60_000 });
    const procs: (SpecdProcess | undefined)[] = [];
    try {
      const [p, d] = await Promise.all([
        startSpecdNixl([...SERVE(file), '--role', 'prefill'], 120_000, { SPECD_PD_TEST_PAUSE_AFTER_DESCRIPTORS: '1' }),
        startSpecdNixl([...SERVE(file), '--role', 'decode']),
      ]);
      procs.push(p, d);
      const r = await startRouter(p, d, file);
      procs.push(r);
      // D frees within until's 20 s, a third of the 60 s transfer timeout: it learnt it from the closed connection
      await expectPrefillKilledMidTransfer(clientOf(r.url, 0), await modelId(d.url), PROMPT_FAULT, p, d);
    } finally {
      await stopAll(procs);
    }
  }, 300_000);
});

const PROMPT_FAULT = 'The history of the ';
