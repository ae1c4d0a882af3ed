// What `specd serve` says on stderr: one line per start-up stage with its time (load target, load drafter,
// calibrate, listen), the serving line with tp / pp and the drafter, and — in a real process sent SIGINT — the
// shutdown and stopped lines, exit code 0. `--disable-log-stats` reaches the server. (The stats line's content:
// test/serve/metrics-stats.test.ts.)
import { spawn } from 'node:child_process';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

import { main, type CliIo } from '../../src/cli/index.js';
import { servingLine, shutdownLine, startServe } from '../../src/cli/serve.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const TARGET = path.join(ROOT, 'models/kimi-k3-tiny');
const DRAFTER = path.join(ROOT, 'models/kimi-k3-tiny-dflash');
const esc = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

describe('specd serve on stderr', () => {
  it('staged start-up lines with times, in order; the serving line names tp, pp and the drafter', async () => {
    let err = '';
    const io: CliIo = { stdout: { write: () => true }, stderr: { write: (s: string) => (err += s) }, cwd: ROOT };
    // the architecture demo + DFlash, cost policy
    const s = await startServe({ model: TARGET, drafter: DRAFTER, port: 0, logLevel: 'silent' }, io);
    try {
      const lines = err.trimEnd().split('\n');
      const expected = [
        new RegExp(`^specd: loading target ${esc(TARGET)} \\(tp 1, pp 1\\)$`),
        /^specd: target loaded in \d+\.\d\d s \(plugin kimi-k3\)$/,
        new RegExp(`^specd: loading drafter ${esc(DRAFTER)}$`),
        /^specd: drafter dflash loaded in \d+\.\d\d s$/,
        /^specd: calibrating the draft policy \(measuring draft and verify step costs\)$/,
        /^specd: calibrated in \d+\.\d\d s$/,
        new RegExp(`^specd: listening on ${esc(s.url)}$`),
      ];
      expect(lines).toHaveLength(expected.length);
      lines.forEach((l, i) => {
        expect(l).toMatch(expected[i]!);
      });
      // the calibration line's time is the engine's own measure (rounded), not a guess
      const calibrated = Number(/calibrated in ([\d.]+) s/.exec(err)?.[1]);
      expect(calibrated * 1000).toBeGreaterThanOrEqual(s.server.engine.metrics.calibrationMs - 10);
      expect(servingLine(s)).toBe(
        `specd: serving kimi-k3-tiny (tp 1, pp 1) with drafter dflash (${DRAFTER}; ` +
          `up to ${s.drafter!.drafter.maxDraftTokens} drafts, cost policy) on ${s.url}`,
      );
      expect(shutdownLine(s, 'SIGTERM')).toBe(
        'specd: SIGTERM: shutting down (0 running and 0 waiting requests aborted)',
      );
    } finally {
      await s.close();
    }
  }, 120_000);

  it('a fixed draft length: no calibration stage; --disable-log-stats turns the stats line off', async () => {
    let err = '';
    const io: CliIo = { stdout: { write: () => true }, stderr: { write: (s: string) => (err += s) }, cwd: ROOT };
    const s = await startServe(
      { config: 'configs/kimi-k3-tiny-nospec.json', port: 0, logLevel: 'silent', disableLogStats: true },
      io,
    );
    try {
      expect(err).not.toMatch(/calibrat/);
      expect(err).not.toMatch(/drafter/);
      expect(s.server.options.statsIntervalMs).toBe(0);
      expect(servingLine(s)).toBe(`specd: serving kimi-k3-tiny (tp 1, pp 1) without a drafter on ${s.url}`);
    } finally {
      await s.close();
    }
    const t = await startServe(
      { config: 'configs/kimi-k3-tiny-nospec.json', port: 0, logLevel: 'silent', statsIntervalMs: 1234 },
      { ...io, stderr: { write: () => true } },
    );
    await t.close();
    expect(t.server.options.statsIntervalMs).toBe(1234);
    // the flag parses (a usage error would exit 2 before loading anything)
    let usage = '';
    const code = await main(['serve', '--disable-log-stats', '--port', 'x'], {
      ...io,
      stderr: { write: (s: string) => (usage += s) },
    });
    expect(code).toBe(2);
    expect(usage).toMatch(/--port/);
    expect(usage).not.toMatch(/disable-log-stats/);
  }, 120_000);

  it('a real process sent SIGINT prints the shutdown line and the stopped line, and exits 0', async () => {
    const child = spawn(
      process.execPath,
      [
        path.join(ROOT, 'packages/core/src/cli/bin.js'),
        'serve',
        '--model',
        TARGET,
        '--port',
        '0',
        '--no-spec',
        '--log-level',
        'silent',
      ],
      { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'] },
    );
    let err = '';
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    await new Promise<void>((resolve, reject) => {
      child.stderr.on('data', (d: Buffer) => {
        err += d.toString();
        if (/specd: serving /.test(err)) resolve();
      });
      child.on('exit', () => reject(new Error(`specd serve exited before serving:\n${err}`)));
    });
    child.kill('SIGINT');
    expect(await exited).toBe(0);
    const lines = err.trimEnd().split('\n');
    expect(lines.slice(-4)).toEqual([
      expect.stringMatching(/^specd: listening on http:\/\/127\.0\.0\.1:\d+$/),
      expect.stringMatching(
        /^specd: serving kimi-k3-tiny \(tp 1, pp 1\) without a drafter on http:\/\/127\.0\.0\.1:\d+$/,
      ),
      'specd: SIGINT: shutting down (0 running and 0 waiting requests aborted)',
      expect.stringMatching(/^specd: stopped in \d+\.\d\d s$/),
    ]);
  }, 120_000);
});
