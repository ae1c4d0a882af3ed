// A synthetic Kimi-K3 checkpoint (same architecture and tensor names as models/kimi-k3-tiny,
// Kimi-Linear-48B-A3B proportions, random bf16 weights) for bandwidth benchmarks: written at bench
// time with core's writeSafetensors, one shard per layer plus model.safetensors.index.json, so
// generation never holds more than one layer in memory. Never committed.
//
// Weight values: bf16 with a random sign and mantissa and a fixed exponent chosen so |w| is in
// [2^e, 2^(e+1)) with 2^e ≤ 1/sqrt(fan_in) (activations stay O(1) through the layers; routing is
// effectively random). Norm weights are 1, A_log = log(1..16), dt_bias and the router correction
// bias 0 (fp32, as the reference's FP32_PARAMS).

import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { writeSafetensors } from '@specd/core';

/** The large synthetic config (HF config.json fields, as models/kimi-k3-tiny/config.json). */
export function largeSyntheticConfig() {
  return {
    architectures: ['KimiLinearForCausalLM'],
    model_type: 'kimi_k3',
    vocab_size: 32768,
    hidden_size: 2048,
    num_hidden_layers: 8,
    intermediate_size: 8192,
    num_attention_heads: 16,
    num_key_value_heads: 16,
    kv_lora_rank: 512,
    q_lora_rank: null,
    qk_nope_head_dim: 128,
    qk_rope_head_dim: 64,
    v_head_dim: 128,
    mla_use_nope: true,
    linear_attn_config: {
      kda_layers: [1, 2, 3, 5, 6, 7],
      full_attn_layers: [4, 8],
      num_heads: 16,
      head_dim: 128,
      short_conv_kernel_size: 4,
    },
    num_experts: 64,
    num_experts_per_token: 8,
    num_shared_experts: 1,
    moe_intermediate_size: 512,
    first_k_dense_replace: 1,
    moe_layer_freq: 1,
    moe_router_activation_func: 'sigmoid',
    moe_renormalize: true,
    routed_scaling_factor: 2.446,
    num_expert_group: 1,
    topk_group: 1,
    use_grouped_topk: true,
    hidden_act: 'silu',
    rms_norm_eps: 1e-5,
    tie_word_embeddings: false,
    rope_theta: 10000.0,
    rope_scaling: null,
    num_nextn_predict_layers: 0,
    torch_dtype: 'bfloat16',
    use_cache: true,
    eos_token_id: 0,
    bos_token_id: null,
    max_position_embeddings: 4096,
  };
}

/**
 * The dense synthetic config: {@link largeSyntheticConfig} with every layer's feed-forward the dense SwiGLU MLP
 * (first_k_dense_replace = the layer count; no experts are written): 8 layers of 68 M (KDA) / 64 M (MLA) parameters
 * and a 67 M lm_head, 1.22 GB of bf16 weights read per token (bench/verify-dense.mjs --model kimi).
 */
export function denseSyntheticConfig() {
  const c = largeSyntheticConfig();
  return { ...c, first_k_dense_replace: c.num_hidden_layers };
}

/**
 * Bytes of weights a forward reads, by family, from the HF config (the model's parsing rules:
 * kinds from linear_attn_config, dense below first_k_dense_replace). Routed experts are separate:
 * `perExpert` bytes each, counted by the caller from the routing (bench/decode.mjs, bench/verify-dense.mjs).
 */
export function kimiWeightBytes(c) {
  const D = c.hidden_size;
  const la = c.linear_attn_config;
  const H = la.num_heads;
  const d = la.head_dim;
  const HD = H * d;
  const ks = la.short_conv_kernel_size;
  const Hm = c.num_attention_heads;
  const rope = c.qk_rope_head_dim;
  const r = c.kv_lora_rank;
  const E = c.num_experts;
  const Im = c.moe_intermediate_size;
  const L = c.num_hidden_layers;
  const kdaLayers = la.kda_layers.length;
  const mlaLayers = la.full_attn_layers.length;
  const dense = c.first_k_dense_replace;
  const moeLayers = L - dense;
  const fam = {
    'KDA projections':
      kdaLayers * (2 * (D * (3 * HD + 2 * d + H) + 2 * HD * d + D * HD) + 4 * (3 * HD * ks + H + HD + d)),
    'KDA core': 0,
    'MLA projections':
      mlaLayers * (2 * (D * (Hm * (c.qk_nope_head_dim + rope) + r + rope) + D * Hm * c.v_head_dim) + 4 * r),
    'MLA attention': mlaLayers * 4 * Hm * (c.qk_nope_head_dim + c.v_head_dim) * r,
    'dense MLP': dense * 2 * 3 * D * c.intermediate_size,
    'MoE router': moeLayers * (2 * E * D + 4 * E),
    'MoE experts': moeLayers * 2 * 3 * D * Im * c.num_shared_experts, // + routed experts
    norms: L * 2 * D * 4 + D * 4,
    lm_head: 2 * c.vocab_size * D,
    embedding: 0,
  };
  const fixed = Object.values(fam).reduce((a, b) => a + b, 0);
  const perExpert = 2 * 3 * D * Im;
  // ≈ checkpoint bytes (embedding included)
  const stored = 2 * c.vocab_size * D + fixed - fam['MLA attention'] / 2 + moeLayers * E * perExpert;
  return {
    fam,
    fixed,
    perExpert,
    moeLayers,
    stored,
    kdaStatePerSeq: kdaLayers * H * d * d * 4,
    mlaRowBytes: mlaLayers * (r + rope) * 4,
  };
}

/** xorshift32 state shared by the generators below (deterministic per run). */
let rngState = 0x9e3779b9;

/** Random bf16 `[count]` with |w| in [2^e, 2^(e+1)), 2^e ≤ 1/sqrt(fanIn), random sign. */
function randomBf16(count, fanIn) {
  const e = Math.floor(Math.log2(1 / Math.sqrt(fanIn)));
  const expBits = (127 + e) << 7;
  const pair = ((expBits << 16) | expBits) >>> 0;
  const out = new Uint16Array(count + (count & 1));
  const words = new Uint32Array(out.buffer);
  let x = rngState;
  for (let i = 0; i < words.length; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    words[i] = ((x & 0x807f807f) | pair) >>> 0;
  }
  rngState = x >>> 0 || 1;
  return count & 1 ? out.subarray(0, count) : out;
}

const bf16 = (shape, fanIn) => ({
  dtype: 'BF16',
  shape,
  data: randomBf16(
    shape.reduce((a, b) => a * b, 1),
    fanIn,
  ),
});
const ones = (n) => ({ dtype: 'BF16', shape: [n], data: new Uint16Array(n).fill(0x3f80) });
const f32 = (shape, fill) => ({
  dtype: 'F32',
  shape,
  data: Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, (_, i) => fill(i)),
});

/** Tensors of decoder layer `l` (0-based), named as the Kimi loader reads them. */
function layerTensors(c, l) {
  const D = c.hidden_size;
  const p = `model.layers.${l}.`;
  const t = { [`${p}input_layernorm.weight`]: ones(D), [`${p}post_attention_layernorm.weight`]: ones(D) };
  const la = c.linear_attn_config;
  const a = `${p}self_attn.`;
  if (la.kda_layers.includes(l + 1)) {
    const H = la.num_heads;
    const d = la.head_dim;
    const HD = H * d;
    for (const n of ['q', 'k', 'v']) {
      t[`${a}${n}_proj.weight`] = bf16([HD, D], D);
      t[`${a}${n}_conv1d.weight`] = bf16([HD, 1, la.short_conv_kernel_size], la.short_conv_kernel_size);
    }
    t[`${a}f_a_proj.weight`] = bf16([d, D], D);
    t[`${a}g_a_proj.weight`] = bf16([d, D], D);
    t[`${a}b_proj.weight`] = bf16([H, D], D);
    t[`${a}f_b_proj.weight`] = bf16([HD, d], d);
    t[`${a}g_b_proj.weight`] = bf16([HD, d], d);
    t[`${a}A_log`] = f32([1, 1, H, 1], (i) => Math.log(1 + (15 * i) / Math.max(1, H - 1)));
    t[`${a}dt_bias`] = f32([HD], () => 0);
    t[`${a}o_norm.weight`] = ones(d);
    t[`${a}o_proj.weight`] = bf16([D, HD], HD);
  } else {
    const H = c.num_attention_heads;
    const r = c.kv_lora_rank;
    const rope = c.qk_rope_head_dim;
    t[`${a}q_proj.weight`] = bf16([H * (c.qk_nope_head_dim + rope), D], D);
    t[`${a}kv_a_proj_with_mqa.weight`] = bf16([r + rope, D], D);
    t[`${a}kv_a_layernorm.weight`] = ones(r);
    t[`${a}kv_b_proj.weight`] = bf16([H * (c.qk_nope_head_dim + c.v_head_dim), r], r);
    t[`${a}o_proj.weight`] = bf16([D, H * c.v_head_dim], H * c.v_head_dim);
  }
  if (l < c.first_k_dense_replace) {
    const I = c.intermediate_size;
    t[`${p}mlp.gate_proj.weight`] = bf16([I, D], D);
    t[`${p}mlp.up_proj.weight`] = bf16([I, D], D);
    t[`${p}mlp.down_proj.weight`] = bf16([D, I], I);
  } else {
    const m = `${p}block_sparse_moe.`;
    const I = c.moe_intermediate_size;
    const E = c.num_experts;
    t[`${m}gate.weight`] = bf16([E, D], D);
    t[`${m}gate.e_score_correction_bias`] = f32([E], () => 0);
    for (let e = 0; e < E; e++) {
      t[`${m}experts.${e}.w1.weight`] = bf16([I, D], D);
      t[`${m}experts.${e}.w3.weight`] = bf16([I, D], D);
      t[`${m}experts.${e}.w2.weight`] = bf16([D, I], I);
    }
    const Is = I * c.num_shared_experts;
    if (Is > 0) {
      t[`${m}shared_experts.gate_proj.weight`] = bf16([Is, D], D);
      t[`${m}shared_experts.up_proj.weight`] = bf16([Is, D], D);
      t[`${m}shared_experts.down_proj.weight`] = bf16([D, Is], Is);
    }
  }
  return t;
}

/**
 * Writes config.json + one safetensors shard per layer (embedding and head in their own shards) +
 * the index into `dir` (created if missing).
 * @returns {{ bytes: number }} bytes of tensor data written.
 */
export function writeSyntheticKimi(dir, config) {
  mkdirSync(dir, { recursive: true });
  const c = config;
  const D = c.hidden_size;
  const shards = [
    () => ({ 'model.embed_tokens.weight': bf16([c.vocab_size, D], D) }),
    ...Array.from({ length: c.num_hidden_layers }, (_, l) => () => layerTensors(c, l)),
    () => ({ 'model.norm.weight': ones(D), 'lm_head.weight': bf16([c.vocab_size, D], D) }),
  ];
  const weightMap = {};
  let bytes = 0;
  shards.forEach((make, i) => {
    const file = `model-${String(i + 1).padStart(5, '0')}-of-${String(shards.length).padStart(5, '0')}.safetensors`;
    const tensors = make();
    for (const [name, t] of Object.entries(tensors)) {
      weightMap[name] = file;
      bytes += t.data.byteLength;
    }
    writeSafetensors(join(dir, file), tensors);
  });
  writeFileSync(
    join(dir, 'model.safetensors.index.json'),
    JSON.stringify({ metadata: { total_size: bytes }, weight_map: weightMap }, null, 1),
  );
  writeFileSync(join(dir, 'config.json'), JSON.stringify(c, null, 2));
  return { bytes };
}
