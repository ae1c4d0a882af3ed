#!/usr/bin/env node
// KDA and MoE micro-benchmark (docs/BENCHMARKS.md, "KDA and MoE"). Run after `npm run build`:
//
//   node native/bench/kda_moe.mjs            (Kimi-Linear-48B-A3B layer shapes, ~1 min)
//   node native/bench/kda_moe.mjs --quick    (fewer repetitions, shorter prefill, fewer experts)
//   --no-moe / --no-kda                      (one family only)
//
// KDA, one layer (heads 32, headDim 128: 2 MiB of fp32 state per sequence):
//   1. recurrent decode (1 token) and verification blocks (T = 4, 8, 16) for one sequence, with and
//      without per-token snapshots; the snapshot commit (one slot copy); replay of n accepted tokens;
//      batched decode (B = 8 sequences x 1 token);
//   2. prefill of one sequence: recurrent vs chunked (chunk 16, 32, 64), tokens/s;
//   2b. the gates g = -exp(A_log)·softplus(f + dt_bias), β = sigmoid(b) of T = 1 and 16 tokens: the native
//      kdaGate against the JavaScript loop the Kimi forward ran before it (same formula), alternated.
//   State traffic is reported as GB/s of state read + written (2 x 2 MiB per token and sequence).
// MoE, one layer (hidden 2304, inter 1024, top-8 + 1 shared expert of inter 1024, sigmoid router):
//   3. routed experts + shared for N = 1, 4, 16, 64 tokens with random routing over E experts:
//      time, distinct experts touched, and GB/s of bf16 expert weights read (each touched expert's
//      w13 + w2 once, + the shared expert).
//   4. router (moeRoute) over 256 experts.
// Times are the minimum over repetitions, in milliseconds.
import {
  createKdaSnapshots,
  createKdaStatePools,
  createMoeExpertSet,
  isa,
  kdaChunked,
  kdaCommitSnapshot,
  kdaGate,
  kdaRecurrent,
  kdaSlotLengths,
  moeExperts,
  moeRoute,
  packMoeExpert,
} from '@specd/native';

const quick = process.argv.includes('--quick');
const runKda = !process.argv.includes('--no-kda');
const runMoe = !process.argv.includes('--no-moe');
const reps = quick ? 3 : 7;

function minTimeMs(fn, repetitions = reps) {
  fn();
  let best = Infinity;
  for (let r = 0; r < repetitions; r++) {
    const t0 = process.hrtime.bigint();
    fn();
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e6);
  }
  return best;
}

let seed = 12345;
const next = () => {
  seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
  return seed / 4294967296;
};
const randomF32 = (n, scale) => new Float32Array(n).map(() => (next() * 2 - 1) * scale);
function randomBf16(count) {
  const out = new Uint16Array(count);
  for (let i = 0; i < count; i++) out[i] = 0x3c00 | ((next() * 65536) & 0x83ff);
  return out;
}

const info = isa();
console.log(`# specd KDA/MoE bench — isa ${info.isa}, threads ${info.threads}, node ${process.version}`);

// ---- KDA ----------------------------------------------------------------------------------------
const shape = { heads: 32, headDim: 128 };
const C = shape.heads * shape.headDim;
const lens = kdaSlotLengths(shape);
const stateMiB = (lens.state * 4) / 2 ** 20;
const one = (T, slot = 0) => ({ seqLens: Int32Array.of(T), slots: Int32Array.of(slot) });

function kdaInputs(T) {
  return {
    qkv: randomF32(T * 3 * C, 1),
    g: new Float32Array(T * C).map(() => -0.001 - 0.5 * next() ** 2),
    beta: new Float32Array(T * shape.heads).map(() => 0.1 + 0.8 * next()),
    convWeight: randomF32(3 * C * 4, 0.5),
  };
}

function benchKdaDecode() {
  console.log(
    `\n## KDA (heads ${shape.heads}, headDim ${shape.headDim}; state ${stateMiB} MiB per sequence and layer)`,
  );
  const pools = createKdaStatePools(shape, 9);
  const rows = [];
  for (const T of [1, 4, 8, 16]) {
    const inp = kdaInputs(T);
    const out = new Float32Array(T * C);
    const snaps = createKdaSnapshots(shape, T);
    const plain = minTimeMs(() => kdaRecurrent(inp, one(T), pools, shape, { out }));
    const snap = minTimeMs(() => kdaRecurrent(inp, one(T), pools, shape, { out, snapshots: snaps }));
    rows.push([T, plain, snap]);
  }
  console.log(
    '| T (tokens, 1 sequence) | recurrent (ms) | per token (us) | state GB/s | with snapshots (ms) | snapshot bytes |',
  );
  console.log('|---:|---:|---:|---:|---:|---:|');
  for (const [T, plain, snap] of rows) {
    const gbs = (T * 2 * lens.state * 4) / plain / 1e6;
    console.log(
      `| ${T} | ${plain.toFixed(3)} | ${((plain / T) * 1000).toFixed(0)} | ${gbs.toFixed(1)} | ` +
        `${snap.toFixed(3)} | ${((T * (lens.state + lens.conv) * 4) / 2 ** 20).toFixed(1)} MiB |`,
    );
  }
  const [, t1, s1] = rows[0];
  const [, t16, s16] = rows.at(-1);
  console.log(
    `goal (KDA recurrent): t(16-token verify block) / t(1 token) ≤ 1.3: ${t16 / t1 <= 1.3 ? 'met' : 'NOT met'} ` +
      `(${(t16 / t1).toFixed(2)}; with snapshots ${(s16 / s1).toFixed(2)})`,
  );
  const snaps = createKdaSnapshots(shape, 16);
  const commit = minTimeMs(() => kdaCommitSnapshot(pools, shape, 0, snaps, 7), 20);
  console.log(`commit one snapshot (copy ${stateMiB} MiB + conv into the slot): ${commit.toFixed(3)} ms`);
  for (const n of [1, 4, 8]) {
    const inp = kdaInputs(n);
    const replay = minTimeMs(() => kdaRecurrent(inp, one(n), pools, shape));
    console.log(
      `replay n=${n} accepted tokens from the pre-verify state: ${replay.toFixed(3)} ms (+ one slot copy to restore)`,
    );
  }
  const B = 8;
  const inp = kdaInputs(B);
  const batch = { seqLens: new Int32Array(B).fill(1), slots: Int32Array.from({ length: B }, (_, i) => i) };
  const ms = minTimeMs(() => kdaRecurrent(inp, batch, pools, shape));
  console.log(
    `batched decode B=${B} x 1 token: ${ms.toFixed(3)} ms = ` +
      `${((B * 2 * lens.state * 4) / ms / 1e6).toFixed(1)} GB/s of state`,
  );
}

function benchKdaPrefill() {
  const T = quick ? 512 : 2048;
  const inp = kdaInputs(T);
  const pools = createKdaStatePools(shape, 1);
  const out = new Float32Array(T * C);
  console.log(`\nprefill of ${T} tokens (1 sequence):`);
  console.log('| kernel | ms | tokens/s |');
  console.log('|---|---:|---:|');
  const runs = [['recurrent', () => kdaRecurrent(inp, one(T), pools, shape, { out })]];
  for (const chunk of [16, 32, 64])
    runs.push([`chunked ${chunk}`, () => kdaChunked(inp, one(T), pools, shape, { out, chunk })]);
  for (const [name, fn] of runs) {
    const ms = minTimeMs(fn, quick ? 1 : 3);
    console.log(`| ${name} | ${ms.toFixed(1)} | ${((T / ms) * 1000).toFixed(0)} |`);
  }
}

// ---- MoE ----------------------------------------------------------------------------------------
function benchMoe() {
  const [D, I, K] = [2304, 1024, 8];
  const E = quick ? 16 : 64;
  console.log(
    `\n## MoE (hidden ${D}, inter ${I}, top-${K} of ${E} experts + shared ` +
      `inter ${I}; ${((3 * D * I * 2) / 2 ** 20).toFixed(1)} MiB bf16 per expert)`,
  );
  const experts = [];
  for (let e = 0; e < E; e++)
    experts.push(packMoeExpert(randomBf16(I * D), randomBf16(I * D), randomBf16(D * I), D, I));
  const shared = packMoeExpert(randomBf16(I * D), randomBf16(I * D), randomBf16(D * I), D, I);
  const set = createMoeExpertSet(experts, shared);
  console.log('| N tokens | ms | distinct experts | weights read (MiB) | GB/s | ms per token |');
  console.log('|---:|---:|---:|---:|---:|---:|');
  for (const N of [1, 4, 16, 64]) {
    const routing = moeRoute(randomF32(N * E, 3), N, E, K, 2.446);
    const x = randomF32(N * D, 1);
    const out = new Float32Array(N * D);
    const ms = minTimeMs(() => moeExperts(x, N, set, routing, out));
    const touched = new Set(routing.ids).size;
    const bytes = (touched + 1) * 3 * D * I * 2;
    console.log(
      `| ${N} | ${ms.toFixed(2)} | ${touched} | ${(bytes / 2 ** 20).toFixed(0)}` +
        ` | ${(bytes / ms / 1e6).toFixed(1)} | ${(ms / N).toFixed(3)} |`,
    );
  }
  const N = 16;
  const logits = randomF32(N * 256, 3);
  const bias = randomF32(256, 0.1);
  const ms = minTimeMs(() => moeRoute(logits, N, 256, K, 2.446, { bias }), 20);
  console.log(`router moeRoute N=${N}, 256 experts, top-${K}: ${(ms * 1000).toFixed(0)} us`);
}

/** The Kimi forward's former JavaScript gate loop (packages/model-kimi-k3 before kdaGate), for comparison. */
function jsGate(f, dtBias, negA, b, H, d) {
  const HD = H * d;
  const T = f.length / HD;
  const g = new Float32Array(T * HD);
  const beta = new Float32Array(T * H);
  const softplus = (x) => (x > 20 ? x : Math.log1p(Math.exp(x)));
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < H; h++) {
      const a = negA[h];
      for (let i = 0; i < d; i++) {
        const ch = h * d + i;
        g[t * HD + ch] = a * Math.fround(softplus(Math.fround(f[t * HD + ch] + dtBias[ch])));
      }
      beta[t * H + h] = 1 / (1 + Math.exp(-b[t * H + h]));
    }
  }
  return { g, beta };
}

function benchKdaGates() {
  console.log(
    `\n## KDA gates (heads ${shape.heads}, headDim ${shape.headDim}): ms per layer call, min of 3 x ${reps}\n`,
  );
  console.log('| T | JavaScript loop | kdaGate (native) | speed-up |');
  console.log('|---:|---:|---:|---:|');
  for (const T of [1, 16]) {
    const f = randomF32(T * C, 4);
    const dt = randomF32(C, 1);
    const negA = Float32Array.from({ length: shape.heads }, (_, h) => -(h + 1));
    const b = randomF32(T * shape.heads, 3);
    let js = Infinity;
    let nat = Infinity;
    for (let r = 0; r < 3; r++) {
      // alternated, so machine load hits both alike
      js = Math.min(
        js,
        minTimeMs(() => jsGate(f, dt, negA, b, shape.heads, shape.headDim)),
      );
      nat = Math.min(
        nat,
        minTimeMs(() => kdaGate(f, dt, negA, b, shape)),
      );
    }
    console.log(`| ${T} | ${js.toFixed(3)} | ${nat.toFixed(3)} | ${(js / nat).toFixed(1)}× |`);
  }
}

if (runKda) {
  benchKdaDecode();
  benchKdaPrefill();
  benchKdaGates();
}
if (runMoe) benchMoe();
