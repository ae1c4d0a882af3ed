// bench/batch-phases.mjs, where a batch step's time goes at C sequences: the per-step view of hand-made runs (phases,
// the rest of the wall time, the decode time against the first engine, kernels by time) and its printed table.
import { describe, expect, it } from 'vitest';

// a plain ES module of the benches (no declarations; vitest transpiles without type-checking)
import * as bp from '../bench/batch-phases.mjs';

/** Plain decoding: 100 steps in 300 ms, of which 50 ms of prefill and 200 of verify forwards. */
const plain = {
  name: 'plain',
  steps: 100,
  wallMs: 300,
  phaseMs: { verify: 200, prefill: 50 },
  kernelMs: { 'verify:gemmBf16': { ms: 120, calls: 3800 }, 'prefill:gemmBf16': { ms: 30, calls: 40 } },
};
/** One draft a sequence: the same tokens in 60 steps, 280 ms of wall time. */
const drafting = {
  name: 'k = 1',
  steps: 60,
  wallMs: 280,
  phaseMs: { verify: 150, prefill: 50, propose: 30, ctxkv: 12, project: 6, commit: 6 },
  kernelMs: {
    'verify:moeExperts': { ms: 60, calls: 420 },
    'verify:gemmBf16': { ms: 90, calls: 2280 },
    'propose:gemmQuant': { ms: 9, calls: 300 },
  },
};

describe('phaseTable', () => {
  it('divides every phase by the batch steps and charges the wall time outside the phases to rest', () => {
    const [p, d] = bp.phaseTable([plain, drafting]).engines;
    expect(p.phasesUs.verify).toBeCloseTo(2000, 9);
    expect(p.phasesUs.prefill).toBeCloseTo(500, 9);
    expect(p.phasesUs.propose).toBe(0);
    expect(p.phasesUs.rest).toBeCloseTo(500, 9); // 300 − 200 − 50 ms over 100 steps
    expect(p.stepUs).toBeCloseTo(3000, 9);
    expect(p.decodeUs).toBeCloseTo(2500, 9);
    expect(d.phasesUs.verify).toBeCloseTo(2500, 9);
    expect(d.phasesUs.propose).toBeCloseTo(500, 9);
    expect(d.phasesUs.rest).toBeCloseTo((1000 * (280 - 254)) / 60, 9);
    const sum = [...bp.PHASES, 'rest'].reduce((a: number, k: string) => a + d.phasesUs[k], 0);
    expect(sum).toBeCloseTo(d.stepUs, 9);
  });

  it('compares decode time (prefill left out) with the first engine: the same tokens, so > 1 is faster', () => {
    const [p, d] = bp.phaseTable([plain, drafting]).engines;
    expect(p.vsFirst).toBe(1);
    expect(d.decodeMs).toBeCloseTo(230, 9);
    expect(d.vsFirst).toBeCloseTo(250 / 230, 12);
  });

  it('lists kernels by time, per step and per call, with the phase they ran in', () => {
    const d = bp.phaseTable([plain, drafting]).engines[1];
    expect(d.kernels.map((k: { phase: string; kernel: string }) => `${k.phase}:${k.kernel}`)).toEqual([
      'verify:gemmBf16',
      'verify:moeExperts',
      'propose:gemmQuant',
    ]);
    expect(d.kernels[1].us).toBeCloseTo(1000, 9);
    expect(d.kernels[1].calls).toBeCloseTo(7, 12);
    expect(d.kernels[1].usPerCall).toBeCloseTo((1000 * 60) / 420, 9);
  });

  it('refuses no runs and a run without steps', () => {
    expect(() => bp.phaseTable([])).toThrow(/at least one run/);
    expect(() => bp.phaseTable([{ ...plain, steps: 0 }])).toThrow(/run plain: expected steps > 0, got 0/);
  });
});

describe('formatPhaseTable', () => {
  it('prints each phase in a column per engine, the decode ratio, and the top kernels', () => {
    const lines = bp.formatPhaseTable(bp.phaseTable([plain, drafting]), 2);
    expect(lines[0]).toBe('| µs a batch step | plain | k = 1 |');
    expect(lines).toContain('| verify | 2,000 | 2,500 |');
    expect(lines).toContain('| rest | 500 | 433 |');
    expect(lines).toContain('| **step (wall)** | **3,000** | **4,667** |');
    expect(lines).toContain('| decode time ×plain | ×1.000 | ×1.087 |');
    const top = lines.slice(lines.findIndex((l: string) => l.startsWith('k = 1:')) + 1);
    expect(top).toEqual([
      '  verify:gemmBf16 1500.0 µs, 38.0 calls, 39.5 µs/call',
      '  verify:moeExperts 1000.0 µs, 7.0 calls, 142.9 µs/call',
    ]);
  });
});
