// The TTFT waterfall of disaggregated requests (pd/waterfall.ts) on loopback: kimi-k3-tiny + DFlash through
// `specd router`, streamed and not. Every phase is measured where it happens (P, D, router) and is non-negative,
// the phases' sum is within the TTFT the router measured, the prefill forward and the transfer wait are positive,
// the payload bytes by kind equal the decode instance's manifest (its specd_pd_payload_bytes) and the descriptors
// the prefill instance's count; each instance exports its phases and the router all of them.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  allFree,
  checkWaterfall,
  completionWithWaterfall,
  drafterBranch,
  metric,
  metricsOf,
  MODELS,
  PHASES,
  type SpecdProcess,
  startPdCluster,
  stopAll,
  until,
} from './pd-cluster.js';
import { skipWithoutFiles } from './require-files.js';

const DFLASH = path.join(MODELS, 'kimi-k3-tiny-dflash');
const HAVE = !skipWithoutFiles('PD TTFT waterfall', [
  path.join(MODELS, 'kimi-k3-tiny/config.json'),
  path.join(DFLASH, 'config.json'),
]);

let tmp: string;
beforeAll(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-pd-waterfall-'));
});
afterAll(() => {
  if (tmp !== undefined) fs.rmSync(tmp, { recursive: true, force: true });
});

describe.skipIf(!HAVE)('PD TTFT waterfall (loopback)', () => {
  it('phases measured where they happen, bytes equal to the manifest', async () => {
    const cfg = path.join(tmp, 'kimi-dflash.json');
    fs.writeFileSync(cfg, JSON.stringify({ model: path.join(MODELS, 'kimi-k3-tiny'), drafter: drafterBranch(DFLASH) }));
    const procs: (SpecdProcess | undefined)[] = [];
    try {
      const { p, d, r } = await startPdCluster(cfg);
      procs.push(p, d, r);
      const model = (await (await fetch(`${r.url}/v1/models`)).json()).data[0].id as string;
      const prompt = 'Once upon a time, in a land far away, there lived a '.repeat(6);
      const bytes: Record<string, number> = { target_kv: 0, linear_state: 0, draft_context: 0 };
      let descriptors = 0;
      const runs = [false, true, false];
      for (const [i, stream] of runs.entries()) {
        const body = { model, prompt: `${i} ${prompt}`, max_tokens: 8, temperature: 0, stream };
        const { waterfall: w, requestId } = await completionWithWaterfall(r.url, body);
        expect(w.request_id).toBe(requestId);
        checkWaterfall(w, `request ${i}${stream ? ' (streamed)' : ''}`);
        for (const k of Object.keys(bytes)) bytes[k] = (bytes[k] ?? 0) + (w.payload_bytes[k] ?? 0);
        descriptors += w.descriptors;
        console.log(`waterfall ${i}${stream ? ' (streamed)' : ''}: ${JSON.stringify(w)}`);
      }
      const [pm, dm, rm] = await Promise.all([metricsOf(p.url), metricsOf(d.url), metricsOf(r.url)]);
      // the payload the router reports (P's manifest rows) is what D expected and checked, kind by kind
      for (const [k, n] of Object.entries(bytes)) {
        expect(n, k).toBe(metric(dm, 'specd_pd_payload_bytes_sum', `kind="${k}"`) || 0);
        expect(n, k).toBeGreaterThan(0);
      }
      expect(descriptors).toBe(metric(pm, 'specd_pd_transfer_descriptors_sum'));
      for (const ph of ['prefill_queue', 'prefill_forward', 'bootstrap'])
        expect(metric(pm, 'specd_pd_phase_seconds_count', `phase="${ph}"`), ph).toBe(runs.length);
      for (const ph of ['transfer_wait', 'decode_queue', 'decode_first_step'])
        expect(metric(dm, 'specd_pd_phase_seconds_count', `phase="${ph}"`), ph).toBe(runs.length);
      for (const ph of PHASES) expect(metric(rm, 'specd_router_waterfall_seconds_count', `phase="${ph}"`)).toBe(3);
      expect(metric(rm, 'specd_router_ttft_seconds_count')).toBe(runs.length);
      expect((await fetch(`${r.url}/pd/waterfall/no-such-request`)).status).toBe(404);
      for (const u of [p.url, d.url]) await until(`${u} frees every page`, () => allFree(u));
    } finally {
      await stopAll(procs);
    }
  }, 120_000);
});
