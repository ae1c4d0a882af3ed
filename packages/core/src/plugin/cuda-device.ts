/**
 * The GPU a target stage lends drafters that run their draft model beside it (the GPU drafters of EAGLE-3 and DFlash),
 * found by shape: a stage with a `cudaDevice()` method (the CUDA Llama stage) returns its loaded addon and its token
 * embedding. Core names no device capability of its own; a drafter plugin asks for the addon entry its runner needs, so
 * an addon built before that runner is treated as no device. Also the bookkeeping of sampled q rows such a drafter
 * leaves on the device ({@link DeviceQRows}).
 */

import type { SequenceId } from '../kv/paged-kv-pool.js';
import { DrafterError, type DraftProposal } from './drafter-plugin.js';
import type { StageModel } from './model-plugin.js';

/** What a target stage on a CUDA GPU lends (its `cudaDevice()`). */
export interface LentCudaDevice<A> {
  /** The loaded CUDA addon (the stage's own; structural: the plugin never imports it). */
  readonly addon: A;
  /** The target's token embedding as bf16 bits, `[vocabSize, hiddenSize]`. */
  readonly embedding: Uint16Array;
}

/**
 * The CUDA device of `target` when it runs on one and its addon has the function `entry` (a runner's create
 * function, e.g. `'dflashCreate'`); undefined otherwise (a CPU stage, or an addon built before that runner).
 */
export function lentCudaDevice<A>(target: StageModel, entry: string): LentCudaDevice<A> | undefined {
  const t = target as StageModel & { cudaDevice?: () => LentCudaDevice<Record<string, unknown>> };
  if (typeof t.cudaDevice !== 'function') return undefined;
  const device = t.cudaDevice();
  return typeof device?.addon?.[entry] === 'function' && device.embedding instanceof Uint16Array
    ? (device as unknown as LentCudaDevice<A>)
    : undefined;
}

/**
 * The sampled proposals of a GPU drafter whose q rows lie in ONE device buffer it lends the target (its
 * `DraftProposal.deviceProbs`), rewritten by every sampled propose: {@link rewrite} before the device call that
 * rewrites it (earlier proposals' q then refuses to be copied back), {@link proposal} for each sequence after it.
 */
export class DeviceQRows {
  private generation = 0;

  /**
   * @param method the drafter's name (prefixes the error).
   * @param vocabSize floats per q row (the target vocabulary).
   * @param copy copies rows [row, row + rows) of the buffer to the host, `[rows, vocabSize]` f32.
   */
  constructor(
    private readonly method: string,
    private readonly vocabSize: number,
    private readonly copy: (row: number, rows: number) => Float32Array,
  ) {}

  /** Call before the device call that rewrites the buffer, whether it returns or throws. */
  rewrite(): void {
    this.generation++;
  }

  /**
   * The proposal of `tokens` whose q is rows [row, row + tokens.length) of the buffer at device address `base`:
   * `deviceProbs` points at them, and reading `probs` copies them back (once) until the next {@link rewrite}, then
   * throws {@link DrafterError}. No drafts: an empty q in host memory.
   */
  proposal(id: SequenceId, tokens: Int32Array, base: bigint, row: number): DraftProposal {
    const k = tokens.length;
    if (k === 0) return { id, tokens, probs: new Float32Array(0) };
    const generation = this.generation;
    let copied: Float32Array | undefined;
    const read = (): Float32Array => {
      if (copied !== undefined) return copied;
      if (generation !== this.generation)
        throw new DrafterError(
          `${this.method}: sequence ${String(id)}: q was read after a later sampled propose ` +
            '(it lives on the GPU until then)',
        );
      copied = this.copy(row, k);
      return copied;
    };
    const address = base + BigInt(row) * BigInt(this.vocabSize * 4);
    const p = { id, tokens, deviceProbs: { device: 'cuda', address } };
    Object.defineProperty(p, 'probs', { enumerable: true, get: read });
    return p as DraftProposal;
  }
}

/** Where a drafter's draft model runs (its `device` setting): the target's GPU when it runs on one, CPU, or CUDA. */
export type DrafterDevice = 'auto' | 'cpu' | 'cuda';

/** The accepted values of a drafter's `device` setting. */
export const DRAFTER_DEVICES: readonly DrafterDevice[] = Object.freeze(['auto', 'cpu', 'cuda']);

/**
 * A drafter's `device` setting checked (undefined stays undefined: the drafter's default, `"auto"`).
 * @throws {DrafterError} "`method`: settings.device: expected one of …, got …".
 */
export function drafterDevice(method: string, value: unknown): DrafterDevice | undefined {
  if (value === undefined) return undefined;
  if (!DRAFTER_DEVICES.includes(value as DrafterDevice))
    throw new DrafterError(
      `${method}: settings.device: expected one of ${DRAFTER_DEVICES.map((d) => JSON.stringify(d)).join(', ')}, ` +
        `got ${JSON.stringify(value)}`,
    );
  return value as DrafterDevice;
}
