/**
 * Tokenizer loading: HF `tokenizer.json` + `tokenizer_config.json` (+ `generation_config.json`,
 * `chat_template.jinja` when present) wrapped around `@huggingface/tokenizers` (pure JS).
 *
 * Token ids are non-negative integers below {@link Tokenizer.vocabSize}; `encode` returns them as an
 * `Int32Array` (what the engine feeds to kernels). Options that change results
 * (`addSpecialTokens`, `skipSpecialTokens`) are required arguments, never defaults.
 */

import * as fs from 'node:fs';
import * as nodePath from 'node:path';

import { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';

import { IncrementalDetokenizer, type IncrementalDetokenizerOptions } from './detokenizer.js';
import {
  describeJsonValue,
  isJsonObject,
  own,
  parseStrictJson,
  type JsonObject,
  type JsonValue,
} from './strict-json.js';

/** Thrown for unreadable / malformed tokenizer files and invalid token ids. */
export class TokenizerError extends Error {
  override readonly name = 'TokenizerError';
  constructor(
    /** The file (or label) concerned. */
    readonly file: string,
    /** What is wrong. */
    readonly detail: string,
    options?: { cause?: unknown },
  ) {
    super(`${file}: ${detail}`, options);
  }
}

/** Options of {@link Tokenizer.encode}. */
export interface EncodeOptions {
  /** Apply the tokenizer's post-processor (e.g. prepend BOS). */
  readonly addSpecialTokens: boolean;
}

/** Options of {@link Tokenizer.decode}. */
export interface DecodeOptions {
  /** Drop special tokens (BOS, EOS, chat markers, …) from the text. */
  readonly skipSpecialTokens: boolean;
}

/** The raw JSON inputs of a tokenizer (for tests and in-memory use). */
export interface TokenizerSources {
  /** Parsed `tokenizer.json`. */
  readonly tokenizerJson: Readonly<Record<string, unknown>>;
  /** Parsed `tokenizer_config.json` (`{}` if the checkpoint has none). */
  readonly tokenizerConfig: Readonly<Record<string, unknown>>;
  /** Parsed `generation_config.json`, if any (its `eos_token_id` adds EOS ids). */
  readonly generationConfig?: Readonly<Record<string, unknown>>;
  /** Contents of `chat_template.jinja`, if any (takes precedence over `tokenizer_config.chat_template`). */
  readonly chatTemplateFile?: string;
  /** Names the source in errors. */
  readonly label?: string;
}

/** A loaded tokenizer. Immutable after construction. */
export class Tokenizer {
  /** One past the largest token id (base vocabulary and added tokens). */
  readonly vocabSize: number;
  /** BOS token id from `tokenizer_config.bos_token`, if defined. */
  readonly bosTokenId: number | undefined;
  /** EOS ids: `tokenizer_config.eos_token` ∪ `generation_config.eos_token_id`, sorted, unique. */
  readonly eosTokenIds: readonly number[];
  /** PAD id from `tokenizer_config.pad_token`, if defined. */
  readonly padTokenId: number | undefined;
  /** Ids of all special tokens (added tokens flagged special, plus BOS/EOS/PAD/UNK). */
  readonly specialTokenIds: ReadonlySet<number>;
  /** The default chat template (Jinja source), unrendered; undefined if the checkpoint has none. */
  readonly chatTemplate: string | undefined;
  /** All named chat templates (`default`, `tool_use`, …); empty if none. */
  readonly chatTemplates: Readonly<Record<string, string>>;
  /** The `tokenizer_config.json` object as loaded. */
  readonly config: Readonly<JsonObject>;
  /** Where the tokenizer came from (directory or label). */
  readonly source: string;
  /**
   * The `tokenizer.json` and `tokenizer_config.json` objects `@huggingface/tokenizers` was built from, to build the
   * same tokenizer in another thread (serve/prompt-encoder.ts).
   */
  readonly libraryInputs: { readonly tokenizerJson: JsonObject; readonly tokenizerConfig: JsonObject };

  private readonly hf: HfTokenizer;
  private readonly idToTokenTable: (string | undefined)[];

  /**
   * Builds a tokenizer from parsed JSON.
   * @throws {TokenizerError} if the JSON is not a tokenizer the library accepts, or a special token
   *   named in the config is not in the vocabulary.
   */
  constructor(sources: TokenizerSources) {
    const label = sources.label ?? '<tokenizer>';
    this.source = label;
    const tokJson = toJsonObject(label, 'tokenizer.json', sources.tokenizerJson);
    const config = toJsonObject(label, 'tokenizer_config.json', sources.tokenizerConfig);
    this.config = config;
    // The library iterates added_tokens unconditionally; HF files may omit it.
    const tokenizerForLib = { ...tokJson, added_tokens: own(tokJson, 'added_tokens') ?? [] };
    // transformers ≥ 4.45 defaults clean_up_tokenization_spaces to false; the library defaults to
    // true. State it explicitly so both agree on files that omit it.
    const cleanUp = own(config, 'clean_up_tokenization_spaces');
    const configForLib = { ...config, clean_up_tokenization_spaces: typeof cleanUp === 'boolean' ? cleanUp : false };
    this.libraryInputs = { tokenizerJson: tokenizerForLib, tokenizerConfig: configForLib };
    try {
      this.hf = new HfTokenizer(tokenizerForLib, configForLib);
    } catch (cause) {
      throw new TokenizerError(label, `cannot build tokenizer: ${(cause as Error).message}`, { cause });
    }

    const vocab = this.hf.get_vocab(true);
    let maxId = -1;
    const table: (string | undefined)[] = [];
    for (const [token, id] of vocab) {
      if (!Number.isSafeInteger(id) || id < 0)
        throw new TokenizerError(label, `token ${JSON.stringify(token)} has invalid id ${String(id)}`);
      table[id] = token;
      if (id > maxId) maxId = id;
    }
    for (const [id, t] of this.hf.get_added_tokens_decoder()) {
      table[id] = t.content;
      if (id > maxId) maxId = id;
    }
    this.idToTokenTable = table;
    this.vocabSize = maxId + 1;

    const special = new Set<number>();
    for (const [id, t] of this.hf.get_added_tokens_decoder()) if (t.special) special.add(id);
    const resolve = (field: string): number | undefined => {
      const content = specialTokenContent(label, config, field);
      if (content === undefined) return undefined;
      const id = this.tokenToId(content);
      if (id === undefined)
        throw new TokenizerError(
          label,
          `tokenizer_config.${field} ${JSON.stringify(content)} is not in the vocabulary`,
        );
      special.add(id);
      return id;
    };
    this.bosTokenId = resolve('bos_token');
    const eos = new Set<number>();
    const eosFromConfig = resolve('eos_token');
    if (eosFromConfig !== undefined) eos.add(eosFromConfig);
    this.padTokenId = resolve('pad_token');
    resolve('unk_token');
    const gen = sources.generationConfig;
    const genEos = gen !== undefined && Object.hasOwn(gen, 'eos_token_id') ? gen.eos_token_id : undefined;
    if (genEos !== undefined && genEos !== null) {
      for (const id of Array.isArray(genEos) ? genEos : [genEos]) {
        if (typeof id !== 'number' || !Number.isSafeInteger(id) || id < 0 || id >= this.vocabSize) {
          throw new TokenizerError(
            label,
            `generation_config.eos_token_id holds ${String(id)}, not a token id below ${this.vocabSize}`,
          );
        }
        eos.add(id);
        special.add(id);
      }
    }
    this.eosTokenIds = Object.freeze([...eos].sort((a, b) => a - b));
    this.specialTokenIds = special;

    const templates = chatTemplatesOf(label, config);
    if (sources.chatTemplateFile !== undefined) templates.default = sources.chatTemplateFile;
    this.chatTemplates = Object.freeze(templates);
    this.chatTemplate = templates.default;
  }

  /**
   * Loads a tokenizer from a checkpoint directory: `tokenizer.json` (required),
   * `tokenizer_config.json`, `generation_config.json`, `chat_template.jinja` (each optional).
   * @throws {TokenizerError} naming the file that is missing or malformed.
   */
  static load(dir: string): Tokenizer {
    const tokenizerJson = readJsonFile(nodePath.join(dir, 'tokenizer.json'), true)!;
    const tokenizerConfig = readJsonFile(nodePath.join(dir, 'tokenizer_config.json'), false) ?? {};
    const generationConfig = readJsonFile(nodePath.join(dir, 'generation_config.json'), false);
    const templatePath = nodePath.join(dir, 'chat_template.jinja');
    const chatTemplateFile = fs.existsSync(templatePath) ? fs.readFileSync(templatePath, 'utf8') : undefined;
    return new Tokenizer({ tokenizerJson, tokenizerConfig, generationConfig, chatTemplateFile, label: dir });
  }

  /**
   * Encodes `text` to token ids.
   * @returns `[numTokens]` int32 ids.
   * @throws {TokenizerError} if a piece has no id (a vocabulary without `unk_token` that does not cover the text).
   */
  encode(text: string, options: EncodeOptions): Int32Array {
    const { ids, tokens } = this.hf.encode(text, { add_special_tokens: options.addSpecialTokens });
    const out = new Int32Array(ids.length);
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i];
      if (typeof id !== 'number' || !Number.isInteger(id)) {
        throw new TokenizerError(this.source, `piece ${JSON.stringify(tokens[i])} has no token id (no unk_token)`);
      }
      out[i] = id;
    }
    return out;
  }

  /**
   * Decodes token ids to text.
   * @param ids `[numTokens]` token ids, each in [0, vocabSize).
   * @throws {TokenizerError} naming the first id that is not a known token.
   */
  decode(ids: ArrayLike<number>, options: DecodeOptions): string {
    if (ids.length === 0) return '';
    const list = new Array<number>(ids.length);
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i]!;
      if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize || this.idToTokenTable[id] === undefined) {
        throw new TokenizerError(
          this.source,
          `decode: ids[${i}] = ${id} is not a token id (vocabSize ${this.vocabSize})`,
        );
      }
      list[i] = id;
    }
    return this.hf.decode(list, { skip_special_tokens: options.skipSpecialTokens });
  }

  /** The id of token string `token` (vocabulary or added token), or undefined. */
  tokenToId(token: string): number | undefined {
    return this.hf.token_to_id(token);
  }

  /** The token string of `id` (byte-level tokens in their mapped form, e.g. `Ġthe`), or undefined. */
  idToToken(id: number): string | undefined {
    return Number.isInteger(id) && id >= 0 ? this.idToTokenTable[id] : undefined;
  }

  /** True if `id` is a special token. */
  isSpecial(id: number): boolean {
    return this.specialTokenIds.has(id);
  }

  /** True if `id` ends generation (one of {@link eosTokenIds}). */
  isEos(id: number): boolean {
    return this.eosTokenIds.includes(id);
  }

  /** A streaming detokenizer over this tokenizer (see {@link IncrementalDetokenizer}). */
  createDetokenizer(options: IncrementalDetokenizerOptions): IncrementalDetokenizer {
    return new IncrementalDetokenizer(this, options);
  }
}

function toJsonObject(label: string, what: string, value: unknown): JsonObject {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new TokenizerError(label, `${what} must be a JSON object`);
  }
  return value as JsonObject;
}

function readJsonFile(path: string, required: boolean): JsonObject | undefined {
  if (!fs.existsSync(path)) {
    if (required) throw new TokenizerError(path, 'file is missing');
    return undefined;
  }
  let root: JsonValue;
  try {
    root = parseStrictJson(fs.readFileSync(path, 'utf8'), { allowNonFinite: true, maxDepth: 256 });
  } catch (cause) {
    throw new TokenizerError(path, `not valid JSON: ${(cause as Error).message}`, { cause });
  }
  if (!isJsonObject(root)) throw new TokenizerError(path, `must be a JSON object, got ${describeJsonValue(root)}`);
  // The library expects plain objects (it uses `in` and Object.entries); copy off null prototypes.
  return JSON.parse(JSON.stringify(root, (_k, v: unknown) => (typeof v === 'bigint' ? Number(v) : v))) as JsonObject;
}

/** A special-token field is a string or an AddedToken dict `{content: "..."}` (older files), or absent/null. */
function specialTokenContent(label: string, config: JsonObject, field: string): string | undefined {
  const v = own(config, field);
  if (v === undefined || v === null) return undefined;
  if (typeof v === 'string') return v;
  const content = isJsonObject(v) ? own(v, 'content') : undefined;
  if (typeof content === 'string') return content;
  throw new TokenizerError(
    label,
    `tokenizer_config.${field} must be a string or {content: string}, got ${describeJsonValue(v)}`,
  );
}

/** `chat_template` is a string (the default) or a list of `{name, template}`. */
function chatTemplatesOf(label: string, config: JsonObject): Record<string, string> {
  const v = own(config, 'chat_template');
  const out = Object.create(null) as Record<string, string>;
  if (v === undefined || v === null) return out;
  if (typeof v === 'string') {
    out.default = v;
    return out;
  }
  if (Array.isArray(v)) {
    for (const [i, entry] of v.entries()) {
      const name = isJsonObject(entry) ? own(entry, 'name') : undefined;
      const template = isJsonObject(entry) ? own(entry, 'template') : undefined;
      if (typeof name !== 'string' || typeof template !== 'string') {
        throw new TokenizerError(
          label,
          `tokenizer_config.chat_template[${i}] must be {name: string, template: string}`,
        );
      }
      out[name] = template;
    }
    return out;
  }
  throw new TokenizerError(
    label,
    `tokenizer_config.chat_template must be a string or a list, got ${describeJsonValue(v)}`,
  );
}
