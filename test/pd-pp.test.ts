// Prefill/decode disaggregation with a pipelined prefill instance (`specd serve --role prefill --pp N`): each P
// stage process sends the layers it owns straight to the decode instance (pp = 1), the driver its own layers, the
// drafter's context and the handoff state. P, D, the router and an aggregated server (pp = 1) are real processes
// on loopback; prompts span several prefill chunks (scheduler.prefill_chunk_tokens 8). For plain decoding and every
// drafter of the shipped Kimi target at pp 2, and DFlash at pp 3 (a middle stage too): greedy output through the
// router equals the aggregated server's, D runs no prompt token through its target, and afterwards every page and
// slot is free on D, on P's driver and in P's stage processes (GET /pd/stages flushes the driver's queued cache
// operations to each stage and reports what it holds).
// With every sender paused after 1 descriptor (the transfer engines' test hook): a client that leaves mid-transfer
// ends the stage's write and frees everything on P, D and the stage (before the transfer timeout could); a stage
// process killed mid-transfer fails the request with an error naming the stage, and D frees everything.
// Kimi only: SmolLM2 ships as a GGUF file, and pipeline parallelism loads safetensors checkpoints only.
import * as fs from 'node:fs';
import * as path from 'node:path';

import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';

import {
  allFree,
  drafterBranch,
  drafterDirs,
  metric,
  metricsOf,
  modelId,
  MODELS,
  type SpecdProcess,
  startRouter,
  startSpecd,
  stopAll,
  tempDir,
  until,
} from './pd-cluster.js';
import { skipWithoutFiles } from './require-files.js';

const TARGET = path.join(MODELS, 'kimi-k3-tiny');
const HAVE = !skipWithoutFiles('PD with a pipelined prefill instance', [path.join(TARGET, 'config.json')]);
const CHUNK = 8;
const PROMPTS = [
  'The quick brown fox',
  'def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n',
  'Once upon a time, in a land far away, there lived a king who had three daughters. The youngest',
];

const tmp = tempDir('specd-pd-pp-');

function config(name: string, drafter: string | undefined, pd: object = {}): string {
  const file = path.join(tmp(), `${name}.json`);
  fs.writeFileSync(
    file,
    JSON.stringify({
      model: TARGET,
      drafter: drafterBranch(drafter),
      scheduler: { prefill_chunk_tokens: CHUNK, max_sequence_tokens: 512 },
      pd: { bootstrap_timeout_ms: 20_000, transfer_timeout_ms: 20_000, ...pd },
    }),
  );
  return file;
}

const serveArgs = (cfg: string, ...more: string[]) => [
  'serve',
  '--config',
  cfg,
  '--port',
  '0',
  '--log-level',
  'warn',
  ...more,
];

async function router(p: SpecdProcess, d: SpecdProcess, cfg: string): Promise<SpecdProcess> {
  return startRouter(p, d, cfg);
}

interface StageUse {
  readonly stage: number;
  readonly layer_start: number;
  readonly layer_end: number;
  readonly kv_pages_used: number;
  readonly state_slots_used: number;
  readonly transfers_inflight: number;
}

async function stagesOf(url: string): Promise<StageUse[]> {
  return ((await (await fetch(`${url}/pd/stages`)).json()) as { stages: StageUse[] }).stages;
}

describe.skipIf(!HAVE)('PD with P at pp 2 (kimi-k3-tiny)', () => {
  const dirs = HAVE ? drafterDirs('kimi-k3-tiny') : [];
  // every drafter at pp 2, plain decoding at pp 2, and DFlash at pp 3 (a middle stage)
  const cases: [string, number, string | undefined][] = [
    ['plain decoding', 2, undefined],
    ...dirs.map((d): [string, number, string] => [path.basename(d), 2, d]),
    ...dirs.filter((d) => d.endsWith('-dflash')).map((d): [string, number, string] => [path.basename(d), 3, d]),
  ];
  it.each(cases)(
    '%s, P at pp %i: router output equals aggregated; D prefills nothing; every stage frees its pages',
    async (name, pp, dir) => {
      const cfg = config(`pp${pp}-${name}`, dir);
      const procs: (SpecdProcess | undefined)[] = [];
      try {
        const started = await Promise.all([
          startSpecd(serveArgs(cfg)),
          startSpecd(serveArgs(cfg, '--role', 'prefill', '--pp', String(pp))),
          startSpecd(serveArgs(cfg, '--role', 'decode')),
        ]);
        procs.push(...started);
        const [a, p, d] = started as [SpecdProcess, SpecdProcess, SpecdProcess];
        const r = await router(p, d, cfg);
        procs.push(r);
        const stages = await stagesOf(p.url);
        // pp stages covering the 8 layers in order
        expect(stages).toHaveLength(pp);
        expect(stages.map((s) => s.layer_start)).toEqual([0, ...stages.slice(0, -1).map((s) => s.layer_end)]);
        expect(stages[pp - 1]?.layer_end).toBe(8);
        const model = await modelId(a.url);
        const agg = new OpenAI({ baseURL: `${a.url}/v1`, apiKey: 'none' });
        const pd = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'none' });
        let promptTokens = 0;
        let longest = 0;
        for (const prompt of PROMPTS) {
          const body = { model, prompt, max_tokens: 16, temperature: 0 };
          const want = await agg.completions.create(body);
          const got = await pd.completions.create(body);
          expect(got.choices[0]?.text, prompt).toBe(want.choices[0]?.text);
          expect(got.usage?.completion_tokens).toBe(want.usage?.completion_tokens);
          promptTokens += got.usage?.prompt_tokens ?? 0;
          longest = Math.max(longest, got.usage?.prompt_tokens ?? 0);
        }
        expect(longest).toBeGreaterThan(3 * CHUNK);
        const dm = await metricsOf(d.url);
        const pm = await metricsOf(p.url);
        expect(metric(dm, 'specd_prompt_tokens_prefilled')).toBe(0);
        expect(metric(pm, 'specd_prompt_tokens_prefilled')).toBe(promptTokens);
        expect(metric(dm, 'specd_pd_payload_bytes_count', 'kind="target_kv"')).toBe(PROMPTS.length);
        expect(await allFree(d.url)).toBe(true);
        expect(await allFree(p.url)).toBe(true);
        for (const s of await stagesOf(p.url)) {
          expect(s.kv_pages_used, `stage ${s.stage}`).toBe(0);
          expect(s.state_slots_used, `stage ${s.stage}`).toBe(0);
          expect(s.transfers_inflight, `stage ${s.stage}`).toBe(0);
        }
      } finally {
        await stopAll(procs);
      }
    },
    300_000,
  );

  it("a client that leaves mid-transfer: the stage's write stops; P, D and the stage hold nothing", async () => {
    // the transfer timeout is far beyond the waits below: only the abort can end the paused writes in time
    const cfg = config('pp-abort', undefined, { transfer_timeout_ms: 120_000 });
    const procs: (SpecdProcess | undefined)[] = [];
    try {
      const [p, d] = await Promise.all([
        startSpecd(serveArgs(cfg, '--role', 'prefill', '--pp', '2'), 120_000, {
          SPECD_PD_TEST_PAUSE_AFTER_DESCRIPTORS: '1',
        }),
        startSpecd(serveArgs(cfg, '--role', 'decode')),
      ]);
      procs.push(p, d);
      const r = await router(p, d, cfg);
      procs.push(r);
      const client = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'none', maxRetries: 0 });
      const model = await modelId(d.url);
      const ac = new AbortController();
      const pending = client.completions
        .create({ model, prompt: PROMPTS[1] ?? '', max_tokens: 8 }, { signal: ac.signal })
        .catch((e: unknown) => e);
      await until('the stage paused in its transfer', () => /pipeline stage 0 \(pid \d+\) paused/.test(p.stderr()));
      expect((await stagesOf(p.url))[0]?.transfers_inflight).toBe(1);
      ac.abort();
      expect(await pending).toBeInstanceOf(Error);
      await until('P, D and the stage free', async () => {
        const stage0 = (await stagesOf(p.url))[0];
        return (
          (await allFree(p.url)) &&
          (await allFree(d.url)) &&
          stage0?.transfers_inflight === 0 &&
          stage0.kv_pages_used === 0 &&
          stage0.state_slots_used === 0
        );
      });
      expect((await fetch(`${p.url}/health`)).status).toBe(200);
    } finally {
      await stopAll(procs);
    }
  }, 300_000);

  it('a stage process killed mid-transfer: the request fails naming the stage; D frees everything', async () => {
    const cfg = config('pp-kill', undefined);
    const procs: (SpecdProcess | undefined)[] = [];
    try {
      const [p, d] = await Promise.all([
        startSpecd(serveArgs(cfg, '--role', 'prefill', '--pp', '2'), 120_000, {
          SPECD_PD_TEST_PAUSE_AFTER_DESCRIPTORS: '1',
        }),
        startSpecd(serveArgs(cfg, '--role', 'decode')),
      ]);
      procs.push(p, d);
      const r = await router(p, d, cfg);
      procs.push(r);
      const client = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'none', maxRetries: 0 });
      const model = await modelId(d.url);
      const pending = client.completions
        .create({ model, prompt: PROMPTS[2] ?? '', max_tokens: 8, temperature: 0 })
        .catch((e: unknown) => e);
      const paused = /pipeline stage 0 \(pid (\d+)\) paused after 1 descriptors/;
      await until('the stage paused in its transfer', () => paused.test(p.stderr()));
      const pid = Number(paused.exec(p.stderr())?.[1]);
      expect(pid).toBeGreaterThan(0);
      process.kill(pid, 'SIGKILL');
      const err = await pending;
      expect(err).toBeInstanceOf(OpenAI.APIError);
      // D's answer (P aborted the room, with its reason) or P's: either names the stage and how it ended
      expect(String((err as Error).message)).toMatch(/pipeline stage 0 \(layers 0–3, pid \d+\) was killed by SIGKILL/);
      expect((err as InstanceType<typeof OpenAI.APIError>).status).toBeGreaterThanOrEqual(409);
      await until('D free', () => allFree(d.url));
      expect((await fetch(`${d.url}/health`)).status).toBe(200);
    } finally {
      await stopAll(procs);
    }
  }, 300_000);
});
