// Speculative-decoding metrics and the periodic stats line, with real values: greedy requests with a fixed draft
// length through the server agree, counter by counter, with the same requests run by a bare SpecEngine (its
// RunMetrics); the τ, acceptance-rate and per-position gauges equal what the counters give; `specd generate --json`
// reports the /metrics counts of the same request with the same denominator (num_drafts); the stats line's
// throughput integrates to the tokens generated and its spec-decode numbers add up to the counters.
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { main, type CliIo } from '../../src/cli/index.js';
import { type DraftPolicy, RunMetrics, SpecEngine } from '../../src/engine/index.js';
import { BUILTIN_PLUGIN_PACKAGES } from '../../src/plugin/registry.js';
import { type LoadedDrafter, loadDrafter } from '../../src/runtime/drafter.js';
import { type LoadedTarget, loadTarget } from '../../src/runtime/target.js';
import {
  ServerMetrics,
  SpecdServer,
  type StatsLine,
  StatsLogger,
  type SpecDecodeTotals,
} from '../../src/serve/index.js';

/** A ServerMetrics whose gauges all read 0 (counters only). */
function idleMetrics(): ServerMetrics {
  const zero = () => 0;
  return new ServerMetrics({
    running: zero,
    waiting: zero,
    targetPagesInUse: zero,
    draftPagesInUse: zero,
    stateSlotsInUse: zero,
    prefillTokens: zero,
    transfersInFlight: zero,
  });
}

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const MODEL = 'kimi-k3-tiny';
const DRAFTER = path.join(ROOT, 'models/kimi-k3-tiny-dflash');
const PROMPTS = ['The history of the', 'Once upon a time there was', 'In the beginning'];
/** Drafts per step and new tokens per request. */
const K = 4;
const NEW_TOKENS = 24;

let target: LoadedTarget;
let drafter: LoadedDrafter;
let server: SpecdServer;
let url: string;
/** The log's JSON records, in order, and who waits for the next one. */
const records: Record<string, unknown>[] = [];
let onRecord: (() => void) | undefined;

beforeAll(async () => {
  target = await loadTarget(path.join(ROOT, 'models', MODEL), BUILTIN_PLUGIN_PACKAGES);
  drafter = await loadDrafter(DRAFTER, BUILTIN_PLUGIN_PACKAGES, target, 1024, 2);
  const logger = pino(
    { level: 'info' },
    {
      write(line: string) {
        records.push(JSON.parse(line) as Record<string, unknown>);
        onRecord?.();
      },
    },
  );
  server = new SpecdServer({
    target,
    drafter: drafter.drafter,
    modelName: MODEL,
    sampling: { temperature: 0, top_p: 1, top_k: 0, max_tokens: 64 },
    scheduler: {
      max_running_requests: 2,
      max_waiting_requests: 8,
      prefill_chunk_tokens: 64,
      max_tokens_in_flight: 4096,
      max_sequence_tokens: 1024,
      page_size: 16,
    },
    bodyLimitBytes: 1 << 20,
    numDraftTokens: K,
    logger,
    statsIntervalMs: 20,
  });
  url = await server.listen('127.0.0.1', 0);
}, 120_000);
afterAll(async () => {
  await server?.close();
  drafter?.drafter.dispose();
  target?.model.dispose();
});

/** The /metrics text parsed: `name{labels}` → value. */
async function scrape(): Promise<Map<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || line.trim() === '') continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

/** The spec-decode counters of a scrape (0 when absent). */
function counters(m: Map<string, number>): SpecDecodeTotals {
  const get = (n: string): number => m.get(n) ?? 0;
  const perPos: number[] = [];
  for (const [k, v] of m) {
    const p = /^specd_spec_decode_num_accepted_tokens_per_pos_total\{position="(\d+)"\}$/.exec(k);
    if (p !== null) perPos[Number(p[1])] = v;
  }
  return {
    draftSteps: get('specd_spec_decode_num_drafts_total'),
    verifySteps: get('specd_spec_decode_num_verify_steps_total'),
    draftTokens: get('specd_spec_decode_num_draft_tokens_total'),
    acceptedTokens: get('specd_spec_decode_num_accepted_tokens_total'),
    acceptedPerPos: Array.from({ length: perPos.length }, (_, i) => perPos[i] ?? 0),
  };
}

const minus = (a: SpecDecodeTotals, b: SpecDecodeTotals): SpecDecodeTotals => ({
  draftSteps: a.draftSteps - b.draftSteps,
  verifySteps: a.verifySteps - b.verifySteps,
  draftTokens: a.draftTokens - b.draftTokens,
  acceptedTokens: a.acceptedTokens - b.acceptedTokens,
  acceptedPerPos: a.acceptedPerPos.map((c, i) => c - (b.acceptedPerPos[i] ?? 0)),
});

async function complete(prompt: string): Promise<void> {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, prompt, max_tokens: NEW_TOKENS, temperature: 0, ignore_eos: true }),
  });
  expect(r.status).toBe(200);
  const body = (await r.json()) as { usage: { completion_tokens: number } };
  expect(body.usage.completion_tokens).toBe(NEW_TOKENS);
}

/** The stats lines logged so far (the log's other records — requests — left out). */
const statsLines = (): (StatsLine & { msg: string; level: number })[] =>
  records.filter((r) => typeof r.msg === 'string' && r.msg.startsWith('Avg prompt throughput')) as (StatsLine & {
    msg: string;
    level: number;
  })[];

/** Resolves once `done()` holds on the log (checked at every new record). */
function waitFor(done: () => boolean): Promise<void> {
  return new Promise((resolve) => {
    const check = (): void => {
      if (!done()) return;
      onRecord = undefined;
      resolve();
    };
    onRecord = check;
    check();
  });
}

describe('speculative-decoding metrics', () => {
  it('per-request counter deltas equal a bare SpecEngine run of the same requests; gauges follow the counters; ' +
    'the stats line adds up', async () => {
    // the known run: the same greedy requests, one at a time, through a bare engine with the same drafts per step
    const engine = new SpecEngine(target.model, drafter.drafter, {
      maxSequences: 1,
      maxTokensPerSequence: 1024,
      pageSize: 16,
      prefillChunk: 64,
      draftLength: () => K,
    });
    const reference = new RunMetrics();
    try {
      const results = engine.run(
        PROMPTS.map((p, id) => ({
          id,
          promptIds: target.tokenizer.encode(p, { addSpecialTokens: false }),
          maxTokens: NEW_TOKENS,
          sampling: { temperature: 0 },
          seed: 0,
          ignoreEos: true,
          eosTokenIds: target.eosTokenIds,
        })),
      );
      // results come back in finishing order: index the metrics by request
      for (let id = 0; id < PROMPTS.length; id++) reference.requests.push(results.find((r) => r.id === id)!.metrics);
      expect(engine.metrics.verifySteps).toBe(reference.verifySteps);
    } finally {
      engine.dispose();
    }
    expect(reference.drafted).toBeGreaterThan(0);
    expect(reference.accepted).toBeGreaterThan(0);

    const start = counters(await scrape());
    for (let i = 0; i < PROMPTS.length; i++) {
      const before = counters(await scrape());
      await complete(PROMPTS[i]!);
      const d = minus(counters(await scrape()), before);
      const m = reference.requests[i]!;
      expect(d.draftSteps, `num_drafts of request ${i}`).toBe(m.draftSteps);
      expect(d.verifySteps, `num_verify_steps of request ${i}`).toBe(m.verifySteps);
      expect(d.draftTokens, `num_draft_tokens of request ${i}`).toBe(m.drafted);
      expect(d.acceptedTokens, `num_accepted_tokens of request ${i}`).toBe(m.accepted);
      expect(d.acceptedPerPos.slice(0, m.acceptedAt.length), `per_pos of request ${i}`).toEqual(
        Array.from({ length: m.acceptedAt.length }, (_, j) => m.acceptedAt[j] ?? 0),
      );
      // plain k = 0 steps (the last token of a request drafts nothing) count as verify steps, not as drafts
      expect(d.verifySteps).toBeGreaterThanOrEqual(d.draftSteps);
    }

    const all = await scrape();
    const c = counters(all);
    const run = minus(c, start);
    expect(run.verifySteps).toBe(reference.verifySteps);
    expect(run.draftSteps).toBe(reference.draftSteps);
    expect(run.acceptedTokens).toBe(reference.accepted);
    // the gauges are what the counters give (since start: this server served only these requests)
    expect(start.verifySteps).toBe(0);
    const tau = all.get('specd_spec_decode_acceptance_length_per_verify_step')!;
    expect(tau).toBeCloseTo((c.acceptedTokens + c.verifySteps) / c.verifySteps, 12);
    expect(tau).toBeCloseTo(reference.tauPerStep, 12);
    expect(all.get('specd_spec_decode_draft_acceptance_rate')).toBeCloseTo(c.acceptedTokens / c.draftTokens, 12);
    c.acceptedPerPos.forEach((n, i) => {
      expect(all.get(`specd_spec_decode_per_position_acceptance_rate{position="${i}"}`), `position ${i}`).toBeCloseTo(
        n / c.draftSteps,
        12,
      );
    });
    // vLLM's mean acceptance length (per draft step) from the same counters is the engine's tauPerDraft
    expect(all.get('specd_spec_decode_acceptance_length_per_draft')).toBeCloseTo(
      1 + c.acceptedTokens / c.draftSteps,
      12,
    );
    expect(all.get('specd_spec_decode_acceptance_length_per_draft')).toBeCloseTo(reference.tauPerDraft, 12);

    // the stats lines: once their spec-decode numbers cover every verify step, they add up to the counters
    await waitFor(() => statsLines().reduce((a, l) => a + (l.spec?.verifySteps ?? 0), 0) === c.verifySteps);
    const lines = statsLines();
    const sum = (f: (s: NonNullable<StatsLine['spec']>) => number): number =>
      lines.reduce((a, l) => a + (l.spec === undefined ? 0 : f(l.spec)), 0);
    expect(sum((s) => s.draftSteps)).toBe(c.draftSteps);
    expect(sum((s) => s.draftTokens)).toBe(c.draftTokens);
    expect(sum((s) => s.acceptedTokens)).toBe(c.acceptedTokens);
    // throughput × interval integrates to the tokens generated (idle intervals are logged at debug level, not here)
    const generated = lines.reduce((a, l) => a + (l.generationTokensPerS * l.intervalMs) / 1000, 0);
    expect(generated).toBeCloseTo(PROMPTS.length * NEW_TOKENS, 6);
    expect(server.loop.generatedTokens).toBe(PROMPTS.length * NEW_TOKENS);
    for (const l of lines) {
      expect(l.level).toBe(30); // info
      expect(l.msg).toMatch(
        new RegExp(
          String.raw`^Avg prompt throughput: [\d.]+ tokens/s, Avg generation throughput: [\d.]+ tokens/s, ` +
            String.raw`Running: [0-2] reqs, Waiting: \d+ reqs, KV cache usage: [\d.]+% \(\d+/\d+ pages\)`,
        ),
      );
      expect(l.kvCacheUsage).toBeGreaterThanOrEqual(0);
      expect(l.kvCacheUsage).toBeLessThanOrEqual(1);
      const s = l.spec;
      if (s === undefined) continue;
      expect(s.tauPerVerifyStep).toBeCloseTo((s.acceptedTokens + s.verifySteps) / s.verifySteps, 12);
      expect(s.acceptanceRate).toBeCloseTo(s.draftTokens === 0 ? 0 : s.acceptedTokens / s.draftTokens, 12);
      expect(l.msg).toContain(`τ per verify step: ${s.tauPerVerifyStep.toFixed(2)} (${s.verifySteps} steps)`);
      expect(l.msg).toContain(`(${s.acceptedTokens}/${s.draftTokens} tokens)`);
    }
    expect(lines.some((l) => l.spec !== undefined)).toBe(true);
  }, 120_000);

  it('`specd generate --json`: the /metrics counts of one request, per-position rates over num_drafts', async () => {
    const before = counters(await scrape());
    await complete(PROMPTS[0]!);
    const d = minus(counters(await scrape()), before);
    let out = '';
    const io: CliIo = { stdout: { write: (s: string) => (out += s) }, stderr: { write: () => true }, cwd: ROOT };
    const args = ['generate', '--prompt', PROMPTS[0]!, '--max-tokens', String(NEW_TOKENS), '--ignore-eos'];
    expect(await main([...args, '--json', '--drafter', DRAFTER, '--num-draft-tokens', String(K)], io)).toBe(0);
    const g = JSON.parse(out) as Record<string, number & number[]>;
    expect(g.num_drafts).toBe(d.draftSteps);
    expect(g.num_drafted).toBe(d.draftTokens);
    expect(g.num_accepted).toBe(d.acceptedTokens);
    expect(g.verify_steps).toBe(d.verifySteps);
    expect(g.num_drafted).toBe(g.drafted); // the older names stay
    expect(g.acceptance_rate).toBeCloseTo(d.acceptedTokens / d.draftTokens, 12);
    expect(g.acceptance_length_per_draft).toBeCloseTo(1 + d.acceptedTokens / d.draftSteps, 12);
    expect(g.acceptance_length).toBeCloseTo(1 + d.acceptedTokens / d.verifySteps, 12);
    // the same per-position counts under both denominators: num_drafts (as /metrics) and every verify step
    const n = g.per_position_acceptance_rate.length;
    expect(n).toBeGreaterThan(0);
    expect(g.per_position_acceptance_rate.map((r) => Math.round(r * d.draftSteps))).toEqual(
      d.acceptedPerPos.slice(0, n),
    );
    expect(d.acceptedPerPos.slice(n).every((c) => c === 0)).toBe(true); // (positions only earlier requests reached)
    g.per_position_acceptance_rate.forEach((r, i) => {
      expect(r).toBeCloseTo(d.acceptedPerPos[i]! / d.draftSteps, 12);
      expect(g.per_position_acceptance[i]).toBeCloseTo(d.acceptedPerPos[i]! / d.verifySteps, 12);
    });
    // greedy: no seed reported
    expect(g.seed).toBeUndefined();
  }, 120_000);
});

describe('the two denominators', () => {
  it('plain steps between draft steps: τ over verify steps; τ per draft, per-position rates per draft', async () => {
    // 3 drafts on even verify steps, a plain decode step (k = 0) on odd ones: verify steps ≈ 2 × draft steps
    const policy: DraftPolicy = {
      choose: (cs) => cs.map((c) => (c.metrics.verifySteps % 2 === 0 ? Math.min(3, c.maxDrafts) : 0)),
      observe: () => undefined,
      release: () => undefined,
    };
    const engine = new SpecEngine(target.model, drafter.drafter, {
      maxSequences: 1,
      maxTokensPerSequence: 1024,
      draftPolicy: policy,
    });
    let results: ReturnType<SpecEngine['run']>;
    try {
      results = engine.run(
        PROMPTS.map((p, id) => ({
          id: 100 + id, // (the server's loop numbers its requests from 1)
          promptIds: target.tokenizer.encode(p, { addSpecialTokens: false }),
          maxTokens: NEW_TOKENS,
          sampling: { temperature: 0 },
          seed: 0,
          ignoreEos: true,
          eosTokenIds: target.eosTokenIds,
        })),
      );
    } finally {
      engine.dispose();
    }
    const metrics = idleMetrics();
    for (const r of results)
      metrics.recordRequest('completions', 'length', {
        promptTokens: 4,
        outputTokens: r.tokenIds.length,
        e2e: 1,
        spec: r.metrics,
      });
    const run = engine.metrics;
    expect(run.verifySteps).toBeGreaterThan(run.draftSteps + PROMPTS.length); // the plain steps
    expect(run.accepted).toBeGreaterThan(0);
    const text = await metrics.registry.metrics();
    const value = (name: string): number => {
      const line = text.split('\n').find((l) => l.startsWith(`${name} `));
      expect(line, name).toBeDefined();
      return Number(line!.slice(name.length + 1));
    };
    const steps = value('specd_spec_decode_num_verify_steps_total');
    const drafts = value('specd_spec_decode_num_drafts_total');
    const accepted = value('specd_spec_decode_num_accepted_tokens_total');
    expect(steps).toBe(run.verifySteps);
    expect(drafts).toBe(run.draftSteps);
    expect(accepted).toBe(run.accepted);
    expect(value('specd_spec_decode_acceptance_length_per_verify_step')).toBeCloseTo((accepted + steps) / steps, 12);
    expect(value('specd_spec_decode_acceptance_length_per_verify_step')).toBeCloseTo(run.tauPerStep, 12);
    // vLLM's mean acceptance length (per draft step) is a different, larger number here
    expect(run.tauPerDraft).toBeCloseTo(1 + accepted / drafts, 12);
    expect(value('specd_spec_decode_acceptance_length_per_draft')).toBeCloseTo(run.tauPerDraft, 12);
    expect(run.tauPerDraft).toBeGreaterThan(run.tauPerStep);
    expect(metrics.specTotals.acceptedPerPos[0]).toBeGreaterThan(0);
    metrics.specTotals.acceptedPerPos.forEach((n, i) => {
      expect(value(`specd_spec_decode_per_position_acceptance_rate{position="${i}"}`)).toBeCloseTo(n / drafts, 12);
    });
    // per request: generate --json's per_position_acceptance_rate (over num_drafts) vs per_position_acceptance
    for (const r of results) {
      const m = r.metrics;
      if (m.draftSteps === 0) continue;
      m.perDraftAcceptance.forEach((rate, i) => {
        expect(rate * m.draftSteps).toBeCloseTo(m.acceptedAt[i] ?? 0, 9);
        expect(m.perPositionAcceptance[i]! * m.verifySteps).toBeCloseTo(m.acceptedAt[i] ?? 0, 9);
      });
      expect(m.perDraftAcceptance[0]).toBeGreaterThan(m.perPositionAcceptance[0]!);
    }
  }, 120_000);
});

describe('StatsLogger', () => {
  it('rates over the interval from the source, τ per verify step and per draft step, idle intervals inactive', () => {
    let clock = 1000;
    let prompt = 7;
    let generation = 3;
    let spec: SpecDecodeTotals = {
      draftSteps: 1,
      verifySteps: 2,
      draftTokens: 4,
      acceptedTokens: 1,
      acceptedPerPos: [1],
    };
    let running = 0;
    let waiting = 1;
    const source = {
      promptTokens: () => prompt,
      generationTokens: () => generation,
      running: () => running,
      waiting: () => waiting,
      kvPages: () => ({ used: 20, total: 80 }),
      spec: () => spec,
    };
    const stats = new StatsLogger(
      source,
      () => undefined,
      10_000,
      () => clock,
    );
    // 2 s later: 100 prompt and 40 generated tokens, 10 draft steps and 2 plain steps, 18 of 40 drafts accepted
    clock += 2000;
    prompt += 100;
    generation += 40;
    running = 1;
    waiting = 0;
    spec = {
      draftSteps: 11,
      verifySteps: 14,
      draftTokens: 44,
      acceptedTokens: 19,
      acceptedPerPos: [10, 6, 3],
    };
    const a = stats.sample();
    expect(a.intervalMs).toBe(2000);
    expect(a.promptTokensPerS).toBe(100 / 2);
    expect(a.generationTokensPerS).toBe(40 / 2);
    expect(a.kvCacheUsage).toBe(20 / 80);
    expect(a.spec?.tauPerVerifyStep).toBe((18 + 12) / 12);
    expect(a.spec?.meanAcceptanceLength).toBe(1 + 18 / 10);
    expect(a.spec?.acceptanceRate).toBe(18 / 40);
    expect(a.spec?.perPositionAcceptanceRate).toEqual([9 / 10, 6 / 10, 3 / 10]);
    expect(a.active).toBe(true);
    expect(a.text).toBe(
      'Avg prompt throughput: 50.0 tokens/s, Avg generation throughput: 20.0 tokens/s, Running: 1 reqs, ' +
        'Waiting: 0 reqs, KV cache usage: 25.0% (20/80 pages), τ per verify step: 2.50 (12 steps), ' +
        'Mean acceptance length: 2.80, Draft acceptance rate: 45.0% (18/40 tokens), ' +
        'Per-position acceptance rate: 0.900, 0.600, 0.300',
    );
    // nothing new, nothing running, one waiting: active (a queue is news); then nothing at all: inactive
    clock += 500;
    running = 0;
    waiting = 1;
    const b = stats.sample();
    expect(b.intervalMs).toBe(500);
    expect(b.spec).toBeUndefined();
    expect(b.generationTokensPerS).toBe(0);
    expect(b.active).toBe(true);
    expect(b.text).not.toContain('τ');
    clock += 500;
    waiting = 0;
    expect(stats.sample().active).toBe(false);
    expect(() => new StatsLogger(source, () => undefined, 0)).toThrow(/intervalMs: expected an integer >= 1, got 0/);
  });

  it('specd_requests_total counts by the API finish reason (the engine\'s "eos" is "stop")', async () => {
    const metrics = idleMetrics();
    for (const reason of ['eos', 'stop', 'eos', 'length', 'abort'])
      metrics.recordRequest('chat', reason, { promptTokens: 1, outputTokens: 1, e2e: 1 });
    const text = await metrics.registry.metrics();
    const count = (reason: string) =>
      Number(
        text
          .split('\n')
          .find((l) => l.startsWith(`specd_requests_total{endpoint="chat",finish_reason="${reason}"} `))
          ?.split(' ')[1],
      );
    expect([count('stop'), count('length'), count('abort')]).toEqual([3, 1, 1]);
    expect(text).not.toContain('finish_reason="eos"');
  });
});
