// The transfer overlapped with prefill (`pd.overlap`, packages/core/src/pd/overlap.ts), as real processes on
// loopback (P, D and the router on port 0; the `openai` client): P sends each finished prefill chunk's rows while the
// prompt of several hundred tokens still prefills, and
// - greedy and seeded-sampled completions through the router equal an aggregated server's, for kimi-k3-tiny alone
//   and with every shipped drafter, with the same acceptances (D drafts from the draft context sent in parts);
// - the router's waterfall says bytes went early (`overlapped_bytes` > 0), never the linear-attention state nor a
//   sliding layer's window (at most the target KV plus the full draft layers' rows), and none with `pd.overlap`
//   false, where the output is the same;
// - a client that drops its request while P is sending parts leaves every page and slot free on P and D.
import * as fs from 'node:fs';
import * as path from 'node:path';

import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';

import {
  allFree,
  completionWithWaterfall,
  drafterDirs,
  kimiConfig,
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

const HAVE = !skipWithoutFiles('PD overlap', [path.join(MODELS, 'kimi-k3-tiny/config.json')]);
const tmp = tempDir('specd-pd-overlap-');
/** About 700 tokens: 11 prefill chunks of 64. */
const LONG = Array.from(
  { length: 48 },
  (_, i) => `Day ${i + 1}: the fox ran ${i % 3 === 0 ? 'through the quiet forest' : 'along the river'} and home.`,
).join(' ');

/** Whether every layer of a drafter checkpoint slides (its draft context then never goes early). */
function allSlide(dir: string | undefined): boolean {
  if (dir === undefined) return false;
  const c = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8')) as { layer_types?: string[] };
  return c.layer_types?.every((t) => t === 'sliding_attention') === true;
}

const accepted = async (u: string) => metric(await metricsOf(u), 'specd_spec_decode_num_accepted_tokens_total') || 0;

describe.skipIf(!HAVE)('PD: the transfer overlapped with prefill (pd.overlap)', () => {
  const cases: [string, string | undefined][] = [
    ['no drafter', undefined],
    ...drafterDirs('kimi-k3-tiny').map((d): [string, string] => [path.basename(d), d]),
  ];

  it.each(cases)(
    '%s: output equals aggregated, rows went while P prefilled',
    async (name, dir) => {
      const cfg = kimiConfig(tmp(), name.replace(/ /g, '-'), dir);
      const procs: (SpecdProcess | undefined)[] = [];
      try {
        const a = await startSpecd(['serve', '--config', cfg, '--port', '0', '--log-level', 'warn']);
        procs.push(a);
        const { p, d, r } = await startPdCluster(cfg);
        procs.push(p, d, r);
        const model = await modelId(a.url);
        const agg = new OpenAI({ baseURL: `${a.url}/v1`, apiKey: 'none' });
        const body = { model, prompt: LONG, max_tokens: 24, temperature: 0 };
        const want = await agg.completions.create(body);
        const got = await completionWithWaterfall(r.url, body);
        expect(got.text).toBe(want.choices[0]?.text);
        expect(want.usage?.prompt_tokens).toBeGreaterThan(6 * 64);
        const w = got.waterfall;
        const { target_kv, linear_state, draft_context } = w.payload_bytes as Record<string, number>;
        expect(w.overlapped_bytes, `${name}: bytes sent while prefilling`).toBeGreaterThan(0);
        // never the state; a sliding layer's window only at the handoff
        const early = (target_kv ?? 0) + (allSlide(dir) ? 0 : (draft_context ?? 0));
        expect(w.overlapped_bytes).toBeLessThanOrEqual(early);
        expect(linear_state).toBeGreaterThan(0);
        if (dir !== undefined) {
          expect(await accepted(d.url), `${name}: acceptances on D`).toBe(await accepted(a.url));
          expect(await accepted(d.url)).toBeGreaterThan(0);
        }
        // seeded sampling continues the same PRNG stream on D
        const sampled = { ...body, temperature: 0.8, seed: 11 };
        const pd = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'none' });
        expect((await pd.completions.create(sampled)).choices[0]?.text).toBe(
          (await agg.completions.create(sampled)).choices[0]?.text,
        );
        for (const u of [p.url, d.url]) await until(`${u}: every page and slot free`, () => allFree(u));
      } finally {
        await stopAll(procs);
      }
    },
    300_000,
  );

  it('pd.overlap false: nothing goes early, the same output; a dropped request frees everything', async () => {
    const dir = path.join(MODELS, 'kimi-k3-tiny-dflash');
    const off = kimiConfig(tmp(), 'off', dir, { overlap: false });
    const on = kimiConfig(tmp(), 'on', dir);
    const procs: (SpecdProcess | undefined)[] = [];
    try {
      const c1 = await startPdCluster(off);
      procs.push(c1.p, c1.d, c1.r);
      const c2 = await startPdCluster(on);
      procs.push(c2.p, c2.d, c2.r);
      const model = await modelId(c1.p.url);
      const body = { model, prompt: LONG, max_tokens: 16, temperature: 0 };
      const a = await completionWithWaterfall(c1.r.url, body);
      const b = await completionWithWaterfall(c2.r.url, body);
      expect(a.waterfall.overlapped_bytes).toBe(0);
      expect(b.waterfall.overlapped_bytes).toBeGreaterThan(0);
      expect(b.text).toBe(a.text);
      expect(b.waterfall.payload_bytes).toEqual(a.waterfall.payload_bytes);
      // drops while P prefills and sends parts (a prompt of ~3,000 tokens), at several points
      const longer = Array.from({ length: 4 }, () => LONG).join(' ');
      const client = new OpenAI({ baseURL: `${c2.r.url}/v1`, apiKey: 'none', maxRetries: 0 });
      for (const ms of [50, 150, 400]) {
        const ac = new AbortController();
        const t = setTimeout(() => ac.abort(), ms);
        await client.completions
          .create({ model, prompt: longer, max_tokens: 8, temperature: 0 }, { signal: ac.signal })
          .catch(() => undefined);
        clearTimeout(t);
      }
      for (const u of [c2.p.url, c2.d.url]) await until(`${u}: every page and slot free`, () => allFree(u));
      // both still answer
      expect((await completionWithWaterfall(c2.r.url, body)).text).toBe(a.text);
    } finally {
      await stopAll(procs);
    }
  }, 300_000);
});
