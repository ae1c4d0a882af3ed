// Prefill/decode faults, with P, D and the router as real processes (the shipped Kimi target + DFlash): a prompt
// too long for P (its 400 context_length_exceeded reaches the client, D's reservation is freed), max_tokens 1 (D
// answers the first token without a decode step), P killed mid-transfer at a deterministic fault point (the
// transfer engine's test hook pauses after 1 descriptor), D killed mid-stream, an abort storm from clients, the
// bootstrap timeouts of both roles (tested by their error, with a hang guard at 10× the timeout), and a digest
// mismatch refused naming the field. Afterwards every page, state slot and transfer is free on every process that
// is still up, and they answer.
// Then what an attack found (each fixed): a malformed control message that once stopped P's control plane, a
// fake P whose `finished` carries ids outside the vocabulary (once crashed D), an abort of a request queued for a
// free sequence on D, a P restarted on the same bootstrap port (D hellos again), a D whose request differs from
// P's (refused), and one API key across router, P and D.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

import OpenAI from 'openai';
import * as zmq from 'zeromq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  allFree,
  clientOf,
  expectPrefillKilledMidTransfer,
  metric,
  metricsOf,
  ROOT,
  type SpecdProcess,
  startRouter,
  startSpecd,
  stopAll,
  until,
} from './pd-cluster.js';
import { skipWithoutFiles } from './require-files.js';

const MODEL = path.join(ROOT, 'models/kimi-k3-tiny');
const DRAFTER = path.join(ROOT, 'models/kimi-k3-tiny-dflash');
const HAVE = !skipWithoutFiles('PD faults', [path.join(MODEL, 'config.json'), path.join(DRAFTER, 'config.json')]);
const BOOTSTRAP_MS = 400;

let tmp: string;
const procs: SpecdProcess[] = [];

function config(name: string, extra: { scheduler?: object; drafter?: object; pd?: object } = {}): string {
  const file = path.join(tmp, `${name}.json`);
  fs.writeFileSync(
    file,
    JSON.stringify({
      model: MODEL,
      drafter: { method: 'dflash', path: DRAFTER, num_draft_tokens: 15, ...extra.drafter },
      scheduler: { max_sequence_tokens: 1024, ...extra.scheduler },
      pd: { bootstrap_timeout_ms: 20_000, transfer_timeout_ms: 20_000, ...extra.pd },
    }),
  );
  return file;
}

async function serve(
  cfg: string,
  role: 'prefill' | 'decode',
  env: Record<string, string> = {},
  extra: readonly string[] = [],
): Promise<SpecdProcess> {
  const p = await startSpecd(
    ['serve', '--config', cfg, '--role', role, '--port', '0', '--log-level', 'warn', ...extra],
    120_000,
    env,
  );
  procs.push(p);
  return p;
}

async function router(p: SpecdProcess, d: SpecdProcess, cfg: string): Promise<SpecdProcess> {
  const r = await startRouter(p, d, cfg, ['--health-interval-ms', '200']);
  procs.push(r);
  return r;
}

const PROMPT = 'The history of the ';
const LONG = 'one two three four five six seven eight nine ten '.repeat(20);

describe.skipIf(!HAVE)('PD faults (processes)', () => {
  let P: SpecdProcess;
  let D: SpecdProcess;
  let R: SpecdProcess;
  let client: OpenAI;
  let model: string;
  beforeAll(async () => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-pd-faults-'));
    // P accepts shorter sequences than D: a long prompt fails on P only
    P = await serve(config('p', { scheduler: { max_sequence_tokens: 128 } }), 'prefill');
    D = await serve(config('d'), 'decode');
    R = await router(P, D, config('d'));
    client = new OpenAI({ baseURL: `${R.url}/v1`, apiKey: 'none', maxRetries: 0 });
    model = (await (await fetch(`${D.url}/v1/models`)).json()).data[0].id;
  }, 300_000);
  afterAll(async () => {
    await stopAll(procs);
    if (tmp !== undefined) fs.rmSync(tmp, { recursive: true, force: true });
  });

  it("a prompt too long for P: P's 400 reaches the client and D's reservation is freed", async () => {
    const err = await client.completions.create({ model, prompt: LONG, max_tokens: 8 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(400);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('context_length_exceeded');
    expect(String((err as Error).message)).toMatch(/maximum context length is 128 tokens/);
    await until('P and D free', async () => (await allFree(P.url)) && (await allFree(D.url)));
  });

  it('max_tokens 1: the first token from P, no decode step on D, nothing left reserved', async () => {
    const before = metric(await metricsOf(D.url), 'specd_spec_decode_num_drafts_total');
    const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 1, temperature: 0 });
    expect(r.usage?.completion_tokens).toBe(1);
    expect(r.choices[0]?.finish_reason).toBe('length');
    const m = await metricsOf(D.url);
    expect(metric(m, 'specd_spec_decode_num_drafts_total')).toBe(before);
    expect(metric(m, 'specd_prompt_tokens_prefilled')).toBe(0);
    await until('D free', () => allFree(D.url));
  });

  it('an abort storm across the router frees every page and slot on P and D; both still answer', async () => {
    const aborts = Array.from({ length: 12 }, async (_, i) => {
      const ac = new AbortController();
      const stream = await client.completions
        .create({ model, prompt: `${PROMPT}${i}`, max_tokens: 100, stream: true }, { signal: ac.signal })
        .catch(() => undefined);
      if (i % 3 === 0) ac.abort(); // before the first chunk
      let n = 0;
      try {
        for await (const _ of stream ?? []) if (++n >= 1 + (i % 4)) ac.abort();
      } catch {
        // aborted
      }
    });
    await Promise.all(aborts);
    await until('P and D free after the storm', async () => (await allFree(P.url)) && (await allFree(D.url)));
    const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 4, temperature: 0 });
    expect(r.usage?.completion_tokens).toBe(4);
  });

  it(
    'D: a bootstrap address nobody answers fails with a timeout naming it; nothing stays reserved',
    async () => {
      const d2 = await serve(config('d-short', { pd: { bootstrap_timeout_ms: BOOTSTRAP_MS } }), 'decode');
      const body = {
        request_id: 'r-timeout',
        room: 'room-timeout',
        kind: 'completion',
        prompt_ids: [1, 2, 3],
        bootstrap: 'tcp://127.0.0.1:9',
        body: { model, prompt: 'x', max_tokens: 4 },
      };
      const t = await fetch(`${d2.url}/pd/decode`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      expect(t.status).toBe(504);
      expect(JSON.stringify(await t.json())).toMatch(/hello to the prefill instance tcp:\/\/127\.0\.0\.1:9/);
      expect(await allFree(d2.url)).toBe(true);
    },
    10 * BOOTSTRAP_MS + 5000,
  );

  it(
    "P: no decode instance's layout within the bootstrap timeout fails naming the wait; P frees everything",
    async () => {
      const p2 = await serve(config('p-short', { pd: { bootstrap_timeout_ms: BOOTSTRAP_MS } }), 'prefill');
      const t = await fetch(`${p2.url}/pd/prefill`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          request_id: 'r-p-timeout',
          room: 'room-p-timeout',
          kind: 'completion',
          prompt_ids: [1, 2, 3],
          body: { model, prompt: 'x', max_tokens: 4 },
        }),
      });
      expect(t.status).toBe(504);
      expect(JSON.stringify(await t.json())).toMatch(/waiting for the layout: no answer within 400 ms/);
      await until('P free', () => allFree(p2.url));
    },
    10 * BOOTSTRAP_MS + 5000,
  );

  it('a digest mismatch (another draft length on P) is refused at connection time naming the field', async () => {
    const p3 = await serve(config('p-other', { drafter: { num_draft_tokens: 3 } }), 'prefill');
    const r3 = await router(p3, D, config('d'));
    const c3 = new OpenAI({ baseURL: `${r3.url}/v1`, apiKey: 'none', maxRetries: 0 });
    const err = await c3.completions.create({ model, prompt: PROMPT, max_tokens: 4 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(String((err as Error).message)).toMatch(/drafter\.settings \(prefill [^,]+, decode [^)]+\)/);
    await until('P and D free', async () => (await allFree(p3.url)) && (await allFree(D.url)));
  });

  it('P killed mid-transfer (paused after 1 descriptor): the client gets an error, D frees everything', async () => {
    const p4 = await serve(config('p-pause'), 'prefill', { SPECD_PD_TEST_PAUSE_AFTER_DESCRIPTORS: '1' });
    const r4 = await router(p4, D, config('d'));
    await expectPrefillKilledMidTransfer(clientOf(r4.url, 0), model, PROMPT, p4, D);
  });

  it('D killed mid-stream: the client sees the stream end in error, P is free and still answers', async () => {
    const d5 = await serve(config('d5'), 'decode');
    const r5 = await router(P, d5, config('d'));
    const c5 = new OpenAI({ baseURL: `${r5.url}/v1`, apiKey: 'none', maxRetries: 0 });
    let chunks = 0;
    const outcome = await (async () => {
      try {
        for await (const _ of await c5.completions.create({ model, prompt: PROMPT, max_tokens: 100, stream: true })) {
          if (++chunks === 2) d5.kill('SIGKILL');
        }
        return 'ended';
      } catch {
        return 'error';
      }
    })();
    expect(chunks).toBeGreaterThanOrEqual(2);
    expect(chunks).toBeLessThan(100);
    expect(outcome).toBe('error');
    await until('P free', () => allFree(P.url));
    expect((await fetch(`${P.url}/health`)).status).toBe(200);
  });

  it('a malformed control message is dropped: P keeps serving', async () => {
    const info = (await (await fetch(`${P.url}/pd/info`)).json()) as { bootstrap: string };
    const sock = new zmq.Dealer({ linger: 0 });
    sock.connect(info.bootstrap);
    for (const frame of [
      '{"type":"abort","room":"k1","reason":{"toString":1}}',
      'not json',
      '{"type":"layout","room":"x"}',
      '{"type":"hello"}',
    ])
      await sock.send(frame);
    sock.close();
    const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 4, temperature: 0 });
    expect(r.usage?.completion_tokens).toBe(4);
  });

  it("a fake P's 'finished' with ids outside the vocabulary fails that request only (502); D stays up", async () => {
    const fake = new zmq.Router({ linger: 0 });
    await fake.bind('tcp://127.0.0.1:0');
    void (async () => {
      for await (const [id, f] of fake) {
        const m = JSON.parse(String(f)) as { type: string; room: string };
        if (m.type === 'hello') await fake.send([id as Buffer, JSON.stringify({ type: 'hello-ok' })]);
        if (m.type === 'layout')
          await fake.send([
            id as Buffer,
            JSON.stringify({ type: 'finished', room: m.room, finishReason: 'eos', tokenIds: [99_999_999] }),
          ]);
      }
    })().catch(() => undefined);
    try {
      const res = await fetch(`${D.url}/pd/decode`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          request_id: 'fake',
          room: 'fake-room',
          kind: 'completion',
          prompt_ids: [1, 2],
          bootstrap: fake.lastEndpoint,
          body: { model, prompt: 'x', max_tokens: 4 },
        }),
      });
      expect(res.status).toBe(502);
      expect(JSON.stringify(await res.json())).toMatch(/99999999 is not a token id/);
    } finally {
      fake.close();
    }
    expect((await fetch(`${D.url}/health`)).status).toBe(200);
    await until('D free', () => allFree(D.url));
  });

  it('an abort of a request queued on D for a free sequence ends it at once, with nothing reserved', async () => {
    const d6 = await serve(config('d6', { scheduler: { max_running_requests: 1 } }), 'decode');
    const r6 = await router(P, d6, config('d'));
    const c6 = new OpenAI({ baseURL: `${r6.url}/v1`, apiKey: 'none', maxRetries: 0 });
    const ac = new AbortController();
    const busy = (async () => {
      try {
        for await (const _ of await c6.completions.create(
          { model, prompt: PROMPT, max_tokens: 100, stream: true, ignore_eos: true } as never,
          { signal: ac.signal },
        ));
      } catch {
        // aborted below
      }
    })();
    await until('D busy', async () => metric(await metricsOf(d6.url), 'specd_num_requests_running') === 1);
    const info = (await (await fetch(`${P.url}/pd/info`)).json()) as { bootstrap: string };
    const queued = fetch(`${d6.url}/pd/decode`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        request_id: 'queued',
        room: 'queued-room',
        kind: 'completion',
        prompt_ids: [1, 2, 3],
        bootstrap: info.bootstrap,
        body: { model, prompt: 'x', max_tokens: 4 },
      }),
    });
    await until('the request queued', async () => metric(await metricsOf(d6.url), 'specd_num_requests_waiting') >= 1);
    await fetch(`${d6.url}/pd/abort`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ room: 'queued-room', reason: 'test' }),
    });
    const res = await queued;
    expect(res.status).toBe(502);
    expect(JSON.stringify(await res.json())).toMatch(/room queued-room: aborted \(test\)/);
    ac.abort();
    await busy;
    await until('D free', () => allFree(d6.url));
  });

  it('P restarted on the same bootstrap port: D hellos again and the next request succeeds', async () => {
    const cfg = config('p-fixed');
    const port = String(20000 + (process.pid % 20000));
    const args = ['serve', '--config', cfg, '--role', 'prefill', '--port', '0', '--bootstrap-port', port];
    let p7 = await startSpecd([...args, '--log-level', 'warn']);
    procs.push(p7);
    const r7 = await router(p7, D, config('d'));
    const c7 = new OpenAI({ baseURL: `${r7.url}/v1`, apiKey: 'none', maxRetries: 0 });
    expect((await c7.completions.create({ model, prompt: PROMPT, max_tokens: 3 })).usage?.completion_tokens).toBe(3);
    p7.kill('SIGKILL');
    await p7.exited;
    // the router knows P by its HTTP URL: a new router for the restarted P (same bootstrap port, D unchanged)
    p7 = await startSpecd([...args, '--log-level', 'warn']);
    procs.push(p7);
    const r8 = await router(p7, D, config('d'));
    const c8 = new OpenAI({ baseURL: `${r8.url}/v1`, apiKey: 'none', maxRetries: 0 });
    expect((await c8.completions.create({ model, prompt: PROMPT, max_tokens: 3 })).usage?.completion_tokens).toBe(3);
  });

  it('P refuses to hand its state to a D holding another request (other prompt ids, same length)', async () => {
    const info = (await (await fetch(`${P.url}/pd/info`)).json()) as { bootstrap: string };
    const post = (url: string, ids: number[]) =>
      fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          request_id: 'mismatch',
          room: 'mismatch-room',
          kind: 'completion',
          prompt_ids: ids,
          bootstrap: info.bootstrap,
          body: { model, prompt: 'x', max_tokens: 4 },
        }),
      });
    const [p, d] = await Promise.all([
      post(`${P.url}/pd/prefill`, [5, 6, 7, 8]),
      post(`${D.url}/pd/decode`, [1, 2, 3, 4]),
    ]);
    expect(p.status).toBe(502);
    expect(JSON.stringify(await p.json())).toMatch(/the decode instance holds another request/);
    expect(d.status).toBe(502);
    await until('P and D free', async () => (await allFree(P.url)) && (await allFree(D.url)));
  });

  it('one API key across router, P and D: with it the request succeeds, without it 401', async () => {
    const cfg = config('keyed');
    const key = ['--api-key', 'sekret'];
    const pk = await serve(cfg, 'prefill', {}, key);
    const dk = await serve(cfg, 'decode', {}, key);
    const rk = await startRouter(pk, dk, cfg, key);
    procs.push(rk);
    const ok = new OpenAI({ baseURL: `${rk.url}/v1`, apiKey: 'sekret', maxRetries: 0 });
    expect((await ok.completions.create({ model, prompt: PROMPT, max_tokens: 3 })).usage?.completion_tokens).toBe(3);
    const bad = new OpenAI({ baseURL: `${rk.url}/v1`, apiKey: 'wrong', maxRetries: 0 });
    const err = await bad.completions.create({ model, prompt: PROMPT, max_tokens: 3 }).catch((e: unknown) => e);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(401);
  });
});
