/**
 * Bounded fuzz test of the safetensors reader: random mutations of valid files must either load
 * (and then every tensor reads back with the declared size) or throw SafetensorsError — never
 * another error type, never hang. A fixed number of cases from a fixed seed, printed so a failure can be replayed.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

import {
  SafetensorsError,
  SafetensorsFile,
  serializeSafetensors,
  type SafetensorsDtype,
  type TensorToWrite,
} from '../../src/io/index.js';
import { makeTempDir, prng } from './helpers.js';

const dir = makeTempDir('st-fuzz');
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const DTYPES: [SafetensorsDtype, number][] = [
  ['F32', 4],
  ['BF16', 2],
  ['F16', 2],
  ['I64', 8],
  ['U8', 1],
  ['I32', 4],
  ['F64', 8],
  ['BOOL', 1],
];

function randomFile(rand: () => number): Uint8Array {
  const tensors: Record<string, TensorToWrite> = {};
  const count = 1 + Math.floor(rand() * 5);
  for (let i = 0; i < count; i++) {
    const [dtype, size] = DTYPES[Math.floor(rand() * DTYPES.length)]!;
    const rank = Math.floor(rand() * 3);
    const shape = Array.from({ length: rank }, () => Math.floor(rand() * 4));
    const n = shape.reduce((a, b) => a * b, 1);
    const bytes = new Uint8Array(n * size).map(() => Math.floor(rand() * 256));
    tensors[`layers.${i}.w`] = { dtype, shape, data: bytes };
  }
  return serializeSafetensors(tensors, rand() < 0.5 ? { format: 'pt' } : undefined);
}

function headerOf(file: Uint8Array): { n: number; json: Record<string, unknown>; data: Uint8Array } {
  const n = Number(new DataView(file.buffer, file.byteOffset).getBigUint64(0, true));
  const json = JSON.parse(new TextDecoder().decode(file.subarray(8, 8 + n))) as Record<string, unknown>;
  return { n, json, data: file.subarray(8 + n) };
}

function withHeader(text: string, data: Uint8Array, lieN?: bigint): Uint8Array {
  const h = new TextEncoder().encode(text);
  const out = new Uint8Array(8 + h.length + data.length);
  new DataView(out.buffer).setBigUint64(0, lieN ?? BigInt(h.length), true);
  out.set(h, 8);
  out.set(data, 8 + h.length);
  return out;
}

const HOSTILE_NUMBERS = [
  '-1',
  '-0',
  '1e400',
  '0.5',
  '9007199254740993',
  '18446744073709551615',
  '1e21',
  '"8"',
  'null',
  '[]',
  '{}',
  'true',
];

/** One random mutation of a valid file. */
function mutate(file: Uint8Array, rand: () => number): Uint8Array {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;
  const { json, data } = headerOf(file);
  const names = Object.keys(json).filter((k) => k !== '__metadata__');
  const entry = (): Record<string, unknown> => json[pick(names)] as Record<string, unknown>;
  switch (Math.floor(rand() * 12)) {
    case 0: {
      // byte flips anywhere
      const out = file.slice();
      const flips = 1 + Math.floor(rand() * 4);
      for (let i = 0; i < flips; i++) out[Math.floor(rand() * out.length)] = Math.floor(rand() * 256);
      return out;
    }
    case 1:
      return file.slice(0, Math.floor(rand() * file.length)); // truncation
    case 2: {
      // header length lie
      const out = file.slice();
      const lies = [
        0n,
        1n,
        7n,
        BigInt(file.length),
        BigInt(file.length - 8),
        BigInt(file.length - 9),
        2n ** 63n,
        2n ** 64n - 1n,
        BigInt(Math.floor(rand() * 200)),
      ];
      new DataView(out.buffer).setBigUint64(0, pick(lies), true);
      return out;
    }
    case 3: {
      // overlapping / shifted offsets
      if (names.length === 0) return file;
      const e = entry();
      const [b, en] = e.data_offsets as [number, number];
      const delta = pick([-8, -4, -1, 1, 4, 8]);
      e.data_offsets = pick([
        [b + delta, en + delta],
        [b + delta, en],
        [0, en - b],
        [en, b],
      ]);
      return withHeader(JSON.stringify(json), data);
    }
    case 4: {
      // huge or hostile shapes
      if (names.length === 0) return file;
      const e = entry();
      const text = JSON.stringify(json).replace(
        JSON.stringify(e.shape),
        `[${pick(HOSTILE_NUMBERS)},${pick(['4', '9007199254740991', '0'])}]`,
      );
      return withHeader(text, data);
    }
    case 5: {
      // hostile offsets as raw text (bigints, negatives, non-numbers)
      if (names.length === 0) return file;
      const e = entry();
      const text = JSON.stringify(json).replace(
        JSON.stringify(e.data_offsets),
        `[${pick(HOSTILE_NUMBERS)},${pick(HOSTILE_NUMBERS)}]`,
      );
      return withHeader(text, data);
    }
    case 6:
      // non-object JSON
      return withHeader(pick(['[]', '1', '"x"', 'null', 'true', '[{}]', '']), data);
    case 7: {
      // duplicate keys
      const text = JSON.stringify(json);
      const name = names.length > 0 ? pick(names) : '__metadata__';
      return withHeader(
        `${text.slice(0, -1)}${text.length > 2 ? ',' : ''}${JSON.stringify(name)}:${JSON.stringify(json[name] ?? {})}}`,
        data,
      );
    }
    case 8: {
      // dtype swap / unknown dtype / missing field
      if (names.length === 0) return file;
      const e = entry();
      const choice = Math.floor(rand() * 3);
      if (choice === 0) e.dtype = pick(['F32', 'BF16', 'I64', 'U8', 'F4', 'F6_E2M3', 'X', 1, null]);
      else if (choice === 1) delete e[pick(['dtype', 'shape', 'data_offsets'])];
      else e.shape = [];
      return withHeader(JSON.stringify(json), data);
    }
    case 9:
      // trailing bytes or truncated data region
      return rand() < 0.5
        ? withHeader(JSON.stringify(json), new Uint8Array([...data, 1, 2, 3]))
        : withHeader(JSON.stringify(json), data.subarray(0, Math.max(0, data.length - 1)));
    case 10: {
      // metadata of the wrong shape
      json.__metadata__ = pick([{ a: 1 }, [], 'x', { a: { b: 'c' } }, null]);
      return withHeader(JSON.stringify(json), data);
    }
    default: {
      // random byte inside the JSON text (syntax damage)
      const out = file.slice();
      const n = headerOf(file).n;
      if (n > 0)
        out[8 + Math.floor(rand() * n)] = pick([
          0x22, 0x7b, 0x7d, 0x5b, 0x5d, 0x2c, 0x3a, 0x5c, 0x00, 0xc3, 0xff, 0x30,
        ]);
      return out;
    }
  }
}

/** Returns 'ok' or the rule of the SafetensorsError; rethrows any other error (a test failure). */
function checkLoadsOrRejects(load: () => SafetensorsFile): string {
  let st: SafetensorsFile;
  try {
    st = load();
  } catch (err) {
    if (!(err instanceof SafetensorsError)) throw err;
    return err.rule;
  }
  try {
    for (const name of st.names()) {
      const info = st.info(name);
      const t = st.read(name);
      expect(t.data.byteLength).toBe(info.byteLength);
      expect(info.dataOffsets[1]).toBeLessThanOrEqual(st.header.dataByteLength);
    }
  } finally {
    st.close();
  }
  return 'ok';
}

/** Seed and number of the random mutations. */
const SEED = 0x5eed;
const CASES = 4000;

describe('safetensors fuzz', () => {
  it('every mutation loads correctly or throws SafetensorsError (in memory and on disk)', () => {
    console.log(`safetensors fuzz: ${CASES} mutations, seed 0x${SEED.toString(16)}`);
    const rand = prng(SEED);
    const tally = new Map<string, number>();
    const onDisk = path.join(dir, 'm.safetensors');
    let i = 0;
    for (; i < CASES; i++) {
      const base = randomFile(rand);
      let mutated = mutate(base, rand);
      if (rand() < 0.3) mutated = mutate(withHeaderFromFile(mutated), rand);
      const label = `case ${i}`;
      const outcome = checkLoadsOrRejects(() => SafetensorsFile.fromBytes(mutated, label));
      tally.set(outcome, (tally.get(outcome) ?? 0) + 1);
      if (i % 10 === 0) {
        fs.writeFileSync(onDisk, mutated);
        checkLoadsOrRejects(() => SafetensorsFile.open(onDisk));
      }
    }
    expect(i).toBeGreaterThan(500);
    // Both outcomes occur, and the mutations reach most rules.
    expect(tally.get('ok') ?? 0).toBeGreaterThan(0);
    expect(tally.size, JSON.stringify([...tally])).toBeGreaterThanOrEqual(12);
  });
});

/** A second round of mutation needs a well-formed file (the first mutation may have kept it valid). */
function withHeaderFromFile(file: Uint8Array): Uint8Array {
  try {
    SafetensorsFile.fromBytes(file).close();
    return file;
  } catch {
    return serializeSafetensors({ x: { dtype: 'U8', shape: [1], data: new Uint8Array([1]) } });
  }
}
