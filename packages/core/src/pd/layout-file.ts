/**
 * The PD layout file read by `specd pd plan` (docs/PD-PLANNER.md): both sides' layouts and one
 * request's page mapping, as an engineer writes them to check a deployment before running it. JSON,
 * parsed strictly (duplicate keys refused), validated by {@link PD_LAYOUT_SCHEMA} (ajv, JSON Schema
 * 2020-12, defaults filled in) and then by the checks the schema cannot state; every error is one
 * `$.json.path: reason` line.
 *
 *   { "dtype": "bf16", "page_size": 64, "target_layers"?: 93,
 *     "region": {"kind"?: "target-kv" | "draft-kv", "layers": 6, "kv_heads": 8, "head_dim": 128, "window"?: 4096},
 *     "mla"?: {"layers": [3, 7, …], "kv_lora_rank": 512, "qk_rope_head_dim": 64, "dtype"?, "pages"?},
 *     "kda"?: {"layers": [0, 1, 2, …], "num_heads": 32, "head_dim": 128, "conv_kernel": 4, "dtype"?: "f32",
 *              "slots"?: [[0, 0]]},
 *     "prefill": {"tp": 4, "pp"?: 8, "partition"?: [...], "base_address": 0, "num_pages": 1024,
 *                 "mla_pages"?, "num_slots"?},
 *     "decode": {…the same fields…},
 *     "pages": [[src, dst], …] }
 *
 * Regions, in buffer order: `region` (K and V per layer, split by KV head; `draft-kv` lives on the last
 * stage), `mla` (one latent + rope row per token, replicated), `kda-state` (per slot `[heads, dK·dV]`,
 * by head) and `kda-conv` (per slot `[3 (q, k, v), heads, headDim·(kernel − 1)]`, by head). Layer ids
 * are 0-based absolute target layers (a Hugging Face config's `full_attn_layers` / `kda_layers` are
 * 1-based).
 */

import * as fs from 'node:fs';

import { compileConfigSchema, formatConfigErrors } from '../config/validate.js';
import { parseStrictJson } from '../io/strict-json.js';
import { defaultPartition, PartitionError, partitionRanges } from '../pipeline/partition.js';
import { type PdRegionSpec, type PdSideLayout, placeSide, tpFitsHeads } from './placement.js';
import type { PdUnitMapping, PdUnitPair } from './planner.js';
import { PdError } from './types.js';

/** Bytes per element of the dtypes a layout file may name. */
export const PD_DTYPE_BYTES = Object.freeze({ f32: 4, f16: 2, bf16: 2, fp8: 1 } as const);
export type PdDtype = keyof typeof PD_DTYPE_BYTES;

const count = (min: number, description: string) => ({ type: 'integer', minimum: min, description }) as const;
const dtype = { enum: Object.keys(PD_DTYPE_BYTES) } as const;
const pairs = (what: string) =>
  ({
    type: 'array',
    description: `[source ${what}, destination ${what}] pairs, in order (adjacent runs are coalesced)`,
    items: { type: 'array', prefixItems: [count(0, 'prefill'), count(0, 'decode')], items: false, minItems: 2 },
  }) as const;
const layerList = {
  type: 'array',
  items: count(0, '0-based absolute target layer'),
  minItems: 1,
  uniqueItems: true,
} as const;
const sideSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['tp', 'base_address', 'num_pages'],
  properties: {
    tp: count(1, 'TP ranks per stage'),
    pp: { ...count(1, 'pipeline stages'), default: 1 },
    partition: {
      type: 'array',
      items: count(1, 'layers'),
      minItems: 1,
      description: "target layers per stage (length pp); default the engine's split",
    },
    base_address: count(0, "where every (stage, rank)'s first buffer starts, bytes"),
    num_pages: count(0, "pages in the region's pool on every rank"),
    mla_pages: count(0, 'pages of the MLA pool (default num_pages)'),
    num_slots: count(1, 'KDA state slots (default 1)'),
  },
} as const;

/** The layout file's JSON Schema (2020-12); `specd pd plan` validates with it, defaults filled in. */
export const PD_LAYOUT_SCHEMA = Object.freeze({
  $schema: 'https://json-schema.org/draft/2020-12/schema',
  $id: 'https://specd.dev/schemas/pd-layout.json',
  title: 'specd PD layout (pd plan)',
  type: 'object',
  additionalProperties: false,
  required: ['dtype', 'page_size', 'region', 'prefill', 'decode', 'pages'],
  properties: {
    $schema: { type: 'string' },
    description: { type: 'string' },
    dtype: { ...dtype, description: 'KV element type of region (and of mla unless it says)' },
    page_size: count(1, 'tokens per page'),
    target_layers: count(1, 'target layers (default: region.layers when region is target-kv)'),
    region: {
      type: 'object',
      additionalProperties: false,
      required: ['layers', 'kv_heads', 'head_dim'],
      properties: {
        kind: { enum: ['target-kv', 'draft-kv'], default: 'target-kv' },
        layers: count(1, 'layers (target-kv: layers 0 … n−1 of the target; draft-kv: draft layers)'),
        kv_heads: count(1, 'KV heads in all'),
        head_dim: count(1, 'elements per head'),
        window: count(1, 'sliding window, tokens (a request sends only the pages of its last window rows)'),
        feature_width: count(
          1,
          "draft-kv: elements of the drafter's projected feature per row (its hidden size), for the bytes of " +
            'pd.draft_context "features"',
        ),
      },
    },
    mla: {
      type: 'object',
      additionalProperties: false,
      required: ['layers', 'kv_lora_rank', 'qk_rope_head_dim'],
      properties: {
        layers: layerList,
        kv_lora_rank: count(1, 'latent width'),
        qk_rope_head_dim: count(0, 'rope slice width'),
        dtype,
        pages: pairs('page'),
      },
    },
    kda: {
      type: 'object',
      additionalProperties: false,
      required: ['layers', 'num_heads', 'head_dim', 'conv_kernel'],
      properties: {
        layers: layerList,
        num_heads: count(1, 'KDA heads'),
        head_dim: count(1, 'dK = dV'),
        conv_kernel: count(2, 'short_conv_kernel_size'),
        dtype: { ...dtype, default: 'f32' },
        slots: { ...pairs('slot'), default: [[0, 0]] },
      },
    },
    prefill: sideSchema,
    decode: sideSchema,
    pages: pairs('page'),
  },
});

/** A parsed layout file: the planner's inputs. */
export interface PdLayout {
  readonly dtype: PdDtype;
  /** Tokens per page. */
  readonly pageSize: number;
  /** Window of `region`, tokens, when given. */
  readonly window?: number;
  /** A draft-kv region's projected-feature width, elements per row (`feature_width`), when given. */
  readonly featureWidth?: number;
  /** In buffer order. */
  readonly regions: readonly PdRegionSpec[];
  readonly prefill: PdSideLayout;
  readonly decode: PdSideLayout;
  readonly mapping: PdUnitMapping;
}

interface SideJson {
  tp: number;
  pp: number;
  partition?: number[];
  base_address: number;
  num_pages: number;
  mla_pages?: number;
  num_slots?: number;
}
interface LayoutJson {
  dtype: PdDtype;
  page_size: number;
  target_layers?: number;
  region: {
    kind: 'target-kv' | 'draft-kv';
    layers: number;
    kv_heads: number;
    head_dim: number;
    window?: number;
    feature_width?: number;
  };
  mla?: {
    layers: number[];
    kv_lora_rank: number;
    qk_rope_head_dim: number;
    dtype?: PdDtype;
    pages?: [number, number][];
  };
  kda?: {
    layers: number[];
    num_heads: number;
    head_dim: number;
    conv_kernel: number;
    dtype: PdDtype;
    slots: [number, number][];
  };
  prefill: SideJson;
  decode: SideJson;
  pages: [number, number][];
}

/** The JSON path of the first bigint (an integer beyond 2^53) in `v`, if any. */
function bigintAt(v: unknown, at: string): string | undefined {
  if (typeof v === 'bigint') return at;
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) {
      const p = bigintAt(v[i], `${at}[${i}]`);
      if (p !== undefined) return p;
    }
  } else if (v !== null && typeof v === 'object') {
    for (const [k, x] of Object.entries(v)) {
      const p = bigintAt(x, /^[A-Za-z_$][\w$]*$/.test(k) ? `${at}.${k}` : `${at}[${JSON.stringify(k)}]`);
      if (p !== undefined) return p;
    }
  }
  return undefined;
}

/** The checks the schema cannot state, one `$.path: reason` line each. */
function semanticErrors(j: LayoutJson): string[] {
  const errors: string[] = [];
  const targetKv = j.region.kind === 'target-kv';
  const staged = j.prefill.pp > 1 || j.decode.pp > 1 || j.prefill.partition !== undefined;
  const needLayers = j.mla !== undefined || j.kda !== undefined || staged || j.decode.partition !== undefined;
  // a draft region alone at pp 1 on both sides does not depend on the target's layer count
  const numLayers = j.target_layers ?? (targetKv ? j.region.layers : needLayers ? undefined : 1);
  if (numLayers === undefined)
    errors.push(
      '$.target_layers: required with a draft-kv region when mla / kda is given or a side has pp > 1 ' +
        "(the stages' layer ranges need the target's layer count)",
    );
  if (numLayers !== undefined && targetKv && j.region.layers > numLayers)
    errors.push(`$.region.layers: ${j.region.layers} target layers, the target has ${numLayers} (target_layers)`);
  for (const [name, layers] of [
    ['mla', j.mla?.layers],
    ['kda', j.kda?.layers],
  ] as const) {
    layers?.forEach((l, i) => {
      if (numLayers !== undefined && l >= numLayers)
        errors.push(`$.${name}.layers[${i}]: layer ${l} is outside the target's ${numLayers} layers`);
    });
  }
  for (const sideName of ['prefill', 'decode'] as const) {
    const s = j[sideName];
    if (numLayers !== undefined) {
      try {
        partitionRanges(s.partition ?? defaultPartition(numLayers, s.pp), numLayers, s.pp);
      } catch (e) {
        if (!(e instanceof PartitionError)) throw e;
        errors.push(`$.${sideName}.${s.partition === undefined ? 'pp' : 'partition'}: ${e.message}`);
      }
    }
    const heads: [string, number][] = [['region.kv_heads', j.region.kv_heads]];
    if (j.kda !== undefined) heads.push(['kda.num_heads', j.kda.num_heads]);
    for (const [field, h] of heads) {
      const why = tpFitsHeads(h, s.tp);
      if (why !== undefined) errors.push(`$.${sideName}.tp: ${why} (${field})`);
    }
  }
  return [...errors, ...unitErrors(j)];
}

/** The unit mappings' checks: units in range on both sides, no destination unit twice. */
function unitErrors(j: LayoutJson): string[] {
  const errors: string[] = [];
  const checkPairs = (at: string, list: readonly PdUnitPair[], what: string, src: number, dst: number): void => {
    const seen = new Map<number, number>();
    list.forEach(([s, d], i) => {
      if (s >= src) errors.push(`${at}[${i}][0]: ${what} ${s} out of range (prefill has ${src})`);
      if (d >= dst) errors.push(`${at}[${i}][1]: ${what} ${d} out of range (decode has ${dst})`);
      const before = seen.get(d);
      if (before !== undefined)
        errors.push(`${at}[${i}][1]: ${what} ${d} is already the destination of ${at}[${before}]`);
      seen.set(d, i);
    });
  };
  checkPairs('$.pages', j.pages, 'page', j.prefill.num_pages, j.decode.num_pages);
  if (j.mla?.pages !== undefined)
    checkPairs(
      '$.mla.pages',
      j.mla.pages,
      'page',
      j.prefill.mla_pages ?? j.prefill.num_pages,
      j.decode.mla_pages ?? j.decode.num_pages,
    );
  if (j.kda !== undefined)
    checkPairs('$.kda.slots', j.kda.slots, 'slot', j.prefill.num_slots ?? 1, j.decode.num_slots ?? 1);
  return errors;
}

/**
 * Validates a parsed layout object (defaults are filled in place) and turns it into planner inputs.
 * @param where names the source in errors (the file).
 * @throws {PdError} `'layout'`: `where: $.path: reason; …` (every schema and semantic error).
 */
export function parseLayout(data: unknown, where = 'layout'): PdLayout {
  const fail = (lines: readonly string[]): PdError => new PdError('layout', `${where}: ${lines.join('; ')}`);
  const big = bigintAt(data, '$');
  if (big !== undefined) throw fail([`${big}: an integer beyond 2^53 (not exact as a number)`]);
  const validate = compileConfigSchema(PD_LAYOUT_SCHEMA as unknown as Record<string, unknown>);
  if (!validate(data)) throw fail(formatConfigErrors(validate.errors ?? [], data));
  const j = data as LayoutJson;
  const errors = semanticErrors(j);
  if (errors.length > 0) throw fail(errors);

  const draft = j.region.kind === 'draft-kv';
  const numLayers = j.target_layers ?? (draft ? 1 : j.region.layers);
  const regionName = j.region.kind;
  const regions: PdRegionSpec[] = [
    {
      name: regionName,
      kind: j.region.kind,
      layers: Array.from({ length: j.region.layers }, (_, i) => i),
      parts: ['k', 'v'],
      unit: 'page',
      rowsPerUnit: j.page_size,
      heads: j.region.kv_heads,
      headBytes: j.region.head_dim * PD_DTYPE_BYTES[j.dtype],
      split: 'heads',
      ...(j.region.window === undefined ? {} : { window: j.region.window }),
      ...(draft ? { drafter: true } : {}),
    },
  ];
  const units = (s: SideJson): Record<string, number> => ({ [regionName]: s.num_pages });
  const pUnits = units(j.prefill);
  const dUnits = units(j.decode);
  const mapping: Record<string, readonly PdUnitPair[]> = { [regionName]: j.pages };
  if (j.mla !== undefined) {
    regions.push({
      name: 'mla',
      kind: 'target-kv',
      layers: [...j.mla.layers].sort((a, b) => a - b),
      parts: [''],
      unit: 'page',
      rowsPerUnit: j.page_size,
      heads: 1,
      headBytes: (j.mla.kv_lora_rank + j.mla.qk_rope_head_dim) * PD_DTYPE_BYTES[j.mla.dtype ?? j.dtype],
      split: 'replicated',
    });
    pUnits.mla = j.prefill.mla_pages ?? j.prefill.num_pages;
    dUnits.mla = j.decode.mla_pages ?? j.decode.num_pages;
    mapping.mla = j.mla.pages ?? j.pages;
  }
  if (j.kda !== undefined) {
    const k = j.kda;
    const bytes = PD_DTYPE_BYTES[k.dtype];
    const base = {
      layers: [...k.layers].sort((a, b) => a - b),
      parts: [''],
      unit: 'slot',
      heads: k.num_heads,
    } as const;
    regions.push(
      {
        ...base,
        name: 'kda-state',
        kind: 'linear-state',
        rowsPerUnit: 1,
        headBytes: k.head_dim ** 2 * bytes,
        split: 'heads',
      },
      {
        ...base,
        name: 'kda-conv',
        kind: 'conv-state',
        rowsPerUnit: 3,
        headBytes: k.head_dim * (k.conv_kernel - 1) * bytes,
        split: 'heads',
      },
    );
    for (const [u, s] of [
      [pUnits, j.prefill],
      [dUnits, j.decode],
    ] as const) {
      u['kda-state'] = s.num_slots ?? 1;
      u['kda-conv'] = s.num_slots ?? 1;
    }
    mapping['kda-state'] = k.slots;
    mapping['kda-conv'] = k.slots;
  }
  const side = (s: SideJson, numUnits: Record<string, number>): PdSideLayout => ({
    tp: s.tp,
    pp: s.pp,
    ...(s.partition === undefined ? {} : { partition: s.partition }),
    numLayers,
    baseAddress: s.base_address,
    numUnits,
  });
  const layout: PdLayout = {
    dtype: j.dtype,
    pageSize: j.page_size,
    ...(j.region.window === undefined ? {} : { window: j.region.window }),
    ...(j.region.feature_width === undefined ? {} : { featureWidth: j.region.feature_width }),
    regions,
    prefill: side(j.prefill, pUnits),
    decode: side(j.decode, dUnits),
    mapping,
  };
  try {
    placeSide(regions, layout.prefill, 'prefill');
    placeSide(regions, layout.decode, 'decode');
  } catch (e) {
    if (e instanceof PdError) throw fail([e.message]);
    throw e;
  }
  return layout;
}

/**
 * Reads, parses (strict JSON) and validates a layout file.
 * @throws {PdError} `'layout'`: `FILE: cannot read …`, `FILE: not valid JSON: …`, or `FILE: $.path: reason; …`.
 */
export function loadLayoutFile(file: string): PdLayout {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (cause) {
    throw new PdError('layout', `${file}: cannot read: ${(cause as Error).message}`);
  }
  let data: unknown;
  try {
    data = parseStrictJson(text);
  } catch (cause) {
    throw new PdError('layout', `${file}: not valid JSON: ${(cause as Error).message}`);
  }
  return parseLayout(data, file);
}
