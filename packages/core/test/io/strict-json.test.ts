import { describe, expect, it } from 'vitest';

import { parseStrictJson, StrictJsonError } from '../../src/io/index.js';

describe('parseStrictJson', () => {
  it('parses what JSON.parse parses, identically', () => {
    const samples = [
      '{"a":[1,-2.5e3,0,true,false,null,"x\\n\\u00e9\\ud83d\\ude00\\"\\\\\\/"],"b":{}}',
      ' [ ] ',
      '"plain"',
      '-0',
      '1E+2',
      '{"":{"":[[]]}}',
    ];
    for (const s of samples) expect(parseStrictJson(s)).toEqual(JSON.parse(s));
  });

  it('keeps integers beyond 2^53 exact as bigint', () => {
    expect(parseStrictJson('[9007199254740991, 9007199254740993, -18446744073709551615]')).toEqual([
      9007199254740991,
      9007199254740993n,
      -18446744073709551615n,
    ]);
  });

  it('rejects duplicate keys, naming the key and path', () => {
    expect(() => parseStrictJson('{"a":{"b":1,"b":2}}')).toThrow(/duplicate key "b" in \$\.a/);
    expect(() => parseStrictJson('{"x":[{"k":1,"k":1}]}')).toThrow(/\$\.x\[0\]/);
  });

  it('treats __proto__ as an ordinary own key', () => {
    const v = parseStrictJson('{"__proto__":{"polluted":1}}') as Record<string, unknown>;
    expect(Object.hasOwn(v, '__proto__')).toBe(true);
    expect(Object.getPrototypeOf(v)).toBe(Object.prototype);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });

  it('rejects malformed input with StrictJsonError and an offset', () => {
    const bad = [
      '',
      '{',
      '{"a"}',
      '{"a":1,}',
      '[1,]',
      '01',
      '1.',
      '.5',
      '+1',
      'NaN',
      'Infinity',
      "'x'",
      '"\\x"',
      '"\u0001"',
      '"abc',
      '{} {}',
      'tru',
      '1e999',
      '"\\u12"',
    ];
    for (const s of bad) {
      expect(() => parseStrictJson(s), JSON.stringify(s)).toThrow(StrictJsonError);
    }
    try {
      parseStrictJson('[1, 2, x]');
    } catch (e) {
      expect((e as StrictJsonError).offset).toBe(7);
    }
  });

  it('limits nesting depth without overflowing the stack', () => {
    expect(() => parseStrictJson('['.repeat(1_000_000))).toThrow(/nesting deeper than 64/);
    expect(parseStrictJson('[[[1]]]', { maxDepth: 3 })).toEqual([[[1]]]);
    expect(() => parseStrictJson('[[[1]]]', { maxDepth: 2 })).toThrow(StrictJsonError);
  });

  it('accepts NaN / Infinity only when asked', () => {
    expect(parseStrictJson('[NaN, Infinity, -Infinity]', { allowNonFinite: true })).toEqual([NaN, Infinity, -Infinity]);
    expect(() => parseStrictJson('-Infinity')).toThrow(StrictJsonError);
  });
});
