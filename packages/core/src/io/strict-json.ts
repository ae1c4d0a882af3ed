/**
 * A strict JSON parser for untrusted checkpoint headers and config files.
 *
 * Why not `JSON.parse`: it silently keeps the last of two duplicate keys (a header naming one tensor
 * twice is ambiguous, and we refuse it), and it rounds integers above 2^53 to the nearest double
 * (an offset of 2^64−1 would silently become 1.8e19). This parser
 * - rejects duplicate keys in any object, naming the key and its JSON path;
 * - returns integers whose magnitude exceeds `Number.MAX_SAFE_INTEGER` as `bigint`, so callers can
 *   reject them by type rather than by a rounded value;
 * - limits nesting depth (no stack overflow on `[[[[…`);
 * - defines a key named `__proto__` as an own property (it never sets the prototype). Objects are
 *   ordinary `{}` (null-prototype objects are always in V8's slow dictionary mode, 2–3× slower to
 *   build), so look arbitrary keys up with `Object.hasOwn`, never plain indexing.
 * It implements RFC 8259 exactly (no comments, no trailing commas, no NaN).
 */

/** A parsed JSON value. Integers beyond ±(2^53−1) are `bigint`; every other number is `number`. */
export type JsonValue = null | boolean | number | bigint | string | JsonValue[] | JsonObject;

/** A parsed JSON object. Look arbitrary keys up with `Object.hasOwn` (see the module comment). */
export interface JsonObject {
  [key: string]: JsonValue;
}

/** Thrown for malformed JSON. `offset` is the character index (UTF-16 code units) of the problem. */
export class StrictJsonError extends Error {
  override readonly name = 'StrictJsonError';
  constructor(
    message: string,
    /** Character offset in the source text where parsing stopped. */
    readonly offset: number,
  ) {
    super(message);
  }
}

/** Options for {@link parseStrictJson}. */
export interface StrictJsonOptions {
  /** Deepest allowed nesting of arrays/objects (default 64; the top-level value is depth 1). */
  maxDepth?: number;
  /**
   * Accept the non-standard literals `NaN`, `Infinity` and `-Infinity` (Python's `json.dump`
   * writes them by default, so some HF config.json files contain them). Default false.
   */
  allowNonFinite?: boolean;
}

/**
 * Parses `text` as one JSON value, surrounded by optional JSON whitespace.
 * @throws {StrictJsonError} on any syntax error, duplicate key, or nesting deeper than `maxDepth`.
 */
export function parseStrictJson(text: string, options: StrictJsonOptions = {}): JsonValue {
  const parser = new Parser(text, options.maxDepth ?? 64, options.allowNonFinite ?? false);
  parser.skipWhitespace();
  const value = parser.parseValue(1);
  parser.skipWhitespace();
  if (parser.pos !== text.length) parser.fail('unexpected data after the JSON value');
  return value;
}

/** Type guard: a JSON object (not an array, not null). */
export function isJsonObject(value: JsonValue | undefined): value is JsonObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** The own property `key` of `obj` (never an inherited one such as `constructor`), or undefined. */
export function own(obj: JsonObject, key: string): JsonValue | undefined {
  return Object.hasOwn(obj, key) ? obj[key] : undefined;
}

/** Describes a JSON value's kind for error messages (`"array"`, `"null"`, `"big integer"`, …). */
export function describeJsonValue(value: JsonValue | undefined): string {
  if (value === undefined) return 'nothing (field missing)';
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'array';
  if (typeof value === 'bigint') return `integer ${value} (beyond 2^53)`;
  if (typeof value === 'object') return 'object';
  if (typeof value === 'string')
    return `string ${JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value)}`;
  return `${typeof value} ${String(value)}`;
}

const NUMBER_RE = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
const INTEGER_RE = /^-?(?:0|[1-9][0-9]*)$/;

class Parser {
  pos = 0;
  private readonly pathStack: (string | number)[] = [];
  constructor(
    private readonly text: string,
    private readonly maxDepth: number,
    private readonly allowNonFinite: boolean,
  ) {}

  fail(message: string): never {
    throw new StrictJsonError(`${message} at character ${this.pos}`, this.pos);
  }

  skipWhitespace(): void {
    const t = this.text;
    while (this.pos < t.length) {
      const c = t.charCodeAt(this.pos);
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) this.pos++;
      else break;
    }
  }

  parseValue(depth: number): JsonValue {
    const c = this.text[this.pos];
    switch (c) {
      case '{':
        return this.parseObject(depth);
      case '[':
        return this.parseArray(depth);
      case '"':
        return this.parseString();
      case 't':
        return this.parseLiteral('true', true);
      case 'f':
        return this.parseLiteral('false', false);
      case 'n':
        return this.parseLiteral('null', null);
      case undefined:
        return this.fail('unexpected end of JSON');
      case 'N':
        if (this.allowNonFinite) return this.parseLiteral('NaN', NaN);
        return this.fail('NaN is not JSON');
      case 'I':
        if (this.allowNonFinite) return this.parseLiteral('Infinity', Infinity);
        return this.fail('Infinity is not JSON');
      default:
        if (c === '-' && this.allowNonFinite && this.text.startsWith('-Infinity', this.pos))
          return this.parseLiteral('-Infinity', -Infinity);
        if (c === '-' || (c >= '0' && c <= '9')) return this.parseNumber();
        return this.fail(`unexpected character ${JSON.stringify(c)}`);
    }
  }

  private parseLiteral<T extends JsonValue>(word: string, value: T): T {
    if (!this.text.startsWith(word, this.pos)) this.fail(`invalid literal (expected ${word})`);
    this.pos += word.length;
    return value;
  }

  private parseNumber(): number | bigint {
    NUMBER_RE.lastIndex = this.pos;
    const m = NUMBER_RE.exec(this.text);
    if (m === null || m[0] === '-' || m[0].length === 0) this.fail('invalid number');
    const lexeme = m[0];
    this.pos += lexeme.length;
    if (INTEGER_RE.test(lexeme)) {
      const n = Number(lexeme);
      if (Number.isSafeInteger(n)) return n;
      return BigInt(lexeme);
    }
    const n = Number(lexeme);
    if (!Number.isFinite(n)) this.fail(`number ${lexeme} overflows a double`);
    return n;
  }

  private parseString(): string {
    const t = this.text;
    const start = ++this.pos; // after the opening quote
    // Fast path: no escapes.
    let i = start;
    while (i < t.length) {
      const c = t.charCodeAt(i);
      if (c === 0x22) {
        this.pos = i + 1;
        return t.slice(start, i);
      }
      if (c === 0x5c) break;
      if (c < 0x20) {
        this.pos = i;
        this.fail('control character in string');
      }
      i++;
    }
    // Slow path: build with escapes.
    let out = t.slice(start, i);
    while (i < t.length) {
      const c = t.charCodeAt(i);
      if (c === 0x22) {
        this.pos = i + 1;
        return out;
      }
      if (c < 0x20) {
        this.pos = i;
        this.fail('control character in string');
      }
      if (c !== 0x5c) {
        out += t[i];
        i++;
        continue;
      }
      const e = t[i + 1];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          const hex = t.slice(i + 2, i + 6);
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) {
            this.pos = i;
            this.fail('invalid \\u escape');
          }
          out += String.fromCharCode(parseInt(hex, 16));
          i += 4;
          break;
        }
        default:
          this.pos = i;
          this.fail('invalid escape');
      }
      i += 2;
    }
    this.pos = i;
    return this.fail('unterminated string');
  }

  /** JSON path of the value being parsed (`$.a[3].b`), built only for error messages. */
  private currentPath(): string {
    let out = '$';
    for (const k of this.pathStack) out += typeof k === 'number' ? `[${k}]` : `.${k}`;
    return out;
  }

  private parseArray(depth: number): JsonValue[] {
    if (depth > this.maxDepth) this.fail(`nesting deeper than ${this.maxDepth}`);
    this.pos++; // [
    const out: JsonValue[] = [];
    this.skipWhitespace();
    if (this.text[this.pos] === ']') {
      this.pos++;
      return out;
    }
    for (;;) {
      this.skipWhitespace();
      this.pathStack.push(out.length);
      out.push(this.parseValue(depth + 1));
      this.pathStack.pop();
      this.skipWhitespace();
      const c = this.text[this.pos];
      if (c === ',') {
        this.pos++;
        continue;
      }
      if (c === ']') {
        this.pos++;
        return out;
      }
      this.fail("expected ',' or ']' in array");
    }
  }

  private parseObject(depth: number): JsonObject {
    if (depth > this.maxDepth) this.fail(`nesting deeper than ${this.maxDepth}`);
    this.pos++; // {
    const out: JsonObject = {};
    this.skipWhitespace();
    if (this.text[this.pos] === '}') {
      this.pos++;
      return out;
    }
    for (;;) {
      this.skipWhitespace();
      if (this.text[this.pos] !== '"') this.fail('expected a string key in object');
      const keyPos = this.pos;
      const key = this.parseString();
      if (Object.hasOwn(out, key)) {
        this.pos = keyPos;
        this.fail(`duplicate key ${JSON.stringify(key)} in ${this.currentPath()}`);
      }
      this.skipWhitespace();
      if (this.text[this.pos] !== ':') this.fail("expected ':' after object key");
      this.pos++;
      this.skipWhitespace();
      this.pathStack.push(key);
      const value = this.parseValue(depth + 1);
      if (key === '__proto__')
        Object.defineProperty(out, key, { value, enumerable: true, writable: true, configurable: true });
      else out[key] = value;
      this.pathStack.pop();
      this.skipWhitespace();
      const c = this.text[this.pos];
      if (c === ',') {
        this.pos++;
        continue;
      }
      if (c === '}') {
        this.pos++;
        return out;
      }
      this.fail("expected ',' or '}' in object");
    }
  }
}
