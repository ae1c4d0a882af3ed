/**
 * The specd deployment config schema (JSON Schema draft 2020-12): core's sections plus one
 * `drafter` branch per loaded drafter plugin (its `schema`, discriminated by `method`), and the
 * built-in `{"method": "none"}` branch. Core never names a method other than "none".
 *
 *   { "model": "models/kimi-k3-tiny",                     // target checkpoint dir (relative to the file)
 *     "device": "cpu" | "cuda",                             // where the target runs (default cpu; --device)
 *     "checkpoint_sanity": "refuse" | "warn",               // a non-finite weight refused (default) or warned
 *     "drafter": {"method": "dflash", "path": "…"} | {"method": "none"},
 *     "plugins": ["@specd/model-kimi-k3", "@specd/plugin-dflash"],
 *     "sampling": {"temperature"?: 0, "top_p"?: 1, "top_k"?: 0, "repetition_penalty"?: 1, "max_tokens"?: 64,
 *                  "seed"?: 1},   // absent fields: the model's generation_config.json, else OpenAI's
 *     "scheduler": {"max_running_requests": 8, "max_waiting_requests": 64, "prefill_chunk_tokens": 64,
 *                   "max_tokens_in_flight": 16384, "max_sequence_tokens": 2048, "page_size": 16},
 *     "server": {"host": "127.0.0.1", "port": 8000, "api_key"?: "…", "allowed_hosts"?: ["…"],
 *                "metrics_require_key": false, "body_limit_bytes": 1048576, "model_name"?: "…"},
 *     "parallelism": {"tp": 1, "pp": 1, "partition"?: [layers per stage], "transport": "zmq" | "fifo"},
 *                    // pp > 1: stage processes; tp > 1: worker-thread ranks; both: each stage a TP group
 *     "pd": {"role": "none" | "prefill" | "decode", "bootstrap"?: {"host", "port"},
 *            "router"?: {"prefill": [urls], "decode": [urls], "host": "127.0.0.1", "port": 8000,
 *                        "policy": "round_robin" | "random", "health_interval_ms": 5000},   // `specd router`
 *            "bootstrap_timeout_ms": 30000, "transfer_timeout_ms": 60000} }
 */

import type { DrafterPlugin } from '../plugin/drafter-plugin.js';
import { BUILTIN_PLUGIN_PACKAGES } from '../plugin/registry.js';

/** `$id` of the merged schema. */
export const CONFIG_SCHEMA_ID = 'https://specd.dev/schemas/config.json';

/** The drafter branch that turns speculative decoding off. */
export const NO_DRAFTER_SCHEMA = Object.freeze({
  type: 'object',
  required: ['method'],
  additionalProperties: false,
  properties: { method: { const: 'none', description: 'no drafter: plain decoding with the target alone' } },
});

const port = { type: 'integer', minimum: 0, maximum: 65535 } as const;
const upstreamUrl = { type: 'string', pattern: '^https?://[^/]+$', description: 'a base URL, e.g. http://host:30001' };

/**
 * The merged config schema for the given drafter plugins (each contributes `schema`, whose
 * `properties.method.const` must be its method).
 * @throws {Error} if a plugin's schema lacks `properties.method.const` equal to its method.
 */
export function buildConfigSchema(drafters: readonly DrafterPlugin[]): Record<string, unknown> {
  const branches: unknown[] = [NO_DRAFTER_SCHEMA];
  for (const d of drafters) {
    const props = (d.schema as { properties?: { method?: { const?: unknown } } }).properties;
    if (props?.method?.const !== d.method) {
      throw new Error(
        `drafter plugin ${JSON.stringify(d.method)}: schema.properties.method.const: ` +
          `expected ${JSON.stringify(d.method)}, got ${JSON.stringify(props?.method?.const)}`,
      );
    }
    // embedded: no nested resource ids
    const { $id: _id, $schema: _s, ...branch } = d.schema as Record<string, unknown>;
    branches.push({
      ...branch,
      required: [...new Set(['method', ...((branch.required as string[] | undefined) ?? [])])],
    });
  }
  return {
    $schema: 'https://json-schema.org/draft/2020-12/schema',
    $id: CONFIG_SCHEMA_ID,
    title: 'specd deployment config',
    type: 'object',
    additionalProperties: false,
    properties: {
      $schema: { type: 'string' },
      model: {
        type: 'string',
        minLength: 1,
        description:
          'target checkpoint directory (HF format), relative to the config file; default: the shipped ' +
          'models/kimi-k3-tiny (`specd serve` with neither --config nor --model reads configs/default.json instead)',
      },
      device: {
        enum: ['cpu', 'cuda'],
        default: 'cpu',
        description:
          'where the target runs (`--device` overrides it): "cpu", or "cuda": one NVIDIA GPU through ' +
          '@specd/native-cuda (`npm run build:cuda`), for model plugins that have a GPU path (Llama) at tp = pp = 1',
      },
      checkpoint_sanity: {
        enum: ['refuse', 'warn'],
        default: 'refuse',
        description:
          'checks of the target and drafter checkpoints at load: "refuse" a non-finite weight, or "warn" and load it ' +
          'anyway (structural problems are refused either way; docs/ARCHITECTURE.md, "Checkpoint sanity")',
      },
      drafter: {
        type: 'object',
        description: 'the drafting method, by "method"; absent: the shipped DFlash with the shipped target, else none',
        required: ['method'],
        properties: { method: { type: 'string' } },
        discriminator: { propertyName: 'method' },
        oneOf: branches,
      },
      plugins: {
        type: 'array',
        items: { type: 'string', minLength: 1 },
        uniqueItems: true,
        default: [...BUILTIN_PLUGIN_PACKAGES],
        description: 'plugin packages to import (each exports register(container))',
      },
      sampling: {
        type: 'object',
        additionalProperties: false,
        default: {},
        description:
          "defaults for requests that do not say; a field given here wins over the model's generation_config.json, " +
          "which wins over OpenAI's defaults (config/generation-config.ts)",
        properties: {
          temperature: {
            type: 'number',
            minimum: 0,
            maximum: 2,
            description: '0 = greedy; absent: generation_config.json (do_sample false: 0), else 1',
          },
          top_p: {
            type: 'number',
            exclusiveMinimum: 0,
            maximum: 1,
            description: 'absent: generation_config.json, else 1',
          },
          top_k: { type: 'integer', minimum: 0, description: '0 = off; absent: generation_config.json, else 0' },
          repetition_penalty: {
            type: 'number',
            exclusiveMinimum: 0,
            description: '1 = off; absent: generation_config.json, else off',
          },
          max_tokens: {
            type: 'integer',
            minimum: 1,
            description:
              'serve: for requests without max_tokens, capped at the remaining context; absent: the remaining ' +
              'context (max_sequence_tokens − prompt), as vLLM. generate: --max-tokens default (64 when absent)',
          },
          seed: { type: 'integer', minimum: 0, maximum: 4294967295, description: 'default: random per request' },
        },
      },
      scheduler: {
        type: 'object',
        additionalProperties: false,
        default: {},
        properties: {
          max_running_requests: {
            type: 'integer',
            minimum: 1,
            default: 8,
            description: 'sequences decoded together (KV slots)',
          },
          max_waiting_requests: { type: 'integer', minimum: 0, default: 64, description: 'queued beyond that → 503' },
          prefill_chunk_tokens: { type: 'integer', minimum: 1, default: 64 },
          max_tokens_in_flight: {
            type: 'integer',
            minimum: 1,
            default: 16384,
            description: 'Σ (prompt + max_tokens) over waiting and running requests; beyond → 503',
          },
          max_sequence_tokens: {
            type: 'integer',
            minimum: 2,
            default: 2048,
            description:
              "the context length (vLLM's max_model_len): prompt + max_tokens per request, beyond → 400 " +
              "context_length_exceeded; at most the model's max_position_embeddings (refused at start-up)",
          },
          page_size: { type: 'integer', minimum: 1, default: 16, description: 'target KV page size, tokens' },
        },
      },
      server: {
        type: 'object',
        additionalProperties: false,
        default: {},
        properties: {
          host: { type: 'string', minLength: 1, default: '127.0.0.1' },
          port: { ...port, default: 8000, description: '0 = an ephemeral port' },
          api_key: {
            type: 'string',
            minLength: 1,
            description:
              'if set, requests need "Authorization: Bearer <api_key>" (--api-key and SPECD_API_KEY take precedence)',
          },
          allowed_hosts: {
            type: 'array',
            items: { type: 'string', minLength: 1 },
            uniqueItems: true,
            description:
              'Host names (no port) accepted besides the bound address, localhost, 127.0.0.1 and [::1]; "*" = any. ' +
              'Checked when no API key is set (DNS rebinding), and whenever given; a 0.0.0.0 bind without a key ' +
              'needs it',
          },
          metrics_require_key: {
            type: 'boolean',
            default: false,
            description: '/metrics needs the API key too (/health stays open)',
          },
          body_limit_bytes: { type: 'integer', minimum: 1024, default: 1048576 },
          model_name: {
            type: 'string',
            minLength: 1,
            description: 'model id served by /v1/models (default: the model directory name)',
          },
        },
      },
      parallelism: {
        type: 'object',
        additionalProperties: false,
        default: {},
        description:
          'pp > 1 runs in generate and serve (stages 0 … pp−2 as processes, the last in the driver); ' +
          'tp > 1 runs in generate and serve (rank 0 in the driver, ranks 1 … tp−1 as worker threads; ' +
          "tp must divide the model's head and expert counts); " +
          'both: every stage a TP group of tp ranks (threads of its stage process)',
        properties: {
          tp: { type: 'integer', minimum: 1, default: 1 },
          pp: { type: 'integer', minimum: 1, default: 1 },
          transport: {
            enum: ['zmq', 'fifo'],
            default: 'zmq',
            description:
              'pp > 1: how the driver talks to the stage processes: "zmq" = ZeroMQ PAIR sockets over ipc:// ' +
              '(default), "fifo" = a pair of named pipes per stage (same host only, lower latency)',
          },
          stage_hosts: {
            type: 'array',
            items: {
              type: 'object',
              additionalProperties: false,
              properties: {
                exec: { type: 'array', items: { type: 'string', minLength: 1 }, minItems: 1 },
                address: { type: 'string', minLength: 1 },
              },
            },
            description:
              "pp > 1, transport zmq (specd serve): stage k's process (k = 0 … pp−2) on another host: `exec` is the " +
              'command prefix that starts it there and execs node in place (e.g. ["ip", "netns", "exec", "ns1"]; the ' +
              'stage stays a child of the server, which watches its pid: another network namespace, a container ' +
              'sharing the process table), `address` its own address (its PD transfer agent binds there); the ' +
              'server then binds the stage sockets on tcp://<server host>:* instead of ipc://',
          },
          partition: {
            type: 'array',
            items: { type: 'integer', minimum: 1 },
            minItems: 1,
            description:
              'layers per pipeline stage (length pp, each >= 1, sum = num_hidden_layers, checked when the model ' +
              "loads); default: vLLM's split, the remainder on the stages before the last",
          },
        },
      },
      pd: {
        type: 'object',
        additionalProperties: false,
        default: {},
        description:
          "prefill/decode disaggregation: this instance's role (`specd serve --role`), the prefill role's bootstrap " +
          'socket, `specd router`, and the timeouts of both roles',
        properties: {
          role: { enum: ['none', 'prefill', 'decode'], default: 'none' },
          bootstrap: {
            type: 'object',
            additionalProperties: false,
            required: ['host', 'port'],
            properties: { host: { type: 'string', minLength: 1 }, port },
          },
          router: {
            type: 'object',
            additionalProperties: false,
            description: '`specd router` (flags override it): the servers it routes to and where it listens',
            properties: {
              prefill: { type: 'array', items: upstreamUrl, uniqueItems: true, default: [] },
              decode: { type: 'array', items: upstreamUrl, uniqueItems: true, default: [] },
              host: { type: 'string', minLength: 1, default: '127.0.0.1' },
              port: { ...port, default: 8000, description: '0 = an ephemeral port' },
              policy: { enum: ['round_robin', 'random'], default: 'round_robin' },
              health_interval_ms: {
                type: 'integer',
                minimum: 0,
                default: 5000,
                description: 'GET /health and /pd/info on every upstream this often; 0 = only at start',
              },
            },
          },
          bootstrap_timeout_ms: {
            type: 'integer',
            minimum: 1,
            default: 30000,
            description: 'how long P and D wait for their peer to join a bootstrap room before failing the request',
          },
          transfer: {
            enum: ['zmq', 'nixl'],
            default: 'zmq',
            description:
              'the PD data plane: zmq (ZeroMQ/TCP) or nixl (NIXL over UCX: shared memory/TCP on one host, RDMA on a ' +
              'cluster; needs `npm run nixl:fetch`); prefill and decode instances must use the same',
          },
          draft_context: {
            enum: ['kv', 'features', 'auto'],
            default: 'kv',
            description:
              "the drafter's context in a transfer: kv (its draft KV pages; a sliding layer only its window's), " +
              'features (the projected features of the rows, from which the decode instance rebuilds the draft ' +
              'KV: fewer bytes, some compute on D), auto (the decode instance picks per request by measured ' +
              'transfer rate and rebuild cost); prefill and decode instances must use the same; features and auto ' +
              'need a drafter that declares DraftContextFeatures and tp = pp = 1',
          },
          overlap: {
            type: 'boolean',
            default: true,
            description:
              'prefill instance: send the rows each prefill chunk finished (target KV, the draft context of layers ' +
              'that attend the whole context) while the prompt still prefills, so that the transfer wait is only ' +
              'the tail after the forward; applies at tp 1 on both sides without pipeline stages',
          },
          transfer_timeout_ms: {
            type: 'integer',
            minimum: 1,
            default: 60000,
            description: "how long D waits for P's transfer (and P for D's acknowledgement) before failing the request",
          },
        },
      },
    },
  };
}
