/** This method's settings and its branch of the specd config schema. */
import type { DrafterSchema } from '@specd/core';

/** The method name (the config's `drafter.method`). */
export const PROMPT_LOOKUP_METHOD = 'prompt-lookup';

/** Validated settings of a prompt-lookup drafter. */
export interface PromptLookupSettings {
  /** Drafts per step at most (k). */
  readonly numDraftTokens: number;
  /** Shortest n-gram tried. */
  readonly minNgram: number;
  /** Longest n-gram tried first. */
  readonly maxNgram: number;
}

export const DEFAULT_SETTINGS: PromptLookupSettings = Object.freeze({ numDraftTokens: 4, minNgram: 1, maxNgram: 4 });

/**
 * The schema branch (JSON Schema 2020-12); core validates the config with it. Absent fields: {@link DEFAULT_SETTINGS}
 * (parseSettings).
 */
export const PROMPT_LOOKUP_SCHEMA: DrafterSchema = Object.freeze({
  $id: 'specd:drafter/prompt-lookup',
  type: 'object',
  required: ['method'],
  additionalProperties: false,
  properties: {
    method: { const: PROMPT_LOOKUP_METHOD },
    num_draft_tokens: { type: 'integer', minimum: 1, maximum: 64, description: 'drafts per step at most (k)' },
    min_ngram: { type: 'integer', minimum: 1, description: 'shortest suffix n-gram looked up' },
    max_ngram: { type: 'integer', minimum: 1, description: 'longest suffix n-gram looked up (tried first)' },
  },
});

/**
 * Settings from the config's `drafter` object (absent fields take {@link DEFAULT_SETTINGS}; already schema-validated
 * when it comes from a config file; checked again here for callers in code).
 * @throws {RangeError} on a bad value.
 */
export function parseSettings(raw: Readonly<Record<string, unknown>> | undefined): PromptLookupSettings {
  const get = (key: string, fallback: number, min: number): number => {
    const v = raw?.[key] ?? fallback;
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min)
      throw new RangeError(`prompt-lookup: ${key}: expected an integer >= ${min}, got ${JSON.stringify(v)}`);
    return v;
  };
  const numDraftTokens = get('num_draft_tokens', DEFAULT_SETTINGS.numDraftTokens, 1);
  const minNgram = get('min_ngram', DEFAULT_SETTINGS.minNgram, 1);
  const maxNgram = get('max_ngram', Math.max(DEFAULT_SETTINGS.maxNgram, minNgram), 1);
  if (maxNgram < minNgram) throw new RangeError(`prompt-lookup: max_ngram (${maxNgram}) < min_ngram (${minNgram})`);
  return Object.freeze({ numDraftTokens, minNgram, maxNgram });
}
