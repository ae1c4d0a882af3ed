// The PD router against fake prefill and decode servers (fastify on 127.0.0.1, port 0) that speak the
// internal protocol (/pd/info, /pd/prefill, /pd/decode, /pd/abort, /health, /v1/models), with the official
// `openai` client against the router: completions and chat, streaming and not; the prompt ids P and D receive
// are the tokenizer's (and the chat template's); failures on either side reach the client with their status
// and abort the other side; a client that disconnects aborts both; health checks take a dead D out of rotation
// and bring it back; round robin; one request id everywhere; /health, /v1/models, /metrics.
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';

import Fastify, { type FastifyInstance } from 'fastify';
import OpenAI from 'openai';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { ChatTemplate } from '../../src/serve/chat-template.js';
import { BUILTIN_PLUGIN_PACKAGES } from '../../src/plugin/registry.js';
import { loadTarget } from '../../src/runtime/target.js';
import { loadPromptBuilder, PromptBuilder } from '../../src/serve/prompt.js';
import { parseChatRequest, parseCompletionRequest } from '../../src/serve/protocol.js';
import { Tokenizer } from '../../src/io/tokenizer.js';
import { PdError } from '../../src/pd/types.js';
import { PdRouter, type PdRouterOptions } from '../../src/pd/router.js';
import { RandomPolicy, RoundRobinPolicy, createPdPolicy } from '../../src/pd/policy.js';
import { main, startRouter, type CliIo } from '../../src/cli/index.js';
import { makeTempDir } from '../io/helpers.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const MODEL_DIR = path.join(ROOT, 'models/kimi-k3-tiny');
const MODEL = 'kimi-k3-tiny';
const SAMPLING = { temperature: 0, top_p: 1, top_k: 0, max_tokens: 8 };

/** What a fake got on /pd/prefill or /pd/decode. */
interface Received {
  readonly requestIdHeader: string | undefined;
  readonly body: {
    request_id: string;
    room: number;
    kind: string;
    prompt_ids: number[];
    bootstrap: string;
    body: Record<string, unknown>;
  };
}

/**
 * How a fake answers its next /pd/prefill or /pd/decode: normally, with an error, not until aborted, or by dropping
 * the connection without an answer (the next `times` requests; then normally).
 */
type Mode =
  | { kind: 'ok' }
  | { kind: 'error'; status: number; message: string }
  | { kind: 'hang' }
  | { kind: 'drop'; times: number };

/** The words a fake D generates: a function of the prompt ids, so the test can predict them. */
function words(ids: readonly number[], n: number): string[] {
  const last = ids[ids.length - 1] ?? 0;
  return Array.from({ length: n }, (_, i) => ` w${(last + i) % 1000}`);
}

/** The one fake of `fakes` that got exactly one request (throws otherwise), and that request. */
function theOne(fakes: readonly FakeUpstream[]): { fake: FakeUpstream; got: Received } {
  const hit = fakes.filter((u) => u.received.length === 1);
  const got = hit[0]?.received[0];
  if (hit.length !== 1 || hit[0] === undefined || got === undefined)
    throw new Error(`expected one fake with one request, got ${fakes.map((u) => u.received.length).join(', ')}`);
  return { fake: hit[0], got };
}

/** Resolves when `check` holds, polling every 5 ms at most `bound` times (throws naming `what` otherwise). */
async function until(what: string, check: () => boolean | Promise<boolean>, bound = 400): Promise<void> {
  for (let i = 0; i < bound; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 5));
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** A fake prefill or decode server that records what it gets. */
class FakeUpstream {
  readonly app: FastifyInstance = Fastify({ logger: false, forceCloseConnections: true });
  readonly received: Received[] = [];
  readonly aborts: { room: number; request_id: string; reason: string }[] = [];
  /** Rooms whose /pd/prefill or /pd/decode request was closed by the router before it was answered. */
  readonly closedEarly: number[] = [];
  healthy = true;
  mode: Mode = { kind: 'ok' };
  /** Decode only: after the first streamed chunk, wait until the router closes the request. */
  stallAfterFirstChunk = false;
  /** Decode only: after the first streamed chunk, drop the connection (a decode server that dies). */
  dieAfterFirstChunk = false;
  /** Answer 409 to a room already received (as P and D refuse a room in use). */
  refuseRepeatedRooms = false;
  url = '';

  constructor(
    readonly role: 'prefill' | 'decode',
    readonly name: string,
  ) {
    const app = this.app;
    app.get('/pd/info', async () =>
      role === 'prefill'
        ? { role, bootstrap: `tcp://127.0.0.1:${5500 + name.length}`, model: MODEL }
        : { role, model: MODEL },
    );
    app.get('/health', async (_req, reply) => reply.code(this.healthy ? 200 : 503).send({ status: 'ok' }));
    app.get('/v1/models', async () => ({ object: 'list', data: [{ id: MODEL, object: 'model', owned_by: name }] }));
    app.post('/pd/abort', async (req) => {
      this.aborts.push(req.body as FakeUpstream['aborts'][number]);
      return { ok: true };
    });
    app.post(`/pd/${role}`, async (req, reply) => {
      const body = req.body as Received['body'];
      const repeated = this.received.some((g) => g.body.room === body.room);
      this.received.push({ requestIdHeader: req.headers['x-request-id'] as string | undefined, body });
      if (this.refuseRepeatedRooms && repeated)
        return reply.code(409).send({
          error: { message: `room ${body.room}: already in use`, type: 'invalid_request_error', param: null },
        });
      const mode = this.mode;
      if (mode.kind === 'drop') {
        if (--mode.times <= 0) this.mode = { kind: 'ok' };
        reply.hijack();
        req.raw.socket.destroy(); // the request was read; no answer, the connection closes
        return;
      }
      if (mode.kind === 'hang') {
        await new Promise<void>((resolve) => reply.raw.on('close', resolve));
        this.closedEarly.push(body.room);
        return reply;
      }
      if (mode.kind === 'error')
        return reply
          .code(mode.status)
          .send({ error: { message: mode.message, type: 'invalid_request_error', param: null, code: 'x' } });
      if (role === 'prefill') return { request_id: body.request_id, prompt_tokens: body.prompt_ids.length };
      return this.decode(body, reply);
    });
  }

  private async decode(body: Received['body'], reply: import('fastify').FastifyReply): Promise<unknown> {
    const chat = body.kind === 'chat';
    const n = Number(body.body.max_tokens ?? body.body.max_completion_tokens ?? SAMPLING.max_tokens);
    const pieces = words(body.prompt_ids, n);
    const usage = {
      prompt_tokens: body.prompt_ids.length,
      completion_tokens: n,
      total_tokens: body.prompt_ids.length + n,
    };
    const id = `${chat ? 'chatcmpl' : 'cmpl'}-${body.room}`;
    const model = MODEL;
    if (body.body.stream !== true) {
      const text = pieces.join('');
      const choice = chat
        ? { index: 0, message: { role: 'assistant', content: text }, logprobs: null, finish_reason: 'length' }
        : { index: 0, text, logprobs: null, finish_reason: 'length' };
      return { id, object: chat ? 'chat.completion' : 'text_completion', created: 1, model, choices: [choice], usage };
    }
    reply.hijack();
    const raw = reply.raw;
    raw.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
    const object = chat ? 'chat.completion.chunk' : 'text_completion';
    const chunk = (text: string | undefined, i: number, finish: string | null): string => {
      const choice = chat
        ? {
            index: 0,
            delta: text === undefined ? {} : i === 0 ? { role: 'assistant', content: text } : { content: text },
            finish_reason: finish,
          }
        : { index: 0, text: text ?? '', logprobs: null, finish_reason: finish };
      return `data: ${JSON.stringify({ id, object, created: 1, model, choices: [choice] })}\n\n`;
    };
    if (this.dieAfterFirstChunk) {
      raw.write(chunk(pieces[0], 0, null), () => raw.destroy()); // the chunk is out, then the connection drops
      return;
    }
    raw.write(chunk(pieces[0], 0, null));
    if (this.stallAfterFirstChunk) {
      await new Promise<void>((resolve) => raw.on('close', resolve));
      this.closedEarly.push(body.room);
      return;
    }
    for (let i = 1; i < pieces.length; i++) raw.write(chunk(pieces[i], i, null));
    raw.write(chunk(chat ? undefined : '', pieces.length, 'length'));
    raw.end('data: [DONE]\n\n');
  }

  async start(): Promise<this> {
    this.url = await this.app.listen({ host: '127.0.0.1', port: 0 });
    return this;
  }

  reset(): void {
    this.received.length = 0;
    this.aborts.length = 0;
    this.closedEarly.length = 0;
    this.mode = { kind: 'ok' };
    this.stallAfterFirstChunk = false;
    this.dieAfterFirstChunk = false;
    this.refuseRepeatedRooms = false;
    this.healthy = true;
  }
}

let prompts: PromptBuilder;
let tokenizer: Tokenizer;
const p0 = new FakeUpstream('prefill', 'p0');
const p1 = new FakeUpstream('prefill', 'p1');
const d0 = new FakeUpstream('decode', 'd0');
const d1 = new FakeUpstream('decode', 'd1');
const P = [p0, p1];
const D = [d0, d1];
const all = [...P, ...D];
const logLines: Record<string, unknown>[] = [];
let router: PdRouter;
let url: string;
let client: OpenAI;

const newRouter = async (o: Partial<PdRouterOptions>): Promise<{ router: PdRouter; url: string }> => {
  const r = new PdRouter({
    prefill: P.map((p) => p.url),
    decode: D.map((d) => d.url),
    prompts,
    sampling: SAMPLING,
    healthIntervalMs: 0,
    ...o,
  });
  return { router: r, url: await r.listen('127.0.0.1', 0) };
};

beforeAll(async () => {
  prompts = loadPromptBuilder(MODEL_DIR);
  tokenizer = Tokenizer.load(MODEL_DIR);
  await Promise.all(all.map((u) => u.start()));
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const line of chunk.toString().split('\n')) if (line !== '') logLines.push(JSON.parse(line));
      cb();
    },
  });
  ({ router, url } = await newRouter({ logger: pino({ level: 'info' }, sink) }));
  client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
afterAll(async () => {
  await router?.close();
  await Promise.all(all.map((u) => u.app.close()));
});

const resetAll = (): void => {
  for (const u of all) u.reset();
};

async function metric(base: string, name: string, labels: Record<string, string> = {}): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const want = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || !(line.startsWith(`${name}{`) || line.startsWith(`${name} `))) continue;
    if (want.every((w) => line.includes(w))) sum += Number(line.split(' ').pop());
  }
  return sum;
}

describe('specd router against fake prefill and decode servers (openai client)', () => {
  it("a completion: P and D get one request, with the tokenizer's prompt ids and P's bootstrap address", async () => {
    resetAll();
    const prompt = 'The history of the';
    const r = await client.completions.create({ model: MODEL, prompt, max_tokens: 5 });
    const ids = Array.from(tokenizer.encode(prompt, { addSpecialTokens: false }));
    expect(r.choices[0]?.text).toBe(words(ids, 5).join(''));
    expect(r.usage?.prompt_tokens).toBe(ids.length);
    const got = [...P, ...D].flatMap((u) => u.received);
    expect(got).toHaveLength(2);
    const { fake: prefill, got: p } = theOne(P);
    const { got: d } = theOne(D);
    expect(p.body).toEqual(d.body);
    expect(p.body.prompt_ids).toEqual(ids);
    expect(p.body.kind).toBe('completion');
    expect(Number.isSafeInteger(p.body.room)).toBe(true);
    expect(p.body.bootstrap).toBe(`tcp://127.0.0.1:${5500 + prefill.name.length}`);
    expect(p.body.body).toEqual({ model: MODEL, prompt, max_tokens: 5 });
    expect(all.every((u) => u.aborts.length === 0)).toBe(true);
  });

  it('token-id prompts pass as they are; ids outside the vocabulary are refused before any upstream', async () => {
    resetAll();
    const r = await client.completions.create({ model: MODEL, prompt: [5, 6, 7], max_tokens: 3 });
    expect(r.choices[0]?.text).toBe(words([5, 6, 7], 3).join(''));
    expect(D.flatMap((u) => u.received)[0]?.body.prompt_ids).toEqual([5, 6, 7]);
    resetAll();
    const bad = client.completions.create({ model: MODEL, prompt: [prompts.vocabSize], max_tokens: 3 });
    await expect(bad).rejects.toMatchObject({ status: 400, param: 'prompt' });
    const noBody = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"model": ',
    });
    expect(noBody.status).toBe(400);
    expect(((await noBody.json()) as { error: { code: string } }).error.code).toBe('invalid_json');
    await expect(client.completions.create({ model: MODEL, prompt: 'x', temperature: 7 })).rejects.toMatchObject({
      status: 400,
      param: 'temperature',
    });
    await expect(client.completions.create({ model: 'other', prompt: 'x' })).rejects.toMatchObject({ status: 404 });
    expect(all.every((u) => u.received.length === 0 && u.aborts.length === 0)).toBe(true);
  });

  it("streamed text equals non-streamed text (completions, chat); chat prompt ids are the template's", async () => {
    resetAll();
    const prompt = 'Once upon a time';
    const whole = await client.completions.create({ model: MODEL, prompt, max_tokens: 6 });
    let streamed = '';
    let finish: string | null | undefined;
    for await (const c of await client.completions.create({ model: MODEL, prompt, max_tokens: 6, stream: true })) {
      streamed += c.choices[0]?.text ?? '';
      finish ??= c.choices[0]?.finish_reason;
    }
    expect(streamed).toBe(whole.choices[0]?.text);
    expect(streamed.length).toBeGreaterThan(0);
    expect(finish).toBe('length');

    const messages = [
      { role: 'system' as const, content: 'Be brief.' },
      { role: 'user' as const, content: 'Name a colour.' },
    ];
    resetAll();
    const chat = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 4 });
    let chatStreamed = '';
    for await (const c of await client.chat.completions.create({ model: MODEL, messages, max_tokens: 4, stream: true }))
      chatStreamed += c.choices[0]?.delta?.content ?? '';
    expect(chatStreamed).toBe(chat.choices[0]?.message.content);
    const source = tokenizer.chatTemplate;
    if (source === undefined) throw new Error(`${MODEL_DIR} has no chat template`);
    const template = new ChatTemplate(source, {});
    const expected = Array.from(tokenizer.encode(template.render(messages, true), { addSpecialTokens: false }));
    const got = D.flatMap((u) => u.received);
    expect(got.map((g) => g.body.kind)).toEqual(['chat', 'chat']);
    expect(got[0]?.body.prompt_ids).toEqual(expected);
    expect(got[1]?.body.prompt_ids).toEqual(expected);
    expect(expected.length).toBeGreaterThan(
      prompts.tokenizer.encode('Name a colour.', { addSpecialTokens: false }).length,
    );
  });

  it("one request id: the client's x-request-id reaches P and D and is logged, else one made up for both", async () => {
    resetAll();
    const { response } = await client.completions
      .create({ model: MODEL, prompt: 'Hello', max_tokens: 2 }, { headers: { 'x-request-id': 'req-abc-123' } })
      .withResponse();
    expect(response.headers.get('x-request-id')).toBe('req-abc-123');
    const got = all.flatMap((u) => u.received);
    expect(got.map((g) => g.requestIdHeader)).toEqual(['req-abc-123', 'req-abc-123']);
    expect(got.map((g) => g.body.request_id)).toEqual(['req-abc-123', 'req-abc-123']);
    const logged = logLines.filter((l) => l.reqId === 'req-abc-123').map((l) => l.msg);
    expect(logged).toContain('pd route');
    expect(logged).toContain('request completed');

    resetAll();
    await client.completions.create({ model: MODEL, prompt: 'Hello', max_tokens: 2 });
    const ids = all.flatMap((u) => u.received.map((g) => g.requestIdHeader));
    expect(ids).toHaveLength(2);
    expect(ids[0]).toMatch(/^[0-9a-f-]{36}$/);
    expect(ids[1]).toBe(ids[0]);
  });

  it('round robin: P and D each in configured order', async () => {
    resetAll();
    const order: string[] = [];
    for (let i = 0; i < 4; i++) {
      await client.completions.create({ model: MODEL, prompt: `n ${i}`, max_tokens: 1 });
      const p = P.find((u) => u.received.length > 0 && u.received.at(-1)?.body.body.prompt === `n ${i}`);
      const d = D.find((u) => u.received.length > 0 && u.received.at(-1)?.body.body.prompt === `n ${i}`);
      order.push(`${p?.name}/${d?.name}`);
    }
    const swap = (name: string): string => name.replace(/\d/g, (k) => String(1 - Number(k)));
    const [first = '', second = ''] = [order[0], swap(order[0] ?? '')];
    expect(order).toEqual([first, second, first, second]);
  });

  it('an error on P reaches the client with its status; D gets /pd/abort and its request is closed', async () => {
    resetAll();
    for (const p of P) p.mode = { kind: 'error', status: 413, message: 'prompt (9000 tokens) is too long' };
    for (const d of D) d.mode = { kind: 'hang' };
    const before = await metric(url, 'specd_router_errors_total', { side: 'prefill' });
    const err = await client.completions.create({ model: MODEL, prompt: 'too long', max_tokens: 4 }).catch((e) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.status).toBe(413);
    expect(err.message).toContain('prompt (9000 tokens) is too long');
    const { fake: d, got } = theOne(D);
    const room = got.body.room;
    await until('D to get /pd/abort and its request closed', () => d.aborts.length === 1 && d.closedEarly.length === 1);
    expect(d.aborts[0]).toMatchObject({ room, request_id: got.body.request_id });
    expect(d.closedEarly).toEqual([room]);
    expect(P.every((p) => p.aborts.length === 0)).toBe(true);
    expect(await metric(url, 'specd_router_errors_total', { side: 'prefill' })).toBe(before + 1);
  });

  it('an error on D reaches the client with its status; P gets /pd/abort and its request is closed', async () => {
    resetAll();
    for (const p of P) p.mode = { kind: 'hang' };
    for (const d of D) d.mode = { kind: 'error', status: 503, message: 'no free pages' };
    const err = await client.chat.completions
      .create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], stream: true })
      .catch((e) => e);
    expect(err.status).toBe(503);
    expect(err.message).toContain('no free pages');
    const { fake: p, got } = theOne(P);
    const room = got.body.room;
    await until('P to get /pd/abort and its request closed', () => p.aborts.length === 1 && p.closedEarly.length === 1);
    expect(p.aborts[0]).toMatchObject({ room });
    expect(D.every((d) => d.aborts.length === 0)).toBe(true);
  });

  it('a dropped D connection is retried once; refused or dropped again, the 502 names the drop', async () => {
    resetAll();
    const before = await metric(url, 'specd_router_upstream_retries_total', { role: 'decode' });
    for (const d of D) d.mode = { kind: 'drop', times: 1 };
    const r = await client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 2 });
    const ids = Array.from(tokenizer.encode('x', { addSpecialTokens: false }));
    expect(r.choices[0]?.text).toBe(words(ids, 2).join(''));
    // the same D got the request twice, with the same room and request id: the second attempt answered
    const d = D.find((u) => u.received.length > 0);
    expect(d?.received.map((g) => [g.body.room, g.body.request_id])).toEqual([
      [d?.received[0]?.body.room, d?.received[0]?.body.request_id],
      [d?.received[0]?.body.room, d?.received[0]?.body.request_id],
    ]);
    expect(P.map((p) => p.received.length).sort()).toEqual([0, 1]);
    expect(P.every((p) => p.aborts.length === 0)).toBe(true);
    expect(await metric(url, 'specd_router_upstream_retries_total', { role: 'decode' })).toBe(before + 1);
    const warned = logLines.find((l) => String(l.msg).includes('retrying once'));
    // (the byte counts are the connection's: a reused keep-alive connection counts its earlier requests too)
    expect(String(warned?.err)).toMatch(/^UND_ERR_SOCKET \(.+; \d+ B sent, \d+ B received\)$/);

    // a D that read the request before the drop refuses the retry (409): the client gets the drop (502), and both
    // P and that D get /pd/abort for the room, which frees what the first attempt holds (a router of its own: the
    // 502 takes that D out of its rotation)
    resetAll();
    const r1 = await newRouter({});
    try {
      for (const p of P) p.mode = { kind: 'hang' };
      for (const u of D) {
        u.mode = { kind: 'drop', times: 1 };
        u.refuseRepeatedRooms = true;
      }
      const c = new OpenAI({ baseURL: `${r1.url}/v1`, apiKey: 'unused', maxRetries: 0 });
      const err = await c.completions.create({ model: MODEL, prompt: 'x', max_tokens: 1 }).catch((e) => e);
      expect(err.status).toBe(502);
      expect(err.message).toMatch(/decode server \S+ is unreachable: UND_ERR_SOCKET \(.+ B received\)/);
      const d2 = D.find((u) => u.received.length === 2);
      const room = d2?.received[0]?.body.room;
      const { fake: p } = theOne(P);
      await until('P and D to get /pd/abort', () => p.aborts.length === 1 && (d2?.aborts.length ?? 0) === 1);
      expect(p.aborts[0]).toMatchObject({ room });
      expect(d2?.aborts[0]).toMatchObject({ room });
      expect(await metric(r1.url, 'specd_router_upstream_retries_total', { role: 'decode' })).toBe(1);
    } finally {
      await r1.router.close();
    }

    // dropped twice: 502 naming D; P is aborted (a router of its own: the 502 takes that D out of its rotation)
    resetAll();
    const r2 = await newRouter({});
    try {
      for (const p of P) p.mode = { kind: 'hang' };
      for (const d2 of D) d2.mode = { kind: 'drop', times: 2 };
      const c = new OpenAI({ baseURL: `${r2.url}/v1`, apiKey: 'unused', maxRetries: 0 });
      const err = await c.completions.create({ model: MODEL, prompt: 'x', max_tokens: 1 }).catch((e) => e);
      expect(err.status).toBe(502);
      expect(err.message).toMatch(/decode server \S+ is unreachable: UND_ERR_SOCKET \(.+ B received\)/);
      expect(D.map((u) => u.received.length).sort()).toEqual([0, 2]);
      const { fake: p } = theOne(P);
      await until('P to get /pd/abort', () => p.aborts.length === 1 && p.closedEarly.length === 1);
      expect(await metric(r2.url, 'specd_router_upstream_retries_total', { role: 'decode' })).toBe(1);
    } finally {
      await r2.router.close();
    }
  });

  it("a client that disconnects mid-stream: both P and D get /pd/abort and D's stream is closed", async () => {
    resetAll();
    for (const d of D) d.stallAfterFirstChunk = true;
    const inFlight0 = await metric(url, 'specd_router_requests_in_flight');
    const ok0 = await metric(url, 'specd_router_requests_total', { route: '/v1/completions', status: '200' });
    const stream = await client.completions.create({ model: MODEL, prompt: 'stream me', max_tokens: 8, stream: true });
    let text = '';
    for await (const c of stream) {
      text += c.choices[0]?.text ?? '';
      expect(await metric(url, 'specd_router_requests_in_flight')).toBe(inFlight0 + 1);
      stream.controller.abort();
      break;
    }
    const { fake: d, got } = theOne(D);
    const { fake: p } = theOne(P);
    const room = got.body.room;
    expect(text).toBe(words(got.body.prompt_ids, 1)[0]);
    await until('both sides to get /pd/abort', () => d.aborts.length === 1 && p.aborts.length === 1);
    await until("D's stream to close", () => d.closedEarly.length === 1);
    expect(d.aborts[0]).toMatchObject({ room, reason: 'client disconnected' });
    expect(p.aborts[0]).toMatchObject({ room, reason: 'client disconnected' });
    await until(
      'in-flight back to its value',
      async () => (await metric(url, 'specd_router_requests_in_flight')) === inFlight0,
    );
    expect(await metric(url, 'specd_router_requests_total', { route: '/v1/completions', status: '499' })).toBe(1);
    expect(await metric(url, 'specd_router_requests_total', { route: '/v1/completions', status: '200' })).toBe(ok0);
  });

  it('a D that dies mid-stream: the stream breaks, P gets /pd/abort, a decode error is counted', async () => {
    resetAll();
    for (const d of D) d.dieAfterFirstChunk = true;
    const before = await metric(url, 'specd_router_errors_total', { side: 'decode' });
    const stream = await client.completions.create({ model: MODEL, prompt: 'die', max_tokens: 8, stream: true });
    const texts: string[] = [];
    const err = await (async () => {
      for await (const c of stream) texts.push(c.choices[0]?.text ?? '');
    })().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Error);
    const { got } = theOne(D);
    expect(texts).toEqual(words(got.body.prompt_ids, 1));
    const { fake: p } = theOne(P);
    await until('P to get /pd/abort', () => p.aborts.length === 1);
    expect(p.aborts[0]).toMatchObject({ room: got.body.room });
    expect(await metric(url, 'specd_router_errors_total', { side: 'decode' })).toBe(before + 1);
  });

  it('/health lists every upstream; /v1/models comes from a D; /metrics counts by route and status', async () => {
    resetAll();
    const h = await fetch(`${url}/health`);
    expect(h.status).toBe(200);
    const body = (await h.json()) as { status: string; upstreams: { url: string; role: string; healthy: boolean }[] };
    expect(body.status).toBe('ok');
    expect(body.upstreams.map((u) => [u.url, u.role, u.healthy])).toEqual(all.map((u) => [u.url, u.role, true]));
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual([MODEL]);
    expect(D.map((d) => d.name)).toContain((models.data[0] as unknown as { owned_by: string }).owned_by);
    const ok0 = await metric(url, 'specd_router_requests_total', { route: '/v1/completions', status: '200' });
    const bad0 = await metric(url, 'specd_router_requests_total', { route: '/v1/completions', status: '400' });
    await client.completions.create({ model: MODEL, prompt: 'count me', max_tokens: 1 });
    await client.completions.create({ model: MODEL, prompt: '', max_tokens: 1 }).catch(() => undefined);
    expect(await metric(url, 'specd_router_requests_total', { route: '/v1/completions', status: '200' })).toBe(ok0 + 1);
    expect(await metric(url, 'specd_router_requests_total', { route: '/v1/completions', status: '400' })).toBe(
      bad0 + 1,
    );
    for (const u of all)
      expect(await metric(url, 'specd_router_upstream_healthy', { url: u.url, role: u.role })).toBe(1);
  });
});

describe('specd router: health and rotation', () => {
  it('a D whose /health fails leaves the rotation by health check and comes back when healthy', async () => {
    resetAll();
    const r = await newRouter({ healthIntervalMs: 10 });
    const c = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const healthyOf = async (u: FakeUpstream): Promise<boolean> => {
      const b = (await (await fetch(`${r.url}/health`)).json()) as { upstreams: { url: string; healthy: boolean }[] };
      return b.upstreams.find((x) => x.url === u.url)?.healthy === true;
    };
    try {
      d1.healthy = false;
      await until('d1 to leave the rotation', async () => !(await healthyOf(d1)));
      expect(await metric(r.url, 'specd_router_upstream_healthy', { url: d1.url, role: 'decode' })).toBe(0);
      for (let i = 0; i < 3; i++) await c.completions.create({ model: MODEL, prompt: 'x', max_tokens: 1 });
      expect(D.map((d) => d.received.length)).toEqual([3, 0]);
      d0.healthy = false;
      await until('d0 to leave the rotation', async () => !(await healthyOf(d0)));
      const h = await fetch(`${r.url}/health`);
      expect(h.status).toBe(503);
      const err = await c.completions.create({ model: MODEL, prompt: 'x', max_tokens: 1 }).catch((e) => e);
      expect(err.status).toBe(503);
      expect(err.message).toContain('no healthy decode server');
      expect(err.message).toContain(d1.url);
      d0.healthy = true;
      d1.healthy = true;
      await until('both to come back', async () => (await healthyOf(d0)) && (await healthyOf(d1)));
      for (let i = 0; i < 2; i++) await c.completions.create({ model: MODEL, prompt: 'x', max_tokens: 1 });
      expect(D.map((d) => d.received.length)).toEqual([4, 1]);
    } finally {
      await r.router.close();
    }
  });

  it('a D that cannot be reached: 502 naming it, P gets /pd/abort, it leaves the rotation at once', async () => {
    resetAll();
    const gone = new FakeUpstream('decode', 'gone');
    await gone.start();
    const r = await newRouter({ decode: [gone.url, d0.url] });
    const c = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    try {
      await gone.app.close();
      for (const p of P) p.mode = { kind: 'hang' };
      const err = await c.completions.create({ model: MODEL, prompt: 'x', max_tokens: 1 }).catch((e) => e);
      expect(err.status).toBe(502);
      expect(err.message).toContain(`decode server ${gone.url} is unreachable`);
      const { fake: p } = theOne(P);
      await until('P to get /pd/abort', () => p.aborts.length === 1 && p.closedEarly.length === 1);
      expect(r.router.states().find((s) => s.url === gone.url)).toMatchObject({ healthy: false });
      for (const q of P) q.mode = { kind: 'ok' };
      const ok = await c.completions.create({ model: MODEL, prompt: 'x', max_tokens: 1 });
      expect(ok.choices[0]?.text).toBe(words(Array.from(tokenizer.encode('x', { addSpecialTokens: false })), 1)[0]);
      expect(d0.received).toHaveLength(1);
    } finally {
      await r.router.close();
    }
  });

  it('a P that cannot be reached: 502 naming it; D gets /pd/abort and its request is closed', async () => {
    resetAll();
    const gone = new FakeUpstream('prefill', 'gone');
    await gone.start();
    const r = await newRouter({ prefill: [gone.url], decode: [d0.url] });
    const c = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    try {
      await gone.app.close();
      d0.mode = { kind: 'hang' };
      const err = await c.completions
        .create({ model: MODEL, prompt: 'x', max_tokens: 1, stream: true })
        .catch((e) => e);
      expect(err.status).toBe(502);
      expect(err.message).toContain(`prefill server ${gone.url} is unreachable`);
      await until('D to get /pd/abort', () => d0.aborts.length === 1 && d0.closedEarly.length === 1);
      expect(d0.aborts[0]?.room).toBe(d0.received[0]?.body.room);
      const h = await fetch(`${r.url}/health`);
      expect(h.status).toBe(503);
    } finally {
      await r.router.close();
    }
  });

  it("an upstream on a port Node's fetch blocks is unhealthy with a reason that says so", async () => {
    // 6000 is on the fetch standard's blocked-port list: fetch refuses it without connecting
    const blocked = 'http://127.0.0.1:6000';
    const r = await newRouter({ decode: [blocked, d0.url] });
    try {
      expect(r.router.states().find((s) => s.url === blocked)).toMatchObject({
        healthy: false,
        reason: expect.stringMatching(/bad port: the port is on the fetch standard's blocked-port list/),
      });
    } finally {
      await r.router.close();
    }
  });

  it('refuses to start when a --prefill URL answers role decode (naming it), or a role has no URL', async () => {
    const r = new PdRouter({ prefill: [d0.url], decode: [d1.url], prompts, sampling: SAMPLING });
    const err = await r.listen('127.0.0.1', 0).catch((e) => e);
    expect(err).toBeInstanceOf(PdError);
    expect(err.message).toContain(`${d0.url} was given as a prefill server but its /pd/info answers role "decode"`);
    await r.close();
    expect(() => new PdRouter({ prefill: [], decode: [d0.url], prompts, sampling: SAMPLING })).toThrow(
      /prefill: at least one server URL/,
    );
  });
});

describe('the prompt builder loads only the tokenizer, and builds what the server (full target) builds', () => {
  for (const dir of ['models/kimi-k3-tiny', 'models/smollm2-135m-instruct']) {
    it(dir, async () => {
      const target = await loadTarget(path.join(ROOT, dir), BUILTIN_PLUGIN_PACKAGES);
      try {
        const server = new PromptBuilder(target.tokenizer, target.model.info.vocabSize);
        const router = loadPromptBuilder(path.join(ROOT, dir));
        expect(router.vocabSize).toBe(server.vocabSize);
        const base = { ...parseCompletionRequest({ model: 'm', prompt: 'x' }, SAMPLING) };
        for (const prompt of ['The history of the', ' tokens, spaces  and\nnewlines ', [1, 2, 3]])
          expect((await router.completion({ ...base, prompt })).ids).toEqual(
            (await server.completion({ ...base, prompt })).ids,
          );
        const chat = parseChatRequest(
          {
            model: 'm',
            messages: [
              { role: 'system', content: 'Be brief.' },
              { role: 'user', content: 'Hi!' },
            ],
          },
          SAMPLING,
        );
        const ids = (await router.chat(chat)).ids;
        expect(ids).toEqual((await server.chat(chat)).ids);
        expect(ids.length).toBeGreaterThan((await router.completion({ ...base, prompt: 'Be brief.Hi!' })).ids.length);
        await expect(router.completion({ ...base, prompt: [router.vocabSize] })).rejects.toThrow(
          /outside the vocabulary/,
        );
        await expect(router.completion({ ...base, prompt: '' })).rejects.toThrow(/encodes to no tokens/);
      } finally {
        target.model.dispose();
      }
    });
  }
});

describe('policies', () => {
  const c = (index: number) => ({ url: `u${index}`, index });
  it('round robin keeps its place when a server leaves and comes back', () => {
    const rr = new RoundRobinPolicy();
    const picks = [
      rr.pick('decode', [c(0), c(1), c(2)]),
      rr.pick('decode', [c(0), c(2)]), // 1 is out: the next after 0 is 2
      rr.pick('decode', [c(0), c(1), c(2)]),
      rr.pick('decode', [c(0), c(1), c(2)]),
      rr.pick('prefill', [c(0), c(1)]),
    ].map((x) => x.index);
    expect(picks).toEqual([0, 2, 0, 1, 0]);
  });
  it('random picks by its source; unknown names are refused naming the known ones', () => {
    const values = [0.1, 0.6, 0.99];
    const rnd = new RandomPolicy(() => values.shift() ?? 0);
    expect([0, 1, 2].map(() => rnd.pick('prefill', [c(0), c(1)]).index)).toEqual([0, 1, 1]);
    expect(createPdPolicy('random').name).toBe('random');
    expect(() => createPdPolicy('constructor')).toThrow(/expected one of round_robin, random/);
  });
});

describe('specd router CLI', () => {
  const err: string[] = [];
  const io: CliIo = { stdout: { write: () => true }, stderr: { write: (s: string) => err.push(s) }, cwd: ROOT };

  it("the config's pd.router names the upstreams and the policy; flags override the port", async () => {
    resetAll();
    const dir = makeTempDir('router');
    const cfg = path.join(dir, 'pd.json');
    fs.writeFileSync(
      cfg,
      JSON.stringify({
        model: MODEL_DIR,
        pd: { router: { prefill: [p1.url], decode: [d1.url], port: 1, policy: 'random' } },
      }),
    );
    const s = await startRouter({ config: cfg, port: 0, logLevel: 'silent' }, io);
    try {
      expect(s.router.policy.name).toBe('random');
      expect(s.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      const c = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0 });
      const r = await c.completions.create({ model: MODEL, prompt: 'via config', max_tokens: 2 });
      const ids = Array.from(tokenizer.encode('via config', { addSpecialTokens: false }));
      expect(r.choices[0]?.text).toBe(words(ids, 2).join(''));
      expect([p1.received.length, d1.received.length, p0.received.length, d0.received.length]).toEqual([1, 1, 0, 0]);
    } finally {
      await s.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('`specd router` as a process: --port 0 prints the URL; it routes, and SIGTERM stops it', async () => {
    resetAll();
    const bin = path.join(ROOT, 'packages/core/src/cli/bin.js');
    const args = ['router', '--prefill', p0.url, '--decode', d0.url, '--port', '0', '--model', MODEL_DIR];
    const child = spawn(process.execPath, [bin, ...args, '--log-level', 'silent'], { cwd: ROOT });
    try {
      let stderr = '';
      const base = await new Promise<string>((resolve, reject) => {
        child.stderr.on('data', (b: Buffer) => {
          stderr += b.toString();
          const m = /routing on (http:\/\/127\.0\.0\.1:\d+) \(policy round_robin\)/.exec(stderr);
          if (m?.[1] !== undefined) resolve(m[1]);
        });
        child.on('exit', (code) => reject(new Error(`specd router exited (${code}): ${stderr}`)));
      });
      const c = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
      const r = await c.chat.completions.create({
        model: MODEL,
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 2,
      });
      expect(r.choices[0]?.message.content).toBe(words(d0.received[0]?.body.prompt_ids ?? [], 2).join(''));
      expect(p0.received).toHaveLength(1);
    } finally {
      const exited = new Promise((resolve) => child.on('exit', resolve));
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
    }
  });

  it('usage errors: a bad --policy or URL (exit 2); no decode server (exit 1, naming the flag)', async () => {
    err.length = 0;
    expect(await main(['router', '--prefill', p0.url, '--decode', d0.url, '--policy', 'fastest'], io)).toBe(2);
    expect(err.join('')).toContain('expected one of round_robin, random');
    err.length = 0;
    expect(await main(['router', '--prefill', 'localhost:3', '--decode', d0.url], io)).toBe(2);
    expect(err.join('')).toContain('expected a base URL');
    err.length = 0;
    expect(await main(['router', '--prefill', p0.url, '--log-level', 'silent'], io)).toBe(1);
    expect(err.join('')).toContain('no decode server: give --decode URL');
  });
});
