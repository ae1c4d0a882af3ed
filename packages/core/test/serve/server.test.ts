// The OpenAI-compatible server end to end, with the official `openai` client against `specd serve`
// on an ephemeral port of 127.0.0.1: completions and chat (streaming and not), concurrent clients,
// greedy output equal to `specd generate`, a short request streaming while a long one runs,
// metrics that move, errors in OpenAI's format (a chat template that rejects the messages: 400), a
// disconnect freeing every page and slot, and the loop's count of verify steps that verified drafts.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { main, type CliIo } from '../../src/cli/index.js';
import { startServe, type StartedServer } from '../../src/cli/serve.js';
import type { DraftPolicy, SpecResult } from '../../src/engine/index.js';
import { Tokenizer } from '../../src/io/tokenizer.js';
import type { Drafter } from '../../src/plugin/drafter-plugin.js';
import { EngineLoop, SpecdServer } from '../../src/serve/index.js';
import { makeTempDir } from '../io/helpers.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const KEY = 'test-key';
const MODEL = 'kimi-k3-tiny';
const tmp = makeTempDir('serve');
const io: CliIo = { stdout: { write: () => true }, stderr: { write: () => true }, cwd: ROOT };

let s: StartedServer;
let client: OpenAI;

beforeAll(async () => {
  const cfg = path.join(tmp, 'serve.json');
  fs.writeFileSync(
    cfg,
    JSON.stringify({
      model: path.join(ROOT, 'models/kimi-k3-tiny'),
      // a fixed draft length so the spec-decode counters move (the default policy may not draft here)
      drafter: { method: 'dflash', path: path.join(ROOT, 'models/kimi-k3-tiny-dflash'), num_draft_tokens: 15 },
      scheduler: { max_running_requests: 4, max_sequence_tokens: 1024 },
      server: { port: 8000, api_key: KEY, body_limit_bytes: 8192 },
    }),
  );
  s = await startServe({ config: cfg, port: 0, logLevel: 'silent' }, io); // --port overrides the config
  client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: KEY, maxRetries: 0 });
});
afterAll(async () => {
  await s?.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

type Extra = { ignore_eos?: boolean; top_k?: number };
const complete = (p: OpenAI.CompletionCreateParamsNonStreaming & Extra) =>
  client.completions.create(p as OpenAI.CompletionCreateParamsNonStreaming);

async function metric(name: string): Promise<number> {
  const text = await (await fetch(`${s.url}/metrics`)).text();
  let sum = 0;
  for (const line of text.split('\n'))
    if (line.startsWith(name) && !line.startsWith('#')) sum += Number(line.split(' ').pop());
  return sum;
}

async function waitIdle(): Promise<void> {
  for (let i = 0; i < 200 && s.server.loop.running + s.server.loop.waiting > 0; i++)
    await new Promise((r) => setTimeout(r, 10));
}

describe('specd serve (openai client)', () => {
  it('binds 127.0.0.1; /health and /v1/models; a fixed draft length needs no cost calibration', async () => {
    expect(s.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(s.server.engine.stepCosts).toBeUndefined();
    expect(s.server.engine.metrics.calibrationMs).toBe(0);
    expect(await (await fetch(`${s.url}/health`)).json()).toEqual({ status: 'ok' });
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual([MODEL]);
  });

  it('greedy completion equals `specd generate` for the same request; usage is counted', async () => {
    const prompt = 'The history of the';
    let out = '';
    const code = await main(['generate', '--prompt', prompt, '--max-tokens', '24', '--json', '--ignore-eos'], {
      ...io,
      stdout: { write: (x: string) => (out += x) },
    });
    expect(code).toBe(0);
    const cli = JSON.parse(out) as { text: string; num_prompt_tokens: number };
    const r = await complete({ model: MODEL, prompt, max_tokens: 24, temperature: 0, ignore_eos: true });
    expect(r.object).toBe('text_completion');
    expect(r.choices[0]!.text).toBe(cli.text);
    expect(r.choices[0]!.finish_reason).toBe('length');
    expect(r.usage).toEqual({
      prompt_tokens: cli.num_prompt_tokens,
      completion_tokens: 24,
      total_tokens: cli.num_prompt_tokens + 24,
    });
    // streaming gives the same text in pieces, then [DONE] (the client stops there)
    const stream = await client.completions.create({
      model: MODEL,
      prompt,
      max_tokens: 24,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
      ignore_eos: true,
    } as OpenAI.CompletionCreateParamsStreaming);
    let text = '';
    let pieces = 0;
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const c of stream) {
      if (c.choices.length > 0) {
        text += c.choices[0]!.text;
        pieces++;
        finish = c.choices[0]!.finish_reason ?? finish;
      }
      usage = c.usage ?? usage;
    }
    expect(text).toBe(cli.text);
    expect(pieces).toBeGreaterThan(3);
    expect(finish).toBe('length');
    expect(usage?.completion_tokens).toBe(24);
  });

  it('chat completions through the ChatML template, streaming and not', async () => {
    const messages: OpenAI.ChatCompletionMessageParam[] = [
      { role: 'system', content: 'You are terse.' },
      { role: 'user', content: 'Tell me about rivers.' },
    ];
    const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16, temperature: 0 });
    expect(r.object).toBe('chat.completion');
    expect(r.choices[0]!.message.role).toBe('assistant');
    expect(r.choices[0]!.message.content!.length).toBeGreaterThan(0);
    // prompt = the rendered template: 2 messages + the assistant header
    const rendered =
      '<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nTell ' +
      'me about rivers.<|im_end|>\n<|im_start|>assistant\n';
    expect(r.usage!.prompt_tokens).toBe(s.target.tokenizer.encode(rendered, { addSpecialTokens: false }).length);
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages,
      max_tokens: 16,
      temperature: 0,
      stream: true,
    });
    let text = '';
    let role: string | undefined;
    for await (const c of stream) {
      role ??= c.choices[0]?.delta.role;
      text += c.choices[0]?.delta.content ?? '';
    }
    expect(role).toBe('assistant');
    expect(text).toBe(r.choices[0]!.message.content);
  });

  it(
    'concurrent clients get what they get alone (greedy); ' +
      'seeded sampling is reproducible; stop strings cut the text',
    async () => {
      const prompts = ['Once upon a time', 'The history of the', 'def main():', 'In 1999, the'];
      const alone: string[] = [];
      for (const p of prompts)
        alone.push(
          (await complete({ model: MODEL, prompt: p, max_tokens: 20, temperature: 0, ignore_eos: true })).choices[0]!
            .text,
        );
      const together = await Promise.all(
        prompts.map((p) => complete({ model: MODEL, prompt: p, max_tokens: 20, temperature: 0, ignore_eos: true })),
      );
      expect(together.map((r) => r.choices[0]!.text)).toEqual(alone);
      const sampled = () =>
        complete({
          model: MODEL,
          prompt: 'Once upon a time',
          max_tokens: 12,
          temperature: 0.9,
          top_p: 0.95,
          top_k: 40,
          seed: 11,
        });
      const [a, b] = await Promise.all([sampled(), sampled()]);
      expect(a.choices[0]!.text).toBe(b.choices[0]!.text);
      // stop: cut before the first occurrence of a word of the greedy text
      const full = alone[1]!;
      const word = full.trim().split(/\s+/)[2]!;
      const cut = await complete({
        model: MODEL,
        prompt: prompts[1]!,
        max_tokens: 20,
        temperature: 0,
        stop: [word],
        ignore_eos: true,
      });
      expect(cut.choices[0]!.finish_reason).toBe('stop');
      expect(cut.choices[0]!.text).toBe(full.slice(0, full.indexOf(word)));
    },
  );

  it('a later request streams (and finishes) before an earlier long one finishes', async () => {
    const events: string[] = [];
    const long = (async () => {
      const st = await client.completions.create({
        model: MODEL,
        prompt: 'The history of the',
        max_tokens: 300,
        temperature: 0,
        stream: true,
        ignore_eos: true,
      } as OpenAI.CompletionCreateParamsStreaming);
      let n = 0;
      for await (const c of st) if (c.choices[0]?.text) n++;
      events.push('long done');
      return n;
    })();
    while (s.server.loop.running === 0) await new Promise((r) => setTimeout(r, 5));
    const st = await client.completions.create({
      model: MODEL,
      prompt: 'Once upon a time',
      max_tokens: 8,
      temperature: 0,
      stream: true,
      ignore_eos: true,
    } as OpenAI.CompletionCreateParamsStreaming);
    for await (const c of st) {
      if (c.choices[0]?.text) events.push('short chunk');
    }
    events.push('short done');
    expect(await long).toBeGreaterThan(10);
    expect(events[0]).toBe('short chunk');
    expect(events.indexOf('short done')).toBeLessThan(events.indexOf('long done'));
  });

  it('metrics: requests, latencies, tokens and spec-decode counters move', async () => {
    const names = [
      'specd_requests_total',
      'specd_time_to_first_token_seconds_count',
      'specd_e2e_request_latency_seconds_count',
      'specd_generation_tokens_total',
      'specd_spec_decode_num_drafts_total',
      'specd_spec_decode_num_draft_tokens_total',
      'specd_spec_decode_num_accepted_tokens_total',
      'specd_spec_decode_num_accepted_tokens_per_pos_total{position="0"}',
    ];
    const before = await Promise.all(names.map(metric));
    await complete({ model: MODEL, prompt: 'The history of the', max_tokens: 32, temperature: 0, ignore_eos: true });
    const after = await Promise.all(names.map(metric));
    names.forEach((n, i) => {
      expect(after[i], n).toBeGreaterThan(before[i]!);
    });
    expect(after[3]! - before[3]!).toBe(32);
    // one draft proposal per verify step that verified ≥ 1 draft: never more proposals than draft tokens,
    // and (fixed k = 15) at most one per committed token
    const drafts = after[4]! - before[4]!;
    expect(drafts).toBeLessThanOrEqual(after[5]! - before[5]!);
    expect(drafts).toBeLessThanOrEqual(32);
    const text = await (await fetch(`${s.url}/metrics`)).text();
    for (const g of [
      'specd_num_requests_running',
      'specd_num_requests_waiting',
      'specd_kv_pages_used{cache="target"}',
      'specd_time_per_output_token_seconds_bucket',
      'specd_verify_budget_tokens_bucket',
    ])
      expect(text).toContain(g);
  });

  it('a client that disconnects mid-stream has its request aborted: every page and slot is freed', async () => {
    const abortsBefore = await metric('specd_requests_total{endpoint="completion",finish_reason="abort"}');
    const ac = new AbortController();
    const st = await client.completions.create(
      {
        model: MODEL,
        prompt: 'Once upon a time',
        max_tokens: 600,
        temperature: 0,
        stream: true,
        ignore_eos: true,
      } as OpenAI.CompletionCreateParamsStreaming,
      { signal: ac.signal },
    );
    let n = 0;
    try {
      for await (const c of st) {
        if (c.choices[0]?.text && ++n === 3) ac.abort(); // the client ends the iteration (or throws) on abort
      }
    } catch (e) {
      expect((e as Error).name).toMatch(/Abort/);
    }
    expect(n).toBeGreaterThanOrEqual(3);
    expect(n).toBeLessThan(100);
    await waitIdle();
    expect(s.server.loop.running + s.server.loop.waiting).toBe(0);
    expect(s.server.engine.pending).toBe(0);
    expect(s.server.engine.cache.pagesInUse).toBe(0);
    expect(s.server.engine.cache.slotsInUse).toBe(0);
    expect(s.drafter!.drafter.pagesInUse).toBe(0);
    expect(s.server.loop.tokensInFlight).toBe(0);
    expect(await metric('specd_requests_total{endpoint="completion",finish_reason="abort"}')).toBe(abortsBefore + 1);
    // the same for a non-streaming request whose client goes away
    const ac2 = new AbortController();
    const pending = fetch(`${s.url}/v1/completions`, {
      method: 'POST',
      signal: ac2.signal,
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ model: MODEL, prompt: 'The history of the', max_tokens: 600, ignore_eos: true }),
    }).catch((e: Error) => e);
    while (s.server.loop.running === 0) await new Promise((r) => setTimeout(r, 2));
    ac2.abort();
    expect(((await pending) as Error).name).toBe('AbortError');
    await waitIdle();
    expect(s.server.engine.cache.pagesInUse).toBe(0);
    expect(s.server.engine.cache.slotsInUse).toBe(0);
    expect(s.drafter!.drafter.pagesInUse).toBe(0);
    expect(await metric('specd_requests_total{endpoint="completion",finish_reason="abort"}')).toBe(abortsBefore + 2);
    // the server keeps serving
    expect((await complete({ model: MODEL, prompt: 'Hello', max_tokens: 2, temperature: 0 })).choices).toHaveLength(1);
  });

  it("bad requests are answered in OpenAI's error format with the right status", async () => {
    const err = async (p: Promise<unknown>) => {
      try {
        await p;
      } catch (e) {
        return e as InstanceType<typeof OpenAI.APIError>;
      }
      throw new Error('expected an error');
    };
    const e400 = await err(complete({ model: MODEL, prompt: 'x', temperature: 5 }));
    expect(e400.status).toBe(400);
    expect(e400.error).toMatchObject({ type: 'invalid_request_error', param: 'temperature', code: 'invalid_value' });
    expect((await err(complete({ model: MODEL, prompt: 'x', max_tokens: 0 }))).status).toBe(400);
    expect((await err(client.chat.completions.create({ model: MODEL, messages: [] }))).status).toBe(400);
    const e404 = await err(complete({ model: 'gpt-4', prompt: 'x' }));
    expect(e404.status).toBe(404);
    expect(e404.error).toMatchObject({ param: 'model', code: 'model_not_found' });
    const e401 = await err(new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'wrong', maxRetries: 0 }).models.list());
    expect(e401.status).toBe(401);
    expect(e401.error).toMatchObject({ code: 'invalid_api_key' });
    const eLong = await err(complete({ model: MODEL, prompt: 'x', max_tokens: 5000 }));
    expect(eLong.status).toBe(400);
    expect(eLong.error).toMatchObject({ code: 'context_length_exceeded', param: 'max_tokens' });
    // raw HTTP: malformed JSON, a body over body_limit_bytes, an unknown route
    const post = (body: string) =>
      fetch(`${s.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
        body,
      });
    const bad = await post('{"model": ');
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { type: string; code: string } }).error).toMatchObject({
      type: 'invalid_request_error',
      code: 'invalid_json',
    });
    const big = await post(JSON.stringify({ model: MODEL, prompt: 'x'.repeat(10000) }));
    expect(big.status).toBe(413);
    expect(((await big.json()) as { error: { code: string } }).error.code).toBe('body_too_large');
    expect((await fetch(`${s.url}/v2/nothing`)).status).toBe(401); // with a key set, only /health and /metrics are open
    const nf = await fetch(`${s.url}/v2/nothing`, { headers: { authorization: `Bearer ${KEY}` } });
    expect(nf.status).toBe(404);
    expect(await nf.json()).toHaveProperty('error.message');
    // a known route under the wrong method: 405, naming the methods it takes
    const wrong = await fetch(`${s.url}/v1/chat/completions`, { headers: { authorization: `Bearer ${KEY}` } });
    expect(wrong.status).toBe(405);
    expect(wrong.headers.get('allow')).toBe('POST');
    expect(((await wrong.json()) as { error: { message: string; code: string } }).error).toEqual(
      expect.objectContaining({
        message: 'method GET not allowed on /v1/chat/completions (allowed: POST)',
        code: 'method_not_allowed',
      }),
    );
    expect(await metric('specd_request_errors_total')).toBeGreaterThanOrEqual(8);
  });

  it('503 when the tokens in flight are full (a second server on the same target, no drafter)', async () => {
    const small = new SpecdServer({
      target: s.target,
      modelName: MODEL,
      sampling: { temperature: 0, top_p: 1, top_k: 0, max_tokens: 64 },
      scheduler: {
        max_running_requests: 2,
        max_waiting_requests: 8,
        prefill_chunk_tokens: 64,
        max_tokens_in_flight: 120,
        max_sequence_tokens: 512,
        page_size: 16,
      },
      bodyLimitBytes: 1 << 20,
    });
    const url = await small.listen('127.0.0.1', 0);
    try {
      const c2 = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 });
      const first = c2.completions.create({
        model: MODEL,
        prompt: 'Once upon a time',
        max_tokens: 100,
        temperature: 0,
        ignore_eos: true,
      } as OpenAI.CompletionCreateParamsNonStreaming);
      while (small.loop.tokensInFlight === 0) await new Promise((r) => setTimeout(r, 2));
      const second = await c2.completions.create({ model: MODEL, prompt: 'Hello there', max_tokens: 100 }).then(
        () => undefined,
        (e: InstanceType<typeof OpenAI.APIError>) => e,
      );
      expect(second?.status).toBe(503);
      expect(second?.error).toMatchObject({ type: 'server_error', code: 'overloaded' });
      expect((await first).usage?.completion_tokens).toBe(100);
      expect(small.engine.cache.pagesInUse).toBe(0);
    } finally {
      await small.close();
    }
  });

  it(
    'a chat template that rejects the messages answers 400 naming ' +
      'why (a second server, a template without a system role)',
    async () => {
      const dir = path.join(ROOT, 'models/kimi-k3-tiny');
      const json = (f: string) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')) as Record<string, unknown>;
      // the Gemma pattern: HF templates reject what they cannot render with raise_exception
      const template =
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ " +
        "raise_exception('System role not supported') }}{% endif %}" +
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor " +
        '%}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}';
      const tokenizer = new Tokenizer({
        tokenizerJson: json('tokenizer.json'),
        tokenizerConfig: json('tokenizer_config.json'),
        chatTemplateFile: template,
        label: 'no-system-role',
      });
      const strict = new SpecdServer({
        target: { ...s.target, tokenizer },
        modelName: MODEL,
        sampling: { temperature: 0, top_p: 1, top_k: 0, max_tokens: 64 },
        scheduler: {
          max_running_requests: 2,
          max_waiting_requests: 8,
          prefill_chunk_tokens: 64,
          max_tokens_in_flight: 4096,
          max_sequence_tokens: 512,
          page_size: 16,
        },
        bodyLimitBytes: 1 << 20,
      });
      const url = await strict.listen('127.0.0.1', 0);
      try {
        const c2 = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 });
        const messages: OpenAI.ChatCompletionMessageParam[] = [
          { role: 'system', content: 'You are terse.' },
          { role: 'user', content: 'Hi' },
        ];
        for (const stream of [false, true]) {
          const e = await c2.chat.completions.create({ model: MODEL, messages, max_tokens: 4, stream }).then(
            () => undefined,
            (x: InstanceType<typeof OpenAI.APIError>) => x,
          );
          expect(e?.status, `stream: ${stream}`).toBe(400);
          expect(e?.error).toEqual({
            message: 'messages: chat template failed to render: System role not supported',
            type: 'invalid_request_error',
            param: 'messages',
            code: 'chat_template_error',
          });
        }
        expect(await strict.metrics.registry.getSingleMetricAsString('specd_request_errors_total')).toContain(
          'specd_request_errors_total{status="400"} 2',
        );
        // the same conversation without the system message renders and runs
        const ok = await c2.chat.completions.create({
          model: MODEL,
          messages: [messages[1]!],
          max_tokens: 4,
          temperature: 0,
        });
        expect(ok.usage?.prompt_tokens).toBe(
          tokenizer.encode('<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n', { addSpecialTokens: false })
            .length,
        );
      } finally {
        await strict.close();
      }
    },
  );

  it(
    'draft steps (num_drafts) count the verify steps that verified drafts: ' +
      'plain steps and proposals a budget cut to 0 are not draft steps',
    async () => {
      // DFlash with a confidence on every draft, so that the policy's budgets hook sees its proposals
      const dflash = s.drafter!.drafter;
      const confident = new Proxy(dflash, {
        get(t, key) {
          if (key === 'propose')
            return (b: Parameters<Drafter['propose']>[0]) =>
              t.propose(b).map((p) => ({ ...p, confidence: new Float32Array(p.tokens.length).fill(0.9) }));
          const v: unknown = Reflect.get(t, key, t);
          return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(t) : v;
        },
      });
      let budgetCalls = 0;
      let kept = 0;
      let cut = 0;
      const policy: DraftPolicy = {
        // 3 drafts on even steps, a plain decode step (k = 0) on odd ones
        choose: (cs) => cs.map((c) => (c.metrics.verifySteps % 2 === 0 ? Math.min(3, c.maxDrafts) : 0)),
        // every third proposal is cut to 0 drafts (verified as a plain step), the others to 2
        budgets: (items) =>
          items.map(() => {
            if (budgetCalls++ % 3 === 2) {
              cut++;
              return 0;
            }
            kept++;
            return 2;
          }),
        observe: () => undefined,
        release: () => undefined,
      };
      const loop = new EngineLoop(
        s.target.model,
        confident,
        { maxSequences: 1, maxTokensPerSequence: 256, draftPolicy: policy },
        { maxWaiting: 1, maxTokensInFlight: 1024, eosTokenIds: [] },
      );
      try {
        const promptIds = s.target.tokenizer.encode('The history of the', { addSpecialTokens: false });
        const r = await new Promise<SpecResult>((resolve, reject) => {
          loop.submit(
            { promptIds, maxTokens: 40, sampling: { temperature: 0 }, seed: 1, ignoreEos: true },
            { onToken: () => undefined, onFinish: resolve, onError: reject },
          );
        });
        expect(r.tokenIds).toHaveLength(40);
        expect(cut).toBeGreaterThanOrEqual(2);
        expect(r.metrics.budgetHistogram[0]).toBe(cut);
        expect(r.metrics.draftSteps).toBe(kept);
        expect(r.metrics.verifySteps).toBeGreaterThan(kept + cut); // the plain odd steps
        expect(r.metrics.drafted).toBeGreaterThanOrEqual(kept);
        expect(r.metrics.drafted).toBeLessThanOrEqual(2 * kept);
      } finally {
        loop.close();
      }
      expect(dflash.pagesInUse).toBe(0);
    },
  );
});
