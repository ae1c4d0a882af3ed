// The transfer checksum (XXH64, seed 0, via hash-wasm): the algorithm's published test vectors, a plain BigInt
// reference of the specification (github.com/Cyan4973/xxHash, doc/xxhash_spec.md) on random inputs of every
// tail length, ranges hashed in order without copying, and the incremental hasher. Runs against dist/.
import { describe, expect, it } from 'vitest';

import { ChecksumHasher, checksumBytes, checksumRanges } from '../../dist/pd/checksum.js';
import { prng, randomBytes } from '../io/helpers.js';

const M = (1n << 64n) - 1n;
const P1 = 0x9e3779b185ebca87n;
const P2 = 0xc2b2ae3d27d4eb4fn;
const P3 = 0x165667b19e3779f9n;
const P4 = 0x85ebca77c2b2ae63n;
const P5 = 0x27d4eb2f165667c5n;

const rotl = (x: bigint, r: bigint) => ((x << r) | (x >> (64n - r))) & M;
const round = (acc: bigint, lane: bigint) => (rotl((acc + lane * P2) & M, 31n) * P1) & M;
const merge = (acc: bigint, v: bigint) => ((acc ^ round(0n, v)) * P1 + P4) & M;

/** XXH64 with seed 0, transcribed from the specification (slow, exact). */
function xxh64Reference(data: Uint8Array): string {
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const len = data.byteLength;
  let at = 0;
  let acc: bigint;
  if (len >= 32) {
    const v = [(P1 + P2) & M, P2, 0n, (M + 1n - P1) & M];
    for (; at + 32 <= len; at += 32)
      for (let i = 0; i < 4; i++) v[i] = round(v[i] as bigint, view.getBigUint64(at + 8 * i, true));
    const [v1, v2, v3, v4] = v as [bigint, bigint, bigint, bigint];
    acc = (rotl(v1, 1n) + rotl(v2, 7n) + rotl(v3, 12n) + rotl(v4, 18n)) & M;
    for (const x of [v1, v2, v3, v4]) acc = merge(acc, x);
  } else {
    acc = P5;
  }
  acc = (acc + BigInt(len)) & M;
  for (; at + 8 <= len; at += 8) acc = (rotl(acc ^ round(0n, view.getBigUint64(at, true)), 27n) * P1 + P4) & M;
  if (at + 4 <= len) {
    acc = (rotl(acc ^ ((BigInt(view.getUint32(at, true)) * P1) & M), 23n) * P2 + P3) & M;
    at += 4;
  }
  for (; at < len; at++) acc = (rotl(acc ^ ((BigInt(data[at] as number) * P5) & M), 11n) * P1) & M;
  acc ^= acc >> 33n;
  acc = (acc * P2) & M;
  acc ^= acc >> 29n;
  acc = (acc * P3) & M;
  acc ^= acc >> 32n;
  return acc.toString(16).padStart(16, '0');
}

const text = (s: string) => new TextEncoder().encode(s);

describe('checksum (XXH64, seed 0)', () => {
  it('matches the published test vectors', () => {
    // xxHash's canonical (big-endian) hex, as `xxhsum -H64` prints it
    expect(checksumBytes(new Uint8Array(0))).toBe('ef46db3751d8e999');
    expect(checksumBytes(text('a'))).toBe('d24ec4f1a98c6e5b');
    expect(checksumBytes(text('abc'))).toBe('44bc2cf5ad770999');
    expect(checksumBytes(text('Nobody inspects the spammish repetition'))).toBe('fbcea83c8a378bf1');
    // the reference agrees on them too (it is the check for the random inputs below)
    expect(xxh64Reference(text('abc'))).toBe('44bc2cf5ad770999');
    expect(xxh64Reference(text('Nobody inspects the spammish repetition'))).toBe('fbcea83c8a378bf1');
  });

  it('equals the specification on random inputs of every length up to 130 bytes and a large one', () => {
    const next = prng(7);
    for (let len = 0; len <= 130; len++) {
      const data = randomBytes(len, next);
      expect(checksumBytes(data), `length ${len}`).toBe(xxh64Reference(data));
    }
    const big = randomBytes(100_003, next);
    expect(checksumBytes(big)).toBe(xxh64Reference(big));
  });

  it('hashes ranges in order as one stream, without depending on how they are cut', () => {
    const next = prng(8);
    const a = randomBytes(4096, next);
    const b = randomBytes(4096, next);
    const regions = new Map([
      ['a', a],
      ['b', b],
    ]);
    const bytes = (id: string) => regions.get(id) as Uint8Array;
    const ranges = [
      { region: 'a', offset: 100, length: 1000 },
      { region: 'b', offset: 3000, length: 1096 },
      { region: 'a', offset: 0, length: 7 },
    ];
    const joined = new Uint8Array(2103);
    joined.set(a.subarray(100, 1100), 0);
    joined.set(b.subarray(3000, 4096), 1000);
    joined.set(a.subarray(0, 7), 2096);
    const want = xxh64Reference(joined);
    expect(checksumRanges(bytes, ranges)).toBe(want);
    // the same bytes cut differently
    const recut = [
      { region: 'a', offset: 100, length: 1 },
      { region: 'a', offset: 101, length: 999 },
      { region: 'b', offset: 3000, length: 0 },
      { region: 'b', offset: 3000, length: 1096 },
      { region: 'a', offset: 0, length: 7 },
    ];
    expect(checksumRanges(bytes, recut)).toBe(want);
    // order matters
    expect(checksumRanges(bytes, [ranges[1], ranges[0], ranges[2]] as typeof ranges)).not.toBe(want);
    // one changed byte matters
    b[3500] = (b[3500] as number) ^ 1;
    expect(checksumRanges(bytes, ranges)).not.toBe(want);
  });

  it('refuses a range outside its region, naming it', () => {
    const bytes = () => new Uint8Array(16);
    expect(() => checksumRanges(bytes, [{ region: 'kv', offset: 8, length: 9 }])).toThrow(
      "checksumRanges: range 0 (region 'kv', offset 8, length 9) is outside the region's 16 bytes",
    );
    expect(() => checksumRanges(bytes, [{ region: 'kv', offset: -1, length: 1 }])).toThrow(/range 0/);
  });

  it('hashes incrementally; hashers interleave without disturbing each other', () => {
    const next = prng(9);
    const x = randomBytes(777, next);
    const y = randomBytes(333, next);
    const hx = new ChecksumHasher();
    const hy = new ChecksumHasher();
    hx.update(x.subarray(0, 100));
    hy.update(y.subarray(0, 33));
    expect(checksumBytes(y)).toBe(xxh64Reference(y)); // a one-shot hash in between
    hx.update(x.subarray(100, 777));
    hy.update(y.subarray(33));
    expect(hx.byteLength).toBe(777);
    expect(hx.digest()).toBe(xxh64Reference(x));
    expect(hy.digest()).toBe(xxh64Reference(y));
    expect(() => hx.digest()).toThrow(/already digested/);
    expect(() => hx.update(x)).toThrow(/already digested/);
    expect(new ChecksumHasher().digest()).toBe('ef46db3751d8e999');
  });
});
