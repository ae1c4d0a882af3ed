/**
 * Requests of several choices: `n` > 1 (completions and chat) and a list of prompts (completions). Each (prompt i,
 * sample j) is its own sequence in the engine loop, batched with everything else; its choice index is i × n + j
 * (OpenAI's order). Choice j of a prompt samples with seed (seed + j) mod 2^32, where seed is the request's `seed`
 * (or the config's default, or a random one): with a seed, choice 0 is what the same request with n = 1 returns,
 * and greedy choices are all the same text. Streamed chunks carry their choice's `index`; the chunk that ends a
 * choice carries its finish_reason; the usage chunk (`stream_options.include_usage`) and `[DONE]` follow the last
 * choice. usage: prompt_tokens counts each prompt once, completion_tokens sums over the choices. Metrics record
 * one request per choice (the prompt's tokens with its first choice).
 * A choice that fails fails the whole request (the others are aborted, their caches freed): a 5xx as for one
 * choice, or, streaming, one error event and `[DONE]`. A client that disconnects aborts every choice.
 * Admission is per choice (EngineLoop.submit): a request whose choices do not all fit now is refused (503
 * `overloaded`) and the choices already queued are aborted; one that could never fit (more choices than
 * `max_waiting_requests`, or Σ (prompt + max_tokens) over its choices above `max_tokens_in_flight`) is a 400 naming
 * `n` (or `prompt` for a list of prompts with n = 1). Each choice's text, echo and logprobs are those of a request of
 * one choice (choice-output.ts): `logprobs` / `top_logprobs` per choice, completions' `echo` per prompt.
 */

import { randomUUID } from 'node:crypto';

import type { FastifyReply } from 'fastify';

import { EngineError, SequenceError, type SpecResult } from '../engine/types.js';
import type { Tokenizer } from '../io/tokenizer.js';
import { type EngineLoop, type LoopListener, type LoopRequest, OverloadedError } from './engine-loop.js';
import { ChoiceOutput } from './choice-output.js';
import { ApiError, invalidParam, modelFailed, overloaded, sequenceFailed, shuttingDown } from './errors.js';
import { apiFinishReason, type ServerMetrics } from './metrics.js';
import type { GenerationParams } from './protocol.js';
import { completionPrompts, type RequestEndpoint } from './request-fields.js';

/** A parsed request of one prompt: its parameters and prompt token ids. */
export interface PreparedPrompt {
  readonly params: GenerationParams;
  /** `[numPromptTokens]` i32. */
  readonly promptIds: Int32Array;
  /** The field prompt errors name (`prompt` or `messages`). */
  readonly param: string;
}

/** What the server lends a request of several choices. */
export interface ChoicesHost {
  readonly loop: EngineLoop;
  readonly tokenizer: Tokenizer;
  readonly modelName: string;
  readonly metrics: ServerMetrics;
  /** The server is shutting down (errors become 503 `server_shutting_down`). */
  closing(): boolean;
  /** Why the model can no longer run, if it cannot. */
  failure(): Error | undefined;
  /** Parses a one-prompt body of `endpoint` (protocol.ts), checks its model and builds its prompt ids. */
  prepare(endpoint: RequestEndpoint, body: unknown): Promise<PreparedPrompt>;
  /** The loop request of a prepared prompt, max_tokens resolved. @throws {ApiError} 400 context_length_exceeded. */
  loopRequest(prepared: PreparedPrompt): LoopRequest;
  /** `scheduler.max_waiting_requests`: more choices than this can never be queued at once. */
  readonly maxWaiting: number;
  /** `scheduler.max_tokens_in_flight`: choices whose Σ (prompt + max_tokens) exceeds it can never run at once. */
  readonly maxTokensInFlight: number;
}

/** Response headers of a server-sent-events stream (no proxy buffering). */
export const SSE_HEADERS = {
  'content-type': 'text/event-stream; charset=utf-8',
  'cache-control': 'no-cache',
  connection: 'keep-alive',
  'x-accel-buffering': 'no',
} as const;

/**
 * The one-prompt bodies of a request whose choices are more than one (`n` > 1, or a completion's list of prompts),
 * `n` and `best_of` removed (checked by request-fields.ts); undefined for a request of one choice (the server's
 * ordinary path).
 */
export function choiceBodies(body: unknown, endpoint: RequestEndpoint, n: number): readonly unknown[] | undefined {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return undefined;
  const b = body as Record<string, unknown>;
  const prompts = endpoint === 'completion' ? completionPrompts(b) : [undefined];
  if (n === 1 && prompts.length === 1) return undefined;
  const { n: _n, best_of: _bestOf, ...rest } = b;
  return endpoint === 'completion' ? prompts.map((prompt) => ({ ...rest, prompt })) : [rest];
}

/** One choice's running state. */
interface Choice {
  readonly index: number;
  readonly prompt: PreparedPrompt;
  readonly request: LoopRequest;
  readonly out: ChoiceOutput;
  loopId: number | undefined;
  result: SpecResult | undefined;
  first: boolean;
  ttft: number | undefined;
}

/**
 * Runs the choices of `bodies` × `n` ({@link choiceBodies}) and answers one JSON or an SSE stream.
 * @throws {ApiError} as the one-choice path: 400 for a bad field or prompt, 503 overloaded, 5xx when a choice fails.
 */
export async function serveChoices(
  host: ChoicesHost,
  reply: FastifyReply,
  endpoint: RequestEndpoint,
  bodies: readonly unknown[],
  n: number,
): Promise<unknown> {
  const t0 = performance.now();
  const param = n > 1 ? 'n' : 'prompt';
  const count = bodies.length * n;
  if (count > host.maxWaiting)
    // before any prompt is encoded
    throw invalidParam(
      param,
      `${count} choices (prompts × n) exceed scheduler.max_waiting_requests (${host.maxWaiting})`,
    );
  const prompts: PreparedPrompt[] = [];
  for (const body of bodies) prompts.push(await host.prepare(endpoint, body));
  const choices: Choice[] = [];
  for (const prompt of prompts) {
    const base = { ...host.loopRequest(prompt), ...ChoiceOutput.request(endpoint, prompt.params) };
    for (let j = 0; j < n; j++) {
      choices.push({
        index: choices.length,
        prompt,
        request: { ...base, seed: (base.seed + j) >>> 0 },
        out: new ChoiceOutput(endpoint, prompt.params, prompt.promptIds, host.tokenizer),
        loopId: undefined,
        result: undefined,
        first: true,
        ttft: undefined,
      });
    }
  }
  const tokens = choices.reduce((t, c) => t + c.request.promptIds.length + c.request.maxTokens, 0);
  if (tokens > host.maxTokensInFlight)
    throw invalidParam(
      param,
      `the choices' prompt + max_tokens add up to ${tokens} tokens, above scheduler.max_tokens_in_flight ` +
        `(${host.maxTokensInFlight})`,
    );
  const p0 = (prompts[0] as PreparedPrompt).params;
  const chat = endpoint === 'chat';
  const id = `${chat ? 'chatcmpl' : 'cmpl'}-${randomUUID().replace(/-/g, '')}`;
  const created = Math.floor(Date.now() / 1000);
  const model = host.modelName;
  const raw = reply.raw;
  let done = 0;
  let ended = false;
  const usage = () => {
    const promptTokens = prompts.reduce((s, p) => s + p.promptIds.length, 0);
    const completion = choices.reduce((s, c) => s + (c.result?.tokenIds.length ?? 0), 0);
    return { prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion };
  };
  const record = (c: Choice, r: SpecResult): void => {
    host.metrics.recordRequest(endpoint, r.finishReason, {
      promptTokens: c.index % n === 0 ? c.prompt.promptIds.length : 0,
      outputTokens: r.tokenIds.length,
      e2e: (performance.now() - t0) / 1000,
      spec: r.metrics,
      ...(c.ttft === undefined ? {} : { ttft: c.ttft }),
    });
  };
  const abortAll = (): void => {
    for (const c of choices)
      if (c.result === undefined && c.loopId !== undefined) {
        host.loop.abort(c.loopId);
        c.loopId = undefined;
      }
  };
  const apiError = (err: Error): ApiError => {
    if (err instanceof ApiError) return err;
    if (host.closing()) return shuttingDown();
    if (host.failure() !== undefined) return modelFailed(err);
    if (err instanceof SequenceError) {
      reply.log.error(err); // the request's logger: its line carries the reqId (X-Request-Id)
      return sequenceFailed(err);
    }
    return new ApiError(500, err.message, 'server_error', null, 'internal_error');
  };
  const chunk = (c: Choice, text: string | undefined, finishReason: string | null): string => {
    const logprobs = c.out.takeLogprobs();
    const choice = chat
      ? {
          index: c.index,
          delta: text === undefined ? {} : c.first ? { role: 'assistant', content: text } : { content: text },
          logprobs,
          finish_reason: finishReason,
        }
      : { index: c.index, text: text ?? '', logprobs, finish_reason: finishReason };
    c.first = false;
    const object = chat ? 'chat.completion.chunk' : 'text_completion';
    return `data: ${JSON.stringify({ id, object, created, model, choices: [choice] })}\n\n`;
  };

  // submits every choice, or none: a refusal aborts those already queued
  const submitAll = (listenerOf: (c: Choice) => LoopListener): void => {
    for (const c of choices) {
      try {
        c.loopId = host.loop.submit(c.request, listenerOf(c));
      } catch (err) {
        abortAll();
        if (err instanceof OverloadedError) throw overloaded(err.message);
        if (err instanceof EngineError) throw invalidParam(c.prompt.param, err.message);
        throw err;
      }
    }
  };

  if (p0.stream) {
    const fail = (err: Error): void => {
      if (ended) return;
      ended = true;
      abortAll();
      const e = apiError(err);
      host.metrics.errors.inc({ status: String(e.status) });
      if (host.closing()) raw.once('finish', () => raw.socket?.end());
      raw.end(`data: ${JSON.stringify(e.toJSON())}\n\ndata: [DONE]\n\n`);
    };
    submitAll((c) => ({
      onPromptLogprobs: (prompt) => c.out.promptLogprobs(prompt),
      onToken: (t, lp) => {
        c.ttft ??= (performance.now() - t0) / 1000;
        // the echoed prompt (and its logprobs) is the choice's first chunk
        const echoed = c.out.takeEcho();
        if (!ended && echoed !== undefined) raw.write(chunk(c, echoed, null));
        const text = c.out.token(t, lp);
        if (!ended && (text !== '' || (c.first && chat))) raw.write(chunk(c, text, null));
      },
      onFinish: (r) => {
        c.result = r;
        record(c, r);
        if (ended) return;
        const tail = c.out.finish();
        if (tail !== '') raw.write(chunk(c, tail, null));
        raw.write(chunk(c, chat ? undefined : '', apiFinishReason(r.finishReason)));
        if (++done < choices.length) return;
        ended = true;
        if (p0.includeUsage) {
          const object = chat ? 'chat.completion.chunk' : 'text_completion';
          raw.write(`data: ${JSON.stringify({ id, object, created, model, choices: [], usage: usage() })}\n\n`);
        }
        raw.end('data: [DONE]\n\n');
      },
      onError: (err) => {
        c.loopId = undefined; // the loop released it
        fail(err);
      },
    }));
    if (raw.destroyed) {
      ended = true;
      abortAll();
      return reply;
    }
    reply.hijack();
    raw.writeHead(200, SSE_HEADERS);
    raw.on('close', () => {
      if (ended) return;
      ended = true;
      abortAll();
      host.metrics.requests.inc({ endpoint, finish_reason: 'abort' });
    });
    return reply;
  }

  return new Promise((resolve, reject) => {
    submitAll((c) => ({
      onPromptLogprobs: (prompt) => c.out.promptLogprobs(prompt),
      onToken: (t, lp) => {
        c.ttft ??= (performance.now() - t0) / 1000;
        c.out.token(t, lp);
      },
      onFinish: (r) => {
        c.result = r;
        record(c, r);
        if (ended || ++done < choices.length) return;
        ended = true;
        const out = choices.map((x) => {
          x.out.finish();
          const res = x.result as SpecResult;
          const reason = apiFinishReason(res.finishReason);
          const ids = x.prompt.params.returnTokenIds ? { token_ids: res.tokenIds } : {};
          const text = x.out.fullText;
          const logprobs = x.out.allLogprobs();
          return chat
            ? {
                index: x.index,
                message: { role: 'assistant', content: text },
                logprobs,
                finish_reason: reason,
                ...ids,
              }
            : { index: x.index, text, logprobs, finish_reason: reason, ...ids };
        });
        const object = chat ? 'chat.completion' : 'text_completion';
        resolve({ id, object, created, model, choices: out, usage: usage() });
      },
      onError: (err) => {
        c.loopId = undefined; // the loop released it
        if (ended) return;
        ended = true;
        abortAll();
        reject(apiError(err)); // (the error handler counts it)
      },
    }));
    raw.on('close', () => {
      if (ended) return;
      ended = true;
      abortAll();
      host.metrics.requests.inc({ endpoint, finish_reason: 'abort' });
      resolve(undefined);
    });
    if (raw.destroyed && !ended) {
      ended = true;
      abortAll();
      resolve(undefined);
    }
  });
}
