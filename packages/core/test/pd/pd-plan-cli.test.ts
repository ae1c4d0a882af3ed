// `specd pd plan`: the summary and the --json copy list of the shipped Kimi-K3 layout files
// (configs/pd/), the payload per request, and bad layout files failing with `FILE: $.path: reason`.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, describe, expect, it } from 'vitest';

import { type CliIo, main } from '../../src/cli/index.js';
import { makeTempDir } from '../io/helpers.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const DRAFT = 'configs/pd/kimi-k3-draft-tp4pp8-to-tp32.json';
const FULL = 'configs/pd/kimi-k3-full-tp4pp8-to-tp32.json';
const REVERSE = 'configs/pd/kimi-k3-draft-tp32-to-tp4pp2.json';
const tmp = makeTempDir('pd-plan');
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

async function run(args: string[]): Promise<{ code: number; out: string; err: string }> {
  let out = '';
  let err = '';
  const io: CliIo = {
    stdout: { write: (s: string) => (out += s) },
    stderr: { write: (s: string) => (err += s) },
    cwd: ROOT,
  };
  const code = await main(args, io);
  return { code, out, err };
}

/** The fields of a layout file the bad-file cases change. */
interface LayoutEdit {
  dtype?: string;
  target_layers?: number;
  pages?: number[][];
  prefill: Record<string, unknown>;
  decode: Record<string, unknown>;
}

const draftJson = JSON.parse(fs.readFileSync(path.join(ROOT, DRAFT), 'utf8')) as Record<string, unknown>;

/** Writes `draftJson` changed by `edit` to a temp file; returns its path. */
function variant(name: string, edit: (j: LayoutEdit) => void): string {
  const j = structuredClone(draftJson) as unknown as LayoutEdit;
  edit(j);
  const file = path.join(tmp, `${name}.json`);
  fs.writeFileSync(file, JSON.stringify(j));
  return file;
}

describe('specd pd plan', () => {
  it('summary: each side its own item size, copies by rank pair, payload per request', async () => {
    const { code, out, err } = await run(['pd', 'plan', DRAFT, '--prompt-tokens', '1000']);
    expect(err).toBe('');
    expect(code).toBe(0);
    expect(out).toContain('prefill: tp 4, pp 8 (target layers per stage 11, 11, 12, 12, 12, 12, 12, 11)');
    expect(out).toContain('  prefill: 2 heads per rank; row 512 B, page 32768 B (32 KiB), 1024 pages\n');
    expect(out).toContain(
      '  decode:  1 head per rank, each on 4 of 32 ranks; row 256 B, page 16384 B (16 KiB), 2048 pages\n',
    );
    expect(out).toContain('sliding window 4096 tokens: a request sends only the pages of its last 4096 rows');
    // 6 layers × K, V × 32 D ranks × 2 page runs; 4 pages × 64 tokens × 256 B per D rank and buffer
    expect(out).toContain(`  768 copies (rows strided on prefill: 768, on decode: 0), ${6 * 2 * 32 * 4 * 64 * 256} B`);
    expect(out).toContain('    prefill stage 7 rank 1 → decode stage 0 ranks 8-15: 192 copies, 6291456 B (6 MiB)\n');
    // ⌈1000 / 64⌉ = 16 pages of 16 KiB per (layer, part, D rank)
    expect(out).toContain(`  draft-kv (draft_context): ${6 * 2 * 32 * 16 * 16384} B (96 MiB)\n`);
  });

  it('payload: a prompt past the window sends its pages; the kv line names both modes', async () => {
    const { code, out } = await run(['pd', 'plan', DRAFT, '--prompt-tokens', '16384']);
    expect(code).toBe(0);
    // rows [12288, 16384): pages 192 … 255, 64 of the 256 a window-blind sender would send
    const page = 16384;
    const per = 6 * 2 * 32 * page;
    expect(out).toContain(`  draft-kv (draft_context): ${64 * per} B (384 MiB)\n`);
    expect(out).toContain(
      `draft context: kv (every page) ${256 * per} B (1.5 GiB); kv + window ${64 * per} B (384 MiB)\n`,
    );
    // features: the window's 4096 rows × 7168 bf16 elements, whole on each of D's 32 ranks: more than kv + window
    const features = 4096 * 7168 * 2 * 32;
    expect(out).toContain(
      `  features (7168 elements a row, the window, to each of D's 32 ranks) ${features} B (1.75 GiB); auto by bytes ` +
        `(at run time D also weighs the rebuild it measures): kv + window, ${64 * per} B (384 MiB)\n`,
    );
  });

  it('--json: one copy per line; D rank 13, layer 2 (v), page 9 → 40 at hand-derived offsets', async () => {
    const { code, out } = await run(['pd', 'plan', DRAFT, '--json']);
    expect(code).toBe(0);
    const rows = out
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, number | string>);
    expect(rows.length).toBe(768);
    const c = rows.find((r) => r.dst_rank === 13 && r.layer === 2 && r.part === 'v' && r.count === 64);
    expect(c).toEqual({
      region: 'draft-kv',
      kind: 'draft-kv',
      layer: 2,
      part: 'v',
      src_stage: 7,
      src_rank: 1,
      dst_stage: 0,
      dst_rank: 13,
      head: 3,
      heads: 1,
      // base 0x1000000000 + 5 buffers × 1024 pages × 32 KiB + page 9 × 32 KiB + the rank's 2nd head
      src_offset: 0x10_0000_0000 + 5 * 1024 * 32768 + 9 * 32768 + 256,
      // base 0x7f0000000000 + 5 buffers × 2048 pages × 16 KiB + page 40 × 16 KiB
      dst_offset: 0x7f00_0000_0000 + 5 * 2048 * 16384 + 40 * 16384,
      src_buffer_offset: 9 * 32768 + 256,
      dst_buffer_offset: 40 * 16384,
      bytes: 256,
      count: 64,
      src_stride: 512,
      dst_stride: 256,
    });
  });

  it('the reverse direction and the full Kimi-K3 state (MLA, KDA) plan and report their payload', async () => {
    const rev = await run(['pd', 'plan', REVERSE]);
    expect(rev.code).toBe(0);
    expect(rev.out).toContain('    prefill stage 0 rank 9 → decode stage 1 rank 1: 24 copies, 786432 B (768 KiB)\n');
    const full = await run(['pd', 'plan', FULL, '--prompt-tokens', '16600']);
    expect(full.err).toBe('');
    expect(full.code).toBe(0);
    const pages = Math.ceil(16600 / 64);
    const mla = 24 * 32 * pages * 64 * (512 + 64) * 2; // replicated: every D rank receives the whole latent
    const kda = 69 * 32 * (128 * 128 * 4 + 3 * 128 * 3 * 4); // f32 state + q/k/v conv (kernel 4 → 3 columns)
    // the draft layers slide over 4096: rows [12504, 16600) on pages 195 … 259, 65 pages
    const windowPages = pages - Math.floor((16600 - 4096) / 64);
    expect(windowPages).toBe(65);
    const draft = 6 * 2 * 32 * windowPages * 64 * 256;
    expect(full.out).toMatch(
      new RegExp(`by class: target_kv ${mla} B \\(.*\\), linear_state ${kda} B \\(.*\\), draft_context ${draft} B`),
    );
    expect(full.out).toContain(
      'region kda-conv (conv-state): 69 layers, 32 heads × 1536 B, split heads, 3 rows per slot',
    );
  });

  it('a GQA target (region kind target-kv, the default): layers over P stages, target_layers defaulted', async () => {
    const file = path.join(tmp, 'gqa.json');
    fs.writeFileSync(
      file,
      JSON.stringify({
        dtype: 'f16',
        page_size: 16,
        region: { layers: 8, kv_heads: 4, head_dim: 64 },
        prefill: { tp: 2, pp: 2, partition: [3, 5], base_address: 0, num_pages: 32 },
        decode: { tp: 4, base_address: 4096, num_pages: 64 },
        pages: [
          [0, 10],
          [1, 11],
        ],
      }),
    );
    const { code, out, err } = await run(['pd', 'plan', file, '--json']);
    expect(err).toBe('');
    expect(code).toBe(0);
    const rows = out
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, number | string>);
    expect(rows.length).toBe(8 * 2 * 4); // layers × K, V × D ranks (one head each, pages 0-1 one run)
    for (const r of rows) {
      expect(r.src_stage).toBe((r.layer as number) < 3 ? 0 : 1);
      expect(r.src_rank).toBe((r.dst_rank as number) >> 1); // P rank r holds heads 2r, 2r+1
      // P row: 2 heads × 128 B; D row: 1 head; 2 pages of 16 rows in one copy
      expect(r).toMatchObject({ bytes: 128, count: 32, src_stride: 256, dst_stride: 128 });
      const buffer =
        ((r.layer as number) < 3 ? (r.layer as number) : (r.layer as number) - 3) * 2 + (r.part === 'v' ? 1 : 0);
      expect(r.src_offset).toBe(buffer * 32 * 16 * 256 + ((r.dst_rank as number) % 2) * 128);
      expect(r.dst_offset).toBe(
        4096 + ((r.layer as number) * 2 + (r.part === 'v' ? 1 : 0)) * 64 * 16 * 128 + 10 * 16 * 128,
      );
    }
  });

  it.each([
    ['tp-zero', (j: LayoutEdit) => (j.prefill.tp = 0), '$.prefill.tp: minimum: must be >= 1, got 0'],
    [
      'unknown',
      (j: LayoutEdit) => (j.decode.pages = 3),
      '$.decode.pages: additionalProperties: unknown property, got 3',
    ],
    ['missing', (j: LayoutEdit) => delete j.pages, '$.pages: required: required property is missing'],
    [
      'dtype',
      (j: LayoutEdit) => (j.dtype = 'int4'),
      '$.dtype: enum: must be one of ["f32","f16","bf16","fp8"], got "int4"',
    ],
    ['pair', (j: LayoutEdit) => (j.pages = [[1, 2, 3]]), '$.pages[0]: items: must NOT have more than 2 items'],
    ['tp-heads', (j: LayoutEdit) => (j.prefill.tp = 3), '$.prefill.tp: tp 3 does not divide 8 heads (region.kv_heads)'],
    [
      'tp-replication',
      (j: LayoutEdit) => (j.decode.tp = 12),
      '$.decode.tp: tp 12 is above 8 heads but not a multiple of it (replication) (region.kv_heads)',
    ],
    [
      'src-range',
      (j: LayoutEdit) =>
        (j.pages = [
          [5, 100],
          [1024, 101],
          [7, 102],
          [9, 40],
        ]),
      '$.pages[1][0]: page 1024 out of range (prefill has 1024)',
    ],
    [
      'dst-range',
      (j: LayoutEdit) =>
        (j.pages = [
          [5, 4096],
          [6, 101],
          [7, 102],
          [9, 40],
        ]),
      '$.pages[0][1]: page 4096 out of range (decode has 2048)',
    ],
    [
      'dst-twice',
      (j: LayoutEdit) =>
        (j.pages = [
          [5, 100],
          [6, 101],
          [7, 102],
          [9, 101],
        ]),
      '$.pages[3][1]: page 101 is already the destination of $.pages[1]',
    ],
    [
      'partition',
      (j: LayoutEdit) => (j.prefill.partition = [11, 11, 12, 12, 12, 12, 12, 12]),
      '$.prefill.partition: partition [11, 11, 12, 12, 12, 12, 12, 12]: sums to 94 layers, the model has 93',
    ],
    [
      'pp',
      (j: LayoutEdit) => (j.decode.pp = 94),
      '$.decode.pp: pp 94: the model has only 93 layers (each stage needs at least one)',
    ],
    [
      'target-layers',
      (j: LayoutEdit) => delete j.target_layers,
      '$.target_layers: required with a draft-kv region when mla / kda is given or a side has pp > 1',
    ],
    ['big', (j: LayoutEdit) => (j.decode.base_address = '__BIG__'), '$.decode.base_address: an integer beyond 2^53'],
  ])('bad layout (%s): exit 1, "FILE: $.path: reason"', async (name, edit, message) => {
    const file = variant(name, edit);
    if (name === 'big')
      fs.writeFileSync(file, fs.readFileSync(file, 'utf8').replace('"__BIG__"', '18446744073709551615'));
    const { code, out, err } = await run(['pd', 'plan', file]);
    expect(out).toBe('');
    expect(code).toBe(1);
    expect(err.startsWith(`specd: error: ${file}: ${message}`)).toBe(true);
  });

  it('unreadable or malformed files and bad flags', async () => {
    const dup = path.join(tmp, 'dup.json');
    fs.writeFileSync(dup, '{"dtype": "bf16", "dtype": "f32"}');
    const a = await run(['pd', 'plan', dup]);
    expect(a.code).toBe(1);
    expect(a.err).toMatch(new RegExp(`^specd: error: ${dup}: not valid JSON: .*duplicate key "dtype"`));
    const b = await run(['pd', 'plan', path.join(tmp, 'nope.json')]);
    expect(b.code).toBe(1);
    expect(b.err).toMatch(/nope\.json: cannot read: ENOENT/);
    const c = await run(['pd', 'plan', DRAFT, '--prompt-tokens', '-3']);
    expect(c.code).toBe(2);
    expect(c.err).toContain("option '--prompt-tokens <n>' argument '-3' is invalid. expected an integer >= 0");
  });
});
