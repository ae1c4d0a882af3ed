// Loading an EAGLE-3 checkpoint: config parsing (taps as given), the speculators layout of the same
// weights (`layers.0.*` names, `transformer_layer_config`), registration under core's DRAFTER_PLUGIN
// and selection by `architectures`, `num_draft_tokens`, and the specific rejections: fc width ≠ taps ×
// hidden, taps the target does not have, hidden size mismatch, missing d2t, trees on the KDA target (an
// all-attention target accepts them), context writes without nextTokens; no PD hand-over stubs.
import 'reflect-metadata';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { container } from 'tsyringe';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import {
  DRAFTER_PLUGIN,
  DrafterError,
  DrafterRegistry,
  HfConfig,
  HfConfigError,
  SafetensorsCheckpoint,
  SafetensorsFile,
  writeSafetensors,
  type StageModel,
  type TensorToWrite,
} from '@specd/core';

import { eagle3Plugin, parseEagle3Config, register, type Eagle3Drafter } from '../src/index.js';
import { EAGLE3_DIR, GOLDENS_DIR, loadDrafter, loadTarget } from './helpers.js';

let target: StageModel;
let tmp: string;
beforeAll(() => {
  target = loadTarget();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-eagle3-'));
});
afterAll(() => {
  target.dispose();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const base = () => HfConfig.read(EAGLE3_DIR).raw as Record<string, unknown>;

/** The shipped checkpoint in vLLM's speculators layout: config.json rewritten, `midlayer.` → `layers.0.`. */
function speculatorsConfig(over: Record<string, unknown> = {}): Record<string, unknown> {
  const b = base();
  return {
    architectures: ['Eagle3Speculator'],
    speculators_model_type: 'eagle3',
    speculators_version: '0.1.0',
    draft_vocab_size: b.draft_vocab_size,
    norm_before_residual: false,
    eagle_aux_hidden_state_layer_ids: [2, 4, 5],
    transformer_layer_config: {
      model_type: 'llama',
      architectures: ['LlamaForCausalLM'],
      hidden_size: b.hidden_size,
      num_attention_heads: b.num_attention_heads,
      num_key_value_heads: b.num_key_value_heads,
      head_dim: b.head_dim,
      intermediate_size: b.intermediate_size,
      num_hidden_layers: 1,
      vocab_size: b.vocab_size,
      rms_norm_eps: b.rms_norm_eps,
      rope_theta: b.rope_theta,
      hidden_act: 'silu',
      max_position_embeddings: 4096,
      tie_word_embeddings: false,
    },
    speculators_config: {
      algorithm: 'eagle3',
      default_proposal_method: 'greedy',
      proposal_methods: [{ proposal_type: 'greedy', speculative_tokens: 6, verifier_accept_k: 1, accept_tolerance: 0 }],
      verifier: { name_or_path: 'models/kimi-k3-tiny', architectures: ['KimiLinearForCausalLM'] },
    },
    ...over,
  };
}

function writeSpeculatorsCheckpoint(dir: string, config: Record<string, unknown>): void {
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config, null, 2));
  const src = SafetensorsCheckpoint.open(EAGLE3_DIR);
  try {
    const out = new Map<string, TensorToWrite>();
    for (const name of src.names()) {
      const info = src.info(name);
      out.set(name.replace(/^midlayer\./, 'layers.0.'), {
        dtype: info.dtype,
        shape: info.shape,
        data: src.readBytes(name),
      });
    }
    writeSafetensors(path.join(dir, 'model.safetensors'), out);
  } finally {
    src.close();
  }
}

describe('EAGLE-3 config', () => {
  it('parses the shipped checkpoint; taps are eagle_aux_hidden_state_layer_ids as given', () => {
    const c = parseEagle3Config(HfConfig.read(EAGLE3_DIR));
    expect(c.layout).toBe('eagle3');
    expect(c.taps).toEqual([2, 4, 5]);
    expect(c.draftVocabSize).toBe(4096);
    expect(c.normBeforeResidual).toBe(false);
    expect(c.speculativeTokens).toBeUndefined();
  });
  it('the speculators layout of the same weights parses to the same config', () => {
    const a = parseEagle3Config(HfConfig.read(EAGLE3_DIR));
    const b = parseEagle3Config(HfConfig.fromObject(speculatorsConfig()));
    expect(b.layout).toBe('speculators');
    expect(b.speculativeTokens).toBe(6);
    const strip = ({ layout: _l, speculativeTokens: _s, ...rest }: ReturnType<typeof parseEagle3Config>) => rest;
    expect(strip(b)).toEqual(strip(a));
    // aux ids inside transformer_layer_config; vLLM's default norm_before_residual (true) when absent
    const t = speculatorsConfig();
    const inner = { ...(t.transformer_layer_config as object), eagle_aux_hidden_state_layer_ids: [2, 4, 5] };
    const { eagle_aux_hidden_state_layer_ids: _x, norm_before_residual: _y, ...rest } = t;
    const c = parseEagle3Config(HfConfig.fromObject({ ...rest, transformer_layer_config: inner }));
    expect(c.taps).toEqual([2, 4, 5]);
    expect(c.normBeforeResidual).toBe(true);
  });
  it('names the bad field', () => {
    expect(() => parseEagle3Config(HfConfig.fromObject({ ...base(), architectures: ['LlamaForCausalLM'] }))).toThrow(
      HfConfigError,
    );
    expect(() => parseEagle3Config(HfConfig.fromObject({ ...base(), eagle_config: {} }))).toThrow(
      /eagle_aux_hidden_state_layer_ids.*required/,
    );
    expect(() => parseEagle3Config(HfConfig.fromObject({ ...base(), num_hidden_layers: 2 }))).toThrow(
      /num_hidden_layers.*expected 1/,
    );
    expect(() =>
      parseEagle3Config(HfConfig.fromObject(speculatorsConfig({ speculators_model_type: 'eagle' }))),
    ).toThrow(/speculators_model_type.*expected "eagle3"/);
    expect(() => parseEagle3Config(HfConfig.fromObject(speculatorsConfig({ norm_before_fc: true })))).toThrow(
      /norm_before_fc.*not supported/,
    );
    expect(() =>
      parseEagle3Config(HfConfig.fromObject(speculatorsConfig({ transformer_layer_config: undefined }))),
    ).toThrow(/transformer_layer_config/);
  });
});

describe('EAGLE-3 registration', () => {
  it("registers under DRAFTER_PLUGIN and is selected by either layout's architectures", () => {
    const child = container.createChildContainer();
    register(child);
    const reg = DrafterRegistry.fromContainer(child);
    expect(reg.resolve(HfConfig.read(EAGLE3_DIR))).toBe(eagle3Plugin);
    expect(reg.resolve(HfConfig.fromObject(speculatorsConfig()))).toBe(eagle3Plugin);
    expect(child.resolveAll(DRAFTER_PLUGIN)).toEqual([eagle3Plugin]);
    expect(eagle3Plugin.method).toBe('eagle3');
    expect((eagle3Plugin.schema.properties as Record<string, { const?: string }>).method!.const).toBe('eagle3');
  });
});

describe('EAGLE-3 load', () => {
  it('loads the shipped checkpoint: chain of 6 by default, num_draft_tokens overrides; taps; no PD stubs', async () => {
    const d = await loadDrafter(target);
    try {
      expect(d.maxDraftTokens).toBe(6);
      expect(d.captureSetter(target.info)).toEqual([2, 4, 5]);
      expect(() => d.captureSetter({ ...target.info, numLayers: 4 })).toThrow(
        /taps \[5\] are beyond the target's 4 layers/,
      );
      expect('buildPDInput' in d || 'acceptPDInput' in d).toBe(false);
      expect(d.draftToTarget.length).toBe(4096);
    } finally {
      d.dispose();
    }
    const e = await loadDrafter(target, { settings: { method: 'eagle3', path: EAGLE3_DIR, num_draft_tokens: 3 } });
    expect(e.maxDraftTokens).toBe(3);
    e.dispose();
  });

  it('the weights setting: "bf16", "q8_0" or "q8_0_int8", anything else named', async () => {
    await expect(
      loadDrafter(target, { settings: { method: 'eagle3', path: EAGLE3_DIR, weights: 'int4' } }),
    ).rejects.toThrow(/eagle3: settings\.weights: expected "bf16" or "q8_0" or "q8_0_int8", got "int4"/);
    const d = await loadDrafter(target, { settings: { method: 'eagle3', path: EAGLE3_DIR, weights: 'bf16' } });
    d.dispose();
  });
  it('fc width ≠ taps × hidden size', async () => {
    await expect(
      loadDrafter(target, { config: { eagle_config: { eagle_aux_hidden_state_layer_ids: [2, 4] } } }),
    ).rejects.toThrow(/fc\.weight is \[256, 768\], expected \[256, 512\] \(hidden 256, taps × hidden = 2 × 256\)/);
  });
  it('taps the target does not have', async () => {
    await expect(
      loadDrafter(target, { config: { eagle_config: { eagle_aux_hidden_state_layer_ids: [2, 4, 9] } } }),
    ).rejects.toThrow(
      new RegExp(
        /eagle_aux_hidden_state_layer_ids \[2, 4, 9\] name taps \[9\] the target does not have /.source +
          /\(it has taps 0\.\.8, 8 layers\)/.source,
      ),
    );
  });
  it("a hidden size other than the target's", async () => {
    await expect(loadDrafter(target, { config: { hidden_size: 128 } })).rejects.toThrow(DrafterError);
    await expect(loadDrafter(target, { config: { hidden_size: 128 } })).rejects.toThrow(
      /hidden_size 128 differs from the target's 256/,
    );
  });
  it("a checkpoint without d2t (draft vocabulary smaller than the target's)", async () => {
    const hide = (w: SafetensorsCheckpoint) =>
      new Proxy(w, {
        get(t, p) {
          if (p === 'has') return (n: string) => n !== 'd2t' && t.has(n);
          const v = Reflect.get(t, p, t) as unknown;
          return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(t) : v;
        },
      });
    await expect(loadDrafter(target, { wrapWeights: hide })).rejects.toThrow(
      new RegExp(
        /checkpoint has no tensor "d2t" \(the draft → target vocabulary map\), /.source +
          /required since draft_vocab_size 4096 < vocab_size 8192/.source,
      ),
    );
  });
  it(
    'tree drafting on the KDA target names the KDA layers; an ' +
      'all-attention target accepts it (test/tree.test.ts drafts trees)',
    async () => {
      const tree = { method: 'eagle3', path: EAGLE3_DIR, tree: { top_k: 4, depth: 5, total_tokens: 32 } };
      await expect(loadDrafter(target, { settings: tree })).rejects.toThrow(
        'eagle3: EAGLE-3 tree drafting needs per-branch linear-attention state, which targets ' +
          'with KDA layers (layers 0, 1, 2, 4, 5, 6) do not have; use chain drafting (omit `tree`)',
      );
      const allAttention = Object.create(target, {
        info: {
          value: {
            ...target.info,
            layerKinds: target.info.layerKinds.map(() => 'mla'),
            treeVerificationBlocker: undefined,
          },
        },
        // the TreeCommit capability (this test loads a tree drafter; it never commits a tree)
        commitTreePath: { value: () => undefined },
      }) as StageModel;
      const noTreeCommit = Object.create(allAttention, { commitTreePath: { value: undefined } }) as StageModel;
      await expect(loadDrafter(noTreeCommit, { settings: tree })).rejects.toThrow(
        'eagle3: EAGLE-3 tree drafting needs a target that verifies token trees (the TreeCommit capability, ' +
          '`commitTreePath`); this target (8 layers) has none; use chain drafting (omit `tree`)',
      );
      const d = await loadDrafter(allAttention, { settings: tree });
      try {
        expect(d.maxDraftTokens).toBe(32);
        expect(d.tree).toEqual({ topK: 4, depth: 5, totalTokens: 32 });
      } finally {
        d.dispose();
      }
    },
  );
  it('context writes need nextTokens', async () => {
    const d = await loadDrafter(target);
    try {
      d.addSequence('s');
      const D = target.info.hiddenSize;
      expect(() =>
        d.writeProjectedContextKV(new Float32Array(2 * D), [{ id: 's', position: 0, numTokens: 2 }]),
      ).toThrow(/nextTokens is missing/);
      expect(() =>
        d.writeProjectedContextKV(new Float32Array(2 * D), [
          { id: 's', position: 0, numTokens: 2, nextTokens: new Int32Array(1) },
        ]),
      ).toThrow(/nextTokens: expected \[2\] i32/);
      expect(d.contextLength('s')).toBe(0);
      expect(() =>
        d.propose({
          sequences: [
            {
              id: 's',
              position: 0,
              lastToken: 1,
              maxDrafts: 1,
              history: new Int32Array(1),
              sampling: { temperature: 0 },
              rng: { next: () => 0 },
            },
          ],
        }),
      ).toThrow(/no draft context yet/);
      d.freeSequence('s');
      expect(d.pagesInUse).toBe(0);
    } finally {
      d.dispose();
    }
  });

  it('the speculators layout (layers.0.* weights) loads and drafts exactly as the EAGLE-3 layout', async () => {
    const dir = path.join(tmp, 'speculators');
    writeSpeculatorsCheckpoint(
      dir,
      speculatorsConfig({
        speculators_config: {
          ...(speculatorsConfig().speculators_config as object),
          proposal_methods: [{ proposal_type: 'greedy', speculative_tokens: 4 }],
        },
      }),
    );
    const cfg = HfConfig.read(dir);
    expect(
      DrafterRegistry.fromContainer(
        (() => {
          const c = container.createChildContainer();
          register(c);
          return c;
        })(),
      ).resolve(cfg),
    ).toBe(eagle3Plugin);
    const spec = await loadDrafter(target, { dir });
    const ref = await loadDrafter(target);
    try {
      expect(spec.config.layout).toBe('speculators');
      expect(spec.maxDraftTokens).toBe(4);
      const g = SafetensorsFile.open(path.join(GOLDENS_DIR, 'sentence.safetensors'));
      const index = JSON.parse(fs.readFileSync(path.join(GOLDENS_DIR, 'index.json'), 'utf8')) as {
        goldens: Record<string, { T: number; first_token: number }>;
      };
      const { T, first_token: first } = index.goldens.sentence!;
      const ids = g.read('input_ids').data as Int32Array;
      const next = Int32Array.from({ length: T }, (_, i) => (i + 1 < T ? ids[i + 1]! : first));
      const draft = (d: Eagle3Drafter) => {
        const sum = d.projectTargetHiddenPartial(
          new Map(d.config.taps.map((t) => [t, g.read(`hidden.${t}`).data as Float32Array])),
          T,
        );
        d.addSequence('x');
        try {
          d.writeProjectedContextKV(sum, [{ id: 'x', position: 0, numTokens: T, nextTokens: next }]);
          return Array.from(
            d.propose({
              sequences: [
                {
                  id: 'x',
                  position: T,
                  lastToken: first,
                  maxDrafts: 4,
                  history: new Int32Array(0),
                  sampling: { temperature: 0 },
                  rng: { next: () => 0 },
                },
              ],
            })[0]!.tokens,
          );
        } finally {
          d.freeSequence('x');
        }
      };
      const want = Array.from(g.read('eagle3.first_proposal').data as Int32Array).slice(0, 4);
      expect(draft(ref)).toEqual(want);
      expect(draft(spec)).toEqual(want);
      g.close();
    } finally {
      spec.dispose();
      ref.dispose();
    }
  });
});
