// The OpenAI/vLLM surface around sampling, with the official `openai` client against a real server on an ephemeral
// port of 127.0.0.1: `n` > 1 and lists of prompts (indices, seeds seed + j, greedy choices equal, usage, streamed
// chunks by index), fields refused with a 400 naming them, metadata fields accepted, unknown fields logged once,
// vLLM's /tokenize and /detokenize, and X-Request-Id echoed and used by the log.
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { BUILTIN_PLUGIN_PACKAGES } from '../../src/plugin/registry.js';
import { type LoadedDrafter, loadDrafter } from '../../src/runtime/drafter.js';
import { type LoadedTarget, loadTarget } from '../../src/runtime/target.js';
import { SpecdServer } from '../../src/serve/index.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const MODEL = 'kimi-k3-tiny';
const MAX_LEN = 1024;

let target: LoadedTarget;
let drafter: LoadedDrafter;
let server: SpecdServer;
let url: string;
let client: OpenAI;
/** The log's JSON records, in order. */
const records: Record<string, unknown>[] = [];

beforeAll(async () => {
  target = await loadTarget(path.join(ROOT, 'models', MODEL), BUILTIN_PLUGIN_PACKAGES);
  drafter = await loadDrafter(path.join(ROOT, 'models/kimi-k3-tiny-dflash'), BUILTIN_PLUGIN_PACKAGES, target, 1024, 4);
  const logger = pino({ level: 'info' }, { write: (line: string) => records.push(JSON.parse(line)) });
  server = new SpecdServer({
    target,
    drafter: drafter.drafter,
    modelName: MODEL,
    sampling: { temperature: 0, top_p: 1, top_k: 0, max_tokens: 64 },
    scheduler: {
      max_running_requests: 4,
      max_waiting_requests: 16,
      prefill_chunk_tokens: 64,
      max_tokens_in_flight: 8192,
      max_sequence_tokens: MAX_LEN,
      page_size: 16,
    },
    bodyLimitBytes: 1 << 20,
    numDraftTokens: 4,
    logger,
    statsIntervalMs: 0,
  });
  url = await server.listen('127.0.0.1', 0);
  client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 });
}, 120_000);
afterAll(async () => {
  await server?.close();
  drafter?.drafter.dispose();
  target?.model.dispose();
});

type Extra = { ignore_eos?: boolean; [key: string]: unknown };
const complete = (p: Omit<OpenAI.CompletionCreateParamsNonStreaming, 'model'> & Extra) =>
  client.completions.create({ model: MODEL, ...p } as OpenAI.CompletionCreateParamsNonStreaming);
const chat = (p: Omit<OpenAI.ChatCompletionCreateParamsNonStreaming, 'model'> & Extra) =>
  client.chat.completions.create({ model: MODEL, ...p } as OpenAI.ChatCompletionCreateParamsNonStreaming);
const MESSAGES: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: 'Tell me about rivers.' }];

/** `xs[i]`, which must exist. @throws {Error} naming the index when it does not. */
function at<T>(xs: readonly T[], i: number): T {
  const x = xs[i];
  if (x === undefined) throw new Error(`no element ${i} (length ${xs.length})`);
  return x;
}

/** A response's usage, which must be there. @throws {Error} when it is not. */
function usageOf(r: { usage?: OpenAI.CompletionUsage | undefined }): OpenAI.CompletionUsage {
  if (r.usage === undefined) throw new Error('the response has no usage');
  return r.usage;
}

/** The error a promise rejects with (fails the test when it resolves). */
async function refusal(p: Promise<unknown>): Promise<InstanceType<typeof OpenAI.APIError>> {
  try {
    await p;
  } catch (err) {
    if (err instanceof OpenAI.APIError) return err;
    throw err;
  }
  throw new Error('expected the request to be refused');
}

const post = (route: string, body: unknown, headers: Record<string, string> = {}, signal?: AbortSignal) =>
  fetch(`${url}${route}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
    ...(signal === undefined ? {} : { signal }),
  });

describe('n > 1 and lists of prompts', () => {
  it('greedy n = 3: three choices, indices 0..2, each the n = 1 text; usage counts the prompt once', async () => {
    const prompt = 'The history of the';
    const one = await complete({ prompt, max_tokens: 16, temperature: 0, ignore_eos: true });
    const r = await complete({ prompt, max_tokens: 16, temperature: 0, ignore_eos: true, n: 3 });
    expect(r.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    for (const c of r.choices) {
      expect(c.text).toBe(at(one.choices, 0).text);
      expect(c.finish_reason).toBe('length');
    }
    const P = usageOf(one).prompt_tokens;
    expect(r.usage).toEqual({ prompt_tokens: P, completion_tokens: 48, total_tokens: P + 48 });
  });

  it('seeded sampling: choice j of seed s is the n = 1 request with seed s + j (completions and chat)', async () => {
    const prompt = 'Once upon a time there was';
    const base = { prompt, max_tokens: 12, temperature: 1, ignore_eos: true };
    const r = await complete({ ...base, n: 3, seed: 1234 });
    const texts = r.choices.map((c) => c.text);
    for (let j = 0; j < 3; j++) {
      const alone = await complete({ ...base, seed: 1234 + j });
      expect(texts[j]).toBe(at(alone.choices, 0).text);
    }
    expect(new Set(texts).size).toBeGreaterThan(1); // independent samples
    const c = await chat({ messages: MESSAGES, max_tokens: 10, temperature: 1, n: 2, seed: 77, ignore_eos: true });
    expect(c.choices.map((x) => x.index)).toEqual([0, 1]);
    for (let j = 0; j < 2; j++) {
      const alone = await chat({ messages: MESSAGES, max_tokens: 10, temperature: 1, seed: 77 + j, ignore_eos: true });
      expect(at(c.choices, j).message.content).toBe(at(alone.choices, 0).message.content);
      expect(at(c.choices, j).message.role).toBe('assistant');
    }
    expect(usageOf(c).completion_tokens).toBe(20);
  });

  it('a list of prompts × n: index = prompt_i × n + j, each the prompt sent alone; usage sums', async () => {
    const prompts = ['In the beginning', 'The history of the'];
    const alone = await Promise.all(
      prompts.map((prompt) => complete({ prompt, max_tokens: 8, temperature: 0, ignore_eos: true })),
    );
    const r = await complete({ prompt: prompts, max_tokens: 8, temperature: 0, ignore_eos: true, n: 2 });
    expect(r.choices.map((c) => c.index)).toEqual([0, 1, 2, 3]);
    for (let i = 0; i < 2; i++)
      for (let j = 0; j < 2; j++) expect(at(r.choices, i * 2 + j).text).toBe(at(at(alone, i).choices, 0).text);
    const P = usageOf(at(alone, 0)).prompt_tokens + usageOf(at(alone, 1)).prompt_tokens;
    expect(r.usage).toEqual({ prompt_tokens: P, completion_tokens: 32, total_tokens: P + 32 });
    // token-id prompts too
    const ids = prompts.map((p) => Array.from(target.tokenizer.encode(p, { addSpecialTokens: false })));
    const byIds = await complete({ prompt: ids, max_tokens: 8, temperature: 0, ignore_eos: true });
    expect(byIds.choices.map((c) => c.text)).toEqual(alone.map((a) => at(a.choices, 0).text));
  });

  it('streaming: chunks carry their index, the texts equal the non-streamed ones, one usage chunk', async () => {
    const prompts = ['In the beginning', 'Once upon a time there was'];
    const body = { model: MODEL, prompt: prompts, max_tokens: 10, temperature: 0, ignore_eos: true, n: 2 };
    const whole = await complete(body);
    const stream = await client.completions.create({
      ...body,
      stream: true,
      stream_options: { include_usage: true },
    } as OpenAI.CompletionCreateParamsStreaming);
    const texts = ['', '', '', ''];
    const finishes: (string | null)[] = [null, null, null, null];
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const c of stream) {
      for (const ch of c.choices) {
        texts[ch.index] += ch.text;
        if (ch.finish_reason !== null) {
          expect(finishes[ch.index]).toBeNull();
          finishes[ch.index] = ch.finish_reason;
        }
      }
      if (c.usage) {
        expect(usage).toBeUndefined();
        usage = c.usage;
      }
    }
    expect(texts).toEqual(whole.choices.map((c) => c.text));
    expect(finishes).toEqual(['length', 'length', 'length', 'length']);
    expect(usage).toEqual(whole.usage);

    const chatStream = await client.chat.completions.create({
      model: MODEL,
      messages: MESSAGES,
      max_tokens: 8,
      temperature: 0,
      n: 2,
      stream: true,
    });
    const chatTexts = ['', ''];
    const roles = [0, 0];
    for await (const c of chatStream)
      for (const ch of c.choices) {
        chatTexts[ch.index] += ch.delta.content ?? '';
        if (ch.delta.role === 'assistant') roles[ch.index] = at(roles, ch.index) + 1;
      }
    const chatWhole = await chat({ messages: MESSAGES, max_tokens: 8, temperature: 0 });
    expect(chatTexts).toEqual([at(chatWhole.choices, 0).message.content, at(chatWhole.choices, 0).message.content]);
    expect(roles).toEqual([1, 1]);
  });

  it('every choice leaves the loop: no page or slot held afterwards', async () => {
    await complete({ prompt: ['a b c', 'd e f'], max_tokens: 4, temperature: 0, n: 3 });
    expect(server.loop.running + server.loop.waiting).toBe(0);
    expect(server.engine.cache.slotsInUse).toBe(0);
  });

  it('choices that never fit: 400 naming n; that do not fit now: 503, the queued ones aborted', async () => {
    // max_waiting_requests 16
    const many = await refusal(complete({ prompt: 'The history of the', max_tokens: 4, n: 20 }));
    expect([many.status, many.param, many.message]).toEqual([
      400,
      'n',
      '400 n: 20 choices (prompts × n) exceed scheduler.max_waiting_requests (16)',
    ]);
    const long = await refusal(complete({ prompt: 'x', max_tokens: 900, n: 10 }));
    expect([long.status, long.param, long.message.includes('max_tokens_in_flight (8192)')]).toEqual([400, 'n', true]);
    // a running request holds ~900 of the 8192 tokens in flight: 9 choices of ~900 fit alone, not beside it
    const ctl = new AbortController();
    const body = { model: MODEL, prompt: 'x y', max_tokens: 900, ignore_eos: true, stream: true };
    const running = await post('/v1/completions', body, {}, ctl.signal);
    await running.body?.getReader().read();
    const busy = await refusal(complete({ prompt: 'x', max_tokens: 900, n: 9, ignore_eos: true }));
    expect([busy.status, busy.code]).toEqual([503, 'overloaded']);
    expect(server.loop.running + server.loop.waiting).toBe(1); // the 8 queued choices were aborted
    ctl.abort();
    while (server.loop.running + server.loop.waiting > 0) await server.loop.whenFreed();
    expect(server.engine.pending).toBe(0);
    const ok = await complete({ prompt: 'The history of the', max_tokens: 4, n: 2 });
    expect(ok.choices).toHaveLength(2);
  });

  it('a client that leaves a stream of several choices aborts them all; their slots are freed', async () => {
    const ctl = new AbortController();
    const before = server.loop.generatedTokens;
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: 'x y', max_tokens: 900, ignore_eos: true, n: 3, stream: true }),
      signal: ctl.signal,
    });
    const reader = r.body?.getReader();
    const first = await reader?.read();
    expect(new TextDecoder().decode(first?.value)).toContain('"index":');
    expect(server.loop.running + server.loop.waiting).toBe(3);
    ctl.abort();
    // event-driven: wait for the loop to release each choice (the test's timeout is the hang guard)
    while (server.loop.running + server.loop.waiting > 0) await server.loop.whenFreed();
    expect(server.engine.cache.slotsInUse).toBe(0);
    expect(server.loop.generatedTokens - before).toBeLessThan(3 * 900); // aborted, not finished
  });

  it('n out of range and a mixed prompt list are 400s naming the field', async () => {
    for (const n of [0, 129, 1.5]) {
      const e = await refusal(complete({ prompt: 'x', max_tokens: 2, n }));
      expect([e.status, e.param]).toEqual([400, 'n']);
    }
    const e = await refusal(complete({ prompt: ['x', [1, 2]] as unknown as string[], max_tokens: 2 }));
    expect([e.status, e.param]).toEqual([400, 'prompt']);
    // vLLM's prompt_logprobs is not implemented: refused, not dropped (completions' echo + logprobs serves it)
    const pl = await refusal(complete({ prompt: 'x', max_tokens: 2, prompt_logprobs: 1 }));
    expect([pl.status, pl.param]).toEqual([400, 'prompt_logprobs']);
  });

  it('logprobs, echo, min_tokens and stop ids per choice: each choice answers what it would alone', async () => {
    const prompts = ['In the beginning', 'The history of the'];
    const base = { max_tokens: 6, temperature: 1, seed: 41, ignore_eos: true, logprobs: 2, echo: true };
    const r = await complete({ ...base, prompt: prompts, n: 2 });
    for (let i = 0; i < 2; i++)
      for (let j = 0; j < 2; j++) {
        const res = await complete({ ...base, prompt: at(prompts, i), seed: 41 + j });
        const alone = at(res.choices, 0);
        const c = at(r.choices, i * 2 + j);
        expect(c.text.startsWith(at(prompts, i))).toBe(true);
        expect(c.text).toBe(alone.text);
        expect(c.logprobs).toEqual(alone.logprobs);
        // the echoed prompt's tokens, then 6 generated ones; the first prompt token has no logprob
        expect(c.logprobs?.token_logprobs?.[0]).toBeNull();
        expect(c.logprobs?.tokens?.length).toBe(usageOf(res).total_tokens);
      }
    // chat: top_logprobs per choice, streamed and not, equal to the request alone
    const chatBase = { messages: MESSAGES, max_tokens: 5, temperature: 1, logprobs: true, top_logprobs: 3 };
    const many = await chat({ ...chatBase, n: 2, seed: 9 });
    const chunks: OpenAI.ChatCompletionTokenLogprob[][] = [[], []];
    const stream = await client.chat.completions.create({ model: MODEL, ...chatBase, n: 2, seed: 9, stream: true });
    for await (const c of stream)
      for (const ch of c.choices) at(chunks, ch.index).push(...(ch.logprobs?.content ?? []));
    for (let j = 0; j < 2; j++) {
      const alone = at((await chat({ ...chatBase, seed: 9 + j })).choices, 0);
      expect(at(many.choices, j).logprobs).toEqual(alone.logprobs);
      expect(at(chunks, j)).toEqual(alone.logprobs?.content);
      expect(alone.logprobs?.content?.length).toBe(5);
      for (const p of alone.logprobs?.content ?? []) expect(p.top_logprobs.length).toBe(3);
    }
    // min_tokens and stop_token_ids (its text dropped) as for one choice
    const ids = Array.from(target.tokenizer.encode(' the', { addSpecialTokens: false }));
    const stopBody = {
      prompt: 'The history of the',
      max_tokens: 12,
      temperature: 0,
      stop_token_ids: ids,
      min_tokens: 3,
    };
    const one = at((await complete(stopBody)).choices, 0);
    const two = await complete({ ...stopBody, n: 2 });
    for (const c of two.choices) expect([c.text, c.finish_reason]).toEqual([one.text, one.finish_reason]);
  });
});

describe('fields refused, accepted and logged', () => {
  it('what would change the output and is not implemented: a 400 naming the field', async () => {
    const cases: [Extra, string][] = [
      [{ response_format: { type: 'json_object' } }, 'response_format'],
      [{ tools: [{ type: 'function', function: { name: 'f' } }] }, 'tools'],
      [{ tool_choice: 'required' }, 'tool_choice'],
      [{ functions: [{ name: 'f' }] }, 'functions'],
      [{ function_call: { name: 'f' } }, 'function_call'],
      [{ best_of: 3, n: 2 }, 'best_of'],
      [{ guided_json: { type: 'object' } }, 'guided_json'],
      [{ guided_regex: 'a+' }, 'guided_regex'],
      [{ min_p: 0.1 }, 'min_p'],
    ];
    for (const [extra, param] of cases) {
      const e = await refusal(chat({ messages: MESSAGES, max_tokens: 2, ...extra }));
      expect([e.status, e.param, e.message.includes(param)]).toEqual([400, param, true]);
    }
    const e = await refusal(complete({ prompt: 'x', max_tokens: 2, suffix: 'y' }));
    expect([e.status, e.param]).toEqual([400, 'suffix']);
    expect(server.loop.running + server.loop.waiting).toBe(0);
  });

  it('metadata fields and no-op tool settings are accepted and change nothing', async () => {
    const plain = await chat({ messages: MESSAGES, max_tokens: 6, temperature: 0 });
    const r = await chat({
      messages: MESSAGES,
      max_tokens: 6,
      temperature: 0,
      user: 'u-1',
      metadata: { team: 'a' },
      store: false,
      service_tier: 'auto',
      parallel_tool_calls: false,
      tool_choice: 'none',
      tools: [],
      response_format: { type: 'text' },
      best_of: 1,
    });
    expect(at(r.choices, 0).message.content).toBe(at(plain.choices, 0).message.content);
  });

  it('an unknown field is logged once per name (warn), then ignored', async () => {
    const warned = () => records.filter((r) => r.level === 40 && r.field === 'frobnicate');
    expect(warned()).toHaveLength(0);
    for (let i = 0; i < 2; i++) await complete({ prompt: 'x', max_tokens: 2, frobnicate: i });
    expect(warned()).toHaveLength(1);
    expect(String(at(warned(), 0).msg)).toContain('frobnicate');
    expect(server.unknownFields.logged).toContain('frobnicate');
  });
});

describe('/tokenize and /detokenize (vLLM)', () => {
  it('a prompt: its ids with special tokens by default, count and max_model_len', async () => {
    const prompt = 'The history of the';
    const r = (await (await post('/tokenize', { model: MODEL, prompt })).json()) as Record<string, unknown>;
    const withSpecial = Array.from(target.tokenizer.encode(prompt, { addSpecialTokens: true }));
    expect(r).toEqual({ count: withSpecial.length, max_model_len: MAX_LEN, tokens: withSpecial });
    const bare = (await (await post('/tokenize', { prompt, add_special_tokens: false })).json()) as {
      tokens: number[];
    };
    // the ids a completion runs on
    const c = await complete({ prompt, max_tokens: 1 });
    expect(bare.tokens).toEqual(Array.from(target.tokenizer.encode(prompt, { addSpecialTokens: false })));
    expect(bare.tokens.length).toBe(usageOf(c).prompt_tokens);
  });

  it('messages: the chat template rendered with the generation prompt, as a chat request runs', async () => {
    const r = (await (await post('/tokenize', { messages: MESSAGES })).json()) as { count: number; tokens: number[] };
    const c = await chat({ messages: MESSAGES, max_tokens: 1 });
    expect(r.count).toBe(usageOf(c).prompt_tokens);
    const text = server.prompts.renderChat({ messages: [{ role: 'user', content: 'Tell me about rivers.' }] });
    expect(r.tokens).toEqual(Array.from(target.tokenizer.encode(text, { addSpecialTokens: false })));
  });

  it('/detokenize inverts /tokenize; bad ids, fields and models are refused naming them', async () => {
    const prompt = 'Once upon a time there was';
    const { tokens } = (await (await post('/tokenize', { prompt, add_special_tokens: false })).json()) as {
      tokens: number[];
    };
    expect(await (await post('/detokenize', { model: MODEL, tokens })).json()).toEqual({ prompt });
    const V = target.model.info.vocabSize;
    const bad = await post('/detokenize', { tokens: [1, V] });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { param: string } }).error.param).toBe('tokens[1]');
    const both = await post('/tokenize', { prompt: 'a', messages: MESSAGES });
    expect([both.status, ((await both.json()) as { error: { param: string } }).error.param]).toEqual([400, 'prompt']);
    expect((await post('/tokenize', { model: 'other', prompt: 'a' })).status).toBe(404);
    const big = await post('/tokenize', { prompt: 'x'.repeat(server.prompts.maxPromptChars + 1) });
    expect(((await big.json()) as { error: { code: string } }).error.code).toBe('context_length_exceeded');
  });
});

describe('X-Request-Id', () => {
  it("echoes the client's id (JSON, stream and errors) and the log line carries it", async () => {
    const id = 'client-req-42';
    const r = await post('/v1/completions', { model: MODEL, prompt: 'x', max_tokens: 2 }, { 'x-request-id': id });
    expect(r.status).toBe(200);
    expect(r.headers.get('x-request-id')).toBe(id);
    await r.json();
    const done = records.find((x) => x.reqId === id && x.msg === 'incoming request');
    expect(done).toBeDefined();
    const streamed = await post(
      '/v1/chat/completions',
      { model: MODEL, messages: MESSAGES, max_tokens: 2, stream: true, n: 2 },
      { 'x-request-id': 'client-stream-7' },
    );
    expect(streamed.headers.get('x-request-id')).toBe('client-stream-7');
    expect(await streamed.text()).toContain('data: [DONE]');
    const refused = await post('/v1/completions', { model: MODEL, prompt: 'x', n: 0 }, { 'x-request-id': 'e-1' });
    expect([refused.status, refused.headers.get('x-request-id')]).toEqual([400, 'e-1']);
  });

  it('without the header: a generated UUID, echoed and logged', async () => {
    const r = await fetch(`${url}/health`);
    const id = r.headers.get('x-request-id');
    expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
    await r.json();
    expect(records.some((x) => x.reqId === id && x.msg === 'incoming request')).toBe(true);
  });
});
