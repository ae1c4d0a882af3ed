// The benches' machine probes: AMX from /proc/cpuinfo, and the C probes of bench/ (read-bw.c, dot-rate.c)
// compiled for this machine on demand. Shared by bench/peer.mjs and bench/verify-dense.mjs.
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const BENCH = path.dirname(fileURLToPath(import.meta.url));

/**
 * Compiles bench/`name`.c with `cc -O2 -march=native -pthread` into `dir`/`name` when the binary is missing or
 * older than its source. @returns the binary's path. @throws the compiler's error (no `cc`, a failed build).
 */
export function compileProbe(name, dir) {
  const src = path.join(BENCH, `${name}.c`);
  const bin = path.join(dir, name);
  fs.mkdirSync(dir, { recursive: true });
  if (!fs.existsSync(bin) || fs.statSync(bin).mtimeMs < fs.statSync(src).mtimeMs)
    execFileSync('cc', ['-O2', '-march=native', '-pthread', '-o', bin, src], { stdio: 'inherit' });
  return bin;
}

/**
 * Peak dot-product rates from registers (bench/dot-rate.c, compiled into `dir`) on `threads` threads, each issued for
 * `seconds`, the best of `runs` per key. @returns G ops/s by key (vnni_int8, avx512_bf16, amx_int8, amx_bf16,
 * avx512_f32; a multiply-add = 2 ops), null where the CPU or compiler lacks the instructions. @throws as compileProbe,
 * or the probe's failure.
 */
export function dotRates(threads, dir, { runs = 3, seconds = 0.5 } = {}) {
  const bin = compileProbe('dot-rate', dir);
  const best = {};
  for (let i = 0; i < runs; i++) {
    const r = JSON.parse(execFileSync(bin, [String(threads), String(seconds)], { encoding: 'utf8' }));
    for (const [k, v] of Object.entries(r)) best[k] = v === null ? null : Math.max(best[k] ?? 0, v);
  }
  return best;
}

/**
 * Read bandwidth of `threads` threads re-reading a buffer of `mib` MiB (bench/read-bw.c, compiled into `dir`), GB/s,
 * one run. @throws as compileProbe, or when the probe prints no rate.
 */
export function readBandwidthGBs(threads, mib, dir) {
  const bin = compileProbe('read-bw', dir);
  const out = execFileSync(bin, [String(threads), String(mib)], { encoding: 'utf8' });
  const m = /read ([\d.]+) GB\/s/.exec(out);
  if (m === null) throw new Error(`read-bw printed ${JSON.stringify(out)}`);
  return Number(m[1]);
}

/** AMX as /proc/cpuinfo lists it (amx_tile + amx_int8 or amx_bf16); false where it cannot be read. */
export function cpuHasAmx() {
  try {
    const flags =
      fs
        .readFileSync('/proc/cpuinfo', 'utf8')
        .match(/^flags\s*:(.*)$/m)?.[1]
        .split(/\s+/) ?? [];
    return flags.includes('amx_tile') && (flags.includes('amx_int8') || flags.includes('amx_bf16'));
  } catch {
    return false;
  }
}
