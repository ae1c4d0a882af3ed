// `specd serve`'s defaults and vLLM's flag names: with no arguments it serves SmolLM2-135M-Instruct with EAGLE-3
// (configs/default.json) and answers a chat turn coherently; sampling defaults come from the model's
// generation_config.json unless the config sets them; --num-draft-tokens, --served-model-name, --max-model-len and
// --max-num-seqs override the config; a busy port is refused before anything loads; logs are text or JSON lines.
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';

import OpenAI from 'openai';
import { afterAll, describe, expect, it } from 'vitest';

import { main, startRouter, type CliIo } from '../../src/cli/index.js';
import { serveLogger, startServe } from '../../src/cli/serve.js';
import { makeTempDir } from '../io/helpers.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const TINY = path.join(ROOT, 'models/kimi-k3-tiny');
const SMOLLM2 = path.join(ROOT, 'models/smollm2-135m-instruct');
const tmp = makeTempDir('serve-defaults');
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

/** An io whose stderr is collected in `err.text`. */
function collecting(): { io: CliIo; err: { text: string } } {
  const err = { text: '' };
  return {
    io: { stdout: { write: () => true }, stderr: { write: (s: string) => (err.text += s) }, cwd: ROOT },
    err,
  };
}

/** kimi-k3-tiny's files linked into a folder whose generation_config.json recommends sampling. */
function tinyWithSampling(): string {
  const dir = path.join(tmp, 'tiny-sampled');
  fs.mkdirSync(dir);
  for (const f of fs.readdirSync(TINY))
    if (f !== 'generation_config.json') fs.symlinkSync(path.join(TINY, f), path.join(dir, f));
  fs.writeFileSync(
    path.join(dir, 'generation_config.json'),
    JSON.stringify({ eos_token_id: 0, do_sample: true, temperature: 0.2, top_p: 0.9, repetition_penalty: 1.1 }),
  );
  return dir;
}

describe('specd serve: sampling defaults and vLLM flag names', () => {
  it('generation_config.json gives the defaults, the config wins over it; vLLM names override the config', async () => {
    const model = tinyWithSampling();
    const { io } = collecting();
    const a = await startServe({ model, spec: false, port: 0, logLevel: 'silent' }, io);
    try {
      expect(a.server.options.sampling).toEqual({ temperature: 0.2, top_p: 0.9, top_k: 0, repetition_penalty: 1.1 });
      expect(a.server.options.modelName).toBe('tiny-sampled');
    } finally {
      await a.close();
    }
    const config = path.join(tmp, 'explicit.json');
    fs.writeFileSync(
      config,
      JSON.stringify({
        model,
        drafter: { method: 'dflash', path: path.join(ROOT, 'models/kimi-k3-tiny-dflash'), num_draft_tokens: 2 },
        sampling: { temperature: 0, max_tokens: 9 },
        scheduler: { max_sequence_tokens: 1024, max_running_requests: 8 },
        server: { model_name: 'from-config' },
      }),
    );
    const b = await startServe(
      {
        config,
        numDraftTokens: 3,
        servedModelName: 'tiny',
        maxModelLen: 512,
        maxNumSeqs: 2,
        port: 0,
        logLevel: 'silent',
      },
      io,
    );
    try {
      expect(b.server.options.sampling).toEqual({
        temperature: 0,
        top_p: 0.9,
        top_k: 0,
        repetition_penalty: 1.1,
        max_tokens: 9,
      });
      expect(b.server.options.numDraftTokens).toBe(3);
      expect(b.server.options.modelName).toBe('tiny');
      expect(b.server.options.scheduler.max_sequence_tokens).toBe(512);
      expect(b.server.options.scheduler.max_running_requests).toBe(2);
      const models = (await (await fetch(`${b.url}/v1/models`)).json()) as { data: { id: string }[] };
      expect(models.data.map((m) => m.id)).toEqual(['tiny']);
      // --max-model-len is the context limit requests are checked against
      const res = await fetch(`${b.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny', prompt: 'The history of the', max_tokens: 600 }),
      });
      expect(res.status).toBe(400);
      expect(JSON.stringify(await res.json())).toMatch(/512/);
    } finally {
      await b.close();
    }
  }, 120_000);

  it('flags: bad values are usage errors (exit 2); --num-draft-tokens without a drafter exits 1', async () => {
    for (const args of [
      ['--log-format', 'xml'],
      ['--max-model-len', '1'],
      ['--max-num-seqs', '0'],
      ['--num-draft-tokens', 'many'],
    ]) {
      const { io, err } = collecting();
      expect(await main(['serve', ...args], io)).toBe(2);
      expect(err.text).toContain(args[0]);
    }
    const { io, err } = collecting();
    const code = await main(['serve', '--model', TINY, '--no-spec', '--num-draft-tokens', '3', '--port', '0'], io);
    expect(code).toBe(1);
    expect(err.text).toMatch(/--num-draft-tokens needs a drafter/);
  });
});

describe('specd serve: a busy port is reported before loading', () => {
  it('refuses the port held by another socket, naming it, and loads nothing', async () => {
    const holder = net.createServer();
    await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve));
    const port = (holder.address() as net.AddressInfo).port;
    try {
      const { io, err } = collecting();
      await expect(startServe({ model: TINY, spec: false, port, logLevel: 'silent' }, io)).rejects.toThrow(
        `--port / server.port: 127.0.0.1:${port} is in use by another process; pick another with --port`,
      );
      expect(err.text).not.toMatch(/loading target/);
    } finally {
      await new Promise<void>((resolve) => holder.close(() => resolve()));
    }
  });
});

describe('specd serve: log format', () => {
  /** One message logged in `format`, as written. */
  function logged(format: 'text' | 'json'): string {
    let out = '';
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        out += chunk.toString();
        done();
      },
    });
    serveLogger('info', format, sink).info({ requestId: 'r1' }, 'request done');
    return out;
  }
  it('json: one JSON object per line; text: level, message and fields in plain words', () => {
    const json = JSON.parse(logged('json')) as Record<string, unknown>;
    expect(json).toMatchObject({ level: 30, msg: 'request done', requestId: 'r1' });
    const text = logged('text');
    expect(() => JSON.parse(text)).toThrow();
    expect(text).toMatch(/INFO.*request done/);
    expect(text).toMatch(/"requestId":"r1"/); // fields on the same line
    expect(text.includes(String.fromCharCode(27))).toBe(false); // no colour escapes off a TTY
  });
});

describe.skipIf(!fs.existsSync(path.join(SMOLLM2, 'SmolLM2-135M-Instruct.Q4_1.gguf')))(
  'specd serve with no arguments (npm run models:fetch)',
  () => {
    it('serves SmolLM2-135M-Instruct with EAGLE-3 and answers a chat turn coherently', async () => {
      const { io, err } = collecting();
      const s = await startServe({ port: 0, logLevel: 'silent' }, io);
      try {
        expect(err.text).toContain(`loading target ${SMOLLM2} (tp 1, pp 1)`);
        expect(s.drafter?.drafter.method).toBe('eagle3');
        expect(s.drafter?.dir).toBe(path.join(ROOT, 'models/smollm2-135m-instruct-eagle3'));
        expect(s.server.options.numDraftTokens).toBeUndefined(); // the cost policy
        // the model card's sampling, written by models:fetch
        expect(s.server.options.sampling).toEqual({ temperature: 0.2, top_p: 0.9, top_k: 0 });
        const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'none' });
        const r = await client.chat.completions.create({
          model: 'smollm2-135m-instruct',
          messages: [{ role: 'user', content: 'What is the capital of France?' }],
          max_tokens: 24,
          temperature: 0,
        });
        expect(r.choices[0]!.message.content).toMatch(/Paris/);
        expect(r.choices[0]!.finish_reason).toBe('stop');
      } finally {
        await s.close();
      }
    }, 180_000);

    it('specd router with neither --config nor --model: the same default model and sampling', async () => {
      const { io } = collecting();
      const r = await startRouter(
        {
          prefill: ['http://127.0.0.1:9'],
          decode: ['http://127.0.0.1:10'],
          port: 0,
          logLevel: 'silent',
          healthIntervalMs: 0,
        },
        io,
      );
      try {
        expect(r.router.options.sampling).toEqual({ temperature: 0.2, top_p: 0.9, top_k: 0 });
      } finally {
        await r.close();
      }
    });
  },
);
