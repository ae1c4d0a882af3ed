// `--device cpu|cuda` on `specd generate` and `specd serve`, and the config's `device`, on a machine without a
// usable CUDA backend (CI: no GPU, @specd/native-cuda not built; a local build without a GPU fails the same way):
// `--device cuda` on a Llama target fails with one line from the CUDA loader, on kimi-k3-tiny (a plugin without a
// GPU path) with "runs on cpu only", with --tp naming --tp; the flag overrides the config; a bad value is refused
// naming the flag or the JSON path. The rows a GPU stage is sized for, and the device line, without a GPU.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, describe, expect, it } from 'vitest';

import { main, type CliIo } from '../../src/cli/index.js';
import {
  checkDeviceRows,
  DEVICE_DRAFT_TOKENS_BOUND,
  deviceLine,
  deviceMaxTokens,
  draftTokensBound,
} from '../../src/cli/device.js';
import type { Drafter } from '../../src/plugin/drafter-plugin.js';
import type { StageModel } from '../../src/plugin/model-plugin.js';
import { skipWithoutFiles } from '../../../../test/require-files.js';
import { makeTempDir } from '../io/helpers.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const SMOLLM2 = path.join(ROOT, 'models/smollm2-135m-instruct');
const SMOLLM2_GGUF = path.join(SMOLLM2, 'SmolLM2-135M-Instruct.Q4_1.gguf');
const TINY = path.join(ROOT, 'models/kimi-k3-tiny');
const tmp = makeTempDir('cli-device');
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

/**
 * What the CUDA loader says here: not built / does not load (CI, or a build whose CUDA libraries are missing), or
 * built but without a usable GPU (packages/native-cuda/index.js).
 */
const CUDA_ABSENT = /^specd: error: the CUDA backend (is not available here: |found no usable GPU: )/;

async function run(args: string[]): Promise<{ code: number; out: string; err: string }> {
  let out = '';
  let err = '';
  const io: CliIo = {
    stdout: { write: (s: string) => (out += s), isTTY: false },
    stderr: { write: (s: string) => (err += s) },
    cwd: ROOT,
  };
  const code = await main(args, io);
  return { code, out, err };
}

/** The error lines of a failed run: exactly one `specd: error:` line and no stack trace. */
function errorLine(err: string): string {
  const lines = err.trimEnd().split('\n');
  const errors = lines.filter((l) => l.startsWith('specd: error:'));
  expect(errors).toHaveLength(1);
  expect(err).not.toMatch(/^\s+at /m); // no stack frame
  return errors[0]!;
}

describe.skipIf(skipWithoutFiles('specd --device cuda on SmolLM2', [SMOLLM2_GGUF]))(
  '--device cuda on a Llama target without a usable CUDA backend',
  () => {
    it('generate: exit 1 and one line from the CUDA loader; the CPU path still works afterwards', async () => {
      const args = ['generate', '--model', SMOLLM2, '--prompt', 'The history of the', '--max-tokens', '2'];
      for (const extra of [['--no-spec'], ['--drafter', path.join(ROOT, 'models/smollm2-135m-instruct-dflash')]]) {
        const r = await run([...args, ...extra, '--device', 'cuda']);
        expect(r.code).toBe(1);
        expect(r.out).toBe('');
        expect(r.err.trim().split('\n')).toHaveLength(1);
        expect(errorLine(r.err)).toMatch(CUDA_ABSENT);
      }
      const cpu = await run([...args, '--no-spec', '--device', 'cpu', '--json']);
      expect(cpu.err).toBe('');
      expect(cpu.code).toBe(0);
      expect((JSON.parse(cpu.out) as { num_output_tokens: number }).num_output_tokens).toBeGreaterThan(0);
    });

    it('serve: the stage line names the device, then exit 1 and one error line', async () => {
      const r = await run([
        'serve',
        '--model',
        SMOLLM2,
        '--no-spec',
        '--port',
        '0',
        '--log-level',
        'silent',
        '--device',
        'cuda',
      ]);
      expect(r.code).toBe(1);
      expect(r.err).toContain(`specd: loading target ${SMOLLM2} (tp 1, pp 1, device cuda)\n`);
      expect(errorLine(r.err)).toMatch(CUDA_ABSENT);
      expect(r.err.trimEnd().split('\n').at(-1)).toMatch(CUDA_ABSENT);
    });

    it('the config\'s "device" is used, and --device overrides it', async () => {
      const config = path.join(tmp, 'smollm2-cuda.json');
      fs.writeFileSync(config, JSON.stringify({ model: SMOLLM2, device: 'cuda', drafter: { method: 'none' } }));
      const args = ['generate', '--config', config, '--prompt', 'Hi', '--max-tokens', '1', '--json'];
      const fromConfig = await run(args);
      expect(fromConfig.code).toBe(1);
      expect(errorLine(fromConfig.err)).toMatch(CUDA_ABSENT);
      const overridden = await run([...args, '--device', 'cpu']);
      expect(overridden.err).toBe('');
      expect(overridden.code).toBe(0);
    });
  },
);

describe('--device refusals before any GPU is touched', () => {
  it('kimi-k3-tiny (a plugin without a GPU path): "runs on cpu only", generate and serve', async () => {
    const g = await run(['generate', '--model', TINY, '--no-spec', '--prompt', 'x', '--device', 'cuda']);
    expect(g.code).toBe(1);
    expect(g.out).toBe('');
    expect(g.err).toBe('specd: error: model plugin kimi-k3 runs on cpu only: --device cuda is not available for it\n');
    const s = await run([
      'serve',
      '--model',
      TINY,
      '--no-spec',
      '--port',
      '0',
      '--log-level',
      'silent',
      '--device',
      'cuda',
    ]);
    expect(s.code).toBe(1);
    expect(errorLine(s.err)).toBe(
      'specd: error: model plugin kimi-k3 runs on cpu only: --device cuda is not available for it',
    );
  });

  it('--device cuda with --tp 2 or --pp 2: refused naming --tp and --pp', async () => {
    for (const par of [
      ['--tp', '2'],
      ['--pp', '2'],
    ]) {
      const r = await run(['generate', '--model', SMOLLM2, '--no-spec', '--prompt', 'x', '--device', 'cuda', ...par]);
      expect(r.code).toBe(1);
      expect(r.err).toBe(
        'specd: error: --device cuda runs the whole model on one GPU: --tp and --pp are not available with it yet\n',
      );
    }
    const s = await run(['serve', '--model', TINY, '--no-spec', '--port', '0', '--device', 'cuda', '--tp', '2']);
    expect(s.code).toBe(1);
    expect(errorLine(s.err)).toMatch(/--device cuda runs the whole model on one GPU: --tp and --pp are not available/);
  });

  it('serve --device cuda with a PD role: refused before loading', async () => {
    const r = await run(['serve', '--model', SMOLLM2, '--role', 'decode', '--port', '0', '--device', 'cuda']);
    expect(r.code).toBe(1);
    expect(r.err).toBe(
      'specd: error: --device cuda: prefill/decode disaggregation (--role / pd.role decode) is not available with ' +
        'it yet (the KV stays on the GPU)\n',
    );
  });

  it('a device other than cpu or cuda: a usage error naming the flag (exit 2), or the config path', async () => {
    for (const args of [
      ['generate', '--prompt', 'x'],
      ['serve', '--port', '0'],
    ]) {
      const r = await run([...args, '--device', 'tpu']);
      expect(r.code).toBe(2);
      expect(r.err).toBe(
        "specd: error: option '--device <device>' argument 'tpu' is invalid. Allowed choices are cpu, cuda.\n",
      );
    }
    const bad = path.join(tmp, 'tpu.json');
    fs.writeFileSync(bad, JSON.stringify({ device: 'tpu' }));
    const r = await run(['generate', '--prompt', 'x', '--config', bad]);
    expect(r.code).toBe(1);
    expect(r.err).toBe(`specd: error: ${bad}: $.device: enum: must be one of ["cpu","cuda"], got "tpu"\n`);
  });

  it('`specd config schema` lists device (enum cpu|cuda, default cpu); validate fills it in', async () => {
    const schema = JSON.parse((await run(['config', 'schema'])).out) as {
      properties: Record<string, { enum?: string[]; default?: unknown; description?: string }>;
    };
    expect(schema.properties.device).toMatchObject({ enum: ['cpu', 'cuda'], default: 'cpu' });
    expect(schema.properties.device!.description).toMatch(/--device/);
    const file = path.join(tmp, 'empty.json');
    fs.writeFileSync(file, '{}');
    expect((JSON.parse((await run(['config', 'validate', file])).out) as { device: string }).device).toBe('cpu');
    fs.writeFileSync(file, '{"device": "cuda"}');
    expect((JSON.parse((await run(['config', 'validate', file])).out) as { device: string }).device).toBe('cuda');
  });
});

describe('the rows a GPU stage is sized for', () => {
  it('max(2048, prefill chunk, sequences × (drafts + 1)); drafts: 0, the fixed length, else the bound', () => {
    expect(draftTokensBound(false, 7)).toBe(0);
    expect(draftTokensBound(true, 3)).toBe(3);
    expect(draftTokensBound(true, undefined)).toBe(DEVICE_DRAFT_TOKENS_BOUND);
    expect(deviceMaxTokens({ prefillChunk: 64, maxSequences: 1, draftTokens: 32 })).toBe(2048);
    expect(deviceMaxTokens({ prefillChunk: 4096, maxSequences: 8, draftTokens: 15 })).toBe(4096);
    expect(deviceMaxTokens({ prefillChunk: 128, maxSequences: 256, draftTokens: 32 })).toBe(256 * 33);
  });

  it('a drafter that drafts past the rows is refused naming --num-draft-tokens and how many fit', () => {
    const drafter = { method: 'wide', maxDraftTokens: 300 } as unknown as Drafter;
    expect(() => checkDeviceRows('cuda', 2048, 8, drafter, 255)).not.toThrow(); // 8 × 256 = 2048
    expect(() => checkDeviceRows('cuda', 2048, 8, drafter, undefined)).toThrow(
      '--device cuda: the wide drafter drafts up to 300 tokens a step: 8 sequences × 301 rows = 2408 rows, more ' +
        "than the 2048 the device's activations were sized for; fix the draft length with --num-draft-tokens " +
        '(at most 255 here)',
    );
  });

  it('the device line: describe() of a stage that has it, on a device other than cpu', () => {
    const plain = {} as StageModel;
    const gpu = { describe: () => 'cuda: a GPU' } as unknown as StageModel;
    expect(deviceLine('cuda', plain)).toBeUndefined();
    expect(deviceLine('cpu', gpu)).toBeUndefined();
    expect(deviceLine('cuda', gpu)).toBe('cuda: a GPU');
  });
});
