// Prefill/decode disaggregation as real processes on loopback: `specd serve --role prefill`, `specd serve --role
// decode` and `specd router` (all on port 0), the `openai` client against the router. For every drafter in
// models/ of the shipped Kimi target and of SmolLM2, and plain decoding: greedy completions through the router
// equal an aggregated server's, streamed text equals non-streamed text; the decode instance runs no prompt token
// through its target (specd_prompt_tokens_prefilled stays 0 there and equals the prompt tokens on the prefill
// instance), payload bytes by kind are reported, and every page and slot is free afterwards; seeded sampling gives
// the same text too. The faults are in pd-faults.test.ts.
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
  startPdCluster,
  startSpecd,
  stopAll,
  tempDir,
  until,
} from './pd-cluster.js';
import { skipWithoutFiles } from './require-files.js';

interface Family {
  readonly target: string;
  readonly file: string;
  readonly prompts: readonly string[];
}

const FAMILIES: readonly Family[] = [
  {
    target: 'kimi-k3-tiny',
    file: 'kimi-k3-tiny/config.json',
    prompts: [
      'The quick brown fox',
      'def fibonacci(n):\n    if n < 2:\n        return n\n',
      'Once upon a time, in a',
      // longer than the sliding draft windows (64 of kimi-k3-tiny-dflash-swa, 128 of -dflash's last layer) plus a page
      Array.from({ length: 14 }, (_, i) => `Day ${i + 1}: the fox ran through the quiet forest and home again.`).join(
        ' ',
      ),
    ],
  },
  {
    target: 'smollm2-135m-instruct',
    file: 'smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf',
    prompts: ['The capital of France is', 'Here is a short poem about the sea:\n'],
  },
];

const tmp = tempDir('specd-pd-serve-');

/** A config file: the target, the drafter (or none) at a fixed draft length, and `extra` merged in. */
function config(name: string, target: string, drafter: string | undefined, extra: Record<string, unknown> = {}) {
  const file = path.join(tmp(), `${name}.json`);
  const d = drafterBranch(drafter);
  fs.writeFileSync(file, JSON.stringify({ model: path.join(MODELS, target), drafter: d, ...extra }));
  return file;
}

/**
 * Draft KV bytes D receives for a block drafter's context of `length` rows (core `DrafterBase.draftKvEntries`): per
 * layer K and V, every page of a full layer, the pages of rows [length − W, length) of a layer sliding over W;
 * pages of 16 rows of `[kvHeads, headDim]` f32. Undefined for a checkpoint without `layer_types` (EAGLE-3).
 */
function draftContextBytes(dir: string, length: number): number | undefined {
  const c = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8')) as {
    layer_types?: string[];
    sliding_window?: number;
    num_key_value_heads: number;
    head_dim: number;
  };
  if (c.layer_types === undefined) return undefined;
  const page = 16 * c.num_key_value_heads * c.head_dim * 4;
  let pages = 0;
  for (const t of c.layer_types) {
    const w = t === 'sliding_attention' ? (c.sliding_window ?? 0) : 0;
    pages += Math.ceil(length / 16) - (w > 0 ? Math.floor(Math.max(0, length - w) / 16) : 0);
  }
  return 2 * pages * page;
}

for (const family of FAMILIES) {
  const HAVE = !skipWithoutFiles(`PD serving (${family.target})`, [path.join(MODELS, family.file)]);
  describe.skipIf(!HAVE)(`PD through the router: ${family.target}`, () => {
    const cases = [undefined, ...(HAVE ? drafterDirs(family.target) : [])];
    it.each(cases.map((d) => [d === undefined ? 'plain decoding' : path.basename(d), d]))(
      '%s: router output equals aggregated; D prefills nothing',
      async (name, dir) => {
        const cfg = config(`${family.target}-${name}`, family.target, dir);
        const procs: (SpecdProcess | undefined)[] = [];
        try {
          const a = await startSpecd(['serve', '--config', cfg, '--port', '0', '--log-level', 'warn']);
          procs.push(a);
          const { p, d, r } = await startPdCluster(cfg);
          procs.push(p, d, r);
          const model = await modelId(a.url);
          const agg = new OpenAI({ baseURL: `${a.url}/v1`, apiKey: 'none' });
          const pd = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'none' });
          let promptTokens = 0;
          const handedOff: number[] = []; // the prompt length of every request P handed to D
          for (const prompt of family.prompts) {
            const body = { model, prompt, max_tokens: 20, temperature: 0 };
            const want = await agg.completions.create(body);
            const got = await pd.completions.create(body);
            expect(got.choices[0]?.text, prompt).toBe(want.choices[0]?.text);
            expect(got.usage?.completion_tokens).toBe(want.usage?.completion_tokens);
            promptTokens += got.usage?.prompt_tokens ?? 0;
            handedOff.push(got.usage?.prompt_tokens ?? 0, got.usage?.prompt_tokens ?? 0, got.usage?.prompt_tokens ?? 0);
            let streamed = '';
            for await (const chunk of await pd.completions.create({ ...body, stream: true }))
              streamed += chunk.choices[0]?.text ?? '';
            expect(streamed, `${prompt} (streamed)`).toBe(want.choices[0]?.text);
            promptTokens += got.usage?.prompt_tokens ?? 0;
            // seeded sampling: P samples the first token, D continues the request's PRNG stream from its draws
            const sampled = { ...body, temperature: 0.8, seed: 3 };
            const wantS = await agg.completions.create(sampled);
            const gotS = await pd.completions.create(sampled);
            expect(gotS.choices[0]?.text, `${prompt} (seed 3, T 0.8)`).toBe(wantS.choices[0]?.text);
            promptTokens += gotS.usage?.prompt_tokens ?? 0;
          }
          const chat = {
            model,
            messages: [{ role: 'user' as const, content: 'Say hello.' }],
            max_tokens: 12,
            temperature: 0,
          };
          const hasTemplate = (await agg.chat.completions.create(chat).catch(() => undefined)) !== undefined;
          if (hasTemplate) {
            const want = await agg.chat.completions.create(chat);
            const got = await pd.chat.completions.create(chat);
            expect(got.choices[0]?.message.content).toBe(want.choices[0]?.message.content);
            promptTokens += got.usage?.prompt_tokens ?? 0;
            handedOff.push(got.usage?.prompt_tokens ?? 0);
          }
          const dm = await metricsOf(d.url);
          const pm = await metricsOf(p.url);
          expect(metric(dm, 'specd_prompt_tokens_prefilled')).toBe(0);
          expect(metric(pm, 'specd_prompt_tokens_prefilled')).toBe(promptTokens);
          expect(metric(dm, 'specd_pd_payload_bytes_count', 'kind="target_kv"')).toBeGreaterThan(0);
          if (dir !== undefined && !name.endsWith('eagle3'))
            expect(metric(dm, 'specd_pd_payload_bytes_sum', 'kind="draft_context"')).toBeGreaterThan(0);
          // every request came with its draft context as KV (pd.draft_context "kv", the default)
          if (dir !== undefined)
            expect(metric(dm, 'specd_pd_draft_context_form_total', 'form="kv"')).toBe(handedOff.length);
          // a block drafter sends its draft KV, a sliding layer only its window's pages: exactly these bytes (the
          // Kimi family's last prompt is past both windows plus a page)
          if (family.target === 'kimi-k3-tiny') expect(Math.max(...handedOff)).toBeGreaterThan(128 + 16);
          const draftBytes = dir === undefined ? undefined : draftContextBytes(dir, 1);
          if (dir !== undefined && draftBytes !== undefined)
            expect(metric(dm, 'specd_pd_payload_bytes_sum', 'kind="draft_context"')).toBe(
              handedOff.reduce((a, n) => a + (draftContextBytes(dir, n) as number), 0),
            );
          for (const [u, m] of [
            [p.url, pm],
            [d.url, dm],
          ] as const) {
            expect(metric(m, 'specd_kv_pages_used', 'cache="target"'), u).toBe(0);
            expect(metric(m, 'specd_state_slots_used'), u).toBe(0);
            expect(metric(m, 'specd_pd_transfers_inflight'), u).toBe(0);
          }
        } finally {
          await stopAll(procs);
        }
      },
      300_000,
    );
  });
}

// What a vLLM user sends besides a plain completion, through the router: logprobs (completions and chat, streamed
// and not), completions' echo with logprobs, a request that ends on its first token (P's `finished` path), n > 1
// and a list of prompts (one P/D pair per choice), each equal to the aggregated server's answer.
const KIMI = !skipWithoutFiles('PD surface', [path.join(MODELS, 'kimi-k3-tiny/config.json')]);
describe.skipIf(!KIMI)('PD through the router: logprobs, echo, n > 1, prompt lists', () => {
  it('every answer equals the aggregated server', async () => {
    const dir = KIMI ? drafterDirs('kimi-k3-tiny').find((d) => d.endsWith('dflash')) : undefined;
    const cfg = config('kimi-surface', 'kimi-k3-tiny', dir);
    const procs: (SpecdProcess | undefined)[] = [];
    try {
      const a = await startSpecd(['serve', '--config', cfg, '--port', '0', '--log-level', 'warn']);
      procs.push(a);
      const { p, d, r } = await startPdCluster(cfg);
      procs.push(p, d, r);
      const model = await modelId(a.url);
      const agg = new OpenAI({ baseURL: `${a.url}/v1`, apiKey: 'none' });
      const pd = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'none' });
      const same = async (body: Record<string, unknown>, what: string): Promise<OpenAI.Completion> => {
        const b = { model, ...body } as unknown as OpenAI.CompletionCreateParamsNonStreaming;
        const want = await agg.completions.create(b);
        const got = await pd.completions.create(b);
        expect(got.choices, what).toEqual(want.choices);
        expect(got.usage, what).toEqual(want.usage);
        return got;
      };
      const prompt = 'The quick brown fox';
      const lp = await same({ prompt, max_tokens: 8, temperature: 0, logprobs: 3 }, 'logprobs');
      expect(lp.choices[0]?.logprobs?.token_logprobs?.length).toBe(8);
      const echo = await same({ prompt, max_tokens: 5, temperature: 0.7, seed: 5, logprobs: 2, echo: true }, 'echo');
      expect(echo.choices[0]?.text.startsWith(prompt)).toBe(true);
      expect(echo.choices[0]?.logprobs?.token_logprobs?.[0]).toBeNull();
      await same({ prompt, max_tokens: 1, temperature: 0, logprobs: 1 }, 'ends on its first token');
      await same({ prompt, max_tokens: 6, temperature: 0.9, seed: 11, n: 3 }, 'n = 3, seeded');
      await same({ prompt: [prompt, 'Once upon a time'], max_tokens: 6, temperature: 0, n: 2, logprobs: 1 }, 'list');
      // streamed: the chunks add up to the non-streamed choices, indices kept, one usage chunk
      const body = { model, prompt: [prompt, 'In the beginning'], max_tokens: 6, temperature: 0, n: 2 };
      const whole = await agg.completions.create(body);
      const texts = ['', '', '', ''];
      let usage: OpenAI.CompletionUsage | undefined;
      const stream = await pd.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
      for await (const c of stream) {
        for (const ch of c.choices) texts[ch.index] += ch.text;
        if (c.usage) usage = c.usage;
      }
      expect(texts).toEqual(whole.choices.map((c) => c.text));
      expect(usage).toEqual(whole.usage);
      // chat top_logprobs, streamed and not
      const chat = {
        model,
        messages: [{ role: 'user' as const, content: 'Say hello.' }],
        max_tokens: 6,
        temperature: 0,
        logprobs: true,
        top_logprobs: 2,
      };
      const wantChat = await agg.chat.completions.create(chat);
      expect((await pd.chat.completions.create(chat)).choices).toEqual(wantChat.choices);
      const content: OpenAI.ChatCompletionTokenLogprob[] = [];
      for await (const c of await pd.chat.completions.create({ ...chat, stream: true }))
        content.push(...(c.choices[0]?.logprobs?.content ?? []));
      expect(content).toEqual(wantChat.choices[0]?.logprobs?.content);
      for (const u of [p.url, d.url]) await until(`${u} frees every page`, () => allFree(u));
    } finally {
      await stopAll(procs);
    }
  }, 300_000);
});
