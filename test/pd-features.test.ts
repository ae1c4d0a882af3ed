// Prefill/decode disaggregation with the draft context sent as projected features (`pd.draft_context`), as real
// processes on loopback (P, D and the router on port 0; the `openai` client): with "features" D asks for the
// features of the rows it needs instead of every draft layer's K and V and rebuilds the draft KV from them, so
// greedy completions through the router equal an aggregated server's, with the same acceptances (D drafts from the
// rebuilt draft KV), while D receives exactly the feature pages' bytes
// (`specd_pd_payload_bytes{kind="draft_context"}`); "auto" does the same on its first request (nothing measured
// yet) and equals aggregated throughout. A drafter or a layout that cannot send features is refused at start-up
// with a message naming the setting.
import * as fs from 'node:fs';
import * as path from 'node:path';

import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';

import {
  allFree,
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

const HAVE = !skipWithoutFiles('PD with features', [path.join(MODELS, 'kimi-k3-tiny/config.json')]);
const tmp = tempDir('specd-pd-features-');
const PROMPTS = [
  'Once upon a time, in a',
  // past the -swa variant's window (64) plus a page, so that its feature pages are a window's
  Array.from({ length: 14 }, (_, i) => `Day ${i + 1}: the fox ran through the quiet forest and home again.`).join(' '),
];

/** A config: kimi-k3-tiny, the drafter at a fixed draft length, `pd` merged in. */
/**
 * Feature bytes of a context of `length` rows (core `DrafterBase.draftFeatureEntries`): the pages (16 rows of
 * `hidden` f32) of every row, or of the widest window's rows when every draft layer slides.
 */
function featureBytes(dir: string, length: number): number {
  const c = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8')) as {
    layer_types: string[];
    sliding_window?: number;
    hidden_size: number;
  };
  const allSlide = c.layer_types.every((t) => t === 'sliding_attention');
  const first = allSlide ? Math.floor(Math.max(0, length - (c.sliding_window ?? 0)) / 16) : 0;
  return (Math.ceil(length / 16) - first) * 16 * c.hidden_size * 4;
}

describe.skipIf(!HAVE)('PD with the draft context as features (pd.draft_context)', () => {
  it.each([
    ['kimi-k3-tiny-dflash', 'features'],
    ['kimi-k3-tiny-dflash-swa', 'features'],
    ['kimi-k3-tiny-dspark', 'features'],
    ['kimi-k3-tiny-dflash', 'auto'],
  ])(
    '%s, %s: router output equals aggregated; D receives the feature pages and rebuilds',
    async (name, form) => {
      const dir = path.join(MODELS, name);
      const cfg = kimiConfig(tmp(), `${name}-${form}`, dir, { draft_context: form });
      const procs: (SpecdProcess | undefined)[] = [];
      try {
        const a = await startSpecd(['serve', '--config', cfg, '--port', '0', '--log-level', 'warn']);
        procs.push(a);
        const { p, d, r } = await startPdCluster(cfg);
        procs.push(p, d, r);
        const model = await modelId(a.url);
        const agg = new OpenAI({ baseURL: `${a.url}/v1`, apiKey: 'none' });
        const pd = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'none' });
        let want = 0;
        for (const [i, prompt] of PROMPTS.entries()) {
          const body = { model, prompt, max_tokens: 24, temperature: 0 };
          const a1 = await agg.completions.create(body);
          const got = await pd.completions.create(body);
          expect(got.choices[0]?.text, prompt).toBe(a1.choices[0]?.text);
          want += featureBytes(dir, got.usage?.prompt_tokens ?? 0);
          const draft = metric(await metricsOf(d.url), 'specd_pd_payload_bytes_sum', 'kind="draft_context"');
          // "features" always; "auto" on its first request (nothing measured yet: the fewer bytes)
          if (form === 'features' || i === 0) expect(draft, `${prompt}: draft context bytes`).toBe(want);
          else want = draft;
        }
        // the form of each request D resumed: features for "features"; "auto" began with features
        const forms = await metricsOf(d.url);
        const byForm = (f: string) => metric(forms, 'specd_pd_draft_context_form_total', `form="${f}"`) || 0;
        expect(byForm('features') + byForm('kv')).toBe(PROMPTS.length);
        expect(byForm('features')).toBeGreaterThanOrEqual(form === 'features' ? PROMPTS.length : 1);
        // D drafts from the rebuilt draft KV exactly as the aggregated server from its own: the same acceptances
        const accepted = async (u: string) => metric(await metricsOf(u), 'specd_spec_decode_num_accepted_tokens_total');
        expect(await accepted(d.url)).toBeGreaterThan(0);
        expect(await accepted(d.url)).toBe(await accepted(a.url));
        // seeded sampling continues the same PRNG stream on D
        const sampled = { model, prompt: PROMPTS[1]!, max_tokens: 24, temperature: 0.8, seed: 5 };
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

  it('refuses a drafter or a layout that cannot send features, naming the setting', async () => {
    const eagle = kimiConfig(tmp(), 'eagle-features', path.join(MODELS, 'kimi-k3-tiny-eagle3'), {
      draft_context: 'features',
    });
    await expect(
      startSpecd(['serve', '--config', eagle, '--role', 'decode', '--port', '0', '--log-level', 'warn']),
    ).rejects.toThrow(/pd\.draft_context "features": the eagle3 drafter cannot send its context as features/);
    const tp = kimiConfig(tmp(), 'tp-features', path.join(MODELS, 'kimi-k3-tiny-dflash'), { draft_context: 'auto' });
    await expect(
      startSpecd(['serve', '--config', tp, '--role', 'prefill', '--tp', '2', '--port', '0', '--log-level', 'warn']),
    ).rejects.toThrow(/pd\.draft_context "auto" needs tp = pp = 1 on both sides \(got tp 2, pp 1\)/);
  }, 120_000);
});
