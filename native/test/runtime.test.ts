// ISA selection and thread pool: SPECD_ISA / SPECD_NUM_THREADS at load (child processes), setIsa.
import { execFileSync, spawnSync } from 'node:child_process';
import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import {
  DEFAULT_PARALLEL_MIN_WORK,
  createMoeExpertSet,
  f32ToBf16,
  gemmBf16,
  isa,
  kdaRecurrent,
  moeExperts,
  packBf16Weights,
  packMoeExpert,
  parallelCopy,
  setIsa,
  setNumThreads,
  setParallelMinWork,
} from '@specd/native';
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

  it('SPECD_ISA=portable, SPECD_NUM_THREADS and SPECD_PARALLEL_MIN_WORK apply at load', () => {
    const out = execFileSync(process.execPath, ['-e', probe], {
      env: { ...process.env, SPECD_ISA: 'portable', SPECD_NUM_THREADS: '3', SPECD_PARALLEL_MIN_WORK: '4096' },
      encoding: 'utf8',
    });
    expect(JSON.parse(out)).toMatchObject({ isa: 'portable', threads: 3, parallelMinWork: 4096 });
  });

  it('a malformed env var fails the load with a message naming it', () => {
    const bad = loadWith({ SPECD_ISA: 'sse9' });
    expect(bad.status).not.toBe(0);
    expect(bad.stderr).toContain('SPECD_ISA: expected "auto", "portable" or "avx512", got "sse9"');
    const threads = loadWith({ SPECD_NUM_THREADS: 'many' });
    expect(threads.stderr).toContain('SPECD_NUM_THREADS: expected an integer in [1, 1024], got "many"');
    const minWork = loadWith({ SPECD_PARALLEL_MIN_WORK: '0' });
    expect(minWork.status).not.toBe(0);
    expect(minWork.stderr).toContain('SPECD_PARALLEL_MIN_WORK: expected an integer in [1, 1073741824], got "0"');
    expect(loadWith({ SPECD_PARALLEL_MIN_WORK: '4096' }).status).toBe(0);
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

  it('setParallelMinWork changes which calls split, never a result; it validates its argument', () => {
    let seed = 7;
    const rnd = (n: number, scale = 1): Float32Array =>
      Float32Array.from({ length: n }, () => {
        seed = (seed * 1103515245 + 12345) % 2 ** 31;
        return (seed / 2 ** 31 - 0.5) * scale;
      });
    const bf = (n: number): Uint16Array => f32ToBf16(rnd(n, 0.2));
    // kimi-k3-tiny's shapes: 256-wide GEMMs, 8 experts of 128, KDA 4 heads × 64
    const w = packBf16Weights(bf(768 * 256), 768, 256);
    const x = rnd(5 * 256);
    const experts = createMoeExpertSet(
      Array.from({ length: 8 }, () => packMoeExpert(bf(128 * 256), bf(128 * 256), bf(256 * 128), 256, 128)),
      packMoeExpert(bf(128 * 256), bf(128 * 256), bf(256 * 128), 256, 128),
    );
    const routing = { topK: 2, ids: Int32Array.from([0, 3, 1, 3, 7, 2, 5, 6, 4, 0]), weights: rnd(10, 2) };
    const H = 4;
    const d = 64;
    const C = H * d;
    const inputs = {
      qkv: rnd(5 * 3 * C),
      g: rnd(5 * C, 0.1).map((v) => -Math.abs(v)),
      beta: rnd(5 * H).map((v) => Math.abs(v)),
      convWeight: rnd(3 * C * 4),
    };
    const state0 = rnd(2 * H * d * d, 0.1);
    const conv0 = rnd(2 * 9 * C);
    const run = (): Float32Array[] => {
      const pools = { state: state0.slice(), conv: conv0.slice() };
      const o = kdaRecurrent(inputs, { seqLens: Int32Array.of(4, 1), slots: Int32Array.of(1, 0) }, pools, {
        heads: H,
        headDim: d,
      });
      return [gemmBf16(x, 5, w), moeExperts(x, 5, experts, routing), o, pools.state];
    };
    const threads = isa().threads;
    try {
      setNumThreads(2);
      expect(isa().parallelMinWork).toBe(DEFAULT_PARALLEL_MIN_WORK);
      setParallelMinWork(2 ** 30); // every call inline (but those without a work estimate)
      expect(isa().parallelMinWork).toBe(2 ** 30);
      const inline = run();
      setParallelMinWork(1); // every call split
      const split = run();
      setParallelMinWork(DEFAULT_PARALLEL_MIN_WORK);
      const dflt = run();
      inline.forEach((want, i) => {
        expect(Array.from(split[i] ?? [])).toEqual(Array.from(want));
        expect(Array.from(dflt[i] ?? [])).toEqual(Array.from(want));
      });
    } finally {
      setParallelMinWork(DEFAULT_PARALLEL_MIN_WORK);
      setNumThreads(threads);
    }
    expect(() => setParallelMinWork(0)).toThrow('setParallelMinWork: units: expected an integer in [1, 1073741824]');
    expect(() => setParallelMinWork(1.5)).toThrow('setParallelMinWork: units');
  });
});
