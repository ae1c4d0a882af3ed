// Shared by test/tensor-parallel.test.ts and test/tp-pp.test.ts: greedy generation of the same two
// batched prompts on two loaded targets, and the TP equivalence rule — outputs equal, or the
// first difference falls at a near-tie of the tp = 1 run (top-2 logit gap < 1e-3 at that token),
// which is recorded for the test's closing report.
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { expect } from 'vitest';

import {
  BUILTIN_PLUGIN_PACKAGES,
  loadDrafter,
  loadTarget,
  loadTensorParallelTarget,
  SequenceCache,
  SpecEngine,
  type Drafter,
  type LoadedTarget,
  type StageModel,
} from '@specd/core';

/** Repository root. */
export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
/** The shipped tiny Kimi target every TP test runs. */
export const TINY_TARGET = path.join(ROOT, 'models/kimi-k3-tiny');
/** The two prompts the TP tests generate together (prose and code). */
export const TP_PROMPTS = ['The history of the city begins with', 'def fibonacci(n):'];

/** A shipped tiny drafter's checkpoint directory (`dflash`, `dspark`, `eagle3`). */
export function tinyDrafterDir(method: string): string {
  return path.join(ROOT, 'models', `kimi-k3-tiny-${method}`);
}

/**
 * Loads a shipped tiny drafter for `target` (2 sequences × 256 tokens; sharded when the target is TP), with the
 * drafter `settings` when given.
 */
export async function tinyDrafter(
  target: LoadedTarget,
  method: string,
  settings?: Readonly<Record<string, unknown>>,
): Promise<Drafter> {
  const dir = tinyDrafterDir(method);
  return (await loadDrafter(settings === undefined ? dir : { dir, settings }, BUILTIN_PLUGIN_PACKAGES, target, 256, 2))
    .drafter;
}

/** The tp = 1 target, a tp = `tp` one, the prompts' ids and the equivalence checker over them. */
export async function loadTpPair(
  tp = 2,
): Promise<{ whole: LoadedTarget; other: LoadedTarget; promptIds: Int32Array[]; eq: TpEquivalence }> {
  const whole = await loadTarget(TINY_TARGET, BUILTIN_PLUGIN_PACKAGES);
  const promptIds = TP_PROMPTS.map((p) => whole.tokenizer.encode(p, { addSpecialTokens: false }));
  const eq = new TpEquivalence(whole, promptIds, `tp=${tp}`);
  const other = await loadTensorParallelTarget(TINY_TARGET, BUILTIN_PLUGIN_PACKAGES, { tp });
  return { whole, other, promptIds, eq };
}

/** Top-2 logit gap below which a TP difference is accepted as a near-tie. */
export const NEAR_TIE = 1e-3;

/** Top-2 logit gap of `model` after `prompt + prefix` (one forward, decode kernels). */
export function gapAfter(model: StageModel, prompt: Int32Array, prefix: readonly number[]): number {
  const tokens = Int32Array.from([...prompt, ...prefix]);
  const cache = new SequenceCache(model.cacheGeometry, {
    pageSize: 16,
    numPages: Math.ceil(tokens.length / 16) + 1,
    numSlots: 1,
  });
  cache.add(0);
  const logits = model.forward({ sequences: [{ id: 0, position: 0, tokens, logits: 'last' }] }, cache).logits!;
  const sorted = Float32Array.from(logits).sort().reverse();
  return sorted[0]! - sorted[1]!;
}

/** The equivalence check of one test file: the tp = 1 reference model, the prompts, and the near-ties seen. */
export class TpEquivalence {
  /** Near-tie differences seen (the test reports them at the end). */
  readonly nearTies: string[] = [];

  /**
   * @param whole the tp = 1, pp = 1 target (the reference and the near-tie judge)
   * @param promptIds the prompts `[P]` i32 each, generated together as one batch
   * @param otherLabel how the report names the configuration under test, e.g. "tp=2"
   * @param maxTokens new tokens per prompt (EOS ignored)
   */
  constructor(
    private readonly whole: LoadedTarget,
    readonly promptIds: readonly Int32Array[],
    private readonly otherLabel: string,
    private readonly maxTokens = 24,
  ) {}

  /** Greedy output ids per prompt: max draft length, prefill chunks of 4, both prompts batched. */
  generate(target: LoadedTarget, drafter: Drafter | undefined, commit?: 'replay'): number[][] {
    return this.run(target, drafter, commit).ids;
  }

  /** {@link generate}, with the run's τ per step (acceptance length; 1 without a drafter). */
  run(target: LoadedTarget, drafter: Drafter | undefined, commit?: 'replay'): { ids: number[][]; tau: number } {
    const engine = new SpecEngine(target.model, drafter, {
      maxSequences: 2,
      maxTokensPerSequence: 256,
      draftPolicy: 'max',
      prefillChunk: 4,
      ...(commit === undefined ? {} : { commit }),
    });
    const out = engine.run(
      this.promptIds.map((p, i) => ({
        id: `r${i}`,
        promptIds: p,
        maxTokens: this.maxTokens,
        sampling: { temperature: 0 },
        seed: 1,
        ignoreEos: true,
      })),
    );
    return {
      ids: this.promptIds.map((_, i) => out.find((r) => r.id === `r${i}`)!.tokenIds),
      tau: engine.metrics.tauPerStep,
    };
  }

  /** `got` equals `ref` per prompt, or first differs at a near-tie of the tp = 1 run (recorded). */
  expectEquivalent(label: string, ref: number[][], got: number[][]): void {
    ref.forEach((a, s) => {
      const b = got[s]!;
      const i = a.findIndex((t, j) => t !== b[j]);
      if (i < 0) {
        expect(b).toEqual(a);
        return;
      }
      const gap = gapAfter(this.whole.model, this.promptIds[s]!, a.slice(0, i));
      this.nearTies.push(
        `${label} prompt ${s}: first difference at token ${i} (tp=1 ${a[i]}, ` +
          `${this.otherLabel} ${b[i]}), top-2 gap ${gap.toExponential(2)}`,
      );
      expect(
        gap,
        `${label} prompt ${s}: ${this.otherLabel} differs at token ${i} where tp=1's top-2 gap is ${gap}`,
      ).toBeLessThan(NEAR_TIE);
    });
  }
}
