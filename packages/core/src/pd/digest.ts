/**
 * The bootstrap digest of prefill/decode disaggregation: P and D each compute a record of named field
 * digests from what they loaded and compare them when they connect, so two instances that would hand over
 * state that does not fit (another checkpoint, tokenizer, drafter setting, page size or dtype) are refused
 * at connection time, naming the field — not by a wrong answer later (vLLM does this for its speculative
 * config, vllm-project/vllm#49230).
 *
 * Fields ({@link PD_DIGEST_FIELDS}); content fields are SHA-256 hex digests, small settings their value
 * (readable in an error):
 * - `target.config`: a Hugging Face folder's config.json (canonical JSON: keys sorted, whitespace dropped);
 *   a GGUF file's metadata except the `tokenizer.*` keys (canonical JSON).
 * - `target.checkpoint` (cheap for a huge checkpoint: the weights are never read): a Hugging Face folder's
 *   model.safetensors.index.json (canonical JSON, when present) and, for every `*.safetensors` file of the
 *   folder in name order, its name, its size in bytes and its header bytes `[0, 8 + N)` (the u64 length N
 *   and the JSON header: every tensor's name, dtype, shape and offsets). A GGUF file: its size and its bytes
 *   before the data section (header, metadata, tensor infos); locating the data section parses the file with
 *   core's GgufFile, which reads it (at most 2 GiB, as when loading it).
 * - `tokenizer`: `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`, `chat_template.jinja`
 *   (each file's bytes, or its absence) of the tokenizer folder — the target's, or the GGUF's folder when it
 *   holds a tokenizer.json, as `loadTarget` picks; else the GGUF's `tokenizer.*` metadata (canonical JSON).
 * - `drafter.method`: the method name (`'none'` without a drafter); `drafter.config`, `drafter.checkpoint`:
 *   as the target's, of the drafter checkpoint (`'none'` for a method without one); `drafter.settings`: the
 *   config's drafter branch (canonical JSON) without the keys that say where or how one side loads rather
 *   than what it computes ({@link DIGEST_IGNORED_SETTINGS}: `path`, `context_only`).
 * - `page_size.target`, `page_size.draft` (tokens per page; `'none'` without draft KV), `dtype.target`,
 *   `dtype.draft` (the caches' dtypes, e.g. `'f32'`).
 * - `transfer`: the data plane, `pd.transfer` (`'zmq'` or `'nixl'`): the two engines do not talk to each other.
 * - `draft_context`: `pd.draft_context` (`'kv'`, `'features'`, `'auto'`): D asks for the form, P must keep it.
 * - `tp`, `pp`: the side's tensor- and pipeline-parallel sizes. They may differ between P and D (the
 *   transfer plan maps one layout onto the other), so {@link compareDigests} only checks that they are
 *   positive integers and reports them.
 */

import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as nodePath from 'node:path';

import { GgufFile } from '../io/gguf.js';
import { checkHeaderLength } from '../io/safetensors-format.js';
import { ggufPathOf } from '../runtime/target.js';
import { PdError } from './types.js';

/** The digest's fields, in the order they are reported. */
export const PD_DIGEST_FIELDS = [
  'target.config',
  'target.checkpoint',
  'tokenizer',
  'drafter.method',
  'drafter.config',
  'drafter.checkpoint',
  'drafter.settings',
  'page_size.target',
  'page_size.draft',
  'dtype.target',
  'dtype.draft',
  'transfer',
  'draft_context',
  'tp',
  'pp',
] as const;

/** One field of the digest. */
export type PdDigestField = (typeof PD_DIGEST_FIELDS)[number];

/** A side's digest: field → hex digest, or the setting's value (module comment). */
export type PdDigest = Readonly<Record<PdDigestField, string>>;

/** Drafter settings keys left out of `drafter.settings` (where or how a side loads, not what it computes). */
export const DIGEST_IGNORED_SETTINGS: readonly string[] = ['path', 'context_only'];

/** The drafter a side runs. */
export interface PdDrafterIdentity {
  /** Method name (`Drafter.method`). */
  readonly method: string;
  /** Its checkpoint folder; absent for a method without one. */
  readonly path?: string;
  /** The config's drafter branch (validated, defaults filled in); absent = none given. */
  readonly settings?: Readonly<Record<string, unknown>>;
}

/** What a side's digest is computed from: paths and plain values. */
export interface PdDigestInputs {
  /** The target: a Hugging Face folder, a `.gguf` file, or a folder holding one `.gguf` and no config.json. */
  readonly target: string;
  /** The drafter; absent = plain decoding. */
  readonly drafter?: PdDrafterIdentity;
  /** Target KV tokens per page. */
  readonly pageSize: number;
  /** Draft KV tokens per page; absent = the drafter keeps no KV pages. */
  readonly draftPageSize?: number;
  /** The target caches' dtype (e.g. `'f32'`). */
  readonly dtype: string;
  /** The draft caches' dtype; absent = no draft KV. */
  readonly draftDtype?: string;
  /** The transfer engine (`pd.transfer`; default `'zmq'`). */
  readonly transfer?: 'zmq' | 'nixl';
  /** The draft context's form (`pd.draft_context`; default `'kv'`). */
  readonly draftContext?: 'kv' | 'features' | 'auto';
  /** Tensor-parallel size of this side (≥ 1). */
  readonly tp: number;
  /** Pipeline-parallel size of this side (≥ 1). */
  readonly pp: number;
}

/**
 * Computes a side's digest (module comment).
 * @throws {PdError} `'digest'` for a tp / pp / page size that is not a positive integer; the file readers'
 *   errors (`SafetensorsError`, `GgufError`, a missing config.json) naming the file.
 */
export function pdDigest(inputs: PdDigestInputs): PdDigest {
  const positive = (name: string, v: number): string => {
    if (!(Number.isSafeInteger(v) && v >= 1))
      throw new PdError('digest', `PD digest: ${name}: expected an integer >= 1, got ${v}`);
    return String(v);
  };
  const target = checkpointDigests(inputs.target);
  const d = inputs.drafter;
  const drafter = d?.path === undefined ? undefined : checkpointDigests(d.path);
  const settings =
    d?.settings === undefined
      ? {}
      : Object.fromEntries(Object.entries(d.settings).filter(([k]) => !DIGEST_IGNORED_SETTINGS.includes(k)));
  return {
    'target.config': target.config,
    'target.checkpoint': target.checkpoint,
    tokenizer: target.tokenizer,
    'drafter.method': d?.method ?? 'none',
    'drafter.config': drafter?.config ?? 'none',
    'drafter.checkpoint': drafter?.checkpoint ?? 'none',
    'drafter.settings': d === undefined ? 'none' : sha256(canonicalJson(settings)),
    'page_size.target': positive('pageSize', inputs.pageSize),
    'page_size.draft': inputs.draftPageSize === undefined ? 'none' : positive('draftPageSize', inputs.draftPageSize),
    'dtype.target': inputs.dtype,
    'dtype.draft': inputs.draftDtype ?? 'none',
    transfer: inputs.transfer ?? 'zmq',
    draft_context: inputs.draftContext ?? 'kv',
    tp: positive('tp', inputs.tp),
    pp: positive('pp', inputs.pp),
  };
}

/** The parallel layouts of both sides, as {@link compareDigests} reports them. */
export interface PdParallelism {
  readonly tp: { readonly mine: number; readonly theirs: number };
  readonly pp: { readonly mine: number; readonly theirs: number };
}

/**
 * Compares this side's digest with the peer's (as received): every field but `tp` and `pp` must be equal;
 * `tp` and `pp` need only be compatible (positive integers on both sides; they may differ) and are returned.
 * @param peer names the peer in the message (e.g. `'prefill 127.0.0.1:41234'`).
 * @param labels how the message names the two sides' values (default `mine` / `theirs`; the prefill role says
 *   `prefill` / `decode`, so that the refusal reads the same on both sides).
 * @throws {PdError} `'digest'` naming every field that differs or is missing on either side (with both values,
 *   digests shortened to 12 hex digits), and any field the peer sent that this side does not know.
 */
export function compareDigests(
  mine: PdDigest,
  theirs: Readonly<Record<string, string | undefined>>,
  peer = 'the peer',
  labels: { readonly mine: string; readonly theirs: string } = { mine: 'mine', theirs: 'theirs' },
): PdParallelism {
  const show = (v: string | undefined): string =>
    v === undefined ? 'absent' : /^[0-9a-f]{64}$/.test(v) ? `${v.slice(0, 12)}…` : JSON.stringify(v);
  const problems: string[] = [];
  for (const field of PD_DIGEST_FIELDS) {
    if (field === 'tp' || field === 'pp') continue;
    const m = mine[field];
    const t = theirs[field];
    if (m !== t) problems.push(`${field} (${labels.mine} ${show(m)}, ${labels.theirs} ${show(t)})`);
  }
  const known: readonly string[] = PD_DIGEST_FIELDS;
  for (const field of Object.keys(theirs))
    if (!known.includes(field)) problems.push(`${field} (${labels.theirs} ${show(theirs[field])}, not a field here)`);
  const parallel = (field: 'tp' | 'pp') => {
    const t = theirs[field];
    const n = t !== undefined && /^[1-9][0-9]*$/.test(t) ? Number(t) : Number.NaN;
    if (!Number.isSafeInteger(n)) problems.push(`${field} (${labels.theirs} ${show(t)}: expected a positive integer)`);
    return { mine: Number(mine[field]), theirs: n };
  };
  const result = { tp: parallel('tp'), pp: parallel('pp') };
  if (problems.length > 0) throw new PdError('digest', `bootstrap digest: ${peer} differs in ${problems.join(', ')}`);
  return result;
}

// ---- checkpoint identity -----------------------------------------------------------------------

/** The content digests of one checkpoint (module comment). */
interface CheckpointDigests {
  readonly config: string;
  readonly checkpoint: string;
  readonly tokenizer: string;
}

/** Tokenizer files of a Hugging Face folder, as `Tokenizer.load` reads them. */
const TOKENIZER_FILES = ['tokenizer.json', 'tokenizer_config.json', 'generation_config.json', 'chat_template.jinja'];

function checkpointDigests(path: string): CheckpointDigests {
  const gguf = ggufPathOf(path);
  return gguf === undefined ? hfDigests(path) : ggufDigests(gguf);
}

function hfDigests(dir: string): CheckpointDigests {
  const configFile = nodePath.join(dir, 'config.json');
  if (!fs.existsSync(configFile))
    throw new PdError('digest', `PD digest: ${dir}: no config.json (neither a Hugging Face folder nor a GGUF)`);
  const hash = createHash('sha256');
  const indexFile = nodePath.join(dir, 'model.safetensors.index.json');
  if (fs.existsSync(indexFile)) feed(hash, 'index', canonicalJson(readJson(indexFile)));
  const shards = fs
    .readdirSync(dir)
    .filter((f) => f.endsWith('.safetensors'))
    .sort();
  for (const name of shards) {
    const { size, header } = safetensorsHeader(nodePath.join(dir, name));
    feed(hash, 'file', name);
    feed(hash, 'size', String(size));
    feed(hash, 'header', header);
  }
  return {
    config: sha256(canonicalJson(readJson(configFile))),
    checkpoint: hash.digest('hex'),
    tokenizer: tokenizerFilesDigest(dir),
  };
}

function ggufDigests(file: string): CheckpointDigests {
  const gguf = GgufFile.open(file);
  const config: Record<string, unknown> = {};
  const tokenizer: Record<string, unknown> = {};
  for (const [key, entry] of gguf.metadata)
    (key.startsWith('tokenizer.') ? tokenizer : config)[key] = { type: entry.type, value: entry.value };
  const hash = createHash('sha256');
  feed(hash, 'size', String(gguf.byteLength));
  feed(hash, 'header', readBytes(file, 0, gguf.dataStartBytes));
  const dir = nodePath.dirname(file);
  return {
    config: sha256(canonicalJson(config)),
    checkpoint: hash.digest('hex'),
    // as loadTarget: a tokenizer.json beside the GGUF wins over its metadata
    tokenizer: fs.existsSync(nodePath.join(dir, 'tokenizer.json'))
      ? tokenizerFilesDigest(dir)
      : sha256(canonicalJson(tokenizer)),
  };
}

function tokenizerFilesDigest(dir: string): string {
  const hash = createHash('sha256');
  for (const name of TOKENIZER_FILES) {
    const file = nodePath.join(dir, name);
    feed(hash, 'file', name);
    feed(hash, 'content', fs.existsSync(file) ? fs.readFileSync(file) : '<absent>');
  }
  return hash.digest('hex');
}

/** A safetensors file's size and header bytes `[0, 8 + N)`. @throws `SafetensorsError` on a bad header length. */
function safetensorsHeader(file: string): { size: number; header: Uint8Array } {
  const size = fs.statSync(file).size;
  const prefix = readBytes(file, 0, Math.min(8, size));
  const n = checkHeaderLength(file, prefix, size);
  return { size, header: readBytes(file, 0, 8 + n) };
}

/** Bytes `[offset, offset + length)` of `file`. */
function readBytes(file: string, offset: number, length: number): Uint8Array {
  const out = new Uint8Array(length);
  const fd = fs.openSync(file, 'r');
  try {
    let at = 0;
    while (at < length) {
      const n = fs.readSync(fd, out, at, length - at, offset + at);
      if (n === 0) throw new PdError('digest', `PD digest: ${file}: ends before byte ${offset + length}`);
      at += n;
    }
  } finally {
    fs.closeSync(fd);
  }
  return out;
}

function readJson(file: string): unknown {
  try {
    return JSON.parse(fs.readFileSync(file, 'utf8')) as unknown;
  } catch (err) {
    throw new PdError('digest', `PD digest: ${file}: not valid JSON (${(err as Error).message})`);
  }
}

// ---- hashing -----------------------------------------------------------------------------------

/** SHA-256 hex of a string (UTF-8). */
function sha256(text: string): string {
  return createHash('sha256').update(text, 'utf8').digest('hex');
}

/** Feeds a tagged, length-prefixed part (so parts cannot run into each other). */
function feed(hash: ReturnType<typeof createHash>, tag: string, part: string | Uint8Array): void {
  const bytes = typeof part === 'string' ? Buffer.from(part, 'utf8') : part;
  hash.update(`${tag}:${bytes.byteLength}:`, 'utf8');
  hash.update(bytes);
}

/**
 * JSON with object keys sorted at every depth; bigints as decimal strings, typed arrays and arrays as
 * arrays, Maps as objects (GGUF metadata values).
 */
export function canonicalJson(value: unknown): string {
  const norm = (v: unknown): unknown => {
    if (typeof v === 'bigint') return v.toString();
    if (ArrayBuffer.isView(v) && !(v instanceof DataView)) return Array.from(v as unknown as ArrayLike<unknown>, norm);
    if (Array.isArray(v)) return v.map(norm);
    if (v instanceof Map) return norm(Object.fromEntries(v));
    if (v !== null && typeof v === 'object') {
      const obj = v as Record<string, unknown>;
      return Object.fromEntries(
        Object.keys(obj)
          .sort()
          .map((k) => [k, norm(obj[k])]),
      );
    }
    return v;
  };
  return JSON.stringify(norm(value));
}
