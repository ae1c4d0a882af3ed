/**
 * The decode role of prefill/decode disaggregation (`specd serve --role decode`): reserves a request's target
 * pages, state slot and draft context, tells its prefill instance where they are (the entries it expects,
 * derived from its own model, drafter and layout), waits for the state, checks it — every expected entry
 * present with its length, every checksum — and only then lets the request continue in the same speculative
 * loop as aggregated serving, from the first token P sampled. It never runs the prompt through its target.
 *
 * A prefill instance split into pipeline stages sends from every stage (its `hello-ok` lists them, pd/stages.ts):
 * D expects each stage's entries under that stage's transfer id, all before it sends its layout, and checks the
 * union of the stages' rows as one manifest.
 *
 * Whatever ends a request before it continues — P's failure or abort, the router's `/pd/abort`, a timeout, a
 * failed check — frees its pages, slot and draft context.
 */

import { RequestMetrics } from '../engine/metrics.js';
import type { HandoffState } from '../engine/types.js';
import type { SequenceId } from '../kv/paged-kv-pool.js';
import {
  hasDraftContextFeatures,
  hasDraftContextTransfer,
  type DraftContextFeatures,
  type Drafter,
} from '../plugin/drafter-plugin.js';
import type { EngineLoop, LoopListener, LoopRequest } from '../serve/engine-loop.js';
import { checksumRanges } from './checksum.js';
import { ControlClient, type ControlMessage, type Deferred, deferred, withTimeout } from './control.js';
import { DraftFormChooser } from './draft-form.js';
import { handoffLogprobsFromWire } from './logprobs-wire.js';
import { checkManifest, checkPdDrafter, regionLookup } from './manifest.js';
import { rangeBytes } from './pairing.js';
import { type PdRoleOptions, Tombstones } from './prefill-role.js';
import { RankedState } from './ranks.js';
import { type PdStageLayout, splitByStage, stageRequestId } from './stages.js';
import type { TransferEngine } from './transfer-engine.js';
import { createTransferEngine } from './transfer-factory.js';
import { entryName, type LocalEntry, type ManifestRow, PdError, type PdPayloadClass, payloadClass } from './types.js';
import type { DecodeTimings } from './waterfall.js';

/** How a request admitted by the decode role goes on. */
export type Admission =
  /** The state arrived and checked: `begin()` resumes the request (its first token reaches the listener). */
  | {
      readonly kind: 'resume';
      readonly loopId: number;
      readonly payload: Partial<Record<PdPayloadClass, number>>;
      /** The draft context's form this request used (pd/draft-form.ts; `'kv'` without a drafter). */
      readonly draftForm: 'kv' | 'features';
    }
  /** The request ended on P with its first token (EOS, max_tokens 1, a stop string): `begin()` reports it. */
  | { readonly kind: 'finished'; readonly loopId: undefined };

/** An admitted request: how it goes on, and the call that starts it (after the response headers are out). */
export interface Admitted {
  readonly admission: Admission;
  begin(): void;
  /**
   * D's phases of the request's TTFT waterfall (pd/waterfall.ts), complete once the first token reached the
   * listener (the decode first step ends there; read before that, it ends now).
   */
  timings(): DecodeTimings;
}

/**
 * The notification a P sender sends after its data (prefill-role.ts; a pipeline stage's, pipeline/stage-pd.ts):
 * its manifest rows, and from the last stage the handoff state.
 */
interface Notification {
  readonly requestId: string;
  readonly rows: readonly ManifestRow[];
  readonly state?: HandoffState;
}

/** What P tells about a room besides the data: the request ended on its first token, or P needs our hello again. */
type RoomEvent =
  | {
      readonly kind: 'finished';
      readonly tokenIds: readonly number[];
      readonly finishReason: string;
      /** The logprobs fields as sent (pd/logprobs-wire.ts). */
      readonly logprobs: { readonly firstLogprob?: unknown; readonly promptLogprobs?: unknown };
    }
  | { readonly kind: 'rehello' };

/** A request being admitted: P's events for it, and why it was aborted. */
interface Room {
  events: Deferred<RoomEvent>;
  aborted?: PdError;
  /** When P's `sending` arrived (performance.now(), ms): the start of the transfer wait. */
  sendingAt?: number;
}

/** @throws {PdError} `'peer'` unless `ids` are token ids of the vocabulary. */
function checkTokens(ids: readonly unknown[], vocab: number, what: string): asserts ids is number[] {
  for (const t of ids)
    if (!(Number.isSafeInteger(t) && (t as number) >= 0 && (t as number) < vocab))
      throw new PdError('peer', `${what}: ${JSON.stringify(t)} is not a token id (vocabulary ${vocab})`);
}

/**
 * Checks a notification P sent after its data: manifest rows and, from the last stage (`withState`), the handoff
 * state (first token in the vocabulary, position = the prompt length, seed and draws integers).
 * @throws {PdError} `'peer'` naming the bad field.
 */
function checkNotification(
  n: unknown,
  vocab: number,
  promptLength: number,
  room: string,
  withState: boolean,
): Notification {
  const bad = (what: string): never => {
    throw new PdError('peer', `room ${room}: the prefill instance's notification: ${what}`);
  };
  const o = n as Partial<Notification> | null;
  if (o === null || typeof o !== 'object' || !Array.isArray(o.rows)) return bad('rows: expected an array');
  for (const row of o.rows) {
    const k = (row as Partial<ManifestRow> | null)?.key;
    if (
      k === undefined ||
      typeof k !== 'object' ||
      typeof row.checksum !== 'string' ||
      !Number.isSafeInteger(row.byteLength)
    )
      bad('rows: expected {key, byteLength, checksum}');
  }
  if (!withState) return o as Notification;
  const st = o.state as Partial<HandoffState> | undefined;
  if (st === undefined || typeof st !== 'object') return bad('state: missing');
  checkTokens([st.firstToken], vocab, `room ${room}: the prefill instance's notification: state.firstToken`);
  if (st.position !== promptLength) bad(`state.position: expected the prompt length ${promptLength}`);
  if (!Number.isSafeInteger(st.seed) || !Number.isSafeInteger(st.draws) || (st.draws as number) < 0)
    bad('state.seed / state.draws: expected integers');
  return o as Notification;
}

/** A prefill instance this role talks to: its control connection and, once it accepted our hello, its stages. */
interface Peer {
  readonly client: ControlClient;
  readonly hello: Deferred<readonly PdStageLayout[]>;
}

/** The decode role over a server's engine loop. */
export class DecodeRole {
  private transfer: TransferEngine | undefined;
  private readonly peers = new Map<string, Peer>();
  /** Rooms of requests being admitted (queued for a sequence, or waiting for their state). */
  private readonly rooms = new Map<string, Room>();
  /** Region id → this side's bytes (after start). */
  private lookup: (id: string) => Uint8Array = regionLookup([]);
  /** Requests waiting for a free sequence. */
  private queued = 0;
  /** This side's memory and entries over its tensor-parallel ranks. */
  private readonly ranked: RankedState;
  /** Rooms aborted before their request arrived here: the request is refused when it comes. */
  private readonly tombstones = new Tombstones();
  /** The draft context's form per request (`pd.draft_context`; pd/draft-form.ts). */
  readonly draftForm: DraftFormChooser;

  /**
   * @param maxQueued requests that may wait for a free sequence at once (the server's max_waiting_requests).
   * @throws {PdError} `'unsupported'` for a drafter without {@link DraftContextTransfer}, naming it.
   */
  constructor(
    private readonly loop: EngineLoop,
    private readonly drafter: Drafter | undefined,
    private readonly options: PdRoleOptions,
    private readonly maxQueued = 64,
  ) {
    if (drafter !== undefined) checkPdDrafter(drafter);
    this.ranked = new RankedState(loop.engine.target, loop.engine.cache, drafter);
    const mode = drafter !== undefined && hasDraftContextFeatures(drafter) ? (options.draftContext ?? 'kv') : 'kv';
    this.draftForm = new DraftFormChooser(mode);
  }

  /**
   * Sequence `id`'s expected entries with the draft context in the form {@link draftForm} picks for it (by the
   * draft bytes of each form), and that form.
   */
  private expectedEntries(id: SequenceId): { entries: LocalEntry[]; form: 'kv' | 'features' } {
    const kv = this.ranked.entries(id, 'kv');
    const d = this.drafter;
    if (this.draftForm.mode === 'kv' || d === undefined || !hasDraftContextFeatures(d))
      return { entries: kv, form: 'kv' };
    const features = this.ranked.entries(id, 'features');
    const draftBytes = (es: readonly LocalEntry[]) =>
      es.filter((e) => payloadClass(e.key.kind) === 'draft_context').reduce((a, e) => a + rangeBytes(e.ranges), 0);
    const featureBytes = features
      .filter((e) => e.key.kind === 'draft-features')
      .reduce((a, e) => a + rangeBytes(e.ranges), 0);
    const form = this.draftForm.choose(draftBytes(kv), draftBytes(features), featureBytes / (4 * d.pdFeatureWidth));
    return { entries: form === 'kv' ? kv : features, form };
  }

  /** Requests being admitted (reserved, waiting for their state). */
  get inflight(): number {
    return this.rooms.size;
  }

  /** Binds the transfer agent and registers the engine's memory. */
  async start(): Promise<void> {
    this.transfer = await createTransferEngine(this.options.transfer ?? 'zmq', { host: this.options.host, port: 0 });
    const regions = this.ranked.regions();
    this.transfer.registerRegions(regions);
    this.lookup = regionLookup(regions);
  }

  /** Aborts every request being admitted and closes the connections. */
  async close(): Promise<void> {
    for (const room of [...this.rooms.keys()]) this.abort(room, 'the decode instance is shutting down');
    for (const p of this.peers.values()) p.client.close();
    this.peers.clear();
    await this.transfer?.close();
  }

  /**
   * Reserves `req`'s sequence, asks the prefill instance at `bootstrap` for its state in room `room`, waits for
   * it and checks it.
   * @param request the request's digest (protocol.ts `requestDigest`): P refuses the state of another request.
   * @throws {PdError} `'capacity'` (no sequence or page free), `'digest'` (P refused our hello or we refused
   *   its), `'timeout'`, `'abort'`, `'conflict'` (the room is in use), `'manifest'` / `'checksum'` (naming the
   *   entry), `'peer'` (including a malformed state); the loop's `OverloadedError` / `EngineError`. Nothing stays
   *   reserved when it throws.
   */
  async admit(
    room: string,
    requestId: string,
    bootstrap: string,
    req: LoopRequest,
    listener: LoopListener,
    request = '',
  ): Promise<Admitted> {
    const transfer = this.transfer;
    if (transfer === undefined) throw new PdError('peer', 'decode role: not started');
    // the waterfall's instants (performance.now(), ms; pd/waterfall.ts)
    const admittedAt = performance.now();
    let reservedAt = admittedAt;
    let arrivedAt = admittedAt;
    let beganAt: number | undefined;
    let firstAt: number | undefined;
    const timed: LoopListener = {
      ...listener,
      onToken: (t, lp) => {
        if (firstAt === undefined && beganAt !== undefined) firstAt = performance.now();
        listener.onToken(t, lp);
      },
    };
    const timings = (r: Room): (() => DecodeTimings) => {
      const wait = arrivedAt - (r.sendingAt ?? arrivedAt);
      return () => {
        const began = beganAt ?? performance.now();
        return {
          transfer_wait_ms: Math.max(0, wait),
          decode_queue_ms: began - arrivedAt,
          decode_first_step_ms: (firstAt ?? performance.now()) - began,
          reserve_ms: reservedAt - admittedAt,
        };
      };
    };
    if (this.rooms.has(room)) throw new PdError('conflict', `room ${room}: already in use by another request`);
    const dead = this.tombstones.reason(room);
    if (dead !== undefined) throw new PdError('abort', `room ${room}: aborted (${dead})`);
    // registered before the wait for a sequence, so that an abort while queued ends the request at once
    const r: Room = { events: deferred<RoomEvent>() };
    this.rooms.set(room, r);
    let loopId: number | undefined;
    /** The transfer ids expected for the room (one per P stage that sends). */
    let transferIds: string[] = [];
    try {
      loopId = await this.reserve(req, timed, r);
      reservedAt = performance.now();
      const id = loopId;
      if (this.drafter !== undefined && hasDraftContextTransfer(this.drafter))
        this.drafter.pdReserveContext(id, req.promptIds.length);
      // every rank holds the reservation before the transfer writes into it (a replayed add zeroes the slot)
      this.ranked.sync();
      const { entries: expected, form } = this.expectedEntries(id);
      let outcome: { kind: 'data'; ns: Notification[] } | RoomEvent;
      for (let hellos = 0; ; hellos++) {
        const { peer, stages } = await this.peer(bootstrap);
        // one sender per P stage that keeps some of the entries (pd/stages.ts); the last stage sends the state
        const byStage = splitByStage(expected, stages);
        const last = stages.length - 1;
        const notes: Promise<Notification>[] = [];
        transferIds = [];
        byStage.forEach((entries, k) => {
          if (entries.length === 0 && k !== last) return;
          const tid = stageRequestId(room, k, stages);
          transferIds.push(tid);
          notes.push(
            transfer.expect(
              tid,
              entries.flatMap((e) => e.ranges),
              { timeoutMs: this.options.transferTimeoutMs },
            ) as Promise<Notification>,
          );
        });
        const arrived = Promise.all(notes);
        arrived.catch(() => undefined);
        await peer.client.send({
          type: 'layout',
          room,
          requestId,
          agent: transfer.address,
          request,
          entries: expected.map((e) => ({ key: e.key, ranges: e.ranges })),
        });
        outcome = await withTimeout(
          Promise.race([arrived.then((ns) => ({ kind: 'data' as const, ns })), r.events.promise]),
          this.options.bootstrapTimeoutMs + this.options.transferTimeoutMs,
          `room ${room}: waiting for the state from ${bootstrap}`,
        );
        arrivedAt = performance.now();
        // P restarted on the same address and never saw our hello: hello again and resend the layout, once
        if (outcome.kind !== 'rehello') break;
        for (const tid of transferIds) transfer.abort(tid, 'the prefill instance asked for a new hello');
        if (hellos >= 1) throw new PdError('peer', `the prefill instance ${bootstrap} keeps asking for a hello`);
        r.events = deferred<RoomEvent>();
      }
      const vocab = this.loop.engine.target.info.vocabSize;
      // the logprobs the request needs from P (the first token's; the prompt's for an echo with logprobs)
      const want = { first: req.logprobs !== undefined, prompt: req.promptLogprobs !== undefined };
      const P = req.promptIds.length;
      if (outcome.kind === 'finished') {
        const { tokenIds, finishReason } = outcome;
        checkTokens(tokenIds, vocab, `room ${room}: finished: tokenIds`);
        if (finishReason !== 'eos' && finishReason !== 'stop' && finishReason !== 'length')
          throw new PdError('peer', `room ${room}: finished: finishReason ${JSON.stringify(finishReason)}`);
        const lps = handoffLogprobsFromWire(outcome.logprobs, want, vocab, P, `room ${room}: finished`);
        this.loop.abort(id);
        for (const tid of transferIds) transfer.abort(tid, 'the request ended on its first token');
        return {
          admission: { kind: 'finished', loopId: undefined },
          begin: () => {
            beganAt = performance.now();
            if (lps.promptLogprobs !== undefined) listener.onPromptLogprobs?.(lps.promptLogprobs);
            for (const [i, t] of tokenIds.entries()) timed.onToken(t, i === 0 ? lps.firstLogprob : undefined);
            listener.onFinish({ id, tokenIds: [...tokenIds], finishReason, metrics: new RequestMetrics() });
          },
          timings: timings(r),
        };
      }
      // the last sender's notification carries the state; every sender's its rows, checked together
      const notes = outcome.ns.map((n, k) =>
        checkNotification(n, vocab, req.promptIds.length, room, k === outcome.ns.length - 1),
      );
      const sent = notes[notes.length - 1]?.state;
      if (sent === undefined) throw new PdError('peer', `room ${room}: ${bootstrap} sent no handoff state`);
      const { firstLogprob: _f, promptLogprobs: _p, ...plain } = sent;
      const state: HandoffState = {
        ...plain,
        ...handoffLogprobsFromWire(sent, want, vocab, P, `room ${room}: the prefill instance's notification: state`),
      };
      const received = notes.flatMap((n) => n.rows);
      checkManifest(expected, received);
      const rows = new Map(received.map((row) => [entryName(row.key), row]));
      const payload: Partial<Record<PdPayloadClass, number>> = {};
      for (const e of expected) {
        const row = rows.get(entryName(e.key));
        const sum = checksumRanges(this.lookup, e.ranges);
        if (row === undefined || row.checksum !== sum)
          throw new PdError(
            'checksum',
            `${entryName(e.key)}: checksum ${sum} of the bytes received differs from the sender's ${row?.checksum}`,
          );
        const cls = payloadClass(e.key.kind);
        payload[cls] = (payload[cls] ?? 0) + rangeBytes(e.ranges);
      }
      this.draftForm.observeTransfer(
        Object.values(payload).reduce((a, n) => a + n, 0),
        arrivedAt - (r.sendingAt ?? arrivedAt),
      );
      if (form === 'features') {
        // the draft KV of the rows the features cover, computed here as P computed it (the same bits)
        const t0 = performance.now();
        const rows = (this.drafter as Drafter & DraftContextFeatures).pdRebuildFromFeatures(id);
        this.draftForm.observeRebuild(rows, performance.now() - t0);
      }
      return {
        admission: { kind: 'resume', loopId: id, payload, draftForm: form },
        timings: timings(r),
        begin: () => {
          beganAt = performance.now();
          try {
            this.loop.resume(id, state);
          } catch (err) {
            // the loop failed the reservation meanwhile (a failed step): the listener reports it
            listener.onError(err as Error);
          }
        },
      };
    } catch (err) {
      if (loopId !== undefined) this.loop.abort(loopId);
      for (const tid of transferIds.length === 0 ? [room] : transferIds) transfer.abort(tid, (err as Error).message);
      if (!(err instanceof PdError && err.code === 'abort')) {
        const p = this.peers.get(bootstrap);
        void p?.client.send({ type: 'abort', room, reason: (err as Error).message }).catch(() => undefined);
      }
      throw err;
    } finally {
      this.rooms.delete(room);
    }
  }

  /**
   * Reserves a sequence, waiting while none is free: at most `maxQueued` requests wait (beyond that, or after
   * bootstrapTimeoutMs, PdError `'capacity'`: the client gets 503). An abort of the room ends the wait at once.
   */
  private async reserve(req: LoopRequest, listener: LoopListener, room: Room): Promise<number> {
    const deadline = performance.now() + this.options.bootstrapTimeoutMs;
    let queued = false;
    try {
      for (;;) {
        if (room.aborted !== undefined) throw room.aborted;
        const id = this.loop.reserve(req, listener);
        if (id !== undefined) return id;
        if (!queued) {
          if (this.queued >= this.maxQueued)
            throw new PdError(
              'capacity',
              `no free sequence or KV pages on the decode instance and ${this.queued} requests already wait for ` +
                'one; retry later',
            );
          queued = true;
          this.queued++;
        }
        const left = deadline - performance.now();
        if (left <= 0)
          throw new PdError(
            'capacity',
            `no sequence or KV pages freed on the decode instance within ${this.options.bootstrapTimeoutMs} ms`,
          );
        await Promise.race([
          withTimeout(this.loop.whenFreed(), left, 'waiting for a free sequence').catch(() => undefined),
          room.events.promise.catch(() => undefined),
        ]);
      }
    } finally {
      if (queued) this.queued--;
    }
  }

  /** Aborts the admission of room `room` (the router's `/pd/abort`). Idempotent. */
  abort(room: string, reason: string): void {
    this.tombstones.add(room, reason, this.options.bootstrapTimeoutMs);
    const r = this.rooms.get(room);
    if (r === undefined) return;
    r.aborted = new PdError('abort', `room ${room}: aborted (${reason})`);
    r.events.reject(r.aborted);
    this.transfer?.abort(room, reason);
  }

  /** The connection to the prefill instance at `address` and its stages, once it accepted our hello. */
  private async peer(address: string): Promise<{ peer: Peer; stages: readonly PdStageLayout[] }> {
    let p = this.peers.get(address);
    if (p === undefined) {
      const hello = deferred<readonly PdStageLayout[]>();
      const client = new ControlClient(address, (msg) => this.onMessage(address, msg));
      p = { client, hello };
      this.peers.set(address, p);
      void client.send({ type: 'hello', digest: this.options.digest }).catch((e: Error) => hello.reject(e));
    }
    try {
      const stages = await withTimeout(
        p.hello.promise,
        this.options.bootstrapTimeoutMs,
        `hello to the prefill instance ${address}`,
      );
      return { peer: p, stages };
    } catch (err) {
      // try again from scratch next time (the prefill instance may come up later or be fixed)
      if (this.peers.get(address) === p) {
        this.peers.delete(address);
        p.client.close();
      }
      throw err;
    }
  }

  private onMessage(address: string, msg: ControlMessage): void {
    switch (msg.type) {
      case 'hello-ok': {
        const stages = msg.stages ?? [];
        const p = this.peers.get(address);
        try {
          p?.hello.resolve(checkStages(stages, address));
        } catch (err) {
          p?.hello.reject(err as Error);
        }
        return;
      }
      case 'hello-refused':
        this.peers
          .get(address)
          ?.hello.reject(new PdError('digest', `the prefill instance ${address} refused: ${msg.message}`));
        return;
      case 'finished':
        this.rooms
          .get(msg.room)
          ?.events.resolve({ kind: 'finished', tokenIds: msg.tokenIds, finishReason: msg.finishReason, logprobs: msg });
        return;
      case 'hello-required': {
        // the prefill instance at this address restarted: forget the connection; the room hellos again
        const p = this.peers.get(address);
        if (p !== undefined) {
          this.peers.delete(address);
          p.client.close();
        }
        this.rooms.get(msg.room)?.events.resolve({ kind: 'rehello' });
        return;
      }
      case 'sending': {
        const r = this.rooms.get(msg.room);
        if (r !== undefined) r.sendingAt ??= performance.now();
        return;
      }
      case 'failed':
      case 'abort':
        this.abort(msg.room, `the prefill instance: ${'reason' in msg ? msg.reason : msg.message}`);
        return;
      default:
        return;
    }
  }
}

/**
 * P's stages from its `hello-ok` (none: one stage, an older P), checked: layer ranges of non-negative integers,
 * cache layers integers, no cache layer kept by two stages.
 * @throws {PdError} `'layout'` naming the prefill instance and the stage.
 */
function checkStages(stages: readonly PdStageLayout[], address: string): readonly PdStageLayout[] {
  if (!Array.isArray(stages)) throw new PdError('layout', `the prefill instance ${address}: stages is not a list`);
  if (stages.length === 0) return [{ layerStart: 0, layerEnd: 0, cacheLayers: [] }];
  const seen = new Set<number>();
  stages.forEach((s, k) => {
    const ok =
      Number.isSafeInteger(s?.layerStart) &&
      Number.isSafeInteger(s?.layerEnd) &&
      Array.isArray(s?.cacheLayers) &&
      (s.cacheLayers as unknown[]).every((l) => Number.isSafeInteger(l) && !seen.has(l as number));
    if (!ok)
      throw new PdError(
        'layout',
        `the prefill instance ${address}: stage ${k} ${JSON.stringify(s)} is not a stage layout ` +
          '({layerStart, layerEnd, cacheLayers}: integers, each cache layer in one stage)',
      );
    for (const l of s.cacheLayers) seen.add(l);
  });
  return stages;
}
