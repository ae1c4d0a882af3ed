// The request fields that change the target's logits or stop on token ids — presence_penalty, frequency_penalty,
// repetition_penalty, min_tokens, stop_token_ids, logit_bias — parsed (ranges, 400 naming the field), passed to the
// engine and into the PD request digest, and end to end through `specd serve` with the official `openai` client on
// an ephemeral port of 127.0.0.1: greedy output with penalties equals plain decoding (no drafter) with the same
// settings, logit_bias and stop_token_ids with min_tokens, out-of-vocabulary ids refused with a 400.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { startServe, type StartedServer } from '../../src/cli/serve.js';
import { SpecEngine, type SamplingParams } from '../../src/engine/index.js';
import { requestDigest } from '../../src/pd/protocol.js';
import { ApiError } from '../../src/serve/errors.js';
import { StopTextBuffer } from '../../src/serve/stop-text.js';
import {
  parseChatRequest,
  parseCompletionRequest,
  samplingOf,
  type SamplingDefaults,
} from '../../src/serve/protocol.js';
import { makeTempDir } from '../io/helpers.js';

const DEFAULTS: SamplingDefaults = { temperature: 1, top_p: 1, top_k: 0 };

const param = (f: () => unknown): { status: number; param: string | null | undefined; message: string } => {
  try {
    f();
  } catch (e) {
    if (e instanceof ApiError) return { status: e.status, param: e.param, message: e.message };
    throw e;
  }
  throw new Error('expected an ApiError');
};

describe('parsing the logits fields', () => {
  it('passes them to the engine sampling; absent fields stay absent', () => {
    const body = {
      model: 'm',
      prompt: 'x',
      temperature: 0,
      max_tokens: 9,
      presence_penalty: 0.5,
      frequency_penalty: -1.5,
      repetition_penalty: 1.2,
      min_tokens: 9,
      stop_token_ids: [7, 0],
      logit_bias: { '5': 100, '12': -100, '3': 0.25 },
    };
    const p = parseCompletionRequest(body, DEFAULTS);
    expect(p).toMatchObject({ presencePenalty: 0.5, frequencyPenalty: -1.5, repetitionPenalty: 1.2, minTokens: 9 });
    expect(p.stopTokenIds).toEqual([7, 0]);
    expect([...p.logitBias!]).toEqual([
      [3, 0.25],
      [5, 100],
      [12, -100],
    ]);
    expect(samplingOf(p)).toEqual({
      temperature: 0,
      topK: 0,
      topP: 1,
      presencePenalty: 0.5,
      frequencyPenalty: -1.5,
      repetitionPenalty: 1.2,
      minTokens: 9,
      logitBias: p.logitBias,
    });
    const plain = parseChatRequest(
      { model: 'm', messages: [{ role: 'user', content: 'x' }], logit_bias: {} },
      DEFAULTS,
    );
    const s = samplingOf(plain);
    expect(Object.keys(s).sort()).toEqual(['temperature', 'topK', 'topP']);
    expect(plain.stopTokenIds).toBeUndefined();
  });

  it.each([
    [{ min_tokens: -1 }, 'min_tokens', 'expected an integer >= 0, got -1'],
    [{ min_tokens: 1.5 }, 'min_tokens', 'got 1.5'],
    [{ min_tokens: 10, max_tokens: 9 }, 'min_tokens', 'expected at most max_tokens (9), got 10'],
    [{ stop_token_ids: [1, -2] }, 'stop_token_ids', 'expected an array of token ids'],
    [{ stop_token_ids: 3 }, 'stop_token_ids', 'expected an array of token ids'],
    [{ logit_bias: [1, 2] }, 'logit_bias', 'expected an object of token id -> bias'],
    [{ logit_bias: { abc: 1 } }, 'logit_bias', 'expected token ids as keys, got "abc"'],
    [{ logit_bias: { '-1': 1 } }, 'logit_bias', 'expected token ids as keys'],
    [{ logit_bias: { '4': 100.5 } }, 'logit_bias', 'the bias of token 4: expected a number in [-100, 100], got 100.5'],
    [{ logit_bias: { '4': '1' } }, 'logit_bias', 'got 1'],
    [{ presence_penalty: -2.1 }, 'presence_penalty', 'expected a number in [-2, 2]'],
  ])('%j → 400 naming %s', (fields, field, message) => {
    for (const parse of [
      () => parseCompletionRequest({ model: 'm', prompt: 'x', ...fields }, DEFAULTS),
      () => parseChatRequest({ model: 'm', messages: [{ role: 'user', content: 'x' }], ...fields }, DEFAULTS),
    ]) {
      const e = param(parse);
      expect([e.status, e.param]).toEqual([400, field]);
      expect(e.message).toContain(message);
    }
  });

  it('a stop-text buffer made unarmed (min_tokens) sends everything and finds stop strings only after arm()', () => {
    const b = new StopTextBuffer(['ab'], false);
    expect(b.push('xab')).toBe('xab');
    expect(b.push('a')).toBe('a');
    b.arm();
    expect(b.push('a')).toBe(''); // held: it may start a stop string
    expect(b.push('bz')).toBe('');
    expect([b.stopped, b.fullText]).toEqual([true, 'xaba']);
  });

  it('the PD request digest differs when a field that decides tokens differs', () => {
    const base = { model: 'm', prompt: 'x', temperature: 0 };
    const ids = [1, 2, 3];
    const digest = (extra: object) => requestDigest(ids, parseCompletionRequest({ ...base, ...extra }, DEFAULTS));
    const all = [
      digest({}),
      digest({ presence_penalty: 0.5 }),
      digest({ frequency_penalty: 0.5 }),
      digest({ repetition_penalty: 1.1 }),
      digest({ min_tokens: 2 }),
      digest({ stop_token_ids: [4] }),
      digest({ logit_bias: { '4': 1 } }),
      digest({ logit_bias: { '4': 2 } }),
    ];
    expect(new Set(all).size).toBe(all.length);
    // the order of logit_bias keys does not matter
    expect(digest({ logit_bias: { '4': 1, '9': 2 } })).toBe(digest({ logit_bias: { '9': 2, '4': 1 } }));
  });
});

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const MODEL = 'kimi-k3-tiny';
const tmp = makeTempDir('serve-logits');
const io = { stdout: { write: () => true }, stderr: { write: () => true }, cwd: ROOT };

let s: StartedServer;
let client: OpenAI;

beforeAll(async () => {
  const cfg = path.join(tmp, 'serve.json');
  fs.writeFileSync(
    cfg,
    JSON.stringify({
      model: path.join(ROOT, 'models/kimi-k3-tiny'),
      drafter: { method: 'dflash', path: path.join(ROOT, 'models/kimi-k3-tiny-dflash'), num_draft_tokens: 8 },
      scheduler: { max_running_requests: 4, max_sequence_tokens: 512 },
      server: { port: 8000 },
    }),
  );
  s = await startServe({ config: cfg, port: 0, logLevel: 'silent' }, io);
  client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'none', maxRetries: 0 });
});
afterAll(async () => {
  await s?.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

type Extra = {
  ignore_eos?: boolean;
  return_token_ids?: boolean;
  repetition_penalty?: number;
  min_tokens?: number;
  stop_token_ids?: number[];
};
type Choice = OpenAI.CompletionChoice & { token_ids: number[] };
const complete = async (p: OpenAI.CompletionCreateParamsNonStreaming & Extra): Promise<Choice> =>
  (await client.completions.create({ return_token_ids: true, ...p } as OpenAI.CompletionCreateParamsNonStreaming))
    .choices[0] as Choice;

/** Plain decoding (no drafter) of `prompt` on the server's target with `sampling`, greedy. */
function plain(prompt: string, maxTokens: number, sampling: SamplingParams): number[] {
  const engine = new SpecEngine(s.target.model, undefined, { maxSequences: 1, maxTokensPerSequence: 256 });
  const [r] = engine.run([
    {
      id: 'plain',
      promptIds: s.target.tokenizer.encode(prompt, { addSpecialTokens: false }),
      maxTokens,
      sampling,
      seed: 1,
      ignoreEos: true,
    },
  ]);
  return r!.tokenIds;
}

describe('specd serve with penalties, logit_bias, min_tokens and stop_token_ids (openai client)', () => {
  it('greedy with penalties and logit_bias: the tokens of plain decoding with the same settings', async () => {
    const prompt = 'The history of the';
    const r = await complete({
      model: MODEL,
      prompt,
      max_tokens: 32,
      temperature: 0,
      ignore_eos: true,
      presence_penalty: 0.4,
      frequency_penalty: 0.6,
      repetition_penalty: 1.2,
      logit_bias: { '13': 2 },
    });
    const want = plain(prompt, 32, {
      temperature: 0,
      presencePenalty: 0.4,
      frequencyPenalty: 0.6,
      repetitionPenalty: 1.2,
      logitBias: new Map([[13, 2]]),
    });
    expect(r.token_ids).toEqual(want);
    expect(r.token_ids).not.toEqual(plain(prompt, 32, { temperature: 0 }));
    expect(r.text).toBe(s.target.tokenizer.decode(want, { skipSpecialTokens: true }));
  });

  it('logit_bias +100 makes a token certain; a stop token id ends after min_tokens, text left out', async () => {
    const prompt = 'Once upon a time';
    const biased = await complete({ model: MODEL, prompt, max_tokens: 5, temperature: 0, logit_bias: { '300': 100 } });
    expect(biased.token_ids).toEqual([300, 300, 300, 300, 300]);
    const base = { model: MODEL, prompt, max_tokens: 20, temperature: 0, logit_bias: { '300': 100 }, min_tokens: 3 };
    const stopped = await complete({ ...base, stop_token_ids: [300] });
    expect(stopped.finish_reason).toBe('stop');
    expect(stopped.token_ids).toHaveLength(4);
    expect(stopped.token_ids.slice(0, 3)).not.toContain(300);
    expect(stopped.token_ids[3]).toBe(300);
    const first3 = await complete({ ...base, max_tokens: 3, stop_token_ids: [300] });
    expect(first3.token_ids).toEqual(stopped.token_ids.slice(0, 3));
    expect(stopped.text).toBe(first3.text);
    // (token 300 has text, so leaving it out is seen)
    expect(s.target.tokenizer.decode([300], { skipSpecialTokens: true }).trim()).not.toBe('');
    // streamed: the same text, the same finish reason
    const stream = await client.completions.create({
      ...base,
      stop_token_ids: [300],
      stream: true,
    } as OpenAI.CompletionCreateParamsStreaming);
    let text = '';
    let finish: string | null = null;
    for await (const c of stream) {
      text += c.choices[0]?.text ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    expect([text, finish]).toEqual([first3.text, 'stop']);
  });

  it('token ids outside the vocabulary in logit_bias or stop_token_ids: 400 naming the field', async () => {
    const V = s.target.model.info.vocabSize;
    const err = async (p: Promise<unknown>) => {
      try {
        await p;
      } catch (e) {
        return e as InstanceType<typeof OpenAI.APIError>;
      }
      throw new Error('expected an error');
    };
    const bias = await err(complete({ model: MODEL, prompt: 'x', logit_bias: { [String(V)]: 1 } }));
    expect(bias.status).toBe(400);
    expect(bias.error).toMatchObject({ type: 'invalid_request_error', param: 'logit_bias' });
    expect(bias.message).toContain(`token id ${V} is outside the vocabulary (size ${V})`);
    const chat = await err(
      client.chat.completions.create({
        model: MODEL,
        messages: [{ role: 'user', content: 'hi' }],
        stop_token_ids: [V + 5],
      } as OpenAI.ChatCompletionCreateParamsNonStreaming),
    );
    expect([chat.status, (chat.error as { param: string }).param]).toEqual([400, 'stop_token_ids']);
    // the server still answers
    expect((await complete({ model: MODEL, prompt: 'x', max_tokens: 2, temperature: 0 })).token_ids).toHaveLength(2);
  });
});
