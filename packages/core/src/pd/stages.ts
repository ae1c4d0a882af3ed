/**
 * A prefill instance split into pipeline stages (`specd serve --role prefill --pp N`): every stage process sends
 * the layers it owns straight to the decode instance, the driver (the last stage) its own layers, the drafter's
 * context and the handoff state (docs/ARCHITECTURE.md "Prefill/decode disaggregation"). P tells D its stages in
 * the `hello-ok` reply; both sides route an entry to its sender with {@link entryStage}, and each sender writes
 * under its own transfer request id ({@link stageRequestId}): the transfer engine takes one sender per request.
 */

import type { SequenceId } from '../kv/paged-kv-pool.js';
import type { SequenceCache } from '../kv/sequence-cache.js';
import type { LayoutEntry } from './control.js';
import type { ManifestRow, PdEntryKey } from './types.js';

/** One stage of a prefill instance, as its `hello-ok` names it (stage order; pp = 1: one stage). */
export interface PdStageLayout {
  /** The stage's target layers `[layerStart, layerEnd)` (model layer ids: for messages). */
  readonly layerStart: number;
  readonly layerEnd: number;
  /**
   * The target cache layer ids the stage keeps: the `layer` of the target entries it sends (`'target-kv'`,
   * `'linear-state'`, `'conv-state'`). Cache layer ids are the model plugin's (model-llama keeps K and V of
   * layer l in cache layers 2l and 2l + 1), so P states them rather than D guessing them from layer ranges.
   */
  readonly cacheLayers: readonly number[];
}

/**
 * The stage that sends entry `key`: a target entry goes to the stage keeping its cache layer; the drafter's
 * entries, and a target layer no stage lists, to the last stage (the driver: where the drafter lives, and where a
 * missing entry is reported by name).
 */
export function entryStage(key: PdEntryKey, stages: readonly PdStageLayout[]): number {
  const last = stages.length - 1;
  if (key.kind === 'target-kv' || key.kind === 'linear-state' || key.kind === 'conv-state') {
    const k = stages.findIndex((s) => s.cacheLayers.includes(key.layer));
    if (k >= 0 && k < last) return k;
  }
  return last;
}

/**
 * Entries of a layout by sending stage ({@link entryStage}): `out[k]` in layout order, empty for a stage that
 * sends nothing.
 */
export function splitByStage<E extends { readonly key: PdEntryKey }>(
  entries: readonly E[],
  stages: readonly PdStageLayout[],
): E[][] {
  return stages.map((_, k) => entries.filter((e) => entryStage(e.key, stages) === k));
}

/** The transfer request id stage `stage` writes room `room` under: the room itself for the last stage. */
export function stageRequestId(room: string, stage: number, stages: readonly PdStageLayout[]): string {
  return stage === stages.length - 1 ? room : `${room}/stage${stage}`;
}

/** What the driver asks an earlier stage to send for one request (P's side; the stage process does it). */
export interface StageSendRequest {
  /** The transfer request id the stage writes under ({@link stageRequestId}). */
  readonly transferId: string;
  /** The request id of the logs (travels in the stage's notification). */
  readonly requestId: string;
  /** D's transfer agent address. */
  readonly agent: string;
  /** The entries D expects from this stage, each with the ranges of D's memory it goes to. */
  readonly entries: readonly LayoutEntry[];
  /** How long the write may take, ms. */
  readonly timeoutMs: number;
  /** D's TP size (default 1): the stage re-splits its entries for D's ranks (pd/ranks.ts `reshardEntries`). */
  readonly tp?: number;
}

/** The notification a stage's write carries (the last stage's adds the handoff state). */
export interface StageNotification {
  readonly requestId: string;
  readonly rows: readonly ManifestRow[];
}

/** `pd-start`'s options for the stages' transfer agents. */
export interface StageSendersStart {
  /** The interface the agents bind (port 0). */
  readonly host: string;
  /** The transfer engine (config `pd.transfer`; default 'zmq'). */
  readonly transfer?: 'zmq' | 'nixl';
  /** Test-only: every stage write stops after this many descriptors (a fault point, logged naming the stage). */
  readonly pauseAfterDescriptors?: number;
}

/**
 * A target split into stage processes that send their own layers (pipeline/pipeline-model.ts): what the prefill
 * role asks of it. Stage indices are pipeline stage indices; the last stage is this process, which sends through
 * the role's own transfer engine and is never asked here.
 */
export interface StageSenders {
  /** Every stage, in order, the last one this process. */
  readonly pdStages: readonly PdStageLayout[];
  /** Binds every earlier stage's transfer agent (once). @throws the stage's error, naming it. */
  pdStart(options: StageSendersStart): void;
  /**
   * Stage `stage` (< the last) writes `request.entries` of sequence `id` of the engine's `cache` to D; resolves
   * when D acknowledged. @throws {PdError} (rejects) naming the stage.
   */
  pdSend(stage: number, cache: SequenceCache, id: SequenceId, request: StageSendRequest): Promise<void>;
  /** Stops stage `stage`'s write `transferId` (no-op when it ended). */
  pdAbort(stage: number, transferId: string, reason: string): void;
  /** What each earlier stage holds (stage order), after the queued cache operations. */
  stageUsage(): ({ stage: number } & StageUsage)[];
}

/** What a stage process holds: its caches' pages and state slots, its PD writes in flight. */
export interface StageUsage {
  readonly pagesInUse: number;
  readonly slotsInUse: number;
  readonly transfersInFlight: number;
}

/** Whether `model` is a pipeline whose stages send their own layers ({@link StageSenders}). */
export function hasStageSenders(model: object): model is StageSenders {
  return 'pdSend' in model && typeof model.pdSend === 'function';
}
