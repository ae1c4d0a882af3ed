/**
 * Llama-family config (`model_type` "llama", `LlamaForCausalLM`), read from `config.json` with
 * {@link HfConfig} (every error names the file and JSON path), or synthesised from GGUF metadata
 * (gguf.ts). Semantics as HF transformers' LlamaConfig; SmolLM2-135M: REFERENCE.md §10.
 * Room for Qwen2/Qwen3 (q/k/v biases, per-head q/k RMSNorm) is kept in the config type; those
 * model types are refused until their goldens exist.
 */

import type { HfConfig } from '@specd/core';

/** Accepted `model_type` values. */
export const LLAMA_MODEL_TYPES = Object.freeze(['llama'] as const);
/** Accepted `architectures` entries. */
export const LLAMA_ARCHITECTURES = Object.freeze(['LlamaForCausalLM'] as const);

/**
 * Rotary layout of the q/k projection rows: `'neox'` (HF checkpoints: rotate_half over the two
 * halves of each head) or `'interleaved'` (GGUF from llama.cpp's converter, which permutes the
 * q/k rows so rotation pairs are adjacent). The two are the same model.
 */
export type LlamaRopeStyle = 'neox' | 'interleaved';

/** Validated, typed Llama config. Immutable. */
export interface LlamaConfig {
  readonly modelType: string;
  readonly vocabSize: number;
  readonly hiddenSize: number;
  readonly numLayers: number;
  readonly intermediateSize: number;
  readonly numHeads: number;
  readonly numKvHeads: number;
  readonly headDim: number;
  readonly ropeTheta: number;
  readonly ropeStyle: LlamaRopeStyle;
  readonly rmsNormEps: number;
  /** lm_head shares the embedding. */
  readonly tieWordEmbeddings: boolean;
  /** q/k/v projections carry a bias (Qwen2); false for Llama. */
  readonly attentionBias: boolean;
  readonly eosTokenIds: readonly number[];
  readonly bosTokenId: number | undefined;
}

/**
 * Validates and types a Llama config.
 * @param ropeStyle the q/k row layout of the weights that come with it (see {@link LlamaRopeStyle}).
 * @throws {HfConfigError} naming the field: wrong model_type, missing / mistyped fields, `hidden_act`
 *   not silu, heads not dividing hidden_size (without head_dim), KV heads not dividing heads,
 *   `rope_scaling` set (not implemented), `mlp_bias` or `attention_bias` true (not implemented).
 */
export function parseLlamaConfig(cfg: HfConfig, ropeStyle: LlamaRopeStyle = 'neox'): LlamaConfig {
  const modelType = cfg.requireOneOf('model_type', LLAMA_MODEL_TYPES);
  const pos = { min: 1 };
  const hiddenSize = cfg.requireInt('hidden_size', pos);
  const numHeads = cfg.requireInt('num_attention_heads', pos);
  const numKvHeads = cfg.optionalInt('num_key_value_heads', pos) ?? numHeads;
  if (numHeads % numKvHeads !== 0)
    cfg.fail('num_key_value_heads', `must divide num_attention_heads (${numHeads}), got ${numKvHeads}`);
  let headDim = cfg.optionalInt('head_dim', pos);
  if (headDim === undefined) {
    if (hiddenSize % numHeads !== 0)
      cfg.fail(
        'num_attention_heads',
        `must divide hidden_size (${hiddenSize}) when head_dim is absent, got ${numHeads}`,
      );
    headDim = hiddenSize / numHeads;
  }
  if (headDim % 2 !== 0) cfg.fail('head_dim', `must be even (rotary pairs), got ${headDim}`);
  const act = cfg.optionalString('hidden_act') ?? 'silu';
  if (act !== 'silu') cfg.fail('hidden_act', `must be "silu" (SwiGLU), got ${JSON.stringify(act)}`);
  if (cfg.has('rope_scaling') && cfg.raw.rope_scaling !== null)
    cfg.fail('rope_scaling', 'RoPE scaling is not implemented yet (must be null or absent)');
  if (cfg.optionalBoolean('mlp_bias') === true) cfg.fail('mlp_bias', 'MLP biases are not implemented (must be false)');
  if (cfg.optionalBoolean('attention_bias') === true)
    cfg.fail('attention_bias', 'attention biases are not implemented yet (must be false)');
  // a BOS / EOS id outside the vocabulary is a config error (checkpoint sanity): inside [0, vocab_size)
  const tokenId = { min: 0, max: cfg.requireInt('vocab_size', pos) - 1 };
  const ids = (key: string): number[] =>
    cfg.has(key) && cfg.raw[key] !== null
      ? Array.isArray(cfg.raw[key])
        ? cfg.requireIntArray(key, tokenId)
        : [cfg.requireInt(key, tokenId)]
      : [];
  const bos = ids('bos_token_id');
  return Object.freeze({
    modelType,
    vocabSize: cfg.requireInt('vocab_size', pos),
    hiddenSize,
    numLayers: cfg.requireInt('num_hidden_layers', pos),
    intermediateSize: cfg.requireInt('intermediate_size', pos),
    numHeads,
    numKvHeads,
    headDim,
    ropeTheta: cfg.optionalNumber('rope_theta', { min: 0 }) ?? 10000,
    ropeStyle,
    rmsNormEps: cfg.optionalNumber('rms_norm_eps', { min: 0 }) ?? 1e-6,
    tieWordEmbeddings: cfg.optionalBoolean('tie_word_embeddings') ?? false,
    attentionBias: false,
    eosTokenIds: Object.freeze(ids('eos_token_id')),
    bosTokenId: bos[0],
  });
}
