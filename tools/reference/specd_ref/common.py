"""Shared numerics helpers for the reference models (fp32 compute, bf16 storage)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) · w, computed in fp32. x: [..., dim]."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def linear(dim_in: int, dim_out: int) -> nn.Linear:
    return nn.Linear(dim_in, dim_out, bias=False)


def rope_cos_sin(positions: torch.Tensor, dim: int, theta: float):
    """Neox-style RoPE tables. positions: [T] int64 → cos, sin: [T, dim] fp32."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim))
    ang = positions.float()[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [..., T, heads, dim]; cos/sin: [T, dim]. Neox (rotate halves)."""
    c = cos[:, None, :].to(x.dtype)
    s = sin[:, None, :].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    rot = torch.cat([-x2, x1], dim=-1)
    return x * c + rot * s


def swiglu(gate: nn.Linear, up: nn.Linear, down: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return down(F.silu(gate(x)) * up(x))


def round_to_bf16_(module: nn.Module) -> None:
    """Round every floating parameter to bf16 precision in place (kept in fp32 storage).

    Evaluation and goldens use these bf16-rounded weights so the reference computes exactly what
    specd computes from the bf16 checkpoint. Parameters stored as fp32 in the checkpoint
    (A_log, dt_bias, e_score_correction_bias) are left untouched.
    """
    for name, p in module.named_parameters():
        if any(k in name for k in FP32_PARAMS):
            continue
        p.data.copy_(p.data.to(torch.bfloat16).float())


# Parameters kept in fp32 in the checkpoints (as in Kimi-Linear's published safetensors).
FP32_PARAMS = ("A_log", "dt_bias", "e_score_correction_bias")


def save_hf_folder(out: Path, state: dict, config: dict, max_shard_bytes: int = 15 * 2**20,
                   extra_files: dict | None = None) -> list[str]:
    """Write config.json and bf16 safetensors (sharded with an index when over max_shard_bytes)."""
    from safetensors.torch import save_file
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, v in state.items():
        v = v.detach().cpu().contiguous()
        if v.is_floating_point():
            v = v.float() if any(n in k for n in FP32_PARAMS) else v.to(torch.bfloat16)
        tensors[k] = v
    shards, cur, size = [], {}, 0
    for k in sorted(tensors):
        nb = tensors[k].numel() * tensors[k].element_size()
        if cur and size + nb > max_shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = tensors[k]
        size += nb
    shards.append(cur)
    names = []
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        names.append("model.safetensors")
    else:
        weight_map = {}
        total = 0
        for i, sh in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(sh, str(out / fname), metadata={"format": "pt"})
            names.append(fname)
            for k, v in sh.items():
                weight_map[k] = fname
                total += v.numel() * v.element_size()
        (out / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name, text in (extra_files or {}).items():
        (out / name).write_text(text)
    return names


def load_hf_state(folder: Path) -> dict:
    """Read every tensor of an HF folder (single file or sharded) as fp32 torch tensors.

    `draft_vocab_ids` (FR-Spec's reduced draft vocabulary of a DFlash/DSpark checkpoint: the ids specd's draft
    head keeps; tools/draft-vocab.mjs) is not a module weight and is skipped: the reference drafts over the whole
    vocabulary."""
    from safetensors.torch import load_file
    idx = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(idx.read_text())["weight_map"].values())) if idx.exists() \
        else ["model.safetensors"]
    state = {}
    for f in files:
        for k, v in load_file(str(folder / f)).items():
            if k == "draft_vocab_ids":
                continue
            state[k] = v.float() if v.is_floating_point() else v
    return state


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def decay_weights(n: int, gamma: float, device=None) -> torch.Tensor:
    """DFlash position-decayed loss weights exp(-(k-1)/γ) for k = 1..n."""
    k = torch.arange(1, n + 1, device=device, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def nll_to_ppl(nll: float) -> float:
    return math.exp(nll)
