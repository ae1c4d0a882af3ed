// The transfer overlapped with prefill (pd/overlap.ts) against a recording transfer engine: the partial writes carry
// exactly the finished rows of the row-structured entries (scattered pages, rows cut inside a page), never a state
// entry; the last write (planSend with `sentBefore`) carries the rest, and P's bytes land whole in D's regions; a
// failed part fails the request at the handoff. Also sliceRanges.
import { describe, expect, it } from 'vitest';

import { OverlapSender } from '../../src/pd/overlap.js';
import { planSend, sliceRanges } from '../../src/pd/pairing.js';
import type { TransferDescriptor, TransferEngine, WriteOptions } from '../../src/pd/transfer-engine.js';
import { entryId, type LocalEntry, PdError, type RegionRange } from '../../src/pd/types.js';

const ROW = 12; // bytes per row
const PAGE = 4; // rows per page

interface Write {
  local: readonly TransferDescriptor[];
  remote: readonly TransferDescriptor[];
  options: WriteOptions;
}

/** A transfer engine that records writes and applies them to `dst` when told to. */
function recorder(src: Map<string, Uint8Array>, dst: Map<string, Uint8Array>, fail?: () => boolean) {
  const writes: Write[] = [];
  const pending: (() => void)[] = [];
  const engine = {
    write(_peer: string, _id: string, local, remote, _n: unknown, options: WriteOptions) {
      writes.push({ local, remote, options });
      return new Promise((resolve, reject) => {
        pending.push(() => {
          if (fail?.() === true) return reject(new PdError('peer', 'the decode instance went away'));
          let bytes = 0;
          local.forEach((l, i) => {
            const r = remote[i] as TransferDescriptor;
            dst.get(r.region)!.set(src.get(l.region)!.subarray(l.offset, l.offset + l.length), r.offset);
            bytes += l.length;
          });
          resolve({ bytes, descriptors: local.length, messages: 1 });
        });
      });
    },
  } as Pick<TransferEngine, 'write'> as TransferEngine;
  /** Lets every write in flight land, then the microtasks that start the next. */
  const land = async (): Promise<void> => {
    for (let i = 0; i < 4; i++) {
      for (const f of pending.splice(0)) f();
      await new Promise((r) => setImmediate(r));
    }
  };
  return { engine, writes, land };
}

const pages = (region: string, ids: readonly number[]): RegionRange[] =>
  ids.map((p) => ({ region, offset: p * PAGE * ROW, length: PAGE * ROW }));

describe('sliceRanges', () => {
  const rs: RegionRange[] = [
    { region: 'a', offset: 100, length: 10 },
    { region: 'b', offset: 0, length: 5 },
    { region: 'a', offset: 0, length: 20 },
  ];
  it('cuts the concatenation of ranges at byte offsets', () => {
    expect(sliceRanges(rs, 0, 35)).toEqual(rs);
    expect(sliceRanges(rs, 8, 17)).toEqual([
      { region: 'a', offset: 108, length: 2 },
      { region: 'b', offset: 0, length: 5 },
      { region: 'a', offset: 0, length: 2 },
    ]);
    expect(sliceRanges(rs, 15, 15)).toEqual([]);
    expect(sliceRanges(rs, 30, 99)).toEqual([{ region: 'a', offset: 15, length: 5 }]);
  });
});

describe('OverlapSender', () => {
  // P: a KV entry on scattered pages 7, 2, 5 (12 rows) and a state entry; D: pages 0, 1, 2 and its own slot
  const src = new Map([
    ['kv', Uint8Array.from({ length: 8 * PAGE * ROW }, (_, i) => (i * 7 + 3) & 255)],
    ['state', Uint8Array.from({ length: 64 }, (_, i) => 255 - i)],
  ]);
  const mine: LocalEntry[] = [
    { key: { kind: 'target-kv', layer: 0, part: '', rank: 0 }, ranges: pages('kv', [7, 2, 5]), rowBytes: ROW },
    {
      key: { kind: 'linear-state', layer: 1, part: '', rank: 0 },
      ranges: [{ region: 'state', offset: 0, length: 64 }],
    },
  ];
  const wanted = [
    { key: mine[0]!.key, ranges: pages('dkv', [0, 1, 2]) },
    { key: mine[1]!.key, ranges: [{ region: 'dstate', offset: 64, length: 64 }] },
  ];

  it('sends finished rows in parts, the rest and the state in the last write; D ends with P bytes', async () => {
    const dst = new Map([
      ['dkv', new Uint8Array(3 * PAGE * ROW)],
      ['dstate', new Uint8Array(128)],
    ]);
    const { engine, writes, land } = recorder(src, dst);
    const s = new OverlapSender(engine, 'room', () => mine, 1000, 0);
    s.progress(3); // before the layout: nothing
    expect(writes).toHaveLength(0);
    s.start('d', wanted);
    expect(writes).toHaveLength(1);
    expect(writes[0]!.options.partial).toBe(true);
    expect(writes[0]!.local).toEqual([{ region: 'kv', offset: 7 * PAGE * ROW, length: 3 * ROW }]);
    s.progress(6); // while the first part is in flight: waits for it
    expect(writes).toHaveLength(1);
    await land();
    // rows 3..5: the rest of page 7, then the first two rows of page 2
    expect(writes[1]!.local).toEqual([
      { region: 'kv', offset: 7 * PAGE * ROW + 3 * ROW, length: ROW },
      { region: 'kv', offset: 2 * PAGE * ROW, length: 2 * ROW },
    ]);
    await land();
    const sent = await s.finish();
    expect(s.bytes).toBe(6 * ROW);
    expect(s.writes).toBe(2);
    s.progress(12); // after finish: nothing more
    expect(writes).toHaveLength(2);
    const plan = planSend(wanted, mine, (id) => src.get(id)!, 'P', undefined, sent);
    // the last write: rows 6..11 and the state; the rows' checksums cover the whole entries
    expect(plan.local).toEqual([
      { region: 'kv', offset: 2 * PAGE * ROW + 2 * ROW, length: 2 * ROW },
      { region: 'kv', offset: 5 * PAGE * ROW, length: PAGE * ROW },
      { region: 'state', offset: 0, length: 64 },
    ]);
    expect(plan.rows.map((r) => r.byteLength)).toEqual([12 * ROW, 64]);
    expect(plan.rows).toEqual(planSend(wanted, mine, (id) => src.get(id)!, 'P').rows);
    plan.local.forEach((l, i) => {
      const r = plan.remote[i]!;
      dst.get(r.region)!.set(src.get(l.region)!.subarray(l.offset, l.offset + l.length), r.offset);
    });
    const kv = src.get('kv')!;
    const want = new Uint8Array(3 * PAGE * ROW);
    for (const [i, p] of [7, 2, 5].entries())
      want.set(kv.subarray(p * PAGE * ROW, (p + 1) * PAGE * ROW), i * PAGE * ROW);
    expect(dst.get('dkv')).toEqual(want);
    expect(dst.get('dstate')!.subarray(64)).toEqual(src.get('state'));
  });

  it('a failed part fails the handoff with its error; nothing more is sent', async () => {
    const dst = new Map([
      ['dkv', new Uint8Array(3 * PAGE * ROW)],
      ['dstate', new Uint8Array(128)],
    ]);
    const { engine, writes, land } = recorder(src, dst, () => true);
    const s = new OverlapSender(engine, 'room', () => mine, 1000, 0);
    s.start('d', wanted);
    s.progress(4);
    await land();
    s.progress(8);
    expect(writes).toHaveLength(1);
    await expect(s.finish()).rejects.toThrow(/went away/);
  });

  it('a part waits for minPartBytes, but not at the prompt last chunk but one', async () => {
    const dst = new Map([['dkv', new Uint8Array(3 * PAGE * ROW)]]);
    const { engine, writes, land } = recorder(src, dst);
    const s = new OverlapSender(engine, 'room', () => mine, 1000, 5 * ROW);
    s.start('d', wanted);
    s.progress(4);
    expect(writes).toHaveLength(0); // 4 rows < 5
    s.progress(5);
    expect(writes).toHaveLength(1);
    await land();
    s.progress(8, true); // 3 rows, but the last chunk is next
    expect(writes).toHaveLength(2);
    expect(writes[1]!.local.reduce((a, d) => a + d.length, 0)).toBe(3 * ROW);
  });

  it('an entry whose length differs on D stops the parts; the last write names it', async () => {
    const dst = new Map([['dkv', new Uint8Array(3 * PAGE * ROW)]]);
    const { engine, writes } = recorder(src, dst);
    const s = new OverlapSender(engine, 'room', () => mine, 1000, 0);
    const short = [{ key: mine[0]!.key, ranges: [{ region: 'dkv', offset: 0, length: 5 }] }];
    s.start('d', short);
    s.progress(12);
    expect(writes).toHaveLength(1); // 5 bytes are ready: they go
    expect(() =>
      planSend(short, mine, (id) => src.get(id)!, 'P', undefined, new Map([[entryId(mine[0]!.key), 5]])),
    ).toThrow(/target-kv layer 0 \(?.*144 bytes here, the decode side expects 5 bytes/);
  });
});
