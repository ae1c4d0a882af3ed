/**
 * The DFlash checkpoint config (z-lab format, REFERENCE.md §3; oracle: tools/reference/specd_ref/dflash.py
 * `DFlashConfig.from_hf`) and this method's branch of the specd config schema.
 */

import {
  DRAFTER_DEVICES,
  DRAFT_WEIGHT_FORMATS,
  DrafterError,
  drafterDevice,
  type DrafterDevice,
  type DrafterSchema,
  type HfConfig,
  type StageInfo,
} from '@specd/core';

/** `config.json` `architectures` entries of a DFlash checkpoint. */
export const DFLASH_ARCHITECTURES: readonly string[] = Object.freeze(['DFlashDraftModel']);

/**
 * Largest `block_size` accepted (checkpoint sanity: an unbounded size is refused at load). DFlash checkpoints
 * use 16; 256 leaves room while keeping a block forward and its draft KV small.
 */
export const DFLASH_MAX_BLOCK_SIZE = 256;

/** Draft layer attention kind (`layer_types`). */
export type DFlashLayerType = 'full_attention' | 'sliding_attention';

/** A validated DFlash config. */
export interface DFlashConfig {
  readonly hiddenSize: number;
  readonly numLayers: number;
  readonly numHeads: number;
  readonly numKvHeads: number;
  readonly headDim: number;
  readonly intermediateSize: number;
  readonly vocabSize: number;
  /** Block length B: the last verified token + B − 1 mask slots → B − 1 drafts. */
  readonly blockSize: number;
  readonly maskTokenId: number;
  /** Checkpoint ids ("output of layer k"). */
  readonly targetLayerIds: readonly number[];
  /** Tap ids in the pinned convention: targetLayerIds + 1 (REFERENCE.md §2). */
  readonly taps: readonly number[];
  readonly layerTypes: readonly DFlashLayerType[];
  /** Window of sliding layers, positions (0 if none). */
  readonly slidingWindow: number;
  readonly ropeTheta: number;
  readonly rmsNormEps: number;
  /** `max_position_embeddings`: positions the draft model was trained for (undefined: no limit declared). */
  readonly maxPositionEmbeddings: number | undefined;
  /**
   * `dflash_config.draft_vocab_size`: the draft head's vocabulary (FR-Spec, arXiv 2502.14856), whose token ids the
   * checkpoint's `draft_vocab_ids` tensor lists; undefined = the whole target vocabulary. Verification always keeps
   * the whole vocabulary, so the output is unchanged (lossless).
   */
  readonly draftVocabSize: number | undefined;
}

/**
 * Validates a DFlash `config.json` (or one of a block drafter sharing its backbone: `architectures`
 * lists the accepted `architectures` entries, default {@link DFLASH_ARCHITECTURES}).
 * @throws {HfConfigError} naming the JSON path of the first bad field.
 */
export function parseDFlashConfig(c: HfConfig, architectures: readonly string[] = DFLASH_ARCHITECTURES): DFlashConfig {
  const archs = c.architectures;
  if (!archs.some((a) => architectures.includes(a)))
    c.fail('architectures', `expected one of [${architectures.join(', ')}], got [${archs.join(', ')}]`);
  const numLayers = c.requireInt('num_hidden_layers', { min: 1 });
  const numHeads = c.requireInt('num_attention_heads', { min: 1 });
  const numKvHeads = c.requireInt('num_key_value_heads', { min: 1 });
  if (numHeads % numKvHeads !== 0)
    c.fail('num_key_value_heads', `expected a divisor of num_attention_heads = ${numHeads}, got ${numKvHeads}`);
  const headDim = c.requireInt('head_dim', { min: 2 });
  if (headDim % 2 !== 0) c.fail('head_dim', `expected an even number (RoPE), got ${headDim}`);
  const d = c.section('dflash_config');
  const targetLayerIds = d.requireIntArray('target_layer_ids', { min: 0 });
  if (targetLayerIds.length === 0) d.fail('target_layer_ids', 'expected at least one layer id');
  if (new Set(targetLayerIds).size !== targetLayerIds.length)
    d.fail('target_layer_ids', `expected distinct ids, got [${targetLayerIds.join(', ')}]`);
  const layerTypes = c.optionalStringArray('layer_types') ?? Array<string>(numLayers).fill('full_attention');
  if (layerTypes.length !== numLayers)
    c.fail('layer_types', `expected ${numLayers} entries (num_hidden_layers), got ${layerTypes.length}`);
  layerTypes.forEach((t, i) => {
    if (t !== 'full_attention' && t !== 'sliding_attention')
      c.fail(`layer_types`, `entry ${i}: expected "full_attention" or "sliding_attention", got ${JSON.stringify(t)}`);
  });
  const slidingWindow = c.optionalInt('sliding_window', { min: 0 }) ?? 0;
  if (layerTypes.includes('sliding_attention') && slidingWindow < 1)
    c.fail('sliding_window', `expected >= 1 with sliding_attention layers, got ${slidingWindow}`);
  const blockSize = c.requireInt('block_size', { min: 2 });
  if (blockSize > DFLASH_MAX_BLOCK_SIZE)
    c.fail(
      'block_size',
      `expected at most ${DFLASH_MAX_BLOCK_SIZE} (a block is one forward of block_size rows per sequence, and the ` +
        `draft KV pool is sized by it), got ${blockSize}`,
    );
  const vocabSize = c.requireInt('vocab_size', { min: 1 });
  const draftVocabSize = d.optionalInt('draft_vocab_size', { min: 1 });
  if (draftVocabSize !== undefined && draftVocabSize > vocabSize)
    d.fail('draft_vocab_size', `expected at most vocab_size = ${vocabSize}, got ${draftVocabSize}`);
  return Object.freeze({
    hiddenSize: c.requireInt('hidden_size', { min: 1 }),
    numLayers,
    numHeads,
    numKvHeads,
    headDim,
    intermediateSize: c.requireInt('intermediate_size', { min: 1 }),
    vocabSize,
    blockSize,
    maskTokenId: d.requireInt('mask_token_id', { min: 0 }),
    targetLayerIds: Object.freeze(targetLayerIds),
    taps: Object.freeze(targetLayerIds.map((k) => k + 1)),
    layerTypes: Object.freeze(layerTypes as DFlashLayerType[]),
    slidingWindow,
    ropeTheta: c.optionalNumber('rope_theta', { min: Number.MIN_VALUE }) ?? 10000,
    rmsNormEps: c.optionalNumber('rms_norm_eps', { min: 0 }) ?? 1e-6,
    maxPositionEmbeddings: c.optionalInt('max_position_embeddings', { min: 1 }),
    draftVocabSize,
  });
}

/** The `weights` setting's JSON Schema (DFlash's and DSpark's config branches). */
export const DFLASH_WEIGHTS_SCHEMA = Object.freeze({
  enum: [...DRAFT_WEIGHT_FORMATS],
  description:
    'the CPU draft layers\' projections: "bf16" (as the checkpoint stores them), "q8_0" (q/k/v, o and the MLP ' +
    'quantized to GGUF Q8_0 at load, int16 activations: half the bytes and VNNI dot products) or "q8_0_int8" (the ' +
    'same weights with int8 activations: half the dot-product work again); the context projection (fc) follows: ' +
    'Q8_0 with int16 activations for either Q8_0 format. The drafts may change a little, the output does not. ' +
    'Default: "q8_0_int8" on an AVX-512 CPU without AMX, else "bf16". The Q8_0 formats not with device "cuda" or ' +
    'tensor parallelism',
});

/** This method's branch of the specd config schema (JSON Schema draft 2020-12; validated elsewhere). */
export const DFLASH_SCHEMA: DrafterSchema = Object.freeze({
  $id: 'specd:drafter/dflash',
  type: 'object',
  required: ['method', 'path'],
  additionalProperties: false,
  properties: {
    method: { const: 'dflash' },
    path: {
      type: 'string',
      description: 'DFlash checkpoint directory (z-lab format, architectures ["DFlashDraftModel"])',
    },
    num_draft_tokens: { type: 'integer', minimum: 1, description: 'drafts per step at most (default block_size − 1)' },
    draft_head: {
      enum: ['target', 'packed'],
      description:
        'the draft logits over the whole vocabulary: "target" (default) runs the target lm_head; "packed" a ' +
        'drafter-owned packed copy of it (bf16: vocab × hidden × 2 bytes more memory; Q8_0 with int8 activations on ' +
        'AVX-512 CPUs without AMX; faster where the target head ' +
        'is quantized). A checkpoint with draft_vocab_size packs its reduced head (unless draft_vocab is "whole")',
    },
    device: {
      enum: ['auto', 'cpu', 'cuda'],
      description:
        'where the draft model runs: "auto" (default: on the GPU when the target runs on one, --device cuda, and the ' +
        'draft layers are full-attention; else on the CPU), "cpu", or "cuda" (refused unless the target runs on a GPU)',
    },
    draft_vocab: {
      enum: ['checkpoint', 'whole'],
      description:
        'the draft head\'s vocabulary: "checkpoint" (default) the reduced one the checkpoint lists ' +
        '(dflash_config.draft_vocab_size, FR-Spec), if any; "whole" the whole vocabulary even then',
    },
    weights: DFLASH_WEIGHTS_SCHEMA,
    confidence: {
      type: 'boolean',
      description:
        "proposals carry each draft's confidence (the largest probability of its position's draft distribution), " +
        "so the cost policy's verify budgets verify only the drafts whose calibrated survival clears the step's " +
        'threshold (default true; false: every proposed draft is verified). The CPU drafter only',
    },
  },
});

/** The accepted values of the `device` setting (core's). */
export const DFLASH_DEVICES: readonly DrafterDevice[] = DRAFTER_DEVICES;

/**
 * The `device` setting (undefined: `"auto"`), checked again here for callers that bypass the schema.
 * @throws {DrafterError} naming the setting and the accepted values.
 */
export function dflashDevice(value: unknown): DrafterDevice {
  return drafterDevice('dflash', value) ?? 'auto';
}

/**
 * The `confidence` setting checked again here for callers that bypass the schema (undefined stays undefined: the
 * drafter's default, `DFlashDrafter.confidence`); `method` names the drafter in the error (DSpark's setting too).
 * @throws {DrafterError} naming the setting when it is not a boolean.
 */
export function dflashConfidence(value: unknown, method = 'dflash'): boolean | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== 'boolean')
    throw new DrafterError(`${method}: settings.confidence: expected a boolean, got ${JSON.stringify(value)}`);
  return value;
}

/**
 * The target taps a DFlash drafter reads (its `captureSetter`): `config.taps`.
 * @throws {DrafterError} naming the taps beyond the target's layers.
 */
export function dflashTaps(config: DFlashConfig, target: StageInfo): readonly number[] {
  const bad = config.taps.filter((t) => t > target.numLayers);
  if (bad.length > 0)
    throw new DrafterError(
      `dflash: captureSetter: taps [${bad.join(', ')}] are beyond the target's ${target.numLayers} layers`,
    );
  return config.taps;
}
