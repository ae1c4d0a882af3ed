import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

import { HfConfig, HfConfigError } from '../../src/io/index.js';
import { makeTempDir } from './helpers.js';

const dir = makeTempDir('cfg');
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const configText = JSON.stringify({
  architectures: ['KimiLinearForCausalLM'],
  model_type: 'kimi_linear',
  hidden_size: 7168,
  rms_norm_eps: 1e-5,
  tie_word_embeddings: false,
  sliding_window: null,
  rope_scaling: null,
  linear_attn_config: { kda_layers: [1, 2, 3], full_attn_layers: [4], head_dim: 128 },
  layer_types: ['full_attention', 'sliding_attention'],
  max_big: 18446744073709552000, // the double nearest 2^64 − 1; the text is put back below
}).replace('"max_big":18446744073709552000', '"max_big":18446744073709551615');

function expectField(fn: () => unknown, field: string, detail?: string): void {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(HfConfigError);
    expect((err as HfConfigError).field).toBe(field);
    expect((err as Error).message).toContain(`"${field}"`);
    if (detail !== undefined) expect((err as Error).message).toContain(detail);
    return;
  }
  throw new Error(`expected HfConfigError for ${field}`);
}

describe('HfConfig', () => {
  fs.writeFileSync(path.join(dir, 'config.json'), configText);
  const cfg = HfConfig.read(dir);

  it('reads typed required and optional fields', () => {
    expect(cfg.file).toBe(path.join(dir, 'config.json'));
    expect(cfg.modelType).toBe('kimi_linear');
    expect(cfg.architectures).toEqual(['KimiLinearForCausalLM']);
    expect(cfg.requireInt('hidden_size', { min: 1 })).toBe(7168);
    expect(cfg.requireNumber('rms_norm_eps', { min: 0 })).toBe(1e-5);
    expect(cfg.requireBoolean('tie_word_embeddings')).toBe(false);
    expect(cfg.optionalInt('sliding_window')).toBeUndefined();
    expect(cfg.optionalInt('not_there')).toBeUndefined();
    expect(cfg.optionalSection('rope_scaling')).toBeUndefined();
    expect(cfg.requireStringArray('layer_types')).toEqual(['full_attention', 'sliding_attention']);
    expect(cfg.has('sliding_window')).toBe(false);
    expect(cfg.has('hidden_size')).toBe(true);
  });

  it('nested sections keep the JSON path in errors', () => {
    const lin = cfg.section('linear_attn_config');
    expect(lin.requireIntArray('kda_layers', { min: 1 })).toEqual([1, 2, 3]);
    expectField(() => lin.requireInt('num_heads'), 'linear_attn_config.num_heads', 'required but missing');
    expectField(
      () => lin.requireIntArray('kda_layers', { min: 2 }),
      'linear_attn_config.kda_layers[0]',
      'must be in [2, ∞]',
    );
  });

  it('missing, null and mistyped required fields throw naming the field and what was found', () => {
    expectField(() => cfg.requireInt('vocab_size'), 'vocab_size', 'required but missing');
    expectField(() => cfg.requireInt('sliding_window'), 'sliding_window', 'is null');
    expectField(() => cfg.requireString('hidden_size'), 'hidden_size', 'must be a string, got number 7168');
    expectField(() => cfg.requireInt('rms_norm_eps'), 'rms_norm_eps', 'safe integer');
    expectField(() => cfg.optionalBoolean('hidden_size'), 'hidden_size', 'boolean');
    expectField(() => cfg.requireInt('max_big'), 'max_big', 'beyond 2^53');
    expectField(() => cfg.section('hidden_size'), 'hidden_size', 'an object');
    expectField(() => cfg.requireOneOf('model_type', ['llama', 'qwen3']), 'model_type', 'must be one of');
    expectField(() => cfg.requireIntArray('layer_types'), 'layer_types[0]', 'safe integer');
    expectField(() => cfg.fail('hidden_size', 'custom check'), 'hidden_size', 'custom check');
  });

  it('file-level errors name the file', () => {
    expect(() => HfConfig.read(path.join(dir, 'nope.json'))).toThrow(/nope\.json: cannot read/);
    fs.writeFileSync(path.join(dir, 'bad.json'), '{"a": 1, "a": 2}');
    expect(() => HfConfig.read(path.join(dir, 'bad.json'))).toThrow(/bad\.json: not valid JSON: duplicate key "a"/);
    expect(() => HfConfig.parse('[1]', 'x.json')).toThrow(HfConfigError);
  });

  it('accepts Python NaN / Infinity literals and a BOM', () => {
    const c = HfConfig.parse('\ufeff{"a": NaN, "b": -Infinity, "c": Infinity}');
    expect(c.requireNumber('a')).toBeNaN();
    expect(c.requireNumber('b')).toBe(-Infinity);
    expectField(() => c.requireNumber('c', { max: 1 }), 'c', 'must be in');
  });

  it('fromObject wraps a plain object', () => {
    const c = HfConfig.fromObject(
      { block_size: 16, dflash_config: { mask_token_id: 5, target_layer_ids: [1, 2] } },
      'draft.json',
    );
    expect(c.section('dflash_config').requireIntArray('target_layer_ids')).toEqual([1, 2]);
    expectField(() => c.section('dflash_config').requireInt('missing'), 'dflash_config.missing');
  });
});
