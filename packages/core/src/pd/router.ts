/**
 * The prefill/decode router (`specd router`), shaped like SGLang's PD router: it takes OpenAI requests
 * (`POST /v1/completions`, `POST /v1/chat/completions`, streaming or not), checks them and builds the prompt ids
 * once (serve/prompt.ts, as the aggregated server would), picks a prefill server P and a decode server D by its
 * {@link PdPolicy}, and sends both, concurrently, the same JSON
 *
 *   POST {P}/pd/prefill, POST {D}/pd/decode   (header x-request-id)
 *   {request_id, room, kind: 'completion' | 'chat', prompt_ids: number[], bootstrap: P's address, body}
 *
 * where `room` is the bootstrap id of the pair (a random integer in [0, 2^53)) and `body` the client's request
 * as it came. D answers as the aggregated server would (JSON, or SSE ending in `data: [DONE]`) and sends its
 * headers only once the transfer is verified; the router passes D's answer through unchanged and unbuffered.
 * P answers `200 {request_id, prompt_tokens}` once D acknowledged the transfer, or an OpenAI error.
 * A request of several choices (`n` > 1, a completion's list of prompts) runs one P/D pair per choice, choice
 * i × n + j of prompt i with seed + j as the aggregated server (serve/choices.ts), and the router merges D's answers
 * (request id `<id>-<choice>` towards P and D). Logprobs and echo pass through: P sends D the first token's logprob
 * and an echo's prompt logprobs with the handoff state (pd/logprobs-wire.ts).
 *
 * Failures (the first side to fail decides the answer): P fails before D's headers → the client gets P's status
 * and error, D gets `POST /pd/abort {room, request_id, reason}` and its request is aborted; D fails → the client
 * gets D's status and error, P gets /pd/abort; a side that cannot be reached → 502 naming it (it leaves the
 * rotation at once) and the other side gets /pd/abort; the client disconnects → both requests are aborted and
 * both sides get /pd/abort. `GET /health` (200 when a prefill and a decode server are healthy, else 503; each
 * upstream's state), `GET /v1/models` (a healthy D's), `GET /metrics` (`specd_router_*`, its own registry).
 * Health: `GET /pd/info` (role, P's bootstrap address, model) and `GET /health` on every upstream at start and
 * every `healthIntervalMs`; a server answering the other role's /pd/info refuses the start.
 *
 * The TTFT waterfall (pd/waterfall.ts): the router measures its own phase and the TTFT, reads P's phases from its
 * /pd/prefill answer and D's from a header of its /pd/decode answer (not passed on), exports the whole at /metrics,
 * logs it at debug level and serves the last {@link WATERFALLS_KEPT} at `GET /pd/waterfall/<request id>`
 * (`<id>-<choice>` for a request of several choices).
 */

import { randomBytes, randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';

import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Logger } from 'pino';

import { choiceBodies } from '../serve/choices.js';
import { ApiError, bodyTooLarge, shuttingDown, unknownModel } from '../serve/errors.js';
import { answerThenDrain, checkBind, installAccessHook, installJsonParser } from '../serve/http-guard.js';
import type { BuiltPrompt, PromptBuilder, PromptKind } from '../serve/prompt.js';
import { checkRequestFields } from '../serve/request-fields.js';
import {
  parseChatRequest,
  parseCompletionRequest,
  type GenerationParams,
  type SamplingDefaults,
} from '../serve/protocol.js';
import { type PdCandidate, type PdPolicy, type PdRole, RoundRobinPolicy } from './policy.js';
import { PdRouterMetrics } from './router-metrics.js';
import { PdError } from './types.js';
import {
  assembleWaterfall,
  DECODE_TIMINGS_HEADER,
  parseDecodeTimings,
  parsePrefillTimings,
  type PrefillTimings,
  type Waterfall,
} from './waterfall.js';

/** What the router is given. */
export interface PdRouterOptions {
  /** Prefill servers' base URLs (`http://host:port`), at least one. */
  readonly prefill: readonly string[];
  /** Decode servers' base URLs, at least one. */
  readonly decode: readonly string[];
  /** Builds prompt ids from the same tokenizer as P and D. */
  readonly prompts: PromptBuilder;
  /** The config's `sampling` (request checking only; P and D apply their own). */
  readonly sampling: SamplingDefaults;
  /** Default: round robin. */
  readonly policy?: PdPolicy;
  /** Between health checks, ms (default 5000; 0: only at start and when a request fails to connect). */
  readonly healthIntervalMs?: number;
  /** Bound on each /pd/info, /health, /pd/abort and /v1/models call to an upstream, ms (default 5000). */
  readonly upstreamTimeoutMs?: number;
  /** Largest request body, bytes (default 1 MiB). */
  readonly bodyLimitBytes?: number;
  /** A pino logger (default: none). */
  readonly logger?: Logger;
  /**
   * The deployment's API key (`server.api_key`, `--api-key`): clients must send `Authorization: Bearer KEY` on
   * everything but /health and /metrics, and the router sends it on every call to P and D (probes and aborts
   * included). Absent: no key here, and the client's Authorization header is forwarded as it is, and the Host header
   * is checked (serve/http-guard.ts).
   */
  readonly apiKey?: string;
  /** Host names accepted besides the bound address and loopback (`*`: any); serve/http-guard.ts AccessPolicy. */
  readonly allowedHosts?: readonly string[];
  /** `/metrics` needs the API key too (default: open). */
  readonly metricsNeedKey?: boolean;
}

/** One upstream's state, as `/health` lists it. */
export interface PdUpstreamState {
  readonly url: string;
  readonly role: PdRole;
  readonly healthy: boolean;
  /** Why it is unhealthy (absent when healthy). */
  readonly reason?: string;
  /** P's bootstrap address from /pd/info (prefill only, once known). */
  readonly bootstrap?: string;
  /** The model it serves, from /pd/info (once known). */
  readonly model?: string;
}

interface Upstream extends PdCandidate {
  readonly role: PdRole;
  healthy: boolean;
  reason: string | undefined;
  bootstrap: string | undefined;
  model: string | undefined;
}

const OTHER: Record<PdRole, PdRole> = { prefill: 'decode', decode: 'prefill' };

/** Waterfalls kept for `GET /pd/waterfall/<request id>` (the oldest is dropped). */
export const WATERFALLS_KEPT = 1024;

/** How long `GET /pd/waterfall/<id>` waits for a request's waterfall still being assembled, ms. */
const WATERFALL_WAIT_MS = 10_000;

/**
 * `res` with its body passed through unchanged, `onFirst(performance.now())` called at its first non-empty chunk
 * (a cancel or an error of the body reaches the original as before).
 */
function timeFirstByte(res: Response, onFirst: (at: number) => void): Response {
  if (res.body === null) return res;
  let seen = false;
  const body = res.body.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, ctl) {
        if (!seen && chunk.byteLength > 0) {
          seen = true;
          onFirst(performance.now());
        }
        ctl.enqueue(chunk);
      },
    }),
  );
  return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
}

/** A random bootstrap room id in [0, 2^53) (a safe integer, so JSON keeps it exact). */
export function randomRoom(): number {
  return Number(randomBytes(8).readBigUInt64BE() & ((1n << 53n) - 1n));
}

/** undici's `cause` of a failed fetch: its code, message and, for a socket error, the socket's byte counts. */
interface FetchCause {
  code?: string;
  message?: string;
  socket?: { bytesWritten?: number; bytesRead?: number };
}

/**
 * The reason a fetch failed, from undici's `cause`: its code (e.g. `ECONNREFUSED`), and for a dropped connection
 * (`UND_ERR_SOCKET`) undici's message and the connection's bytes sent and received, e.g. `UND_ERR_SOCKET (other side
 * closed; 412 B sent, 0 B received)`.
 */
function describeFetchError(err: unknown): string {
  const cause = (err as { cause?: FetchCause }).cause;
  // the fetch standard's blocked ports (6000, 6665–6669, …): Node's fetch refuses them before connecting
  if (cause?.message === 'bad port')
    return (
      "bad port: the port is on the fetch standard's blocked-port list, which Node's fetch refuses; run that " +
      'server on another port'
    );
  const code = cause?.code ?? cause?.message ?? (err as Error).message ?? String(err);
  const sock = cause?.socket;
  if (cause?.code !== 'UND_ERR_SOCKET' || sock === undefined) return code;
  const bytes = `${sock.bytesWritten ?? '?'} B sent, ${sock.bytesRead ?? '?'} B received`;
  return `${code} (${cause.message ?? 'closed'}; ${bytes})`;
}

/**
 * Connection failures that happen before any answer and that a second attempt, on another connection, may not meet:
 * the peer (or the path to it) closed or reset the connection. A refused connection (no server) or a timeout is not
 * one of them.
 */
const DROPPED_BEFORE_ANSWER = new Set(['UND_ERR_SOCKET', 'ECONNRESET', 'EPIPE']);

/** Whether a rejected fetch lost its connection before the answer's head ({@link DROPPED_BEFORE_ANSWER}). */
function droppedBeforeAnswer(err: unknown): boolean {
  return DROPPED_BEFORE_ANSWER.has((err as { cause?: FetchCause }).cause?.code ?? '');
}

/** The OpenAI error of an upstream's non-2xx answer: its own when it sent one, else one naming the side. */
async function upstreamError(side: PdRole, url: string, res: Response): Promise<{ status: number; body: unknown }> {
  const text = await res.text().catch(() => '');
  try {
    const j = JSON.parse(text) as { error?: { message?: unknown } };
    if (j !== null && typeof j === 'object' && typeof j.error?.message === 'string')
      return { status: res.status, body: j };
  } catch {
    // not JSON: wrapped below
  }
  const e = new ApiError(
    res.status,
    `${side} server ${url} answered ${res.status}: ${text.slice(0, 200)}`,
    res.status >= 500 ? 'server_error' : 'invalid_request_error',
    null,
    'upstream_error',
  );
  return { status: res.status, body: e.toJSON() };
}

const send = (reply: FastifyReply, e: ApiError): FastifyReply =>
  reply.code(e.status).type('application/json').send(e.toJSON());

/** Headers of D's answer passed to the client (hop-by-hop and length headers are the router's own). */
const PASSED_HEADERS = ['content-type', 'cache-control', 'x-accel-buffering'];

/** A running router. */
export class PdRouter {
  readonly app: FastifyInstance;
  readonly metrics = new PdRouterMetrics();
  readonly policy: PdPolicy;
  private readonly upstreams: readonly Upstream[];
  private readonly timeoutMs: number;
  private timer: NodeJS.Timeout | undefined;
  private closed = false;
  private boundHost: string | undefined;
  /** When each client request arrived (performance.now(), ms), by its socket request. */
  private readonly arrivals = new WeakMap<object, number>();
  /** The last waterfalls by P/D request id (pending while assembled; undefined: the pair failed). */
  private readonly waterfalls = new Map<string, Promise<Waterfall | undefined>>();

  /** @throws {PdError} `'peer'` when a role has no URL or a URL appears twice. */
  constructor(readonly options: PdRouterOptions) {
    for (const role of ['prefill', 'decode'] as const)
      if (options[role].length === 0) throw new PdError('peer', `router: ${role}: at least one server URL is needed`);
    const make = (role: PdRole, url: string, index: number): Upstream => ({
      url: url.replace(/\/+$/, ''),
      index,
      role,
      healthy: false,
      reason: 'not checked yet',
      bootstrap: undefined,
      model: undefined,
    });
    this.upstreams = [
      ...options.prefill.map((u, i) => make('prefill', u, i)),
      ...options.decode.map((u, i) => make('decode', u, i)),
    ];
    const seen = new Set<string>();
    for (const u of this.upstreams) {
      if (seen.has(u.url)) throw new PdError('peer', `router: ${u.url} is listed twice`);
      seen.add(u.url);
      this.metrics.upstreamHealthy.set({ url: u.url, role: u.role }, 0);
    }
    this.policy = options.policy ?? new RoundRobinPolicy();
    this.timeoutMs = options.upstreamTimeoutMs ?? 5000;
    this.app = Fastify({
      bodyLimit: options.bodyLimitBytes ?? 1048576,
      requestIdHeader: 'x-request-id',
      genReqId: () => randomUUID(),
      ...(options.logger === undefined
        ? { logger: false }
        : { loggerInstance: options.logger as unknown as FastifyBaseLogger }),
      // requests arriving while closing get the router's own 503 server_shutting_down (OpenAI's error shape)
      return503OnClosing: false,
    });
    this.routes();
  }

  /** Every upstream's state, prefill servers first, in configured order. */
  states(): PdUpstreamState[] {
    return this.upstreams.map((u) => ({
      url: u.url,
      role: u.role,
      healthy: u.healthy,
      ...(u.reason === undefined ? {} : { reason: u.reason }),
      ...(u.bootstrap === undefined ? {} : { bootstrap: u.bootstrap }),
      ...(u.model === undefined ? {} : { model: u.model }),
    }));
  }

  /**
   * Checks every upstream (/pd/info, then /health), then listens on host:port (port 0: ephemeral) and checks
   * them again every `healthIntervalMs`. An upstream that cannot be reached starts unhealthy (logged).
   * @returns the base URL, e.g. `http://127.0.0.1:8000`.
   * @throws {PdError} `'peer'` naming a URL whose /pd/info answers the other role; {@link BindError} for a wildcard
   *   host without an API key and without allowed hosts (serve/http-guard.ts checkBind; beyond loopback without a key
   *   it logs a warning).
   */
  async listen(host: string, port: number): Promise<string> {
    const warning = checkBind(host, this.options);
    if (warning !== undefined) this.options.logger?.warn(warning);
    this.boundHost = host;
    await Promise.all(this.upstreams.map((u) => this.probe(u, true)));
    for (const u of this.upstreams)
      if (!u.healthy) this.options.logger?.warn({ url: u.url, role: u.role, reason: u.reason }, 'upstream not healthy');
    await this.app.listen({ host, port });
    this.schedule();
    const a = this.app.server.address() as AddressInfo;
    return `http://${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`;
  }

  /** One round of health checks on every upstream (what the timer runs). */
  async checkHealth(): Promise<void> {
    await Promise.all(this.upstreams.map((u) => this.probe(u, false)));
  }

  /** Stops the health checks and listening (in-flight answers finish first). */
  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.timer);
    await this.app.close();
    await this.options.prompts.close();
  }

  private schedule(): void {
    const every = this.options.healthIntervalMs ?? 5000;
    if (this.closed || every <= 0) return;
    this.timer = setTimeout(() => {
      void this.checkHealth().finally(() => this.schedule());
    }, every);
    this.timer.unref();
  }

  private setHealth(u: Upstream, healthy: boolean, reason?: string): void {
    if (u.healthy !== healthy)
      this.options.logger?.info({ url: u.url, role: u.role, healthy, reason }, 'upstream health changed');
    u.healthy = healthy;
    u.reason = healthy ? undefined : reason;
    this.metrics.upstreamHealthy.set({ url: u.url, role: u.role }, healthy ? 1 : 0);
  }

  /**
   * GET /pd/info (the role must match; P's bootstrap address; the model), then GET /health; `u` is healthy when
   * both answer as they should. @throws {PdError} `'peer'` on a role mismatch when `atStart`.
   */
  private async probe(u: Upstream, atStart: boolean): Promise<void> {
    const get = (route: string): Promise<Response> =>
      fetch(`${u.url}${route}`, { headers: this.keyHeader(), signal: AbortSignal.timeout(this.timeoutMs) });
    let info: { role?: unknown; bootstrap?: unknown; model?: unknown };
    try {
      const res = await get('/pd/info');
      if (!res.ok) {
        await res.body?.cancel();
        return this.setHealth(u, false, `GET /pd/info answered ${res.status}`);
      }
      info = (await res.json()) as typeof info;
    } catch (err) {
      return this.setHealth(u, false, `GET /pd/info failed: ${describeFetchError(err)}`);
    }
    if (info.role !== u.role) {
      const role = JSON.stringify(info.role);
      const what = `${u.url} was given as a ${u.role} server but its /pd/info answers role ${role}`;
      if (atStart) throw new PdError('peer', `router: ${what}`);
      return this.setHealth(u, false, what);
    }
    if (u.role === 'prefill') {
      if (typeof info.bootstrap !== 'string' || info.bootstrap === '')
        return this.setHealth(
          u,
          false,
          `/pd/info: bootstrap: expected an address, got ${JSON.stringify(info.bootstrap)}`,
        );
      u.bootstrap = info.bootstrap;
    }
    if (typeof info.model === 'string') u.model = info.model;
    try {
      const res = await get('/health');
      await res.body?.cancel();
      this.setHealth(u, res.ok, res.ok ? undefined : `GET /health answered ${res.status}`);
    } catch (err) {
      this.setHealth(u, false, `GET /health failed: ${describeFetchError(err)}`);
    }
  }

  private healthy(role: PdRole): Upstream[] {
    return this.upstreams.filter((u) => u.role === role && u.healthy);
  }

  /** The healthy server of `role` the policy picks. @throws {ApiError} 503 naming the role and why none is. */
  private pick(role: PdRole): Upstream {
    const healthy = this.healthy(role);
    if (healthy.length === 0) {
      const why = this.upstreams
        .filter((u) => u.role === role)
        .map((u) => `${u.url}: ${u.reason ?? 'unhealthy'}`)
        .join('; ');
      throw new ApiError(503, `no healthy ${role} server (${why})`, 'server_error', null, 'no_healthy_upstream');
    }
    return this.policy.pick(role, healthy);
  }

  /** Keeps a pair's waterfall (pending until assembled) for `GET /pd/waterfall/<id>` (the last 1024). */
  private keepWaterfall(requestId: string, w: Promise<Waterfall | undefined>): void {
    this.waterfalls.delete(requestId);
    this.waterfalls.set(requestId, w);
    if (this.waterfalls.size > WATERFALLS_KEPT) {
      const oldest = this.waterfalls.keys().next().value;
      if (oldest !== undefined) this.waterfalls.delete(oldest);
    }
  }

  /** Posts /pd/abort to `u` (never throws; failures are logged). */
  private abortUpstream(u: Upstream, room: number, requestId: string, reason: string, log: FastifyBaseLogger): void {
    this.metrics.aborts.inc({ role: u.role });
    fetch(`${u.url}/pd/abort`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': requestId, ...this.keyHeader() },
      body: JSON.stringify({ room, request_id: requestId, reason }),
      signal: AbortSignal.timeout(this.timeoutMs),
    }).then(
      (res) => res.body?.cancel(),
      (err: unknown) => log.warn({ url: u.url, err: describeFetchError(err) }, 'POST /pd/abort failed'),
    );
  }

  /** `Authorization: Bearer KEY` for calls to P and D when the deployment has a key. */
  private keyHeader(): Record<string, string> {
    return this.options.apiKey === undefined ? {} : { authorization: `Bearer ${this.options.apiKey}` };
  }

  /** The Authorization header a client's request is forwarded with: the deployment's key, or the client's own. */
  private authFor(req: FastifyRequest): Record<string, string> {
    return this.options.apiKey === undefined ? auth(req) : this.keyHeader();
  }

  private routes(): void {
    const app = this.app;
    app.addHook('onRequest', async (req) => {
      this.arrivals.set(req.raw, performance.now());
    });
    installAccessHook(
      app,
      this.options,
      () => this.boundHost,
      () => this.metrics.errors.inc({ side: 'router' }),
    );
    app.addHook('onRequest', async (_req, reply) => {
      if (this.closed) return send(reply.header('connection', 'close'), shuttingDown());
    });
    installJsonParser(app);
    app.addHook('onResponse', async (req, reply) => {
      this.metrics.requests.inc({ route: req.routeOptions.url ?? 'unknown', status: String(reply.statusCode) });
    });
    app.setErrorHandler((err: Error & { statusCode?: number; code?: string }, req, reply) => {
      let e: ApiError;
      if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE') {
        this.metrics.errors.inc({ side: 'router' });
        return answerThenDrain(req, reply, bodyTooLarge(app.initialConfig.bodyLimit ?? 0));
      }
      if (err instanceof ApiError) e = err;
      else if (err.statusCode !== undefined && err.statusCode >= 400 && err.statusCode < 500)
        e = new ApiError(400, `malformed request: ${err.message}`, 'invalid_request_error', null, 'invalid_json');
      else {
        req.log.error(err);
        e = new ApiError(500, `internal error: ${err.message}`, 'server_error', null, 'internal_error');
      }
      this.metrics.errors.inc({ side: 'router' });
      return send(reply, e);
    });
    app.setNotFoundHandler((req, reply) =>
      send(reply, new ApiError(404, `no route ${req.method} ${req.url}`, 'invalid_request_error', null, 'not_found')),
    );
    app.get('/health', async (_req, reply) => {
      const ok = this.healthy('prefill').length > 0 && this.healthy('decode').length > 0;
      return reply.code(ok ? 200 : 503).send({ status: ok ? 'ok' : 'error', upstreams: this.states() });
    });
    app.get('/metrics', async (_req, reply) =>
      reply.type(this.metrics.registry.contentType).send(await this.metrics.registry.metrics()),
    );
    app.get('/v1/models', async (req, reply) => {
      const d = this.pick('decode');
      let res: Response;
      try {
        res = await fetch(`${d.url}/v1/models`, {
          headers: { 'x-request-id': String(req.id), ...this.authFor(req) },
          signal: AbortSignal.timeout(this.timeoutMs),
        });
      } catch (err) {
        this.setHealth(d, false, `GET /v1/models failed: ${describeFetchError(err)}`);
        throw unreachable('decode', d.url, err);
      }
      return reply
        .code(res.status)
        .type('application/json')
        .send(await res.text());
    });
    app.get<{ Params: { id: string } }>('/pd/waterfall/:id', async (req, reply) => {
      const pending = this.waterfalls.get(req.params.id);
      const w =
        pending === undefined
          ? undefined
          : await Promise.race([
              pending,
              new Promise<undefined>((r) => setTimeout(r, WATERFALL_WAIT_MS, undefined).unref()),
            ]);
      if (w === undefined)
        return send(
          reply,
          new ApiError(
            404,
            `no waterfall for request ${req.params.id} (unknown, failed, or older than the last ${WATERFALLS_KEPT})`,
            'invalid_request_error',
            null,
            'not_found',
          ),
        );
      return w;
    });
    app.post('/v1/completions', (req, reply) => this.generate(req, reply, 'completion'));
    app.post('/v1/chat/completions', (req, reply) => this.generate(req, reply, 'chat'));
  }

  /** 404 when the healthy decode servers name their model and `p.model` is none of them. */
  private checkModel(p: GenerationParams): void {
    const served = [...new Set(this.healthy('decode').flatMap((u) => (u.model === undefined ? [] : [u.model])))];
    if (served.length > 0 && !served.includes(p.model)) throw unknownModel(p.model, served.join('", "'));
  }

  /**
   * Counts a client request in flight until its connection closes; a client that leaves before its answer ended is
   * counted as a 499 and `leave` runs (it aborts the request's P/D pairs).
   */
  private watchClient(req: FastifyRequest, reply: FastifyReply, leave: () => void): void {
    this.metrics.inFlight.inc();
    reply.raw.on('close', () => {
      this.metrics.inFlight.dec();
      if (reply.raw.writableFinished) return;
      this.metrics.requests.inc({ route: req.routeOptions.url ?? 'unknown', status: '499' });
      leave();
    });
  }

  /** The prompt ids of one one-choice body (400 for a bad field, 404 for another model). */
  private async buildPrompt(body: unknown, kind: PromptKind): Promise<{ prompt: BuiltPrompt; p: GenerationParams }> {
    const { sampling, prompts } = this.options;
    if (kind === 'chat') {
      const p = parseChatRequest(body, sampling);
      this.checkModel(p);
      return { prompt: await prompts.chat(p), p };
    }
    const p = parseCompletionRequest(body, sampling);
    this.checkModel(p);
    return { prompt: await prompts.completion(p), p };
  }

  /** A client request: one P/D pair, or one per choice when it has several (`n` > 1, a list of prompts). */
  private async generate(req: FastifyRequest, reply: FastifyReply, kind: PromptKind): Promise<FastifyReply> {
    const n = checkRequestFields(req.body, kind);
    const many = choiceBodies(req.body, kind, n);
    if (many !== undefined) return this.generateChoices(req, reply, kind, many, n);
    const { prompt } = await this.buildPrompt(req.body, kind);
    if (req.raw.socket.destroyed) return reply; // gone while its body was read: nothing to start
    let clientGone = false;
    const pair = this.startPair(req, kind, req.body, prompt, () => clientGone);
    this.watchClient(req, reply, () => {
      clientGone = true;
      req.log.info('client disconnected: aborting prefill and decode');
      pair.abort('client disconnected');
    });
    const out = await pair.done;
    if (clientGone) return reply;
    if (!out.ok) return reply.code(out.status).type('application/json').send(out.body);
    const res = out.res;
    reply.code(res.status).header('x-request-id', String(req.id));
    for (const h of PASSED_HEADERS) {
      const v = res.headers.get(h);
      if (v !== null) reply.header(h, v);
    }
    if (res.body === null) return reply.send();
    const body = Readable.fromWeb(res.body as WebReadableStream<Uint8Array>);
    body.on('error', (err) => {
      if (clientGone) return; // the client's disconnect ended it: already handled
      pair.brokeOff(err);
    });
    return reply.send(body);
  }

  /**
   * Runs one one-choice `body` through a P and a D (see the module comment): both get the same JSON, the first side
   * to fail decides. `done` resolves with D's answer once its headers came (the transfer is verified), or with the
   * error the client gets (the other side aborted). `gone()` says the client left (its errors are not counted).
   * @throws {ApiError} 503 when no healthy P or D is left (before anything is sent).
   */
  private startPair(
    req: FastifyRequest,
    kind: PromptKind,
    body: unknown,
    prompt: BuiltPrompt,
    gone: () => boolean,
    choice?: number,
  ): PairRun {
    const sides: Record<PdRole, Upstream> = { prefill: this.pick('prefill'), decode: this.pick('decode') };
    // a request of several choices: one request id per pair (`<id>-<choice>`), as P and D log and key by it
    const requestId = choice === undefined ? String(req.id) : `${String(req.id)}-${choice}`;
    const room = randomRoom();
    const log = req.log;
    const arrived = this.arrivals.get(req.raw) ?? performance.now();
    log.info(
      { prefill: sides.prefill.url, decode: sides.decode.url, room, promptTokens: prompt.ids.length },
      'pd route',
    );
    const payload = JSON.stringify({
      request_id: requestId,
      room,
      kind,
      prompt_ids: Array.from(prompt.ids),
      bootstrap: sides.prefill.bootstrap,
      body,
    });
    const controllers: Record<PdRole, AbortController> = {
      prefill: new AbortController(),
      decode: new AbortController(),
    };
    const aborted = new Set<PdRole>();
    const abort = (role: PdRole, reason: string): void => {
      controllers[role].abort();
      if (aborted.has(role)) return;
      aborted.add(role);
      this.abortUpstream(sides[role], room, requestId, reason, log);
    };

    type Outcome = { side: PdRole; res?: Response; err?: unknown };
    const post = (role: PdRole): Promise<Response> =>
      fetch(`${sides[role].url}/pd/${role}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-request-id': requestId, ...this.authFor(req) },
        body: payload,
        signal: controllers[role].signal,
      });
    // A connection dropped before any answer is sent once more (CI's network-namespace test met such a drop twice,
    // NIXL's D alive and silent; its cause is not known). That helps when the upstream never read the request. When
    // it did, the second attempt is refused — P and D refuse a room in use, P keeps a finished room's tombstone, so
    // nothing runs twice — and the client gets the drop, not that refusal; fail() then aborts the room on that side
    // too, freeing what the first attempt holds there.
    const call = (role: PdRole): Promise<Outcome> =>
      post(role).then(
        (res) => ({ side: role, res }),
        async (first: unknown): Promise<Outcome> => {
          if (controllers[role].signal.aborted || !droppedBeforeAnswer(first)) return { side: role, err: first };
          this.metrics.retries.inc({ role });
          log.warn(
            { url: sides[role].url, err: describeFetchError(first) },
            `POST /pd/${role}: the connection dropped before an answer; retrying once`,
          );
          try {
            const res = await post(role);
            if (res.ok) return { side: role, res };
            await res.body?.cancel();
            log.warn(
              { url: sides[role].url, status: res.status },
              `POST /pd/${role}: the retry was refused; answering with the dropped connection`,
            );
          } catch (err) {
            return { side: role, err };
          }
          return { side: role, err: first };
        },
      );
    const outcomes: Record<PdRole, Promise<Outcome>> = { prefill: call('prefill'), decode: call('decode') };
    const routerMs = performance.now() - arrived;
    // the waterfall (pd/waterfall.ts): P's part from its answer, D's from its header, the TTFT at D's first byte
    let prefillPart: (p: PrefillTimings | undefined) => void = () => undefined;
    const prefillTimings = new Promise<PrefillTimings | undefined>((r) => {
      prefillPart = r;
    });
    let settle: (w: Waterfall | undefined) => void = () => undefined;
    this.keepWaterfall(
      requestId,
      new Promise<Waterfall | undefined>((r) => {
        settle = r;
      }),
    );
    /** Reads P's successful answer (its waterfall part). */
    const readPrefill = (res: Response | undefined): Promise<void> =>
      (res === undefined ? Promise.resolve(undefined) : (res.json() as Promise<{ waterfall?: unknown }>)).then(
        (j) => prefillPart(parsePrefillTimings(j?.waterfall)),
        () => prefillPart(undefined),
      );
    /** D's answer with its first byte timed: the waterfall is assembled then. */
    const timed = (res: Response): Response => {
      const d = parseDecodeTimings(res.headers.get(DECODE_TIMINGS_HEADER));
      return timeFirstByte(res, (at) => {
        void prefillTimings.then((p) => {
          if (p === undefined || d === undefined) return settle(undefined);
          const w = assembleWaterfall(requestId, routerMs, at - arrived, p, d);
          this.metrics.observe(w);
          log.debug({ waterfall: w }, 'pd waterfall');
          settle(w);
        });
      });
    };

    /** The client's answer to `side`'s failure; the other side is aborted. */
    const fail = async (o: Outcome): Promise<PairOutcome> => {
      settle(undefined);
      const u = sides[o.side];
      const ours = aborted.has(o.side); // the router aborted it (the client left, another choice failed)
      abort(OTHER[o.side], `${o.side} server ${u.url} failed`);
      if (gone() || ours) {
        // the client's disconnect aborted the upstream call: not the upstream's error
        await o.res?.body?.cancel();
        return { ok: false, status: 499, body: null };
      }
      this.metrics.errors.inc({ side: o.side });
      if (o.res === undefined) {
        // a dropped connection: the upstream may have read the request and hold its room; abort it there as well
        if (droppedBeforeAnswer(o.err)) abort(o.side, `the connection to ${o.side} server ${u.url} dropped`);
        this.setHealth(u, false, `POST /pd/${o.side} failed: ${describeFetchError(o.err)}`);
        log.warn({ url: u.url, err: describeFetchError(o.err) }, `${o.side} server unreachable`);
        const e = unreachable(o.side, u.url, o.err);
        return { ok: false, status: e.status, body: e.toJSON() };
      }
      const e = await upstreamError(o.side, u.url, o.res);
      log.info({ url: u.url, status: e.status }, `${o.side} server failed the request`);
      return { ok: false, ...e };
    };
    const failed = (o: Outcome): boolean => o.res === undefined || !o.res.ok;

    const done = (async (): Promise<PairOutcome> => {
      let first = await Promise.race([outcomes.prefill, outcomes.decode]);
      if (first.side === 'prefill') {
        if (failed(first)) return fail(first);
        void readPrefill(first.res);
        first = await outcomes.decode;
      } else {
        void outcomes.prefill.then(async (o) => {
          if (!failed(o)) return readPrefill(o.res);
          prefillPart(undefined);
          if (controllers.prefill.signal.aborted || gone()) return;
          this.metrics.errors.inc({ side: 'prefill' });
          if (o.res === undefined)
            this.setHealth(sides.prefill, false, `POST /pd/prefill failed: ${describeFetchError(o.err)}`);
          log.warn({ url: sides.prefill.url, status: o.res?.status }, 'prefill failed after decode answered');
        });
      }
      if (gone()) {
        settle(undefined);
        await first.res?.body?.cancel();
        return { ok: false, status: 499, body: null };
      }
      const res = first.res;
      if (res === undefined || !res.ok) return fail(first);
      return { ok: true, res: timed(res) };
    })();
    return {
      done,
      abort: (reason) => {
        abort('prefill', reason);
        abort('decode', reason);
      },
      brokeOff: (err) => {
        this.metrics.errors.inc({ side: 'decode' });
        log.warn({ url: sides.decode.url, err: describeFetchError(err) }, 'decode server broke off its answer');
        abort('prefill', `decode server ${sides.decode.url} broke off its answer`);
      },
    };
  }

  /**
   * A request of several choices (serve/choices.ts's rules: choice i × n + j of prompt i samples with seed + j, usage
   * counts each prompt once): one P/D pair per choice, picked by the policy, all started at once; D's answers are
   * merged into one response under the router's id — one JSON, or one SSE stream whose chunks carry their choice's
   * index, one usage chunk (when asked) and one `[DONE]`. The first pair that fails before its headers fails the
   * request (the others are aborted); a stream that breaks off later ends the client's stream with an error event.
   */
  private async generateChoices(
    req: FastifyRequest,
    reply: FastifyReply,
    kind: PromptKind,
    bodies: readonly unknown[],
    n: number,
  ): Promise<FastifyReply> {
    const built = [];
    for (const body of bodies)
      built.push({ body: body as Record<string, unknown>, ...(await this.buildPrompt(body, kind)) });
    if (req.raw.socket.destroyed) return reply;
    let clientGone = false;
    const pairs: PairRun[] = [];
    const abortAll = (reason: string): void => {
      for (const pair of pairs) pair.abort(reason);
    };
    try {
      for (const b of built)
        for (let j = 0; j < n; j++) {
          const body = { ...b.body, seed: (b.p.seed + j) >>> 0 };
          pairs.push(this.startPair(req, kind, body, b.prompt, () => clientGone, pairs.length));
        }
    } catch (err) {
      abortAll('the request could not be routed'); // no healthy P or D for a later choice
      throw err;
    }
    this.watchClient(req, reply, () => {
      clientGone = true;
      req.log.info('client disconnected: aborting every choice');
      abortAll('client disconnected');
    });
    // the first choice to fail aborts the others at once
    const outs = await Promise.all(
      pairs.map((p) =>
        p.done.then((o) => {
          if (!o.ok) abortAll('another choice of the request failed');
          return o;
        }),
      ),
    );
    if (clientGone) return reply;
    // the failure the client gets: the first that is not one of the aborts it caused
    const bad = outs.find((o) => !o.ok && o.status !== 499) ?? outs.find((o) => !o.ok);
    if (bad !== undefined && !bad.ok) {
      for (const o of outs) if (o.ok) await o.res.body?.cancel();
      return reply.code(bad.status).type('application/json').send(bad.body);
    }
    const responses = outs.map((o) => (o as { res: Response }).res);
    const chat = kind === 'chat';
    const id = `${chat ? 'chatcmpl' : 'cmpl'}-${randomUUID().replace(/-/g, '')}`;
    const stream = responses.some((r) => (r.headers.get('content-type') ?? '').startsWith('text/event-stream'));
    reply.header('x-request-id', String(req.id));
    type Usage = { prompt_tokens: number; completion_tokens: number; total_tokens: number };
    const usage = { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
    const addUsage = (k: number, u: Usage | undefined): void => {
      if (u === undefined) return;
      if (k % n === 0) usage.prompt_tokens += u.prompt_tokens; // each prompt once
      usage.completion_tokens += u.completion_tokens;
      usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
    };
    if (!stream) {
      const jsons = await Promise.all(responses.map((r) => r.json() as Promise<ChoiceAnswer>));
      const choices = jsons.map((j, k) => ({ ...(j.choices[0] ?? {}), index: k }));
      jsons.forEach((j, k) => {
        addUsage(k, j.usage);
      });
      const first = jsons[0] as ChoiceAnswer;
      return reply
        .code(200)
        .send({ id, object: first.object, created: first.created, model: first.model, choices, usage });
    }
    reply.hijack();
    const raw = reply.raw;
    raw.writeHead(200, {
      ...Object.fromEntries(
        PASSED_HEADERS.flatMap((h) => {
          const v = responses[0]?.headers.get(h);
          return v === null || v === undefined ? [] : [[h, v]];
        }),
      ),
      'x-request-id': String(req.id),
    });
    let wantUsage = false;
    let created: number | undefined;
    let object: string | undefined;
    let model: string | undefined;
    let ended = false;
    const end = (tail: string): void => {
      if (ended) return;
      ended = true;
      raw.end(tail);
    };
    await Promise.all(
      responses.map(async (res, k) => {
        try {
          for await (const data of sseEvents(res)) {
            if (ended) break;
            if (data === '[DONE]') continue;
            const ev = JSON.parse(data) as ChoiceAnswer & { error?: unknown };
            if (ev.error !== undefined) {
              abortAll('another choice of the request failed');
              end(`data: ${data}\n\ndata: [DONE]\n\n`);
              break;
            }
            created ??= ev.created;
            object ??= ev.object;
            model ??= ev.model;
            if (ev.choices.length === 0 && ev.usage !== undefined) {
              wantUsage = true;
              addUsage(k, ev.usage);
              continue;
            }
            raw.write(
              `data: ${JSON.stringify({ ...ev, id, choices: ev.choices.map((c) => ({ ...c, index: k })) })}\n\n`,
            );
          }
        } catch (err) {
          if (clientGone || ended) return;
          pairs[k]?.brokeOff(err);
          abortAll('another choice of the request broke off');
          const e = new ApiError(
            502,
            `decode server broke off choice ${k}: ${describeFetchError(err)}`,
            'server_error',
            null,
            'upstream_error',
          );
          end(`data: ${JSON.stringify(e.toJSON())}\n\ndata: [DONE]\n\n`);
        }
      }),
    );
    if (clientGone) return reply;
    if (wantUsage) raw.write(`data: ${JSON.stringify({ id, object, created, model, choices: [], usage })}\n\n`);
    end('data: [DONE]\n\n');
    return reply;
  }
}

/** One P/D pair's run ({@link PdRouter.startPair}). */
interface PairRun {
  /** D's answer once its headers came, or the error the client gets. */
  readonly done: Promise<PairOutcome>;
  /** Aborts both sides (each gets /pd/abort once). */
  abort(reason: string): void;
  /** D's answer broke off after its headers: counted, logged, P aborted. */
  brokeOff(err: unknown): void;
}

type PairOutcome =
  | { readonly ok: true; readonly res: Response }
  | { readonly ok: false; readonly status: number; readonly body: unknown };

/** The fields of a D answer (or stream chunk) the merge reads. */
interface ChoiceAnswer {
  readonly object: string;
  readonly created: number;
  readonly model: string;
  readonly choices: Record<string, unknown>[];
  readonly usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
}

/** The `data:` payloads of a server-sent-events response, in order. @throws what reading the body throws. */
async function* sseEvents(res: Response): AsyncGenerator<string> {
  if (res.body === null) return;
  const decoder = new TextDecoder();
  let buf = '';
  for await (const bytes of res.body as unknown as AsyncIterable<Uint8Array>) {
    buf += decoder.decode(bytes, { stream: true });
    let cut = buf.indexOf('\n\n');
    while (cut >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = event
        .split('\n')
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).trimStart())
        .join('\n');
      if (data !== '') yield data;
      cut = buf.indexOf('\n\n');
    }
  }
}

/** The client's Authorization header, forwarded to P and D (they may require an API key). */
function auth(req: FastifyRequest): Record<string, string> {
  const a = req.headers.authorization;
  return a === undefined ? {} : { authorization: a };
}

/** 502 naming the side and the URL that could not be reached. */
function unreachable(side: PdRole, url: string, err: unknown): ApiError {
  return new ApiError(
    502,
    `${side} server ${url} is unreachable: ${describeFetchError(err)}`,
    'server_error',
    null,
    'upstream_unreachable',
  );
}
