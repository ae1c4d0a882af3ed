"""Regenerate the goldens under test/goldens/ on CPU (one command; ~1 minute):

  python goldens.py --models ../../models --prompts ../../test/prompts --out ../../test/goldens

For each fixed prompt, one safetensors file <name>.safetensors (fp32 unless noted) holding:
  input_ids [T] i32 · hidden.{i} [T, D] residual stream entering layer i (i = 0..L; L = after the last
  layer, before the final norm) · logits.last [min(T,8), V] · argmax [T] i32 ·
  kda.{l}.state [H, d, d] and kda.{l}.conv_{q,k,v} [C, 3] after prefill (l = 0-based layer) ·
  mla.{l}.latent [T, r] (normalised) and mla.{l}.k_pe [T, rope] ·
  moe.{l}.ids [T, k] i32, moe.{l}.weights [T, k], moe.{l}.choice_scores [T, E] (sigmoid + bias) ·
  dflash.context [T, D] (hidden_norm(fc(taps))) · dflash.layer.{j}.k / .v [T, KV, hd] (k_norm + RoPE) ·
  {dflash,dspark,eagle3}.first_proposal [n] i32 (greedy drafts for the first block after prefill, with the
  greedy first token as the bonus).
index.json lists every golden: prompt text, T, greedy continuation (64 tokens, plain decoding),
layer kinds, and the tensors' meaning. Weights are the shipped bf16 checkpoints, computed in fp32.
Prefill runs in one call with KDA chunk 32 (specd may split prefill into chunks: compare within tolerance).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eval_tau import Proposer, load_drafter, plain_greedy
from specd_ref.common import rope_cos_sin
from train_drafters import load_target_hf


def prompts_from_sets(prompt_dir: Path) -> dict[str, str]:
    prose = [json.loads(l)["prompt"] for l in open(prompt_dir / "prose.jsonl")]
    code = [json.loads(l)["prompt"] for l in open(prompt_dir / "code.jsonl")]
    return {
        "short": "The history of the",
        "sentence": "In the morning the committee met to discuss the new budget, and the chairman said that",
        "prose-long": prose[0] + prose[1] + prose[2],
        "code-long": code[0] + "\n" + code[1] + "\n" + code[2],
    }


@torch.no_grad()
def golden(target, drafters: dict, tok, text: str) -> tuple[dict, dict]:
    ids = tok.encode(text, add_special_tokens=False).ids
    x = torch.tensor(ids)[None]
    logits, hidden, caches = target(x, mode="chunked", chunk=32)
    T = len(ids)
    out = {"input_ids": torch.tensor(ids, dtype=torch.int32),
           "logits.last": logits[0, -min(T, 8):].contiguous(),
           "argmax": logits[0].argmax(-1).to(torch.int32)}
    for i, h in enumerate(hidden):
        out[f"hidden.{i}"] = h[0].contiguous()
    for l, (layer, c) in enumerate(zip(target.model.layers, caches)):
        if layer.kind == "kda":
            out[f"kda.{l}.state"] = c["state"][0].contiguous()
            for n in ("q", "k", "v"):
                out[f"kda.{l}.conv_{n}"] = c[f"conv_{n}"][0].contiguous()
        else:
            out[f"mla.{l}.latent"] = c["latent"][0].contiguous()
            out[f"mla.{l}.k_pe"] = c["k_pe"][0].contiguous()
    # router choices: rerun each MoE layer's gate on its normalised input
    for l, layer in enumerate(target.model.layers):
        if hasattr(layer, "block_sparse_moe"):
            a, _ = layer.self_attn(layer.input_layernorm(hidden[l]), None, mode="chunked", chunk=32)
            xm = layer.post_attention_layernorm(hidden[l] + a)[0]
            gate = layer.block_sparse_moe.gate
            ids_, w = gate(xm)
            scores = torch.sigmoid(xm.float() @ gate.weight.float().t()) + gate.e_score_correction_bias.float()
            out[f"moe.{l}.ids"] = ids_.to(torch.int32)
            out[f"moe.{l}.weights"] = w.contiguous()
            out[f"moe.{l}.choice_scores"] = scores.contiguous()
    first = logits[0, -1].argmax()
    tokens = torch.cat([torch.tensor(ids), first.view(1)])
    for name, d in drafters.items():
        prop = Proposer(d, target, 0.0, None, None)
        taps = torch.cat([hidden[t] for t in prop.taps], -1)
        drafts, _ = prop.propose(taps, tokens, prop.max_drafts)
        out[f"{name}.first_proposal"] = drafts.to(torch.int32)
        if name == "dflash":
            f = d.context(taps)[0]
            out["dflash.context"] = f.contiguous()
            cos, sin = rope_cos_sin(torch.arange(T), d.config.head_dim, d.config.rope_theta)
            for j, layer in enumerate(d.layers):
                k, v = layer.self_attn.kv(f[None], cos[None], sin[None])
                out[f"dflash.layer.{j}.k"] = k[0].contiguous()
                out[f"dflash.layer.{j}.v"] = v[0].contiguous()
    meta = {"T": T, "first_token": int(first),
            "greedy_continuation": plain_greedy(target, ids, 64)}
    return out, meta


def main():
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    torch.manual_seed(0)
    tdir = a.models / "kimi-k3-tiny"
    target = load_target_hf(tdir, torch.device("cpu"))
    tok = Tokenizer.from_file(str(tdir / "tokenizer.json"))
    drafters = {}
    for name in ("dflash", "dspark", "eagle3"):
        folder = a.models / f"kimi-k3-tiny-{name}"
        if (folder / "config.json").exists():
            drafters[name] = load_drafter(folder, torch.device("cpu"))
    a.out.mkdir(parents=True, exist_ok=True)
    index = {"target": "models/kimi-k3-tiny", "drafters": sorted(drafters),
             "layer_kinds": [l.kind for l in target.model.layers],
             "kda_chunk": 32, "command": "python tools/reference/goldens.py --models models "
                                         "--prompts test/prompts --out test/goldens",
             "goldens": {}}
    for name, text in prompts_from_sets(a.prompts).items():
        tensors, meta = golden(target, drafters, tok, text)
        save_file(tensors, str(a.out / f"{name}.safetensors"), metadata={"prompt": text})
        index["goldens"][name] = {"file": f"{name}.safetensors", "prompt": text, **meta}
        print(f"{name}: T={meta['T']} tensors={len(tensors)}", flush=True)
    (a.out / "index.json").write_text(json.dumps(index, indent=2) + "\n")


if __name__ == "__main__":
    main()
