"""EAGLE-3 drafter (SafeAILab/EAGLE, arXiv 2503.01840), in the EAGLE-3 checkpoint layout.

config.json: architectures ["LlamaForCausalLMEagle3"], hidden_size, num_attention_heads,
num_key_value_heads, head_dim, intermediate_size, num_hidden_layers 1, vocab_size (target),
draft_vocab_size, rope_theta, rms_norm_eps, eagle_config {eagle_aux_hidden_state_layer_ids}.
Weights: fc [H, 3H], midlayer.{input_layernorm, hidden_norm, post_attention_layernorm,
self_attn.{q,k,v}_proj [.., 2H], self_attn.o_proj, mlp.{gate,up,down}_proj}, norm,
lm_head [draft_vocab, H], d2t [draft_vocab] int64 (target_id = draft_id + d2t[draft_id]),
t2d [vocab] bool (token is in the draft vocabulary).

Semantics pinned here (REFERENCE.md §5):
- Taps: eagle_aux_hidden_state_layer_ids used as given (tap k = residual entering layer k).
- Step 1 at position t: inputs (g_t = fc(concat taps at t), x_{t+1}) predict x_{t+2}.
  The layer sees [input_layernorm(embed(x_{t+1})); hidden_norm(g)] (2H) for q/k/v; the residual is g.
- Step j > 1 (chain): g is the layer's own output hidden (before `norm`) from step j−1; the token is
  the previous step's draft. Position of step j at anchor t is t + j − 1; it attends to step-1
  entries at positions ≤ t and to the chain entries of steps 2..j at the same anchor.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .common import RMSNorm, linear, rope_cos_sin


@dataclass
class Eagle3Config:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    aux_layer_ids: list[int]
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    @property
    def taps(self) -> list[int]:
        return list(self.aux_layer_ids)

    def to_hf(self) -> dict:
        return {
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            "hidden_size": self.hidden_size, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": 1,
            "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
            "rope_theta": self.rope_theta, "rms_norm_eps": self.rms_norm_eps, "hidden_act": "silu",
            "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": self.aux_layer_ids,
                             "use_aux_hidden_state": True},
        }

    @staticmethod
    def from_hf(c: dict) -> "Eagle3Config":
        ids = (c.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") \
            or c.get("eagle_aux_hidden_state_layer_ids")
        return Eagle3Config(
            hidden_size=c["hidden_size"], num_attention_heads=c["num_attention_heads"],
            num_key_value_heads=c["num_key_value_heads"], head_dim=c["head_dim"],
            intermediate_size=c["intermediate_size"], vocab_size=c["vocab_size"],
            draft_vocab_size=c["draft_vocab_size"], aux_layer_ids=list(ids),
            rope_theta=c.get("rope_theta", 10000.0), rms_norm_eps=c.get("rms_norm_eps", 1e-6))


class Eagle3Draft(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.config = c
        H = c.hidden_size
        self.fc = linear(3 * H, H)
        m = self.midlayer = nn.Module()
        m.input_layernorm = RMSNorm(H, c.rms_norm_eps)
        m.hidden_norm = RMSNorm(H, c.rms_norm_eps)
        m.post_attention_layernorm = RMSNorm(H, c.rms_norm_eps)
        m.self_attn = nn.Module()
        m.self_attn.q_proj = linear(2 * H, c.num_attention_heads * c.head_dim)
        m.self_attn.k_proj = linear(2 * H, c.num_key_value_heads * c.head_dim)
        m.self_attn.v_proj = linear(2 * H, c.num_key_value_heads * c.head_dim)
        m.self_attn.o_proj = linear(c.num_attention_heads * c.head_dim, H)
        m.mlp = nn.Module()
        m.mlp.gate_proj = linear(H, c.intermediate_size)
        m.mlp.up_proj = linear(H, c.intermediate_size)
        m.mlp.down_proj = linear(c.intermediate_size, H)
        self.norm = RMSNorm(H, c.rms_norm_eps)
        self.lm_head = linear(H, c.draft_vocab_size)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))

    def init_weights(self, std=0.02):
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=std)

    def set_vocab(self, draft_to_target: torch.Tensor):
        """draft_to_target: [draft_vocab] int64 target ids, ascending."""
        ids = torch.arange(len(draft_to_target), device=draft_to_target.device)
        self.d2t.copy_(draft_to_target - ids)
        self.t2d.zero_()
        self.t2d[draft_to_target] = True

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def qkv(self, emb: torch.Tensor, g: torch.Tensor, pos: torch.Tensor):
        """emb, g: [B, S, H]; pos: [B, S] → q [B,S,h,d], k, v [B,S,kv,d] (RoPE applied)."""
        c, m = self.config, self.midlayer
        B, S, _ = g.shape
        x = torch.cat([m.input_layernorm(emb), m.hidden_norm(g)], -1)
        q = m.self_attn.q_proj(x).view(B, S, c.num_attention_heads, c.head_dim)
        k = m.self_attn.k_proj(x).view(B, S, c.num_key_value_heads, c.head_dim)
        v = m.self_attn.v_proj(x).view(B, S, c.num_key_value_heads, c.head_dim)
        cos, sin = rope_cos_sin(pos.reshape(-1), c.head_dim, c.rope_theta)
        cos, sin = cos.view(B, S, 1, -1).to(q.dtype), sin.view(B, S, 1, -1).to(q.dtype)

        def rot(t):
            t1, t2 = t.chunk(2, -1)
            return t * cos + torch.cat([-t2, t1], -1) * sin
        return rot(q), rot(k), v

    def finish(self, g: torch.Tensor, attn_out: torch.Tensor):
        """Residual + MLP after attention. g: [B,S,H] residual; attn_out: [B,S,h·d] → hidden [B,S,H]."""
        m = self.midlayer
        h = g + m.self_attn.o_proj(attn_out)
        x = m.post_attention_layernorm(h)
        return h + m.mlp.down_proj(F.silu(m.mlp.gate_proj(x)) * m.mlp.up_proj(x))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [.., H] → draft-vocab logits [.., draft_vocab] fp32."""
        return self.lm_head(self.norm(hidden)).float()

    def ttt_forward(self, taps: torch.Tensor, emb_next: list[torch.Tensor], steps: int):
        """Training-time test over a whole sequence.

        taps: [B, T, 3H]; emb_next[j]: [B, T, H] embedding of the token fed at step j+1 for every anchor t
        (teacher forcing: x_{t+j+1}). Returns hidden per step, each [B, T, H].
        """
        c = self.config
        B, T, _ = taps.shape
        g = self.fc(taps)
        pos0 = torch.arange(T, device=taps.device)[None].expand(B, T)
        rep = c.num_attention_heads // c.num_key_value_heads
        causal = pos0[0][:, None] >= pos0[0][None, :]
        K1 = V1 = None
        chain_k, chain_v = [], []
        outs = []
        for j in range(steps):
            q, k, v = self.qkv(emb_next[j], g, pos0 + j)
            if j == 0:
                K1, V1 = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
            else:
                chain_k.append(k.repeat_interleave(rep, 2))
                chain_v.append(v.repeat_interleave(rep, 2))
            scale = c.head_dim ** -0.5
            s1 = torch.einsum("bthd,bshd->bhts", q.float(), K1.float()) * scale
            s1 = s1.masked_fill(~causal, float("-inf"))
            sd = [torch.einsum("bthd,bthd->bht", q.float(), kk.float())[..., None] * scale for kk in chain_k]
            att = torch.cat([s1] + sd, -1).softmax(-1)
            o = torch.einsum("bhts,bshd->bthd", att[..., :T], V1.float())
            for i, vv in enumerate(chain_v):
                o = o + att[..., T + i].permute(0, 2, 1)[..., None] * vv.float()
            g = self.finish(g, o.to(g.dtype).reshape(B, T, -1))
            outs.append(g)
        return outs
