"""CPU checks of specd_ref/llama.py against independent references (SmolLM2-135M-Instruct GGUF).

  PYTHONPATH=. .venv/bin/python check_llama.py --gguf PATH [--transformers /tmp/tfsite]

1. the numpy GGUF reader (gguf_io) == the pip `gguf` package's dequantize, every tensor bit for bit;
2. HF-order weights + rotate_half RoPE == GGUF-order weights + interleaved (adjacent-pair) RoPE;
3. tokenizer built from GGUF metadata == transformers' GGUF tokenizer on corpus text (if available);
4. logits == transformers' LlamaForCausalLM.from_pretrained(dir, gguf_file=...) (rel. err ≤ 1e-3),
   hidden states == output_hidden_states (tap convention);
5. greedy continuations of ChatML prompts (printed: should be fluent English).
--transformers DIR is put on sys.path (an older transformers with GGUF support, e.g. 4.45.2, installed
with `pip install --target DIR --no-deps transformers==4.45.2 tokenizers==0.20.3 huggingface-hub==0.36.2
regex` so the venv keeps its own tokenizers).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from specd_ref.gguf_io import read_gguf
from specd_ref.llama import (LlamaConfig, chatml, generate, hf_state_from_gguf, load_gguf,
                             tokenizer_from_gguf_meta)


def interleaved_forward(model, tensors, c: LlamaConfig, ids):
    """Forward with GGUF-order q/k rows and GPT-J (adjacent pairs) RoPE; final hidden → logits."""
    import torch.nn.functional as F
    T = ids.shape[1]
    pos = torch.arange(T).float()
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))
    ang = pos[:, None] * inv[None]                       # [T, hd/2]
    cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]

    def rope_gptj(x):                                    # x [B,T,h,d], pairs (2i, 2i+1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2)

    h = model.model.embed_tokens(ids)
    for i, layer in enumerate(model.model.layers):
        at = layer.self_attn
        x = layer.input_layernorm(h)
        wq = torch.from_numpy(tensors[f"blk.{i}.attn_q.weight"])
        wk = torch.from_numpy(tensors[f"blk.{i}.attn_k.weight"])
        q = rope_gptj((x @ wq.t()).view(1, T, at.H, at.hd))
        k = rope_gptj((x @ wk.t()).view(1, T, at.KV, at.hd))
        v = at.v_proj(x).view(1, T, at.KV, at.hd)
        rep = at.H // at.KV
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
        att = torch.einsum("bqhd,bkhd->bhqk", q, k) * at.hd ** -0.5
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
        o = torch.einsum("bhqk,bkhd->bqhd", att, v).reshape(1, T, -1)
        h = h + at.o_proj(o)
        xm = layer.post_attention_layernorm(h)
        h = h + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(xm)) * layer.mlp.up_proj(xm))
    return model.lm_head(model.model.norm(h)).float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--transformers", help="extra sys.path entry holding transformers (GGUF support)")
    ap.add_argument("--corpus", type=Path, default=Path("work/corpus"))
    ap.add_argument("--new-tokens", type=int, default=40)
    a = ap.parse_args()
    torch.manual_seed(0)
    report = {}

    t0 = time.time()
    meta_n, ten_n = read_gguf(a.gguf, use_pip=False)
    t1 = time.time()
    try:
        meta_p, ten_p = read_gguf(a.gguf, use_pip=True)
        same = all(np.array_equal(ten_n[k], ten_p[k]) for k in ten_p) and set(ten_n) == set(ten_p)
        report["numpy_reader_equals_pip_gguf"] = bool(same)
        print(f"1. numpy reader ({t1 - t0:.1f}s) vs pip gguf ({time.time() - t1:.1f}s): "
              f"{len(ten_p)} tensors bit-identical: {same}")
        assert same
        assert list(meta_n["tokenizer.ggml.tokens"]) == list(meta_p["tokenizer.ggml.tokens"])
    except ImportError:
        print("1. pip gguf not installed: skipped")
    c = LlamaConfig.from_gguf_meta(meta_n)
    print("   config:", c)
    model, _ = load_gguf(a.gguf, use_pip=False)
    tok = tokenizer_from_gguf_meta(meta_n)

    # 2. interleaved RoPE on GGUF-order weights == rotate_half on un-permuted weights
    ids = torch.tensor([tok.encode(chatml([{"role": "user", "content": "What is the capital of France?"}])).ids])
    with torch.no_grad():
        ref, hidden, _ = model(ids)
        alt = interleaved_forward(model, ten_n, c, ids)
    err = ((ref - alt).abs().max() / ref.abs().max()).item()
    report["interleaved_vs_neox_rel_err"] = err
    print(f"2. GGUF-order + interleaved RoPE vs HF-order + rotate_half: max rel err {err:.2e}")
    assert err < 1e-4

    texts = []
    for d in ("brown", "nlp", "sotu", "code"):
        with open(a.corpus / f"{d}.heldout.jsonl") as f:
            for i, line in enumerate(f):
                if i >= 3:
                    break
                texts.append(json.loads(line)["text"][:3000])
    texts += ["Hello world! 12345 numbers 3.14159 and   spaces\n\n\ttabs", "<|im_start|>user\nhi<|im_end|>\n",
              "émigré naïve café — “quotes” 日本語 🙂"]

    if a.transformers:
        sys.path.insert(0, a.transformers)
    try:
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
        p = Path(a.gguf)
        ht = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        bad = 0
        n = 0
        for t in texts:
            x = tok.encode(t).ids
            y = ht(t, add_special_tokens=False)["input_ids"]
            n += len(x)
            bad += x != y
        report["tokenizer_texts_differing_from_transformers"] = bad
        print(f"3. tokenizer vs transformers {transformers.__version__} GGUF tokenizer: {len(texts)} texts, "
              f"{n} tokens, {bad} texts differ")
        hm = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, torch_dtype=torch.float32)
        hm.eval()
        if "output.weight" not in ten_n:  # transformers 4.45 leaves a tied GGUF's lm_head random: tie it
            hm.lm_head.weight = hm.model.embed_tokens.weight
        errs, herrs = [], []
        for t in [texts[0][:600], texts[-4][:600], chatml([{"role": "user", "content": "Write a haiku about the sea."}])]:
            x = torch.tensor([tok.encode(t).ids])
            with torch.no_grad():
                lo, hs, _ = model(x)
                ho = hm(x, output_hidden_states=True)
            errs.append(((lo - ho.logits).abs().max() / ho.logits.abs().max()).item())
            # HF's last hidden state is after the final norm; compare taps 0..L-1 and norm(tap L)
            he = [((hs[i] - ho.hidden_states[i]).abs().max() / ho.hidden_states[i].abs().max()).item()
                  for i in range(c.num_hidden_layers)]
            he.append(((model.model.norm(hs[-1]) - ho.hidden_states[-1]).abs().max()
                       / ho.hidden_states[-1].abs().max()).item())
            herrs.append(max(he))
        report["logits_max_rel_err_vs_transformers"] = max(errs)
        report["hidden_max_rel_err_vs_transformers"] = max(herrs)
        print(f"4. logits vs transformers: max rel err {max(errs):.2e} (hidden {max(herrs):.2e}) over {len(errs)} prompts")
        assert max(errs) <= 1e-3
    except ImportError as e:
        print(f"3./4. transformers not available ({e}): skipped")

    # 5. greedy ChatML continuations
    qs = ["What is the capital of France?", "Write a short poem about autumn leaves.",
          "Explain what a hash table is in two sentences."]
    prompts = [tok.encode(chatml([{"role": "user", "content": q}])).ids for q in qs]
    t0 = time.time()
    outs = generate(model, prompts, a.new_tokens)
    dt = time.time() - t0
    for q, o in zip(qs, outs):
        print(f"5. Q: {q}\n   A: {tok.decode(o)!r}")
    # batched (left-padded) generation == one prompt at a time
    solo = generate(model, prompts[1:2], a.new_tokens)[0]
    report["batched_equals_single"] = solo == outs[1]
    print(f"   batched {len(qs)}×{a.new_tokens} tokens in {dt:.1f}s; left-padded batch == single: {solo == outs[1]}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
