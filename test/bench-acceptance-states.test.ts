// bench/acceptance-states.mjs: the probe policy's states and plain gaps, the counts per state and the printed table.
import { describe, expect, it } from 'vitest';

// a plain ES module of the benches (no declarations; vitest transpiles without type-checking)
import * as as from '../bench/acceptance-states.mjs';

/** A candidate as the engine offers it (only id and maxDrafts are read). */
const cand = (id: string, maxDrafts: number) => ({ id, maxDrafts });

describe('probePolicy', () => {
  it('files each drafting step under the state before it: first, hot, or cold with its plain gap', () => {
    const seen: [string, number, number][] = [];
    const p = as.probePolicy(3, [0, 2], (state: string, drafted: number, accepted: number) => {
      seen.push([state, drafted, accepted]);
    });
    const step = (accepted: number) => {
      const [k] = p.choose([cand('a', 8)]);
      p.observe('a', k, accepted);
      return k;
    };
    expect(step(3)).toBe(3); // first, every draft accepted → hot
    expect(step(1)).toBe(3); // hot, a rejection → cold with the first gap, 0: drafts at once
    expect(step(0)).toBe(3); // cold 0, a rejection → cold with the next gap, 2: two plain steps
    expect(step(0)).toBe(0);
    expect(step(0)).toBe(0);
    expect(step(3)).toBe(3); // cold 2 → hot
    expect(seen).toEqual([
      ['first', 3, 3],
      ['hot', 3, 1],
      ['cold 0', 3, 0],
      ['cold 2', 3, 3],
    ]);
  });

  it('drafts no more than a candidate allows and forgets a released request', () => {
    const states: string[] = [];
    const p = as.probePolicy(4, [1], (state: string) => states.push(state));
    expect(p.choose([cand('a', 2), cand('b', 9)])).toEqual([2, 4]);
    p.observe('a', 2, 0); // a: cold 1, one plain step owed
    p.observe('b', 4, 4);
    expect(p.choose([cand('a', 2), cand('b', 9)])).toEqual([0, 4]);
    p.release('a');
    expect(p.choose([cand('a', 2)])).toEqual([2]); // a new request of the same id starts over
    p.observe('a', 2, 2);
    expect(states).toEqual(['first', 'first', 'first']);
  });
});

describe('stateCounts and formatStates', () => {
  it('counts a_2 only where draft 1 was accepted and a second offered, and prints rates with their errors', () => {
    const { record, stats } = as.stateCounts();
    record('hot', 2, 2);
    record('hot', 2, 1);
    record('hot', 1, 1); // draft 1 accepted, no second draft: not a trial of a_2
    record('hot', 2, 0);
    record('cold 0', 1, 0);
    expect(stats.get('hot')).toEqual({ steps: 4, a1: 3, n2: 2, a2: 1 });
    const lines = as.formatStates(stats, ['first', 'hot', 'cold 0']);
    // 'first' has no steps: no row; a_1 3/4 ± √(0.75 · 0.25 / 4), a_2 1/2 ± √(0.25 / 2)
    expect(lines.slice(2)).toEqual([
      '| hot | 4 | 0.750 ± 0.217 | 0.500 ± 0.354 |',
      '| cold 0 | 1 | 0.000 ± 0.000 | – |',
    ]);
  });
});
