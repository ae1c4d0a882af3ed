// ISA selection and thread pool: SPECD_ISA / SPECD_NUM_THREADS at load (child processes), setIsa.
import { execFileSync, spawnSync } from 'node:child_process';
import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { isa, parallelCopy, setIsa } from '@specd/native';
import { isaPaths } from './reference.js';

const probe = "import('@specd/native').then((m) => console.log(JSON.stringify(m.isa())))";

function loadWith(env: Record<string, string>): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, ['-e', probe], { env: { ...process.env, ...env }, encoding: 'utf8' });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe('runtime', () => {
  it('reports the chosen path and thread count', () => {
    const info = isa();
    expect(['avx512', 'portable']).toContain(info.isa);
    expect(info.threads).toBeGreaterThanOrEqual(1);
    expect(isaPaths()).toContain('portable');
  });

  it('SPECD_ISA=portable and SPECD_NUM_THREADS apply at load', () => {
    const out = execFileSync(process.execPath, ['-e', probe], {
      env: { ...process.env, SPECD_ISA: 'portable', SPECD_NUM_THREADS: '3' },
      encoding: 'utf8',
    });
    expect(JSON.parse(out)).toMatchObject({ isa: 'portable', threads: 3 });
  });

  it('a malformed env var fails the load with a message naming it', () => {
    const bad = loadWith({ SPECD_ISA: 'sse9' });
    expect(bad.status).not.toBe(0);
    expect(bad.stderr).toContain('SPECD_ISA: expected "auto", "portable" or "avx512", got "sse9"');
    const threads = loadWith({ SPECD_NUM_THREADS: 'many' });
    expect(threads.stderr).toContain('SPECD_NUM_THREADS: expected an integer in [1, 1024], got "many"');
  });

  it('setIsa switches paths and validates names', () => {
    setIsa('portable');
    expect(isa().isa).toBe('portable');
    setIsa('auto');
    expect(isa().isa).toBe(isa().avx512Available ? 'avx512' : 'portable');
    expect(() => setIsa('neon' as 'auto')).toThrow(
      'setIsa: name: expected one of "auto", "portable", "avx512", got string "neon"',
    );
  });

  it('loads in a worker_thread too (context-aware addon, shared pool)', async () => {
    const code = `
      const { parentPort } = require('node:worker_threads');
      import('@specd/native').then((m) => {
        const w = m.packBf16Weights(m.f32ToBf16(new Float32Array(6).fill(1)), 3, 2);
        parentPort.postMessage(Array.from(m.gemmBf16(new Float32Array([1, 2]), 1, w)));
      });`;
    const result = await new Promise((resolve, reject) => {
      const worker = new Worker(code, { eval: true });
      worker.once('message', resolve);
      worker.once('error', reject);
    });
    expect(result).toEqual([3, 3, 3]);
  });

  it('parallelCopy copies every element', () => {
    const src = Float32Array.from({ length: 100_003 }, (_, i) => i);
    const dst = new Float32Array(src.length);
    parallelCopy(dst, src);
    expect(dst[100_002]).toBe(100_002);
    expect(dst.every((v, i) => v === i)).toBe(true);
  });
});
