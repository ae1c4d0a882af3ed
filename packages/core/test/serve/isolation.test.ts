// One request never fails another, end to end over HTTP: kimi-k3-tiny with the embedding row of one token id T
// set to NaN (a copy in a temp folder, loaded with `checkpoint_sanity: "warn"`), served with DFlash at a fixed
// draft length. Long greedy and seeded sampled requests run concurrently while bad requests are injected: prompts
// holding T (greedy, sampled, streamed, T in a later prefill chunk), a prompt whose greedy continuation generates T,
// `temperature: 1e-45` (greedy now), and out-of-range sampling fields (400). Only the requests that contain T fail
// (500 `sequence_failed`, or an error event on a stream); every other request returns the text it returns alone;
// afterwards every target page, state slot and draft page is free, and the freed ones serve requests as before.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { CliIo } from '../../src/cli/index.js';
import { startServe, type StartedServer } from '../../src/cli/serve.js';
import { generateTokens } from '../../src/cli/generate.js';
import { loadTarget } from '../../src/runtime/index.js';
import { makeTempDir } from '../io/helpers.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const SOURCE = path.join(ROOT, 'models/kimi-k3-tiny');
const MODEL = 'kimi-k3-tiny';
const NEW_TOKENS = 96;
const tmp = makeTempDir('isolation');
const io: CliIo = { stdout: { write: () => true }, stderr: { write: () => true }, cwd: ROOT };

const prompts = fs
  .readFileSync(path.join(ROOT, 'test/prompts/prose.jsonl'), 'utf8')
  .trim()
  .split('\n')
  .map((l) => (JSON.parse(l) as { prompt_token_ids: number[] }).prompt_token_ids);

/** Copies the checkpoint to `dir` and sets row `token` of `model.embed_tokens.weight` (bf16) to NaN. */
function poisonedCopy(dir: string, token: number): void {
  fs.mkdirSync(dir, { recursive: true });
  for (const f of fs.readdirSync(SOURCE)) fs.copyFileSync(path.join(SOURCE, f), path.join(dir, f));
  const index = JSON.parse(fs.readFileSync(path.join(dir, 'model.safetensors.index.json'), 'utf8')) as {
    weight_map: Record<string, string>;
  };
  const name = 'model.embed_tokens.weight';
  const file = path.join(dir, index.weight_map[name] ?? '');
  const bytes = fs.readFileSync(file);
  const headerBytes = Number(bytes.readBigUInt64LE(0));
  const header = JSON.parse(bytes.subarray(8, 8 + headerBytes).toString('utf8')) as Record<
    string,
    { dtype: string; shape: number[]; data_offsets: [number, number] }
  >;
  const entry = header[name];
  if (entry === undefined || entry.dtype !== 'BF16' || entry.shape.length !== 2)
    throw new Error(`${name}: expected a [vocab, hidden] BF16 tensor, got ${JSON.stringify(entry)}`);
  const hidden = entry.shape[1] ?? 0;
  const start = 8 + headerBytes + entry.data_offsets[0] + token * hidden * 2;
  for (let i = 0; i < hidden; i++) bytes.writeUInt16LE(0x7fc0, start + 2 * i); // bf16 quiet NaN
  fs.writeFileSync(file, bytes);
}

interface Answer {
  status: number;
  body: {
    choices?: { text: string; finish_reason: string }[];
    usage?: { completion_tokens: number };
    error?: { message: string; param: string | null; code: string | null };
  };
}

let s: StartedServer;
/** The NaN token, and a prompt whose greedy continuation generates it (at output position 8 or later). */
let poison: number;
let generatesPoison: number[];

async function post(body: string): Promise<Answer> {
  const r = await fetch(`${s.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body,
  });
  return { status: r.status, body: (await r.json()) as Answer['body'] };
}
const complete = (fields: Record<string, unknown>) =>
  post(JSON.stringify({ model: MODEL, max_tokens: NEW_TOKENS, ignore_eos: true, temperature: 0, ...fields }));

beforeAll(async () => {
  // T: a token the clean model generates (9th token or later) after one of the other prose prompts, in no prompt
  // used here, not in the greedy innocents' outputs and not generated before in that continuation
  const clean = await loadTarget(SOURCE, ['@specd/model-kimi-k3']);
  try {
    const greedy = (ids: readonly number[], maxTokens: number) =>
      generateTokens(clean, {
        promptIds: Int32Array.from(ids),
        maxTokens,
        sampling: { temperature: 0 },
        seed: 0,
        ignoreEos: true,
      }).tokenIds;
    // the other requests' prompts, and the greedy innocents' outputs, must not hold T
    const others = new Set([
      ...prompts.slice(0, 10).flat(),
      ...[0, 1, 2, 3].flatMap((i) => greedy(prompts[i] ?? [], 96)),
    ]);
    for (const ids of prompts.slice(10)) {
      const out = greedy(ids, 40);
      const at = out.findIndex((t, j) => j >= 8 && !ids.includes(t) && !out.slice(0, j).includes(t) && !others.has(t));
      if (at < 0) continue;
      poison = out[at] ?? -1;
      generatesPoison = ids;
      break;
    }
    expect(generatesPoison, 'a prompt whose continuation generates a token no other request holds').toBeDefined();
  } finally {
    clean.model.dispose();
  }
  const modelDir = path.join(tmp, 'kimi-k3-tiny-nan-row');
  poisonedCopy(modelDir, poison);
  const cfg = path.join(tmp, 'serve.json');
  fs.writeFileSync(
    cfg,
    JSON.stringify({
      model: modelDir,
      checkpoint_sanity: 'warn', // the NaN row is the point of the test: load it (default: refused at load)
      // a fixed draft length: every step drafts, and seeded sampled outputs are reproducible
      drafter: { method: 'dflash', path: path.join(ROOT, 'models/kimi-k3-tiny-dflash'), num_draft_tokens: 7 },
      scheduler: { max_running_requests: 16, max_sequence_tokens: 1024 }, // every request below runs at once
      server: { port: 8000, model_name: MODEL },
    }),
  );
  s = await startServe({ config: cfg, port: 0, logLevel: 'silent' }, io);
}, 120_000);
afterAll(async () => {
  await s?.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('one request never fails another (a checkpoint with a NaN embedding row)', () => {
  it('bad requests fail alone; the others return what they return alone; everything is freed', async () => {
    const innocents: Record<string, unknown>[] = [
      ...[0, 1, 2, 3].map((i) => ({ prompt: prompts[i] })),
      { prompt: prompts[4], temperature: 0.8, top_p: 0.95, seed: 5 },
      { prompt: prompts[5], temperature: 1, top_k: 40, seed: 6 },
    ];
    for (const p of innocents) expect(p.prompt as number[]).not.toContain(poison);
    const alone: string[] = [];
    for (const p of innocents) {
      const a = await complete(p);
      expect(a.status, JSON.stringify(a.body)).toBe(200);
      expect(a.body.usage?.completion_tokens).toBe(NEW_TOKENS);
      alone.push(a.body.choices?.[0]?.text ?? '');
    }

    const withPoison = [...(prompts[6] ?? []).slice(0, 20), poison, ...(prompts[6] ?? []).slice(20, 30)];
    const lateChunk = [...(prompts[7] ?? []), ...(prompts[8] ?? []), ...(prompts[9] ?? [])].slice(0, 100);
    lateChunk[90] = poison; // chunks [0, 64) fine, the second chunk holds T
    const streamed = fetch(`${s.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: withPoison, max_tokens: 16, temperature: 0.7, stream: true }),
    }).then(async (r) => ({ status: r.status, text: await r.text() }));
    // the order answers arrive in: the prefill failures come while the long innocent requests still run
    const order: string[] = [];
    const tag = <T>(label: string, p: Promise<T>): Promise<T> =>
      p.then((x) => {
        order.push(label);
        return x;
      });
    const [batch, bad] = await Promise.all([
      Promise.all(innocents.map((p, i) => tag(`innocent ${i}`, complete(p)))),
      Promise.all([
        tag('prefill', complete({ prompt: withPoison })),
        tag('prefill', complete({ prompt: withPoison, temperature: 0.9, seed: 3 })),
        tag('prefill', complete({ prompt: lateChunk })),
        complete({ prompt: generatesPoison, max_tokens: 40 }),
        complete({ prompt: prompts[0], temperature: 1e-45, top_k: 2 }), // greedy: the first innocent's text
        post(`{"model": "${MODEL}", "prompt": "x", "temperature": 1e999}`), // Infinity
        complete({ prompt: 'x', top_k: -2 }),
        complete({ prompt: 'x', repetition_penalty: 0 }),
      ]),
    ]);
    batch.forEach((a, i) => {
      expect(a.status, `innocent ${i}: ${JSON.stringify(a.body)}`).toBe(200);
      expect(a.body.choices?.[0]?.text, `innocent ${i}`).toBe(alone[i]);
    });
    const [greedyT, sampledT, lateT, generatedT, tiny, inf, topK, rep] = bad;
    for (const [a, phase] of [
      [greedyT, 'prefill'],
      [sampledT, 'prefill'],
      [lateT, 'prefill'],
      [generatedT, 'accept'],
    ] as const) {
      expect(a?.status, JSON.stringify(a?.body)).toBe(500);
      expect(a?.body.error?.code).toBe('sequence_failed');
      expect(a?.body.error?.message).toMatch(new RegExp(`^this request failed: request \\d+: ${phase}: .*NaN`));
    }
    expect(order.lastIndexOf('prefill')).toBeLessThan(order.findIndex((x) => x.startsWith('innocent')));
    expect(tiny?.status).toBe(200);
    expect(tiny?.body.choices?.[0]?.text).toBe(alone[0]);
    expect([inf?.status, inf?.body.error?.param]).toEqual([400, 'temperature']);
    expect([topK?.status, topK?.body.error?.param]).toEqual([400, 'top_k']);
    expect([rep?.status, rep?.body.error?.param]).toEqual([400, 'repetition_penalty']);
    const stream = await streamed;
    expect(stream.status).toBe(200);
    expect(stream.text).toMatch(/^data: \{"error":\{"message":"this request failed: request \d+: prefill: .*NaN/);
    expect(stream.text).toMatch(/"code":"sequence_failed"\}\}\n\ndata: \[DONE\]\n\n$/);

    for (let i = 0; i < 200 && s.server.loop.running + s.server.loop.waiting > 0; i++)
      await new Promise((r) => setTimeout(r, 10));
    const engine = s.server.engine;
    expect([engine.cache.pagesInUse, engine.cache.slotsInUse, engine.cache.numSequences]).toEqual([0, 0, 0]);
    expect(engine.drafter?.pagesInUse).toBe(0);
    // the pages and slots the failed requests held (NaN state included) serve new requests as before
    const again = await Promise.all(innocents.slice(0, 2).map((p) => complete(p)));
    expect(again.map((a) => a.body.choices?.[0]?.text)).toEqual(alone.slice(0, 2));
  }, 300_000);
});
