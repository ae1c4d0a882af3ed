"""Goldens for the SmolLM2-135M-Instruct target and its drafters (CPU, ~1 minute):

  python goldens_smollm2.py --gguf G --dflash D --dspark S --eagle3 E --prompts smollm2/prompts --out OUT

For each fixed prompt, OUT/<name>.safetensors (fp32 unless noted):
  input_ids [T] i32 · hidden.{i} [T, D] for the taps the drafters read plus 0 and L (tap i = residual
  entering layer i; L = final pre-norm hidden) · hidden_last.{i} [min(T,4), D] for every i = 0..L (the
  per-layer check on the last positions, small enough to commit) · logits.last [min(T,2), V] · argmax [T] i32 ·
  dflash.context [T, D] (hidden_norm(fc(taps))) · dflash.layer.{j}.k / .v [T, KV, hd] (k_norm + RoPE) ·
  {dflash,dspark,eagle3}.first_proposal [n] i32 (greedy drafts for the first block after prefill, the greedy
  first token as the bonus).
OUT/index.json: prompt text, T, greedy continuation (32 tokens, plain decoding), taps stored.
The target is the GGUF dequantised to fp32 (q/k rows un-permuted to HF order); drafters are the bf16
checkpoints computed in fp32.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eval_tau import Proposer, load_drafter, plain_greedy
from specd_ref.common import rope_cos_sin
from specd_ref.llama import chatml, load_gguf, load_tokenizer


def prompts(prompt_dir: Path) -> dict[str, str]:
    chat = [json.loads(l)["prompt"] for l in open(prompt_dir / "chat.jsonl")]
    plain = [json.loads(l)["prompt"] for l in open(prompt_dir / "plain.jsonl")]
    return {
        "chat-short": chatml([{"role": "user", "content": "What is the capital of France?"}]),
        "chat-long": chat[0],
        "chat-code": next((p for p in chat if "```" in p), chat[1]),
        "plain-short": "The history of the",
        "plain-long": plain[0],
    }


@torch.no_grad()
def golden(target, drafters: dict, ids: list[int]):
    x = torch.tensor(ids)[None]
    logits, hidden, _ = target(x)
    T = len(ids)
    L = len(hidden) - 1
    taps = sorted({0, L} | {t for d in drafters.values() for t in d.config.taps})
    out = {"input_ids": torch.tensor(ids, dtype=torch.int32),
           "logits.last": logits[0, -min(T, 2):].contiguous(),
           "argmax": logits[0].argmax(-1).to(torch.int32)}
    for i in taps:
        out[f"hidden.{i}"] = hidden[i][0].contiguous()
    for i in range(L + 1):
        out[f"hidden_last.{i}"] = hidden[i][0, -min(T, 4):].clone()
    first = logits[0, -1].argmax()
    tokens = torch.cat([torch.tensor(ids), first.view(1)])
    for name, d in drafters.items():
        prop = Proposer(d, target, 0.0, None, None)
        tp = torch.cat([hidden[t] for t in prop.taps], -1)
        drafts, _ = prop.propose(tp, tokens, prop.max_drafts)
        out[f"{name}.first_proposal"] = drafts.to(torch.int32)
        if name == "dflash":
            f = d.context(tp)[0]
            out["dflash.context"] = f.contiguous()
            cos, sin = rope_cos_sin(torch.arange(T), d.config.head_dim, d.config.rope_theta)
            for j, layer in enumerate(d.layers):
                k, v = layer.self_attn.kv(f[None], cos[None], sin[None])
                out[f"dflash.layer.{j}.k"] = k[0].contiguous()
                out[f"dflash.layer.{j}.v"] = v[0].contiguous()
    meta = {"T": T, "first_token": int(first), "taps": taps,
            "greedy_continuation": plain_greedy(target, ids, 32)}
    return out, meta


def main():
    from safetensors.torch import save_file
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--dflash", type=Path)
    ap.add_argument("--dspark", type=Path)
    ap.add_argument("--eagle3", type=Path)
    ap.add_argument("--prompts", type=Path, default=Path("smollm2/prompts"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    target, _ = load_gguf(a.gguf, device=cpu)
    tok = load_tokenizer(a.gguf)
    drafters = {n: load_drafter(p, cpu) for n, p in (("dflash", a.dflash), ("dspark", a.dspark), ("eagle3", a.eagle3))
                if p and (p / "config.json").exists()}
    a.out.mkdir(parents=True, exist_ok=True)
    index = {"target": "SmolLM2-135M-Instruct.Q4_1.gguf (dequantised fp32)",
             "drafters": {n: str(p) for n, p in (("dflash", a.dflash), ("dspark", a.dspark), ("eagle3", a.eagle3))
                          if n in drafters},
             "command": "python tools/reference/goldens_smollm2.py --gguf G --dflash D --dspark S --eagle3 E --out OUT",
             "goldens": {}}
    for name, text in prompts(a.prompts).items():
        ids = tok.encode(text).ids
        tensors, meta = golden(target, drafters, ids)
        save_file(tensors, str(a.out / f"{name}.safetensors"), metadata={"prompt": text})
        props = {k: tensors[k].tolist() for k in tensors if k.endswith("first_proposal")}
        index["goldens"][name] = {"file": f"{name}.safetensors", "prompt": text, **meta, "first_proposals": props}
        print(f"{name}: T={meta['T']} first={meta['first_token']} "
              + " ".join(f"{k}={tok.decode(v)!r}" for k, v in props.items()), flush=True)
    (a.out / "index.json").write_text(json.dumps(index, indent=2) + "\n")


if __name__ == "__main__":
    main()
