/**
 * The DSpark checkpoint config: a DFlash (z-lab format) config with `architectures
 * ["DSparkDraftModel"]` and a `dspark_config` section (oracle: tools/reference/specd_ref/dflash.py
 * `DFlashConfig.from_hf`), and this method's branch of the specd config schema.
 */

import type { DrafterSchema, HfConfig } from '@specd/core';
import { DFLASH_WEIGHTS_SCHEMA, parseDFlashConfig, type DFlashConfig } from '@specd/plugin-dflash';

/** `config.json` `architectures` entries of a DSpark checkpoint. */
export const DSPARK_ARCHITECTURES: readonly string[] = Object.freeze(['DSparkDraftModel']);

/** A validated DSpark config: the DFlash backbone's plus the Markov head's rank. */
export interface DSparkConfig extends DFlashConfig {
  /** Rank r of the Markov head (`markov_head.embed [V, r]`, `markov_head.proj [V, r]`). */
  readonly markovRank: number;
}

/**
 * Validates a DSpark `config.json`.
 * @throws {HfConfigError} naming the JSON path of the first bad field.
 */
export function parseDSparkConfig(c: HfConfig): DSparkConfig {
  const base = parseDFlashConfig(c, DSPARK_ARCHITECTURES);
  const d = c.section('dspark_config');
  const markovRank = d.requireInt('markov_rank', { min: 1 });
  const slots = d.optionalString('slot_semantics');
  if (slots !== undefined && slots !== 'next_token')
    d.fail('slot_semantics', `expected "next_token", got ${JSON.stringify(slots)}`);
  return Object.freeze({ ...base, markovRank });
}

/** This method's branch of the specd config schema (JSON Schema draft 2020-12; validated elsewhere). */
export const DSPARK_SCHEMA: DrafterSchema = Object.freeze({
  $id: 'specd:drafter/dspark',
  type: 'object',
  required: ['method', 'path'],
  additionalProperties: false,
  properties: {
    method: { const: 'dspark' },
    path: {
      type: 'string',
      description: 'DSpark checkpoint directory (z-lab format, architectures ["DSparkDraftModel"])',
    },
    num_draft_tokens: {
      type: 'integer',
      minimum: 1,
      description:
        'a fixed draft length: drafts per step (default: the cost policy with adaptive verify budgets; a fixed ' +
        'length turns both off)',
    },
    context_only: {
      type: 'boolean',
      default: false,
      description:
        'context-KV-only mode for a prefill-only producer: load only the projection (fc, hidden_norm) and ' +
        "each layer's k/v projections and k_norm; the drafter never drafts",
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
        "proposals carry the confidence head's per-draft confidence, so the cost policy's verify budgets verify " +
        "only the drafts whose calibrated survival clears the step's threshold (default true; false: every proposed " +
        'draft is verified)',
    },
  },
});
