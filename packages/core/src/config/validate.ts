/**
 * Validation of a specd config against the merged schema (ajv, JSON Schema 2020-12,
 * `useDefaults: true`, discriminator on `drafter.method`). Errors name the JSON path, the rule
 * (schema keyword) and the offending value:
 *   `$.server.port: maximum: must be <= 65535, got 70000`
 */

import { Ajv2020, type ErrorObject, type ValidateFunction } from 'ajv/dist/2020.js';

/** Thrown for an unreadable or invalid config (message: the file, then one line per error). */
export class ConfigError extends Error {
  override readonly name = 'ConfigError';
  constructor(
    message: string,
    readonly errors: readonly string[] = [],
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** Compiles `schema` (a fresh ajv instance each time: plugin sets differ between calls). */
export function compileConfigSchema(schema: Record<string, unknown>): ValidateFunction {
  const ajv = new Ajv2020({
    allErrors: true,
    useDefaults: true,
    discriminator: true,
    strict: true,
    allowUnionTypes: true,
  });
  return ajv.compile(schema);
}

/** `/a/b/0` → `$.a.b[0]`. */
export function jsonPath(pointer: string): string {
  if (pointer === '') return '$';
  return `$${pointer
    .split('/')
    .slice(1)
    .map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'))
    .map((s) => (/^\d+$/.test(s) ? `[${s}]` : /^[A-Za-z_$][\w$]*$/.test(s) ? `.${s}` : `[${JSON.stringify(s)}]`))
    .join('')}`;
}

function valueAt(root: unknown, pointer: string): unknown {
  let v = root;
  for (const raw of pointer.split('/').slice(1)) {
    const k = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    if (v === null || typeof v !== 'object') return undefined;
    v = (v as Record<string, unknown>)[k];
  }
  return v;
}

const show = (v: unknown): string => {
  const s = JSON.stringify(v);
  return s === undefined ? 'nothing' : s.length > 80 ? `${s.slice(0, 77)}...` : s;
};

/** One line per ajv error: `$.path: rule: message, got value` (oneOf noise of non-chosen branches dropped). */
export function formatConfigErrors(errors: readonly ErrorObject[], data: unknown): string[] {
  const lines: string[] = [];
  for (const e of errors) {
    if (e.keyword === 'oneOf' && errors.length > 1) continue; // the branch errors say more
    let where = e.instancePath;
    let msg = e.message ?? 'invalid';
    let value: unknown = valueAt(data, e.instancePath);
    if (e.keyword === 'additionalProperties') {
      const p = (e.params as { additionalProperty: string }).additionalProperty;
      where = `${where}/${p.replace(/~/g, '~0').replace(/\//g, '~1')}`;
      msg = 'unknown property';
      value = valueAt(data, where);
    } else if (e.keyword === 'required') {
      const p = (e.params as { missingProperty: string }).missingProperty;
      where = `${where}/${p}`;
      msg = 'required property is missing';
      value = undefined;
    } else if (e.keyword === 'discriminator') {
      const { tag } = e.params as { tag: string };
      where = `${where}/${tag}`;
      value = valueAt(data, where);
      msg = 'no drafter method of that name is loaded (see `specd plugins`)';
    } else if (e.keyword === 'enum') {
      msg = `must be one of ${show((e.params as { allowedValues: unknown[] }).allowedValues)}`;
    } else if (e.keyword === 'const') {
      msg = `must be ${show((e.params as { allowedValue: unknown }).allowedValue)}`;
    }
    const line = `${jsonPath(where)}: ${e.keyword}: ${msg}${value === undefined ? '' : `, got ${show(value)}`}`;
    if (!lines.includes(line)) lines.push(line);
  }
  return lines;
}
