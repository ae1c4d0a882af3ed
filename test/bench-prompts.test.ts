// bench/prompts.mjs: the two prompt sets of each target and the default sampling the benches run.
import { describe, expect, it } from 'vitest';

// a plain ES module of the benches (no declarations; vitest transpiles without type-checking)
import * as bp from '../bench/prompts.mjs';

describe('defaultSampling', () => {
  it("maps generation_config.json's fields to the engine's sampling, unset ones at the engine's defaults", () => {
    expect(bp.defaultSampling({ temperature: 0.2, top_p: 0.9 })).toEqual({ temperature: 0.2, topP: 0.9, topK: 0 });
    expect(bp.defaultSampling({ temperature: 0.7, top_k: 40 })).toEqual({ temperature: 0.7, topP: 1, topK: 40 });
    expect(bp.defaultSampling(undefined)).toEqual({ temperature: 1, topP: 1, topK: 0 });
  });
});

describe('promptSets', () => {
  it('reads the two sets of each target and refuses another', () => {
    const [chat, plain] = bp.promptSets('smollm2');
    expect(chat.length).toBe(32);
    expect(plain.length).toBe(32);
    expect(Array.isArray(chat[0].prompt_token_ids)).toBe(true);
    expect(bp.promptSets('kimi').map((s: unknown[]) => s.length > 0)).toEqual([true, true]);
    expect(() => bp.promptSets('llama')).toThrow(/smollm2 or kimi/);
  });
});
