/**
 * A {@link Tokenizer} from a GGUF file's `tokenizer.*` metadata: rebuilds the HF `tokenizer.json`
 * and `tokenizer_config.json` objects that the checkpoint's own files would hold.
 *
 * Supported: `tokenizer.ggml.model == "gpt2"` (byte-level BPE). Keys read (GGUF spec
 * github.com/ggml-org/ggml docs/gguf.md §"Tokenizer"; llama.cpp `src/llama-vocab.cpp`):
 *   tokenizer.ggml.tokens      ARRAY of STRING, the vocabulary in id order (byte-level spelling, `Ġthe`)
 *   tokenizer.ggml.merges      ARRAY of STRING, `"a b"` in rank order
 *   tokenizer.ggml.token_type  ARRAY of INT32 (optional): 1 normal, 2 unknown, 3 control, 4 user-defined,
 *                              5 unused, 6 byte. 3 → added token, special; 4 → added token, not special
 *   tokenizer.ggml.pre         STRING (optional): the pre-tokenizer; see {@link PRE_TOKENIZERS}
 *   tokenizer.ggml.{bos,eos,unknown,padding}_token_id  UINT32 (optional)
 *   tokenizer.ggml.add_bos_token / add_eos_token        BOOL (optional, default false for gpt2)
 *   tokenizer.chat_template    STRING (optional)
 *
 * Pre-tokenizers: `"smollm"` is HF SmolLM2's tokenizer.json — Digits(individual_digits) then
 * ByteLevel(add_prefix_space=false, use_regex=true), written as the equivalent Split(\p{N}, isolated)
 * (see {@link PRE_TOKENIZERS}) — which is also llama.cpp's
 * LLAMA_VOCAB_PRE_TYPE_SMOLLM (a `\p{N}` split, then the GPT-2 regex). `"gpt-2"` / `"default"` / absent:
 * ByteLevel alone. Other values are refused (guessing would silently change token ids).
 * Note: transformers' GGUF loader (`convert_gguf_tokenizer`) has no entry for "smollm" and leaves out
 * the Digits step, so it splits "2024" into fewer tokens than the HF checkpoint and llama.cpp do; the
 * reference ids in test/fixtures/smollm2-tokenizer-ids.json are from transformers with the HF
 * SmolLM2 pre-tokenizer restored (tools/reference/gguf_tokenizer_check.py).
 */

import type { GgufFile } from './gguf.js';
import { GgufValueType } from './gguf-types.js';
import { Tokenizer, TokenizerError, type TokenizerSources } from './tokenizer.js';

/** ggml token types (`llama_token_type`). */
export const GGUF_TOKEN_TYPE = { NORMAL: 1, UNKNOWN: 2, CONTROL: 3, USER_DEFINED: 4, UNUSED: 5, BYTE: 6 } as const;

const BYTE_LEVEL = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true } as const;

/** HF pre_tokenizer JSON per `tokenizer.ggml.pre` value. */
export const PRE_TOKENIZERS: Readonly<Record<string, Readonly<Record<string, unknown>>>> = {
  // HF's file says {type: 'Digits', individual_digits: true}; Rust's Digits splits on char::is_numeric
  // (Unicode N: Nd, Nl, No), but @huggingface/tokenizers' JS Digits uses /\d/u (ASCII 0-9 only), which
  // keeps " ①" or " ½" together. Split on \p{N}, isolated, is the same rule as Rust's Digits and works in JS.
  smollm: {
    type: 'Sequence',
    pretokenizers: [{ type: 'Split', pattern: { Regex: '\\p{N}' }, behavior: 'Isolated', invert: false }, BYTE_LEVEL],
  },
  'gpt-2': BYTE_LEVEL,
  gpt2: BYTE_LEVEL,
  default: BYTE_LEVEL,
};

function optionalU32(gguf: GgufFile, key: string): number | undefined {
  return gguf.has(key) ? gguf.getU32(key) : undefined;
}

function optionalBool(gguf: GgufFile, key: string): boolean | undefined {
  return gguf.has(key) ? gguf.getBool(key) : undefined;
}

/**
 * The HF tokenizer JSON objects equivalent to `gguf`'s tokenizer metadata.
 * @returns `tokenizerJson` (tokenizer.json: BPE model, added tokens, pre-tokenizer, ByteLevel
 *   decoder) and `tokenizerConfig` (bos/eos/pad/unk token strings, chat_template, add_bos_token).
 * @throws {TokenizerError} for a tokenizer model other than "gpt2", an unknown `tokenizer.ggml.pre`,
 *   a token id outside the vocabulary, or a token_type array of the wrong length.
 * @throws {GgufError} when a key has the wrong type or `tokens`/`model` is missing.
 */
export function ggufTokenizerSources(gguf: GgufFile): TokenizerSources {
  const label = gguf.file;
  const model = gguf.getString('tokenizer.ggml.model');
  if (model !== 'gpt2')
    throw new TokenizerError(
      label,
      `tokenizer.ggml.model is ${JSON.stringify(model)}; only "gpt2" (byte-level BPE) is supported`,
    );
  const tokens = gguf.getStringArray('tokenizer.ggml.tokens');
  const merges = gguf.has('tokenizer.ggml.merges') ? gguf.getStringArray('tokenizer.ggml.merges') : [];
  const pre = gguf.has('tokenizer.ggml.pre') ? gguf.getString('tokenizer.ggml.pre') : 'default';
  const preTokenizer = Object.hasOwn(PRE_TOKENIZERS, pre) ? PRE_TOKENIZERS[pre] : undefined;
  if (preTokenizer === undefined) {
    throw new TokenizerError(
      label,
      `tokenizer.ggml.pre ${JSON.stringify(pre)} is not supported (known: ${Object.keys(PRE_TOKENIZERS).join(', ')})`,
    );
  }
  let types: ArrayLike<number> | undefined;
  if (gguf.has('tokenizer.ggml.token_type')) {
    types = gguf.getArray('tokenizer.ggml.token_type', GgufValueType.INT32).items as Int32Array;
    if (types.length !== tokens.length)
      throw new TokenizerError(
        label,
        `tokenizer.ggml.token_type has ${types.length} entries, tokenizer.ggml.tokens ${tokens.length}`,
      );
  }

  const vocab: Record<string, number> = Object.create(null) as Record<string, number>;
  const addedTokens: Record<string, unknown>[] = [];
  for (let id = 0; id < tokens.length; id++) {
    const token = tokens[id]!;
    if (!(token in vocab)) vocab[token] = id; // first id wins on duplicates, as in HF's BPE
    const type = types?.[id];
    if (type === GGUF_TOKEN_TYPE.CONTROL || type === GGUF_TOKEN_TYPE.USER_DEFINED) {
      addedTokens.push({
        id,
        content: token,
        single_word: false,
        lstrip: false,
        rstrip: false,
        normalized: false,
        special: type === GGUF_TOKEN_TYPE.CONTROL,
      });
    }
  }

  const tokenOf = (key: string): string | undefined => {
    const id = optionalU32(gguf, key);
    if (id === undefined) return undefined;
    if (id >= tokens.length)
      throw new TokenizerError(label, `${key} = ${id} is not below the vocabulary size ${tokens.length}`);
    return tokens[id];
  };
  const bos = tokenOf('tokenizer.ggml.bos_token_id');
  const eos = tokenOf('tokenizer.ggml.eos_token_id');
  const addBos = optionalBool(gguf, 'tokenizer.ggml.add_bos_token') ?? false;
  const addEos = optionalBool(gguf, 'tokenizer.ggml.add_eos_token') ?? false;
  if ((addBos && bos === undefined) || (addEos && eos === undefined)) {
    throw new TokenizerError(
      label,
      'tokenizer.ggml.add_bos_token/add_eos_token is set but the matching token id is missing',
    );
  }

  // Post-processor: HF byte-level checkpoints use ByteLevel (no-op on ids); BOS/EOS insertion when the file asks
  // for it.
  const special = (t: string): Record<string, unknown> => ({ SpecialToken: { id: t, type_id: 0 } });
  const seq = { Sequence: { id: 'A', type_id: 0 } };
  const single = [...(addBos ? [special(bos!)] : []), seq, ...(addEos ? [special(eos!)] : [])];
  const postProcessor =
    addBos || addEos
      ? {
          type: 'TemplateProcessing',
          single,
          pair: [...single, ...single.map((p) => ('Sequence' in p ? { Sequence: { id: 'B', type_id: 1 } } : p))],
          special_tokens: Object.fromEntries(
            [bos, eos]
              .filter((t): t is string => t !== undefined && (t === bos ? addBos : addEos))
              .map((t) => [t, { id: t, ids: [vocab[t]], tokens: [t] }]),
          ),
        }
      : { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true };

  const tokenizerJson = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: addedTokens,
    normalizer: null,
    pre_tokenizer: preTokenizer,
    post_processor: postProcessor,
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
      merges: [...merges],
    },
  };
  const tokenizerConfig: Record<string, unknown> = {
    add_bos_token: addBos,
    add_eos_token: addEos,
    clean_up_tokenization_spaces: false,
    model_max_length: gguf.has('llama.context_length') ? gguf.getU32('llama.context_length') : undefined,
  };
  if (bos !== undefined) tokenizerConfig.bos_token = bos;
  if (eos !== undefined) tokenizerConfig.eos_token = eos;
  const pad = tokenOf('tokenizer.ggml.padding_token_id');
  if (pad !== undefined) tokenizerConfig.pad_token = pad;
  const unk = tokenOf('tokenizer.ggml.unknown_token_id');
  if (unk !== undefined) tokenizerConfig.unk_token = unk;
  if (gguf.has('tokenizer.chat_template')) tokenizerConfig.chat_template = gguf.getString('tokenizer.chat_template');
  if (tokenizerConfig.model_max_length === undefined) delete tokenizerConfig.model_max_length;
  return { tokenizerJson, tokenizerConfig, label };
}

/**
 * A {@link Tokenizer} built from `gguf`'s tokenizer metadata (see {@link ggufTokenizerSources}):
 * bos/eos/pad ids from `tokenizer.ggml.*_token_id`, chat template from `tokenizer.chat_template`.
 * @throws {TokenizerError} / {GgufError} as {@link ggufTokenizerSources}.
 */
export function tokenizerFromGguf(gguf: GgufFile): Tokenizer {
  return new Tokenizer(ggufTokenizerSources(gguf));
}
