/**
 * The prefill/decode sender of a pipeline stage process (`specd serve --role prefill --pp N`, pd/stages.ts): the
 * stage sends the target layers it owns straight to the decode instance, from its own cache replica, which holds
 * every sequence at the driver's page ids and slot (cache-replica.ts).
 *
 * Requests arrive on the stage's channel, in order with the forwards and the cache operations (stage-worker.ts):
 * - `pd-start` (once): binds this process's {@link TransferEngine}; replies its address.
 * - `pd-send`: the driver's queued cache operations are applied first, then the stage pairs its entries of the
 *   sequence with the ranges D gave for them (`pairRanges`; an entry it lacks fails the request naming it),
 *   checksums each, registers its cache's regions and starts the write; it replies at once, and the write goes on
 *   on this process's event loop between requests (the driver is never blocked for the transfer). The write's
 *   end — D's acknowledgement or the error — goes to the driver over the IPC channel ({@link StagePdDone}).
 * - `pd-abort`: stops a write (no-op when it ended).
 * A sequence the driver frees (a `finish` or `drop` operation) stops its writes too: its pages may be handed out
 * again at the next forward, and zero-copy frames must not carry another request's rows.
 */

import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { SequenceCache } from '../kv/sequence-cache.js';
import { regionLookup, targetEntries, targetRegions } from '../pd/manifest.js';
import { planSend } from '../pd/pairing.js';
import { reshardEntries } from '../pd/ranks.js';
import type { StageNotification, StageSendRequest } from '../pd/stages.js';
import type { TransferEngine } from '../pd/transfer-engine.js';
import { PdError } from '../pd/types.js';
import { createTransferEngine } from '../pd/transfer-factory.js';

/** The end of one stage write (stage → driver, over the IPC channel). */
export type StagePdDone =
  | { readonly type: 'pd-done'; readonly transferId: string; readonly ok: true }
  | {
      readonly type: 'pd-done';
      readonly transferId: string;
      readonly ok: false;
      readonly code: PdError['code'];
      readonly message: string;
    };

/** `pd-start`'s options. */
export interface StagePdStart {
  /** The interface the transfer agent binds (port 0). */
  readonly host: string;
  /** The transfer engine (config `pd.transfer`; default 'zmq'). */
  readonly transfer?: 'zmq' | 'nixl';
  /** Test-only: every write stops after this many descriptors (a fault point; logged to stderr naming the stage). */
  readonly pauseAfterDescriptors?: number;
}

/** The stage's sender (see the module comment). */
export class StagePdSender {
  private transfer: TransferEngine | undefined;
  /** Writes in flight by transfer id: the sequence they read. */
  private readonly sending = new Map<string, { readonly cache: number; readonly id: SequenceId }>();

  /**
   * @param stage the stage index (for messages).
   * @param report delivers a write's end to the driver.
   */
  constructor(
    private readonly stage: number,
    private readonly report: (done: StagePdDone) => void,
  ) {}

  /** Writes in flight (a gauge). */
  get inflight(): number {
    return this.sending.size;
  }

  /** Binds the transfer agent (once; later calls return the same address). @returns its address. */
  async start(options: StagePdStart): Promise<string> {
    if (this.transfer === undefined) {
      const pause = options.pauseAfterDescriptors;
      this.transfer = await createTransferEngine(options.transfer ?? 'zmq', {
        host: options.host,
        port: 0,
        ...(pause === undefined
          ? {}
          : {
              testHooks: {
                pauseAfterDescriptors: pause,
                onPause: (id) =>
                  process.stderr.write(
                    `specd: pd test hook: pipeline stage ${this.stage} (pid ${process.pid}) paused after ${pause} ` +
                      `descriptors of request ${id}\n`,
                  ),
              },
            }),
      });
    }
    return this.transfer.address;
  }

  /**
   * Starts writing the entries `req` names of sequence `id` of `cache` (driver cache id `cacheId`) to D.
   * @throws {PdError} `'peer'` before {@link start}; `'layout'` for a transfer id already being sent; `'manifest'`
   *   for an entry this stage does not keep (naming it and the stage) or one of another length; `CacheError`
   *   `unknown-sequence`.
   */
  send(cache: SequenceCache, cacheId: number, id: SequenceId, req: StageSendRequest): void {
    const transfer = this.transfer;
    if (transfer === undefined) throw new PdError('peer', `pipeline stage ${this.stage}: pd-send before pd-start`);
    if (this.sending.has(req.transferId))
      throw new PdError('layout', `pipeline stage ${this.stage}: ${req.transferId} is already being sent`);
    const regions = targetRegions(cache);
    const bytes = regionLookup(regions);
    const { local, remote, rows } = planSend(
      req.entries,
      // a stage process is one rank (tp × pp is refused under PD): its entries re-split for D's ranks
      reshardEntries(targetEntries(cache, id), 1, req.entries, req.tp ?? 1),
      bytes,
      `pipeline stage ${this.stage}`,
    );
    transfer.registerRegions(regions);
    this.sending.set(req.transferId, { cache: cacheId, id });
    const note: StageNotification = { requestId: req.requestId, rows };
    transfer.write(req.agent, req.transferId, local, remote, note, { timeoutMs: req.timeoutMs }).then(
      () => this.end({ type: 'pd-done', transferId: req.transferId, ok: true }),
      (err: Error) =>
        this.end({
          type: 'pd-done',
          transferId: req.transferId,
          ok: false,
          code: err instanceof PdError ? err.code : 'peer',
          message: err.message,
        }),
    );
  }

  /** Stops write `transferId` (its end is reported as an abort); unknown ids are ignored. */
  abort(transferId: string, reason: string): void {
    if (this.sending.has(transferId)) this.transfer?.abort(transferId, reason);
  }

  /** Sequence `id` of cache `cacheId` (every sequence of it when `id` is undefined) was freed: its writes stop. */
  freed(cacheId: number, id?: SequenceId): void {
    for (const [transferId, s] of this.sending)
      if (s.cache === cacheId && (id === undefined || s.id === id))
        this.abort(transferId, `pipeline stage ${this.stage}: the sequence was freed`);
  }

  /** Closes the transfer agent (pending writes end as aborts). */
  async close(): Promise<void> {
    await this.transfer?.close();
  }

  private end(done: StagePdDone): void {
    this.sending.delete(done.transferId);
    this.report(done);
  }
}
