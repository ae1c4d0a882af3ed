// `logprobs` and `echo` end to end with the official `openai` client against `specd serve` on 127.0.0.1:0, for
// kimi-k3-tiny without speculation and with each shipped drafter (DFlash, DSpark, EAGLE-3; a fixed draft length
// so every step verifies drafts): greedy logprobs (completions and chat, streamed and not, echoed prompts) are
// bit-identical with and without speculation; a stream's pieces add up to the non-streamed field; the numbers are
// of the raw target distribution (equal, within the prefill kernels' tolerance, to the prompt logprobs of an echo
// of prompt + output, whatever the request's temperature and top-p); the shapes are OpenAI's; bad values are 400s.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { CliIo } from '../../src/cli/index.js';
import { startServe, type StartedServer } from '../../src/cli/serve.js';
import { makeTempDir } from '../io/helpers.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const MODEL = 'kimi-k3-tiny';
const DRAFTERS = ['dflash', 'dspark', 'eagle3'] as const;
const tmp = makeTempDir('serve-logprobs');
const io: CliIo = { stdout: { write: () => true }, stderr: { write: () => true }, cwd: ROOT };

type Extra = { ignore_eos?: boolean; return_token_ids?: boolean; top_k?: number };
type CompletionLogprobs = {
  tokens: string[];
  token_logprobs: (number | null)[];
  top_logprobs: (Record<string, number> | null)[];
  text_offset: number[];
};

async function serve(drafter: (typeof DRAFTERS)[number] | undefined): Promise<StartedServer> {
  const cfg = path.join(tmp, `${drafter ?? 'none'}.json`);
  fs.writeFileSync(
    cfg,
    JSON.stringify({
      model: path.join(ROOT, 'models/kimi-k3-tiny'),
      ...(drafter === undefined
        ? {}
        : {
            drafter: {
              method: drafter,
              path: path.join(ROOT, `models/kimi-k3-tiny-${drafter}`),
              num_draft_tokens: 15,
            },
          }),
      scheduler: { max_running_requests: 4, max_sequence_tokens: 512 },
    }),
  );
  return startServe(
    { config: cfg, port: 0, logLevel: 'silent', ...(drafter === undefined ? { spec: false } : {}) },
    io,
  );
}

const clientOf = (s: StartedServer): OpenAI => new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'none', maxRetries: 0 });

/** Every greedy request of the identity test, answered by one server (the numbers exactly as sent). */
async function greedyAnswers(client: OpenAI): Promise<unknown[]> {
  const completion = (p: OpenAI.CompletionCreateParamsNonStreaming & Extra) =>
    client.completions.create(p as OpenAI.CompletionCreateParamsNonStreaming);
  const base = { model: MODEL, temperature: 0, ignore_eos: true } as const;
  const a = await completion({ ...base, prompt: 'The history of the', max_tokens: 40, logprobs: 5 });
  const b = await completion({ ...base, prompt: 'Once upon a time', max_tokens: 24, logprobs: 2, echo: true });
  const c = await client.chat.completions.create({
    model: MODEL,
    temperature: 0,
    max_tokens: 32,
    messages: [{ role: 'user', content: 'Name three colours.' }],
    logprobs: true,
    top_logprobs: 20,
  });
  const stream = await client.completions.create({
    ...base,
    prompt: [1, 2, 3, 4, 5, 6, 7],
    max_tokens: 30,
    logprobs: 3,
    stream: true,
  } as OpenAI.CompletionCreateParamsStreaming);
  const pieces: unknown[] = [];
  for await (const ch of stream) pieces.push(ch.choices[0]?.logprobs);
  return [a.choices[0]?.logprobs, b.choices[0]?.logprobs, c.choices[0]?.logprobs, pieces];
}

describe('logprobs and echo (openai client, kimi-k3-tiny)', () => {
  let plain: StartedServer;
  let client: OpenAI;
  beforeAll(async () => {
    plain = await serve(undefined);
    client = clientOf(plain);
  });
  afterAll(async () => {
    await plain?.close();
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('completions: OpenAI shape; the greedy token is the top alternative; offsets follow the token texts', async () => {
    const r = await client.completions.create({
      model: MODEL,
      prompt: 'The history of the',
      max_tokens: 20,
      temperature: 0,
      logprobs: 5,
      ignore_eos: true,
    } as OpenAI.CompletionCreateParamsNonStreaming);
    const lp = r.choices[0]!.logprobs as CompletionLogprobs;
    expect(Object.keys(lp).sort()).toEqual(['text_offset', 'token_logprobs', 'tokens', 'top_logprobs']);
    expect(lp.tokens.length).toBe(r.usage!.completion_tokens);
    expect(lp.tokens.join('')).toBe(r.choices[0]!.text);
    let offset = 0;
    lp.tokens.forEach((t, i) => {
      expect(lp.text_offset[i]).toBe(offset);
      offset += t.length;
      const top = lp.top_logprobs[i]!;
      const values = Object.values(top);
      // 5 alternatives, and the emitted token (the greedy one is among them unless two texts coincide)
      expect(values.length).toBeGreaterThanOrEqual(1);
      expect(values.length).toBeLessThanOrEqual(6);
      expect(top[t]).toBe(lp.token_logprobs[i]);
      expect(lp.token_logprobs[i]).toBe(Math.max(...values));
      expect(lp.token_logprobs[i]!).toBeLessThanOrEqual(0);
      expect(values.reduce((s, v) => s + Math.exp(v), 0)).toBeLessThanOrEqual(1 + 1e-9);
    });
  });

  it('chat: OpenAI shape, exactly top_logprobs alternatives, descending, bytes = UTF-8 of the token', async () => {
    const r = await client.chat.completions.create({
      model: MODEL,
      temperature: 0,
      max_tokens: 16,
      messages: [{ role: 'user', content: 'Hello' }],
      logprobs: true,
      top_logprobs: 4,
    });
    const content = r.choices[0]!.logprobs!.content!;
    expect(content.length).toBe(r.usage!.completion_tokens);
    for (const c of content) {
      expect(c.bytes).toEqual([...Buffer.from(c.token, 'utf8')]);
      expect(c.top_logprobs.length).toBe(4);
      const values = c.top_logprobs.map((t) => t.logprob);
      expect(values).toEqual([...values].sort((x, y) => y - x));
      expect(c.logprob).toBe(values[0]);
      for (const t of c.top_logprobs) expect(t.bytes).toEqual([...Buffer.from(t.token, 'utf8')]);
    }
    // logprobs: true alone → the token's logprob and no alternatives; no logprobs → null
    const plainLp = await client.chat.completions.create({
      model: MODEL,
      temperature: 0,
      max_tokens: 16,
      messages: [{ role: 'user', content: 'Hello' }],
      logprobs: true,
    });
    const bare = plainLp.choices[0]!.logprobs!.content!;
    expect(bare.map((c) => [c.token, c.logprob])).toEqual(content.map((c) => [c.token, c.logprob]));
    for (const c of bare) expect(c.top_logprobs).toEqual([]);
    const none = await client.chat.completions.create({
      model: MODEL,
      temperature: 0,
      max_tokens: 4,
      messages: [{ role: 'user', content: 'Hello' }],
    });
    expect(none.choices[0]!.logprobs).toBeNull();
  });

  it('a stream carries every token once; its pieces add up to the non-streamed logprobs', async () => {
    const body = { model: MODEL, prompt: 'Once upon a time', max_tokens: 30, temperature: 0, ignore_eos: true };
    const whole = await client.completions.create({
      ...body,
      logprobs: 3,
    } as OpenAI.CompletionCreateParamsNonStreaming);
    const stream = await client.completions.create({
      ...body,
      logprobs: 3,
      stream: true,
    } as OpenAI.CompletionCreateParamsStreaming);
    const got: CompletionLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
    let text = '';
    for await (const ch of stream) {
      text += ch.choices[0]!.text;
      const lp = ch.choices[0]!.logprobs as CompletionLogprobs | null;
      if (lp === null) continue;
      for (const k of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset'] as const)
        (got[k] as unknown[]).push(...lp[k]);
    }
    expect(text).toBe(whole.choices[0]!.text);
    expect(got).toEqual(whole.choices[0]!.logprobs);
    const messages = [{ role: 'user' as const, content: 'Count to five.' }];
    const chat = { model: MODEL, max_tokens: 24, temperature: 0, messages, logprobs: true, top_logprobs: 2 };
    const chatWhole = await client.chat.completions.create(chat);
    const chatStream = await client.chat.completions.create({ ...chat, stream: true });
    const content: unknown[] = [];
    for await (const ch of chatStream) content.push(...(ch.choices[0]?.logprobs?.content ?? []));
    expect(content).toEqual(chatWhole.choices[0]!.logprobs!.content);
  });

  it('echo: the prompt before the completion; with logprobs, prompt logprobs (first null), streamed', async () => {
    const prompt = 'Once upon a time';
    const body = { model: MODEL, prompt, max_tokens: 12, temperature: 0, ignore_eos: true };
    const plainR = await client.completions.create(body as OpenAI.CompletionCreateParamsNonStreaming);
    const echo = await client.completions.create({ ...body, echo: true } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(echo.choices[0]!.text).toBe(prompt + plainR.choices[0]!.text);
    expect(echo.choices[0]!.logprobs).toBeNull();
    const r = await client.completions.create({
      ...body,
      echo: true,
      logprobs: 1,
    } as OpenAI.CompletionCreateParamsNonStreaming);
    const lp = r.choices[0]!.logprobs as CompletionLogprobs;
    const P = r.usage!.prompt_tokens;
    expect(r.choices[0]!.text).toBe(prompt + plainR.choices[0]!.text);
    expect(lp.tokens.length).toBe(P + r.usage!.completion_tokens);
    expect(lp.token_logprobs[0]).toBeNull();
    expect(lp.top_logprobs[0]).toBeNull();
    for (let i = 1; i < lp.tokens.length; i++) {
      expect(lp.token_logprobs[i]).toBeLessThanOrEqual(0);
      expect(lp.top_logprobs[i]![lp.tokens[i]!]).toBe(lp.token_logprobs[i]);
    }
    // the completion's part equals a request without echo
    const noEcho = await client.completions.create({
      ...body,
      logprobs: 1,
    } as OpenAI.CompletionCreateParamsNonStreaming);
    const tail = noEcho.choices[0]!.logprobs as CompletionLogprobs;
    expect(lp.token_logprobs.slice(P)).toEqual(tail.token_logprobs);
    expect(lp.top_logprobs.slice(P)).toEqual(tail.top_logprobs);
    // streamed: the echoed prompt is the first chunk, with its logprobs
    const stream = await client.completions.create({
      ...body,
      echo: true,
      logprobs: 1,
      stream: true,
    } as OpenAI.CompletionCreateParamsStreaming);
    const chunks = [];
    for await (const ch of stream) chunks.push(ch.choices[0]!);
    expect(chunks[0]!.text).toBe(prompt);
    expect((chunks[0]!.logprobs as CompletionLogprobs).token_logprobs.slice(0, P)).toEqual(
      lp.token_logprobs.slice(0, P),
    );
    expect(chunks.map((c) => c.text).join('')).toBe(r.choices[0]!.text);
    const all = chunks.flatMap((c) => (c.logprobs as CompletionLogprobs | null)?.token_logprobs ?? []);
    expect(all).toEqual(lp.token_logprobs);
  });

  it('raw target distribution: sampled or not, logprobs match the echo of prompt + output', async () => {
    const promptIds = [11, 270, 31, 5, 902, 64];
    for (const sampling of [{ temperature: 0 }, { temperature: 1.3, top_p: 0.5, seed: 7 }]) {
      const r = await client.completions.create({
        model: MODEL,
        prompt: promptIds,
        max_tokens: 16,
        logprobs: 0,
        ignore_eos: true,
        return_token_ids: true,
        ...sampling,
      } as OpenAI.CompletionCreateParamsNonStreaming);
      const choice = r.choices[0] as OpenAI.CompletionChoice & { token_ids: number[] };
      const lp = choice.logprobs as CompletionLogprobs;
      expect(lp.token_logprobs.length).toBe(choice.token_ids.length);
      // the same positions scored as a prompt (prefill kernels: equal within their tolerance, not bitwise)
      const scored = await client.completions.create({
        model: MODEL,
        prompt: [...promptIds, ...choice.token_ids],
        max_tokens: 1,
        echo: true,
        logprobs: 0,
      } as OpenAI.CompletionCreateParamsNonStreaming);
      const slp = scored.choices[0]!.logprobs as CompletionLogprobs;
      const P = promptIds.length;
      const n = choice.token_ids.length;
      expect(slp.tokens.slice(P, P + n)).toEqual(lp.tokens);
      for (let i = 0; i < n; i++)
        expect(Math.abs(slp.token_logprobs[P + i]! - lp.token_logprobs[i]!)).toBeLessThan(2e-3);
      if (sampling.temperature > 0) {
        // raw: not the tempered distribution (a token sampled at temperature 1.3 and top-p 0.5 is not the argmax
        // of its row every time, and its logprob is then below the row's best)
        expect(
          lp.token_logprobs.some((v, i) => v! < Math.max(...Object.values(lp.top_logprobs[i]!)) || v! < -1e-3),
        ).toBe(true);
      }
    }
  });

  it('bad values are 400s naming the field', async () => {
    const post = async (route: string, body: object): Promise<{ status: number; param: unknown }> => {
      const res = await fetch(`${plain.url}/v1/${route}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, max_tokens: 2, ...body }),
      });
      return { status: res.status, param: ((await res.json()) as { error: { param: unknown } }).error?.param };
    };
    const messages = [{ role: 'user', content: 'hi' }];
    expect(await post('completions', { prompt: 'a', logprobs: 6 })).toEqual({ status: 400, param: 'logprobs' });
    expect(await post('completions', { prompt: 'a', logprobs: 1.5 })).toEqual({ status: 400, param: 'logprobs' });
    expect(await post('completions', { prompt: 'a', echo: 'yes' })).toEqual({ status: 400, param: 'echo' });
    expect(await post('chat/completions', { messages, top_logprobs: 2 })).toEqual({
      status: 400,
      param: 'top_logprobs',
    });
    expect(await post('chat/completions', { messages, logprobs: true, top_logprobs: 21 })).toEqual({
      status: 400,
      param: 'top_logprobs',
    });
    expect(await post('chat/completions', { messages, logprobs: 3 })).toEqual({ status: 400, param: 'logprobs' });
    expect(await post('chat/completions', { messages, echo: true })).toEqual({ status: 400, param: 'echo' });
  });

  it('greedy logprobs are bit-identical with and without speculation, for every drafter', async () => {
    const reference = await greedyAnswers(client);
    for (const d of DRAFTERS) {
      const s = await serve(d);
      try {
        const got = await greedyAnswers(clientOf(s));
        const totals = s.server.metrics.specTotals;
        // every step verified drafts, some of them accepted: accepted, recovered and bonus tokens all took part
        expect(totals.draftTokens, d).toBeGreaterThan(0);
        expect(totals.acceptedTokens, d).toBeGreaterThan(0);
        expect(got, d).toEqual(reference);
      } finally {
        await s.close();
      }
    }
  });
});
