/** OpenAI-format API errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status. */

/** An error answered to the client as-is. */
export class ApiError extends Error {
  override readonly name = 'ApiError';
  constructor(
    readonly status: number,
    message: string,
    readonly type: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
  ) {
    super(message);
  }

  /** The response body. */
  toJSON(): { error: { message: string; type: string; param: string | null; code: string | null } } {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

/** 400 for a bad parameter, naming it. */
export const invalidParam = (param: string, message: string): ApiError =>
  new ApiError(400, `${param}: ${message}`, 'invalid_request_error', param, 'invalid_value');
/** 400 when the chat template rejects the messages (e.g. its `raise_exception`) or cannot render them: names why. */
export const chatTemplateFailed = (err: Error): ApiError =>
  new ApiError(400, `messages: ${err.message}`, 'invalid_request_error', 'messages', 'chat_template_error');
/** 401. */
export const badApiKey = (): ApiError =>
  new ApiError(
    401,
    'Incorrect API key provided (expected "Authorization: Bearer <key>")',
    'invalid_request_error',
    null,
    'invalid_api_key',
  );
/**
 * 403 for a request whose Host header is not this server's (DNS rebinding: a web page whose name was re-pointed at
 * the server would reach it with its own name as Host): names the Host and how to allow it.
 */
export const forbiddenHost = (host: string | undefined, keyed = false): ApiError =>
  new ApiError(
    403,
    `Host ${host === undefined ? '(none)' : JSON.stringify(host)} is not allowed: ` +
      (keyed
        ? 'only the bound address, localhost, 127.0.0.1, [::1] and the names in --allowed-hosts are (add it there)'
        : 'without an API key only the bound address, localhost, 127.0.0.1 and [::1] are (add the name to ' +
          '--allowed-hosts, or set an API key)'),
    'invalid_request_error',
    null,
    'forbidden_host',
  );
/** 400 for a /v1 request sent to the prefill instance of a prefill/decode pair (it answers only the router). */
export const prefillOnly = (): ApiError =>
  new ApiError(
    400,
    'this server is the prefill instance of a prefill/decode pair: send requests to the router (specd router)',
    'invalid_request_error',
    null,
    'pd_prefill_only',
  );

/** 400 for a JSON body nested deeper than the server parses: names the limit. */
export const jsonTooDeep = (maxDepth: number): ApiError =>
  new ApiError(
    400,
    `malformed request: JSON nested deeper than ${maxDepth} levels`,
    'invalid_request_error',
    null,
    'json_too_deep',
  );
/** 413 for a body larger than the server reads. */
export const bodyTooLarge = (limitBytes: number): ApiError =>
  new ApiError(
    413,
    `request body larger than body_limit_bytes (${limitBytes})`,
    'invalid_request_error',
    null,
    'body_too_large',
  );
/** 503 for a request the server cannot finish because it is shutting down (in flight or arriving meanwhile). */
export const shuttingDown = (): ApiError =>
  new ApiError(503, 'the server is shutting down', 'server_error', null, 'server_shutting_down');
/** 404 for a model this server does not serve. */
export const unknownModel = (model: string, served: string): ApiError =>
  new ApiError(
    404,
    `The model ${JSON.stringify(model)} does not exist (this server serves ${JSON.stringify(served)})`,
    'invalid_request_error',
    'model',
    'model_not_found',
  );
/** 503 when the queue or the tokens in flight are full. */
export const overloaded = (message: string): ApiError => new ApiError(503, message, 'server_error', null, 'overloaded');
/** 500 when the model can no longer run (e.g. a pipeline stage process died): names what broke. */
export const modelFailed = (err: Error): ApiError =>
  new ApiError(500, `the model cannot run: ${err.message}`, 'server_error', null, 'model_failed');

/**
 * 500 when this request alone failed in the engine (a SequenceError, engine/types.ts: e.g. the model's logits for
 * it were not finite); the requests running beside it go on. Names the request's phase and why.
 */
export const sequenceFailed = (err: Error): ApiError =>
  new ApiError(500, `this request failed: ${err.message}`, 'server_error', null, 'sequence_failed');

/**
 * The HTTP answer to a prefill/decode failure (pd/types.ts PdError codes): 503 `capacity` (retry later),
 * 504 `timeout`, 409 `conflict` (a room in use), 501 `unsupported`, 502 for the rest (the other instance aborted,
 * refused, sent a wrong or missing entry, a bad checksum or a malformed state, or is gone), the message naming
 * the entry, field or peer.
 */
export const pdFailed = (code: string, message: string): ApiError => {
  const status =
    code === 'capacity'
      ? 503
      : code === 'timeout'
        ? 504
        : code === 'conflict'
          ? 409
          : code === 'unsupported'
            ? 501
            : 502;
  return new ApiError(
    status,
    `prefill/decode: ${message}`,
    status === 503 ? 'server_error' : 'api_error',
    null,
    `pd_${code}`,
  );
};
