/**
 * Hugging Face `config.json`: reading, and a small typed accessor API for model plugins.
 *
 * Core knows no model's schema. A plugin reads its own fields through {@link HfConfig}:
 *
 *   const cfg = HfConfig.read(dir);
 *   const hidden = cfg.requireInt('hidden_size', { min: 1 });
 *   const window = cfg.optionalInt('sliding_window');          // undefined if absent or null
 *   const lin = cfg.section('linear_attn_config');             // nested object, required
 *   const kda = lin.requireIntArray('kda_layers');             // errors name "linear_attn_config.kda_layers"
 *
 * Semantics, with no silent defaults:
 * - `require*(key)`: the key must be present and non-null with the right type, else
 *   {@link HfConfigError} naming the file, the JSON path and what was found.
 * - `optional*(key)`: absent or `null` → `undefined` (HF writes `null` for "unset"); present with the
 *   wrong type → error. The caller states its own default at the call site (`?? 4096`).
 */

import * as fs from 'node:fs';
import * as nodePath from 'node:path';

import {
  describeJsonValue,
  isJsonObject,
  own,
  parseStrictJson,
  type JsonObject,
  type JsonValue,
} from './strict-json.js';

/** Thrown for an unreadable config or a missing / mistyped field. */
export class HfConfigError extends Error {
  override readonly name = 'HfConfigError';
  constructor(
    /** Path of the config file (or the label given to {@link HfConfig.fromObject}). */
    readonly file: string,
    /** JSON path of the field (`"linear_attn_config.kda_layers"`), or `""` for the whole file. */
    readonly field: string,
    /** What is wrong. */
    readonly detail: string,
    options?: { cause?: unknown },
  ) {
    super(`${file}${field === '' ? '' : `: field "${field}"`}: ${detail}`, options);
  }
}

/** Inclusive numeric bounds for the number accessors. */
export interface NumberBounds {
  /** Smallest allowed value (inclusive). */
  min?: number;
  /** Largest allowed value (inclusive). */
  max?: number;
}

/**
 * A config object (the whole file or a nested section) with typed, path-aware accessors.
 * Immutable; `raw` is the parsed JSON (null-prototype objects; integers beyond 2^53 are bigint).
 */
export class HfConfig {
  private constructor(
    /** The file the config came from. */
    readonly file: string,
    /** The JSON path of this section (`""` for the root). */
    readonly path: string,
    /** The parsed JSON object of this section. */
    readonly raw: Readonly<JsonObject>,
  ) {}

  /**
   * Reads `config.json`. `path` is the file or the checkpoint directory holding it.
   * Accepts Python's `NaN` / `Infinity` literals; rejects duplicate keys.
   * @throws {HfConfigError} if the file cannot be read, is not JSON, or is not an object.
   */
  static read(path: string, fileName = 'config.json'): HfConfig {
    let file = path;
    try {
      if (fs.statSync(path).isDirectory()) file = nodePath.join(path, fileName);
    } catch {
      // fall through: readFileSync reports the missing path
    }
    let text: string;
    try {
      text = fs.readFileSync(file, 'utf8');
    } catch (cause) {
      throw new HfConfigError(file, '', `cannot read: ${(cause as Error).message}`, { cause });
    }
    return HfConfig.parse(text, file);
  }

  /**
   * Parses config JSON text.
   * @param label names the source in errors.
   * @throws {HfConfigError} if `text` is not a JSON object.
   */
  static parse(text: string, label = '<config>'): HfConfig {
    let root: JsonValue;
    try {
      root = parseStrictJson(text.charCodeAt(0) === 0xfeff ? text.slice(1) : text, { allowNonFinite: true });
    } catch (cause) {
      throw new HfConfigError(label, '', `not valid JSON: ${(cause as Error).message}`, { cause });
    }
    if (!isJsonObject(root))
      throw new HfConfigError(label, '', `must be a JSON object, got ${describeJsonValue(root)}`);
    return new HfConfig(label, '', root);
  }

  /** Wraps an already-parsed object (tests, configs embedded in other files). */
  static fromObject(obj: Readonly<Record<string, unknown>>, label = '<config>'): HfConfig {
    return HfConfig.parse(JSON.stringify(obj), label);
  }

  /** `model_type`, if present. */
  get modelType(): string | undefined {
    return this.optionalString('model_type');
  }

  /** `architectures` (e.g. `["LlamaForCausalLM"]`), `[]` if absent. */
  get architectures(): readonly string[] {
    return this.optionalStringArray('architectures') ?? [];
  }

  /** True if `key` is present and not null. */
  has(key: string): boolean {
    const v = own(this.raw, key);
    return v !== undefined && v !== null;
  }

  /** Keys of this section. */
  keys(): string[] {
    return Object.keys(this.raw);
  }

  /** The JSON path of `key` in this section, as used in error messages. */
  fieldPath(key: string): string {
    return this.path === '' ? key : `${this.path}.${key}`;
  }

  /** Throws an {@link HfConfigError} for `key` (for plugins' own cross-field checks). */
  fail(key: string, detail: string): never {
    throw new HfConfigError(this.file, this.fieldPath(key), detail);
  }

  // ---- objects -------------------------------------------------------------------------------

  /** The nested object at `key`. @throws {HfConfigError} if absent, null or not an object. */
  section(key: string): HfConfig {
    const v = this.get(key, true);
    if (!isJsonObject(v)) this.wrongType(key, 'an object', v);
    return new HfConfig(this.file, this.fieldPath(key), v);
  }

  /** The nested object at `key`, or undefined if absent/null. @throws {HfConfigError} if not an object. */
  optionalSection(key: string): HfConfig | undefined {
    const v = this.get(key, false);
    if (v === undefined) return undefined;
    if (!isJsonObject(v)) this.wrongType(key, 'an object', v);
    return new HfConfig(this.file, this.fieldPath(key), v);
  }

  // ---- scalars -------------------------------------------------------------------------------

  /** @throws {HfConfigError} if absent, null or not a string. */
  requireString(key: string): string {
    return this.asString(key, this.get(key, true)!);
  }
  /** @throws {HfConfigError} if present and not a string. */
  optionalString(key: string): string | undefined {
    const v = this.get(key, false);
    return v === undefined ? undefined : this.asString(key, v);
  }

  /** A string that must be one of `allowed`. @throws {HfConfigError} otherwise. */
  requireOneOf<T extends string>(key: string, allowed: readonly T[]): T {
    const s = this.requireString(key);
    if (!(allowed as readonly string[]).includes(s))
      this.fail(key, `must be one of ${allowed.map((a) => JSON.stringify(a)).join(', ')}, got ${JSON.stringify(s)}`);
    return s as T;
  }

  /**
   * A finite or non-finite number within `bounds`. @throws {HfConfigError} if absent, null, not a number or out of
   * bounds.
   */
  requireNumber(key: string, bounds?: NumberBounds): number {
    return this.asNumber(key, this.get(key, true)!, bounds);
  }
  /** @throws {HfConfigError} if present and not a number or out of bounds. */
  optionalNumber(key: string, bounds?: NumberBounds): number | undefined {
    const v = this.get(key, false);
    return v === undefined ? undefined : this.asNumber(key, v, bounds);
  }

  /** A safe integer within `bounds`. @throws {HfConfigError} if absent, null, not an integer or out of bounds. */
  requireInt(key: string, bounds?: NumberBounds): number {
    return this.asInt(key, this.get(key, true)!, bounds);
  }
  /** @throws {HfConfigError} if present and not a safe integer or out of bounds. */
  optionalInt(key: string, bounds?: NumberBounds): number | undefined {
    const v = this.get(key, false);
    return v === undefined ? undefined : this.asInt(key, v, bounds);
  }

  /** @throws {HfConfigError} if absent, null or not a boolean. */
  requireBoolean(key: string): boolean {
    return this.asBoolean(key, this.get(key, true)!);
  }
  /** @throws {HfConfigError} if present and not a boolean. */
  optionalBoolean(key: string): boolean | undefined {
    const v = this.get(key, false);
    return v === undefined ? undefined : this.asBoolean(key, v);
  }

  // ---- arrays --------------------------------------------------------------------------------

  /** An array of safe integers, each within `bounds`. @throws {HfConfigError} naming the bad element. */
  requireIntArray(key: string, bounds?: NumberBounds): number[] {
    return this.asArray(key, this.get(key, true)!).map((v, i) => this.asInt(`${key}[${i}]`, v, bounds));
  }
  /** @throws {HfConfigError} if present and not an array of safe integers within `bounds`. */
  optionalIntArray(key: string, bounds?: NumberBounds): number[] | undefined {
    const v = this.get(key, false);
    return v === undefined ? undefined : this.asArray(key, v).map((e, i) => this.asInt(`${key}[${i}]`, e, bounds));
  }

  /** An array of numbers. @throws {HfConfigError} naming the bad element. */
  requireNumberArray(key: string, bounds?: NumberBounds): number[] {
    return this.asArray(key, this.get(key, true)!).map((v, i) => this.asNumber(`${key}[${i}]`, v, bounds));
  }
  /** @throws {HfConfigError} if present and not an array of numbers. */
  optionalNumberArray(key: string, bounds?: NumberBounds): number[] | undefined {
    const v = this.get(key, false);
    return v === undefined ? undefined : this.asArray(key, v).map((e, i) => this.asNumber(`${key}[${i}]`, e, bounds));
  }

  /** An array of strings. @throws {HfConfigError} naming the bad element. */
  requireStringArray(key: string): string[] {
    return this.asArray(key, this.get(key, true)!).map((v, i) => this.asString(`${key}[${i}]`, v));
  }
  /** @throws {HfConfigError} if present and not an array of strings. */
  optionalStringArray(key: string): string[] | undefined {
    const v = this.get(key, false);
    return v === undefined ? undefined : this.asArray(key, v).map((e, i) => this.asString(`${key}[${i}]`, e));
  }

  // ---- internals -----------------------------------------------------------------------------

  private get(key: string, required: boolean): JsonValue | undefined {
    const v = own(this.raw, key);
    if (v === undefined || v === null) {
      if (required) this.fail(key, v === null ? 'is required but is null' : 'is required but missing');
      return undefined;
    }
    return v;
  }

  private wrongType(key: string, expected: string, got: JsonValue | undefined): never {
    this.fail(key, `must be ${expected}, got ${describeJsonValue(got)}`);
  }

  private asString(key: string, v: JsonValue): string {
    if (typeof v !== 'string') this.wrongType(key, 'a string', v);
    return v;
  }

  private asBoolean(key: string, v: JsonValue): boolean {
    if (typeof v !== 'boolean') this.wrongType(key, 'a boolean', v);
    return v;
  }

  private asArray(key: string, v: JsonValue): JsonValue[] {
    if (!Array.isArray(v)) this.wrongType(key, 'an array', v);
    return v;
  }

  private asNumber(key: string, v: JsonValue, bounds?: NumberBounds): number {
    const n = typeof v === 'bigint' ? Number(v) : v;
    if (typeof n !== 'number') this.wrongType(key, 'a number', v);
    this.checkBounds(key, n, bounds);
    return n;
  }

  private asInt(key: string, v: JsonValue, bounds?: NumberBounds): number {
    if (typeof v !== 'number' || !Number.isSafeInteger(v)) this.wrongType(key, 'a safe integer', v);
    this.checkBounds(key, v, bounds);
    return v;
  }

  private checkBounds(key: string, n: number, bounds?: NumberBounds): void {
    if (bounds === undefined) return;
    if ((bounds.min !== undefined && !(n >= bounds.min)) || (bounds.max !== undefined && !(n <= bounds.max))) {
      this.fail(key, `must be in [${bounds.min ?? '-∞'}, ${bounds.max ?? '∞'}], got ${n}`);
    }
  }
}
