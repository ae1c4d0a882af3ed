// `specd serve` start-up: defaults (shipped target + DFlash on 127.0.0.1), the cost policy calibrated
// before listening, flags over the config, refused reserved settings. (The HTTP API itself:
// test/serve/server.test.ts.)
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

import { main, type CliIo } from '../../src/cli/index.js';
import { startServe } from '../../src/cli/serve.js';
import { makeTempDir } from '../io/helpers.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const io: CliIo = { stdout: { write: () => true }, stderr: { write: () => true }, cwd: ROOT };
const tmp = makeTempDir('serve-cli');
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

describe('specd serve', () => {
  it(
    'the architecture demo: kimi-k3-tiny with DFlash on 127.0.0.1 (port overridden ' +
      'to ephemeral), the cost policy calibrated before the first request',
    async () => {
      const s = await startServe(
        { model: 'models/kimi-k3-tiny', drafter: 'models/kimi-k3-tiny-dflash', port: 0, logLevel: 'silent' },
        io,
      );
      try {
        expect(s.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
        expect(s.drafter?.drafter.method).toBe('dflash');
        expect(s.server.options.modelName).toBe('kimi-k3-tiny');
        // calibrated at start-up, before any request …
        expect(s.server.engine.stepCosts).toBeDefined();
        const calibrationMs = s.server.engine.metrics.calibrationMs;
        expect(calibrationMs).toBeGreaterThan(0);
        expect(await (await fetch(`${s.url}/health`)).json()).toEqual({ status: 'ok' });
        // … so the first request does not calibrate
        const res = await fetch(`${s.url}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'kimi-k3-tiny', prompt: 'Hello', max_tokens: 3, temperature: 0 }),
        });
        expect(res.status).toBe(200);
        expect(
          ((await res.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens,
        ).toBeGreaterThan(0);
        expect(s.server.engine.metrics.calibrationMs).toBe(calibrationMs);
      } finally {
        await s.close();
      }
    },
  );

  it('configs/kimi-k3-tiny-nospec.json serves without a drafter; --drafter overrides the config', async () => {
    const a = await startServe({ config: 'configs/kimi-k3-tiny-nospec.json', port: 0, logLevel: 'silent' }, io);
    await a.close();
    expect(a.drafter).toBeUndefined();
    expect(a.server.engine.metrics.calibrationMs).toBe(0); // nothing to calibrate without a drafter
    const b = await startServe(
      {
        config: 'configs/kimi-k3-tiny-nospec.json',
        drafter: 'models/kimi-k3-tiny-dflash',
        port: 0,
        logLevel: 'silent',
      },
      io,
    );
    await b.close();
    expect(b.drafter?.drafter.method).toBe('dflash');
  });

  it("--host overrides the config's server.host", async () => {
    // an address this machine does not have (TEST-NET-3): binding it fails, so only the flag can make the server start
    const file = path.join(tmp, 'host.json');
    fs.writeFileSync(
      file,
      JSON.stringify({
        model: path.join(ROOT, 'models/kimi-k3-tiny'),
        drafter: { method: 'none' },
        server: { host: '203.0.113.7', port: 8000 },
      }),
    );
    await expect(startServe({ config: file, port: 0, logLevel: 'silent' }, io)).rejects.toThrow(
      /EADDRNOTAVAIL.*203\.0\.113\.7/,
    );
    const s = await startServe({ config: file, host: '127.0.0.1', port: 0, logLevel: 'silent' }, io);
    try {
      expect(s.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      expect(await (await fetch(`${s.url}/health`)).json()).toEqual({ status: 'ok' });
    } finally {
      await s.close();
    }
  });

  it.each([
    [
      { parallelism: { pp: 2, partition: [4] } },
      /\$\.parallelism\.partition: pp: expected 2 entries \(one per pipeline stage\), got 1/,
    ],
    [
      { pd: { role: 'prefill' }, parallelism: { tp: 2, pp: 2 } },
      /role prefill \(--role \/ pd\.role\): a prefill instance uses --tp or --pp, not both, for now \(got tp 2, pp 2\)/,
    ],
    [
      { pd: { role: 'decode' }, parallelism: { pp: 2 } },
      /role decode .*pp = 1 for now \(got pp 2; --tp is allowed, and the prefill instance may use --pp\)/,
    ],
    [
      { pd: { role: 'prefill' }, parallelism: { pp: 2, transport: 'fifo' } },
      /role prefill with pp 2: parallelism\.transport must be "zmq" \(got "fifo"\)/,
    ],
    [{ server: { port: 99999 } }, /\$\.server\.port: maximum: must be <= 65535, got 99999/],
  ])('config %j → one error line, exit 1', async (cfg, re) => {
    const file = path.join(tmp, 'c.json');
    fs.writeFileSync(file, JSON.stringify(cfg));
    let err = '';
    const code = await main(['serve', '--config', file], { ...io, stderr: { write: (s: string) => (err += s) } });
    expect(code).toBe(1);
    expect(err).toMatch(re);
    expect(err.trim().split('\n')).toHaveLength(1);
  });

  it('usage errors exit 2', async () => {
    let err = '';
    expect(await main(['serve', '--port', 'eighty'], { ...io, stderr: { write: (s: string) => (err += s) } })).toBe(2);
    expect(err).toMatch(/--port.*expected a port/);
  });
});
