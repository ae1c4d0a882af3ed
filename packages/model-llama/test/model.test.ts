// The Llama plugin on SmolLM2-135M-Instruct's GGUF (fetched by `npm run models:fetch`):
// - config from the GGUF metadata (REFERENCE.md §10), tensor-name mapping, errors;
// - batch invariance: a verify block's logits equal the same tokens decoded one by one, bit for
//   bit, and a sequence batched with another equals it alone (what lossless speculation needs);
// - commitPrefix keeps exactly the committed tokens' KV;
// - quantized projections (gemmQuant) vs bf16 panels dequantised at load agree to bf16 rounding;
// - the instruct model answers a ChatML question (a smoke test of the whole path; the per-layer
//   goldens from the PyTorch reference are in goldens.test.ts).
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { GgufFile, HfConfig, SequenceCache, tokenizerFromGguf, type Tokenizer } from '@specd/core';
import { argmax } from '@specd/native';

import {
  ggufSource,
  ggufTensorName,
  loadLlamaStage,
  parseGgufLlamaConfig,
  parseLlamaConfig,
  type LlamaStageModel,
} from '../src/index.js';
import { skipWithoutFiles } from '../../../test/require-files.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const GGUF = path.join(ROOT, 'models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf');
const HAVE = !skipWithoutFiles('SmolLM2-135M-Instruct (GGUF Q4_1)', [GGUF]);

describe('config', () => {
  it('parses a Llama config.json and names the bad field', () => {
    const base = {
      model_type: 'llama',
      hidden_size: 64,
      num_hidden_layers: 2,
      intermediate_size: 128,
      num_attention_heads: 4,
      num_key_value_heads: 2,
      vocab_size: 100,
    };
    const c = parseLlamaConfig(HfConfig.fromObject(base, 'c.json'));
    expect(c).toMatchObject({ headDim: 16, ropeTheta: 10000, ropeStyle: 'neox', tieWordEmbeddings: false });
    expect(() => parseLlamaConfig(HfConfig.fromObject({ ...base, num_key_value_heads: 3 }, 'c.json'))).toThrow(
      /num_key_value_heads.*must divide num_attention_heads \(4\), got 3/,
    );
    expect(() =>
      parseLlamaConfig(HfConfig.fromObject({ ...base, rope_scaling: { type: 'linear', factor: 2 } }, 'c.json')),
    ).toThrow(/rope_scaling.*not implemented/);
    expect(() => parseLlamaConfig(HfConfig.fromObject({ ...base, model_type: 'qwen2' }, 'c.json'))).toThrow(
      /model_type/,
    );
  });

  it('maps Hugging Face tensor names to GGUF names', () => {
    expect(ggufTensorName('model.layers.7.self_attn.k_proj.weight')).toBe('blk.7.attn_k.weight');
    expect(ggufTensorName('model.layers.0.post_attention_layernorm.weight')).toBe('blk.0.ffn_norm.weight');
    expect(ggufTensorName('model.embed_tokens.weight')).toBe('token_embd.weight');
    expect(() => ggufTensorName('model.layers.0.mlp.experts.0.weight')).toThrow(/no GGUF name/);
  });
});

describe.skipIf(!HAVE)('SmolLM2-135M-Instruct (GGUF Q4_1)', () => {
  let file: GgufFile;
  let model: LlamaStageModel;
  let tokenizer: Tokenizer;
  beforeAll(() => {
    file = GgufFile.open(GGUF);
    model = loadLlamaStage(parseGgufLlamaConfig(file), ggufSource(file, 'quant'));
    tokenizer = tokenizerFromGguf(file);
  });
  afterAll(() => model?.dispose());

  const cacheFor = (m: LlamaStageModel, ids: string[]) => {
    const c = new SequenceCache(m.cacheGeometry, { pageSize: 16, numPages: 64, numSlots: ids.length });
    for (const id of ids) c.add(id);
    return c;
  };

  it('reads the config from the metadata (REFERENCE.md §10)', () => {
    expect(model.config).toMatchObject({
      hiddenSize: 576,
      numLayers: 30,
      numHeads: 9,
      numKvHeads: 3,
      headDim: 64,
      intermediateSize: 1536,
      vocabSize: 49152,
      ropeTheta: 100000,
      ropeStyle: 'interleaved',
      tieWordEmbeddings: true,
    });
    expect(model.config.rmsNormEps).toBeCloseTo(1e-5, 12);
    expect(model.cacheGeometry.pagedKv).toEqual({
      layers: Array.from({ length: 60 }, (_, i) => i),
      floatsPerToken: 192,
      kvHeads: 3, // GQA: a row is 3 KV heads × 64, split by KV head under tensor parallelism
    });
  });

  it('a verify block gives bitwise the logits of decoding its tokens one by one, alone or batched', () => {
    const prompt = tokenizer.encode('The quick brown fox jumps over the lazy dog because', { addSpecialTokens: false });
    const block = Int32Array.from([279, 3050, 314, 253, 1542]);
    const V = model.info.vocabSize;
    // one by one
    const c1 = cacheFor(model, ['a']);
    model.forward({ sequences: [{ id: 'a', position: 0, tokens: prompt, logits: 'none' }] }, c1);
    const single: Float32Array[] = [];
    block.forEach((t, i) => {
      single.push(
        model.forward(
          { sequences: [{ id: 'a', position: prompt.length + i, tokens: Int32Array.of(t), logits: 'last' }] },
          c1,
        ).logits!,
      );
    });
    // as one block, batched with another sequence
    const c2 = cacheFor(model, ['a', 'b']);
    model.forward({ sequences: [{ id: 'a', position: 0, tokens: prompt, logits: 'none' }] }, c2);
    model.forward({ sequences: [{ id: 'b', position: 0, tokens: prompt.subarray(0, 4), logits: 'none' }] }, c2);
    const r = model.forward(
      {
        sequences: [
          { id: 'b', position: 4, tokens: Int32Array.of(11, 12, 13), logits: 'all' },
          { id: 'a', position: prompt.length, tokens: block, logits: 'all' },
        ],
      },
      c2,
    );
    block.forEach((_, i) => {
      const row = r.logits!.subarray((3 + i) * V, (4 + i) * V);
      expect(row.every((v, j) => Object.is(v, single[i]![j]))).toBe(true);
    });
  });

  it("argmaxOnly returns the asked rows' argmax instead of the logits, the same as the logits give", () => {
    const prompt = tokenizer.encode('The quick brown fox jumps over the lazy dog because', { addSpecialTokens: false });
    const block = Int32Array.from([279, 3050, 314, 253, 1542]);
    const V = model.info.vocabSize;
    const run = (argmaxOnly: boolean) => {
      const c = cacheFor(model, ['a', 'b']);
      model.forward({ sequences: [{ id: 'a', position: 0, tokens: prompt, logits: 'none' }] }, c);
      return model.forward(
        {
          sequences: [
            { id: 'b', position: 0, tokens: prompt.subarray(0, 4), logits: 'last' },
            { id: 'a', position: prompt.length, tokens: block, logits: 'all' },
          ],
        },
        c,
        { argmaxOnly },
      );
    };
    const full = run(false);
    const only = run(true);
    expect(only.logits).toBeUndefined();
    expect(Array.from(only.logitRowStart)).toEqual([0, 1, 6]);
    // the rows' argmax from the full logits; a forward after it reuses the kept logits buffer and changes nothing
    expect(Array.from(only.argmax!)).toEqual(Array.from(argmax(full.logits!, V)));
    const again = run(true);
    expect(Array.from(again.argmax!)).toEqual(Array.from(only.argmax!));
    expect(new Set(only.argmax).size).toBeGreaterThan(1);
  });

  it('commitPrefix keeps the committed tokens and the next token continues as if only they had been fed', () => {
    const prompt = tokenizer.encode('Once upon a time', { addSpecialTokens: false });
    const c = cacheFor(model, ['a', 'ref']);
    for (const id of ['a', 'ref'])
      model.forward({ sequences: [{ id, position: 0, tokens: prompt, logits: 'none' }] }, c);
    const res = model.forward(
      { sequences: [{ id: 'a', position: prompt.length, tokens: Int32Array.of(11, 12, 13, 14), logits: 'all' }] },
      c,
    );
    model.commitPrefix(c, res, 'a', 2);
    expect(c.length('a')).toBe(prompt.length + 2);
    model.forward(
      { sequences: [{ id: 'ref', position: prompt.length, tokens: Int32Array.of(11, 12), logits: 'none' }] },
      c,
    );
    const next = (id: string) =>
      model.forward({ sequences: [{ id, position: prompt.length + 2, tokens: Int32Array.of(99), logits: 'last' }] }, c)
        .logits!;
    expect(Array.from(next('a'))).toEqual(Array.from(next('ref')));
    expect(() => model.commitPrefix(c, res, 'a', 5)).toThrow(/committed: expected an integer in \[1, 4\]/);
  });

  it(
    "a token tree: every row's logits equal its root-to-row path " +
      'decoded as a chain (bitwise); commitTreePath keeps a path',
    () => {
      const prompt = tokenizer.encode('Once upon a time there was', { addSpecialTokens: false });
      const V = model.info.vocabSize;
      // root (row 0) = the last verified token; rows 1..6 a tree of drafts
      const tokens = Int32Array.from([264, 1184, 253, 1057, 314, 2623, 30]);
      const parents = Int32Array.from([-1, 0, 0, 1, 1, 2, 3]);
      const c = cacheFor(model, ['t', 'ref', 'chain']);
      for (const id of ['t', 'ref'])
        model.forward({ sequences: [{ id, position: 0, tokens: prompt, logits: 'none' }] }, c);
      const res = model.forward(
        { sequences: [{ id: 't', position: prompt.length, tokens, logits: 'all', tree: parents }] },
        c,
      );
      const pathOf = (r: number): number[] => (r < 0 ? [] : [...pathOf(parents[r]!), r]);
      for (let r = 0; r < tokens.length; r++) {
        const path = pathOf(r);
        const c2 = cacheFor(model, ['p']);
        model.forward({ sequences: [{ id: 'p', position: 0, tokens: prompt, logits: 'none' }] }, c2);
        const chain = model.forward(
          {
            sequences: [
              { id: 'p', position: prompt.length, tokens: Int32Array.from(path, (i) => tokens[i]!), logits: 'all' },
            ],
          },
          c2,
        ).logits!;
        const mine = res.logits!.subarray(r * V, (r + 1) * V);
        const theirs = chain.subarray((path.length - 1) * V, path.length * V);
        expect(
          mine.every((v, j) => Object.is(v, theirs[j])),
          `row ${r} (path ${path.join('→')})`,
        ).toBe(true);
      }
      // keep the path 0 → 1 → 3 → 6, then the next token must see exactly those tokens
      model.commitTreePath(c, res, 't', [0, 1, 3, 6]);
      expect(c.length('t')).toBe(prompt.length + 4);
      model.forward(
        {
          sequences: [
            {
              id: 'ref',
              position: prompt.length,
              tokens: Int32Array.from([0, 1, 3, 6], (i) => tokens[i]!),
              logits: 'none',
            },
          ],
        },
        c,
      );
      const next = (id: string) =>
        model.forward(
          { sequences: [{ id, position: prompt.length + 4, tokens: Int32Array.of(99), logits: 'last' }] },
          c,
        ).logits!;
      expect(Array.from(next('t'))).toEqual(Array.from(next('ref')));
      expect(() =>
        model.forward(
          {
            sequences: [
              {
                id: 'chain',
                position: 0,
                tokens: Int32Array.of(1, 2, 3),
                logits: 'all',
                tree: Int32Array.of(-1, 0, 2),
              },
            ],
          },
          c,
        ),
      ).toThrow(/tree\[2\]: expected a parent row in \[0, 2\), got 2/);
    },
  );

  it(
    'quantized projections agree with bf16 panels dequantised ' + 'at load (relative logit error < 1e-2, same argmax)',
    () => {
      const bf16 = loadLlamaStage(parseGgufLlamaConfig(file), ggufSource(file, 'bf16'));
      try {
        const prompt = tokenizer.encode('def fibonacci(n):\n    ', { addSpecialTokens: false });
        const run = (m: LlamaStageModel) =>
          m.forward({ sequences: [{ id: 'x', position: 0, tokens: prompt, logits: 'all' }] }, cacheFor(m, ['x']))
            .logits!;
        const a = run(model);
        const b = run(bf16);
        let num = 0;
        let den = 0;
        for (let i = 0; i < a.length; i++) {
          num += (a[i]! - b[i]!) ** 2;
          den += a[i]! ** 2;
        }
        const rel = Math.sqrt(num / den);
        console.log(`SmolLM2 quant vs bf16-at-load: relative logit error ${rel.toExponential(2)}`);
        expect(rel).toBeLessThan(1e-2);
        expect(rel).toBeGreaterThan(0); // they are different paths
        const V = model.info.vocabSize;
        expect(Array.from(argmax(a, V))).toEqual(Array.from(argmax(b, V)));
      } finally {
        bf16.dispose();
      }
    },
  );

  it('answers a ChatML question greedily', () => {
    const ids = tokenizer.encode(
      '<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n',
      { addSpecialTokens: false },
    );
    const c = cacheFor(model, ['q']);
    let logits = model.forward({ sequences: [{ id: 'q', position: 0, tokens: ids, logits: 'last' }] }, c).logits!;
    const out: number[] = [];
    for (let i = 0; i < 12; i++) {
      const t = argmax(logits, model.info.vocabSize)[0]!;
      out.push(t);
      logits = model.forward(
        { sequences: [{ id: 'q', position: ids.length + i, tokens: Int32Array.of(t), logits: 'last' }] },
        c,
      ).logits!;
    }
    expect(tokenizer.decode(out, { skipSpecialTokens: true })).toMatch(/Paris/);
  });
});
