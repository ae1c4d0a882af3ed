import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeEach, describe, expect, it } from 'vitest';

import { SafetensorsCheckpoint, SafetensorsError, writeSafetensors, type SafetensorsRule } from '../../src/io/index.js';
import { makeTempDir } from './helpers.js';

const root = makeTempDir('ckpt');
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));

let dir: string;
let n = 0;
beforeEach(() => {
  dir = path.join(root, `c${n++}`);
  fs.mkdirSync(dir);
});

function expectRule(fn: () => unknown, rule: SafetensorsRule, text?: string): void {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(SafetensorsError);
    expect((err as SafetensorsError).rule, (err as Error).message).toBe(rule);
    if (text !== undefined) expect((err as Error).message).toContain(text);
    return;
  }
  throw new Error(`expected SafetensorsError ${rule}`);
}

const f32 = (...v: number[]) => ({ dtype: 'F32' as const, shape: [v.length], data: new Float32Array(v) });

function writeSharded(weightMap: Record<string, string>, extra: Record<string, unknown> = {}): void {
  writeSafetensors(path.join(dir, 'model-00001-of-00002.safetensors'), { a: f32(1, 2), b: f32(3) });
  writeSafetensors(path.join(dir, 'model-00002-of-00002.safetensors'), { c: f32(4, 5, 6) });
  fs.writeFileSync(
    path.join(dir, 'model.safetensors.index.json'),
    JSON.stringify({ metadata: { total_size: 24 }, weight_map: weightMap, ...extra }),
  );
}

const goodMap = {
  a: 'model-00001-of-00002.safetensors',
  b: 'model-00001-of-00002.safetensors',
  c: 'model-00002-of-00002.safetensors',
};

describe('SafetensorsCheckpoint', () => {
  it('opens a sharded checkpoint by directory and reads across shards', () => {
    writeSharded(goodMap);
    const ck = SafetensorsCheckpoint.open(dir);
    try {
      expect(ck.names().sort()).toEqual(['a', 'b', 'c']);
      expect(ck.files).toHaveLength(2);
      expect(ck.index?.metadata.total_size).toBe(24);
      expect(Array.from(ck.readTyped('c', 'F32', [3]).data)).toEqual([4, 5, 6]);
      expect(Array.from(ck.read('a').data as Float32Array)).toEqual([1, 2]);
      expect(ck.fileOf('b').path).toContain('model-00001-of-00002');
      expectRule(() => ck.read('zzz'), 'tensor-not-found', '"zzz"');
    } finally {
      ck.close();
    }
  });

  it('opens a single-file checkpoint by directory or file', () => {
    writeSafetensors(path.join(dir, 'model.safetensors'), { x: f32(7) });
    const byDir = SafetensorsCheckpoint.open(dir);
    expect(byDir.names()).toEqual(['x']);
    expect(byDir.index).toBeUndefined();
    byDir.close();
    const byFile = SafetensorsCheckpoint.open(path.join(dir, 'model.safetensors'));
    expect(Array.from(byFile.read('x').data as Float32Array)).toEqual([7]);
    byFile.close();
  });

  it('rejects an empty directory', () => {
    expectRule(() => SafetensorsCheckpoint.open(dir), 'io', 'model.safetensors');
  });

  it('rejects a missing shard', () => {
    writeSharded({ ...goodMap, c: 'model-00003-of-00002.safetensors' });
    expectRule(() => SafetensorsCheckpoint.open(dir), 'index', 'does not exist');
  });

  it('rejects an index name not in its shard', () => {
    writeSharded({ ...goodMap, d: 'model-00002-of-00002.safetensors' });
    expectRule(() => SafetensorsCheckpoint.open(dir), 'index', 'does not contain it');
  });

  it('rejects a shard tensor the index does not list', () => {
    const { c: _c, ...withoutC } = goodMap;
    writeSharded(withoutC);
    // Only shard 1 is referenced now; add c back to shard 1's header via a mapped name to shard 1.
    writeSafetensors(path.join(dir, 'model-00001-of-00002.safetensors'), { a: f32(1, 2), b: f32(3), c: f32(0) });
    expectRule(() => SafetensorsCheckpoint.open(dir), 'index', 'does not list it');
  });

  it('rejects a tensor present in two shards', () => {
    writeSharded(goodMap);
    writeSafetensors(path.join(dir, 'model-00002-of-00002.safetensors'), { c: f32(4, 5, 6), a: f32(9, 9) });
    expectRule(() => SafetensorsCheckpoint.open(dir), 'index', 'two shards');
  });

  it('rejects duplicate weight_map keys', () => {
    writeSharded(goodMap);
    const p = path.join(dir, 'model.safetensors.index.json');
    fs.writeFileSync(p, fs.readFileSync(p, 'utf8').replace('"a":', '"a":"model-00001-of-00002.safetensors","a":'));
    expectRule(() => SafetensorsCheckpoint.open(dir), 'index', 'duplicate key');
  });

  it('rejects shard paths that leave the directory', () => {
    for (const bad of ['../evil.safetensors', '/etc/passwd', 'sub/x.safetensors', '..', '']) {
      writeSharded({ ...goodMap, c: bad });
      expectRule(() => SafetensorsCheckpoint.open(dir), 'index', 'plain file name');
    }
  });

  it('rejects malformed index JSON', () => {
    writeSharded(goodMap);
    const p = path.join(dir, 'model.safetensors.index.json');
    for (const text of [
      '[]',
      '{"weight_map": []}',
      '{"weight_map": {"a": 3}}',
      '{',
      '{"metadata": 1, "weight_map": {}}',
    ]) {
      fs.writeFileSync(p, text);
      expectRule(() => SafetensorsCheckpoint.open(dir), 'index');
    }
  });

  it('reports a corrupt shard with the shard path', () => {
    writeSharded(goodMap);
    fs.writeFileSync(path.join(dir, 'model-00002-of-00002.safetensors'), new Uint8Array(3));
    expectRule(() => SafetensorsCheckpoint.open(dir), 'file-too-small', 'model-00002-of-00002.safetensors');
  });
});
