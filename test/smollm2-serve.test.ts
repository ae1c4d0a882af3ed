// Serving SmolLM2: `specd serve --model models/smollm2-135m-instruct --drafter
// models/smollm2-135m-instruct-dflash` answers OpenAI chat completions with the model's own chat
// template (ChatML from the GGUF metadata, default system prompt included), through the official
// `openai` client, drafting with the DFlash drafter trained for it (a fixed draft length here, so the
// test does not depend on the machine's measured costs); and configs/smollm2-{dflash,dspark}.json serve.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { startServe, type CliIo } from '@specd/core';
import { skipWithoutFiles } from './require-files.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const DIR = path.join(ROOT, 'models/smollm2-135m-instruct');
const HAVE = !skipWithoutFiles('specd serve with SmolLM2-135M-Instruct (GGUF)', [
  path.join(DIR, 'SmolLM2-135M-Instruct.Q4_1.gguf'),
]);
const io: CliIo = { stdout: { write: () => true }, stderr: { write: () => true }, cwd: ROOT };

describe.skipIf(!HAVE)('specd serve with SmolLM2-135M-Instruct (GGUF)', () => {
  let s: Awaited<ReturnType<typeof startServe>>;
  let client: OpenAI;
  let tmp: string;
  beforeAll(async () => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-smollm2-serve-'));
    const config = path.join(tmp, 'smollm2.json');
    fs.writeFileSync(
      config,
      JSON.stringify({
        drafter: {
          method: 'dflash',
          path: path.join(ROOT, 'models/smollm2-135m-instruct-dflash'),
          num_draft_tokens: 4,
        },
      }),
    );
    s = await startServe({ config, model: DIR, port: 0, logLevel: 'silent' }, io);
    client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'none' });
  });
  afterAll(async () => {
    await s?.close();
    if (tmp !== undefined) fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('serves the model under its folder name and answers a chat turn with the ChatML template', async () => {
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual(['smollm2-135m-instruct']);
    const r = await client.chat.completions.create({
      model: 'smollm2-135m-instruct',
      messages: [{ role: 'user', content: 'What is the capital of France?' }],
      max_tokens: 24,
      temperature: 0,
    });
    expect(r.choices[0]!.message.content).toMatch(/Paris/);
    expect(r.choices[0]!.finish_reason).toBe('stop'); // <|im_end|> (the GGUF's EOS) ends the turn
    // ChatML with SmolLM2's default system prompt: the rendered prompt is longer than the question
    expect(r.usage!.prompt_tokens).toBeGreaterThan(30);
    // the answer was drafted by DFlash and verified (4 drafts per step)
    expect(s.drafter?.drafter.method).toBe('dflash');
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    const value = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(metrics)?.[1] ?? NaN);
    expect(value('specd_spec_decode_num_draft_tokens_total')).toBeGreaterThan(0);
    expect(value('specd_spec_decode_num_accepted_tokens_total')).toBeGreaterThan(0);
  });

  it('streams the same text as the non-streamed answer', async () => {
    const req = {
      model: 'smollm2-135m-instruct',
      messages: [{ role: 'user' as const, content: 'Name a color.' }],
      max_tokens: 16,
      temperature: 0,
    };
    const whole = (await client.chat.completions.create(req)).choices[0]!.message.content;
    let streamed = '';
    for await (const chunk of await client.chat.completions.create({ ...req, stream: true }))
      streamed += chunk.choices[0]?.delta?.content ?? '';
    expect(streamed).toBe(whole);
  });

  it.each(['dflash', 'dspark'])('configs/smollm2-%s.json serves the same greedy answer', async (method) => {
    const req = {
      model: 'smollm2-135m-instruct',
      messages: [{ role: 'user' as const, content: 'Name a color.' }],
      max_tokens: 16,
      temperature: 0,
    };
    const expected = (await client.chat.completions.create(req)).choices[0]!.message.content;
    const c = await startServe({ config: `configs/smollm2-${method}.json`, port: 0, logLevel: 'silent' }, io);
    try {
      expect(c.drafter?.drafter.method).toBe(method);
      const other = new OpenAI({ baseURL: `${c.url}/v1`, apiKey: 'none' });
      expect((await other.chat.completions.create(req)).choices[0]!.message.content).toBe(expected);
    } finally {
      await c.close();
    }
  });
});
