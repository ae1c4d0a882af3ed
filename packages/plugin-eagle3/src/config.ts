/**
 * The EAGLE-3 checkpoint config (REFERENCE.md §5; oracle: tools/reference/specd_ref/eagle3.py
 * `Eagle3Config.from_hf`), in either of two layouts, and this method's branch of the specd config schema.
 *
 * - **EAGLE-3 layout** (SafeAILab/EAGLE, SpecForge): `architectures ["LlamaForCausalLMEagle3"]`, the
 *   Llama fields at the top level (`hidden_size`, `num_attention_heads`, `num_key_value_heads`,
 *   `head_dim`, `intermediate_size`, `vocab_size`, `rope_theta`, `rms_norm_eps`), `draft_vocab_size`,
 *   `eagle_config.eagle_aux_hidden_state_layer_ids` (or the same key at the top level). Weights are
 *   named `midlayer.*`.
 * - **speculators layout** (vLLM's `speculators` format): `speculators_model_type: "eagle3"`,
 *   `architectures ["Eagle3Speculator"]`, the Llama fields inside `transformer_layer_config`,
 *   `draft_vocab_size` and `eagle_aux_hidden_state_layer_ids` at the top level (or inside
 *   `transformer_layer_config`), `speculators_config.proposal_methods[]` (`speculative_tokens` of
 *   the `default_proposal_method`, else of the first entry) and `speculators_config.verifier`
 *   (informational). Weights may be named `layers.0.*` instead of `midlayer.*` (both accepted).
 *   `norm_before_residual` is honoured (the residual of the draft layer is `hidden_norm(g)` instead
 *   of `g`); its default is `false` in the EAGLE-3 layout (the reference) and `true` in the
 *   speculators layout (vLLM's default for that format). `norm_before_fc`, `fc_norm` and
 *   `norm_output` = true are rejected (not implemented; never approximated).
 *
 * Taps: `eagle_aux_hidden_state_layer_ids` are used as given — tap k = the residual stream
 * entering target layer k (REFERENCE.md §2; vLLM captures the same). They are required in both layouts.
 */

import {
  DRAFTER_DEVICES,
  DRAFT_WEIGHT_FORMATS,
  draftWeightFormat,
  type DraftWeightFormat,
  DrafterError,
  drafterDevice,
  type DrafterDevice,
  type DrafterSchema,
  type HfConfig,
  type StageInfo,
} from '@specd/core';

/** `config.json` `architectures` entries accepted: the EAGLE-3 layout and the speculators layout. */
export const EAGLE3_ARCHITECTURES: readonly string[] = Object.freeze(['LlamaForCausalLMEagle3', 'Eagle3Speculator']);

/**
 * Chain length (drafts per step) when neither the deployment config nor the checkpoint names one (the reference
 * run's).
 */
export const EAGLE3_DEFAULT_DRAFT_TOKENS = 6;

/**
 * Upper bounds of the sizes a checkpoint or a config may ask for (checkpoint sanity: an unbounded size is refused
 * at load, before the draft KV pool is sized by it): drafts per step (`speculative_tokens`, `num_draft_tokens`,
 * `tree.total_tokens`) and a tree's `top_k` and `depth` (a propose keeps top_k × depth temporary entries).
 */
export const EAGLE3_MAX_DRAFT_TOKENS = 256;
export const EAGLE3_MAX_TREE_TOP_K = 64;
export const EAGLE3_MAX_TREE_DEPTH = 64;

/** Which `config.json` layout a checkpoint uses. */
export type Eagle3Layout = 'eagle3' | 'speculators';

/** A validated EAGLE-3 config. */
export interface Eagle3Config {
  readonly layout: Eagle3Layout;
  readonly hiddenSize: number;
  readonly numHeads: number;
  readonly numKvHeads: number;
  readonly headDim: number;
  readonly intermediateSize: number;
  /** Target vocabulary size the checkpoint was made for. */
  readonly vocabSize: number;
  /** Rows of the draft `lm_head` (draft vocabulary; ids mapped to the target's by `d2t`). */
  readonly draftVocabSize: number;
  /** Tap ids, as given by `eagle_aux_hidden_state_layer_ids` (tap k = residual entering layer k). */
  readonly taps: readonly number[];
  readonly ropeTheta: number;
  readonly rmsNormEps: number;
  /** The draft layer's residual is `hidden_norm(g)` (true) or `g` (false, the reference). */
  readonly normBeforeResidual: boolean;
  /** Drafts per step named by the checkpoint (speculators `speculative_tokens`), if any. */
  readonly speculativeTokens?: number;
}

/**
 * A validated `tree` setting of the deployment config: EAGLE-2 dynamic tree, greedy sequences only
 * (refused at load on targets that cannot verify trees, e.g. with KDA layers: `StageInfo.treeVerificationBlocker`).
 */
export interface Eagle3TreeSettings {
  readonly topK: number;
  readonly depth: number;
  readonly totalTokens: number;
}

/** The deployment config's `drafter` branch, parsed (defaults not filled in). */
export interface Eagle3Settings {
  readonly numDraftTokens?: number;
  readonly tree?: Eagle3TreeSettings;
  /**
   * Where the draft model runs: `'auto'` (absent: on the target's GPU when the target stage runs on one, else on the
   * CPU), `'cpu'`, or `'cuda'` (refused at load for a target that is not on a GPU).
   */
  readonly device?: Eagle3Device;
  /**
   * Whether chain proposals carry per-draft `confidence` (the engine's verify budgets then cut them; default false:
   * every draft verified — see eagle3.ts, "Confidence", for why that is the default).
   */
  readonly confidence?: boolean;
  /**
   * The CPU draft model's weights: `'q8_0'` (quantized to GGUF Q8_0 at load, {@link EAGLE3_WEIGHT_FORMATS};
   * `'q8_0_int8'` with int8 activations) or `'bf16'` (the checkpoint's, `gemmBf16`). Absent: `'q8_0'` for a whole
   * draft model whose projections' input widths are multiples of 32, `'bf16'` for a tensor-parallel shard (loadShard)
   * or other widths; a drafter on the GPU is bf16.
   */
  readonly weights?: Eagle3WeightFormat;
}

/**
 * The draft model's weight formats on the CPU (the `weights` setting): `'bf16'`, or `'q8_0'` — its decoder layer's
 * q/k/v/o and MLP projections and its lm_head quantized at load to GGUF Q8_0 (core's `quantizeQ8_0`, 8.5 bits a
 * weight) and run by `@specd/native` `gemmQuant` with int16 activations: a draft step reads about half the bytes.
 * fc (the context projection, a few rows per committed token) follows in Q8_0 with int16 activations (core's
 * `projectionFormatOf`). Lossless either way: the drafts change a little (the rounding of the weights), the target's
 * verification does not.
 */
export const EAGLE3_WEIGHT_FORMATS: readonly Eagle3WeightFormat[] = DRAFT_WEIGHT_FORMATS;
export type Eagle3WeightFormat = DraftWeightFormat;

/** Where the EAGLE-3 draft model runs ({@link Eagle3Settings.device}; core's {@link DrafterDevice}). */
export type Eagle3Device = DrafterDevice;

/** The accepted values of the `device` setting (core's). */
export const EAGLE3_DEVICES: readonly Eagle3Device[] = DRAFTER_DEVICES;

/** The Llama fields of either layout (top level, or `transformer_layer_config`). */
function parseLlama(
  c: HfConfig,
): Omit<Eagle3Config, 'layout' | 'draftVocabSize' | 'taps' | 'normBeforeResidual' | 'speculativeTokens'> {
  const numHeads = c.requireInt('num_attention_heads', { min: 1 });
  const numKvHeads = c.optionalInt('num_key_value_heads', { min: 1 }) ?? numHeads;
  if (numHeads % numKvHeads !== 0)
    c.fail('num_key_value_heads', `expected a divisor of num_attention_heads = ${numHeads}, got ${numKvHeads}`);
  const hiddenSize = c.requireInt('hidden_size', { min: 1 });
  const headDim = c.optionalInt('head_dim', { min: 2 }) ?? hiddenSize / numHeads;
  if (!Number.isInteger(headDim) || headDim % 2 !== 0)
    c.fail('head_dim', `expected an even integer (RoPE), got ${headDim}`);
  const layers = c.optionalInt('num_hidden_layers', { min: 1 }) ?? 1;
  if (layers !== 1) c.fail('num_hidden_layers', `expected 1 (an EAGLE-3 draft has one decoder layer), got ${layers}`);
  const act = c.optionalString('hidden_act') ?? 'silu';
  if (act !== 'silu') c.fail('hidden_act', `expected "silu", got ${JSON.stringify(act)}`);
  if (c.has('rope_scaling')) c.fail('rope_scaling', 'RoPE scaling is not supported (plain RoPE only)');
  return {
    hiddenSize,
    numHeads,
    numKvHeads,
    headDim,
    intermediateSize: c.requireInt('intermediate_size', { min: 1 }),
    vocabSize: c.requireInt('vocab_size', { min: 1 }),
    ropeTheta: c.optionalNumber('rope_theta', { min: Number.MIN_VALUE }) ?? 10000,
    rmsNormEps: c.optionalNumber('rms_norm_eps', { min: 0 }) ?? 1e-6,
  };
}

function checkTaps(c: HfConfig, key: string, taps: number[]): number[] {
  if (taps.length === 0) c.fail(key, 'expected at least one layer id');
  if (new Set(taps).size !== taps.length) c.fail(key, `expected distinct ids, got [${taps.join(', ')}]`);
  return taps;
}

/**
 * The target taps an EAGLE-3 drafter reads (its `captureSetter`, CPU and GPU drafter alike): the config's taps.
 * @throws {DrafterError} naming the taps beyond the target's layers.
 */
export function eagle3Taps(config: Eagle3Config, target: StageInfo): readonly number[] {
  const bad = config.taps.filter((t) => t > target.numLayers);
  if (bad.length > 0)
    throw new DrafterError(
      `eagle3: captureSetter: taps [${bad.join(', ')}] are beyond the target's ${target.numLayers} layers`,
    );
  return config.taps;
}

/**
 * Validates an EAGLE-3 `config.json` in the EAGLE-3 or the speculators layout (module comment).
 * Both layouts of the same weights parse to the same config except `layout` (and
 * `speculativeTokens`, which only the speculators layout carries).
 * @throws {HfConfigError} naming the JSON path of the first bad field.
 */
export function parseEagle3Config(c: HfConfig): Eagle3Config {
  const archs = c.architectures;
  if (!archs.some((a) => EAGLE3_ARCHITECTURES.includes(a)))
    c.fail('architectures', `expected one of [${EAGLE3_ARCHITECTURES.join(', ')}], got [${archs.join(', ')}]`);
  const speculators = c.has('speculators_model_type') || archs.includes('Eagle3Speculator');
  if (!speculators) {
    const llama = parseLlama(c);
    const e = c.optionalSection('eagle_config');
    const taps =
      e?.has('eagle_aux_hidden_state_layer_ids') === true
        ? checkTaps(
            e,
            'eagle_aux_hidden_state_layer_ids',
            e.requireIntArray('eagle_aux_hidden_state_layer_ids', { min: 0 }),
          )
        : c.has('eagle_aux_hidden_state_layer_ids')
          ? checkTaps(
              c,
              'eagle_aux_hidden_state_layer_ids',
              c.requireIntArray('eagle_aux_hidden_state_layer_ids', { min: 0 }),
            )
          : c.fail(
              'eagle_config.eagle_aux_hidden_state_layer_ids',
              'required (the target layers whose input residuals the drafter reads)',
            );
    rejectNorms(c);
    return Object.freeze({
      layout: 'eagle3',
      ...llama,
      draftVocabSize: c.optionalInt('draft_vocab_size', { min: 1 }) ?? llama.vocabSize,
      taps: Object.freeze(taps),
      normBeforeResidual: c.optionalBoolean('norm_before_residual') ?? false,
    });
  }
  const type = c.requireString('speculators_model_type');
  if (type !== 'eagle3') c.fail('speculators_model_type', `expected "eagle3", got ${JSON.stringify(type)}`);
  const t = c.section('transformer_layer_config');
  const llama = parseLlama(t);
  const taps = c.has('eagle_aux_hidden_state_layer_ids')
    ? checkTaps(
        c,
        'eagle_aux_hidden_state_layer_ids',
        c.requireIntArray('eagle_aux_hidden_state_layer_ids', { min: 0 }),
      )
    : t.has('eagle_aux_hidden_state_layer_ids')
      ? checkTaps(
          t,
          'eagle_aux_hidden_state_layer_ids',
          t.requireIntArray('eagle_aux_hidden_state_layer_ids', { min: 0 }),
        )
      : c.fail(
          'eagle_aux_hidden_state_layer_ids',
          'required (the target layers whose input residuals the drafter reads)',
        );
  const targetHidden = c.optionalInt('target_hidden_size', { min: 1 });
  if (targetHidden !== undefined && targetHidden !== llama.hiddenSize) {
    c.fail(
      'target_hidden_size',
      `expected the draft hidden size ${llama.hiddenSize} (a projection between hidden sizes is not supported), ` +
        `got ${targetHidden}`,
    );
  }
  rejectNorms(c);
  let speculativeTokens: number | undefined;
  const s = c.optionalSection('speculators_config');
  if (s !== undefined) {
    const algo = s.optionalString('algorithm');
    if (algo !== undefined && algo !== 'eagle3') s.fail('algorithm', `expected "eagle3", got ${JSON.stringify(algo)}`);
    const raw = s.raw.proposal_methods ?? [];
    if (!Array.isArray(raw)) s.fail('proposal_methods', 'expected an array');
    const methods = raw as readonly unknown[];
    const wanted = s.optionalString('default_proposal_method');
    const i = Math.max(
      0,
      methods.findIndex(
        (m) => typeof m === 'object' && m !== null && (m as Record<string, unknown>).proposal_type === wanted,
      ),
    );
    const m = methods[i] as unknown;
    if (m !== undefined) {
      if (typeof m !== 'object' || m === null || Array.isArray(m))
        s.fail(`proposal_methods[${i}]`, 'expected an object');
      const k = (m as Record<string, unknown>).speculative_tokens;
      if (k !== undefined && k !== null) {
        if (!(Number.isSafeInteger(k) && (k as number) >= 1 && (k as number) <= EAGLE3_MAX_DRAFT_TOKENS))
          s.fail(
            `proposal_methods[${i}].speculative_tokens`,
            `expected an integer in [1, ${EAGLE3_MAX_DRAFT_TOKENS}], got ${JSON.stringify(k)}`,
          );
        speculativeTokens = k as number;
      }
    }
  }
  return Object.freeze({
    layout: 'speculators',
    ...llama,
    draftVocabSize:
      c.optionalInt('draft_vocab_size', { min: 1 }) ?? t.optionalInt('draft_vocab_size', { min: 1 }) ?? llama.vocabSize,
    taps: Object.freeze(taps),
    normBeforeResidual: c.optionalBoolean('norm_before_residual') ?? true,
    ...(speculativeTokens !== undefined ? { speculativeTokens } : {}),
  });
}

/** `norm_before_fc` / `fc_norm` / `norm_output` variants change the numerics; refused rather than approximated. */
function rejectNorms(c: HfConfig): void {
  for (const key of ['norm_before_fc', 'fc_norm', 'norm_output']) {
    if (c.optionalBoolean(key) === true)
      c.fail(key, 'true is not supported (only the plain EAGLE-3 layer: fc, then the decoder layer)');
  }
}

/**
 * Parses the deployment config's `drafter` object (already validated by {@link EAGLE3_SCHEMA}; checked again
 * here for direct callers).
 * @throws {DrafterError} on a bad field.
 */
export function parseEagle3Settings(settings: Readonly<Record<string, unknown>> | undefined): Eagle3Settings {
  if (settings === undefined) return {};
  const int = (v: unknown, where: string, max: number): number => {
    if (!(Number.isSafeInteger(v) && (v as number) >= 1 && (v as number) <= max))
      throw new DrafterError(`eagle3: settings.${where}: expected an integer in [1, ${max}], got ${JSON.stringify(v)}`);
    return v as number;
  };
  const out: {
    numDraftTokens?: number;
    tree?: Eagle3TreeSettings;
    device?: Eagle3Device;
    confidence?: boolean;
    weights?: Eagle3WeightFormat;
  } = {};
  if (settings.num_draft_tokens !== undefined)
    out.numDraftTokens = int(settings.num_draft_tokens, 'num_draft_tokens', EAGLE3_MAX_DRAFT_TOKENS);
  const tree = settings.tree;
  if (tree !== undefined) {
    if (typeof tree !== 'object' || tree === null || Array.isArray(tree))
      throw new DrafterError(`eagle3: settings.tree: expected an object, got ${JSON.stringify(tree)}`);
    const t = tree as Record<string, unknown>;
    out.tree = Object.freeze({
      topK: int(t.top_k, 'tree.top_k', EAGLE3_MAX_TREE_TOP_K),
      depth: int(t.depth, 'tree.depth', EAGLE3_MAX_TREE_DEPTH),
      totalTokens: int(t.total_tokens, 'tree.total_tokens', EAGLE3_MAX_DRAFT_TOKENS),
    });
  }
  const device = drafterDevice('eagle3', settings.device);
  if (device !== undefined) out.device = device;
  if (settings.confidence !== undefined) {
    if (typeof settings.confidence !== 'boolean')
      throw new DrafterError(
        `eagle3: settings.confidence: expected a boolean, got ${JSON.stringify(settings.confidence)}`,
      );
    out.confidence = settings.confidence;
  }
  const weights = draftWeightFormat('eagle3', settings.weights);
  if (weights !== undefined) out.weights = weights;
  return Object.freeze(out);
}

/** This method's branch of the specd config schema (JSON Schema draft 2020-12; validated elsewhere). */
export const EAGLE3_SCHEMA: DrafterSchema = Object.freeze({
  $id: 'specd:drafter/eagle3',
  type: 'object',
  required: ['method', 'path'],
  additionalProperties: false,
  properties: {
    method: { const: 'eagle3' },
    path: {
      type: 'string',
      description:
        'EAGLE-3 checkpoint directory (architectures ["LlamaForCausalLMEagle3"], ' +
        'or the speculators format ["Eagle3Speculator"])',
    },
    num_draft_tokens: {
      type: 'integer',
      minimum: 1,
      maximum: EAGLE3_MAX_DRAFT_TOKENS,
      description:
        "chain length, drafts per step at most (default: the checkpoint's speculative_tokens, " +
        `else ${EAGLE3_DEFAULT_DRAFT_TOKENS}); not used with tree`,
    },
    device: {
      enum: [...EAGLE3_DEVICES],
      description:
        'where the draft model runs: "auto" (default: on the GPU when the target runs on one, --device cuda; else ' +
        'the CPU), "cpu", or "cuda" (refused for a target on the CPU); trees are drafted on the CPU only',
    },
    confidence: {
      type: 'boolean',
      description:
        "chain proposals carry each draft's confidence (the largest probability of its step's distribution), so the " +
        "cost policy's verify budgets cut each proposal where its calibrated survival falls below the step's " +
        'threshold (default false: every proposed draft is verified; measured on SmolLM2: no faster at one ' +
        'sequence, and the cut made the cost policy over-predict drafting steps under load)',
    },
    weights: {
      enum: [...EAGLE3_WEIGHT_FORMATS],
      description:
        'the CPU draft model\'s weights: "q8_0" (the decoder layer\'s projections and the lm_head quantized to GGUF ' +
        'Q8_0 at load, int16 activations, and the context projection fc with them: a draft step reads about half ' +
        'the bytes; the drafts may change a little, ' +
        'the output does not), "q8_0_int8" (the same weights with int8 activations: half the dot-product work again) ' +
        'or "bf16" (as the checkpoint stores them). Default: "q8_0" on the CPU without tensor parallelism when every ' +
        'projection\'s input width is a multiple of 32, else "bf16"; the Q8_0 formats are refused with device ' +
        '"cuda" and under tensor parallelism',
    },
    tree: {
      type: 'object',
      additionalProperties: false,
      required: ['top_k', 'depth', 'total_tokens'],
      description:
        'EAGLE-2 dynamic tree drafting (greedy; all-attention targets only, refused on targets with KDA layers): ' +
        'top_k children per node, frontier = top_k nodes per depth, the total_tokens best nodes by cumulative ' +
        'log-prob; drafts per step at most = total_tokens. At temperature > 0 a chain of depth drafts is drafted ' +
        'instead (the engine verifies trees greedily only)',
      properties: {
        top_k: { type: 'integer', minimum: 1, maximum: EAGLE3_MAX_TREE_TOP_K },
        depth: { type: 'integer', minimum: 1, maximum: EAGLE3_MAX_TREE_DEPTH },
        total_tokens: { type: 'integer', minimum: 1, maximum: EAGLE3_MAX_DRAFT_TOKENS },
      },
    },
  },
});
