/**
 * Loading a Llama-family target from a GGUF file (llama.cpp's format; REFERENCE.md §10): the config
 * is synthesised from the `llama.*` metadata, tensors are read through {@link LlamaTensorSource} by
 * their Hugging Face names (mapped to GGUF names: `blk.{l}.attn_q.weight`, …), and quantized
 * projections stay quantized (@specd/native `gemmQuant` on repacked Q4_0/Q4_1/Q8_0 blocks) or are
 * dequantised to bf16 panels at load (`weights: 'bf16'`). Q/K rows in GGUF are permuted by
 * llama.cpp's converter for its adjacent-pair rotary, so the config's rope style is `'interleaved'`.
 */

import {
  CheckpointSanity,
  GgmlType,
  findNonFinite,
  type GgufFile,
  HfConfig,
  dequantize,
  dequantizeRow,
  ggmlBlockSize,
  type GgufTensorInfo,
} from '@specd/core';
import {
  f32ToBf16,
  gemmQuant,
  packBf16Weights,
  type QuantActivation,
  quantizedWeights,
  type QuantType,
} from '@specd/native';

import { parseLlamaConfig, type LlamaConfig } from './config.js';
import {
  bf16Linear,
  LlamaWeightError,
  type EmbeddingTable,
  type LinearWeights,
  type LlamaTensorSource,
} from './weights.js';

/** How quantized GGUF projections are held: as blocks (`'quant'`, default) or as bf16 panels. */
export type GgufWeightMode = 'quant' | 'bf16';

/** Hugging Face tensor name → GGUF tensor name (Llama layout). */
export function ggufTensorName(hf: string): string {
  const fixed: Record<string, string> = {
    'model.embed_tokens.weight': 'token_embd.weight',
    'model.norm.weight': 'output_norm.weight',
    'lm_head.weight': 'output.weight',
  };
  if (fixed[hf] !== undefined) return fixed[hf]!;
  const m = /^model\.layers\.(\d+)\.(.+)$/.exec(hf);
  const parts: Record<string, string> = {
    'input_layernorm.weight': 'attn_norm.weight',
    'post_attention_layernorm.weight': 'ffn_norm.weight',
    'self_attn.q_proj.weight': 'attn_q.weight',
    'self_attn.k_proj.weight': 'attn_k.weight',
    'self_attn.v_proj.weight': 'attn_v.weight',
    'self_attn.o_proj.weight': 'attn_output.weight',
    'mlp.gate_proj.weight': 'ffn_gate.weight',
    'mlp.up_proj.weight': 'ffn_up.weight',
    'mlp.down_proj.weight': 'ffn_down.weight',
  };
  if (m !== null && parts[m[2]!] !== undefined) return `blk.${m[1]}.${parts[m[2]!]}`;
  throw new LlamaWeightError(`no GGUF name for tensor ${JSON.stringify(hf)}`);
}

/**
 * The HF-style config of a GGUF file's `llama.*` metadata (names as transformers' LlamaConfig).
 * @throws {GgufError} for a missing / mistyped key; {@link LlamaWeightError} for another architecture.
 */
export function ggufLlamaConfig(g: GgufFile): HfConfig {
  const arch = g.getString('general.architecture');
  if (arch !== 'llama')
    throw new LlamaWeightError(
      `${g.file}: general.architecture is ${JSON.stringify(arch)}; the llama plugin reads "llama" GGUF files`,
    );
  const u = (k: string) => g.getU32(`llama.${k}`);
  const heads = u('attention.head_count');
  const hidden = u('embedding_length');
  const vocab = g.has('llama.vocab_size') ? u('vocab_size') : g.getStringArray('tokenizer.ggml.tokens').length;
  const obj: Record<string, unknown> = {
    model_type: 'llama',
    architectures: ['LlamaForCausalLM'],
    hidden_size: hidden,
    num_hidden_layers: u('block_count'),
    intermediate_size: u('feed_forward_length'),
    num_attention_heads: heads,
    num_key_value_heads: g.has('llama.attention.head_count_kv') ? u('attention.head_count_kv') : heads,
    head_dim: g.has('llama.rope.dimension_count') ? u('rope.dimension_count') : hidden / heads,
    rope_theta: g.has('llama.rope.freq_base') ? g.getF32('llama.rope.freq_base') : 10000,
    rms_norm_eps: g.getF32('llama.attention.layer_norm_rms_epsilon'),
    vocab_size: vocab,
    max_position_embeddings: g.has('llama.context_length') ? u('context_length') : 4096,
    tie_word_embeddings: !g.tensors().some((t) => t.name === 'output.weight'),
    hidden_act: 'silu',
  };
  if (g.has('tokenizer.ggml.bos_token_id')) obj.bos_token_id = g.getU32('tokenizer.ggml.bos_token_id');
  if (g.has('tokenizer.ggml.eos_token_id')) obj.eos_token_id = g.getU32('tokenizer.ggml.eos_token_id');
  return HfConfig.fromObject(obj, `${g.file} (GGUF metadata)`);
}

/** The typed config of a GGUF file (rope style `'interleaved'`, see the module comment). */
export function parseGgufLlamaConfig(g: GgufFile): LlamaConfig {
  return parseLlamaConfig(ggufLlamaConfig(g), 'interleaved');
}

const QUANT_OF: Partial<Record<GgmlType, QuantType>> = {
  [GgmlType.Q4_0]: 'q4_0',
  [GgmlType.Q4_1]: 'q4_1',
  [GgmlType.Q8_0]: 'q8_0',
};

/** A {@link LinearWeights} over repacked GGUF blocks (@specd/native `gemmQuant` with activations `act`). */
function quantLinear(bytes: Uint8Array, type: QuantType, n: number, k: number, act: QuantActivation): LinearWeights {
  const w = quantizedWeights(bytes, type, n, k);
  return { n, k, apply: (x, m, out) => gemmQuant(x, m, w, out, act) };
}

/** Per quantised type: bytes per block and the offsets of its f16 fields (scale d, and Q4_1's minimum m). */
const QUANT_F16_FIELDS: Partial<Record<GgmlType, readonly [number, readonly number[]]>> = {
  [GgmlType.Q4_0]: [18, [0]],
  [GgmlType.Q4_1]: [20, [0, 2]],
  [GgmlType.Q8_0]: [34, [0]],
};

/**
 * Checks a GGUF tensor `[rows, k]` for non-finite values (checkpoint sanity) and reports them through `sanity`
 * naming the tensor, the file and the first bad element: F32 / BF16 values and F16 values (exponent bits all
 * ones) directly; a Q4_0 / Q4_1 / Q8_0 block through its f16 scale and minimum, since a block's values
 * d·q (+ m) are finite exactly when those are (|q| ≤ 127).
 */
export function checkGgufFinite(sanity: CheckpointSanity, file: string, t: GgufTensorInfo, bytes: Uint8Array): void {
  const k = t.shape[t.shape.length - 1] ?? 1;
  const report = (count: number, total: number, first: number, what: string) =>
    sanity.suspect(
      'non-finite',
      t.name,
      `${file}: tensor ${JSON.stringify(t.name)} (${t.typeName}): ${count} non-finite ${what} of ${total}, ` +
        `the first at element ${first} (row ${Math.floor(first / k)})`,
    );
  if (t.type === GgmlType.F32 || t.type === GgmlType.BF16) {
    const aligned = new Uint8Array(bytes); // an aligned copy for the typed views (F32 / BF16 tensors are small here)
    const found = findNonFinite(
      t.type === GgmlType.F32 ? new Float32Array(aligned.buffer) : new Uint16Array(aligned.buffer),
    );
    if (found !== undefined)
      report(found.count, aligned.length / (t.type === GgmlType.F32 ? 4 : 2), found.first, 'values');
    return;
  }
  const [blockBytes, fields, width] =
    t.type === GgmlType.F16 ? [2, [0], 1] : [...(QUANT_F16_FIELDS[t.type] ?? [0, []]), 32];
  if (blockBytes === 0) return;
  const blocks = Math.floor(bytes.length / blockBytes);
  // block sizes and field offsets are even: 16-bit words of a 2-aligned copy (a view when already aligned)
  const even = bytes.byteOffset % 2 === 0 ? bytes : new Uint8Array(bytes);
  const words = new Uint16Array(even.buffer, even.byteOffset, even.byteLength >>> 1);
  const step = blockBytes >>> 1;
  let count = 0;
  let first = -1;
  for (let b = 0; b < blocks; b++) {
    for (const f of fields) {
      if ((words[b * step + (f >>> 1)]! & 0x7c00) !== 0x7c00) continue;
      if (count++ === 0) first = b * width;
      break;
    }
  }
  if (count > 0) report(count, blocks, first, t.type === GgmlType.F16 ? 'values' : 'block scales');
}

/**
 * A {@link LlamaTensorSource} over a GGUF file; every tensor it reads is checked for non-finite values
 * ({@link checkGgufFinite}) under `sanity` (default: refused).
 * @param mode quantized projections kept as blocks (`'quant'`) or dequantised to bf16 panels (`'bf16'`);
 *   F32/F16/BF16 projections always become bf16 panels.
 * @param act activations of the quantized projections: `'f32'` (weights dequantized on the fly),
 *   `'int8'` (activations quantized per 32-block, integer dot products; @specd/native `gemmQuant`) or
 *   `'int16'` (as int8 with 16-bit quants: two int8 dot products per block, within ~2e-4 of fp32).
 */
export function ggufSource(
  g: GgufFile,
  mode: GgufWeightMode = 'quant',
  onTensor?: (name: string) => void,
  sanity: CheckpointSanity = new CheckpointSanity(),
  act: QuantActivation = 'f32',
): LlamaTensorSource {
  const scanned = new Set<string>();
  const info = (hf: string, shape: readonly number[]): GgufTensorInfo => {
    const name = ggufTensorName(hf);
    if (!g.tensors().some((t) => t.name === name))
      throw new LlamaWeightError(`llama: ${g.file}: missing tensor ${name} (${hf})`);
    const t = g.info(name);
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      throw new LlamaWeightError(
        `llama: ${g.file}: tensor ${name} (${hf}) is [${t.shape.join(', ')}], expected [${shape.join(', ')}]`,
      );
    }
    if (!scanned.has(name)) {
      scanned.add(name);
      checkGgufFinite(sanity, g.file, t, g.tensor(name).bytes);
    }
    onTensor?.(hf);
    return t;
  };
  return {
    label: g.file,
    has: (hf) => g.tensors().some((t) => t.name === ggufTensorName(hf)),
    vector(hf, dim) {
      return Float32Array.from(dequantize(g.tensor(info(hf, [dim]).name)));
    },
    linear(names, rows, k) {
      const infos = names.map((hf, i) => info(hf, [rows[i]!, k]));
      const n = rows.reduce((a, b) => a + b, 0);
      const type = infos[0]!.type;
      const q = QUANT_OF[type];
      if (mode === 'quant' && q !== undefined && k % 32 === 0 && infos.every((t) => t.type === type)) {
        const parts = infos.map((t) => g.tensor(t.name).bytes);
        const bytes = new Uint8Array(parts.reduce((a, p) => a + p.length, 0));
        let at = 0;
        for (const p of parts) {
          bytes.set(p, at);
          at += p.length;
        }
        return quantLinear(bytes, q, n, k, act);
      }
      const bits = new Uint16Array(n * k);
      let row = 0;
      for (const t of infos) {
        bits.set(f32ToBf16(dequantize(g.tensor(t.name))), row * k);
        row += t.shape[0]!;
      }
      return bf16Linear(packBf16Weights(bits, n, k));
    },
    bf16Rows(names, rows, k) {
      const out = new Uint16Array(rows.reduce((a, b) => a + b, 0) * k);
      let at = 0;
      names.forEach((hf, i) => {
        out.set(f32ToBf16(dequantize(g.tensor(info(hf, [rows[i]!, k]).name))), at);
        at += rows[i]! * k;
      });
      return out;
    },
    embedding(hf, vocab, dim): EmbeddingTable {
      const t = info(hf, [vocab, dim]);
      const bytes = g.tensor(t.name).bytes;
      const block = ggmlBlockSize(t.type);
      if (block === undefined)
        throw new LlamaWeightError(`llama: ${g.file}: tensor ${t.name} has type ${t.typeName}, which cannot be read`);
      const rowBytes = (dim / block[0]) * block[1];
      // Rows stay encoded (Q8_0: 0.53 bytes per weight) and are decoded to f32 when looked up.
      return {
        vocab,
        dim,
        row: (id, out) => dequantizeRow(t.type, bytes.subarray(id * rowBytes, (id + 1) * rowBytes), dim, out),
      };
    },
  };
}
