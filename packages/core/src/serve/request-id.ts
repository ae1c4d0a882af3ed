/**
 * `X-Request-Id`, as vLLM: every response carries the request's id in its `x-request-id` header — the client's
 * header when it sent one, else the id the server generated (a UUID, the fastify option `genReqId`). The server's
 * fastify is built with `requestIdHeader: 'x-request-id'`, so the same id is the `reqId` of the request's log lines
 * ("incoming request", "request completed", errors logged through `req.log`).
 */

import type { FastifyInstance } from 'fastify';

/**
 * Echoes each request's id in its response's `x-request-id` header. Set on the raw response at `onRequest`, so
 * streamed (hijacked) responses and early refusals (403, 413, 503 while closing) carry it too.
 */
export function installRequestId(app: FastifyInstance): void {
  app.addHook('onRequest', async (req, reply) => {
    reply.raw.setHeader('x-request-id', req.id);
  });
}
