// Helpers shared by the transfer engine tests (transfer-engines.test.ts, the shared suite; zmq-transfer.test.ts, the
// ZeroMQ engine's wire details): page-granular descriptors, byte comparisons, rejections, the receiver's applied
// hook, and the peer process of fixtures/transfer-peer.mjs.
import { fork, type ChildProcess } from 'node:child_process';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { expect } from 'vitest';

import type { TransferDescriptor } from '../../dist/pd/transfer-engine.js';
import { PdError, type RegionRange } from '../../dist/pd/types.js';

const PEER = path.join(path.dirname(fileURLToPath(import.meta.url)), 'fixtures/transfer-peer.mjs');

/** Page-granular descriptor pairs: `pages[i] = [srcPage, dstPage]` of `pageBytes` each. */
export function pagePairs(
  pages: readonly (readonly [number, number])[],
  pageBytes: number,
  src = 'src',
  dst = 'dst',
): { local: TransferDescriptor[]; remote: TransferDescriptor[] } {
  return {
    local: pages.map(([s]) => ({ region: src, offset: s * pageBytes, length: pageBytes })),
    remote: pages.map(([, d]) => ({ region: dst, offset: d * pageBytes, length: pageBytes })),
  };
}

/** The ranges of `pages` (of `pageBytes` each) of `region`. */
export function pageRanges(pages: readonly number[], pageBytes: number, region = 'dst'): RegionRange[] {
  return pages.map((p) => ({ region, offset: p * pageBytes, length: pageBytes }));
}

/** The first byte index where `a` and `b` differ, or -1. */
export function firstDiff(a: Uint8Array, b: Uint8Array): number {
  if (a.length !== b.length) return Math.min(a.length, b.length);
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return i;
  return -1;
}

/** `dst` after copying `pages` of `src` into `before`: what the receiver must hold. */
export function expectedAfter(
  before: Uint8Array,
  src: Uint8Array,
  pages: readonly (readonly [number, number])[],
  pageBytes: number,
): Uint8Array {
  const out = before.slice();
  for (const [s, d] of pages) out.set(src.subarray(s * pageBytes, (s + 1) * pageBytes), d * pageBytes);
  return out;
}

/** The {@link PdError} `p` rejects with (fails the test when it resolves or rejects with something else). */
export async function rejection(p: Promise<unknown>): Promise<PdError> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(PdError);
    return err as PdError;
  }
  throw new Error('expected a rejection, the promise resolved');
}

type Applied = { descriptors: number; bytes: number };

/** Resolves when the receiver's onApplied hook reports `descriptors` applied for `req`. */
export function appliedWatch(): {
  onApplied: (req: string, a: Applied) => void;
  reached: (req: string, descriptors: number) => Promise<Applied>;
} {
  const seen = new Map<string, Applied>();
  const waiters: { req: string; n: number; resolve: (a: Applied) => void }[] = [];
  return {
    onApplied(req, a) {
      seen.set(req, { ...a });
      for (const w of [...waiters])
        if (w.req === req && a.descriptors >= w.n) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve({ ...a });
        }
    },
    reached(req, n) {
      const a = seen.get(req);
      if (a !== undefined && a.descriptors >= n) return Promise.resolve(a);
      return new Promise((resolve) => waiters.push({ req, n, resolve }));
    },
  };
}

/**
 * Forks fixtures/transfer-peer.mjs with `args` (its engine: `SPECD_TEST_TRANSFER` = `engine`) and resolves once it
 * reported its address; the child is pushed to `children` (the caller kills what is left after the tests).
 */
export function spawnPeer(
  args: string[],
  engine: 'zmq' | 'nixl',
  children: ChildProcess[],
): Promise<{ child: ChildProcess; address: string }> {
  const child = fork(PEER, args, {
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    env: { ...process.env, SPECD_TEST_TRANSFER: engine },
  });
  children.push(child);
  return new Promise((resolve, reject) => {
    child.on('message', (m: { address?: string }) => {
      if (m.address !== undefined) resolve({ child, address: m.address });
    });
    child.once('exit', (code) => reject(new Error(`transfer peer exited (${code}) before reporting its address`)));
  });
}

/** The next IPC message of `child` that `pick` accepts. */
export function nextMessage<T>(child: ChildProcess, pick: (m: T) => boolean): Promise<T> {
  return new Promise((resolve) => {
    const on = (m: T) => {
      if (pick(m)) {
        child.off('message', on);
        resolve(m);
      }
    };
    child.on('message', on);
  });
}

/** Kills `child` (SIGKILL) and resolves once it exited. */
export function killed(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    child.once('exit', () => resolve());
    child.kill('SIGKILL');
  });
}

/** Polls `cond` every 5 ms (the pause hook fires from the sender's poll loop, after the first batch completed). */
export async function waitFor(cond: () => boolean): Promise<void> {
  while (!cond()) await new Promise((r) => setTimeout(r, 5));
}
