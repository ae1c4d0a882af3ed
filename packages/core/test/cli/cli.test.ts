// `specd generate` end to end: JSON output against the golden greedy continuation, streaming text
// mode, config files, one-line errors with non-zero exit codes, and the installed `specd` bin.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

import { main, type CliIo } from '../../src/cli/index.js';
import { makeTempDir } from '../io/helpers.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const goldens = JSON.parse(fs.readFileSync(path.join(ROOT, 'test/goldens/index.json'), 'utf8')) as {
  goldens: Record<string, { prompt: string; greedy_continuation: number[] }>;
};
const tmp = makeTempDir('cli');
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

async function run(args: string[], tty = false): Promise<{ code: number; out: string; err: string }> {
  let out = '';
  let err = '';
  const io: CliIo = {
    stdout: { write: (s: string) => (out += s), isTTY: tty },
    stderr: { write: (s: string) => (err += s) },
    cwd: ROOT,
  };
  const code = await main(args, io);
  return { code, out, err };
}

describe('specd generate', () => {
  it('--json: greedy tokens equal the reference continuation; fields and timing', async () => {
    const g = goldens.goldens.sentence!;
    const { code, out, err } = await run([
      'generate',
      '--prompt',
      g.prompt,
      '--max-tokens',
      '24',
      '--json',
      '--ignore-eos',
    ]);
    expect(err).toBe('');
    expect(code).toBe(0);
    const lines = out.trim().split('\n');
    expect(lines.length).toBe(1);
    const r = JSON.parse(lines[0]!) as Record<string, unknown>;
    expect(r.token_ids).toEqual(g.greedy_continuation.slice(0, 24));
    expect(r.num_output_tokens).toBe(24);
    expect(r.num_prompt_tokens).toBe(18);
    expect(typeof r.text).toBe('string');
    expect(r.seconds).toBeGreaterThan(0);
    expect(r.output_tokens_per_s).toBeCloseTo(24 / (r.seconds as number), 6);
    expect(r).not.toHaveProperty('seed'); // greedy: no random number drawn, no seed reported
  });

  it.each(['dspark', 'eagle3', 'dflash'])(
    '--drafter %s with --max-tokens 1 and 3: the cost calibration ' +
      'fits the tightly sized caches; output equals --no-spec',
    async (m) => {
      for (const n of ['1', '3']) {
        const args = ['generate', '--prompt', 'Hi', '--max-tokens', n, '--json', '--ignore-eos'];
        const spec = await run([...args, '--drafter', path.join(ROOT, 'models', `kimi-k3-tiny-${m}`)]);
        expect(spec.err).toBe('');
        expect(spec.code).toBe(0);
        const plain = await run([...args, '--no-spec']);
        expect((JSON.parse(spec.out) as { token_ids: number[] }).token_ids).toEqual(
          (JSON.parse(plain.out) as { token_ids: number[] }).token_ids,
        );
      }
    },
  );

  it('a temperature below 1e-5 is greedy, as in the server (it used to divide the logits into Infinity)', async () => {
    const args = ['generate', '--prompt', 'The history of the', '--max-tokens', '12', '--json', '--no-spec'];
    const greedy = JSON.parse((await run([...args, '--temperature', '0'])).out) as { token_ids: number[] };
    const tiny = await run([...args, '--temperature', '1e-45', '--top-k', '3']);
    expect(tiny.code).toBe(0);
    expect((JSON.parse(tiny.out) as { token_ids: number[] }).token_ids).toEqual(greedy.token_ids);
  });

  it('streams text, stats on stderr (a seed only when sampling); sampling is reproducible with --seed', async () => {
    const a = await run(['generate', '--prompt', 'The history of the', '--max-tokens', '12']);
    expect(a.code).toBe(0);
    expect(a.out.length).toBeGreaterThan(1);
    // greedy (the default temperature 0): no seed
    expect(a.err).toMatch(
      /^\[\d+ tokens in [\d.]+ s, [\d.]+ tok\/s; prompt 4 tokens; dflash τ [\d.]+ over \d+ verify steps\]\n$/,
    );
    const plain = await run(['generate', '--prompt', 'The history of the', '--max-tokens', '12', '--no-spec']);
    expect(plain.err).toMatch(/^\[\d+ tokens in [\d.]+ s, [\d.]+ tok\/s; prompt 4 tokens\]\n$/);
    expect(plain.out).toBe(a.out);
    const sampled = await run(['generate', '--prompt', 'Hi', '--max-tokens', '2', '--no-spec', '--temperature', '0.8']);
    expect(sampled.err).toMatch(/^\[\d+ tokens in [\d.]+ s, [\d.]+ tok\/s; prompt \d+ tokens; seed \d+\]\n$/);
    // Sampled output is reproducible per seed for a fixed draft length; the default policy picks k
    // from measured timings, which changes how many random draws a step takes.
    const args = [
      'generate',
      '--prompt',
      'The history of the',
      '--max-tokens',
      '16',
      '--temperature',
      '0.9',
      '--top-k',
      '40',
      '--top-p',
      '0.95',
      '--seed',
      '7',
      '--json',
      '--num-draft-tokens',
      '15',
    ];
    const s1 = JSON.parse((await run(args)).out) as { token_ids: number[]; seed: number };
    const s2 = JSON.parse((await run(args)).out) as { token_ids: number[]; seed: number };
    expect(s1.token_ids).toEqual(s2.token_ids);
    expect(s1.seed).toBe(7);
    // Under the default (cost) policy, --seed marks the request seeded: it decodes plainly (k = 0),
    // so it is reproducible too — and equal to --no-spec with that seed.
    const seeded = args.slice(0, -2);
    const c1 = JSON.parse((await run(seeded)).out) as { token_ids: number[]; drafted: number };
    const c2 = JSON.parse((await run(seeded)).out) as { token_ids: number[]; drafted: number };
    expect(c1.drafted).toBe(0);
    expect(c2.token_ids).toEqual(c1.token_ids);
    expect(c1.token_ids).toHaveLength(16);
    expect((JSON.parse((await run([...seeded, '--no-spec'])).out) as { token_ids: number[] }).token_ids).toEqual(
      c1.token_ids,
    );
  });

  it(
    'speculative by default with the shipped DFlash: same ' + 'greedy tokens as --no-spec, spec fields in --json',
    async () => {
      const g = goldens.goldens.sentence!;
      const args = ['generate', '--prompt', g.prompt, '--max-tokens', '40', '--json', '--ignore-eos'];
      // The default draft policy drafts only when it pays on this machine; fix k to exercise drafting.
      const byCost = JSON.parse((await run(args)).out) as Record<string, unknown>;
      const spec = JSON.parse((await run([...args, '--num-draft-tokens', '15'])).out) as Record<string, unknown>;
      const plain = JSON.parse((await run([...args, '--no-spec'])).out) as Record<string, unknown>;
      const explicit = JSON.parse((await run([...args, '--drafter', 'models/kimi-k3-tiny-dflash'])).out) as Record<
        string,
        unknown
      >;
      expect(spec.token_ids).toEqual(plain.token_ids);
      expect(byCost.token_ids).toEqual(plain.token_ids);
      expect(byCost.method).toBe('dflash');
      expect(explicit.token_ids).toEqual(plain.token_ids);
      expect((spec.token_ids as number[]).slice(0, 40)).toEqual(g.greedy_continuation.slice(0, 40));
      expect(plain).not.toHaveProperty('drafted');
      expect(spec.method).toBe('dflash');
      expect(spec.drafted).toBeGreaterThan(0);
      expect(spec.accepted).toBeGreaterThan(0);
      expect(spec.verify_steps).toBeGreaterThan(0);
      expect(spec.acceptance_length).toBeCloseTo(1 + (spec.accepted as number) / (spec.verify_steps as number), 12);
      expect((spec.per_position_acceptance as number[]).length).toBeGreaterThan(0);
      const short = JSON.parse((await run([...args, '--num-draft-tokens', '3'])).out) as Record<string, unknown>;
      expect(short.token_ids).toEqual(plain.token_ids);
      expect((short.per_position_acceptance as number[]).length).toBeLessThanOrEqual(3);
      const bad = await run([...args, '--drafter', '/no/such/drafter']);
      expect(bad.code).toBe(1);
      expect(bad.err).toMatch(/^specd: error: drafter directory \/no\/such\/drafter has no config.json/);
      const both = await run([...args, '--drafter', 'models/kimi-k3-tiny-dflash', '--no-spec']);
      expect(both.err).toMatch(/--drafter and --no-spec cannot be used together/);
      const wrong = await run([...args, '--drafter', 'models/kimi-k3-tiny']);
      expect(wrong.err).toMatch(
        /no drafter plugin for architectures \[KimiLinearForCausalLM\]; loaded methods: dflash/,
      );
    },
  );

  it("a config whose drafter method differs from the checkpoint's plugin is refused, naming both", async () => {
    fs.writeFileSync(
      path.join(tmp, 'mismatch.json'),
      JSON.stringify({
        model: path.join(ROOT, 'models/kimi-k3-tiny'),
        drafter: { method: 'dflash', path: path.join(ROOT, 'models/kimi-k3-tiny-dspark') },
      }),
    );
    const r = await run([
      'generate',
      '--config',
      path.join(tmp, 'mismatch.json'),
      '--prompt',
      'The history of the',
      '--max-tokens',
      '2',
    ]);
    expect(r.code).toBe(1);
    expect(r.err).toMatch(
      new RegExp(
        /drafter: method "dflash", but .*kimi-k3-tiny-dspark\/config.json /.source +
          /\(architectures \[DSparkDraftModel\]\) is a "dspark" checkpoint/.source,
      ),
    );
  });

  it('reads --prompt-file and --config (flags override the file)', async () => {
    fs.writeFileSync(path.join(tmp, 'p.txt'), 'The history of the');
    fs.writeFileSync(
      path.join(tmp, 'c.json'),
      JSON.stringify({
        model: path.relative(tmp, path.join(ROOT, 'models/kimi-k3-tiny')),
        plugins: ['@specd/model-kimi-k3'],
        sampling: { max_tokens: 5, temperature: 0 },
      }),
    );
    const r = await run([
      'generate',
      '--config',
      path.join(tmp, 'c.json'),
      '--prompt-file',
      path.join(tmp, 'p.txt'),
      '--json',
      '--max-tokens',
      '6',
    ]);
    expect(r.code).toBe(0);
    expect((JSON.parse(r.out) as { token_ids: number[] }).token_ids).toEqual(
      goldens.goldens.short!.greedy_continuation.slice(0, 6),
    );
  });

  it(
    '--config takes the deployment configs: configs/*-dflash.json ' +
      'drafts, *-nospec.json does not; same greedy tokens',
    async () => {
      const args = ['generate', '--prompt', 'The history of the', '--max-tokens', '12', '--json', '--ignore-eos'];
      const spec = JSON.parse((await run([...args, '--config', 'configs/kimi-k3-tiny-dflash.json'])).out) as Record<
        string,
        unknown
      >;
      const plain = JSON.parse((await run([...args, '--config', 'configs/kimi-k3-tiny-nospec.json'])).out) as Record<
        string,
        unknown
      >;
      expect(spec.method).toBe('dflash');
      expect(plain).not.toHaveProperty('drafted');
      expect(spec.token_ids).toEqual(plain.token_ids);
      // drafter.num_draft_tokens caps the drafts per step
      fs.writeFileSync(
        path.join(tmp, 'k.json'),
        JSON.stringify({
          drafter: { method: 'dflash', path: path.join(ROOT, 'models/kimi-k3-tiny-dflash'), num_draft_tokens: 2 },
        }),
      );
      const capped = JSON.parse((await run([...args, '--config', path.join(tmp, 'k.json')])).out) as Record<
        string,
        unknown
      >;
      expect(capped.token_ids).toEqual(plain.token_ids);
      expect((capped.per_position_acceptance as number[]).length).toBeLessThanOrEqual(2);
    },
  );

  it.each([
    [
      ['generate', '--prompt', 'x', '--max-tokens', 'abc'],
      2,
      /^specd: error: option '--max-tokens <n>' argument 'abc' is invalid\. expected an integer >= 1\n$/,
    ],
    [['generate', '--prompt', 'x', '--temperature', '-1'], 2, /--temperature.*expected a number in \[0, 2\]/],
    [['generate', '--prompt', 'x', '--temperature', '2.5'], 2, /--temperature.*expected a number in \[0, 2\]/],
    [['generate', '--prompt', 'x', '--temperature', 'Infinity'], 2, /--temperature.*expected a number in \[0, 2\]/],
    [['generate', '--prompt', 'x', '--top-p', '0'], 2, /--top-p.*\(0, 1\]/],
    [['generate', '--prompt', 'x', '--bogus'], 2, /^specd: error: unknown option '--bogus'\n$/],
    [['frobnicate'], 2, /unknown command 'frobnicate'/],
    [['generate'], 1, /^specd: error: give exactly one of --prompt TEXT or --prompt-file FILE\n$/],
    [['generate', '--prompt', 'x', '--prompt-file', 'y'], 2, /cannot be used with/],
    [
      ['generate', '--prompt', 'x', '--model', '/no/such/dir'],
      1,
      /^specd: error: model \/no\/such\/dir: neither a folder with config.json nor a .gguf file/,
    ],
    [
      ['generate', '--prompt', 'x', '--model', '/no/such/smollm2-135m-instruct'],
      1,
      /run `npm run models:fetch` to fetch SmolLM2-135M-Instruct/,
    ],
    [['generate', '--prompt-file', '/no/such/file'], 1, /^specd: error: --prompt-file: cannot read/],
  ])('%j → one error line, exit %i', async (args, code, re) => {
    const r = await run(args as string[]);
    expect(r.code).toBe(code);
    expect(r.err).toMatch(re);
    expect(r.err.trim().split('\n').length).toBe(1);
    expect(r.out).toBe('');
  });

  it('config file errors name the file and the JSON path; unknown plugins are listed', async () => {
    const bad = path.join(tmp, 'bad.json');
    fs.writeFileSync(bad, JSON.stringify({ sampling: { top_p: 3 } }));
    expect((await run(['generate', '--prompt', 'x', '--config', bad])).err).toMatch(
      /bad\.json: \$\.sampling\.top_p: maximum: must be <= 1, got 3/,
    );
    fs.writeFileSync(bad, JSON.stringify({ modle: 'x' }));
    expect((await run(['generate', '--prompt', 'x', '--config', bad])).err).toMatch(
      /bad\.json: \$\.modle: additionalProperties: unknown property, got "x"/,
    );
    // the old ad-hoc "generate" section of a config is now "sampling"
    fs.writeFileSync(bad, JSON.stringify({ generate: { max_tokens: 5 } }));
    expect((await run(['generate', '--prompt', 'x', '--config', bad])).err).toMatch(
      /bad\.json: \$\.generate: additionalProperties: unknown property/,
    );
    fs.writeFileSync(bad, JSON.stringify({ plugins: [] }));
    const r = await run(['generate', '--prompt', 'x', '--config', bad]);
    expect(r.code).toBe(1);
    expect(r.err).toMatch(/no model plugin for model_type "kimi_k3" .*loaded: none/);
  });
});

describe('specd --version', () => {
  it("prints @specd/core's version and exits 0", async () => {
    const { version } = JSON.parse(fs.readFileSync(path.join(ROOT, 'packages/core/package.json'), 'utf8')) as {
      version: string;
    };
    expect(version).toMatch(/^\d+\.\d+\.\d+/);
    for (const flag of ['--version', '-V']) {
      const r = await run([flag]);
      expect(r.code).toBe(0);
      expect(r.out).toBe(`${version}\n`);
      expect(r.err).toBe('');
    }
  });
});

describe('specd generate --checkpoint-sanity', () => {
  /** kimi-k3-tiny copied to a temp folder with embedding row `row` set to bf16 NaN. */
  function nanRowCopy(row: number): string {
    const src = path.join(ROOT, 'models/kimi-k3-tiny');
    const dir = path.join(tmp, 'kimi-nan-row');
    fs.mkdirSync(dir, { recursive: true });
    for (const f of fs.readdirSync(src)) fs.copyFileSync(path.join(src, f), path.join(dir, f));
    const name = 'model.embed_tokens.weight';
    const index = JSON.parse(fs.readFileSync(path.join(dir, 'model.safetensors.index.json'), 'utf8')) as {
      weight_map: Record<string, string>;
    };
    const file = path.join(dir, index.weight_map[name] ?? '');
    const bytes = fs.readFileSync(file);
    const n = Number(bytes.readBigUInt64LE(0));
    const entry = (
      JSON.parse(bytes.subarray(8, 8 + n).toString('utf8')) as Record<
        string,
        { shape: number[]; data_offsets: number[] }
      >
    )[name]!;
    const hidden = entry.shape[1]!;
    const start = 8 + n + entry.data_offsets[0]! + row * hidden * 2;
    for (let i = 0; i < hidden; i++) bytes.writeUInt16LE(0x7fc0, start + 2 * i);
    fs.writeFileSync(file, bytes);
    return dir;
  }

  it('a NaN embedding row: refused by default naming the tensor; warn loads it with a warning line', async () => {
    const g = goldens.goldens.sentence!;
    const model = nanRowCopy(8191); // in neither the prompt nor its greedy continuation (checked below)
    const args = ['generate', '--model', model, '--no-spec', '--prompt', g.prompt, '--max-tokens', '4', '--json'];
    const refused = await run(args);
    expect(refused.code).toBe(1);
    expect(refused.err).toMatch(/^specd: error: .*tensor "model\.embed_tokens\.weight": 256 non-finite values of \d+/);
    expect(refused.err).toContain('the first NaN at element 2096896 (row 8191)');
    const warned = await run([...args, '--checkpoint-sanity', 'warn']);
    expect(warned.code).toBe(0);
    expect(warned.err).toMatch(
      /^specd: warning: .*tensor "model\.embed_tokens\.weight": 256 non-finite values.*loaded anyway/,
    );
    const r = JSON.parse(warned.out) as { token_ids: number[] };
    expect(r.token_ids).toEqual(g.greedy_continuation.slice(0, 4));
    expect(r.token_ids).not.toContain(8191);
    const bad = await run([...args, '--checkpoint-sanity', 'ignore']);
    expect(bad.code).toBe(2);
    expect(bad.err).toContain('ignore');
  });
});

describe('installed bin', () => {
  it('`specd generate` runs from the repository root through node_modules/.bin', () => {
    const bin = path.join(ROOT, 'node_modules/.bin/specd');
    const target = fs.existsSync(bin) ? bin : path.join(ROOT, 'packages/core/src/cli/bin.js');
    const r = spawnSync(
      process.execPath,
      [target, 'generate', '--prompt', 'The history of the', '--max-tokens', '4', '--json'],
      { cwd: ROOT, encoding: 'utf8' },
    );
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    expect((JSON.parse(r.stdout) as { token_ids: number[] }).token_ids).toEqual(
      goldens.goldens.short!.greedy_continuation.slice(0, 4),
    );
    const e = spawnSync(process.execPath, [target, 'generate', '--max-tokens', '0', '--prompt', 'x'], {
      cwd: ROOT,
      encoding: 'utf8',
    });
    expect(e.status).toBe(2);
    expect(e.stderr).toMatch(/^specd: error: .*--max-tokens/);
  });
});
