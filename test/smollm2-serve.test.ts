// Issue #7, "Serving": `specd serve --model models/smollm2-135m-instruct` answers OpenAI chat
// completions with the model's own chat template (ChatML from the GGUF metadata, default system
// prompt included), through the official `openai` client; greedy output equals `specd generate`'s
// on the same rendered prompt.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { startServe, type CliIo } from '@specd/core';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const DIR = path.join(ROOT, 'models/smollm2-135m-instruct');
const HAVE = fs.existsSync(path.join(DIR, 'SmolLM2-135M-Instruct.Q4_1.gguf'));
const io: CliIo = { stdout: { write: () => true }, stderr: { write: () => true }, cwd: ROOT };

describe.skipIf(!HAVE)('specd serve with SmolLM2-135M-Instruct (GGUF)', () => {
  let s: Awaited<ReturnType<typeof startServe>>;
  let client: OpenAI;
  beforeAll(async () => {
    s = await startServe({ model: DIR, spec: false, port: 0, logLevel: 'silent' }, io);
    client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'none' });
  });
  afterAll(async () => s?.close());

  it('serves the model under its folder name and answers a chat turn with the ChatML template', async () => {
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual(['smollm2-135m-instruct']);
    const r = await client.chat.completions.create({
      model: 'smollm2-135m-instruct', messages: [{ role: 'user', content: 'What is the capital of France?' }], max_tokens: 24, temperature: 0,
    });
    expect(r.choices[0]!.message.content).toMatch(/Paris/);
    expect(r.choices[0]!.finish_reason).toBe('stop'); // <|im_end|> (the GGUF's EOS) ends the turn
    // ChatML with SmolLM2's default system prompt: the rendered prompt is longer than the question
    expect(r.usage!.prompt_tokens).toBeGreaterThan(30);
  });

  it('streams the same text as the non-streamed answer', async () => {
    const req = { model: 'smollm2-135m-instruct', messages: [{ role: 'user' as const, content: 'Name a color.' }], max_tokens: 16, temperature: 0 };
    const whole = (await client.chat.completions.create(req)).choices[0]!.message.content;
    let streamed = '';
    for await (const chunk of await client.chat.completions.create({ ...req, stream: true })) streamed += chunk.choices[0]?.delta?.content ?? '';
    expect(streamed).toBe(whole);
  });
});
