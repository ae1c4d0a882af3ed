/**
 * Kimi-K3 / Kimi-Linear config (`model_type` "kimi_k3" or "kimi_linear"), read from `config.json`
 * with {@link HfConfig} (every error names the file and JSON path). Field names as
 * moonshotai/Kimi-Linear-48B-A3B (test/fixtures/kimi-linear-48b-a3b/config.json); semantics as
 * tools/reference/specd_ref/kimi.py `KimiConfig.from_hf`.
 */

import type { HfConfig } from '@specd/core';

/** Accepted `model_type` values. */
export const KIMI_MODEL_TYPES = Object.freeze(['kimi_k3', 'kimi_linear'] as const);
/** Accepted `architectures` entries. */
export const KIMI_ARCHITECTURES = Object.freeze(['KimiLinearForCausalLM'] as const);

/** Kind of a decoder layer's token mixer. */
export type KimiLayerKind = 'kda' | 'mla';

/** Validated, typed Kimi config. Immutable. */
export interface KimiConfig {
  readonly modelType: string;
  readonly vocabSize: number;
  readonly hiddenSize: number;
  readonly numLayers: number;
  /** Dense MLP width (layers < firstKDenseReplace). */
  readonly intermediateSize: number;
  /** MLA heads. */
  readonly numHeads: number;
  /** MLA latent width r (`kv_lora_rank`). */
  readonly kvLoraRank: number;
  readonly qkNopeHeadDim: number;
  readonly qkRopeHeadDim: number;
  readonly vHeadDim: number;
  /** By absolute 0-based layer id; from `linear_attn_config.{kda_layers, full_attn_layers}` (1-based). */
  readonly layerKinds: readonly KimiLayerKind[];
  readonly kdaHeads: number;
  readonly kdaHeadDim: number;
  /** Short conv kernel (4); the conv state keeps kernel − 1 columns. */
  readonly convKernel: number;
  readonly numExperts: number;
  readonly expertsPerToken: number;
  readonly numSharedExperts: number;
  readonly moeIntermediateSize: number;
  readonly firstKDenseReplace: number;
  readonly routedScalingFactor: number;
  readonly moeRenormalize: boolean;
  readonly rmsNormEps: number;
  /** EOS id(s) from config.json (may be empty). */
  readonly eosTokenIds: readonly number[];
  /** lm_head shares the embedding (`tie_word_embeddings`, default false). */
  readonly tieWordEmbeddings: boolean;
}

/**
 * Validates and types a Kimi config.
 * @throws {HfConfigError} naming the field: wrong model_type, missing or mistyped fields,
 *   `mla_use_nope` not true, `q_lora_rank` not null, a router other than sigmoid, `hidden_act` not
 *   silu, `moe_layer_freq` or `num_expert_group` not 1 (absent = the default), layer lists that
 *   do not cover 1..num_hidden_layers exactly once, `num_experts_per_token` > `num_experts`.
 */
export function parseKimiConfig(cfg: HfConfig): KimiConfig {
  const modelType = cfg.requireOneOf('model_type', KIMI_MODEL_TYPES);
  const pos = { min: 1 };
  const numLayers = cfg.requireInt('num_hidden_layers', pos);
  const la = cfg.section('linear_attn_config');
  const kda = la.requireIntArray('kda_layers', { min: 1, max: numLayers });
  const full = la.requireIntArray('full_attn_layers', { min: 1, max: numLayers });
  const kinds: (KimiLayerKind | undefined)[] = new Array(numLayers).fill(undefined);
  for (const [list, kind, key] of [
    [kda, 'kda', 'kda_layers'],
    [full, 'mla', 'full_attn_layers'],
  ] as const) {
    for (const l of list) {
      if (kinds[l - 1] !== undefined)
        la.fail(
          key,
          `layer ${l} is listed twice (kda_layers ∪ full_attn_layers must list every layer 1..${numLayers} once)`,
        );
      kinds[l - 1] = kind;
    }
  }
  const missing = kinds.flatMap((k, i) => (k === undefined ? [i + 1] : []));
  if (missing.length > 0)
    la.fail('kda_layers', `layers [${missing.join(', ')}] are in neither kda_layers nor full_attn_layers`);
  if (cfg.requireBoolean('mla_use_nope') !== true)
    cfg.fail('mla_use_nope', "only mla_use_nope = true is implemented (Kimi-Linear's published setting)");
  if (cfg.has('q_lora_rank')) cfg.fail('q_lora_rank', 'must be null (Kimi-Linear has a plain q_proj)');
  const router = cfg.optionalString('moe_router_activation_func') ?? 'sigmoid';
  if (router !== 'sigmoid') cfg.fail('moe_router_activation_func', `must be "sigmoid", got ${JSON.stringify(router)}`);
  const act = cfg.optionalString('hidden_act') ?? 'silu';
  if (act !== 'silu') cfg.fail('hidden_act', `must be "silu" (SwiGLU experts), got ${JSON.stringify(act)}`);
  const freq = cfg.optionalInt('moe_layer_freq') ?? 1;
  if (freq !== 1)
    cfg.fail('moe_layer_freq', `only 1 is implemented (every layer from first_k_dense_replace on is MoE), got ${freq}`);
  const groups = cfg.optionalInt('num_expert_group') ?? 1;
  if (groups !== 1) cfg.fail('num_expert_group', `only 1 is implemented (no grouped top-k), got ${groups}`);
  const numExperts = cfg.requireInt('num_experts', pos);
  const expertsPerToken = cfg.requireInt('num_experts_per_token', pos);
  if (expertsPerToken > numExperts)
    cfg.fail('num_experts_per_token', `must be <= num_experts (${numExperts}), got ${expertsPerToken}`);
  // an EOS id the model cannot emit is a config error (checkpoint sanity): inside [0, vocab_size)
  const tokenId = { min: 0, max: cfg.requireInt('vocab_size', pos) - 1 };
  const eos = cfg.has('eos_token_id')
    ? Array.isArray(cfg.raw.eos_token_id)
      ? cfg.requireIntArray('eos_token_id', tokenId)
      : [cfg.requireInt('eos_token_id', tokenId)]
    : [];
  return Object.freeze({
    modelType,
    vocabSize: cfg.requireInt('vocab_size', pos),
    hiddenSize: cfg.requireInt('hidden_size', pos),
    numLayers,
    intermediateSize: cfg.requireInt('intermediate_size', pos),
    numHeads: cfg.requireInt('num_attention_heads', pos),
    kvLoraRank: cfg.requireInt('kv_lora_rank', pos),
    qkNopeHeadDim: cfg.requireInt('qk_nope_head_dim', pos),
    qkRopeHeadDim: cfg.requireInt('qk_rope_head_dim', { min: 0 }),
    vHeadDim: cfg.requireInt('v_head_dim', pos),
    layerKinds: Object.freeze(kinds as KimiLayerKind[]),
    kdaHeads: la.requireInt('num_heads', pos),
    kdaHeadDim: la.requireInt('head_dim', pos),
    convKernel: la.requireInt('short_conv_kernel_size', { min: 1 }),
    numExperts,
    expertsPerToken,
    numSharedExperts: cfg.requireInt('num_shared_experts', { min: 0 }),
    moeIntermediateSize: cfg.requireInt('moe_intermediate_size', pos),
    firstKDenseReplace: cfg.requireInt('first_k_dense_replace', { min: 0 }),
    routedScalingFactor: cfg.requireNumber('routed_scaling_factor', { min: 0 }),
    moeRenormalize: cfg.optionalBoolean('moe_renormalize') ?? true,
    rmsNormEps: cfg.requireNumber('rms_norm_eps', { min: 0 }),
    eosTokenIds: Object.freeze(eos),
    tieWordEmbeddings: cfg.optionalBoolean('tie_word_embeddings') ?? false,
  });
}
