/**
 * The OpenAI-compatible HTTP server (fastify): `POST /v1/completions`, `POST /v1/chat/completions`
 * (streaming as SSE `data: {…}\n\n` … `data: [DONE]\n\n`, or one JSON), `GET /v1/models`,
 * `GET /health`, `GET /metrics` (Prometheus). Every request goes through one {@link EngineLoop}
 * (continuous batching). Errors are OpenAI's `{"error": {message, type, param, code}}`: 400 bad
 * parameter, malformed JSON or messages the chat template rejects, 401 bad API key, 404 unknown model or route,
 * 413 too long (body or prompt + max_tokens), 503 overloaded, 500 when the model fails (a dead pipeline stage:
 * in-flight and later requests fail naming the stage; `/health` then answers 503). A client that disconnects has its
 * request aborted: its KV pages, state slot and draft context are freed before the next engine step.
 */

import { randomUUID, timingSafeEqual } from 'node:crypto';
import type { AddressInfo } from 'node:net';

import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply } from 'fastify';
import type { Logger } from 'pino';

import type { SpecEngine } from '../engine/engine.js';
import { EngineError, type SpecResult } from '../engine/types.js';
import type { Drafter } from '../plugin/drafter-plugin.js';
import type { StageModel } from '../plugin/model-plugin.js';
import type { Tokenizer } from '../io/tokenizer.js';
import { EngineLoop, OverloadedError } from './engine-loop.js';
import { ApiError, badApiKey, invalidParam, modelFailed, overloaded, tooLong, unknownModel } from './errors.js';
import { ServerMetrics } from './metrics.js';
import { PromptBuilder } from './prompt.js';
import { parseChatRequest, parseCompletionRequest, type GenerationParams, type SamplingDefaults } from './protocol.js';
import { StopTextBuffer } from './stop-text.js';

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
  readonly apiKey?: string;
  readonly bodyLimitBytes: number;
  /** Drafts per step at most (default: the drafter's maximum). */
  readonly numDraftTokens?: number;
  /** A pino logger (default: none). */
  readonly logger?: Logger;
}

/** Maps the engine's finish reasons to OpenAI's. */
const FINISH: Record<string, string> = { eos: 'stop', stop: 'stop', length: 'length', abort: 'abort' };

const send = (reply: FastifyReply, e: ApiError): FastifyReply =>
  reply.code(e.status).type('application/json').send(e.toJSON());

/** A running server. */
export class SpecdServer {
  readonly app: FastifyInstance;
  readonly engine: SpecEngine;
  readonly loop: EngineLoop;
  readonly metrics: ServerMetrics;
  private readonly prompts: PromptBuilder;
  private readonly created = Math.floor(Date.now() / 1000);

  constructor(readonly options: SpecdServerOptions) {
    const { target, drafter, scheduler, numDraftTokens } = options;
    const tok = target.tokenizer;
    this.loop = new EngineLoop(
      target.model,
      drafter,
      {
        maxSequences: scheduler.max_running_requests,
        maxTokensPerSequence: scheduler.max_sequence_tokens,
        pageSize: scheduler.page_size,
        prefillChunk: scheduler.prefill_chunk_tokens,
        decode: (ids) => tok.decode(ids, { skipSpecialTokens: true }),
        ...(numDraftTokens === undefined ? {} : { draftLength: () => numDraftTokens }),
      },
      {
        maxWaiting: scheduler.max_waiting_requests,
        maxTokensInFlight: scheduler.max_tokens_in_flight,
        eosTokenIds: target.eosTokenIds,
      },
    );
    this.engine = this.loop.engine;
    this.metrics = new ServerMetrics({
      running: () => this.loop.running,
      waiting: () => this.loop.waiting,
      targetPagesInUse: () => this.engine.cache.pagesInUse,
      draftPagesInUse: () => drafter?.pagesInUse ?? 0,
    });
    this.prompts = new PromptBuilder(tok, target.model.info.vocabSize);
    this.app = Fastify({
      bodyLimit: options.bodyLimitBytes,
      ...(options.logger === undefined
        ? { logger: false }
        : { loggerInstance: options.logger as unknown as FastifyBaseLogger }),
      return503OnClosing: true,
    });
    this.routes();
  }

  /**
   * Calibrates the engine's cost-based draft policy if it needs it (a drafter and the `'cost'` policy:
   * `SpecEngine.calibrate()`, seconds on the tiny model; logged), so that no request waits for it, then
   * listens on host:port (port 0: ephemeral). Nothing answers, `/health` included, until both are done.
   * @returns the base URL, e.g. `http://127.0.0.1:8000`.
   */
  async listen(host: string, port: number): Promise<string> {
    const before = this.engine.metrics.calibrationMs;
    if (this.engine.calibrate() !== undefined) {
      this.options.logger?.info(
        { calibrationMs: Math.round(this.engine.metrics.calibrationMs - before) },
        'draft policy: step costs calibrated',
      );
    }
    await this.app.listen({ host, port });
    const a = this.app.server.address() as AddressInfo;
    return `http://${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`;
  }

  /** Stops listening and aborts every request (target and drafter stay loaded; the caller disposes them). */
  async close(): Promise<void> {
    this.loop.close();
    await this.app.close();
  }

  private routes(): void {
    const app = this.app;
    const key = this.options.apiKey === undefined ? undefined : Buffer.from(`Bearer ${this.options.apiKey}`);
    const open = new Set(['/health', '/metrics']); // everything else needs the key when one is set
    app.addHook('onRequest', async (req, reply) => {
      if (key === undefined || open.has(req.url.split('?')[0]!)) return;
      const got = Buffer.from(req.headers.authorization ?? '');
      if (got.length !== key.length || !timingSafeEqual(got, key)) {
        this.metrics.errors.inc({ status: '401' });
        return send(reply, badApiKey());
      }
    });
    app.setErrorHandler((err: Error & { statusCode?: number; code?: string }, _req, reply) => {
      let e: ApiError;
      if (err instanceof ApiError) e = err;
      else if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE')
        e = new ApiError(
          413,
          `request body larger than body_limit_bytes (${this.options.bodyLimitBytes})`,
          'invalid_request_error',
          null,
          'body_too_large',
        );
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
      else {
        this.options.logger?.error(err);
        e = new ApiError(500, `internal error: ${err.message}`, 'server_error', null, 'internal_error');
      }
      this.metrics.errors.inc({ status: String(e.status) });
      return send(reply, e);
    });
    app.setNotFoundHandler((req, reply) => {
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
    app.post('/v1/completions', async (req, reply) => {
      const p = parseCompletionRequest(req.body, this.options.sampling);
      this.checkModel(p);
      const prompt = this.prompts.completion(p);
      return this.generate(reply, 'completion', p, prompt.ids, prompt.param);
    });
    app.post('/v1/chat/completions', async (req, reply) => {
      const p = parseChatRequest(req.body, this.options.sampling);
      this.checkModel(p);
      const prompt = this.prompts.chat(p);
      return this.generate(reply, 'chat', p, prompt.ids, prompt.param);
    });
  }

  private checkModel(p: GenerationParams): void {
    if (p.model !== this.options.modelName) throw unknownModel(p.model, this.options.modelName);
    const f = this.options.target.model.failure?.();
    if (f !== undefined) throw modelFailed(f);
  }

  /** Runs one request through the loop; streams or answers one JSON. */
  private generate(
    reply: FastifyReply,
    kind: 'completion' | 'chat',
    p: GenerationParams,
    promptIds: Int32Array,
    promptParam: string,
  ): Promise<unknown> | FastifyReply {
    const t0 = performance.now();
    const P = promptIds.length; // >= 1 (PromptBuilder)
    const limit = this.options.scheduler.max_sequence_tokens;
    const need = P + p.maxTokens + (this.options.drafter?.maxDraftTokens ?? 0) + 1;
    if (need > limit) {
      const draft =
        this.options.drafter === undefined ? '' : ` + a draft block (${this.options.drafter.maxDraftTokens + 1})`;
      throw tooLong(
        `prompt (${P} tokens) + max_tokens (${p.maxTokens})${draft} = ${need} tokens ` +
          `exceeds max_sequence_tokens ${limit}`,
        promptParam,
      );
    }
    const tok = this.options.target.tokenizer;
    const detok = tok.createDetokenizer({ skipSpecialTokens: true, promptIds });
    const stops = new StopTextBuffer(p.stop);
    const id = `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${randomUUID().replace(/-/g, '')}`;
    const created = Math.floor(Date.now() / 1000);
    const object = kind === 'chat' ? 'chat.completion' : 'text_completion';
    const chunkObject = kind === 'chat' ? 'chat.completion.chunk' : 'text_completion';
    const model = this.options.modelName;
    let ttft: number | undefined;
    let finished = false;
    let first = true;
    const raw = reply.raw;
    const chunk = (text: string | undefined, finishReason: string | null): string => {
      const choice =
        kind === 'chat'
          ? {
              index: 0,
              delta: text === undefined ? {} : first ? { role: 'assistant', content: text } : { content: text },
              logprobs: null,
              finish_reason: finishReason,
            }
          : { index: 0, text: text ?? '', logprobs: null, finish_reason: finishReason };
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
    const engineParams = {
      promptIds,
      maxTokens: p.maxTokens,
      sampling: { temperature: p.temperature, topK: p.topK, topP: p.topP },
      seed: p.seed,
      seeded: p.seeded,
      stopStrings: p.stop,
      ignoreEos: p.ignoreEos,
    };
    const submit = (listener: Parameters<EngineLoop['submit']>[1]): number => {
      try {
        return this.loop.submit(engineParams, listener);
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
      const loopId = submit({
        onToken: (t) => {
          onToken();
          const text = stops.push(detok.push(t));
          if (text !== '' || (first && kind === 'chat')) raw.write(chunk(text, null));
        },
        onFinish: (r) => {
          finished = true;
          record(r);
          const tail = stops.push(detok.flush()) + stops.finish();
          if (tail !== '') raw.write(chunk(tail, null));
          raw.write(chunk(kind === 'chat' ? undefined : '', FINISH[r.finishReason] ?? 'stop'));
          if (p.includeUsage) {
            const body = { id, object: chunkObject, created, model, choices: [], usage: usage(r.tokenIds.length) };
            raw.write(`data: ${JSON.stringify(body)}\n\n`);
          }
          raw.end('data: [DONE]\n\n');
        },
        onError: (err) => {
          finished = true;
          this.metrics.errors.inc({ status: '500' });
          const e =
            this.options.target.model.failure?.() !== undefined
              ? modelFailed(err)
              : new ApiError(500, err.message, 'server_error', null, 'internal_error');
          raw.end(`data: ${JSON.stringify(e.toJSON())}\n\ndata: [DONE]\n\n`);
        },
      });
      reply.hijack();
      raw.writeHead(200, {
        'content-type': 'text/event-stream; charset=utf-8',
        'cache-control': 'no-cache',
        connection: 'keep-alive',
        'x-accel-buffering': 'no',
      });
      raw.on('close', () => {
        if (!finished) {
          finished = true;
          this.loop.abort(loopId);
          this.metrics.requests.inc({ endpoint: kind, finish_reason: 'abort' });
        }
      });
      return reply;
    }

    return new Promise((resolve, reject) => {
      const loopId = submit({
        onToken: (t) => {
          onToken();
          stops.push(detok.push(t));
        },
        onFinish: (r) => {
          finished = true;
          record(r);
          stops.push(detok.flush());
          const text = stops.fullText;
          const reason = FINISH[r.finishReason] ?? 'stop';
          const choice =
            kind === 'chat'
              ? { index: 0, message: { role: 'assistant', content: text }, logprobs: null, finish_reason: reason }
              : { index: 0, text, logprobs: null, finish_reason: reason };
          resolve({ id, object, created, model, choices: [choice], usage: usage(r.tokenIds.length) });
        },
        onError: (err) => {
          finished = true;
          reject(this.options.target.model.failure?.() !== undefined ? modelFailed(err) : err);
        },
      });
      raw.on('close', () => {
        if (!finished) {
          finished = true;
          this.loop.abort(loopId);
          this.metrics.requests.inc({ endpoint: kind, finish_reason: 'abort' });
          resolve(undefined);
        }
      });
    });
  }
}
