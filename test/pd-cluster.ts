// Starts specd processes for the prefill/decode tests: `specd serve --role prefill|decode` and `specd router`,
// each on port 0, reporting its URL on stderr; kills them all at the end.
import { type ChildProcess, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { WATERFALL_PHASES } from '@specd/core';
import OpenAI from 'openai';
import { afterAll, beforeAll, expect } from 'vitest';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const BIN = path.join(ROOT, 'packages/core/src/cli/bin.js');
/** The shipped checkpoints. */
export const MODELS = path.join(ROOT, 'models');

/**
 * The drafter checkpoints of a target in models/: its `<target>-<method>` folders with a config.json, sorted
 * (data-driven, so a new drafter checkpoint is covered by every PD test).
 */
export function drafterDirs(target: string): string[] {
  return fs
    .readdirSync(MODELS)
    .filter((d) => d.startsWith(`${target}-`) && fs.existsSync(path.join(MODELS, d, 'config.json')))
    .sort()
    .map((d) => path.join(MODELS, d));
}

/**
 * The config's drafter branch for a checkpoint (`{method: 'none'}` without one): its method (from
 * `architectures`) and a fixed draft length — block size − 1 for the block drafters, 4 for EAGLE-3's chain — so
 * that no server calibrates a cost policy and τ compares at a fixed k.
 */
export function drafterBranch(dir: string | undefined): Record<string, unknown> {
  if (dir === undefined) return { method: 'none' };
  const c = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8')) as {
    architectures: string[];
    block_size?: number;
  };
  const arch = c.architectures[0] ?? '';
  const method = /DFlash/.test(arch) ? 'dflash' : /DSpark/.test(arch) ? 'dspark' : 'eagle3';
  return { method, path: dir, num_draft_tokens: c.block_size === undefined ? 4 : c.block_size - 1 };
}

/**
 * Writes `<dir>/<name>.json`: kimi-k3-tiny with the drafter checkpoint `drafter` at a fixed draft length
 * ({@link drafterBranch}; none when undefined) and `pd` as the config's pd section. @returns the file's path.
 */
export function kimiConfig(
  dir: string,
  name: string,
  drafter: string | undefined,
  pd: Record<string, unknown> = {},
): string {
  const file = path.join(dir, `${name}.json`);
  fs.writeFileSync(
    file,
    JSON.stringify({ model: path.join(MODELS, 'kimi-k3-tiny'), drafter: drafterBranch(drafter), pd }),
  );
  return file;
}

/**
 * {@link startSpecd} for a process that loads NIXL, started once more if the first one died of SIGSEGV before
 * reporting its URL. About one NIXL process in 60 crashed this way (heap corruption) while UCX's memory hooks were
 * on; loading NIXL turns them off on hosts without RDMA devices (pd/nixl-library.ts). Kept as a tripwire: a retry is
 * printed loudly so a recurrence stays visible, and a second crash fails the test.
 */
export async function startSpecdNixl(...args: Parameters<typeof startSpecd>): Promise<SpecdProcess> {
  try {
    return await startSpecd(...args);
  } catch (err) {
    if (!/exited \(SIGSEGV\) before reporting/.test((err as Error).message)) throw err;
    console.warn(`!!! KNOWN BUG (issue 17): a NIXL specd process crashed at start, retrying once:\n${String(err)}`);
    return startSpecd(...args);
  }
}

/** A running specd process and the URL it reported. */
export interface SpecdProcess {
  readonly child: ChildProcess;
  readonly url: string;
  /** Everything it wrote to stderr so far. */
  stderr(): string;
  /** Resolves when it exited (its code, or the signal's name). */
  readonly exited: Promise<number | string>;
  kill(signal?: NodeJS.Signals): void;
}

/**
 * Spawns `specd ARGS` and waits for the line naming its URL (`on http://…`, as `serve` and `router` print).
 * @param wrap turns the command line into the one spawned (e.g. `ip netns exec NS …`, test/netns.ts).
 * @throws when it exits first or does not report within `timeoutMs` (its stderr in the message).
 */
export async function startSpecd(
  args: readonly string[],
  timeoutMs = 120_000,
  env: Readonly<Record<string, string>> = {},
  wrap: (argv: readonly string[]) => readonly string[] = (argv) => argv,
): Promise<SpecdProcess> {
  const [cmd = process.execPath, ...rest] = wrap([process.execPath, BIN, ...args]);
  const child = spawn(cmd, rest, {
    cwd: ROOT,
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, ...env },
  });
  let err = '';
  const exited = new Promise<number | string>((resolve) => {
    child.once('exit', (code, signal) => resolve(code ?? signal ?? -1));
  });
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`specd ${args.join(' ')}: no URL after ${timeoutMs} ms\n${err}`)),
      timeoutMs,
    );
    child.stderr?.setEncoding('utf8');
    child.stderr?.on('data', (chunk: string) => {
      err += chunk;
      const m = / on (http:\/\/[^\s]+)/.exec(err);
      if (m?.[1] !== undefined) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`specd ${args.join(' ')} exited (${code}) before reporting its URL:\n${err}`));
    });
  });
  return {
    child,
    url,
    stderr: () => err,
    exited,
    kill: (signal = 'SIGTERM') => {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    },
  };
}

/**
 * Starts `specd router` on port 0 in front of a prefill and a decode process, with `config` (for the tokenizer and
 * pd.router settings) and `extra` flags (e.g. `--health-interval-ms 200`, `--api-key K`).
 */
export function startRouter(
  prefill: SpecdProcess,
  decode: SpecdProcess,
  config: string,
  extra: readonly string[] = [],
): Promise<SpecdProcess> {
  return startSpecd([
    'router',
    '--prefill',
    prefill.url,
    '--decode',
    decode.url,
    '--port',
    '0',
    '--config',
    config,
    '--log-level',
    'warn',
    ...extra,
  ]);
}

/**
 * `specd serve --role prefill` and `--role decode` (port 0, log level warn) and `specd router` in front of them, for
 * a config (P and D may have their own; the router takes D's).
 */
export async function startPdCluster(
  pConfig: string,
  dConfig = pConfig,
): Promise<{ p: SpecdProcess; d: SpecdProcess; r: SpecdProcess }> {
  const [p, d] = await Promise.all([
    startSpecd(['serve', '--config', pConfig, '--role', 'prefill', '--port', '0', '--log-level', 'warn']),
    startSpecd(['serve', '--config', dConfig, '--role', 'decode', '--port', '0', '--log-level', 'warn']),
  ]);
  const r = await startRouter(p, d, dConfig);
  return { p, d, r };
}

/**
 * One line per process: its URL, whether it runs (else its exit code or signal) and its stderr's last `tail`
 * characters, for a failure message (a dead upstream and a dropped connection look alike to a client).
 */
export function processStates(procs: readonly (SpecdProcess | undefined)[], tail = 600): string {
  return procs
    .map((q) => {
      if (q === undefined) return 'not started';
      const status = q.child.exitCode ?? q.child.signalCode ?? 'running';
      return `${q.url}: ${status}; stderr tail: ${q.stderr().slice(-tail)}`;
    })
    .join('\n');
}

/** Runs `fn`; an error it throws is rethrown with {@link processStates} of `procs` appended to its message. */
export async function withProcessStates<T>(
  procs: readonly (SpecdProcess | undefined)[],
  fn: () => Promise<T>,
): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    const e = err instanceof Error ? err : new Error(String(err));
    e.message += `\n${processStates(procs)}`;
    throw e;
  }
}

/** Stops every process (SIGTERM, then SIGKILL after `graceMs`) and waits for them. */
export async function stopAll(procs: readonly (SpecdProcess | undefined)[], graceMs = 5000): Promise<void> {
  await Promise.all(
    procs.map(async (p) => {
      if (p === undefined) return;
      p.kill('SIGTERM');
      const t = setTimeout(() => p.kill('SIGKILL'), graceMs);
      await p.exited;
      clearTimeout(t);
    }),
  );
}

/** The value of a Prometheus sample `name{labels}` in `text` (NaN when absent). */
export function metric(text: string, name: string, labels = ''): number {
  const esc = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const m = new RegExp(`^${esc(name)}${labels === '' ? '' : esc(`{${labels}}`)} (\\S+)$`, 'm').exec(text);
  return Number(m?.[1] ?? Number.NaN);
}

/** `GET url/metrics` as text. */
export async function metricsOf(url: string): Promise<string> {
  return (await fetch(`${url}/metrics`)).text();
}

/** Polls `probe` every 50 ms until it returns true; throws after `timeoutMs` naming `what`. */
export async function until(what: string, probe: () => Promise<boolean> | boolean, timeoutMs = 20_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (await probe()) return;
    if (Date.now() > end) throw new Error(`${what}: not reached within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** True when `url`'s target pages, state slots, draft pages and PD transfers in flight are all 0. */
export async function allFree(url: string): Promise<boolean> {
  const m = await metricsOf(url);
  return (
    metric(m, 'specd_kv_pages_used', 'cache="target"') === 0 &&
    metric(m, 'specd_kv_pages_used', 'cache="draft"') === 0 &&
    metric(m, 'specd_state_slots_used') === 0 &&
    metric(m, 'specd_pd_transfers_inflight') === 0 &&
    metric(m, 'specd_num_requests_running') === 0
  );
}

/** A request's TTFT waterfall as the router serves it (`GET /pd/waterfall/<id>`, pd/waterfall.ts). */
export interface WaterfallJson {
  readonly request_id: string;
  readonly ttft_ms: number;
  readonly phases_ms: Record<string, number>;
  readonly payload_bytes: Record<string, number>;
  readonly descriptors: number;
  readonly overlapped_bytes: number;
  readonly decode_reserve_ms: number;
}

/** The waterfall phases, in order (pd/waterfall.ts). */
export const PHASES = WATERFALL_PHASES;

/**
 * Posts a completion to the router and reads its waterfall. @returns the OpenAI answer's text (the stream's chunks
 * joined), the router's request id and the waterfall. @throws on a non-200 answer (status and body in the message).
 */
export async function completionWithWaterfall(
  router: string,
  body: Record<string, unknown>,
): Promise<{ text: string; requestId: string; waterfall: WaterfallJson }> {
  const res = await fetch(`${router}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const raw = await res.text();
  if (res.status !== 200) throw new Error(`router answered ${res.status}: ${raw}`);
  const requestId = res.headers.get('x-request-id') ?? '';
  let text = '';
  if (body.stream === true) {
    for (const line of raw.split('\n'))
      if (line.startsWith('data: ') && line !== 'data: [DONE]')
        text += (JSON.parse(line.slice(6)) as { choices: { text: string }[] }).choices[0]?.text ?? '';
  } else text = (JSON.parse(raw) as { choices: { text: string }[] }).choices[0]?.text ?? '';
  const w = await fetch(`${router}/pd/waterfall/${encodeURIComponent(requestId)}`);
  if (w.status !== 200) throw new Error(`GET /pd/waterfall/${requestId} answered ${w.status}: ${await w.text()}`);
  return { text, requestId, waterfall: (await w.json()) as WaterfallJson };
}

/**
 * Checks one waterfall: every phase present and ≥ 0, their sum ≤ the TTFT, a forward and a transfer measured.
 * `lateAnnouncement`: the transfer wait may be 0 — with NIXL the data travels outside the control socket, so D can
 * apply the state before P's `sending` message arrives (D then records no wait, pd/decode-role.ts).
 */
export function checkWaterfall(w: WaterfallJson, what: string, lateAnnouncement = false): void {
  expect(Object.keys(w.phases_ms).sort(), what).toEqual([...PHASES].sort());
  for (const ph of PHASES) expect(w.phases_ms[ph], `${what}: ${ph}`).toBeGreaterThanOrEqual(0);
  const sum = PHASES.reduce((s, ph) => s + (w.phases_ms[ph] ?? 0), 0);
  expect(sum, `${what}: Σ phases ${sum} ms vs TTFT ${w.ttft_ms} ms`).toBeLessThanOrEqual(w.ttft_ms);
  expect(w.phases_ms.prefill_forward, what).toBeGreaterThan(0);
  if (!lateAnnouncement) expect(w.phases_ms.transfer_wait, what).toBeGreaterThan(0);
  expect(w.descriptors, what).toBeGreaterThan(0);
}

/**
 * A temporary directory for the calling test file's configs: created in its beforeAll (`os.tmpdir()/<prefix>…`),
 * removed with its contents in its afterAll. Call at the file's top level; the returned function gives the path.
 */
export function tempDir(prefix: string): () => string {
  let dir: string | undefined;
  beforeAll(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  });
  afterAll(() => {
    if (dir !== undefined) fs.rmSync(dir, { recursive: true, force: true });
  });
  return () => {
    if (dir === undefined) throw new Error(`tempDir(${prefix}): used before beforeAll ran`);
    return dir;
  };
}

/** The id of the model `url` serves (`GET url/v1/models`, the first entry). */
export async function modelId(url: string): Promise<string> {
  return (await (await fetch(`${url}/v1/models`)).json()).data[0].id as string;
}

/** An OpenAI client of the server or router at `url` (no API key; `maxRetries` as OpenAI's default unless given). */
export function clientOf(url: string, maxRetries?: number): OpenAI {
  return new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', ...(maxRetries === undefined ? {} : { maxRetries }) });
}

/**
 * Sends a completion of `prompt` through `client` (a router of `p` and `d`), waits until `p` logged that its
 * transfer paused after 1 descriptor (the test hook `SPECD_PD_TEST_PAUSE_AFTER_DESCRIPTORS=1`), kills `p`
 * (SIGKILL), and asserts: the client gets an API error with a 5xx status; `d` then frees everything (within
 * {@link until}'s 20 s) and still answers /health.
 */
export async function expectPrefillKilledMidTransfer(
  client: OpenAI,
  model: string,
  prompt: string,
  p: SpecdProcess,
  d: SpecdProcess,
): Promise<void> {
  const pending = client.completions.create({ model, prompt, max_tokens: 8 }).catch((e: unknown) => e);
  await until('P paused in the transfer', () => /paused after 1 descriptors of room/.test(p.stderr()));
  p.kill('SIGKILL');
  const err = await pending;
  expect(err).toBeInstanceOf(OpenAI.APIError);
  expect((err as InstanceType<typeof OpenAI.APIError>).status).toBeGreaterThanOrEqual(500);
  await until('D free', () => allFree(d.url));
  expect((await fetch(`${d.url}/health`)).status).toBe(200);
}
