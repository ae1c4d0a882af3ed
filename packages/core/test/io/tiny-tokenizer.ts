/**
 * A tiny byte-level BPE tokenizer (GPT-2 style) built in code for tests: 256 byte tokens, a few
 * merges ("hello", "Ġworld", "é"), five added tokens, a BOS-prepending post-processor.
 */

/** GPT-2's byte → printable-unicode-char table. */
export function bytesToUnicode(): string[] {
  const bs: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = [...bs];
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  }
  const table = new Array<string>(256);
  bs.forEach((b, i) => {
    table[b] = String.fromCodePoint(cs[i]!);
  });
  return table;
}

const MERGES: [string, string][] = [
  ['h', 'e'],
  ['l', 'l'],
  ['he', 'll'],
  ['hell', 'o'],
  ['Ġ', 'w'],
  ['o', 'r'],
  ['Ġw', 'or'],
  ['Ġwor', 'l'],
  ['Ġworl', 'd'],
  ['Ã', '©'], // "é" = C3 A9
];

export const SPECIALS = ['<|endoftext|>', '<s>', '</s>', '<|im_start|>', '<|im_end|>'] as const;

export interface TinyTokenizer {
  tokenizerJson: Record<string, unknown>;
  tokenizerConfig: Record<string, unknown>;
  generationConfig: Record<string, unknown>;
  ids: Record<string, number>;
}

export function tinyTokenizer(): TinyTokenizer {
  const byteChars = bytesToUnicode();
  const vocab: Record<string, number> = {};
  byteChars.forEach((c, i) => {
    vocab[c] = i;
  });
  let next = 256;
  for (const [a, b] of MERGES) vocab[a + b] = next++;
  const ids: Record<string, number> = { ...vocab };
  const addedTokens = SPECIALS.map((content) => {
    const id = next++;
    ids[content] = id;
    return { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true };
  });
  const bos = ids['<s>']!;
  const tokenizerJson = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: addedTokens,
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: {
      type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [
        { SpecialToken: { id: '<s>', type_id: 0 } },
        { Sequence: { id: 'A', type_id: 0 } },
        { Sequence: { id: 'B', type_id: 1 } },
      ],
      special_tokens: { '<s>': { id: '<s>', ids: [bos], tokens: ['<s>'] } },
    },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges: MERGES.map(([a, b]) => `${a} ${b}`),
    },
  };
  const tokenizerConfig = {
    bos_token: '<s>',
    eos_token: {
      __type: 'AddedToken',
      content: '</s>',
      lstrip: false,
      rstrip: false,
      normalized: false,
      single_word: false,
    },
    pad_token: '<|endoftext|>',
    clean_up_tokenization_spaces: false,
    chat_template: "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}",
  };
  const generationConfig = { bos_token_id: bos, eos_token_id: [ids['</s>']!, ids['<|im_end|>']!] };
  return { tokenizerJson, tokenizerConfig, generationConfig, ids };
}

/**
 * A tiny SentencePiece-style BPE (Llama-2 layout): `▁` for spaces via normalizer, byte fallback
 * tokens `<0x00>`…`<0xFF>` for characters outside the vocabulary, and a decoder that strips the
 * one leading space of the text (so decoding a window mid-stream differs from decoding the whole).
 */
export function tinyMetaspaceTokenizer(): TinyTokenizer {
  const vocab: Record<string, number> = { '<unk>': 0, '<s>': 1, '</s>': 2 };
  let next = 3;
  for (let b = 0; b < 256; b++) vocab[`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`] = next++;
  for (const c of ['▁', 'h', 'e', 'l', 'o', 'w', 'r', 'd']) vocab[c] = next++;
  const merges: [string, string][] = [
    ['▁', 'h'],
    ['e', 'l'],
    ['▁h', 'el'],
    ['l', 'o'],
    ['▁hel', 'lo'],
    ['▁', 'w'],
    ['o', 'r'],
    ['▁w', 'or'],
    ['l', 'd'],
    ['▁wor', 'ld'],
  ];
  for (const [a, b] of merges) vocab[a + b] ??= next++;
  const special = (id: number, content: string) => ({
    id,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  });
  const tokenizerJson = {
    version: '1.0',
    added_tokens: [special(0, '<unk>'), special(1, '<s>'), special(2, '</s>')],
    normalizer: {
      type: 'Sequence',
      normalizers: [
        { type: 'Prepend', prepend: '▁' },
        { type: 'Replace', pattern: { String: ' ' }, content: '▁' },
      ],
    },
    pre_tokenizer: null,
    post_processor: {
      type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [
        { SpecialToken: { id: '<s>', type_id: 0 } },
        { Sequence: { id: 'A', type_id: 0 } },
        { Sequence: { id: 'B', type_id: 1 } },
      ],
      special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } },
    },
    decoder: {
      type: 'Sequence',
      decoders: [
        { type: 'Replace', pattern: { String: '▁' }, content: ' ' },
        { type: 'ByteFallback' },
        { type: 'Fuse' },
        { type: 'Strip', content: ' ', start: 1, stop: 0 },
      ],
    },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: '<unk>',
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: true,
      byte_fallback: true,
      ignore_merges: false,
      vocab,
      merges: merges.map(([a, b]) => [a, b]),
    },
  };
  return {
    tokenizerJson,
    tokenizerConfig: { bos_token: '<s>', eos_token: '</s>', unk_token: '<unk>', clean_up_tokenization_spaces: false },
    generationConfig: {},
    ids: vocab,
  };
}
