/**
 * Picks the PD data plane by config (`pd.transfer`): `'zmq'` (the default: ZeroMQ/TCP, pd/zmq-transfer.ts) or
 * `'nixl'` (NIXL over UCX, pd/nixl-transfer.ts; needs `npm run nixl:fetch`). Both implement {@link TransferEngine}
 * and pass the same shared suite (packages/core/test/pd/transfer-engines.test.ts); a prefill and a decode instance
 * must use the same engine (their addresses, `tcp://` vs `nixl://`, are not interchangeable).
 */

import type { TransferEngine } from './transfer-engine.js';
import type { ZmqTransferTestHooks } from './zmq-transfer.js';

/** The transfer engines `pd.transfer` names. */
export type TransferKind = 'zmq' | 'nixl';

export interface TransferEngineOptions {
  readonly host?: string;
  readonly port?: number;
  /** Test-only fault points (both engines honour the same hooks). */
  readonly testHooks?: ZmqTransferTestHooks;
}

/**
 * Creates the engine `kind` bound on `host:port` (port 0: ephemeral). The NIXL module (and the library it loads)
 * is imported only when asked for. @throws Error code `ERR_SPECD_NIXL_MISSING` for 'nixl' when the library was
 * not fetched (the message says `npm run nixl:fetch`); the engine's own errors otherwise.
 */
export async function createTransferEngine(
  kind: TransferKind,
  options: TransferEngineOptions = {},
): Promise<TransferEngine> {
  if (kind === 'nixl') {
    const { createNixlTransferEngine } = await import('./nixl-transfer.js');
    return createNixlTransferEngine(options);
  }
  if (kind !== 'zmq') throw new RangeError(`createTransferEngine: kind must be 'zmq' or 'nixl', got ${String(kind)}`);
  const { createZmqTransferEngine } = await import('./zmq-transfer.js');
  return createZmqTransferEngine(options);
}
