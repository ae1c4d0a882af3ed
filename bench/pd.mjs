#!/usr/bin/env node
// Prefill/decode disaggregation on this machine (packages/core/src/pd):
//   1. the data plane against its physical limit: memcpy (Buffer.copy) of the same bytes in this process, the
//      XXH64 checksum P and D each compute, and the ZeroMQ/TCP TransferEngine writing page runs between two
//      engines over loopback (contiguous runs coalesced into few descriptors, and scattered pages);
//   2. end to end, as processes: time to first token and to the last token of one request through
//      `specd router` → `serve --role prefill` / `--role decode` against an aggregated `specd serve`, the same
//      target and drafter (SmolLM2-135M-Instruct + EAGLE-3, fixed draft length), and D's transfer wait and payload;
//   3. P and D at different TP sizes (kimi-k3-tiny + DFlash): TTFT through the router and P's transfer time.
//
//   npm run bench:pd                 (root; run `npm run build` and `npm run models:fetch` first; ~2 min)
//   node bench/pd.mjs --reps 5 --prompt 512
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { checksumRanges, createZmqTransferEngine } from '@specd/core';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const arg = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i < 0 ? dflt : argv[i + 1];
};
const REPS = Number(arg('reps', '5'));
const PROMPT_WORDS = Number(arg('prompt', '400'));
const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
const gbps = (bytes, ms) => (bytes / (ms / 1000) / 1e9).toFixed(2);

console.log(`CPU: ${cpus()[0]?.model ?? 'unknown'} × ${cpus().length}`);

// --- 1. data plane --------------------------------------------------------------------------------------
const PAGE = 16 << 10; // 16 KiB pages (e.g. 64 tokens × 1 head × 128 × bf16)
const PAGES = 2048; // 32 MiB
const BYTES = PAGE * PAGES;
const src = new Uint8Array(BYTES);
for (let i = 0; i < BYTES; i += 4096) src[i] = i & 0xff;
const dst = new Uint8Array(BYTES);
const times = { memcpy: [], checksum: [], contiguous: [], scattered: [] };
const P = await createZmqTransferEngine({ host: '127.0.0.1', port: 0 });
const D = await createZmqTransferEngine({ host: '127.0.0.1', port: 0 });
P.registerRegions([{ id: 'src', bytes: src }]);
D.registerRegions([{ id: 'dst', bytes: dst }]);
const whole = [{ region: 'src', offset: 0, length: BYTES }];
// a permutation of pages: every destination page elsewhere, no two runs adjacent on both sides
const perm = Array.from({ length: PAGES }, (_, i) => (i * 1021) % PAGES);
let room = 0;
const run = async (pairs) => {
  const id = `b${room++}`;
  const arrived = D.expect(id, [{ region: 'dst', offset: 0, length: BYTES }], { timeoutMs: 60_000 });
  const t0 = performance.now();
  const stats = await P.write(
    D.address,
    id,
    pairs.map(([s]) => ({ region: 'src', offset: s * PAGE, length: PAGE })),
    pairs.map(([, d]) => ({ region: 'dst', offset: d * PAGE, length: PAGE })),
    {},
    { timeoutMs: 60_000 },
  );
  await arrived;
  return { ms: performance.now() - t0, stats };
};
let contiguousStats;
let scatteredStats;
for (let r = 0; r < REPS; r++) {
  let t0 = performance.now();
  Buffer.from(dst.buffer).set(src);
  times.memcpy.push(performance.now() - t0);
  t0 = performance.now();
  checksumRanges(() => src, whole);
  times.checksum.push(performance.now() - t0);
  const c = await run(perm.map((_, i) => [i, i]));
  times.contiguous.push(c.ms);
  contiguousStats = c.stats;
  const s = await run(perm.map((d, i) => [i, d]));
  times.scattered.push(s.ms);
  scatteredStats = s.stats;
}
if (checksumRanges(() => src, whole) !== checksumRanges(() => dst, [{ region: 'dst', offset: 0, length: BYTES }]))
  throw new Error('bench: the scattered transfer did not land the same bytes (permutation is its own check)');
await P.close();
await D.close();
console.log(`\n1. data plane, ${BYTES >> 20} MiB in ${PAGES} pages of ${PAGE >> 10} KiB, median of ${REPS}:`);
console.log('| what | ms | GB/s | descriptors | messages |');
console.log('| --- | --- | --- | --- | --- |');
const row = (what, ms, stats) =>
  console.log(
    `| ${what} | ${ms.toFixed(1)} | ${gbps(BYTES, ms)} | ${stats?.descriptors ?? ''} | ${stats?.messages ?? ''} |`,
  );
row('memcpy (Buffer.set), the limit on one host', median(times.memcpy));
row('XXH64 checksum (hash-wasm)', median(times.checksum));
row('TransferEngine, contiguous pages', median(times.contiguous), contiguousStats);
row('TransferEngine, scattered pages', median(times.scattered), scatteredStats);

// --- 2. end to end ----------------------------------------------------------------------------------------
const BIN = join(ROOT, 'packages/core/src/cli/bin.js');
const procs = [];
function start(args) {
  return new Promise((resolveUrl, reject) => {
    const child = spawn(process.execPath, [BIN, ...args], { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'] });
    procs.push(child);
    let err = '';
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (d) => {
      err += d;
      const m = / on (http:\/\/\S+)/.exec(err);
      if (m) resolveUrl(m[1]);
    });
    child.once('exit', (code) => reject(new Error(`specd ${args.join(' ')} exited ${code}:\n${err}`)));
  });
}
const tmp = mkdtempSync(join(tmpdir(), 'specd-bench-pd-'));
const cfg = join(tmp, 'c.json');
writeFileSync(
  cfg,
  JSON.stringify({
    model: join(ROOT, 'models/smollm2-135m-instruct'),
    drafter: { method: 'eagle3', path: join(ROOT, 'models/smollm2-135m-instruct-eagle3'), num_draft_tokens: 4 },
    scheduler: { max_sequence_tokens: 2048 },
  }),
);
try {
  const quiet = ['--log-level', 'warn', '--port', '0', '--config', cfg];
  const [agg, p, d] = await Promise.all([
    start(['serve', ...quiet]),
    start(['serve', '--role', 'prefill', ...quiet]),
    start(['serve', '--role', 'decode', ...quiet]),
  ]);
  const router = await start(['router', '--prefill', p, '--decode', d, ...quiet]);
  const model = (await (await fetch(`${agg}/v1/models`)).json()).data[0].id;
  const prompt = Array.from({ length: PROMPT_WORDS }, (_, i) => `word${i % 97}`).join(' ');
  const one = async (url) => {
    const t0 = performance.now();
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model, prompt, max_tokens: 32, temperature: 0, stream: true }),
    });
    let ttft;
    let text = '';
    for await (const chunk of res.body) {
      ttft ??= performance.now() - t0;
      text += Buffer.from(chunk).toString('utf8');
    }
    return { ttft, e2e: performance.now() - t0, text, usage: text };
  };
  const rows = { agg: { ttft: [], e2e: [] }, pd: { ttft: [], e2e: [] } };
  let promptTokens = 0;
  for (let r = 0; r < REPS + 1; r++) {
    const a = await one(agg);
    const b = await one(router);
    const strip = (t) => t.replace(/"(id|created)":[^,]+,/g, '');
    if (strip(a.text) !== strip(b.text)) throw new Error('bench: PD output differs from aggregated');
    if (r === 0) continue; // warm-up
    rows.agg.ttft.push(a.ttft);
    rows.agg.e2e.push(a.e2e);
    rows.pd.ttft.push(b.ttft);
    rows.pd.e2e.push(b.e2e);
  }
  const dm = await (await fetch(`${d}/metrics`)).text();
  const pm = await (await fetch(`${p}/metrics`)).text();
  const val = (text, name) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1] ?? Number.NaN);
  promptTokens = val(pm, 'specd_prompt_tokens_prefilled') / (REPS + 1);
  const n = val(dm, 'specd_pd_transfer_wait_seconds_count{role="decode"}');
  const wait = (val(dm, 'specd_pd_transfer_wait_seconds_sum{role="decode"}') / n) * 1000;
  const pn = val(pm, 'specd_pd_transfer_wait_seconds_count{role="prefill"}');
  const send = (val(pm, 'specd_pd_transfer_wait_seconds_sum{role="prefill"}') / pn) * 1000;
  const bytes = ['target_kv', 'linear_state', 'draft_context'].map(
    (k) => val(dm, `specd_pd_payload_bytes_sum{kind="${k}"}`) / val(dm, `specd_pd_payload_bytes_count{kind="${k}"}`),
  );
  console.log(
    `\n2. end to end, SmolLM2-135M-Instruct + EAGLE-3 (4 drafts), ${promptTokens} prompt tokens, 32 new tokens, ` +
      `streamed, median of ${REPS}:`,
  );
  console.log('| path | TTFT ms | e2e ms |');
  console.log('| --- | --- | --- |');
  console.log(`| aggregated serve | ${median(rows.agg.ttft).toFixed(0)} | ${median(rows.agg.e2e).toFixed(0)} |`);
  console.log(`| router → P → D | ${median(rows.pd.ttft).toFixed(0)} | ${median(rows.pd.e2e).toFixed(0)} |`);
  console.log(
    `D's mean wait from reserve to verified state (P's prefill included): ${wait.toFixed(1)} ms; P's mean ` +
      `transfer (handoff to D's acknowledgement): ${send.toFixed(1)} ms; payload per request: target KV ` +
      `${(bytes[0] / 1024).toFixed(0)} KiB, draft context ${(bytes[2] / 1024).toFixed(0)} KiB` +
      (Number.isNaN(bytes[1]) ? '' : `, linear state ${(bytes[1] / 1024).toFixed(0)} KiB`),
  );

  // --- 3. across TP sizes -----------------------------------------------------------------------------------
  // kimi-k3-tiny + DFlash (SmolLM2's model plugin has no TP): P re-splits its ranks' entries for D's ranks
  const kcfg = join(tmp, 'k.json');
  writeFileSync(
    kcfg,
    JSON.stringify({
      model: join(ROOT, 'models/kimi-k3-tiny'),
      drafter: { method: 'dflash', path: join(ROOT, 'models/kimi-k3-tiny-dflash'), num_draft_tokens: 7 },
      scheduler: { max_sequence_tokens: 2048 },
    }),
  );
  const kquiet = ['--log-level', 'warn', '--port', '0', '--config', kcfg];
  const kprompt = Array.from({ length: PROMPT_WORDS }, (_, i) => `word${i % 97}`).join(' ');
  console.log(
    `\n3. across TP sizes, kimi-k3-tiny + DFlash, the same prompt (${PROMPT_WORDS} words), 8 new tokens, ` +
      `median of ${REPS}:`,
  );
  console.log("| P tp → D tp | TTFT ms | P's transfer ms | payload KiB |");
  console.log('| --- | --- | --- | --- |');
  for (const [ptp, dtp] of [
    [1, 1],
    [1, 2],
    [2, 1],
    [2, 2],
  ]) {
    const kp = await start(['serve', '--role', 'prefill', '--tp', String(ptp), ...kquiet]);
    const kd = await start(['serve', '--role', 'decode', '--tp', String(dtp), ...kquiet]);
    const kr = await start(['router', '--prefill', kp, '--decode', kd, ...kquiet]);
    const ttft = [];
    for (let r = 0; r < REPS + 1; r++) {
      const t0 = performance.now();
      const res = await fetch(`${kr}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'kimi-k3-tiny', prompt: kprompt, max_tokens: 8, temperature: 0, stream: true }),
      });
      let first;
      for await (const _ of res.body) first ??= performance.now() - t0;
      if (r > 0) ttft.push(first);
    }
    const km = await (await fetch(`${kp}/metrics`)).text();
    const kdm = await (await fetch(`${kd}/metrics`)).text();
    const sent =
      (val(km, 'specd_pd_transfer_wait_seconds_sum{role="prefill"}') /
        val(km, 'specd_pd_transfer_wait_seconds_count{role="prefill"}')) *
      1000;
    const payload = ['target_kv', 'linear_state', 'draft_context']
      .map((k) => val(kdm, `specd_pd_payload_bytes_sum{kind="${k}"}`) / (REPS + 1))
      .reduce((a, b) => a + b, 0);
    console.log(
      `| ${ptp} → ${dtp} | ${median(ttft).toFixed(0)} | ${sent.toFixed(1)} | ${(payload / 1024).toFixed(0)} |`,
    );
    for (const c of procs.splice(-3)) c.kill('SIGTERM');
  }
} finally {
  for (const c of procs) c.kill('SIGTERM');
  rmSync(tmp, { recursive: true, force: true });
}
