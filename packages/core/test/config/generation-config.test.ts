// Sampling defaults as vLLM and OpenAI: per field the config's `sampling` value, else the model's
// generation_config.json (do_sample false: greedy), else OpenAI's (temperature 1, top_p 1, top_k off); a bad
// generation_config.json is refused naming the file and the field; the shipped models resolve as documented.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

import {
  ConfigError,
  describeSampling,
  loadConfig,
  modelFolder,
  readModelSamplingDefaults,
  resolveSamplingDefaults,
} from '../../src/config/index.js';
import { makeTempDir } from '../io/helpers.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const tmp = makeTempDir('generation-config');
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

let n = 0;
/** A model folder holding `generation_config.json` with `content` (a string is written as is). */
function modelWith(content: unknown): string {
  const dir = path.join(tmp, `m${n++}`);
  fs.mkdirSync(dir);
  fs.writeFileSync(
    path.join(dir, 'generation_config.json'),
    typeof content === 'string' ? content : JSON.stringify(content),
  );
  return dir;
}

describe('generation_config.json', () => {
  it('reads temperature, top_p, top_k and repetition_penalty; do_sample false is greedy; top_k <= 0 is off', () => {
    const dir = modelWith({ do_sample: true, temperature: 0.6, top_p: 0.95, top_k: 20, repetition_penalty: 1.05 });
    expect(readModelSamplingDefaults(dir)).toEqual({
      temperature: 0.6,
      top_p: 0.95,
      top_k: 20,
      repetition_penalty: 1.05,
    });
    expect(readModelSamplingDefaults(modelWith({ do_sample: false, temperature: 0.7, top_k: -1 }))).toEqual({
      temperature: 0,
      top_k: 0,
    });
    // eos ids and max_new_tokens are not sampling defaults
    expect(readModelSamplingDefaults(modelWith({ eos_token_id: 2, max_new_tokens: 50 }))).toEqual({});
    expect(readModelSamplingDefaults(path.join(tmp, 'no-such-model'))).toBeUndefined();
  });

  it('a .gguf file reads the generation_config.json beside it', () => {
    const dir = modelWith({ temperature: 0.3 });
    const gguf = path.join(dir, 'm.gguf');
    fs.writeFileSync(gguf, 'GGUF');
    expect(modelFolder(gguf)).toBe(dir);
    expect(readModelSamplingDefaults(gguf)).toEqual({ temperature: 0.3 });
  });

  it.each([
    [{ temperature: 3 }, /generation_config\.json: temperature: expected a number in \[0, 2\], got 3$/],
    [{ temperature: '0.2' }, /temperature: expected a number in \[0, 2\], got "0.2"$/],
    [{ top_p: 0 }, /top_p: expected a number in \(0, 1\], got 0$/],
    [{ top_k: 1.5 }, /top_k: expected an integer \(0 or less: off\), got 1.5$/],
    [{ repetition_penalty: 0 }, /repetition_penalty: expected a number > 0, got 0$/],
    [{ do_sample: 'yes' }, /do_sample: expected a boolean, got "yes"$/],
    [[1, 2], /generation_config\.json: expected a JSON object, got \[1,2\]$/],
    ['{"temperature": 0.2,}', /generation_config\.json: cannot read: /],
  ])('%j is refused naming the file and the field', (content, message) => {
    const dir = modelWith(content);
    let err: unknown;
    try {
      readModelSamplingDefaults(dir);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as Error).message.startsWith(path.join(dir, 'generation_config.json'))).toBe(true);
    expect((err as Error).message).toMatch(message);
  });
});

describe('resolveSamplingDefaults', () => {
  const model = modelWith({ do_sample: true, temperature: 0.2, top_p: 0.9, repetition_penalty: 1.2 });

  it("per field: the config's value, else generation_config.json, else OpenAI's", () => {
    expect(resolveSamplingDefaults({}, model)).toEqual({
      defaults: { temperature: 0.2, top_p: 0.9, top_k: 0, repetition_penalty: 1.2 },
      sources: { temperature: 'generation_config', top_p: 'generation_config', top_k: 'openai' },
    });
    expect(describeSampling(resolveSamplingDefaults({}, model))).toBe(
      'temperature 0.2 (generation_config), top_p 0.9 (generation_config), top_k 0 (openai), repetition_penalty 1.2',
    );
    // an explicit config value wins, 0 included; max_tokens and seed pass through
    expect(
      resolveSamplingDefaults({ temperature: 0, top_k: 5, repetition_penalty: 1, max_tokens: 7, seed: 3 }, model),
    ).toEqual({
      defaults: { temperature: 0, top_p: 0.9, top_k: 5, repetition_penalty: 1, max_tokens: 7, seed: 3 },
      sources: { temperature: 'config', top_p: 'generation_config', top_k: 'config' },
    });
    // no generation_config.json (or no model at all): OpenAI's temperature 1
    for (const m of [path.join(tmp, 'no-such-model'), undefined])
      expect(resolveSamplingDefaults({ top_p: 0.5 }, m)).toEqual({
        defaults: { temperature: 1, top_p: 0.5, top_k: 0 },
        sources: { temperature: 'openai', top_p: 'config', top_k: 'openai' },
      });
  });

  it('the shipped models: kimi-k3-tiny is greedy (do_sample false); an explicit config value wins', async () => {
    const tiny = path.join(ROOT, 'models/kimi-k3-tiny');
    expect(resolveSamplingDefaults({}, tiny).defaults).toEqual({ temperature: 0, top_p: 1, top_k: 0 });
    // configs/smollm2-eagle3.json sets temperature 0 itself: greedy whatever the model card recommends
    const { config } = await loadConfig(path.join(ROOT, 'configs/smollm2-eagle3.json'));
    expect(config.sampling).toEqual({ temperature: 0, top_p: 1, top_k: 0, max_tokens: 256 });
    expect(resolveSamplingDefaults(config.sampling, config.model).sources.temperature).toBe('config');
  });

  it.skipIf(!fs.existsSync(path.join(ROOT, 'models/smollm2-135m-instruct/generation_config.json')))(
    "SmolLM2 (npm run models:fetch): the model card's temperature 0.2, top_p 0.9 under configs/default.json",
    async () => {
      const { config } = await loadConfig(path.join(ROOT, 'configs/default.json'));
      expect(config.sampling).toEqual({});
      expect(resolveSamplingDefaults(config.sampling, config.model).defaults).toEqual({
        temperature: 0.2,
        top_p: 0.9,
        top_k: 0,
      });
    },
  );
});
