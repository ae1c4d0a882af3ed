// The AMX-INT8 kernel of the int8- and int16-activation GEMM (native/src/quant_i8_amx.cc) on CPUs without AMX:
// compiled with software tiles (amx-emulated/amx_emu.h, force-included) beside the VNNI kernel, and checked bit for
// bit against it by amx-emulated/quant_amx_check.cc (every quant type, both activation widths, m = 1 … 100). On a
// machine with AMX the addon runs the real tiles and quant-int8.test.ts compares them with the GEMV; this keeps the
// kernel's logic (tile shapes, operand layout, the combination of the block sums) under test where CI runs.
// Needs a C++ compiler and a CPU with AVX-512 F/BW/DQ/VL/VNNI/VBMI and F16C (the check runs the VNNI kernel).
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const SRC = path.resolve(HERE, '../src');
const CHECK = path.join(HERE, 'amx-emulated');

const cpuFlags = (() => {
  try {
    return new Set(
      fs
        .readFileSync('/proc/cpuinfo', 'utf8')
        .match(/^flags\s*:(.*)$/m)?.[1]
        ?.trim()
        .split(/\s+/),
    );
  } catch {
    return new Set<string>();
  }
})();
const NEEDED = ['avx512f', 'avx512bw', 'avx512dq', 'avx512vl', 'avx512_vnni', 'avx512vbmi', 'f16c'];
const missing = NEEDED.filter((f) => !cpuFlags.has(f));
const compiler = ['c++', 'g++'].find((c) => {
  try {
    execFileSync(c, ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
});
const why =
  process.arch !== 'x64'
    ? `not x86-64 (${process.arch})`
    : missing.length > 0
      ? `the CPU lacks ${missing.join(', ')}`
      : compiler === undefined
        ? 'no C++ compiler (c++ or g++) on PATH'
        : undefined;

describe('the AMX quant kernel on emulated tiles', () => {
  it.skipIf(why !== undefined)(
    `equals the VNNI kernel bit for bit: int8 and int16, Q4_0 / Q4_1 / Q8_0${why ? ` (skipped: ${why})` : ''}`,
    () => {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-amx-emu-'));
      try {
        const bin = path.join(dir, 'quant_amx_check');
        // the addon's flags for these files (native/CMakeLists.txt), warnings off: GCC 12's intrinsics headers warn
        // falsely about their own undefined pass-through operands
        execFileSync(
          compiler!,
          [
            '-O2',
            '-std=c++17',
            '-w',
            ...['-mavx512f', '-mavx512bw', '-mavx512dq', '-mavx512vl', '-mavx512bf16', '-mavx512vnni'],
            ...['-mavx512vbmi', '-mfma', '-mf16c', '-ffp-contract=off'],
            `-I${SRC}`,
            '-include',
            path.join(CHECK, 'amx_emu.h'),
            path.join(CHECK, 'quant_amx_check.cc'),
            path.join(SRC, 'quant_i8_avx512.cc'),
            path.join(SRC, 'quant_i8_amx.cc'),
            '-o',
            bin,
          ],
          { stdio: 'pipe' },
        );
        const out = execFileSync(bin, { encoding: 'utf8' });
        expect(out).toContain('408 GEMMs checked (VNNI against emulated AMX tiles), 0 differ');
        expect(out).not.toContain('mismatch');
      } finally {
        fs.rmSync(dir, { recursive: true, force: true });
      }
    },
    120_000,
  );
});
