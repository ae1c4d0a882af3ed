/**
 * Checkpoint sanity at load (issue 15, "Limits before work"), on corrupted copies of the shipped checkpoints in a
 * temp folder (models/ is never modified): non-finite weights refused by default and loaded with a warning under
 * `checkpointSanity: 'warn'`, a reshaped tensor of the right size, EOS ids outside the vocabulary, an unbounded
 * DFlash block_size, a drafter made for another vocabulary or tokenizer, a mask-token embedding of near-zero norm,
 * an EAGLE-3 d2t that disagrees with t2d or is not one-to-one, and a tensor present but ignored. Each case checks
 * that the message names the file, tensor or field.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { checkGgufFinite } from '@specd/model-llama';
import {
  CheckpointSanity,
  CheckpointSanityError,
  DrafterError,
  GgmlType,
  GgufFile,
  type GgufTensorInfo,
  HfConfigError,
  SafetensorsFile,
  writeSafetensors,
  loadDrafter,
  loadTarget,
  type LoadedTarget,
  type SanityLoadOptions,
  type TensorToWrite,
} from '@specd/core';

const MODELS = path.join(import.meta.dirname, '..', 'models');
const TARGET = path.join(MODELS, 'kimi-k3-tiny');
const DFLASH = path.join(MODELS, 'kimi-k3-tiny-dflash');
const EAGLE3 = path.join(MODELS, 'kimi-k3-tiny-eagle3');
const TARGET_PLUGINS = ['@specd/model-kimi-k3'];
const DRAFTER_PLUGINS = ['@specd/plugin-dflash', '@specd/plugin-dspark', '@specd/plugin-eagle3'];
const EMBED = 'model.embed_tokens.weight';
const BF16_NAN = 0x7fc0;
const BF16_INF = 0x7f80;

let tmp: string;
let copies = 0;
beforeAll(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-checkpoint-sanity-'));
});
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

type Tensors = Map<string, { dtype: TensorToWrite['dtype']; shape: number[]; data: Uint8Array }>;

/**
 * Copies checkpoint `src` to a fresh temp folder; `edit` may change the tensors of each .safetensors file (name →
 * dtype, shape, raw little-endian bytes; only files it changes are rewritten) and `config` patches config.json.
 * @returns the copy's folder.
 */
function corruptCopy(
  src: string,
  edit: (tensors: Tensors, file: string) => boolean = () => false,
  config: (c: Record<string, unknown>) => void = () => {},
): string {
  const dir = path.join(tmp, `copy-${copies++}`);
  fs.mkdirSync(dir);
  for (const f of fs.readdirSync(src)) fs.copyFileSync(path.join(src, f), path.join(dir, f));
  for (const f of fs.readdirSync(dir).filter((n) => n.endsWith('.safetensors'))) {
    const file = path.join(dir, f);
    const st = SafetensorsFile.open(file);
    const tensors: Tensors = new Map();
    try {
      for (const name of st.names()) {
        const t = st.read(name);
        const bytes = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength).slice();
        tensors.set(name, { dtype: t.dtype, shape: [...t.shape], data: bytes });
      }
    } finally {
      st.close();
    }
    if (edit(tensors, f)) writeSafetensors(file, tensors);
  }
  const cfgFile = path.join(dir, 'config.json');
  const cfg = JSON.parse(fs.readFileSync(cfgFile, 'utf8')) as Record<string, unknown>;
  config(cfg);
  fs.writeFileSync(cfgFile, JSON.stringify(cfg, null, 2));
  return dir;
}

/** Sets bf16 elements [start, end) of tensor `name` (when this file holds it) to `bits`; true if it did. */
function setBf16(tensors: Tensors, name: string, start: number, end: number, bits: number): boolean {
  const t = tensors.get(name);
  if (t === undefined) return false;
  expect(t.dtype).toBe('BF16');
  const view = new DataView(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  for (let i = start; i < end; i++) view.setUint16(2 * i, bits, true);
  return true;
}

/** Warnings collected from a load. */
function collect(mode?: 'refuse' | 'warn'): { options: SanityLoadOptions; warnings: string[] } {
  const warnings: string[] = [];
  return {
    options: { ...(mode === undefined ? {} : { checkpointSanity: mode }), onWarning: (m) => warnings.push(m) },
    warnings,
  };
}

describe('checkpoint sanity: the target', () => {
  it('the shipped target and drafters load without a finding', async () => {
    const { options, warnings } = collect();
    const target = await loadTarget(TARGET, TARGET_PLUGINS, undefined, options);
    try {
      for (const d of ['kimi-k3-tiny-dflash', 'kimi-k3-tiny-dspark', 'kimi-k3-tiny-eagle3']) {
        const loaded = await loadDrafter(path.join(MODELS, d), DRAFTER_PLUGINS, target, 256, 1, options);
        loaded.drafter.dispose();
      }
      // context-only drafters read part of their checkpoint on purpose: asked by the runtime or by the config
      const dspark = { dir: path.join(MODELS, 'kimi-k3-tiny-dspark'), settings: { context_only: true } };
      (await loadDrafter(dspark, DRAFTER_PLUGINS, target, 256, 1, options)).drafter.dispose();
      (await loadDrafter(DFLASH, DRAFTER_PLUGINS, target, 256, 1, { ...options, contextOnly: true })).drafter.dispose();
    } finally {
      target.model.dispose();
    }
    expect(warnings).toEqual([]);
  });

  it('a NaN embedding row is refused, naming the tensor, its file and the row; "warn" loads it', async () => {
    const hidden = 256;
    const row = 1234;
    const dir = corruptCopy(TARGET, (t) => setBf16(t, EMBED, row * hidden, (row + 1) * hidden, BF16_NAN));
    const refused = await loadTarget(dir, TARGET_PLUGINS, undefined, collect().options).then(
      (t) => {
        t.model.dispose();
        return undefined;
      },
      (e: unknown) => e,
    );
    expect(refused).toBeInstanceOf(CheckpointSanityError);
    const err = refused as CheckpointSanityError;
    expect(err.check).toBe('non-finite');
    expect(err.subject).toBe(EMBED);
    expect(err.message).toContain(`tensor "${EMBED}"`);
    expect(err.message).toContain(dir);
    expect(err.message).toContain(`${hidden} non-finite values`);
    expect(err.message).toContain(`the first NaN at element ${row * hidden} (row ${row})`);
    expect(err.message).toContain('checkpoint_sanity: "warn"');

    const { options, warnings } = collect('warn');
    const target = await loadTarget(dir, TARGET_PLUGINS, undefined, options);
    try {
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toContain(`tensor "${EMBED}"`);
      expect(warnings[0]).toContain('loaded anyway');
      // the row really is NaN in the loaded model, the others are finite
      const e = target.model.embedTokens!(Int32Array.of(row, row + 1));
      expect(Number.isNaN(e[0])).toBe(true);
      expect(e.subarray(hidden).every(Number.isFinite)).toBe(true);
    } finally {
      target.model.dispose();
    }
  });

  it('an infinite value inside a layer matrix is refused, naming the tensor', async () => {
    const name = 'model.layers.3.self_attn.o_proj.weight';
    const dir = corruptCopy(TARGET, (t) => setBf16(t, name, 777, 778, BF16_INF));
    await expect(loadTarget(dir, TARGET_PLUGINS, undefined, collect().options)).rejects.toThrow(
      new RegExp(
        `tensor "${name.replace(/\./g, '\\.')}": 1 non-finite value of \\d+, the first Infinity at element 777`,
      ),
    );
  });

  it('a flattened or transposed tensor of the right size is refused, naming it and both shapes', async () => {
    const name = 'model.layers.0.mlp.gate_proj.weight';
    let shape: number[] = [];
    const flat = corruptCopy(TARGET, (t) => {
      const e = t.get(name);
      if (e === undefined) return false;
      shape = e.shape;
      e.shape = [e.shape[0]! * e.shape[1]!];
      return true;
    });
    await expect(loadTarget(flat, TARGET_PLUGINS)).rejects.toThrow(
      `tensor "${name}" in ${path.join(flat, 'model-00001-of-00002.safetensors')}: expected shape ` +
        `[${shape.join(', ')}] (from the config), got [${shape[0]! * shape[1]!}]`,
    );
    const transposed = corruptCopy(TARGET, (t) => {
      const e = t.get(name);
      if (e === undefined) return false;
      e.shape = [e.shape[1]!, e.shape[0]!];
      return true;
    });
    await expect(loadTarget(transposed, TARGET_PLUGINS)).rejects.toThrow(
      `expected shape [${shape.join(', ')}] (from the config), got [${shape[1]}, ${shape[0]}]`,
    );
  });

  it('an eos_token_id outside the vocabulary is refused, naming the field', async () => {
    const dir = corruptCopy(TARGET, undefined, (c) => {
      c.eos_token_id = c.vocab_size;
    });
    const err = await loadTarget(dir, TARGET_PLUGINS).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(HfConfigError);
    expect((err as Error).message).toMatch(/eos_token_id.*must be in \[0, 8191\], got 8192/);
  });
});

describe('checkpoint sanity: drafters', () => {
  let target: LoadedTarget;
  beforeAll(async () => {
    target = await loadTarget(TARGET, TARGET_PLUGINS);
  });
  afterAll(() => target?.model.dispose());
  const load = (dir: string, options: SanityLoadOptions = collect().options) =>
    loadDrafter(dir, DRAFTER_PLUGINS, target, 256, 1, options).then((d) => {
      d.drafter.dispose();
      return d;
    });

  // DFlash's layers and EAGLE-3's lm_head are Q8_0 by default on some CPUs (Q8_0 cannot hold a NaN: such a matrix
  // stays bf16 under "warn")
  it.each([
    ['DFlash', DFLASH, 'layers.1.mlp.down_proj.weight', 256 * 512],
    ['EAGLE-3', EAGLE3, 'lm_head.weight', 4096 * 256],
  ] as const)(
    '%s: a NaN in a drafter weight is refused by default and loads with a warning under "warn"',
    async (_name, drafterDir, tensor, elements) => {
      const dir = corruptCopy(drafterDir, (t) => setBf16(t, tensor, 5, 6, BF16_NAN));
      await expect(load(dir)).rejects.toThrow(
        `${path.join(dir, 'model.safetensors')}: tensor "${tensor}": 1 non-finite value of ` +
          `${elements}, the first NaN at element 5 (row 0)`,
      );
      const { options, warnings } = collect('warn');
      await load(dir, options);
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toContain(`"${tensor}"`);
    },
  );

  it('a block_size of 1e6 is refused at once, naming the field and the bound', async () => {
    const dir = corruptCopy(DFLASH, undefined, (c) => {
      c.block_size = 1_000_000;
    });
    const err = await load(dir).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(HfConfigError);
    expect((err as Error).message).toMatch(/block_size.*expected at most 256 .*got 1000000/);
  });

  it('EAGLE-3 draft lengths and tree sizes of 1e6 are refused at once, naming the setting and the bound', async () => {
    const withSettings = (settings: Record<string, unknown>) =>
      loadDrafter({ dir: EAGLE3, settings }, DRAFTER_PLUGINS, target, 256, 1, collect().options);
    await expect(withSettings({ num_draft_tokens: 1_000_000 })).rejects.toThrow(
      new DrafterError('eagle3: settings.num_draft_tokens: expected an integer in [1, 256], got 1000000'),
    );
    await expect(withSettings({ tree: { top_k: 1_000_000, depth: 4, total_tokens: 16 } })).rejects.toThrow(
      'eagle3: settings.tree.top_k: expected an integer in [1, 64], got 1000000',
    );
  });

  it('a DFlash checkpoint made for another vocabulary size is refused', async () => {
    const dir = corruptCopy(DFLASH, undefined, (c) => {
      c.vocab_size = 32000;
    });
    await expect(load(dir)).rejects.toThrow(
      new DrafterError(`dflash: ${dir}: vocab_size 32000 differs from the target's 8192`),
    );
  });

  it("a drafter tokenizer.json unlike the target's is refused naming the id; an equal one loads", async () => {
    const same = corruptCopy(DFLASH);
    fs.copyFileSync(path.join(TARGET, 'tokenizer.json'), path.join(same, 'tokenizer.json'));
    await load(same);
    const other = corruptCopy(DFLASH);
    const tok = JSON.parse(fs.readFileSync(path.join(TARGET, 'tokenizer.json'), 'utf8')) as {
      model: { vocab: Record<string, number> };
    };
    // swap the ids of two ordinary tokens: same size, different meaning
    const entries = Object.entries(tok.model.vocab).filter(([, id]) => id >= 1000 && id <= 1001);
    expect(entries).toHaveLength(2);
    const [[a, ida], [b, idb]] = entries as [[string, number], [string, number]];
    tok.model.vocab[a] = idb;
    tok.model.vocab[b] = ida;
    fs.writeFileSync(path.join(other, 'tokenizer.json'), JSON.stringify(tok));
    const err = await load(other).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CheckpointSanityError);
    expect((err as Error).message).toContain(`${path.join(other, 'tokenizer.json')}: the drafter's tokenizer differs`);
    expect((err as Error).message).toContain(`at id ${Math.min(ida, idb)}`);
  });

  it('a mask token whose target embedding has near-zero norm loads with a warning naming mask_token_id', async () => {
    const mask = 1; // kimi-k3-tiny-dflash's dflash_config.mask_token_id
    const dir = corruptCopy(TARGET, (t) => setBf16(t, EMBED, mask * 256, (mask + 1) * 256, 0));
    const zeroed = await loadTarget(dir, TARGET_PLUGINS);
    try {
      const { options, warnings } = collect();
      const d = await loadDrafter(DFLASH, DRAFTER_PLUGINS, zeroed, 256, 1, options);
      d.drafter.dispose();
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toMatch(
        new RegExp(`${DFLASH}: the target's embedding of dflash_config.mask_token_id 1 has norm 0\\.00+, under 0\\.01`),
      );
    } finally {
      zeroed.model.dispose();
    }
  });

  it('an EAGLE-3 t2d that disagrees with d2t is refused, naming the id', async () => {
    // target id 8191: is it in the draft vocabulary? flip its t2d mark either way
    let was = 0;
    const dir = corruptCopy(EAGLE3, (t) => {
      const e = t.get('t2d');
      if (e === undefined) return false;
      was = e.data[8191]!;
      e.data[8191] = was === 0 ? 1 : 0;
      return true;
    });
    await expect(load(dir)).rejects.toThrow(
      was === 0
        ? `eagle3: ${dir}: t2d marks target id 8191 as in the draft vocabulary, but no d2t entry maps to it`
        : new RegExp(`eagle3: ${dir}: d2t maps draft id \\d+ to target id 8191, which t2d does not mark`),
    );
  });

  it('an EAGLE-3 d2t that maps two draft ids to one target id is refused', async () => {
    const dir = corruptCopy(EAGLE3, (t) => {
      const e = t.get('d2t');
      if (e === undefined) return false;
      const v = new DataView(e.data.buffer, e.data.byteOffset, e.data.byteLength);
      // draft id 1 → the target id of draft id 0: offset d2t[1] = (0 + d2t[0]) − 1
      v.setBigInt64(8, v.getBigInt64(0, true) - 1n, true);
      return true;
    });
    await expect(load(dir)).rejects.toThrow(
      /d2t maps draft ids 0 and 1 both to target id \d+ \(the map must be one-to-one\)/,
    );
  });

  it("an EAGLE-3 embed_tokens (present, never read: the target's is used) draws a warning naming it", async () => {
    const dir = corruptCopy(EAGLE3, (t) => {
      t.set('embed_tokens.weight', { dtype: 'BF16', shape: [8192, 256], data: new Uint8Array(8192 * 256 * 2) });
      return true;
    });
    const { options, warnings } = collect();
    await load(dir, options);
    expect(warnings).toEqual([`${dir}: 1 tensor present but ignored by the loader: "embed_tokens.weight"`]);
  });
});

describe('checkpoint sanity: non-finite fuzz over the drafters', () => {
  let target: LoadedTarget;
  beforeAll(async () => {
    target = await loadTarget(TARGET, TARGET_PLUGINS);
  });
  afterAll(() => target?.model.dispose());

  /** Seed and number of cases: each poisons one random element of one random float tensor of a shipped drafter. */
  const SEED = 0x5a7e;
  const CASES = 24;

  it('a NaN or ±Infinity anywhere in any weight is refused, naming the tensor and the element', async () => {
    console.log(`non-finite fuzz: ${CASES} cases, seed 0x${SEED.toString(16)}`);
    let state = SEED;
    const rand = () => {
      state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
      return state / 2 ** 32;
    };
    const drafters = ['kimi-k3-tiny-dflash', 'kimi-k3-tiny-dspark', 'kimi-k3-tiny-eagle3'];
    for (let i = 0; i < CASES; i++) {
      const src = path.join(MODELS, drafters[i % drafters.length]!);
      let poisoned = '';
      let element = 0;
      const bits = [BF16_NAN, BF16_INF, 0xff80][Math.floor(rand() * 3)]!;
      const dir = corruptCopy(src, (t) => {
        const names = [...t.keys()].filter((n) => t.get(n)!.dtype === 'BF16').sort();
        poisoned = names[Math.floor(rand() * names.length)]!;
        element = Math.floor(rand() * (t.get(poisoned)!.data.length / 2));
        return setBf16(t, poisoned, element, element + 1, bits);
      });
      const err = await loadDrafter(dir, DRAFTER_PLUGINS, target, 256, 1, collect().options).then(
        (d) => d.drafter.dispose(),
        (e: unknown) => e,
      );
      expect(err, `case ${i}: ${poisoned}[${element}]`).toBeInstanceOf(CheckpointSanityError);
      expect((err as Error).message, `case ${i}`).toContain(`tensor "${poisoned}": 1 non-finite value of `);
      expect((err as Error).message, `case ${i}`).toContain(`at element ${element}`);
      fs.rmSync(dir, { recursive: true });
    }
  });
});

describe('checkpoint sanity: GGUF targets', () => {
  const info = (type: GgmlType, typeName: string, shape: number[]): GgufTensorInfo =>
    ({ name: 'w', type, typeName, shape }) as unknown as GgufTensorInfo;
  const refuse = new CheckpointSanity({ onWarning: () => {} });

  it('F16 values and the f16 scale / minimum of Q8_0, Q4_0 and Q4_1 blocks are checked', () => {
    const f16 = new Uint8Array(8);
    new DataView(f16.buffer).setUint16(4, 0x7e00, true); // element 2: NaN
    expect(() => checkGgufFinite(refuse, 'f.gguf', info(GgmlType.F16, 'F16', [2, 2]), f16)).toThrow(
      'f.gguf: tensor "w" (F16): 1 non-finite values of 4, the first at element 2 (row 1)',
    );
    for (const [type, name, blockBytes, field] of [
      [GgmlType.Q8_0, 'Q8_0', 34, 0],
      [GgmlType.Q4_0, 'Q4_0', 18, 0],
      [GgmlType.Q4_1, 'Q4_1', 20, 2],
    ] as const) {
      const bytes = new Uint8Array(4 * blockBytes); // 4 blocks = [2, 64]
      expect(() => checkGgufFinite(refuse, 'f.gguf', info(type, name, [2, 64]), bytes)).not.toThrow();
      new DataView(bytes.buffer).setUint16(3 * blockBytes + field, 0xfc00, true); // block 3: −Infinity
      expect(() => checkGgufFinite(refuse, 'f.gguf', info(type, name, [2, 64]), bytes)).toThrow(
        `f.gguf: tensor "w" (${name}): 1 non-finite block scales of 4, the first at element 96 (row 1)`,
      );
    }
  });

  it('the SmolLM2 GGUF with an infinite Q4_1 block scale is refused naming the tensor; "warn" loads it', async () => {
    const src = path.join(MODELS, 'smollm2-135m-instruct', 'SmolLM2-135M-Instruct.Q4_1.gguf');
    const file = path.join(tmp, 'smollm2-inf-scale.gguf');
    fs.copyFileSync(src, file);
    const g = GgufFile.open(file);
    const t = g.info('blk.2.ffn_down.weight');
    expect(t.typeName).toBe('Q4_1');
    const bytes = fs.readFileSync(file);
    bytes.writeUInt16LE(0x7c00, t.fileOffsetBytes + 20 * 10); // block 10's scale: +Infinity
    fs.writeFileSync(file, bytes);
    await expect(loadTarget(file, ['@specd/model-llama'], undefined, collect().options)).rejects.toThrow(
      `${file}: tensor "blk.2.ffn_down.weight" (Q4_1): 1 non-finite block scales of ${t.numElements / 32}, ` +
        'the first at element 320 (row 0)',
    );
    const { options, warnings } = collect('warn');
    const target = await loadTarget(file, ['@specd/model-llama'], undefined, options);
    target.model.dispose();
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toContain('"blk.2.ffn_down.weight"');
  });
});
