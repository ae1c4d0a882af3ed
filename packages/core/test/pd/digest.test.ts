// The bootstrap digest: fields computed from small checkpoints written here (a Hugging Face folder and a
// GGUF), what changes them and what does not (formatting, weights, where a side loads from), and
// compareDigests naming every differing field while tp / pp only have to be compatible.
import * as fs from 'node:fs';
import * as path from 'node:path';

import { afterAll, describe, expect, it } from 'vitest';

import { GgufValueType, writeSafetensors } from '../../src/io/index.js';
import {
  compareDigests,
  PD_DIGEST_FIELDS,
  PdError,
  pdDigest,
  type PdDigest,
  type PdDigestInputs,
} from '../../src/pd/index.js';
import { buildGguf } from '../io/gguf-builder.js';
import { makeTempDir } from '../io/helpers.js';

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

interface HfOptions {
  config?: string;
  /** Values of the one tensor `w` ([2, 2] f32). */
  weights?: number[];
  /** Shape of `w` (default [2, 2]). */
  shape?: number[];
  tokenizerConfig?: string;
}

/** A Hugging Face folder: config.json, tokenizer.json, model.safetensors with one tensor `w`. */
function hfDir(o: HfOptions = {}): string {
  const dir = makeTempDir('pd-digest');
  dirs.push(dir);
  fs.writeFileSync(path.join(dir, 'config.json'), o.config ?? '{"hidden_size": 4, "architectures": ["X"]}');
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), '{"model": {"vocab": {"a": 0}}}');
  if (o.tokenizerConfig !== undefined) fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), o.tokenizerConfig);
  const shape = o.shape ?? [2, 2];
  const data = Float32Array.from(o.weights ?? new Array(shape[0]! * shape[1]!).fill(1));
  writeSafetensors(path.join(dir, 'model.safetensors'), { w: { dtype: 'F32', shape, data } });
  return dir;
}

const S = (v: string) => ({ t: GgufValueType.STRING as const, v });

/** A GGUF file in its own folder, with an architecture key and a tokenizer vocabulary. */
function ggufFile(o: { arch?: string; tokens?: string[] } = {}): string {
  const dir = makeTempDir('pd-digest-gguf');
  dirs.push(dir);
  const file = path.join(dir, 'model.gguf');
  fs.writeFileSync(
    file,
    buildGguf({
      metadata: [
        ['general.architecture', S(o.arch ?? 'llama')],
        ['tokenizer.ggml.tokens', { t: GgufValueType.ARRAY, of: GgufValueType.STRING, v: o.tokens ?? ['a', 'b'] }],
      ],
      tensors: [{ name: 'w', type: 0, ggmlShape: [4] }],
    }),
  );
  return file;
}

function inputs(target: string, extra: Partial<PdDigestInputs> = {}): PdDigestInputs {
  return { target, pageSize: 16, dtype: 'f32', tp: 1, pp: 1, ...extra };
}

/** The fields in which two digests differ. */
function differing(a: PdDigest, b: PdDigest): string[] {
  return PD_DIGEST_FIELDS.filter((f) => a[f] !== b[f]);
}

/** compareDigests' error message (empty when it does not throw). */
function mismatch(a: PdDigest, b: Readonly<Record<string, string | undefined>>): string {
  try {
    compareDigests(a, b, 'prefill 127.0.0.1:9');
    return '';
  } catch (err) {
    expect(err).toBeInstanceOf(PdError);
    expect((err as PdError).code).toBe('digest');
    return (err as PdError).message;
  }
}

describe('pdDigest', () => {
  it('is the same for equal checkpoints and settings, and names every field', () => {
    const a = pdDigest(inputs(hfDir()));
    const b = pdDigest(inputs(hfDir()));
    expect(Object.keys(a)).toEqual([...PD_DIGEST_FIELDS]);
    expect(a['target.checkpoint']).toMatch(/^[0-9a-f]{64}$/);
    expect(a).toEqual(b);
    expect(a['drafter.method']).toBe('none');
    expect(a['page_size.draft']).toBe('none');
    expect(compareDigests(a, b)).toEqual({ tp: { mine: 1, theirs: 1 }, pp: { mine: 1, theirs: 1 } });
  });

  it('transfer: the data plane (zmq by default); a zmq side and a nixl side are refused naming it', () => {
    const zmq = pdDigest(inputs(hfDir()));
    const nixl = pdDigest(inputs(hfDir(), { transfer: 'nixl' }));
    expect([zmq.transfer, nixl.transfer]).toEqual(['zmq', 'nixl']);
    expect(differing(zmq, nixl)).toEqual(['transfer']);
    expect(mismatch(zmq, nixl)).toBe(
      'bootstrap digest: prefill 127.0.0.1:9 differs in transfer (mine "zmq", theirs "nixl")',
    );
  });

  it("target.config follows config.json's values, not its formatting", () => {
    const base = pdDigest(inputs(hfDir()));
    const reformatted = pdDigest(inputs(hfDir({ config: '{\n  "architectures": ["X"],\n  "hidden_size": 4\n}' })));
    expect(differing(base, reformatted)).toEqual([]);
    const changed = pdDigest(inputs(hfDir({ config: '{"hidden_size": 8, "architectures": ["X"]}' })));
    expect(differing(base, changed)).toEqual(['target.config']);
    const hex12 = '[0-9a-f]{12}…';
    expect(mismatch(base, changed)).toMatch(
      new RegExp(
        `^bootstrap digest: prefill 127\\.0\\.0\\.1:9 differs in target\\.config \\(mine ${hex12}, theirs ${hex12}\\)$`,
      ),
    );
  });

  it('target.checkpoint reads the safetensors headers and sizes, never the weights', () => {
    const base = pdDigest(inputs(hfDir()));
    // other weight values, same header: the same identity (the weights are not read)
    expect(differing(base, pdDigest(inputs(hfDir({ weights: [5, 6, 7, 8] }))))).toEqual([]);
    // another shape: another header
    expect(differing(base, pdDigest(inputs(hfDir({ shape: [1, 4] }))))).toEqual(['target.checkpoint']);
  });

  it('tokenizer covers the tokenizer files', () => {
    const base = pdDigest(inputs(hfDir()));
    const other = pdDigest(inputs(hfDir({ tokenizerConfig: '{"eos_token": "a"}' })));
    expect(differing(base, other)).toEqual(['tokenizer']);
  });

  it('drafter fields: method, checkpoint and settings, without where or how a side loads', () => {
    const target = hfDir();
    const drafterDir = hfDir({ config: '{"architectures": ["D"]}' });
    const settings = { method: 'm', path: drafterDir, num_draft_tokens: 4 };
    const p = pdDigest(
      inputs(target, {
        drafter: { method: 'm', path: drafterDir, settings: { ...settings, context_only: true } },
        draftPageSize: 16,
        draftDtype: 'f32',
      }),
    );
    const elsewhere = hfDir({ config: '{"architectures": ["D"]}' });
    const d = pdDigest(
      inputs(target, {
        drafter: { method: 'm', path: elsewhere, settings: { ...settings, path: elsewhere } },
        draftPageSize: 16,
        draftDtype: 'f32',
      }),
    );
    expect(differing(p, d)).toEqual([]);
    const k8 = pdDigest(
      inputs(target, {
        drafter: { method: 'm', path: drafterDir, settings: { ...settings, num_draft_tokens: 8 } },
        draftPageSize: 32,
        draftDtype: 'f32',
      }),
    );
    expect(differing(p, k8)).toEqual(['drafter.settings', 'page_size.draft']);
    const message = mismatch(p, k8);
    expect(message).toMatch(
      /differs in drafter\.settings \(mine [0-9a-f]{12}…, theirs [0-9a-f]{12}…\), page_size\.draft/,
    );
    expect(message).toMatch(/, page_size\.draft \(mine "16", theirs "32"\)$/);
    const none = pdDigest(inputs(target));
    expect(differing(p, none)).toEqual([
      'drafter.method',
      'drafter.config',
      'drafter.checkpoint',
      'drafter.settings',
      'page_size.draft',
      'dtype.draft',
    ]);
    // a method without a checkpoint
    const lookup = pdDigest(inputs(target, { drafter: { method: 'lookup', settings: { method: 'lookup' } } }));
    expect(lookup['drafter.checkpoint']).toBe('none');
    expect(lookup['drafter.settings']).toMatch(/^[0-9a-f]{64}$/);
  });

  it('a GGUF: config from its metadata, identity from its header, tokenizer from tokenizer.* or tokenizer.json', () => {
    const base = pdDigest(inputs(ggufFile()));
    expect(differing(base, pdDigest(inputs(ggufFile())))).toEqual([]);
    const otherTokens = pdDigest(inputs(ggufFile({ tokens: ['a', 'c'] })));
    expect(differing(base, otherTokens)).toEqual(['target.checkpoint', 'tokenizer']);
    const otherArch = pdDigest(inputs(ggufFile({ arch: 'llamb' })));
    expect(differing(base, otherArch)).toEqual(['target.config', 'target.checkpoint']);
    // a folder holding one GGUF is the same target; a tokenizer.json beside it wins over the metadata
    const file = ggufFile();
    const folder = pdDigest(inputs(path.dirname(file)));
    expect(differing(base, folder)).toEqual([]);
    fs.writeFileSync(path.join(path.dirname(file), 'tokenizer.json'), '{}');
    expect(differing(base, pdDigest(inputs(file)))).toEqual(['tokenizer']);
  });

  it('refuses a size that is not a positive integer', () => {
    expect(() => pdDigest(inputs(hfDir(), { tp: 0 }))).toThrow(/PD digest: tp: expected an integer >= 1, got 0/);
    expect(() => pdDigest(inputs(hfDir(), { pageSize: 1.5 }))).toThrow(/pageSize/);
  });
});

describe('compareDigests', () => {
  const mine = pdDigest(inputs(hfDir(), { tp: 4, pp: 2 }));

  it('accepts another tp and pp and reports both sides', () => {
    expect(compareDigests(mine, { ...mine, tp: '32', pp: '1' })).toEqual({
      tp: { mine: 4, theirs: 32 },
      pp: { mine: 2, theirs: 1 },
    });
  });

  it('names every differing, missing or unknown field, and an unusable tp', () => {
    const { tokenizer: _dropped, ...rest } = mine;
    const theirs = { ...rest, 'dtype.target': 'bf16', tp: 'four', extra: 'x' };
    const message = mismatch(mine, theirs);
    expect(message).toContain('tokenizer (mine ');
    expect(message).toContain(', theirs absent)');
    expect(message).toContain('dtype.target (mine "f32", theirs "bf16")');
    expect(message).toContain('extra (theirs "x", not a field here)');
    expect(message).toContain('tp (theirs "four": expected a positive integer)');
    expect(message).not.toContain('pp');
  });
});
