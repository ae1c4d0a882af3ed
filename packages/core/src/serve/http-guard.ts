/**
 * What every HTTP front of specd (the OpenAI server, server.ts; the prefill/decode router, pd/router.ts) checks
 * before any work:
 *
 * - JSON bodies nested deeper than {@link MAX_JSON_DEPTH} levels: 400 `json_too_deep`, found by one linear scan
 *   before parsing ({@link jsonNestingExceeds}; parsing and validating are recursive and would overflow the stack
 *   at a few thousand levels).
 * - A body over the limit: 413 `body_too_large` written at once with `Connection: close`, then the rest of the upload
 *   is read and dropped before the connection closes ({@link answerThenDrain}: closing a socket the client is still
 *   writing to makes its kernel reset the connection, and the client would lose the 413; nginx calls this a
 *   lingering close).
 * - Access ({@link installAccessHook}): with an API key, `Authorization: Bearer KEY` on every route but `/health`
 *   (and `/metrics` unless it is put behind the key); without one, the Host header must name the bound address,
 *   `localhost`, `127.0.0.1` or `[::1]` (any port) or an `--allowed-hosts` entry, against DNS rebinding (a web page
 *   whose host name is re-pointed at 127.0.0.1 reaches the server from the user's browser with its own name as
 *   Host). Allowed hosts given with a key are enforced too.
 * - Binding ({@link checkBind}): beyond loopback without a key, a warning; a wildcard address (0.0.0.0, ::) without a
 *   key needs allowed hosts (no Host could be checked against the bound address).
 */

import { timingSafeEqual } from 'node:crypto';

import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';

import { type ApiError, badApiKey, forbiddenHost, jsonTooDeep } from './errors.js';

/** The deepest JSON nesting a request body may have (objects and arrays; a chat request needs 4). */
export const MAX_JSON_DEPTH = 64;

/** How long an oversized upload is read and dropped after its 413 before the connection is cut, ms. */
export const DRAIN_MS = 10_000;

/** The environment variable the CLI reads the API key from (a `--api-key` argument is visible in `ps`). */
export const API_KEY_ENV = 'SPECD_API_KEY';

/** Thrown at start-up for a bind address the access settings cannot protect. */
export class BindError extends Error {
  override readonly name = 'BindError';
}

/** Who may use a server. */
export interface AccessPolicy {
  /** Clients send `Authorization: Bearer <apiKey>`; absent: no key, the Host check applies. */
  readonly apiKey?: string;
  /**
   * Host names (no port) accepted besides the bound address and loopback names; `*` accepts any Host. With an API
   * key they are enforced too when given.
   */
  readonly allowedHosts?: readonly string[];
  /** `/metrics` needs the key too (default: open, like `/health`). */
  readonly metricsNeedKey?: boolean;
}

/**
 * True when `text` nests objects / arrays deeper than `maxDepth` (brackets inside strings do not count). One pass,
 * no allocation; the text need not be valid JSON.
 */
export function jsonNestingExceeds(text: string, maxDepth: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c)
        i++; // backslash: skip the escaped character
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x7b || c === 0x5b) {
      if (++depth > maxDepth) return true;
    } else if (c === 0x7d || c === 0x5d) depth--;
  }
  return false;
}

/**
 * Replaces the app's `application/json` parser by fastify's own (prototype poisoning refused) behind a nesting check
 * ({@link jsonNestingExceeds}): a body nested deeper than `maxDepth` fails with 400 `json_too_deep`.
 */
export function installJsonParser(app: FastifyInstance, maxDepth = MAX_JSON_DEPTH): void {
  const parse = app.getDefaultJsonParser('error', 'error');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (req, body, done) => {
    const text = body as string;
    if (jsonNestingExceeds(text, maxDepth)) return done(jsonTooDeep(maxDepth), undefined);
    parse(req, text, done);
  });
}

/**
 * Answers `e` with `Connection: close` at once, then reads and drops what the client still uploads, and closes the
 * connection once the upload ended (or after `drainMs`, or when the client closes it). For a body refused before it
 * was read (413): the client receives the answer instead of a reset connection.
 */
export function answerThenDrain(req: FastifyRequest, reply: FastifyReply, e: ApiError, drainMs = DRAIN_MS): void {
  const body = JSON.stringify(e.toJSON());
  reply.hijack();
  const res = reply.raw;
  const incoming = req.raw;
  res.writeHead(e.status, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    connection: 'close',
  });
  res.write(body);
  const timer = setTimeout(() => {
    res.end();
    incoming.socket?.destroy();
  }, drainMs);
  timer.unref();
  const finish = (): void => {
    clearTimeout(timer);
    if (!res.writableEnded) res.end();
  };
  if (incoming.complete) {
    finish();
    return;
  }
  incoming.on('end', finish);
  incoming.on('close', finish);
  incoming.resume();
}

/** The host name of a Host header or a bind address, lower case, without port, brackets or a final dot. */
export function hostName(host: string): string {
  let h = host.trim().toLowerCase();
  if (h.startsWith('[')) {
    // `[v6]` or `[v6]:port`; anything else (an unclosed bracket, text after it) names no host
    const end = h.indexOf(']');
    if (end < 0 || !/^(:\d*)?$/.test(h.slice(end + 1))) return '';
    h = h.slice(1, end);
  } else {
    const colon = h.lastIndexOf(':');
    // one colon followed by digits: a port (a bare IPv6 address has several colons)
    if (colon >= 0 && h.indexOf(':') === colon && /^\d*$/.test(h.slice(colon + 1))) h = h.slice(0, colon);
  }
  return h.endsWith('.') ? h.slice(0, -1) : h;
}

/** True for a loopback name or address: `localhost`, 127.0.0.0/8, `::1` (IPv4-mapped included). */
export function isLoopback(host: string): boolean {
  const h = hostName(host);
  return h === 'localhost' || h === '::1' || /^(::ffff:)?127\.\d+\.\d+\.\d+$/.test(h);
}

/** True for an address that binds every interface: `0.0.0.0`, `::` (or an empty host). */
export function isWildcard(host: string): boolean {
  const h = hostName(host);
  return h === '' || h === '0.0.0.0' || h === '::' || h === '::0';
}

/**
 * Checks a bind address against the access policy before listening.
 * @returns a warning to print when the server is reachable beyond loopback without an API key, else undefined.
 * @throws {BindError} for a wildcard address (0.0.0.0, ::) without a key and without allowed hosts.
 */
export function checkBind(host: string, policy: AccessPolicy): string | undefined {
  if (policy.apiKey !== undefined || isLoopback(host)) return undefined;
  if (isWildcard(host) && (policy.allowedHosts?.length ?? 0) === 0)
    throw new BindError(
      `binding ${host} without an API key needs --allowed-hosts (the host names clients use to reach this server; ` +
        `"*" for any): set ${API_KEY_ENV}, or bind 127.0.0.1`,
    );
  return (
    `binding ${host} without an API key: anyone who can reach this address can use the server ` +
    `(set ${API_KEY_ENV} to require one)`
  );
}

/** The API key: the flag's, else `SPECD_API_KEY` from `env`, else the config's (an empty value is no key). */
export function apiKeyFrom(
  flag: string | undefined,
  env: Readonly<Record<string, string | undefined>>,
  config: string | undefined,
): string | undefined {
  for (const k of [flag, env[API_KEY_ENV], config]) if (k !== undefined && k !== '') return k;
  return undefined;
}

/**
 * Adds the access checks as the app's first `onRequest` hook: Host (403 `forbidden_host`), then the API key
 * (401 `invalid_api_key`). See the module comment for the rules.
 * @param boundHost the address the app listens on (its Host is accepted), once known.
 * @param refused called with each refusal before it is sent (metrics).
 */
export function installAccessHook(
  app: FastifyInstance,
  policy: AccessPolicy,
  boundHost: () => string | undefined,
  refused: (e: ApiError) => void,
): void {
  const key = policy.apiKey === undefined ? undefined : Buffer.from(`Bearer ${policy.apiKey}`);
  const extra = (policy.allowedHosts ?? []).map(hostName);
  const anyHost = extra.includes('*');
  const checkHost = !anyHost && (key === undefined || extra.length > 0);
  const open = new Set(policy.metricsNeedKey === true ? ['/health'] : ['/health', '/metrics']);
  const refuse = (reply: FastifyReply, e: ApiError): FastifyReply => {
    refused(e);
    return reply.code(e.status).type('application/json').send(e.toJSON());
  };
  app.addHook('onRequest', async (req, reply) => {
    if (checkHost) {
      const header = req.headers.host;
      const name = header === undefined ? undefined : hostName(header);
      const bound = boundHost();
      const ok =
        name !== undefined &&
        (isLoopback(name) ||
          extra.includes(name) ||
          (bound !== undefined && !isWildcard(bound) && hostName(bound) === name));
      if (!ok) return refuse(reply, forbiddenHost(header, key !== undefined));
    }
    if (key === undefined || open.has(req.url.split('?', 1)[0] ?? '')) return;
    const got = Buffer.from(req.headers.authorization ?? '');
    if (got.length !== key.length || !timingSafeEqual(got, key)) return refuse(reply, badApiKey());
  });
}
