// model_type "kimi_linear": a tiny random checkpoint written with the real Kimi-Linear-48B-A3B key
// names (test/fixtures/kimi-linear-48b-a3b/tensor-names.json) and dtypes (incl. the BF16
// e_score_correction_bias), shapes scaled down; plus config validation errors.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

import {
  HfConfig,
  HfConfigError,
  SafetensorsCheckpoint,
  SequenceCache,
  writeSafetensors,
  type TensorToWrite,
} from '@specd/core';
import { f32ToBf16 } from '@specd/native';

import { kimiPlugin, loadKimiStage, parseKimiConfig, type KimiStageModel } from '../src/index.js';
import { bitwiseEqual, KERNELS, relError, REPO_ROOT } from './helpers.js';

const FIXTURE = path.join(REPO_ROOT, 'test/fixtures/kimi-linear-48b-a3b');
const real = JSON.parse(fs.readFileSync(path.join(FIXTURE, 'tensor-names.json'), 'utf8')) as {
  tensors: { name: string; dtype: string }[];
};
const realConfig = JSON.parse(fs.readFileSync(path.join(FIXTURE, 'config.json'), 'utf8')) as Record<string, unknown>;
/** Name pattern: layer and expert indices replaced by N. */
const pattern = (n: string) => n.replace(/\.layers\.\d+\./, '.layers.N.').replace(/\.experts\.\d+\./, '.experts.N.');
const realDtype = new Map(real.tensors.map((t) => [pattern(t.name), t.dtype]));

// Same structure as the 48B (first layer dense, KDA except every 4th, MLA last), scaled down.
const tiny = {
  ...realConfig,
  vocab_size: 96,
  hidden_size: 32,
  intermediate_size: 48,
  num_hidden_layers: 4,
  num_attention_heads: 2,
  num_key_value_heads: 2,
  kv_lora_rank: 16,
  qk_nope_head_dim: 8,
  qk_rope_head_dim: 4,
  v_head_dim: 8,
  head_dim: 12,
  linear_attn_config: {
    kda_layers: [1, 2, 3],
    full_attn_layers: [4],
    num_heads: 2,
    head_dim: 8,
    short_conv_kernel_size: 4,
  },
  num_experts: 4,
  num_experts_per_token: 2,
  moe_intermediate_size: 16,
  eos_token_id: 95,
  bos_token_id: 94,
  pad_token_id: 93,
};

function shapes(): Map<string, number[]> {
  const c = parseKimiConfig(HfConfig.fromObject(tiny));
  const D = c.hiddenSize;
  const HD = c.kdaHeads * c.kdaHeadDim;
  const m = new Map<string, number[]>([
    ['model.embed_tokens.weight', [c.vocabSize, D]],
    ['lm_head.weight', [c.vocabSize, D]],
    ['model.norm.weight', [D]],
  ]);
  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}.`;
    m.set(`${p}input_layernorm.weight`, [D]);
    m.set(`${p}post_attention_layernorm.weight`, [D]);
    const a = `${p}self_attn.`;
    if (c.layerKinds[l] === 'kda') {
      for (const n of ['q', 'k', 'v']) {
        m.set(`${a}${n}_proj.weight`, [HD, D]);
        m.set(`${a}${n}_conv1d.weight`, [HD, 1, c.convKernel]);
      }
      m.set(`${a}A_log`, [1, 1, c.kdaHeads, 1]);
      m.set(`${a}dt_bias`, [HD]);
      m.set(`${a}b_proj.weight`, [c.kdaHeads, D]);
      for (const n of ['f', 'g']) {
        m.set(`${a}${n}_a_proj.weight`, [c.kdaHeadDim, D]);
        m.set(`${a}${n}_b_proj.weight`, [HD, c.kdaHeadDim]);
      }
      m.set(`${a}o_norm.weight`, [c.kdaHeadDim]);
      m.set(`${a}o_proj.weight`, [D, HD]);
    } else {
      m.set(`${a}q_proj.weight`, [c.numHeads * (c.qkNopeHeadDim + c.qkRopeHeadDim), D]);
      m.set(`${a}kv_a_proj_with_mqa.weight`, [c.kvLoraRank + c.qkRopeHeadDim, D]);
      m.set(`${a}kv_a_layernorm.weight`, [c.kvLoraRank]);
      m.set(`${a}kv_b_proj.weight`, [c.numHeads * (c.qkNopeHeadDim + c.vHeadDim), c.kvLoraRank]);
      m.set(`${a}o_proj.weight`, [D, c.numHeads * c.vHeadDim]);
    }
    if (l < c.firstKDenseReplace) {
      m.set(`${p}mlp.gate_proj.weight`, [c.intermediateSize, D]);
      m.set(`${p}mlp.up_proj.weight`, [c.intermediateSize, D]);
      m.set(`${p}mlp.down_proj.weight`, [D, c.intermediateSize]);
    } else {
      const b = `${p}block_sparse_moe.`;
      m.set(`${b}gate.weight`, [c.numExperts, D]);
      m.set(`${b}gate.e_score_correction_bias`, [c.numExperts]);
      for (let e = 0; e < c.numExperts; e++) {
        m.set(`${b}experts.${e}.w1.weight`, [c.moeIntermediateSize, D]);
        m.set(`${b}experts.${e}.w3.weight`, [c.moeIntermediateSize, D]);
        m.set(`${b}experts.${e}.w2.weight`, [D, c.moeIntermediateSize]);
      }
      for (const n of ['gate_proj', 'up_proj']) m.set(`${b}shared_experts.${n}.weight`, [c.moeIntermediateSize, D]);
      m.set(`${b}shared_experts.down_proj.weight`, [D, c.moeIntermediateSize]);
    }
  }
  return m;
}

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-kimi-linear-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

function writeRandomCheckpoint(): void {
  let seed = 12345;
  const rand = () => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    return seed / 4294967296 - 0.5;
  };
  const tensors: Record<string, TensorToWrite> = {};
  for (const [name, shape] of shapes()) {
    const n = shape.reduce((a, b) => a * b, 1);
    const v = new Float32Array(n);
    const isNorm = name.endsWith('norm.weight');
    for (let i = 0; i < n; i++) {
      if (isNorm) v[i] = 1 + 0.1 * rand();
      else if (name.endsWith('A_log')) v[i] = 2 * rand();
      else if (name.endsWith('dt_bias')) v[i] = -2 + rand();
      else if (name.includes('conv1d')) v[i] = 0.4 * rand();
      else v[i] = 0.2 * rand();
    }
    const dtype = realDtype.get(pattern(name))!;
    tensors[name] = dtype === 'F32' ? { dtype: 'F32', shape, data: v } : { dtype: 'BF16', shape, data: f32ToBf16(v) };
  }
  writeSafetensors(path.join(dir, 'model.safetensors'), tensors);
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(tiny));
}

describe('kimi_linear checkpoint with the real 48B key names', () => {
  it('uses exactly the 48B name patterns and dtypes', () => {
    const mine = new Set([...shapes().keys()].map(pattern));
    expect([...mine].filter((p) => !realDtype.has(p))).toEqual([]);
    expect([...realDtype.keys()].filter((p) => !mine.has(p))).toEqual([]);
    expect(realDtype.get('model.layers.N.block_sparse_moe.gate.e_score_correction_bias')).toBe('BF16');
  });

  it('loads through the plugin (native kernels by default)', async () => {
    writeRandomCheckpoint();
    const weights = SafetensorsCheckpoint.open(dir);
    const config = HfConfig.read(dir);
    expect(config.modelType).toBe('kimi_linear');
    const stage = (await kimiPlugin.load({ dir, config, weights })) as KimiStageModel;
    weights.close();
    expect(stage.kernels.name).toBe('native');
    expect(stage.info.numLayers).toBe(4);
  });

  it.each(KERNELS)('%s kernels: decodes deterministically; TS and native agree', (kernels) => {
    const weights = SafetensorsCheckpoint.open(dir);
    const stage = loadKimiStage({ dir, config: HfConfig.read(dir), weights }, { kernels });
    const other = loadKimiStage(
      { dir, config: HfConfig.read(dir), weights },
      { kernels: kernels === 'ts' ? 'native' : 'ts' },
    );
    weights.close();
    expect(stage.config.layerKinds).toEqual(['kda', 'kda', 'kda', 'mla']);
    expect(stage.config.eosTokenIds).toEqual([95]);
    const cache = new SequenceCache(stage.cacheGeometry, { numPages: 8, numSlots: 2 });
    cache.add('a');
    cache.add('b');
    const ids = Int32Array.from([1, 5, 9, 33, 2, 80, 7]);
    const full = stage.forward({ sequences: [{ id: 'a', position: 0, tokens: ids, logits: 'all' }] }, cache);
    expect(full.logits!.every(Number.isFinite)).toBe(true);
    const V = stage.info.vocabSize;
    for (let i = 0; i < ids.length; i++) {
      const one = stage.forward(
        { sequences: [{ id: 'b', position: i, tokens: ids.subarray(i, i + 1), logits: 'last' }] },
        cache,
      );
      expect(bitwiseEqual(one.logits!, full.logits!.subarray(i * V, (i + 1) * V))).toBe(true);
    }
    const oc = new SequenceCache(other.cacheGeometry, { numPages: 8, numSlots: 1 });
    oc.add('a');
    const ref = other.forward({ sequences: [{ id: 'a', position: 0, tokens: ids, logits: 'all' }] }, oc).logits!;
    expect(relError(full.logits!, ref)).toBeLessThan(1e-4);
    stage.dispose();
    other.dispose();
  });
});

describe('config validation', () => {
  const bad = (patch: Record<string, unknown>, re: RegExp) => {
    expect(() => parseKimiConfig(HfConfig.fromObject({ ...tiny, ...patch }, 'cfg.json'))).toThrow(HfConfigError);
    expect(() => parseKimiConfig(HfConfig.fromObject({ ...tiny, ...patch }, 'cfg.json'))).toThrow(re);
  };
  it('accepts kimi_k3 and kimi_linear, rejects others', () => {
    expect(parseKimiConfig(HfConfig.fromObject({ ...tiny, model_type: 'kimi_k3' })).modelType).toBe('kimi_k3');
    bad({ model_type: 'llama' }, /model_type.*must be one of/);
  });
  it('layer kinds only from linear_attn_config (1-based), every layer exactly once', () => {
    const la = tiny.linear_attn_config;
    bad(
      { linear_attn_config: { ...la, full_attn_layers: [3, 4] } },
      /linear_attn_config.full_attn_layers.*layer 3 is listed twice/,
    );
    bad({ linear_attn_config: { ...la, kda_layers: [1, 2] } }, /layers \[3\] are in neither/);
    bad({ linear_attn_config: { ...la, full_attn_layers: [5] } }, /full_attn_layers\[0\].*\[1, 4\]/);
    bad({ linear_attn_config: { ...la, kda_layers: undefined } }, /kda_layers.*missing/);
  });
  it('rejects unsupported settings', () => {
    bad({ mla_use_nope: false }, /mla_use_nope/);
    bad({ q_lora_rank: 64 }, /q_lora_rank.*null/);
    bad({ moe_router_activation_func: 'softmax' }, /sigmoid/);
    bad({ num_experts_per_token: 9 }, /num_experts_per_token/);
    bad({ hidden_size: '32' }, /hidden_size.*safe integer/);
    bad({ hidden_act: 'gelu' }, /hidden_act/);
    bad({ moe_layer_freq: 2 }, /moe_layer_freq/);
    bad({ num_expert_group: 4 }, /num_expert_group/);
  });
});
