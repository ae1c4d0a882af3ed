"""DFlash (block-diffusion drafter, z-lab/dflash, arXiv 2602.06036) and DSpark (DeepSpec) drafters.

Checkpoint format (z-lab): config.json with architectures ["DFlashDraftModel"], block_size,
dflash_config {mask_token_id, target_layer_ids}, num_hidden_layers, num_attention_heads,
num_key_value_heads, head_dim, layer_types (full_attention | sliding_attention), sliding_window,
rope_theta. Weights: fc, hidden_norm, norm, layers.N.{input_layernorm, post_attention_layernorm,
self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, mlp.{gate,up,down}_proj}. No embedding or lm_head:
the target's are used (REFERENCE.md §3).

Semantics pinned here:
- Taps: target_layer_ids k mean "output of layer k" → tap k+1 (REFERENCE.md §2).
- Context features f = hidden_norm(fc(concat taps)) [T, D]; per draft layer K = k_norm(k_proj(f)),
  V = v_proj(f), RoPE (neox) at the context's absolute positions. No input_layernorm on f.
- Block: [last verified token, MASK × (B−1)] at positions p..p+B−1, embedded with the target's
  embedding. Full-attention layers: bidirectional over context (< p) + block. Sliding layers:
  causal inside the block, keys within `sliding_window` positions of the query.
- DFlash: block slot j (1..B−1) predicts the token at its own position p+j → B−1 draft tokens.
- DSpark (weights names: markov_head.embed [V, r] = W1, markov_head.proj [V, r] = W2,
  confidence_head [1, D + r] + bias): slot j (0..B−1) predicts the NEXT token, at p+j+1 (anchor
  slot plus noise slots, each predicting the next token) → B draft tokens. Drafts are made left to
  right: logits_j = lm_head(h_j) + W2 · W1[x_{j}] where x_j is the token at position p+j (the anchor
  for j = 0, else the previous draft); confidence_j = sigmoid(w·[h_j; W1[x_j]] + b).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .common import RMSNorm, apply_rope, linear, rope_cos_sin


@dataclass
class DFlashConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    layer_types: list[str]
    sliding_window: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    method: str = "dflash"       # "dflash" | "dspark"
    markov_rank: int = 0         # DSpark only

    @property
    def taps(self) -> list[int]:
        """Tap ids in the pinned convention (residual stream entering layer i)."""
        return [k + 1 for k in self.target_layer_ids]

    def to_hf(self) -> dict:
        cfg = {
            "architectures": ["DSparkDraftModel" if self.method == "dspark" else "DFlashDraftModel"],
            "model_type": "qwen3", "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size, "vocab_size": self.vocab_size,
            "block_size": self.block_size, "layer_types": self.layer_types,
            "sliding_window": self.sliding_window, "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps, "hidden_act": "silu", "attention_bias": False,
            "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "dflash_config": {"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids},
        }
        if self.method == "dspark":
            cfg["dspark_config"] = {"markov_rank": self.markov_rank, "confidence_head": True,
                                    "slot_semantics": "next_token"}
        return cfg

    @staticmethod
    def from_hf(c: dict) -> "DFlashConfig":
        arch = c["architectures"][0]
        if arch not in ("DFlashDraftModel", "DSparkDraftModel"):
            raise ValueError(f"not a DFlash/DSpark checkpoint: architectures {c['architectures']}")
        n = c["num_hidden_layers"]
        return DFlashConfig(
            hidden_size=c["hidden_size"], num_hidden_layers=n, num_attention_heads=c["num_attention_heads"],
            num_key_value_heads=c["num_key_value_heads"], head_dim=c["head_dim"],
            intermediate_size=c["intermediate_size"], vocab_size=c["vocab_size"], block_size=c["block_size"],
            mask_token_id=c["dflash_config"]["mask_token_id"],
            target_layer_ids=list(c["dflash_config"]["target_layer_ids"]),
            layer_types=list(c.get("layer_types") or ["full_attention"] * n),
            sliding_window=c.get("sliding_window") or 0, rope_theta=c.get("rope_theta", 10000.0),
            rms_norm_eps=c.get("rms_norm_eps", 1e-6),
            method="dspark" if arch == "DSparkDraftModel" else "dflash",
            markov_rank=(c.get("dspark_config") or {}).get("markov_rank", 0))


class DraftAttention(nn.Module):
    def __init__(self, c: DFlashConfig, sliding: bool):
        super().__init__()
        self.H, self.KV, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = linear(c.hidden_size, self.H * self.hd)
        self.k_proj = linear(c.hidden_size, self.KV * self.hd)
        self.v_proj = linear(c.hidden_size, self.KV * self.hd)
        self.o_proj = linear(self.H * self.hd, c.hidden_size)
        self.q_norm = RMSNorm(self.hd, c.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, c.rms_norm_eps)
        self.sliding = sliding

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """K, V for inputs x [B, S, D] at positions with tables cos/sin [B, S, hd] → [B, S, KV, hd] each."""
        B, S, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, S, self.KV, self.hd))
        v = self.v_proj(x).view(B, S, self.KV, self.hd)
        return _rope_b(k, cos, sin), v


def _rope_b(x, cos, sin):
    """x [B, S, heads, hd]; cos/sin [B, S, hd]."""
    c, s = cos[:, :, None, :].to(x.dtype), sin[:, :, None, :].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * c + torch.cat([-x2, x1], dim=-1) * s


class DraftLayer(nn.Module):
    def __init__(self, c: DFlashConfig, i: int):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DraftAttention(c, c.layer_types[i] == "sliding_attention")
        self.mlp = nn.Module()
        self.mlp.gate_proj = linear(c.hidden_size, c.intermediate_size)
        self.mlp.up_proj = linear(c.hidden_size, c.intermediate_size)
        self.mlp.down_proj = linear(c.intermediate_size, c.hidden_size)


class MarkovHead(nn.Module):
    def __init__(self, V: int, r: int):
        super().__init__()
        self.embed = nn.Embedding(V, r)
        self.proj = linear(r, V)


class DFlashDraft(nn.Module):
    """DFlash / DSpark draft model. Uses the target's embed_tokens and lm_head (passed in)."""

    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.config = c
        D = c.hidden_size
        self.fc = linear(len(c.target_layer_ids) * D, D)
        self.hidden_norm = RMSNorm(D, c.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(c, i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(D, c.rms_norm_eps)
        if c.method == "dspark":
            self.markov_head = MarkovHead(c.vocab_size, c.markov_rank)
            self.confidence_head = nn.Linear(D + c.markov_rank, 1)

    def init_weights(self, std=0.02):
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=std)
        if self.config.method == "dspark":
            nn.init.zeros_(self.markov_head.proj.weight)
            nn.init.zeros_(self.confidence_head.bias)

    def context(self, taps: torch.Tensor) -> torch.Tensor:
        """taps: [B, T, n_taps·D] (concat in target_layer_ids order) → f [B, T, D]."""
        return self.hidden_norm(self.fc(taps))

    def forward_blocks(self, f: torch.Tensor, ctx_pos: torch.Tensor, ctx_valid: torch.Tensor,
                       blk_emb: torch.Tensor, blk_pos: torch.Tensor, blk_id: torch.Tensor) -> torch.Tensor:
        """Run draft blocks against a context.

        f: [B, S, D] context features; ctx_pos: [B, S] int64 positions; ctx_valid: [B, nb, S] bool
        (which context entries block n may see, before window rules);
        blk_emb: [B, Q, D] block token embeddings (Q = nb·block_size); blk_pos: [B, Q] positions;
        blk_id: [Q] block index of each query slot. Returns hidden [B, Q, D] after the final norm.
        """
        c = self.config
        B, Q, _ = blk_emb.shape
        S = f.shape[1]
        cos_c, sin_c = _cos_sin(ctx_pos, c.head_dim, c.rope_theta)
        cos_b, sin_b = _cos_sin(blk_pos, c.head_dim, c.rope_theta)
        same_blk = blk_id[:, None] == blk_id[None, :]                               # [Q, Q]
        ctx_ok = ctx_valid[:, blk_id, :]                                           # [B, Q, S]
        dpos_c = blk_pos[:, :, None] - ctx_pos[:, None, :]                         # [B, Q, S]
        dpos_b = blk_pos[:, :, None] - blk_pos[:, None, :]                         # [B, Q, Q]
        h = blk_emb
        for layer in self.layers:
            at = layer.self_attn
            x = layer.input_layernorm(h)
            q = _rope_b(at.q_norm(at.q_proj(x).view(B, Q, at.H, at.hd)), cos_b, sin_b)
            kc, vc = at.kv(f, cos_c, sin_c)
            kb, vb = at.kv(x, cos_b, sin_b)
            mc = ctx_ok
            mb = same_blk[None].expand(B, Q, Q)
            if at.sliding:
                mc = mc & (dpos_c < c.sliding_window)
                mb = mb & (dpos_b >= 0) & (dpos_b < c.sliding_window)
            k = torch.cat([kc, kb], 1)
            v = torch.cat([vc, vb], 1)
            mask = torch.cat([mc, mb], 2)                                          # [B, Q, S+Q]
            rep = at.H // at.KV
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
            att = torch.einsum("bqhd,bshd->bhqs", q.float(), k.float()) * at.hd ** -0.5
            att = att.masked_fill(~mask[:, None], float("-inf")).softmax(-1)
            o = torch.einsum("bhqs,bshd->bqhd", att, v.float()).to(h.dtype).reshape(B, Q, at.H * at.hd)
            h = h + at.o_proj(o)
            x = layer.post_attention_layernorm(h)
            h = h + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(x)) * layer.mlp.up_proj(x))
        return self.norm(h)

    # --- DSpark heads ---------------------------------------------------------------------------
    def markov_bias(self, prev_tokens: torch.Tensor) -> torch.Tensor:
        """W2 · W1[prev] for prev [...] int64 → [..., V]."""
        return self.markov_head.proj(self.markov_head.embed(prev_tokens))

    def confidence_logit(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """w · [hidden; W1[prev]] + b → [...] fp32 (the confidence before the sigmoid)."""
        z = torch.cat([hidden, self.markov_head.embed(prev_tokens).to(hidden.dtype)], -1)
        return self.confidence_head(z).float()[..., 0]

    def confidence(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """sigmoid(w · [hidden; W1[prev]] + b) → [...] in (0, 1): P(slot accepted | earlier accepted)."""
        return torch.sigmoid(self.confidence_logit(hidden, prev_tokens))


def _cos_sin(pos: torch.Tensor, dim: int, theta: float):
    B, S = pos.shape
    cos, sin = rope_cos_sin(pos.reshape(-1), dim, theta)
    return cos.view(B, S, dim), sin.view(B, S, dim)
