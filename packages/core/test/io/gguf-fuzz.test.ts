/**
 * Bounded fuzz test of the GGUF reader: every prefix of a small valid file, and random byte flips /
 * u64 lies in it, must either parse (and then every readable tensor's view and dequantization has
 * the declared size) or throw GgufError — never another error type, never hang, never allocate more
 * than the file size (counts are checked before allocating). A fixed number of cases from fixed seeds, printed so a
 * failure can be replayed.
 */
import { describe, expect, it } from 'vitest';

import { GgmlType, GgufError, GgufFile, GgufValueType, isSupportedGgmlType } from '../../src/io/index.js';
import { buildGguf } from './gguf-builder.js';
import { prng } from './helpers.js';

function smallFile(rand: () => number): Uint8Array {
  const rb = (n: number) => Uint8Array.from({ length: n }, () => Math.floor(rand() * 256));
  return buildGguf({
    alignment: rand() < 0.5 ? 16 : undefined,
    metadata: [
      ['general.architecture', { t: GgufValueType.STRING, v: 'llama' }],
      ['n', { t: GgufValueType.UINT32, v: 3 }],
      ['f', { t: GgufValueType.FLOAT32, v: 0.5 }],
      ['b', { t: GgufValueType.BOOL, v: false }],
      ['toks', { t: GgufValueType.ARRAY, of: GgufValueType.STRING, v: ['<s>', 'Ġa', 'é'] }],
      ['ids', { t: GgufValueType.ARRAY, of: GgufValueType.INT32, v: [1, 2, 3] }],
      [
        'nest',
        {
          t: GgufValueType.ARRAY,
          of: GgufValueType.ARRAY,
          v: [{ t: GgufValueType.ARRAY, of: GgufValueType.UINT64, v: [1n] }],
        },
      ],
    ],
    tensors: [
      { name: 'a', type: GgmlType.F32, ggmlShape: [4, 2], data: rb(32) },
      { name: 'b', type: GgmlType.Q4_1, ggmlShape: [32, 2], data: rb(40) },
      { name: 'c', type: GgmlType.Q8_0, ggmlShape: [32], data: rb(34) },
      { name: 'd', type: GgmlType.Q4_K, ggmlShape: [256], data: rb(144) },
      { name: 'e', type: GgmlType.BF16, ggmlShape: [3], data: rb(6) },
    ],
  });
}

/** 'ok' or the GgufError rule; rethrows anything else (a test failure). */
function parseOrReject(bytes: Uint8Array): string {
  let g: GgufFile;
  try {
    g = GgufFile.fromBytes(bytes, 'fuzz.gguf');
  } catch (err) {
    if (!(err instanceof GgufError)) throw err;
    expect(err.message.startsWith('fuzz.gguf: ')).toBe(true);
    return err.rule;
  }
  for (const t of g.tensors()) {
    expect(t.fileOffsetBytes + t.byteLength).toBeLessThanOrEqual(bytes.length);
    if (!isSupportedGgmlType(t.type)) continue;
    expect(g.tensor(t.name).bytes.length).toBe(t.byteLength);
    expect(g.dequantize(t.name).length).toBe(t.numElements);
  }
  return 'ok';
}

/** Seed of the file whose truncations are checked; seed and number of the random mutations. */
const TRUNCATION_SEED = 7;
const MUTATION_SEED = 0x66757a7a;
const MUTATION_CASES = 5000;

describe('gguf fuzz', () => {
  it('every truncation of a valid file before the end of its data throws GgufError', () => {
    const file = smallFile(prng(TRUNCATION_SEED));
    console.log(`gguf fuzz: every prefix of a ${file.length}-byte file made with seed ${TRUNCATION_SEED}`);
    expect(parseOrReject(file)).toBe('ok');
    const last = GgufFile.fromBytes(file).tensors().at(-1)!;
    const dataEnd = last.fileOffsetBytes + last.byteLength; // the last tensor's padding is optional
    const rules = new Set<string>();
    for (let n = 0; n < file.length; n++) {
      const r = parseOrReject(file.subarray(0, n));
      expect(r === 'ok', `prefix of ${n} bytes: ${r}`).toBe(n >= dataEnd);
      rules.add(r);
    }
    expect([...rules].sort()).toEqual(expect.arrayContaining(['count', 'tensor-offset', 'truncated']));
  });

  it('random byte flips and u64 lies parse correctly or throw GgufError', () => {
    console.log(`gguf fuzz: ${MUTATION_CASES} mutations, seed 0x${MUTATION_SEED.toString(16)}`);
    const rand = prng(MUTATION_SEED);
    const tally = new Map<string, number>();
    let i = 0;
    for (; i < MUTATION_CASES; i++) {
      const out = smallFile(rand).slice();
      const dv = new DataView(out.buffer);
      const kind = Math.floor(rand() * 3);
      if (kind === 0) {
        const flips = 1 + Math.floor(rand() * 4);
        for (let k = 0; k < flips; k++) out[Math.floor(rand() * out.length)] = Math.floor(rand() * 256);
      } else if (kind === 1) {
        // a hostile u64 anywhere in the header (counts, lengths, dims, offsets)
        const at = Math.floor(rand() * Math.min(out.length - 8, 400));
        const lies = [
          0n,
          1n,
          2n ** 32n,
          2n ** 53n,
          2n ** 63n,
          2n ** 64n - 1n,
          BigInt(out.length),
          BigInt(Math.floor(rand() * 1000)),
        ];
        dv.setBigUint64(at, lies[Math.floor(rand() * lies.length)]!, true);
      } else {
        // a hostile u32 (types, n_dims, version, element types)
        const at = Math.floor(rand() * Math.min(out.length - 4, 400));
        const lies = [0, 1, 4, 5, 9, 12, 13, 39, 40, 2 ** 31, 2 ** 32 - 1];
        dv.setUint32(at, lies[Math.floor(rand() * lies.length)]!, true);
      }
      const rule = parseOrReject(out);
      tally.set(rule, (tally.get(rule) ?? 0) + 1);
    }
    expect(i).toBeGreaterThan(500);
    expect(tally.get('ok') ?? 0).toBeGreaterThan(0);
    expect(tally.size, JSON.stringify([...tally])).toBeGreaterThanOrEqual(7);
  });
});
