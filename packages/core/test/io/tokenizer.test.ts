import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

import { Tokenizer, TokenizerError } from '../../src/io/index.js';
import { makeTempDir, prng } from './helpers.js';
import { tinyMetaspaceTokenizer, tinyTokenizer } from './tiny-tokenizer.js';

const dir = makeTempDir('tok');
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const tiny = tinyTokenizer();
const { ids } = tiny;
const tok = new Tokenizer({ ...tiny, label: 'tiny' });
const TEXT = 'hello world héllo 😀 世界 <|im_end|> hello';

describe('Tokenizer (tiny byte-level BPE)', () => {
  it('encodes with the merges and optional BOS', () => {
    const plain = tok.encode('hello world', { addSpecialTokens: false });
    expect(plain).toBeInstanceOf(Int32Array);
    expect(Array.from(plain)).toEqual([ids.hello, ids.Ġworld]);
    expect(Array.from(tok.encode('hello world', { addSpecialTokens: true }))).toEqual([
      ids['<s>'],
      ids.hello,
      ids.Ġworld,
    ]);
    // "é" is one merged token, "😀" four byte tokens; added tokens are matched whole.
    const e = Array.from(tok.encode('é😀<|im_end|>', { addSpecialTokens: false }));
    expect(e[0]).toBe(ids['Ã©']);
    expect(e).toHaveLength(1 + 4 + 1);
    expect(e[5]).toBe(ids['<|im_end|>']);
  });

  it('decodes back to the text, optionally skipping special tokens', () => {
    const enc = tok.encode(TEXT, { addSpecialTokens: true });
    expect(tok.decode(enc, { skipSpecialTokens: false })).toBe(`<s>${TEXT}`);
    expect(tok.decode(enc, { skipSpecialTokens: true })).toBe(TEXT.replace('<|im_end|>', ''));
    expect(tok.decode([], { skipSpecialTokens: false })).toBe('');
    expect(tok.decode(Array.from(enc), { skipSpecialTokens: false })).toBe(`<s>${TEXT}`);
  });

  it('rejects ids outside the vocabulary, naming the position', () => {
    expect(() => tok.decode([ids.hello!, tok.vocabSize], { skipSpecialTokens: false })).toThrow(TokenizerError);
    expect(() => tok.decode([-1], { skipSpecialTokens: false })).toThrow(/ids\[0\] = -1/);
    expect(() => tok.decode([1.5], { skipSpecialTokens: false })).toThrow(TokenizerError);
  });

  it('maps tokens and ids, and knows its special tokens', () => {
    expect(tok.vocabSize).toBe(256 + 10 + 5);
    expect(tok.tokenToId('Ġworld')).toBe(ids.Ġworld);
    expect(tok.idToToken(ids.Ġworld!)).toBe('Ġworld');
    expect(tok.idToToken(ids['</s>']!)).toBe('</s>');
    expect(tok.tokenToId('nope')).toBeUndefined();
    expect(tok.idToToken(99999)).toBeUndefined();
    expect(tok.bosTokenId).toBe(ids['<s>']);
    expect(tok.padTokenId).toBe(ids['<|endoftext|>']);
    expect(tok.eosTokenIds).toEqual([ids['</s>'], ids['<|im_end|>']]);
    expect(tok.isEos(ids['<|im_end|>']!)).toBe(true);
    expect(tok.isEos(ids.hello!)).toBe(false);
    expect(tok.isSpecial(ids['<|im_start|>']!)).toBe(true);
    expect(tok.chatTemplate).toContain('<|im_start|>');
    expect(tok.chatTemplates.default).toBe(tok.chatTemplate);
  });

  it('streams text token by token without splitting UTF-8 characters', () => {
    const enc = Array.from(tok.encode(TEXT, { addSpecialTokens: false }));
    const detok = tok.createDetokenizer({ skipSpecialTokens: false });
    const deltas: string[] = [];
    for (const id of enc) deltas.push(detok.push(id));
    deltas.push(detok.flush());
    expect(deltas.join('')).toBe(TEXT);
    expect(detok.text).toBe(TEXT);
    for (const d of deltas) expect(d).not.toContain('\uFFFD');
    // The emoji's first three byte tokens emit nothing; the fourth emits the whole character.
    const emojiStart = enc.indexOf(tok.encode('😀', { addSpecialTokens: false })[0]!);
    expect(deltas.slice(emojiStart, emojiStart + 3)).toEqual(['', '', '']);
    expect(deltas[emojiStart + 3]).toBe('😀');
  });

  it('streams in random chunks (as accepted draft tokens arrive) with prompt context', () => {
    const rand = prng(7);
    const prompt = tok.encode('hello', { addSpecialTokens: true });
    const enc = Array.from(tok.encode(TEXT, { addSpecialTokens: false }));
    for (let trial = 0; trial < 20; trial++) {
      const detok = tok.createDetokenizer({ skipSpecialTokens: true, promptIds: prompt });
      let out = '';
      for (let i = 0; i < enc.length; ) {
        const k = 1 + Math.floor(rand() * 4);
        out += detok.push(enc.slice(i, i + k));
        i += k;
      }
      out += detok.flush();
      expect(out).toBe(TEXT.replace('<|im_end|>', ''));
      expect(detok.numGenerated).toBe(enc.length);
    }
  });

  it('flush emits an incomplete trailing character as U+FFFD', () => {
    const bytes = tok.encode('😀', { addSpecialTokens: false });
    const detok = tok.createDetokenizer({ skipSpecialTokens: false });
    expect(detok.push(bytes.subarray(0, 2))).toBe('');
    expect(detok.flush()).toContain('\uFFFD');
  });
});

describe('Tokenizer.load', () => {
  it('loads tokenizer.json, tokenizer_config.json, generation_config.json and chat_template.jinja', () => {
    fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tiny.tokenizerJson));
    fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(tiny.tokenizerConfig));
    fs.writeFileSync(path.join(dir, 'generation_config.json'), JSON.stringify({ eos_token_id: ids['<|endoftext|>'] }));
    fs.writeFileSync(path.join(dir, 'chat_template.jinja'), '{{ messages }}');
    const t = Tokenizer.load(dir);
    expect(t.eosTokenIds).toEqual([ids['<|endoftext|>'], ids['</s>']]);
    expect(t.chatTemplate).toBe('{{ messages }}');
    expect(t.decode(t.encode('hello world', { addSpecialTokens: false }), { skipSpecialTokens: true })).toBe(
      'hello world',
    );
  });

  it('names the missing or malformed file', () => {
    const empty = path.join(dir, 'empty');
    fs.mkdirSync(empty);
    expect(() => Tokenizer.load(empty)).toThrow(/tokenizer\.json: file is missing/);
    fs.writeFileSync(path.join(empty, 'tokenizer.json'), '{"model": ');
    expect(() => Tokenizer.load(empty)).toThrow(/tokenizer\.json: not valid JSON/);
    fs.writeFileSync(path.join(empty, 'tokenizer.json'), '{"model": {"type": "Nope"}}');
    expect(() => Tokenizer.load(empty)).toThrow(TokenizerError);
  });

  it('rejects special tokens not in the vocabulary and bad generation_config ids', () => {
    expect(() => new Tokenizer({ ...tiny, tokenizerConfig: { eos_token: '<nope>' } })).toThrow(
      /eos_token "<nope>" is not in the vocabulary/,
    );
    expect(() => new Tokenizer({ ...tiny, generationConfig: { eos_token_id: [1e9] } })).toThrow(
      /generation_config.eos_token_id/,
    );
  });
});

describe('Tokenizer (tiny SentencePiece-style BPE with byte fallback)', () => {
  const sp = tinyMetaspaceTokenizer();
  const t = new Tokenizer({ ...sp, label: 'tiny-sp' });
  const text = 'hello world é😀 hello';

  it('round-trips through byte fallback', () => {
    const enc = t.encode(text, { addSpecialTokens: true });
    expect(enc[0]).toBe(1);
    expect(Array.from(enc)).toContain(sp.ids['▁hello']);
    expect(Array.from(enc)).toContain(sp.ids['<0xF0>']);
    expect(t.decode(enc, { skipSpecialTokens: true })).toBe(text);
  });

  it('streams without losing spaces at window starts or splitting characters', () => {
    const gen = Array.from(t.encode(text, { addSpecialTokens: false }));
    const detok = t.createDetokenizer({ skipSpecialTokens: true });
    const deltas = gen.map((id) => detok.push(id));
    expect(deltas.join('') + detok.flush()).toBe(text);
    for (const d of deltas) expect(d).not.toContain('\uFFFD');
    expect(deltas[1]).toBe(' world');
  });

  it('with prompt context, the first generated word keeps its leading space', () => {
    const prompt = t.encode('hello', { addSpecialTokens: true });
    const gen = Array.from(t.encode('hello world', { addSpecialTokens: false }));
    const detok = t.createDetokenizer({ skipSpecialTokens: true, promptIds: prompt });
    const out = gen.map((id) => detok.push(id)).join('') + detok.flush();
    const full = t.decode([...prompt, ...gen], { skipSpecialTokens: true });
    const promptText = t.decode(prompt, { skipSpecialTokens: true });
    expect(out).toBe(full.slice(promptText.length));
    expect(out).toBe(' hello world');
  });
});
