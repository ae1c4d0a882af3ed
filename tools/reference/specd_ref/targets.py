"""The shipped target's size and the data pipeline shared by the training stages."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .kimi import KimiConfig

DOMAINS = ["brown", "nlp", "sotu", "code"]
EOS_ID, MASK_ID, PAD_ID = 0, 1, 2


def tiny_config() -> KimiConfig:
    """kimi-k3-tiny: 8 layers (KDA ×6, MLA at 1-based 4 and 8), 8 experts top-2 + 1 shared."""
    return KimiConfig(
        vocab_size=8192, hidden_size=256, num_hidden_layers=8, intermediate_size=768,
        num_attention_heads=4, kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32,
        v_head_dim=64, kda_layers=[1, 2, 3, 5, 6, 7], full_attn_layers=[4, 8], kda_num_heads=4,
        kda_head_dim=64, short_conv_kernel_size=4, num_experts=8, num_experts_per_token=2,
        num_shared_experts=1, moe_intermediate_size=128, first_k_dense_replace=1,
        routed_scaling_factor=2.0, rms_norm_eps=1e-5)


class TokenData:
    """uint16 token streams per domain and split (written by data.py encode)."""

    def __init__(self, data_dir: Path, split: str):
        self.streams = {d: np.fromfile(data_dir / f"{d}.{split}.u16", dtype=np.uint16) for d in DOMAINS}
        sizes = np.array([len(self.streams[d]) for d in DOMAINS], dtype=np.float64)
        self.weights = sizes / sizes.sum()

    def batch(self, rng: np.random.Generator, batch: int, length: int) -> torch.Tensor:
        """Random windows [batch, length] int64, domains drawn in proportion to their size."""
        doms = rng.choice(len(DOMAINS), size=batch, p=self.weights)
        rows = []
        for d in doms:
            s = self.streams[DOMAINS[d]]
            i = int(rng.integers(0, len(s) - length))
            rows.append(s[i:i + length].astype(np.int64))
        return torch.from_numpy(np.stack(rows))

    def windows(self, domain: str, length: int, max_windows: int) -> torch.Tensor:
        """Consecutive non-overlapping windows of one domain (held-out evaluation)."""
        s = self.streams[domain]
        n = min(max_windows, len(s) // length)
        return torch.from_numpy(s[: n * length].astype(np.int64).reshape(n, length))
