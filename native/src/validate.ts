/**
 * Argument validation for the typed wrappers: one helper family that names the call, the
 * parameter, what was expected and what came (the native side checks again; this layer gives
 * TypeScript users the same messages without crossing into C++).
 */

/** Thrown for a bad argument; `code` is `ERR_SPECD_INVALID_ARG`, as for the native checks. */
export class SpecdArgumentError extends TypeError {
  readonly code = 'ERR_SPECD_INVALID_ARG';
  constructor(call: string, param: string, expected: string, got: string) {
    super(`${call}: ${param}: expected ${expected}, got ${got}`);
    this.name = 'SpecdArgumentError';
  }
}

/** Short description of a value for error messages ("Float32Array of length 3", "number 1.5"). */
export function describe(value: unknown): string {
  if (value === null) return 'null';
  if (value === undefined) return 'undefined';
  if (ArrayBuffer.isView(value)) {
    const length = 'length' in value && typeof value.length === 'number' ? value.length : value.byteLength;
    return `${value.constructor.name} of length ${length}`;
  }
  if (typeof value === 'number') return `number ${value}`;
  if (typeof value === 'string') return `string "${value}"`;
  if (Array.isArray(value)) return `Array of length ${value.length}`;
  return typeof value;
}

/** Throws SpecdArgumentError(call, param, expected, describe(got)). */
export function fail(call: string, param: string, expected: string, got: unknown): never {
  throw new SpecdArgumentError(call, param, expected, describe(got));
}

type TypedCtor<T> = { new (length: number): T; readonly name: string };

/**
 * Checks that `value` is a `ctor` typed array, of `length` elements when given (`what` explains
 * the length, e.g. "m*k"); returns it typed.
 */
export function expectArray<T extends Float32Array | Uint16Array | Int32Array>(
  call: string,
  param: string,
  value: unknown,
  ctor: TypedCtor<T>,
  length?: number,
  what?: string,
): T {
  if (value instanceof ctor && (length === undefined || value.length === length)) return value;
  // the message only on failure: this check runs on every native call
  const expected = length === undefined ? ctor.name : `${ctor.name} of length ${length}${what ? ` (${what})` : ''}`;
  return fail(call, param, expected, value);
}

/** Returns `out` checked against (ctor, length), or a new zero-filled array when `out` is undefined. */
export function outArray<T extends Float32Array | Uint16Array | Int32Array>(
  call: string,
  out: unknown,
  ctor: TypedCtor<T>,
  length: number,
  what: string,
): T {
  return out === undefined ? new ctor(length) : expectArray(call, 'out', out, ctor, length, what);
}

/** Checks an integer in [min, max] (inclusive). */
export function expectInt(
  call: string,
  param: string,
  value: unknown,
  min: number,
  max = Number.MAX_SAFE_INTEGER,
): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    fail(call, param, `an integer in [${min}, ${max}]`, value);
  }
  return value;
}

/** Checks a finite number with an optional (exclusive or inclusive) lower and upper bound description. */
export function expectNumber(
  call: string,
  param: string,
  value: unknown,
  test: (v: number) => boolean = () => true,
  expected = 'a finite number',
): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || !test(value)) fail(call, param, expected, value);
  return value;
}

/** Checks that `value` is one of `options`. */
export function expectOneOf<T extends string>(call: string, param: string, value: unknown, options: readonly T[]): T {
  if (typeof value !== 'string' || !(options as readonly string[]).includes(value)) {
    fail(call, param, `one of ${options.map((o) => `"${o}"`).join(', ')}`, value);
  }
  return value as T;
}

/** Checks that `total` splits into rows of `cols` and returns the row count. */
export function rowsOf(call: string, param: string, value: { length: number }, cols: number, colsName: string): number {
  if (value.length % cols !== 0) fail(call, param, `a length divisible by ${colsName} = ${cols}`, value);
  return value.length / cols;
}
