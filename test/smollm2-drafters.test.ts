// Issue #7, "the same tap convention, so every drafter plugin works on this target unchanged": the
// DFlash and EAGLE-3 plugins on SmolLM2-135M-Instruct (GGUF, model-llama). The drafters trained for
// SmolLM2 are not in the repo yet (they need the GPU machine), so this test builds checkpoints of the
// right geometry with random weights in a temporary folder: acceptance is near zero, but every path
// runs — load through config.json, taps from the Llama stage, context KV, propose, verify — and
// greedy output must be plain decoding's, with one target forward per verify step and every page freed.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { BUILTIN_PLUGIN_PACKAGES, SpecEngine, loadDrafter, loadTarget, writeSafetensors, type LoadedTarget, type TensorToWrite } from '@specd/core';
import { f32ToBf16 } from '@specd/native';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const GGUF_DIR = path.join(ROOT, 'models/smollm2-135m-instruct');
const HAVE = fs.existsSync(path.join(GGUF_DIR, 'SmolLM2-135M-Instruct.Q4_1.gguf'));
const D = 576;
const V = 49152;

let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648) * 2 - 1;
const bf16 = (shape: number[], scale = 0.02, fill?: number): TensorToWrite => {
  const n = shape.reduce((a, b) => a * b, 1);
  return { dtype: 'BF16', shape, data: f32ToBf16(Float32Array.from({ length: n }, () => fill ?? rand() * scale)) };
};
const ones = (n: number) => bf16([n], 0, 1);

function writeDFlash(dir: string): void {
  fs.mkdirSync(dir, { recursive: true });
  const taps = [1, 15, 27];
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify({
    architectures: ['DFlashDraftModel'], model_type: 'qwen3', hidden_size: D, num_hidden_layers: 1, num_attention_heads: 9,
    num_key_value_heads: 3, head_dim: 64, intermediate_size: 256, vocab_size: V, block_size: 8, layer_types: ['full_attention'],
    rope_theta: 100000, rms_norm_eps: 1e-5, hidden_act: 'silu', attention_bias: false, tie_word_embeddings: false,
    dflash_config: { mask_token_id: 16, target_layer_ids: taps },
  }));
  const p = 'layers.0.';
  writeSafetensors(path.join(dir, 'model.safetensors'), {
    'fc.weight': bf16([D, taps.length * D]), 'hidden_norm.weight': ones(D), 'norm.weight': ones(D),
    [`${p}input_layernorm.weight`]: ones(D), [`${p}post_attention_layernorm.weight`]: ones(D),
    [`${p}self_attn.q_proj.weight`]: bf16([576, D]), [`${p}self_attn.k_proj.weight`]: bf16([192, D]), [`${p}self_attn.v_proj.weight`]: bf16([192, D]),
    [`${p}self_attn.o_proj.weight`]: bf16([D, 576]), [`${p}self_attn.q_norm.weight`]: ones(64), [`${p}self_attn.k_norm.weight`]: ones(64),
    [`${p}mlp.gate_proj.weight`]: bf16([256, D]), [`${p}mlp.up_proj.weight`]: bf16([256, D]), [`${p}mlp.down_proj.weight`]: bf16([D, 256]),
  });
}

function writeEagle3(dir: string): void {
  fs.mkdirSync(dir, { recursive: true });
  const dv = 1024;
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify({
    architectures: ['LlamaForCausalLMEagle3'], model_type: 'llama', hidden_size: D, num_attention_heads: 9, num_key_value_heads: 3,
    head_dim: 64, intermediate_size: 256, num_hidden_layers: 1, vocab_size: V, draft_vocab_size: dv, rope_theta: 100000,
    rms_norm_eps: 1e-5, hidden_act: 'silu', tie_word_embeddings: false, eagle_config: { eagle_aux_hidden_state_layer_ids: [2, 15, 27] },
  }));
  // draft id i → target id 3·i (d2t holds the offset 2·i)
  const d2t = BigInt64Array.from({ length: dv }, (_, i) => BigInt(2 * i));
  const p = 'midlayer.';
  writeSafetensors(path.join(dir, 'model.safetensors'), {
    'fc.weight': bf16([D, 3 * D]), 'norm.weight': ones(D), 'lm_head.weight': bf16([dv, D]), d2t: { dtype: 'I64', shape: [dv], data: d2t },
    [`${p}input_layernorm.weight`]: ones(D), [`${p}hidden_norm.weight`]: ones(D), [`${p}post_attention_layernorm.weight`]: ones(D),
    [`${p}self_attn.q_proj.weight`]: bf16([576, 2 * D]), [`${p}self_attn.k_proj.weight`]: bf16([192, 2 * D]), [`${p}self_attn.v_proj.weight`]: bf16([192, 2 * D]),
    [`${p}self_attn.o_proj.weight`]: bf16([D, 576]),
    [`${p}mlp.gate_proj.weight`]: bf16([256, D]), [`${p}mlp.up_proj.weight`]: bf16([256, D]), [`${p}mlp.down_proj.weight`]: bf16([D, 256]),
  });
}

describe.skipIf(!HAVE)('drafter plugins on SmolLM2-135M-Instruct (random-weight checkpoints of its geometry)', () => {
  let tmp: string;
  let target: LoadedTarget;
  let prompts: Int32Array[];
  beforeAll(async () => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-smollm2-drafters-'));
    writeDFlash(path.join(tmp, 'dflash'));
    writeEagle3(path.join(tmp, 'eagle3'));
    target = await loadTarget(GGUF_DIR, BUILTIN_PLUGIN_PACKAGES);
    prompts = ['<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n', 'def add(a, b):\n    return']
      .map((t) => target.tokenizer.encode(t, { addSpecialTokens: false }));
  });
  afterAll(() => {
    target?.model.dispose();
    if (tmp !== undefined) fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('eagle3 with dynamic trees (top_k 2, depth 3, 6 nodes): verified in one forward per step, greedy output is plain decoding\'s', async () => {
    const dir = path.join(tmp, 'eagle3');
    const settings = { method: 'eagle3', path: dir, tree: { top_k: 2, depth: 3, total_tokens: 6 } };
    const { drafter } = await loadDrafter({ dir, method: 'eagle3', settings }, BUILTIN_PLUGIN_PACKAGES, target, 512, 2);
    try {
      expect(drafter.maxDraftTokens).toBe(6);
      // the drafter proposes trees (parents not a chain)
      const spy = drafter.propose.bind(drafter);
      let trees = 0;
      drafter.propose = (b) => {
        const out = spy(b);
        trees += out.filter((p) => p.parents !== undefined && p.parents.some((v, j) => v !== j - 1)).length;
        return out;
      };
      const reqs = () => prompts.map((ids, i) => ({ id: i, promptIds: ids, maxTokens: 20, sampling: { temperature: 0 }, seed: 0, ignoreEos: true }));
      const plain = new SpecEngine(target.model, undefined, { maxSequences: 2, maxTokensPerSequence: 512 }).run(reqs());
      const e = new SpecEngine(target.model, drafter, { maxSequences: 2, maxTokensPerSequence: 512, draftPolicy: 'max' });
      const spec = e.run(reqs());
      for (const r of spec) expect(r.tokenIds).toEqual(plain.find((p) => p.id === r.id)!.tokenIds);
      expect(trees).toBeGreaterThan(0);
      expect(e.metrics.decodeForwards).toBe(e.metrics.verifyForwards);
      expect(e.cache.pagesInUse + e.cache.slotsInUse + drafter.pagesInUse).toBe(0);
    } finally {
      drafter.dispose();
    }
  });

  it.each(['dflash', 'eagle3'])('%s: greedy output is plain decoding\'s; drafts made, one target forward per verify step, pages freed', async (method) => {
    const { drafter } = await loadDrafter(path.join(tmp, method), BUILTIN_PLUGIN_PACKAGES, target, 512, 2);
    try {
      expect(drafter.method).toBe(method);
      const reqs = () => prompts.map((ids, i) => ({ id: i, promptIds: ids, maxTokens: 24, sampling: { temperature: 0 }, seed: 0, ignoreEos: true }));
      const plain = new SpecEngine(target.model, undefined, { maxSequences: 2, maxTokensPerSequence: 512 }).run(reqs());
      const e = new SpecEngine(target.model, drafter, { maxSequences: 2, maxTokensPerSequence: 512, draftPolicy: 'max' });
      const spec = e.run(reqs());
      for (const r of spec) expect(r.tokenIds, `request ${String(r.id)}`).toEqual(plain.find((p) => p.id === r.id)!.tokenIds);
      expect(e.metrics.drafted).toBeGreaterThan(0);
      expect(e.metrics.decodeForwards).toBe(e.metrics.verifyForwards);
      expect(e.cache.pagesInUse + e.cache.slotsInUse + drafter.pagesInUse).toBe(0);
    } finally {
      drafter.dispose();
    }
  });
});
