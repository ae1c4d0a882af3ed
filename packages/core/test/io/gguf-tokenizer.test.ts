/**
 * Tokenizer from GGUF metadata, and the real SmolLM2-135M-Instruct GGUF (fetched by
 * `npm run models:fetch`; those tests skip with a warning when it is absent, and fail under CI). Reference ids:
 * test/fixtures/smollm2-tokenizer-ids.json from tools/reference/gguf_tokenizer_check.py; reference
 * dequantized values: pip `gguf` (`gguf.dequantize`) on the same file, pinned below.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

import {
  ggufTokenizerSources,
  GgmlType,
  GgufFile,
  GgufValueType,
  tokenizerFromGguf,
  TokenizerError,
} from '../../src/io/index.js';
import { ChatTemplate } from '../../src/serve/chat-template.js';
import { buildGguf } from './gguf-builder.js';
import { skipWithoutFiles } from '../../../../test/require-files.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const GGUF_PATH = path.join(ROOT, 'models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf');
const FIXTURE = path.join(ROOT, 'test/fixtures/smollm2-tokenizer-ids.json');
const haveModel = !skipWithoutFiles('SmolLM2-135M-Instruct Q4_1 GGUF (models:fetch)', [GGUF_PATH]);

const CHATML =
  "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + " +
  "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

function tinyGguf(pre = 'smollm', model = 'gpt2'): GgufFile {
  const tokens = ['<|endoftext|>', '<|im_start|>', '<|im_end|>', 'a', 'b', 'Ġ', '1', '2', 'ab', 'Ġab', '<think>'];
  const types = [3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 4];
  const S = (v: string) => ({ t: GgufValueType.STRING, v }) as const;
  const U = (v: number) => ({ t: GgufValueType.UINT32, v }) as const;
  return GgufFile.fromBytes(
    buildGguf({
      metadata: [
        ['tokenizer.ggml.model', S(model)],
        ['tokenizer.ggml.pre', S(pre)],
        ['tokenizer.ggml.tokens', { t: GgufValueType.ARRAY, of: GgufValueType.STRING, v: tokens }],
        ['tokenizer.ggml.token_type', { t: GgufValueType.ARRAY, of: GgufValueType.INT32, v: types }],
        ['tokenizer.ggml.merges', { t: GgufValueType.ARRAY, of: GgufValueType.STRING, v: ['a b', 'Ġ ab'] }],
        ['tokenizer.ggml.bos_token_id', U(1)],
        ['tokenizer.ggml.eos_token_id', U(2)],
        ['tokenizer.ggml.unknown_token_id', U(0)],
        ['tokenizer.ggml.padding_token_id', U(2)],
        ['tokenizer.ggml.add_bos_token', { t: GgufValueType.BOOL, v: false }],
        ['tokenizer.chat_template', S(CHATML)],
      ],
    }),
    'tiny.gguf',
  );
}

describe('tokenizer from GGUF metadata (synthetic)', () => {
  it('builds a byte-level BPE tokenizer with control / user-defined added tokens', () => {
    const tok = tokenizerFromGguf(tinyGguf());
    expect(tok.vocabSize).toBe(11);
    expect([tok.bosTokenId, tok.eosTokenIds, tok.padTokenId]).toEqual([1, [2], 2]);
    expect([...tok.encode('ab ab', { addSpecialTokens: true })]).toEqual([8, 9]);
    // smollm: digits split one by one
    expect([...tok.encode('12', { addSpecialTokens: false })]).toEqual([6, 7]);
    expect([...tok.encode('<|im_start|>ab<think><|im_end|>', { addSpecialTokens: false })]).toEqual([1, 8, 10, 2]);
    expect(tok.isSpecial(1) && tok.isSpecial(0) && !tok.isSpecial(10)).toBe(true);
    expect(tok.decode([1, 8, 9, 2], { skipSpecialTokens: true })).toBe('ab ab');
    expect(tok.chatTemplate).toBe(CHATML);
  });

  it('applies the ChatML chat template', () => {
    const tok = tokenizerFromGguf(tinyGguf());
    const text = new ChatTemplate(tok.chatTemplate!).render([{ role: 'user', content: 'ab' }], true);
    expect(text).toBe('<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n');
    expect([...tok.encode(text, { addSpecialTokens: false })].filter((id) => id <= 2)).toEqual([1, 2, 1]);
  });

  it('refuses other tokenizer models and unknown pre-tokenizers', () => {
    expect(() => tokenizerFromGguf(tinyGguf('smollm', 'llama'))).toThrow(TokenizerError);
    expect(() => tokenizerFromGguf(tinyGguf('smollm', 'llama'))).toThrow(
      /tokenizer\.ggml\.model is "llama"; only "gpt2"/,
    );
    expect(() => tokenizerFromGguf(tinyGguf('qwen2'))).toThrow(/tokenizer\.ggml\.pre "qwen2" is not supported/);
    const plain = ggufTokenizerSources(tinyGguf('default'));
    expect((plain.tokenizerJson.pre_tokenizer as { type: string }).type).toBe('ByteLevel');
  });
});

describe.skipIf(!haveModel)('SmolLM2-135M-Instruct Q4_1 GGUF (models:fetch)', () => {
  const g = haveModel ? GgufFile.open(GGUF_PATH) : undefined!;

  it('header, hyper-parameters and tensor table', () => {
    expect(g.version).toBe(3);
    expect(g.alignment).toBe(32);
    expect(g.dataStartBytes).toBe(1785664);
    expect(g.getString('general.architecture')).toBe('llama');
    expect(g.getU32('llama.block_count')).toBe(30);
    expect(g.getU32('llama.embedding_length')).toBe(576);
    expect(g.getU32('llama.feed_forward_length')).toBe(1536);
    expect(g.getU32('llama.attention.head_count')).toBe(9);
    expect(g.getU32('llama.attention.head_count_kv')).toBe(3);
    expect(g.getU32('llama.context_length')).toBe(8192);
    expect(g.getF32('llama.rope.freq_base')).toBe(100000);
    expect(g.getF32('llama.attention.layer_norm_rms_epsilon')).toBe(Math.fround(1e-5));
    const list = g.tensors();
    expect(list.length).toBe(272);
    const count = (t: GgmlType) => list.filter((x) => x.type === t).length;
    expect([count(GgmlType.Q4_1), count(GgmlType.F32), count(GgmlType.Q8_0)]).toEqual([210, 61, 1]);
    expect(g.info('token_embd.weight')).toMatchObject({
      ggmlShape: [576, 49152],
      shape: [49152, 576],
      typeName: 'Q8_0',
      offsetBytes: 0,
      byteLength: 30081024,
    });
    expect(g.info('blk.0.ffn_down.weight')).toMatchObject({
      ggmlShape: [1536, 576],
      shape: [576, 1536],
      typeName: 'Q4_1',
      byteLength: 552960,
    });
  });

  // From pip gguf 0.x `dequantize(t.data, t.tensor_type)` (f32); sums in f64. Our values matched it
  // bit for bit on all elements of these tensors when this was written.
  const REF: Record<string, { first: number[]; last: number; sum: number; sumsq: number }> = {
    'token_embd.weight': {
      first: [-0.10654449462890625, 0.032978057861328125, 0.048198699951171875, -0.022830963134765625],
      last: -0.0417022705078125,
      sum: -15353.04449415207,
      sumsq: 520415.71544763993,
    },
    'blk.0.attn_norm.weight': {
      first: [0.01397705078125, 0.0238037109375, -0.019775390625, -0.0302734375],
      last: -0.038330078125,
      sum: 0.6129436492919922,
      sumsq: 0.9180835409024439,
    },
    'blk.0.ffn_down.weight': {
      first: [-0.330810546875, 0.3460693359375, 0.0753173828125, -0.4661865234375],
      last: -0.181365966796875,
      sum: 150.63577270507812,
      sumsq: 33220.11995097203,
    },
    'blk.0.attn_q.weight': {
      first: [-0.0963134765625, 0.1573486328125, -0.0963134765625, -0.73046875],
      last: -0.255859375,
      sum: 59.22322082519531,
      sumsq: 26749.573275085306,
    },
    'blk.29.ffn_up.weight': {
      first: [-0.128662109375, 0.06195068359375, -0.06512451171875, -0.3828125],
      last: 0.23858642578125,
      sum: 305.73268127441406,
      sumsq: 41023.198645859724,
    },
    'blk.7.attn_k.weight': {
      first: [-0.002532958984375, 0.321746826171875, -0.27276611328125, 0.051513671875],
      last: -0.0545654296875,
      sum: -47.49678039550781,
      sumsq: 4539.719853340415,
    },
  };
  it.each(Object.keys(REF))('dequantizes %s like pip gguf', (name) => {
    const ref = REF[name]!;
    const w = g.dequantize(name);
    expect([...w.subarray(0, 4)]).toEqual(ref.first);
    expect(w[w.length - 1]).toBe(ref.last);
    let sum = 0;
    let sumsq = 0;
    for (const v of w) {
      sum += v;
      sumsq += v * v;
    }
    expect(Math.abs(sum - ref.sum)).toBeLessThan(1e-9 * Math.max(1, ref.sumsq));
    expect(Math.abs(sumsq - ref.sumsq)).toBeLessThan(1e-9 * ref.sumsq);
  });

  interface Fixture {
    specialTokens: Record<string, string>;
    chat: { messages: { role: string; content: string }[]; addGenerationPrompt: boolean; rendered: string };
    cases: { text: string; ids: number[] }[];
  }
  const fixture = JSON.parse(fs.readFileSync(FIXTURE, 'utf8')) as Fixture;

  it('tokenizer ids match the reference on every fixture string', () => {
    const tok = tokenizerFromGguf(g);
    expect(tok.vocabSize).toBe(49152);
    expect([tok.bosTokenId, tok.eosTokenIds, tok.padTokenId]).toEqual([1, [2], 2]);
    expect(fixture.cases.length).toBeGreaterThanOrEqual(250);
    const mismatches: string[] = [];
    for (const { text, ids } of fixture.cases) {
      const ours = [...tok.encode(text, { addSpecialTokens: true })];
      if (JSON.stringify(ours) !== JSON.stringify(ids))
        mismatches.push(`${JSON.stringify(text)}: ours ${JSON.stringify(ours)} ref ${JSON.stringify(ids)}`);
      else expect(tok.decode(ours, { skipSpecialTokens: false })).toBe(text);
    }
    expect(mismatches.slice(0, 5), `${mismatches.length} of ${fixture.cases.length} differ`).toEqual([]);
  });

  it('renders the ChatML chat template like transformers', () => {
    const tok = tokenizerFromGguf(g);
    const t = new ChatTemplate(tok.chatTemplate!, {
      bos_token: fixture.specialTokens.bos_token,
      eos_token: fixture.specialTokens.eos_token,
    });
    const text = t.render(fixture.chat.messages, fixture.chat.addGenerationPrompt);
    expect(text).toBe(fixture.chat.rendered);
    expect(text).toBe(
      '<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n',
    );
    const noSystem = t.render([{ role: 'user', content: 'Hi' }], true);
    expect(noSystem).toBe(
      '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by ' +
        'Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n',
    );
  });
});
