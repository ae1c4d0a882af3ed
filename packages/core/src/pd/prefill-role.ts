/**
 * The prefill role of prefill/decode disaggregation (`specd serve --role prefill`): runs a request's prompt
 * through its engine (continuous batching with the aggregated requests, chunked prefill, the drafter's
 * context written), then writes the request's state — the manifest's entries, each with a checksum — into the
 * pages and slot its decode instance reserved, and frees its own once the decode instance acknowledged.
 *
 * Under pipeline parallelism (`--pp N`) every stage process sends the target layers it owns from its own cache
 * replica (pd/stages.ts, pipeline/stage-pd.ts), in parallel with this process (the last stage), which sends its
 * layers, the drafter's context and the handoff state; the `hello-ok` reply tells D the stages.
 *
 * Control plane: a ZeroMQ ROUTER on the bootstrap port (control.ts); data plane: a {@link TransferEngine}.
 * A request waits at most `bootstrapTimeoutMs` for its decode instance's layout and `transferTimeoutMs` for
 * the transfer; an abort (the router's `/pd/abort`, the decode instance's `abort`) frees its pages and slot
 * whatever phase it is in.
 */

import type { Logger } from 'pino';

import type { HandoffState, SpecResult } from '../engine/types.js';
import type { Drafter } from '../plugin/drafter-plugin.js';
import type { EngineLoop, LoopRequest } from '../serve/engine-loop.js';
import {
  ControlServer,
  type ControlMessage,
  type Deferred,
  deferred,
  type LayoutEntry,
  withTimeout,
} from './control.js';
import { compareDigests } from './digest.js';
import type { DraftContextMode } from './draft-form.js';
import { type HandoffLogprobs, handoffLogprobsToWire } from './logprobs-wire.js';
import { checkPdDrafter, regionLookup } from './manifest.js';
import { OverlapSender } from './overlap.js';
import { planSend, rangeBytes } from './pairing.js';
import { gatherScattered, RankedState, reshardEntries } from './ranks.js';
import {
  hasStageSenders,
  type PdStageLayout,
  splitByStage,
  type StageSenders,
  stageRequestId,
  type StageUsage,
} from './stages.js';
import type { TransferEngine } from './transfer-engine.js';
import { createTransferEngine, type TransferKind } from './transfer-factory.js';
import type { ZmqTransferTestHooks } from './zmq-transfer.js';
import { type PdEntryKey, PdError, type PdPayloadClass, payloadClass } from './types.js';
import { PAYLOAD_CLASSES, type PrefillTimings } from './waterfall.js';

/** Settings shared by both roles. */
export interface PdRoleOptions {
  /** Host the bootstrap socket and the transfer agent bind (e.g. `127.0.0.1`). */
  readonly host: string;
  /** How long P waits for a request's layout from its decode instance, and D for P's hello (ms). */
  readonly bootstrapTimeoutMs: number;
  /** How long a transfer may take, from the layout to the acknowledgement (ms). */
  readonly transferTimeoutMs: number;
  /** The transfer engine (config `pd.transfer`; default 'zmq'); P and D must use the same one. */
  readonly transfer?: TransferKind;
  /**
   * The draft context's form (config `pd.draft_context`; default 'kv'): D picks per request (pd/draft-form.ts), so
   * P offers both forms unless it is 'kv'.
   */
  readonly draftContext?: DraftContextMode;
  /**
   * Send the rows each prefill chunk finished while the prompt still prefills (config `pd.overlap`; default true;
   * P only, pd/overlap.ts): the transfer wait is then the tail after the forward.
   */
  readonly overlap?: boolean;
  /** This side's digest (digest.ts): compared at connection time, a mismatch refused naming the field. */
  readonly digest: Readonly<Record<string, string>>;
  readonly logger?: Logger;
}

/** Options of the prefill role. */
export interface PrefillRoleOptions extends PdRoleOptions {
  /** Bootstrap port (0: ephemeral; the bound address is {@link PrefillRole.bootstrap}). */
  readonly bootstrapPort: number;
  /** Test-only faults: entries withheld from both the payload and the manifest; the transfer engine's hooks. */
  readonly testHooks?: {
    readonly withhold?: (key: PdEntryKey) => boolean;
    readonly transfer?: ZmqTransferTestHooks;
  };
}

/** What a prefilled request reports (the `/pd/prefill` answer). */
export interface PrefillOutcome {
  readonly promptTokens: number;
  /** Bytes sent by payload class (empty when the request ended on its first token). */
  readonly payload: Partial<Record<PdPayloadClass, number>>;
  /** Handoff to acknowledgement, ms (0 without a transfer). */
  readonly transferMs: number;
  /** P's phases of the request's TTFT waterfall, its payload by class and descriptors (pd/waterfall.ts). */
  readonly timings: PrefillTimings;
}

/** What {@link PrefillRole.send} moved, and when it started (performance.now(), ms). */
interface Sent {
  readonly payload: Partial<Record<PdPayloadClass, number>>;
  readonly descriptors: number;
  readonly startedAt: number;
  /** Bytes sent while the prompt prefilled (pd/overlap.ts). */
  readonly overlapped: number;
}

/** P's timings from its instants (performance.now(), ms): arrival, first chunk's forward, handoff, write start. */
function prefillTimings(
  arrived: number,
  forwardAt: number | undefined,
  handoffAt: number,
  sendAt: number,
  payload: Partial<Record<PdPayloadClass, number>>,
  descriptors: number,
  overlapped = 0,
): PrefillTimings {
  const forward = forwardAt ?? handoffAt;
  const bytes = {} as Record<PdPayloadClass, number>;
  for (const c of PAYLOAD_CLASSES) bytes[c] = payload[c] ?? 0;
  return {
    prefill_queue_ms: forward - arrived,
    prefill_forward_ms: handoffAt - forward,
    bootstrap_ms: sendAt - handoffAt,
    payload_bytes: bytes,
    descriptors,
    overlapped_bytes: overlapped,
  };
}

/** D's layout for one request, as received on the control plane. */
interface Layout {
  readonly peer: Buffer;
  readonly requestId: string;
  readonly agent: string;
  /** The request's digest as D parsed it (protocol.ts `requestDigest`). */
  readonly request: string;
  readonly entries: readonly LayoutEntry[];
  /** The decode instance's TP size (from its hello's digest). */
  readonly tp: number;
}

/** A request in this role: its room's layout and how to stop it. */
interface Room {
  readonly layout: Deferred<Layout>;
  /** The loop id once submitted. */
  loopId?: number;
  /** Rejects the request's wait (an abort). */
  readonly failed: Deferred<never>;
  /** Stage processes' writes in flight (pipeline parallelism): stopped when the room ends. */
  stageWrites?: { readonly stage: number; readonly transferId: string }[];
  /** Staging regions registered for the room's write (gathered entries), deregistered when the room ends. */
  staging?: string[];
  /** The rows sent while the request prefills (pd/overlap.ts), when they are. */
  stream?: OverlapSender;
  timer?: NodeJS.Timeout;
}

/** The prefill role over a server's engine loop. */
export class PrefillRole {
  private readonly control: ControlServer;
  private transfer: TransferEngine | undefined;
  private readonly rooms = new Map<string, Room>();
  /** Routing ids (hex) of decode instances whose hello was accepted, and each one's TP size (its digest's). */
  private readonly peers = new Map<string, number>();
  /** This side's memory and entries over its tensor-parallel ranks. */
  private readonly ranked: RankedState;
  /** Region id → this side's bytes (after start). */
  private lookup: (id: string) => Uint8Array = regionLookup([]);
  /** Rooms aborted or failed before (or without) a request of ours: a late request or layout for one is refused. */
  private readonly tombstones = new Tombstones();
  /** The target's stage processes when it is a pipeline (they send their own layers), else undefined. */
  private readonly senders: StageSenders | undefined;
  /** This side's stages as `hello-ok` names them (one without pipeline parallelism). */
  readonly stages: readonly PdStageLayout[];

  constructor(
    private readonly loop: EngineLoop,
    private readonly drafter: Drafter | undefined,
    private readonly options: PrefillRoleOptions,
  ) {
    if (drafter !== undefined) checkPdDrafter(drafter);
    this.control = new ControlServer((peer, msg) => this.onMessage(peer, msg));
    const target = loop.engine.target;
    this.senders = hasStageSenders(target) ? target : undefined;
    this.ranked = new RankedState(target, loop.engine.cache, drafter);
    if (this.senders !== undefined && this.ranked.tp > 1)
      throw new PdError('unsupported', 'prefill role: a pipeline whose stages are tensor-parallel groups (tp × pp)');
    const geometry = loop.engine.cache.geometry;
    this.stages = this.senders?.pdStages ?? [
      {
        layerStart: 0,
        layerEnd: target.info.numLayers,
        cacheLayers: [...geometry.pagedKv.layers, ...geometry.linearState.layers],
      },
    ];
  }

  /** Pages and state slots each earlier pipeline stage holds (empty without pipeline parallelism). */
  stageUsage(): ({ stage: number } & StageUsage)[] {
    return this.senders?.stageUsage() ?? [];
  }

  /** The bootstrap address decode instances connect to (after {@link start}). */
  get bootstrap(): string {
    return this.control.address;
  }

  /** Requests in this role (waiting for a layout, prefilling or transferring). */
  get inflight(): number {
    return this.rooms.size;
  }

  /** Binds the bootstrap socket and the transfer agent and registers the engine's memory. */
  async start(): Promise<void> {
    await this.control.bind(this.options.host, this.options.bootstrapPort);
    this.transfer = await createTransferEngine(this.options.transfer ?? 'zmq', {
      host: this.options.host,
      port: 0,
      ...(this.options.testHooks?.transfer === undefined ? {} : { testHooks: this.options.testHooks.transfer }),
    });
    const regions = this.ranked.regions();
    this.transfer.registerRegions(regions);
    this.lookup = regionLookup(regions);
    const pause = this.options.testHooks?.transfer?.pauseAfterDescriptors;
    this.senders?.pdStart({
      host: this.options.host,
      ...(this.options.transfer === undefined ? {} : { transfer: this.options.transfer }),
      ...(pause === undefined ? {} : { pauseAfterDescriptors: pause }),
    });
  }

  /** Aborts every request and closes the sockets. */
  async close(): Promise<void> {
    for (const room of [...this.rooms.keys()]) this.abort(room, 'the prefill instance is shutting down');
    this.control.close();
    await this.transfer?.close();
  }

  /**
   * Prefills `req` for room `room` and transfers its state to the decode instance that sent the room's layout.
   * @param request the request's digest (protocol.ts `requestDigest`); the decode instance's must be equal.
   * @throws {PdError} `'timeout'` (no layout within bootstrapTimeoutMs; the transfer within transferTimeoutMs),
   *   `'layout'` (the decode instance's request differs from this one),
   *   `'abort'`, `'manifest'` (an entry D expects that this side does not have), the transfer's errors;
   *   `OverloadedError` / `EngineError` from the loop (queue full, a request the engine refuses).
   *   Whatever happens, the request's pages and slot are free when it settles.
   */
  async prefill(room: string, requestId: string, req: LoopRequest, request = ''): Promise<PrefillOutcome> {
    const arrived = performance.now();
    if (this.rooms.get(room)?.loopId !== undefined)
      throw new PdError('conflict', `room ${room}: already in use by another request`);
    const dead = this.tombstones.reason(room);
    if (dead !== undefined) throw new PdError('abort', `room ${room}: aborted (${dead})`);
    const r = this.room(room);
    const log = this.options.logger?.child({ requestId, room });
    // the first token's logprob and the prompt's (for a request that asks): D emits them (pd/logprobs-wire.ts)
    let lps: HandoffLogprobs = {};
    let forwardAt: number | undefined;
    let handoffAt = arrived;
    const stream = this.overlapSender(r, room, request);
    try {
      const result = await new Promise<SpecResult>((resolve, reject) => {
        r.failed.promise.catch(reject);
        r.loopId = this.loop.submit(
          { ...req, handoff: true },
          {
            onToken: (_t, lp) => {
              if (lp !== undefined && lps.firstLogprob === undefined) lps = { ...lps, firstLogprob: lp };
            },
            onPromptLogprobs: (promptLogprobs) => {
              lps = { ...lps, promptLogprobs };
            },
            onPrefillStart: () => {
              forwardAt = performance.now();
            },
            ...(stream === undefined
              ? {}
              : { onPrefillChunk: (rows: number, lastNext: boolean) => stream.progress(rows, lastNext) }),
            onFinish: (res) => {
              handoffAt = performance.now();
              resolve(res);
            },
            onError: reject,
          },
        );
      });
      if (result.finishReason === 'abort') throw new PdError('abort', `room ${room}: aborted`);
      const layout = await this.await(r, r.layout.promise, this.options.bootstrapTimeoutMs, 'waiting for the layout');
      if (layout.request !== request)
        throw new PdError(
          'layout',
          `room ${room}: the decode instance holds another request (its prompt ids or parameters differ from this ` +
            "one's): refusing to hand this request's state to it",
        );
      if (result.finishReason !== 'handoff' || result.handoff === undefined) {
        // ended on its first token: nothing to transfer (rows sent while it prefilled are D's to drop)
        await stream?.finish().catch(() => undefined);
        const sendAt = performance.now();
        await this.control.send(layout.peer, {
          type: 'finished',
          room,
          tokenIds: result.tokenIds,
          finishReason: result.finishReason,
          ...handoffLogprobsToWire(lps),
        });
        const timings = prefillTimings(arrived, forwardAt, handoffAt, sendAt, {}, 0);
        return { promptTokens: req.promptIds.length, payload: {}, transferMs: 0, timings };
      }
      const t0 = performance.now();
      const sent = await this.send(room, r, layout, { ...result.handoff, ...lps });
      const transferMs = performance.now() - t0;
      const { payload, descriptors } = sent;
      const timings = prefillTimings(
        arrived,
        forwardAt,
        handoffAt,
        sent.startedAt,
        payload,
        descriptors,
        sent.overlapped,
      );
      log?.info(
        { payload, descriptors, overlappedBytes: sent.overlapped, transferMs: Math.round(transferMs) },
        'pd: state transferred',
      );
      return { promptTokens: req.promptIds.length, payload, transferMs, timings };
    } catch (err) {
      // a part still in flight stops (a no-op when the last write already failed and aborted it)
      if (stream !== undefined) this.transfer?.abort(room, (err as Error).message);
      const layout = r.layout.settled ? await r.layout.promise.catch(() => undefined) : undefined;
      if (layout !== undefined && !(err instanceof PdError && err.code === 'abort'))
        void this.control.send(layout.peer, { type: 'abort', room, reason: (err as Error).message });
      throw err;
    } finally {
      stream?.close();
      // stage writes still going (another sender failed) stop before the pages can be handed out again
      this.stopStageWrites(r, 'the request ended');
      if (r.staging !== undefined && r.staging.length > 0) this.transfer?.deregisterRegions(r.staging);
      // frees the handed-off sequence (or whatever is left of it); a no-op for a request that finished
      if (r.loopId !== undefined) this.loop.abort(r.loopId);
      this.forget(room);
      // the room is over: a layout that arrives late for it is answered with an abort, not kept
      this.tombstones.add(room, 'the request is over on the prefill instance', this.options.bootstrapTimeoutMs);
    }
  }

  /**
   * Aborts room `room` (the router's `/pd/abort`, the decode instance's `abort`): its wait rejects with
   * PdError `'abort'` and its pages and slot are freed. Idempotent; unknown rooms are ignored.
   */
  abort(room: string, reason: string): void {
    this.tombstones.add(room, reason, this.options.bootstrapTimeoutMs);
    const r = this.rooms.get(room);
    if (r === undefined) return;
    const err = new PdError('abort', `room ${room}: aborted (${reason})`);
    r.failed.reject(err);
    r.layout.reject(err);
    this.transfer?.abort(room, reason);
    this.stopStageWrites(r, reason);
    if (r.loopId !== undefined) this.loop.abort(r.loopId);
    // a room no request of ours runs in (only a layout arrived) holds nothing: forget it now
    else this.forget(room);
  }

  /**
   * A request for `room` failed before it reached this role (a bad parameter, a prompt too long): the decode
   * instance's layout for it, arrived or still to come, is answered with an abort.
   */
  fail(room: string, reason: string): void {
    const r = this.rooms.get(room);
    if (r?.loopId !== undefined) return; // a request of ours runs in this room: a bad duplicate must not end it
    if (r?.layout.settled === true)
      void r.layout.promise.then(
        (l) => this.control.send(l.peer, { type: 'abort', room, reason }),
        () => undefined,
      );
    this.abort(room, reason);
  }

  /**
   * Sends the state of a handed-off request: every entry D expects, paired with ours, then the notification.
   * Under pipeline parallelism each earlier stage process sends the entries of the layers it keeps
   * ({@link splitByStage}) at the same time, under its own transfer id; the request fails naming the first
   * sender that fails, and the others are stopped.
   */
  private async send(room: string, r: Room, layout: Layout, state: HandoffState): Promise<Sent> {
    const transfer = this.transfer;
    const loopId = r.loopId;
    if (transfer === undefined || loopId === undefined) throw new PdError('peer', 'prefill role: not started');
    const byStage = splitByStage(layout.entries, this.stages);
    const last = this.stages.length - 1;
    const payload: Partial<Record<PdPayloadClass, number>> = {};
    const writes: Promise<unknown>[] = [];
    // the end of the bootstrap phase: D's transfer wait starts when this message arrives (pd/waterfall.ts)
    const startedAt = performance.now();
    await this.control.send(layout.peer, { type: 'sending', room }).catch(() => undefined);
    // the rows sent while the request prefilled: the last write skips them (a failed part fails the request here)
    const stream = r.stream;
    const sentBefore =
      stream === undefined
        ? undefined
        : await this.await(r, stream.finish(), this.options.transferTimeoutMs, 'sending the rows left');
    if (r.failed.settled) await r.failed.promise; // aborted meanwhile: nothing is written
    r.stageWrites = [];
    for (const [k, entries] of byStage.entries()) {
      const senders = this.senders;
      if (k === last || entries.length === 0 || senders === undefined) continue;
      for (const e of entries) {
        const cls = payloadClass(e.key.kind);
        payload[cls] = (payload[cls] ?? 0) + rangeBytes(e.ranges);
      }
      const transferId = stageRequestId(room, k, this.stages);
      r.stageWrites.push({ stage: k, transferId });
      writes.push(
        senders.pdSend(k, this.loop.engine.cache, loopId, {
          transferId,
          requestId: layout.requestId,
          agent: layout.agent,
          entries,
          timeoutMs: this.options.transferTimeoutMs,
          tp: layout.tp,
        }),
      );
    }
    // what each of D's ranks expects, cut from this side's ranks' entries (pd/ranks.ts; the same TP: rank r's);
    // an entry cut into many small pieces (TP sizes that differ) is gathered into a staging buffer first
    const wanted = byStage[last] ?? [];
    const staged = gatherScattered(
      reshardEntries(
        this.ranked.entries(loopId, (this.options.draftContext ?? 'kv') === 'kv' ? 'kv' : 'both'),
        this.ranked.tp,
        wanted,
        layout.tp,
      ),
      this.lookup,
      `staging/${room}/`,
    );
    const stagedBytes = regionLookup(staged.regions);
    const stagedIds = new Set(staged.regions.map((x) => x.id));
    transfer.registerRegions(staged.regions);
    r.staging = staged.regions.map((x) => x.id);
    const own = planSend(
      wanted,
      staged.entries,
      (id) => (stagedIds.has(id) ? stagedBytes(id) : this.lookup(id)),
      'the prefill instance',
      this.options.testHooks?.withhold,
      sentBefore,
    );
    for (const row of own.rows) {
      const cls = payloadClass(row.key.kind);
      payload[cls] = (payload[cls] ?? 0) + row.byteLength;
    }
    let descriptors = 0;
    writes.push(
      transfer
        .write(
          layout.agent,
          room,
          own.local,
          own.remote,
          { requestId: layout.requestId, rows: own.rows, state: { ...state, ...handoffLogprobsToWire(state) } },
          { timeoutMs: this.options.transferTimeoutMs },
        )
        .then((stats) => {
          descriptors = stats.descriptors;
        }),
    );
    try {
      await this.await(r, Promise.all(writes), this.options.transferTimeoutMs, 'transferring');
    } catch (err) {
      transfer.abort(room, (err as Error).message);
      this.stopStageWrites(r, (err as Error).message);
      throw err;
    }
    r.stageWrites = [];
    return { payload, descriptors, startedAt, overlapped: stream?.bytes ?? 0 };
  }

  /**
   * The room's {@link OverlapSender} when its rows can go while it prefills (`overlap` on, no pipeline stages, tp 1
   * here; it starts once D's layout arrived for this request from a decode instance at tp 1), else undefined.
   */
  private overlapSender(r: Room, room: string, request: string): OverlapSender | undefined {
    const transfer = this.transfer;
    if (this.options.overlap === false || this.senders !== undefined || this.ranked.tp !== 1 || transfer === undefined)
      return undefined;
    const form = (this.options.draftContext ?? 'kv') === 'kv' ? 'kv' : 'both';
    const stream = new OverlapSender(
      transfer,
      room,
      () => (r.loopId === undefined ? [] : this.ranked.entries(r.loopId, form)),
      this.options.transferTimeoutMs,
    );
    r.stream = stream;
    r.layout.promise.then(
      (l) => {
        if (l.tp === 1 && l.request === request) stream.start(l.agent, l.entries);
      },
      () => undefined,
    );
    return stream;
  }

  /** Stops the room's stage writes still in flight (each stage's abort is a no-op for a write that ended). */
  private stopStageWrites(r: Room, reason: string): void {
    const writes = r.stageWrites ?? [];
    r.stageWrites = [];
    for (const w of writes) this.senders?.pdAbort(w.stage, w.transferId, reason);
  }

  /** Waits for `p`, failing on the room's abort or after `ms`. */
  private await<T>(r: Room, p: Promise<T>, ms: number, what: string): Promise<T> {
    return withTimeout(Promise.race([p, r.failed.promise]), ms, what);
  }

  /** The room's record (created by whichever comes first: the request or its layout). */
  private room(room: string): Room {
    let r = this.rooms.get(room);
    if (r === undefined) {
      r = { layout: deferred<Layout>(), failed: deferred<never>() };
      this.rooms.set(room, r);
      // a layout nobody claims (the router's request never came) is dropped after the bootstrap timeout
      const created = r;
      r.timer = setTimeout(() => {
        if (created.loopId !== undefined) return;
        // the router's request for this room never came: tell the decode instance, which holds a reservation
        const ms = this.options.bootstrapTimeoutMs;
        const reason = `no request for room ${room} reached the prefill instance within ${ms} ms`;
        if (created.layout.settled)
          void created.layout.promise.then(
            (l) => this.control.send(l.peer, { type: 'abort', room, reason }),
            () => undefined,
          );
        this.forget(room);
        this.tombstones.add(room, reason, this.options.bootstrapTimeoutMs);
      }, this.options.bootstrapTimeoutMs);
      r.timer.unref();
    }
    return r;
  }

  private forget(room: string): void {
    const r = this.rooms.get(room);
    if (r === undefined) return;
    clearTimeout(r.timer);
    this.rooms.delete(room);
  }

  private onMessage(peer: Buffer, msg: ControlMessage): void {
    const who = peer.toString('hex');
    switch (msg.type) {
      case 'hello': {
        try {
          const { tp } = compareDigests(this.options.digest, msg.digest, 'the decode instance', {
            mine: 'prefill',
            theirs: 'decode',
          });
          this.peers.set(who, tp.theirs);
          void this.control.send(peer, { type: 'hello-ok', stages: this.stages });
        } catch (err) {
          this.peers.delete(who);
          void this.control.send(peer, { type: 'hello-refused', message: (err as Error).message });
        }
        return;
      }
      case 'layout': {
        const tp = this.peers.get(who);
        if (tp === undefined) {
          // this instance never accepted a hello from this peer (it restarted on the same address): ask for one
          void this.control.send(peer, { type: 'hello-required', room: msg.room });
          return;
        }
        const dead = this.tombstones.reason(msg.room);
        if (dead !== undefined) {
          void this.control.send(peer, { type: 'abort', room: msg.room, reason: dead });
          return;
        }
        this.room(msg.room).layout.resolve({
          peer,
          requestId: msg.requestId,
          agent: msg.agent,
          request: msg.request,
          entries: msg.entries,
          tp,
        });
        return;
      }
      case 'abort':
        this.abort(msg.room, `the decode instance aborted: ${msg.reason}`);
        return;
      default:
        return;
    }
  }
}

/** Names of rooms that ended, each kept for a while with why, so that a late message for one is refused. */
export class Tombstones {
  private readonly rooms = new Map<string, { reason: string; until: number }>();

  /** Keeps `room` for `ms` (and drops expired ones). */
  add(room: string, reason: string, ms: number): void {
    const now = performance.now();
    for (const [k, v] of this.rooms) if (v.until < now) this.rooms.delete(k);
    this.rooms.set(room, { reason, until: now + ms });
  }

  /** Why `room` ended, if it did recently. */
  reason(room: string): string | undefined {
    const t = this.rooms.get(room);
    if (t === undefined) return undefined;
    if (t.until < performance.now()) {
      this.rooms.delete(room);
      return undefined;
    }
    return t.reason;
  }
}
