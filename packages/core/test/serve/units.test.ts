// Server pieces without a model: stop-string streaming, the chat template renderer, request parsing,
// the Prometheus exporter's spec-decode and verify-budget metrics.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

import { RequestMetrics } from '../../src/engine/index.js';
import {
  ApiError,
  ChatTemplate,
  ChatTemplateError,
  parseChatRequest,
  parseCompletionRequest,
  ServerMetrics,
  StopTextBuffer,
} from '../../src/serve/index.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const DEFAULTS = { temperature: 0, top_p: 1, top_k: 0, max_tokens: 64 };

describe('StopTextBuffer', () => {
  const stream = (stops: string[], pieces: string[]): { sent: string[]; full: string; stopped: boolean } => {
    const b = new StopTextBuffer(stops);
    const sent = pieces.map((p) => b.push(p));
    sent.push(b.finish());
    return { sent, full: b.fullText, stopped: b.stopped };
  };

  it('without stops everything passes through at once', () => {
    expect(stream([], ['a', 'b', 'c']).sent).toEqual(['a', 'b', 'c', '']);
  });

  it('holds back a possible stop prefix and cuts before the stop string (across pieces)', () => {
    const r = stream(['END'], ['hello E', 'N', 'D more']);
    expect(r.sent).toEqual(['hello ', '', '', '']);
    expect(r.full).toBe('hello ');
    expect(r.stopped).toBe(true);
  });

  it('releases held text when the stop does not complete', () => {
    const r = stream(['END'], ['hello E', 'x', ' EN']);
    expect(r.sent).toEqual(['hello ', 'Ex', ' ', 'EN']);
    expect(r.full).toBe('hello Ex EN');
    expect(r.stopped).toBe(false);
  });

  it('the earliest of several stops wins; a stop at the very start gives empty text', () => {
    expect(stream(['b', 'cd'], ['a cd b']).full).toBe('a ');
    expect(stream(['x'], ['xyz']).full).toBe('');
  });

  it('random streams: the concatenation equals the text cut at the first stop', () => {
    let seed = 7;
    const rnd = (n: number): number => {
      seed = (seed * 1103515245 + 12345) >>> 0;
      return seed % n;
    };
    for (let t = 0; t < 300; t++) {
      const text = Array.from({ length: 30 }, () => 'abc '[rnd(4)]).join('');
      const stops = ['ab', 'cab c', 'bb'].slice(0, 1 + rnd(3));
      const pieces: string[] = [];
      for (let i = 0; i < text.length; ) {
        const n = 1 + rnd(4);
        pieces.push(text.slice(i, i + n));
        i += n;
      }
      const r = stream(stops, pieces);
      const cuts = stops.map((s) => text.indexOf(s)).filter((i) => i >= 0);
      const expected = cuts.length === 0 ? text : text.slice(0, Math.min(...cuts));
      expect(r.sent.join('')).toBe(expected);
      expect(r.full).toBe(expected);
    }
  });
});

describe('ChatTemplate (@huggingface/jinja)', () => {
  const shipped = (
    JSON.parse(fs.readFileSync(path.join(ROOT, 'models/kimi-k3-tiny/tokenizer_config.json'), 'utf8')) as {
      chat_template: string;
    }
  ).chat_template;

  it('renders the shipped ChatML template', () => {
    const t = new ChatTemplate(shipped);
    const msgs = [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Hi {{ there }} %}' },
    ];
    expect(t.render(msgs)).toBe(
      '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi {{ there }} %}<|im_end|>\n<|im_start|>assistant\n',
    );
    expect(t.render(msgs, false)).toBe(
      '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi {{ there }} %}<|im_end|>\n',
    );
  });

  it('supports what common HF templates use: loop vars, conditions, whitespace control, bos_token', () => {
    const t = new ChatTemplate(
      "{{ bos_token }}{%- for m in messages -%}{% if m.role == 'user' %}[U{{ " +
        "loop.index }}]{% elif m.role == 'assistant' %}[A]{% else %}[S]{% endif " +
        "%}{{ m['content'] | trim }}{% if not loop.last %}|{% endif %}{%- endfor -%}",
      { bos_token: '<s>' },
    );
    expect(
      t.render([
        { role: 'system', content: ' s ' },
        { role: 'user', content: 'u' },
        { role: 'assistant', content: 'a' },
      ]),
    ).toBe('<s>[S]s|[U2]u|[A]a');
  });

  it('a template that does not parse is a ChatTemplateError', () => {
    expect(() => new ChatTemplate('{% for m in messages %}')).toThrow(ChatTemplateError);
  });

  it(
    'a template that rejects the messages (raise_exception, ' + 'as HF templates do) is a ChatTemplateError naming why',
    () => {
      const t = new ChatTemplate(
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System " +
          "role not supported') }}{% endif %}{{ m['content'] }}{% endfor %}",
      );
      expect(t.render([{ role: 'user', content: 'hi' }])).toBe('hi');
      expect(() =>
        t.render([
          { role: 'system', content: 's' },
          { role: 'user', content: 'hi' },
        ]),
      ).toThrow(ChatTemplateError);
      expect(() => t.render([{ role: 'system', content: 's' }])).toThrow(
        'chat template failed to render: System role not supported',
      );
    },
  );
});

describe('request parsing', () => {
  const status = (f: () => unknown): { status: number; param: string | null } => {
    try {
      f();
    } catch (e) {
      expect(e).toBeInstanceOf(ApiError);
      return { status: (e as ApiError).status, param: (e as ApiError).param };
    }
    throw new Error('expected an ApiError');
  };

  it('completion: defaults from the config, overrides from the request', () => {
    const r = parseCompletionRequest({ model: 'm', prompt: 'hi', seed: 3 }, DEFAULTS);
    expect(r).toMatchObject({
      model: 'm',
      prompt: 'hi',
      maxTokens: undefined, // absent: the server resolves it against the context (serve/limits.ts)
      temperature: 0,
      topP: 1,
      topK: 0,
      seed: 3,
      stop: [],
      stream: false,
      ignoreEos: false,
    });
    expect(
      parseCompletionRequest(
        {
          model: 'm',
          prompt: [1, 2],
          max_tokens: 5,
          temperature: 0.5,
          top_p: 0.9,
          top_k: -1,
          stop: 'x',
          stream: true,
          stream_options: { include_usage: true },
        },
        DEFAULTS,
      ),
    ).toMatchObject({
      prompt: [1, 2],
      maxTokens: 5,
      temperature: 0.5,
      topP: 0.9,
      topK: 0,
      stop: ['x'],
      stream: true,
      includeUsage: true,
    });
    expect(parseCompletionRequest({ model: 'm', prompt: ['one'] }, DEFAULTS).prompt).toBe('one');
  });

  it.each([
    [{ prompt: 'x' }, 'model'],
    [{ model: 'm' }, 'prompt'],
    [{ model: 'm', prompt: ['a', 'b'] }, 'prompt'],
    [{ model: 'm', prompt: 'x', max_tokens: 0 }, 'max_tokens'],
    [{ model: 'm', prompt: 'x', max_tokens: 2.5 }, 'max_tokens'],
    [{ model: 'm', prompt: 'x', temperature: -0.1 }, 'temperature'],
    [{ model: 'm', prompt: 'x', top_p: 0 }, 'top_p'],
    [{ model: 'm', prompt: 'x', n: 2 }, 'n'],
    [{ model: 'm', prompt: 'x', stop: ['a', 'b', 'c', 'd', 'e'] }, 'stop'],
    [{ model: 'm', prompt: 'x', stream: 'yes' }, 'stream'],
    [{ model: 'm', prompt: 'x', logprobs: 6 }, 'logprobs'],
    [{ model: 'm', prompt: 'x', logprobs: true }, 'logprobs'],
  ])('completion %j → 400 naming %s', (body, param) => {
    expect(status(() => parseCompletionRequest(body, DEFAULTS))).toEqual({ status: 400, param });
  });

  it('a missing model says so; a wrong type shows the value', () => {
    for (const parse of [
      (model?: unknown) => () => parseCompletionRequest({ model, prompt: 'x' }, DEFAULTS),
      (model?: unknown) => () => parseChatRequest({ model, messages: [{ role: 'user', content: 'x' }] }, DEFAULTS),
    ]) {
      expect(status(parse())).toEqual({ status: 400, param: 'model' });
      expect(parse()).toThrow(/^model: missing \(the served model id, as GET \/v1\/models lists it\)$/);
      expect(parse(null)).toThrow(/^model: missing/);
      expect(parse(7)).toThrow(/^model: expected a model id, got 7$/);
      expect(parse('')).toThrow(/^model: expected a model id, got ""$/);
    }
  });

  it.each([
    // JSON.parse reads 1e999 as Infinity and -1e999 as -Infinity; NaN cannot come from JSON but is refused too
    ['temperature', Number.POSITIVE_INFINITY, /^temperature: expected a number in \[0, 2\] \(below 0.00001: greedy\)/],
    ['temperature', Number.NaN, /^temperature: expected a number in \[0, 2\]/],
    ['temperature', -1e-45, /^temperature: .*got -1e-45/],
    ['temperature', 2.5, /^temperature: .*got 2.5/],
    ['temperature', '0.5', /^temperature: .*got "0.5"/],
    ['top_p', 1.5, /^top_p: expected a number in \(0, 1\], got 1.5/],
    ['top_p', Number.NEGATIVE_INFINITY, /^top_p: /],
    ['top_k', -2, /^top_k: expected an integer, -1 or 0 \(off\) or >= 1, got -2/],
    ['top_k', 1.5, /^top_k: .*got 1.5/],
    ['seed', 0.5, /^seed: expected an integer in \[-9007199254740991, 9007199254740991\] \(-1: none\), got 0.5/],
    ['seed', 2 ** 64, /^seed: .*got 18446744073709552000/],
    ['presence_penalty', 2.5, /^presence_penalty: expected a number in \[-2, 2\], got 2.5/],
    ['frequency_penalty', -3, /^frequency_penalty: expected a number in \[-2, 2\], got -3/],
    ['repetition_penalty', 0, /^repetition_penalty: expected a finite number > 0, got 0/],
    ['repetition_penalty', Number.POSITIVE_INFINITY, /^repetition_penalty: /],
  ])('sampling field %s = %s → 400 naming it (vLLM ranges)', (param, value, message) => {
    for (const parse of [
      () => parseCompletionRequest({ model: 'm', prompt: 'x', [param]: value }, DEFAULTS),
      () => parseChatRequest({ model: 'm', messages: [{ role: 'user', content: 'x' }], [param]: value }, DEFAULTS),
    ]) {
      expect(status(parse)).toEqual({ status: 400, param });
      expect(parse).toThrow(message);
    }
  });

  it('a temperature below 1e-5 is greedy (top_p, top_k off); seed -1 is no seed; penalties in range pass', () => {
    const body = JSON.parse('{"model": "m", "prompt": "x", "temperature": 1e-45, "top_p": 0.5, "top_k": 3}');
    expect(parseCompletionRequest(body, DEFAULTS)).toMatchObject({ temperature: 0, topP: 1, topK: 0 });
    expect(parseCompletionRequest({ ...body, temperature: 9.99e-6 }, DEFAULTS)).toMatchObject({ temperature: 0 });
    expect(parseCompletionRequest({ ...body, temperature: 1e-5 }, DEFAULTS)).toMatchObject({
      temperature: 1e-5,
      topP: 0.5,
      topK: 3,
    });
    // the config's default goes through the same normalisation
    expect(
      parseCompletionRequest({ model: 'm', prompt: 'x' }, { ...DEFAULTS, temperature: 1e-9, top_k: 5 }),
    ).toMatchObject({ temperature: 0, topK: 0 });
    expect(JSON.parse('{"t": 1e999}').t).toBe(Number.POSITIVE_INFINITY); // how Infinity reaches the parser
    const unseeded = parseCompletionRequest({ model: 'm', prompt: 'x', seed: -1, temperature: 1 }, DEFAULTS);
    expect(unseeded.seeded).toBe(false);
    const seeded = parseCompletionRequest({ model: 'm', prompt: 'x', seed: -2, temperature: 1 }, DEFAULTS);
    expect([seeded.seeded, seeded.seed]).toEqual([true, 2 ** 32 - 2]);
    const ok = { presence_penalty: -2, frequency_penalty: 2, repetition_penalty: 1.3 };
    expect(parseCompletionRequest({ model: 'm', prompt: 'x', ...ok }, DEFAULTS).prompt).toBe('x');
  });

  it('chat: messages with string or text-part content; bad ones name the field', () => {
    const r = parseChatRequest(
      {
        model: 'm',
        messages: [
          { role: 'developer', content: 'a' },
          {
            role: 'user',
            content: [
              { type: 'text', text: 'b' },
              { type: 'text', text: 'c' },
            ],
          },
        ],
        max_completion_tokens: 7,
      },
      DEFAULTS,
    );
    expect(r.messages).toEqual([
      { role: 'system', content: 'a' },
      { role: 'user', content: 'bc' },
    ]);
    expect(r.maxTokens).toBe(7);
    expect(status(() => parseChatRequest({ model: 'm', messages: [] }, DEFAULTS)).param).toBe('messages');
    expect(
      status(() => parseChatRequest({ model: 'm', messages: [{ role: 'robot', content: 'x' }] }, DEFAULTS)).param,
    ).toBe('messages[0].role');
    expect(
      status(() => parseChatRequest({ model: 'm', messages: [{ role: 'user', content: 3 }] }, DEFAULTS)).param,
    ).toBe('messages[0].content');
    expect(status(() => parseChatRequest([1], DEFAULTS)).param).toBe('body');
  });
});

describe('ServerMetrics (prom-client)', () => {
  it(
    'exports spec-decode counters and verify budgets ' +
      '(specd_verify_budget_tokens histogram, the unverified-draft counter)',
    async () => {
      const m = new ServerMetrics({
        running: () => 0,
        waiting: () => 0,
        targetPagesInUse: () => 0,
        draftPagesInUse: () => 0,
        stateSlotsInUse: () => 0,
        prefillTokens: () => 0,
        transfersInFlight: () => 0,
      });
      const spec = new RequestMetrics();
      spec.recordBudget(7, 2);
      spec.recordStep(2, 1);
      spec.recordBudget(7, 0);
      spec.recordStep(0, 0);
      spec.recordBudget(5, 5);
      spec.recordStep(5, 3);
      // 3 verify steps, the second cut to 0 drafts (a plain step): 2 draft steps, 7 draft tokens
      expect(spec.draftSteps).toBe(2);
      m.recordRequest('completion', 'length', { promptTokens: 3, outputTokens: 7, ttft: 0.01, e2e: 0.05, spec });
      // a request that never drafted (k = 0 throughout, or no drafter) moves no spec-decode counter
      const plain = new RequestMetrics();
      for (let i = 0; i < 4; i++) plain.recordStep(0, 0);
      m.recordRequest('completion', 'length', { promptTokens: 3, outputTokens: 4, e2e: 0.05, spec: plain });
      const text = await m.registry.metrics();
      expect(text).toContain('specd_spec_decode_num_drafts_total 2\n');
      expect(text).toContain('specd_spec_decode_num_draft_tokens_total 7\n');
      expect(text).toContain('specd_spec_decode_num_accepted_tokens_total 4\n');
      expect(text).toContain('# TYPE specd_verify_budget_tokens histogram');
      expect(text).toContain('specd_verify_budget_tokens_bucket{le="0"} 1');
      expect(text).toContain('specd_verify_budget_tokens_bucket{le="2"} 2');
      expect(text).toContain('specd_verify_budget_tokens_bucket{le="5"} 3');
      expect(text).toContain('specd_verify_budget_tokens_count 3');
      expect(text).toContain('specd_verify_budget_tokens_sum 7');
      expect(text).toContain('specd_spec_decode_num_unverified_draft_tokens_total 12');
      expect(spec.meanBudget).toBeCloseTo(7 / 3, 12);
      expect(spec.toJSON()).toMatchObject({ unverified: 12, verify_budget_histogram: [1, 0, 1, 0, 0, 1] });
    },
  );
});
