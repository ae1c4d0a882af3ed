// Pipeline parallelism in `specd serve` (`--pp N`). A greedy completion through `serve --pp 2`
// (shipped target + shipped DFlash) equals pp = 1's; the stage processes exit when the server closes,
// and on SIGTERM / SIGINT of a `specd serve --pp 2` process; a killed stage fails the request in
// flight and every later one with 500 naming the stage, while the server stays up and /health answers
// 503 with the reason; a `specd serve --pp 3` killed with SIGKILL leaves no stage process either.
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

import { PipelineModel, startServe, type CliIo, type StartedServer } from '@specd/core';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const BIN = path.join(ROOT, 'packages/core/src/cli/bin.js');
const io: CliIo = { stdout: { write: () => true }, stderr: { write: () => true }, cwd: ROOT };
// the architecture demo (`specd serve`'s default is SmolLM2, configs/default.json)
const TINY = { model: 'models/kimi-k3-tiny' };
const TINY_DFLASH = { ...TINY, drafter: 'models/kimi-k3-tiny-dflash' };
const PROMPT = 'The history of the city begins with';
const STAGE0 = /pipeline stage 0 \(layers 0–3, pid \d+\) was killed by SIGKILL/;

function alive(pid: number): boolean {
  try {
    return !fs.readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') Z ');
  } catch {
    return false;
  }
}

async function waitDead(pids: readonly number[], ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (pids.some(alive) && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
}

async function complete(
  s: StartedServer,
  body: Record<string, unknown>,
): Promise<{ status: number; json: Record<string, any> }> {
  const res = await fetch(`${s.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: s.server.options.modelName,
      prompt: PROMPT,
      temperature: 0,
      ignore_eos: true,
      ...body,
    }),
  });
  return { status: res.status, json: (await res.json()) as Record<string, any> };
}

const pidsOf = (s: StartedServer): number[] => (s.target.model as PipelineModel).pids;

describe('specd serve --pp', () => {
  it('a greedy completion (DFlash) through --pp 2 equals pp = 1; the stage processes exit on close', async () => {
    const one = await startServe({ ...TINY_DFLASH, port: 0, logLevel: 'silent' }, io);
    let ref: Record<string, any>;
    try {
      expect(one.drafter?.drafter.method).toBe('dflash');
      ref = (await complete(one, { max_tokens: 24 })).json;
    } finally {
      await one.close();
    }
    const two = await startServe({ ...TINY_DFLASH, port: 0, pp: 2, logLevel: 'silent' }, io);
    let pids: number[] = [];
    try {
      expect(two.target.model).toBeInstanceOf(PipelineModel);
      expect(two.drafter?.drafter.method).toBe('dflash');
      pids = pidsOf(two);
      expect(pids).toHaveLength(1);
      expect(pids.every(alive)).toBe(true);
      expect((two.target.model as PipelineModel).stages.map((st) => [st.layerStart, st.layerEnd])).toEqual([
        [0, 4],
        [4, 8],
      ]);
      const got = await complete(two, { max_tokens: 24 });
      expect(got.status).toBe(200);
      expect(got.json.choices[0].text).toBe(ref.choices[0].text);
      expect(got.json.usage).toEqual(ref.usage);
      expect(await (await fetch(`${two.url}/health`)).json()).toEqual({ status: 'ok' });
    } finally {
      await two.close();
    }
    await waitDead(pids);
    expect(pids.filter(alive)).toEqual([]);
  });

  it('--pp-partition 3,5 and config partition: one bad length is refused', async () => {
    await expect(
      startServe({ ...TINY_DFLASH, port: 0, pp: 2, ppPartition: [3, 2, 3], logLevel: 'silent' }, io),
    ).rejects.toThrow(/--pp-partition 3,2,3: 3 entries \(layers per pipeline stage\) but 2 stages; give --pp 3/);
    const s = await startServe({ ...TINY, port: 0, pp: 2, ppPartition: [3, 5], spec: false, logLevel: 'silent' }, io);
    try {
      expect((s.target.model as PipelineModel).stages.map((st) => [st.layerStart, st.layerEnd])).toEqual([
        [0, 3],
        [3, 8],
      ]);
      expect((await complete(s, { max_tokens: 4 })).status).toBe(200);
    } finally {
      await s.close();
    }
  });

  it(
    'a killed stage: the request in flight and later ones fail ' +
      'with 500 naming the stage; /health 503; the server stays up',
    async () => {
      const s = await startServe({ ...TINY_DFLASH, port: 0, pp: 2, logLevel: 'silent' }, io);
      try {
        expect((await complete(s, { max_tokens: 4 })).status).toBe(200);
        const [pid] = pidsOf(s);
        // a streaming request: kill stage 0 when the first chunk arrives
        const res = await fetch(`${s.url}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({
            model: s.server.options.modelName,
            prompt: PROMPT,
            temperature: 0,
            ignore_eos: true,
            max_tokens: 400,
            stream: true,
          }),
        });
        expect(res.status).toBe(200);
        const reader = res.body!.getReader();
        let text = '';
        let killed = false;
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          text += Buffer.from(value).toString('utf8');
          if (!killed) {
            process.kill(pid!, 'SIGKILL');
            killed = true;
          }
        }
        const events = text
          .split('\n\n')
          .filter((e) => e.startsWith('data: ') && e !== 'data: [DONE]')
          .map((e) => JSON.parse(e.slice(6)));
        const err = events.at(-1)!.error;
        expect(err.code).toBe('model_failed');
        expect(err.message).toMatch(STAGE0);
        expect(text.endsWith('data: [DONE]\n\n')).toBe(true);
        // later requests: 500 at once, naming the stage
        const later = await complete(s, { max_tokens: 4 });
        expect(later.status).toBe(500);
        expect(later.json.error).toMatchObject({ type: 'server_error', code: 'model_failed' });
        expect(later.json.error.message).toMatch(STAGE0);
        const health = await fetch(`${s.url}/health`);
        expect(health.status).toBe(503);
        const h = (await health.json()) as { status: string; reason: string };
        expect(h.status).toBe('error');
        expect(h.reason).toMatch(STAGE0);
        expect((await fetch(`${s.url}/v1/models`)).status).toBe(200);
      } finally {
        await s.close();
      }
    },
  );

  it('a stage that dies while idle: /health 503 and the next request 500, before any forward', async () => {
    const s = await startServe({ ...TINY, port: 0, pp: 2, spec: false, logLevel: 'silent' }, io);
    try {
      const [pid] = pidsOf(s);
      process.kill(pid!, 'SIGKILL');
      await waitDead([pid!]);
      // the event loop reaps the child shortly after
      let health = await fetch(`${s.url}/health`);
      for (let i = 0; i < 100 && health.status === 200; i++) {
        await new Promise((r) => setTimeout(r, 20));
        health = await fetch(`${s.url}/health`);
      }
      expect(health.status).toBe(503);
      expect(((await health.json()) as { reason: string }).reason).toMatch(STAGE0);
      const r = await complete(s, { max_tokens: 4 });
      expect(r.status).toBe(500);
      expect(r.json.error.message).toMatch(STAGE0);
    } finally {
      await s.close();
    }
  });

  it.each(['SIGTERM', 'SIGINT'] as const)('`specd serve --pp 3` stopped by %s leaves no stage process', async (sig) => {
    const child = spawn(
      process.execPath,
      [BIN, 'serve', '--model', TINY.model, '--pp', '3', '--no-spec', '--port', '0', '--log-level', 'silent'],
      { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'] },
    );
    let err = '';
    const url = await new Promise<string>((resolve, reject) => {
      child.stderr!.on('data', (d: Buffer) => {
        err += d.toString();
        const m = /on (http:\/\/\S+)/.exec(err);
        if (m) resolve(m[1]!);
      });
      child.once('exit', (code) => reject(new Error(`serve exited with ${code}: ${err}`)));
    });
    const stages = fs
      .readFileSync(`/proc/${child.pid}/task/${child.pid}/children`, 'utf8')
      .trim()
      .split(/\s+/)
      .map(Number);
    expect(stages).toHaveLength(2);
    expect(stages.every(alive)).toBe(true);
    expect((await fetch(`${url}/health`)).status).toBe(200);
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    child.kill(sig);
    expect(await exited).toBe(0);
    await waitDead(stages);
    expect(stages.filter(alive)).toEqual([]);
  });

  it('`specd serve --pp 3` killed by SIGKILL: the stage processes exit by themselves (no orphans)', async () => {
    const child = spawn(
      process.execPath,
      [BIN, 'serve', '--model', TINY.model, '--pp', '3', '--no-spec', '--port', '0', '--log-level', 'silent'],
      { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'] },
    );
    let err = '';
    await new Promise<void>((resolve, reject) => {
      child.stderr!.on('data', (d: Buffer) => {
        err += d.toString();
        if (/on (http:\/\/\S+)/.test(err)) resolve();
      });
      child.once('exit', (code) => reject(new Error(`serve exited with ${code}: ${err}`)));
    });
    const stages = fs
      .readFileSync(`/proc/${child.pid}/task/${child.pid}/children`, 'utf8')
      .trim()
      .split(/\s+/)
      .map(Number);
    expect(stages).toHaveLength(2);
    expect(stages.every(alive)).toBe(true);
    const exited = new Promise<NodeJS.Signals | null>((resolve) =>
      child.once('exit', (_code, signal) => resolve(signal)),
    );
    child.kill('SIGKILL'); // no handler runs: the stages notice the driver's IPC channel closing
    expect(await exited).toBe('SIGKILL');
    await waitDead(stages);
    expect(stages.filter(alive)).toEqual([]);
  });
});
