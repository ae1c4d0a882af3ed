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
