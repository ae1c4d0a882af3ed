// The SmolLM2 drafters' training prompts (tools/reference/smollm2/prompts/train_prompts.u16) share no content
// 8-gram with the held-out prompts their τ is measured on (chat.jsonl, plain.jsonl), as
// tools/reference/ngram_check.py checks with the tokenizer. Re-checked here on the shipped token ids: the only
// 8-grams both sides may share are the template ones (ChatML turns and task instructions) listed in
// template_8grams.json, and that list must be template: every 8-gram in it recurs in ≥ 50 chat training prompts
// and in no plain one (plain prompts are bare corpus snippets, so a repeated corpus passage would show up there).
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

const DIR = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'tools/reference/smollm2/prompts');
const N = 8;

function u16(file: string): Uint16Array {
  const b = fs.readFileSync(path.join(DIR, file));
  return new Uint16Array(b.buffer, b.byteOffset, b.byteLength / 2);
}

/** The 8-grams of `ids` as strings of UTF-16 code units (one per token id < 65536). */
function grams(ids: ArrayLike<number>): Set<string> {
  const out = new Set<string>();
  for (let i = 0; i + N <= ids.length; i++)
    out.add(String.fromCharCode(...Array.from({ length: N }, (_, k) => ids[i + k]!)));
  return out;
}

describe('SmolLM2 drafter training prompts vs the held-out prompts', () => {
  const flat = u16('train_prompts.u16');
  const lens = u16('train_prompts.len.u16');
  const train: Uint16Array[] = [];
  for (let i = 0, off = 0; i < lens.length; off += lens[i]!, i++) train.push(flat.subarray(off, off + lens[i]!));
  const template = new Set(
    (JSON.parse(fs.readFileSync(path.join(DIR, 'template_8grams.json'), 'utf8')) as { grams: number[][] }).grams.map(
      (g) => String.fromCharCode(...g),
    ),
  );

  it('the files agree: one length per prompt, every token counted', () => {
    const meta = JSON.parse(fs.readFileSync(path.join(DIR, 'train_prompts.json'), 'utf8')) as {
      prompts: number;
      tokens: number;
      kinds: string[];
    };
    expect(lens.length).toBe(meta.prompts);
    expect(meta.kinds.length).toBe(meta.prompts);
    expect(lens.reduce((a, b) => a + b, 0)).toBe(flat.length);
    expect(flat.length).toBe(meta.tokens);
  });

  it('every template 8-gram recurs in ≥ 50 chat training prompts and in no plain one', () => {
    const kinds = (JSON.parse(fs.readFileSync(path.join(DIR, 'train_prompts.json'), 'utf8')) as { kinds: string[] })
      .kinds;
    const count = new Map<string, { chat: number; plain: number }>(
      [...template].map((g) => [g, { chat: 0, plain: 0 }]),
    );
    train.forEach((p, i) => {
      for (const g of grams(p)) {
        const c = count.get(g);
        if (c) c[kinds[i] as 'chat' | 'plain']++;
      }
    });
    const bad = [...count].filter(([, c]) => c.chat < 50 || c.plain > 0);
    expect(bad.map(([g, c]) => `${Array.from(g, (x) => x.charCodeAt(0)).join(',')}: ${JSON.stringify(c)}`)).toEqual([]);
  });

  it('no training prompt shares a non-template 8-gram with a held-out prompt', () => {
    const held = new Map<string, string>();
    for (const kind of ['chat', 'plain']) {
      for (const line of fs
        .readFileSync(path.join(DIR, `${kind}.jsonl`), 'utf8')
        .trim()
        .split('\n')) {
        const r = JSON.parse(line) as { id: string; prompt_token_ids: number[] };
        for (const g of grams(r.prompt_token_ids)) if (!template.has(g)) held.set(g, r.id);
      }
    }
    expect(held.size).toBeGreaterThan(1000);
    const shared: string[] = [];
    train.forEach((p, i) => {
      for (const g of grams(p)) {
        if (held.has(g)) {
          shared.push(`train #${i} ~ ${held.get(g)!}`);
          break;
        }
      }
    });
    expect(shared.slice(0, 5)).toEqual([]);
  });
});
