/**
 * The OpenAI-compatible HTTP server (fastify): `POST /v1/completions`, `POST /v1/chat/completions`
 * (streaming as SSE `data: {…}\n\n` … `data: [DONE]\n\n`, or one JSON), `GET /v1/models`,
 * `GET /health`, `GET /metrics` (Prometheus). Every request goes through one {@link EngineLoop}
 * (continuous batching). Errors are OpenAI's `{"error": {message, type, param, code}}`: 400 bad
 * parameter, malformed JSON (or nested deeper than 64 levels), messages the chat template rejects, or a prompt +
 * max_tokens past the context length (`context_length_exceeded`, vLLM's message; limits.ts), 401 bad API key,
 * 403 a Host not allowed (no API key: DNS rebinding; http-guard.ts), 404 unknown model or route, 413 a body over
 * body_limit_bytes (answered before the upload ends, then the connection closes), 503 overloaded or
 * `server_shutting_down` (requests in flight or arriving while {@link SpecdServer.close} runs; `Connection: close`,
 * and an open stream ends with an error event), 500 when the model fails (a dead pipeline stage: in-flight and later
 * requests fail naming the stage; `/health` then answers 503). A client that disconnects has its request aborted:
 * its KV pages, state slot and draft context are freed before the next engine step. Long prompts are encoded in a
 * worker thread (prompt-encoder.ts), so `/health` and the engine steps go on meanwhile.
 */

import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';

import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply } from 'fastify';
import type { Logger } from 'pino';

import type { SpecEngine } from '../engine/engine.js';
import type { TokenLogprob } from '../engine/logprobs.js';
import { EngineError, SequenceError, type SpecResult } from '../engine/types.js';
import type { Drafter } from '../plugin/drafter-plugin.js';
import type { StageModel } from '../plugin/model-plugin.js';
import type { Tokenizer } from '../io/tokenizer.js';
import { EngineLoop, type LoopListener, type LoopRequest, OverloadedError } from './engine-loop.js';
import {
  ApiError,
  bodyTooLarge,
  invalidParam,
  modelFailed,
  overloaded,
  pdFailed,
  prefillOnly,
  sequenceFailed,
  shuttingDown,
  unknownModel,
} from './errors.js';
import { answerThenDrain, checkBind, installAccessHook, installJsonParser } from './http-guard.js';
import { checkServerContextLength, type ModelContextLength, resolveMaxTokens } from './limits.js';
import { apiFinishReason, ServerMetrics } from './metrics.js';
import { PromptBuilder } from './prompt.js';
import { DecodeRole } from '../pd/decode-role.js';
import { PrefillRole, type PdRoleOptions, type PrefillRoleOptions } from '../pd/prefill-role.js';
import { parsePdRequest, type PdRequest, ROOM_EXPECTED, requestDigest, roomName } from '../pd/protocol.js';
import { PdError, type PdPayloadClass } from '../pd/types.js';
import { DECODE_TIMINGS_HEADER, type WaterfallPhase } from '../pd/waterfall.js';
import {
  logitsProblem,
  parseChatRequest,
  parseCompletionRequest,
  samplingOf,
  type GenerationParams,
  type SamplingDefaults,
} from './protocol.js';
import { StatsLogger } from './stats-log.js';
import { ChoiceOutput } from './choice-output.js';
import { type ChoicesHost, choiceBodies, SSE_HEADERS, serveChoices } from './choices.js';
import { checkRequestFields, UnknownFieldLog } from './request-fields.js';
import { installRequestId } from './request-id.js';
import { installTokenizeRoutes } from './tokenize-routes.js';

/** Scheduler settings (the config's `scheduler`). */
export interface SchedulerSettings {
  readonly max_running_requests: number;
  readonly max_waiting_requests: number;
  readonly prefill_chunk_tokens: number;
  readonly max_tokens_in_flight: number;
  readonly max_sequence_tokens: number;
  readonly page_size: number;
}

/** What a server serves and how. */
export interface SpecdServerOptions {
  readonly target: {
    readonly model: StageModel;
    readonly tokenizer: Tokenizer;
    readonly eosTokenIds: readonly number[];
  };
  readonly drafter?: Drafter;
  /** The id clients name in `model`. */
  readonly modelName: string;
  readonly sampling: SamplingDefaults;
  readonly scheduler: SchedulerSettings;
  /** Clients send `Authorization: Bearer <apiKey>` (http-guard.ts); absent: no key, and the Host header is checked. */
  readonly apiKey?: string;
  /** Host names accepted besides the bound address and loopback (`*`: any); see http-guard.ts AccessPolicy. */
  readonly allowedHosts?: readonly string[];
  /** `/metrics` needs the API key too (default: open). */
  readonly metricsNeedKey?: boolean;
  /**
   * The target's context length (limits.ts modelContextLength): `scheduler.max_sequence_tokens` may not exceed it.
   * Absent: not checked.
   */
  readonly modelContextLength?: ModelContextLength;
  readonly bodyLimitBytes: number;
  /** Drafts per step at most (default: the drafter's maximum). */
  readonly numDraftTokens?: number;
  /** A pino logger (default: none). */
  readonly logger?: Logger;
  /**
   * Prefill/decode disaggregation: serve as the prefill or the decode instance of a pair (`/pd/*` routes, the
   * bootstrap socket and the transfer agent; docs/ARCHITECTURE.md). Absent: aggregated serving only.
   */
  readonly pd?:
    | { readonly role: 'prefill'; readonly options: PrefillRoleOptions }
    | { readonly role: 'decode'; readonly options: PdRoleOptions };
  /**
   * Period of the stats line (serve/stats-log.ts) on `logger`, ms (default 10 000, as vLLM; 0: none, the CLI's
   * `--disable-log-stats`). Started by {@link SpecdServer.listen}, stopped by {@link SpecdServer.close}.
   */
  readonly statsIntervalMs?: number;
}

/** Checked parameters whose max_tokens is resolved against the prompt (absent: the remaining context). */
type ResolvedParams = GenerationParams & { readonly maxTokens: number };

/** How a request enters the engine loop: its loop id, and the call that starts it once the response is open. */
interface Opened {
  readonly loopId: number | undefined;
  begin(): void;
  /**
   * Extra response headers, read once when the headers are written: after the first token for a stream (Node sends
   * the head with the first body bytes anyway), with the answer otherwise (the decode role's timings).
   */
  readonly headers?: () => Record<string, string>;
}

/** Sends an {@link ApiError} as its OpenAI-style JSON body. */
const send = (reply: FastifyReply, e: ApiError): FastifyReply =>
  reply.code(e.status).type('application/json').send(e.toJSON());

/** A running server. */
export class SpecdServer {
  readonly app: FastifyInstance;
  readonly engine: SpecEngine;
  readonly loop: EngineLoop;
  readonly metrics: ServerMetrics;
  /** The prefill or decode role (prefill/decode disaggregation), if any. */
  readonly pd: PrefillRole | DecodeRole | undefined;
  /** Builds prompt ids (chat template, limits checked before encoding, long texts encoded in a worker thread). */
  readonly prompts: PromptBuilder;
  private readonly created = Math.floor(Date.now() / 1000);
  /** The address given to {@link listen} (its Host is accepted). */
  private boundHost: string | undefined;
  /** Set when {@link close} starts: requests get 503 `server_shutting_down`. */
  private closing = false;
  /** The periodic stats line (undefined without a logger or with `statsIntervalMs` 0). */
  private stats: StatsLogger | undefined;
  /** Unknown request fields, each logged once (request-fields.ts). */
  readonly unknownFields: UnknownFieldLog;

  /**
   * @throws {ContextLengthError} when `scheduler.max_sequence_tokens` exceeds the model's context length;
   *   {@link EngineError} as the engine's constructor.
   */
  constructor(readonly options: SpecdServerOptions) {
    const { target, drafter, scheduler, numDraftTokens } = options;
    checkServerContextLength(scheduler.max_sequence_tokens, options.modelContextLength);
    const tok = target.tokenizer;
    this.loop = new EngineLoop(
      target.model,
      drafter,
      {
        maxSequences: scheduler.max_running_requests,
        // the engine sizes a sequence for prompt + max_tokens + a draft block; drafts never pass prompt + max_tokens
        // (they are capped at the tokens left), so requests are checked against max_sequence_tokens alone
        maxTokensPerSequence: scheduler.max_sequence_tokens + (drafter?.maxDraftTokens ?? 0) + 1,
        pageSize: scheduler.page_size,
        prefillChunk: scheduler.prefill_chunk_tokens,
        decode: (ids) => tok.decode(ids, { skipSpecialTokens: true }),
        // a prefill instance never drafts (its drafter may be context-only): no draft policy, no calibration
        ...(options.pd?.role === 'prefill'
          ? { draftLength: () => 0 }
          : numDraftTokens === undefined
            ? {}
            : { draftLength: () => numDraftTokens }),
      },
      {
        maxWaiting: scheduler.max_waiting_requests,
        maxTokensInFlight: scheduler.max_tokens_in_flight,
        eosTokenIds: target.eosTokenIds,
      },
    );
    this.engine = this.loop.engine;
    const pd = options.pd;
    this.pd =
      pd === undefined
        ? undefined
        : pd.role === 'prefill'
          ? new PrefillRole(this.loop, drafter, pd.options)
          : new DecodeRole(this.loop, drafter, pd.options, scheduler.max_waiting_requests);
    this.metrics = new ServerMetrics({
      running: () => this.loop.running,
      waiting: () => this.loop.waiting,
      targetPagesInUse: () => this.engine.cache.pagesInUse,
      draftPagesInUse: () => drafter?.pagesInUse ?? 0,
      stateSlotsInUse: () => this.engine.cache.slotsInUse,
      prefillTokens: () => this.engine.metrics.prefillTokens,
      transfersInFlight: () => this.pd?.inflight ?? 0,
    });
    this.prompts = new PromptBuilder(tok, target.model.info.vocabSize, {
      maxContextTokens: scheduler.max_sequence_tokens,
    });
    this.app = Fastify({
      bodyLimit: options.bodyLimitBytes,
      ...(options.logger === undefined
        ? { logger: false }
        : { loggerInstance: options.logger as unknown as FastifyBaseLogger }),
      // requests arriving while closing get this server's own 503 (server_shutting_down, OpenAI's error shape)
      return503OnClosing: false,
      // the router's request id (x-request-id) is this request's log id too: one id on router, P and D
      requestIdHeader: 'x-request-id',
      genReqId: () => randomUUID(), // without the header (request-id.ts echoes it)
    });
    this.unknownFields = new UnknownFieldLog((o, msg) => options.logger?.warn(o, msg));
    this.routes();
  }

  /**
   * Calibrates the engine's cost-based draft policy if it needs it (a drafter and the `'cost'` policy:
   * `SpecEngine.calibrate()`, seconds on the tiny model; logged), so that no request waits for it, then
   * listens on host:port (port 0: ephemeral). Nothing answers, `/health` included, until both are done. Binding
   * beyond loopback without an API key logs a warning (http-guard.ts checkBind).
   * @returns the base URL, e.g. `http://127.0.0.1:8000`.
   * @throws {BindError} for a wildcard host (0.0.0.0, ::) without an API key and without allowed hosts.
   */
  async listen(host: string, port: number): Promise<string> {
    const warning = checkBind(host, this.options);
    if (warning !== undefined) this.options.logger?.warn(warning);
    this.boundHost = host;
    const before = this.engine.metrics.calibrationMs;
    if (this.engine.calibrate() !== undefined) {
      this.options.logger?.info(
        { calibrationMs: Math.round(this.engine.metrics.calibrationMs - before) },
        'draft policy: step costs calibrated',
      );
    }
    await this.pd?.start();
    await this.app.listen({ host, port });
    this.startStats();
    const a = this.app.server.address() as AddressInfo;
    return `http://${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`;
  }

  /**
   * Stops listening and ends every request with 503 `server_shutting_down` (`Connection: close`; an open stream gets
   * an error event, then closes); target and drafter stay loaded (the caller disposes them).
   */
  async close(): Promise<void> {
    this.closing = true;
    this.stats?.stop();
    await this.pd?.close();
    this.loop.close();
    await this.app.close();
    await this.prompts.close();
  }

  /** Starts the periodic stats line on the logger (info level; an idle interval at debug level). */
  private startStats(): void {
    const logger = this.options.logger;
    const intervalMs = this.options.statsIntervalMs ?? 10_000;
    if (logger === undefined || intervalMs === 0 || this.stats !== undefined) return;
    this.stats = new StatsLogger(
      {
        promptTokens: () => this.engine.metrics.prefillTokens,
        generationTokens: () => this.loop.generatedTokens,
        running: () => this.loop.running,
        waiting: () => this.loop.waiting,
        kvPages: () => {
          const kv = this.engine.cache.kv;
          return kv === undefined ? undefined : { used: kv.pagesInUse, total: kv.numPages };
        },
        spec: () => this.metrics.specTotals,
      },
      ({ text, active, ...fields }) => (active ? logger.info(fields, text) : logger.debug(fields, text)),
      intervalMs,
    );
    this.stats.start();
  }

  private routes(): void {
    const app = this.app;
    installRequestId(app);
    installAccessHook(
      app,
      this.options,
      () => this.boundHost,
      (e) => this.metrics.errors.inc({ status: String(e.status) }),
    );
    app.addHook('onRequest', async (_req, reply) => {
      if (!this.closing) return;
      this.metrics.errors.inc({ status: '503' });
      return send(reply.header('connection', 'close'), shuttingDown());
    });
    installJsonParser(app);
    app.setErrorHandler((err: Error & { statusCode?: number; code?: string }, req, reply) => {
      let e: ApiError;
      if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE') {
        // answered before the upload ends; the rest is read and dropped, then the connection closes
        this.metrics.errors.inc({ status: '413' });
        return answerThenDrain(req, reply, bodyTooLarge(this.options.bodyLimitBytes));
      }
      if (err instanceof ApiError) e = err;
      else if (err.statusCode === 415)
        e = new ApiError(
          400,
          `${err.message} (send Content-Type: application/json)`,
          'invalid_request_error',
          null,
          'unsupported_media_type',
        );
      else if (err.statusCode !== undefined && err.statusCode >= 400 && err.statusCode < 500)
        e = new ApiError(400, `malformed request: ${err.message}`, 'invalid_request_error', null, 'invalid_json');
      else if (this.closing) e = shuttingDown();
      else {
        this.options.logger?.error(err);
        e = new ApiError(500, `internal error: ${err.message}`, 'server_error', null, 'internal_error');
      }
      // a request the shutdown ended (the engine loop's close, a prefill/decode role's abort) is a 503, not a 500
      if (this.closing && e.status >= 500) e = shuttingDown();
      this.metrics.errors.inc({ status: String(e.status) });
      return send(reply, e);
    });
    app.addHook('onSend', async (_req, reply) => {
      if (this.closing) reply.header('connection', 'close');
    });
    app.setNotFoundHandler((req, reply) => {
      // a route that exists under other methods is a 405 naming them (as FastAPI answers vLLM's routes), else a 404
      const url = req.url.split('?')[0] ?? req.url;
      const allowed = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'].filter(
        (method) => method !== req.method && app.hasRoute({ method: method as 'GET', url }),
      );
      if (allowed.length > 0) {
        this.metrics.errors.inc({ status: '405' });
        reply.header('allow', allowed.join(', '));
        return send(
          reply,
          new ApiError(
            405,
            `method ${req.method} not allowed on ${url} (allowed: ${allowed.join(', ')})`,
            'invalid_request_error',
            null,
            'method_not_allowed',
          ),
        );
      }
      this.metrics.errors.inc({ status: '404' });
      return send(
        reply,
        new ApiError(404, `no route ${req.method} ${req.url}`, 'invalid_request_error', null, 'not_found'),
      );
    });
    // 200 {"status":"ok"}; 503 {"status":"error","reason":…} once the model cannot run (a dead pipeline stage)
    app.get('/health', async (_req, reply) => {
      const f = this.options.target.model.failure?.();
      return f === undefined ? { status: 'ok' } : reply.code(503).send({ status: 'error', reason: f.message });
    });
    app.get('/metrics', async (_req, reply) => {
      const text = await this.metrics.registry.metrics();
      return reply.type(this.metrics.registry.contentType).send(text);
    });
    app.get('/v1/models', async () => ({
      object: 'list',
      data: [
        {
          id: this.options.modelName,
          object: 'model',
          created: this.created,
          owned_by: 'specd',
          max_model_len: this.options.scheduler.max_sequence_tokens,
        },
      ],
    }));
    if (this.pd !== undefined) this.pdRoutes(this.pd);
    installTokenizeRoutes(app, {
      tokenizer: this.options.target.tokenizer,
      prompts: this.prompts,
      modelName: this.options.modelName,
      vocabSize: this.options.target.model.info.vocabSize,
      maxModelLen: this.options.scheduler.max_sequence_tokens,
      sampling: this.options.sampling,
    });
    app.post('/v1/completions', async (req, reply) => {
      const n = checkRequestFields(req.body, 'completion', this.unknownFields);
      const many = choiceBodies(req.body, 'completion', n);
      if (many !== undefined) return serveChoices(this.choicesHost(), reply, 'completion', many, n);
      const p = parseCompletionRequest(req.body, this.options.sampling);
      this.checkModel(p);
      const prompt = await this.prompts.completion(p);
      return this.generate(reply, 'completion', p, prompt.ids, prompt.param);
    });
    app.post('/v1/chat/completions', async (req, reply) => {
      const n = checkRequestFields(req.body, 'chat', this.unknownFields);
      const many = choiceBodies(req.body, 'chat', n);
      if (many !== undefined) return serveChoices(this.choicesHost(), reply, 'chat', many, n);
      const p = parseChatRequest(req.body, this.options.sampling);
      this.checkModel(p);
      const prompt = await this.prompts.chat(p);
      return this.generate(reply, 'chat', p, prompt.ids, prompt.param);
    });
  }

  /** What a request of several choices (choices.ts) uses of this server. */
  private choicesHost(): ChoicesHost {
    return {
      loop: this.loop,
      tokenizer: this.options.target.tokenizer,
      modelName: this.options.modelName,
      metrics: this.metrics,
      closing: () => this.closing,
      failure: () => this.options.target.model.failure?.(),
      maxWaiting: this.options.scheduler.max_waiting_requests,
      maxTokensInFlight: this.options.scheduler.max_tokens_in_flight,
      prepare: async (endpoint, body) => {
        const p =
          endpoint === 'chat'
            ? parseChatRequest(body, this.options.sampling)
            : parseCompletionRequest(body, this.options.sampling);
        this.checkModel(p);
        const prompt = 'messages' in p ? await this.prompts.chat(p) : await this.prompts.completion(p);
        return { params: p, promptIds: prompt.ids, param: prompt.param };
      },
      loopRequest: ({ params, promptIds, param }) => {
        if (this.pd instanceof PrefillRole) throw prefillOnly();
        return this.loopRequest(this.withMaxTokens(params, promptIds.length, param), promptIds, false);
      },
    };
  }

  /** The `/pd/*` routes of a prefill or decode instance (the router's side of the protocol, pd/router.ts). */
  private pdRoutes(role: PrefillRole | DecodeRole): void {
    const app = this.app;
    // the client's body plus the prompt ids the router adds (at most 11 characters per id)
    const pdBodyLimit = this.options.bodyLimitBytes + 12 * this.options.scheduler.max_sequence_tokens + 4096;
    app.get('/pd/info', async () =>
      role instanceof PrefillRole
        ? { role: 'prefill', bootstrap: role.bootstrap, model: this.options.modelName }
        : { role: 'decode', model: this.options.modelName },
    );
    app.post('/pd/abort', async (req) => {
      const body = (req.body ?? {}) as { room?: unknown; reason?: unknown };
      const room = roomName(body.room);
      if (room === undefined) throw invalidParam('room', ROOM_EXPECTED);
      role.abort(room, typeof body.reason === 'string' ? body.reason : 'the router aborted');
      return { ok: true };
    });
    if (role instanceof PrefillRole) {
      // the prefill instance's pipeline stages and what their caches hold (one round trip per stage process)
      app.get('/pd/stages', async () => {
        const usage = role.stageUsage();
        return {
          stages: role.stages.map((s, stage) => {
            const held = usage[stage] ?? {
              pagesInUse: this.engine.cache.pagesInUse,
              slotsInUse: this.engine.cache.slotsInUse,
              transfersInFlight: role.inflight,
            };
            return {
              stage,
              layer_start: s.layerStart,
              layer_end: s.layerEnd,
              kv_pages_used: held.pagesInUse,
              state_slots_used: held.slotsInUse,
              transfers_inflight: held.transfersInFlight,
            };
          }),
        };
      });
      app.post('/pd/prefill', { bodyLimit: pdBodyLimit }, async (req) => {
        const pd = parsePdRequest(req.body, 'prefill');
        const param = pd.kind === 'chat' ? 'messages' : 'prompt';
        let p: ResolvedParams;
        let ids: Int32Array;
        let digest: string;
        try {
          ({ p, ids, digest } = this.pdPrompt(pd));
        } catch (err) {
          // the decode instance holds a reservation for this room: its layout gets an abort
          role.fail(pd.room, (err as Error).message);
          throw err;
        }
        try {
          // with the logprobs the request asks for: P sends the first token's (and an echo's prompt ones) to D
          const req = { ...this.loopRequest(p, ids, true), ...ChoiceOutput.request(pd.kind, p) };
          const out = await role.prefill(pd.room, pd.requestId, req, digest);
          this.recordPayload('prefill', out.payload, out.transferMs / 1000);
          const t = out.timings;
          this.recordPhases({
            prefill_queue: t.prefill_queue_ms,
            prefill_forward: t.prefill_forward_ms,
            bootstrap: t.bootstrap_ms,
          });
          if (t.descriptors > 0) this.metrics.pdDescriptors.observe(t.descriptors);
          // P's part of the TTFT waterfall, read by the router (pd/waterfall.ts)
          return { request_id: pd.requestId, prompt_tokens: out.promptTokens, waterfall: t };
        } catch (err) {
          throw this.pdError(err, param);
        }
      });
    } else {
      app.post('/pd/decode', { bodyLimit: pdBodyLimit }, async (req, reply) => {
        const pd = parsePdRequest(req.body, 'decode');
        const param = pd.kind === 'chat' ? 'messages' : 'prompt';
        const { p, ids, digest } = this.pdPrompt(pd);
        const bootstrap = pd.bootstrap ?? '';
        const t0 = performance.now();
        const open = async (listener: Parameters<EngineLoop['submit']>[1]): Promise<Opened> => {
          try {
            const a = await role.admit(
              pd.room,
              pd.requestId,
              bootstrap,
              { ...this.loopRequest(p, ids, false), ...ChoiceOutput.request(pd.kind, p) },
              listener,
              digest,
            );
            if (a.admission.kind === 'resume') {
              this.recordPayload('decode', a.admission.payload, (performance.now() - t0) / 1000);
              this.metrics.pdDraftContextForm.inc({ form: a.admission.draftForm });
            }
            const headers = (): Record<string, string> => {
              const t = a.timings();
              this.recordPhases({
                transfer_wait: t.transfer_wait_ms,
                decode_queue: t.decode_queue_ms,
                decode_first_step: t.decode_first_step_ms,
              });
              // D's part of the TTFT waterfall, read (and not passed on) by the router (pd/waterfall.ts)
              return { [DECODE_TIMINGS_HEADER]: JSON.stringify(t) };
            };
            return { loopId: a.admission.loopId, begin: a.begin, headers };
          } catch (err) {
            throw this.pdError(err, param);
          }
        };
        return this.generate(reply, pd.kind, p, ids, param, open);
      });
    }
  }

  /**
   * Parses the client's request a PD request carries, checks its prompt ids against the vocabulary and resolves its
   * max_tokens against the context length ({@link withMaxTokens}). The digest P and D compare is of the request as
   * sent (an absent max_tokens stays absent, whatever each side's context length).
   */
  private pdPrompt(pd: PdRequest): { p: ResolvedParams; ids: Int32Array; digest: string } {
    const p =
      pd.kind === 'chat'
        ? parseChatRequest(pd.body, this.options.sampling)
        : parseCompletionRequest(pd.body, this.options.sampling);
    this.checkModel(p);
    const V = this.options.target.model.info.vocabSize;
    const bad = pd.promptIds.find((t) => t >= V);
    if (bad !== undefined) throw invalidParam('prompt_ids', `token id ${bad} is outside the vocabulary (size ${V})`);
    const ids = Int32Array.from(pd.promptIds);
    const resolved = this.withMaxTokens(p, ids.length, pd.kind === 'chat' ? 'messages' : 'prompt');
    return { p: resolved, ids, digest: requestDigest(ids, p) };
  }

  /**
   * `p` with the max_tokens it runs with (limits.ts resolveMaxTokens: the request's, else the config's default capped
   * at the remaining context, else the remaining context).
   * @throws {ApiError} 400 `context_length_exceeded` when prompt + max_tokens exceeds max_sequence_tokens.
   */
  private withMaxTokens(p: GenerationParams, promptTokens: number, promptParam: string): ResolvedParams {
    const limit = this.options.scheduler.max_sequence_tokens;
    const configured = this.options.sampling.max_tokens;
    return { ...p, maxTokens: resolveMaxTokens(limit, promptTokens, p.maxTokens, configured, promptParam) };
  }

  /** The engine loop's request for parsed parameters. */
  private loopRequest(p: ResolvedParams, promptIds: Int32Array, handoff: boolean): LoopRequest {
    return {
      promptIds,
      maxTokens: p.maxTokens,
      sampling: samplingOf(p),
      seed: p.seed,
      seeded: p.seeded,
      stopStrings: p.stop,
      ignoreEos: p.ignoreEos,
      ...(p.stopTokenIds === undefined ? {} : { stopTokenIds: p.stopTokenIds }),
      handoff,
    };
  }

  /** Records a PD request's payload by class and its transfer wait. */
  private recordPayload(role: string, payload: Partial<Record<PdPayloadClass, number>>, waitS: number): void {
    for (const [kind, bytes] of Object.entries(payload)) this.metrics.pdPayloadBytes.observe({ kind }, bytes);
    this.metrics.pdTransferWait.observe({ role }, waitS);
  }

  /** Records a PD request's waterfall phases measured here (ms; pd/waterfall.ts). */
  private recordPhases(phases: Partial<Record<WaterfallPhase, number>>): void {
    for (const [phase, ms] of Object.entries(phases)) this.metrics.pdPhase.observe({ phase }, ms / 1000);
  }

  /** The client's answer to an error of a PD request (PdError → pdFailed; the loop's refusals as for /v1). */
  private pdError(err: unknown, promptParam: string): Error {
    if (err instanceof PdError) {
      this.metrics.pdTransferFailures.inc({ code: err.code });
      return pdFailed(err.code, err.message);
    }
    if (err instanceof OverloadedError) return overloaded(err.message);
    if (err instanceof EngineError) return invalidParam(promptParam, err.message);
    return err as Error;
  }

  private checkModel(p: GenerationParams): void {
    if (p.model !== this.options.modelName) throw unknownModel(p.model, this.options.modelName);
    const f = this.options.target.model.failure?.();
    if (f !== undefined) throw modelFailed(f);
    const outside = logitsProblem(p, this.options.target.model.info.vocabSize);
    if (outside !== undefined) throw invalidParam(outside.field, outside.message);
  }

  /**
   * Runs one request through the loop; streams or answers one JSON.
   * @param open how the request enters the loop (default: `EngineLoop.submit`; the decode role admits it once its
   *   state arrived); the response headers are sent only after it resolved, so its errors are ordinary HTTP errors.
   */
  private async generate(
    reply: FastifyReply,
    kind: 'completion' | 'chat',
    p: GenerationParams,
    promptIds: Int32Array,
    promptParam: string,
    open?: (listener: LoopListener) => Promise<Opened>,
  ): Promise<unknown> {
    if (this.pd instanceof PrefillRole) throw prefillOnly();
    const t0 = performance.now();
    const P = promptIds.length;
    if (P === 0) throw invalidParam(promptParam, 'the prompt encodes to no tokens');
    const resolved = this.withMaxTokens(p, P, promptParam);
    const out = new ChoiceOutput(kind, p, promptIds, this.options.target.tokenizer);
    const id = `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${randomUUID().replace(/-/g, '')}`;
    const created = Math.floor(Date.now() / 1000);
    const object = kind === 'chat' ? 'chat.completion' : 'text_completion';
    const chunkObject = kind === 'chat' ? 'chat.completion.chunk' : 'text_completion';
    const model = this.options.modelName;
    let ttft: number | undefined;
    let finished = false;
    let first = true;
    const raw = reply.raw;
    /** The extra headers of the opened request (the decode role's timings), read once. */
    let extraHeaders: (() => Record<string, string>) | undefined;
    /** Writes the stream's head if not yet written (before its first bytes). */
    const head = (): void => {
      if (!raw.headersSent) raw.writeHead(200, { ...SSE_HEADERS, ...(extraHeaders?.() ?? {}) });
    };
    const chunk = (text: string | undefined, finishReason: string | null, logprobs: unknown = null): string => {
      const choice =
        kind === 'chat'
          ? {
              index: 0,
              delta: text === undefined ? {} : first ? { role: 'assistant', content: text } : { content: text },
              logprobs,
              finish_reason: finishReason,
            }
          : { index: 0, text: text ?? '', logprobs, finish_reason: finishReason };
      first = false;
      const body = { id, object: chunkObject, created, model, choices: [choice] };
      return `data: ${JSON.stringify(body)}\n\n`;
    };
    const usage = (n: number): { prompt_tokens: number; completion_tokens: number; total_tokens: number } => ({
      prompt_tokens: P,
      completion_tokens: n,
      total_tokens: P + n,
    });
    const record = (r: SpecResult): void => {
      this.metrics.recordRequest(kind, r.finishReason, {
        promptTokens: P,
        outputTokens: r.tokenIds.length,
        e2e: (performance.now() - t0) / 1000,
        spec: r.metrics,
        ...(ttft === undefined ? {} : { ttft }),
      });
    };
    const engineParams: LoopRequest = {
      ...this.loopRequest(resolved, promptIds, false),
      ...ChoiceOutput.request(kind, p),
    };
    const onPromptLogprobs = (prompt: readonly (TokenLogprob | null)[]): void => out.promptLogprobs(prompt);
    const submit = async (listener: LoopListener): Promise<Opened> => {
      if (open !== undefined) return open(listener);
      try {
        return { loopId: this.loop.submit(engineParams, listener), begin: () => undefined };
      } catch (err) {
        if (err instanceof OverloadedError) throw overloaded(err.message);
        if (err instanceof EngineError) throw invalidParam(promptParam, err.message);
        throw err;
      }
    };
    const onToken = (): void => {
      ttft ??= (performance.now() - t0) / 1000;
    };

    if (p.stream) {
      const opened = await submit({
        onPromptLogprobs,
        onToken: (t, lp) => {
          onToken();
          head();
          // the echoed prompt (and its logprobs) is the stream's first chunk
          const echoed = out.takeEcho();
          if (echoed !== undefined) raw.write(chunk(echoed, null, out.takeLogprobs()));
          const text = out.token(t, lp);
          if (text !== '' || (first && kind === 'chat')) raw.write(chunk(text, null, out.takeLogprobs()));
        },
        onFinish: (r) => {
          finished = true;
          record(r);
          head();
          const tail = out.finish();
          if (tail !== '') raw.write(chunk(tail, null, out.takeLogprobs()));
          raw.write(chunk(kind === 'chat' ? undefined : '', apiFinishReason(r.finishReason), out.takeLogprobs()));
          if (p.includeUsage) {
            const body = { id, object: chunkObject, created, model, choices: [], usage: usage(r.tokenIds.length) };
            raw.write(`data: ${JSON.stringify(body)}\n\n`);
          }
          raw.end('data: [DONE]\n\n');
        },
        onError: (err) => {
          finished = true;
          if (err instanceof SequenceError) this.options.logger?.error(err);
          // a model that can no longer run fails its requests one by one too: model_failed says so
          const e = this.closing
            ? shuttingDown()
            : this.options.target.model.failure?.() !== undefined
              ? modelFailed(err)
              : err instanceof SequenceError
                ? sequenceFailed(err)
                : new ApiError(500, err.message, 'server_error', null, 'internal_error');
          this.metrics.errors.inc({ status: String(e.status) });
          head();
          // shutting down: the error event ends the stream, then the connection closes
          if (this.closing) raw.once('finish', () => raw.socket?.end());
          raw.end(`data: ${JSON.stringify(e.toJSON())}\n\ndata: [DONE]\n\n`);
        },
      });
      const loopId = opened.loopId;
      if (raw.destroyed) {
        // the client left while the request was being admitted
        finished = true;
        if (loopId !== undefined) this.loop.abort(loopId);
        return reply;
      }
      reply.hijack();
      extraHeaders = opened.headers;
      // without extra headers the head is written now; with them, at the first token (the same bytes on the wire)
      if (extraHeaders === undefined) head();
      raw.on('close', () => {
        if (!finished) {
          finished = true;
          if (loopId !== undefined) this.loop.abort(loopId);
          this.metrics.requests.inc({ endpoint: kind, finish_reason: 'abort' });
        }
      });
      opened.begin();
      return reply;
    }

    return new Promise((resolve, reject) => {
      const listener: LoopListener = {
        onPromptLogprobs,
        onToken: (t, lp) => {
          onToken();
          out.token(t, lp);
        },
        onFinish: (r) => {
          finished = true;
          record(r);
          out.finish();
          const text = out.fullText;
          const logprobs = out.allLogprobs();
          const reason = apiFinishReason(r.finishReason);
          const ids = p.returnTokenIds ? { token_ids: r.tokenIds } : {};
          const choice =
            kind === 'chat'
              ? {
                  index: 0,
                  message: { role: 'assistant', content: text },
                  logprobs,
                  finish_reason: reason,
                  ...ids,
                }
              : { index: 0, text, logprobs, finish_reason: reason, ...ids };
          for (const [k, v] of Object.entries(extraHeaders?.() ?? {})) reply.header(k, v);
          resolve({ id, object, created, model, choices: [choice], usage: usage(r.tokenIds.length) });
        },
        onError: (err) => {
          finished = true;
          if (this.options.target.model.failure?.() !== undefined) reject(modelFailed(err));
          else if (err instanceof SequenceError) {
            this.options.logger?.error(err);
            reject(sequenceFailed(err)); // (the error handler counts it)
          } else reject(err);
        },
      };
      submit(listener).then((opened) => {
        const loopId = opened.loopId;
        raw.on('close', () => {
          if (!finished) {
            finished = true;
            if (loopId !== undefined) this.loop.abort(loopId);
            this.metrics.requests.inc({ endpoint: kind, finish_reason: 'abort' });
            resolve(undefined);
          }
        });
        if (raw.destroyed && !finished) {
          finished = true;
          if (loopId !== undefined) this.loop.abort(loopId);
          resolve(undefined);
          return;
        }
        extraHeaders = opened.headers;
        opened.begin();
      }, reject);
    });
  }
}
