"""Kimi-K3 / Kimi-Linear reference target: KDA linear attention + MLA (NoPE) + MoE.

Readable PyTorch, the numerics oracle for specd's TypeScript/C++ code (REFERENCE.md §7).
Tensor and config names follow moonshotai/Kimi-Linear-48B-A3B (see
test/fixtures/kimi-linear-48b-a3b/), so one loader accepts model_type "kimi_k3" and "kimi_linear".

Semantics pinned here (where public implementations differ, the choice is stated):
- Layer kinds come only from config.linear_attn_config.{kda_layers, full_attn_layers} (1-based).
- KDA: q/k/v projections → causal depthwise conv1d (kernel 4, no bias) → SiLU; q, k L2-normalised
  per head (x / sqrt(Σx² + 1e-6)); g = −exp(A_log[h]) · softplus(f_b(f_a(x)) + dt_bias) (fp32, log
  space, per channel); β = sigmoid(b_proj x); fp32 state S [d_k, d_v]:
      S' = diag(exp g)·S;  S = S' + β·k (v − S'ᵀk)ᵀ;  o = Sᵀ q · d_k^−½
  then o_norm (RMSNorm over d_k, one weight shared by heads) · sigmoid(g_b(g_a(x))), o_proj.
- MLA with mla_use_nope: no rotary anywhere; q = q_proj(x) → [H, nope+rope]; kv_a_proj_with_mqa(x)
  → [latent r | k_pe rope]; latent normalised by kv_a_layernorm (eps = rms_norm_eps, as vLLM);
  kv_b_proj(latent) → [H, nope + v]; k = [k_nope, k_pe shared by heads]; scale (nope+rope)^−½.
  The cache per token is (normalised latent [r], k_pe [rope]).
- MoE: sigmoid(router logits in fp32); top-k chosen on scores + e_score_correction_bias (selection
  only, as vLLM; HF's modeling_kimi.py aliases the bias into the weights, which we do not copy);
  weights = chosen raw scores / their sum · routed_scaling_factor; one shared expert, unscaled.
- Tap i = residual stream entering layer i (= HF output_hidden_states[i]; 0 = embeddings).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .common import RMSNorm, linear

L2_EPS = 1e-6


@dataclass
class KimiConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    kda_layers: list[int]          # 1-based, as in the config
    full_attn_layers: list[int]    # 1-based
    kda_num_heads: int
    kda_head_dim: int
    short_conv_kernel_size: int
    num_experts: int
    num_experts_per_token: int
    num_shared_experts: int
    moe_intermediate_size: int
    first_k_dense_replace: int
    routed_scaling_factor: float
    rms_norm_eps: float
    mla_use_nope: bool = True
    moe_renormalize: bool = True
    extra: dict = field(default_factory=dict)

    @staticmethod
    def from_hf(cfg: dict) -> "KimiConfig":
        if cfg.get("model_type") not in ("kimi_k3", "kimi_linear"):
            raise ValueError(f"config.model_type must be kimi_k3 or kimi_linear, got {cfg.get('model_type')!r}")
        la = cfg["linear_attn_config"]
        if not cfg.get("mla_use_nope", False):
            raise ValueError("only mla_use_nope=true is implemented (Kimi-Linear's published setting)")
        if cfg.get("q_lora_rank") is not None:
            raise ValueError("q_lora_rank must be null (Kimi-Linear has a plain q_proj)")
        if cfg.get("moe_router_activation_func", "sigmoid") != "sigmoid":
            raise ValueError("moe_router_activation_func must be 'sigmoid'")
        c = KimiConfig(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            num_hidden_layers=cfg["num_hidden_layers"], intermediate_size=cfg["intermediate_size"],
            num_attention_heads=cfg["num_attention_heads"], kv_lora_rank=cfg["kv_lora_rank"],
            qk_nope_head_dim=cfg["qk_nope_head_dim"], qk_rope_head_dim=cfg["qk_rope_head_dim"],
            v_head_dim=cfg["v_head_dim"], kda_layers=list(la["kda_layers"]),
            full_attn_layers=list(la["full_attn_layers"]), kda_num_heads=la["num_heads"],
            kda_head_dim=la["head_dim"], short_conv_kernel_size=la["short_conv_kernel_size"],
            num_experts=cfg["num_experts"], num_experts_per_token=cfg["num_experts_per_token"],
            num_shared_experts=cfg["num_shared_experts"],
            moe_intermediate_size=cfg["moe_intermediate_size"],
            first_k_dense_replace=cfg["first_k_dense_replace"],
            routed_scaling_factor=float(cfg["routed_scaling_factor"]),
            rms_norm_eps=float(cfg["rms_norm_eps"]), mla_use_nope=True,
            moe_renormalize=bool(cfg.get("moe_renormalize", True)))
        kinds = sorted(c.kda_layers + c.full_attn_layers)
        if kinds != list(range(1, c.num_hidden_layers + 1)):
            raise ValueError("kda_layers ∪ full_attn_layers must list every layer 1..num_hidden_layers once")
        return c

    def is_kda(self, layer: int) -> bool:
        """layer is 0-based here; the config lists are 1-based."""
        return (layer + 1) in self.kda_layers


# ---------------------------------------------------------------------------------------------
# KDA core: recurrent (one token at a time) and chunked (WY form) — same math, two orders.
# ---------------------------------------------------------------------------------------------

def kda_recurrent(q, k, v, g, beta, scale, state=None):
    """Token-by-token KDA. q,k: [B,T,H,K]; v: [B,T,H,V]; g: [B,T,H,K] log decay; beta: [B,T,H].

    q and k must already be L2-normalised. Returns o [B,T,H,V] fp32, final state [B,H,K,V] fp32.
    Keeps every intermediate state in fp32 (REFERENCE.md §7).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    S = torch.zeros(B, H, K, V, dtype=torch.float32, device=q.device) if state is None else state.float().clone()
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    o = torch.empty(B, T, H, V, dtype=torch.float32, device=q.device)
    for t in range(T):
        S = S * g[:, t].exp()[..., None]
        kt = k[:, t]
        pred = torch.einsum("bhk,bhkv->bhv", kt, S)
        S = S + torch.einsum("bhk,bhv->bhkv", kt, beta[:, t][..., None] * (v[:, t] - pred))
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S)
    return o, S


def kda_chunked(q, k, v, g, beta, scale, state=None, chunk: int = 32):
    """Chunked KDA (delta rule in WY form with channel-wise decay); same contract as kda_recurrent.

    Within a chunk with cumulative log decay G_t (per channel):
      A[t,i] = β_t Σ_d k_t k_i e^{G_t−G_i} (i<t),  U = (I+A)^{-1} diag(β) (V − (k⊙e^{G}) S0)
      O = (q⊙e^{G}) S0 + (Σ_d q_t k_i e^{G_t−G_i}, i≤t) U
      S_C = e^{G_C} ⊙ S0 + Σ_i (k_i ⊙ e^{G_C−G_i}) u_iᵀ
    Pairwise exponents are formed as differences (≤ 0), so nothing overflows in fp32.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    S = torch.zeros(B, H, K, V, dtype=torch.float32, device=q.device) if state is None else state.float()
    pad = (-T) % chunk
    if pad:
        q, k, g = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, g))
        v = F.pad(v, (0, 0, 0, 0, 0, pad))
        beta = F.pad(beta, (0, 0, 0, pad))
    n = (T + pad) // chunk
    # [B, H, n, C, ·]
    q, k, v, g = (x.view(B, n, chunk, H, -1).permute(0, 3, 1, 2, 4) for x in (q, k, v, g))
    beta = beta.view(B, n, chunk, H).permute(0, 3, 1, 2)
    q = q * scale
    G = g.cumsum(dim=3)
    idx = torch.arange(chunk, device=q.device)
    incl = idx[:, None] >= idx[None, :]
    strict = idx[:, None] > idx[None, :]
    eye = torch.eye(chunk, device=q.device)
    outs = []
    for c in range(n):
        qc, kc, vc, Gc, bc = q[:, :, c], k[:, :, c], v[:, :, c], G[:, :, c], beta[:, :, c]
        diff = Gc[:, :, :, None, :] - Gc[:, :, None, :, :]              # [B,H,C,C,K] (t,i)
        D = diff.masked_fill(~incl[:, :, None], float("-inf")).exp()
        Akk = torch.einsum("bhtd,bhid,bhtid->bhti", kc, kc, D) * strict
        A = bc[..., None] * Akk
        X = torch.linalg.solve_triangular(eye + A, torch.diag_embed(bc), upper=False, unitriangular=True)
        eG = Gc.exp()
        W = X @ (kc * eG)
        U = X @ vc - W @ S
        Aqk = torch.einsum("bhtd,bhid,bhtid->bhti", qc, kc, D)
        outs.append((qc * eG) @ S + Aqk @ U)
        Glast = Gc[:, :, -1:, :]
        S = Glast.exp().transpose(-1, -2) * S + (kc * (Glast - Gc).exp()).transpose(-1, -2) @ U
    o = torch.stack(outs, dim=2).permute(0, 2, 3, 1, 4).reshape(B, n * chunk, H, V)[:, :T]
    return o, S


def l2norm(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + L2_EPS)


class KDAAttention(nn.Module):
    """Kimi Delta Attention layer. Input/output x: [B, T, hidden]."""

    def __init__(self, c: KimiConfig):
        super().__init__()
        H, Kd, D = c.kda_num_heads, c.kda_head_dim, c.hidden_size
        self.H, self.Kd, self.ks = H, Kd, c.short_conv_kernel_size
        self.q_proj, self.k_proj, self.v_proj = linear(D, H * Kd), linear(D, H * Kd), linear(D, H * Kd)
        self.q_conv1d = nn.Conv1d(H * Kd, H * Kd, self.ks, groups=H * Kd, bias=False)
        self.k_conv1d = nn.Conv1d(H * Kd, H * Kd, self.ks, groups=H * Kd, bias=False)
        self.v_conv1d = nn.Conv1d(H * Kd, H * Kd, self.ks, groups=H * Kd, bias=False)
        self.A_log = nn.Parameter(torch.zeros(1, 1, H, 1))
        self.dt_bias = nn.Parameter(torch.zeros(H * Kd))
        self.f_a_proj, self.f_b_proj = linear(D, Kd), linear(Kd, H * Kd)
        self.b_proj = linear(D, H)
        self.g_a_proj, self.g_b_proj = linear(D, Kd), linear(Kd, H * Kd)
        self.o_norm = RMSNorm(Kd, c.rms_norm_eps)
        self.o_proj = linear(H * Kd, D)

    def _conv(self, conv: nn.Conv1d, x: torch.Tensor, prev: torch.Tensor | None):
        """Causal depthwise conv + SiLU. x: [B,T,C]; prev: [B,C,ks−1] earlier inputs (or None)."""
        xt = x.transpose(1, 2)
        if prev is None:
            prev = torch.zeros(x.shape[0], x.shape[2], self.ks - 1, dtype=x.dtype, device=x.device)
        full = torch.cat([prev.to(x.dtype), xt], dim=2)
        y = F.conv1d(full, conv.weight.to(x.dtype), groups=xt.shape[1])
        return F.silu(y).transpose(1, 2), full[:, :, -(self.ks - 1):]

    def gates(self, x: torch.Tensor):
        """Decay g [B,T,H,K] fp32 (log space) and beta [B,T,H] fp32 for input x [B,T,hidden]."""
        B, T, _ = x.shape
        f = self.f_b_proj(self.f_a_proj(x)).float() + self.dt_bias.float()
        g = -self.A_log.float().exp().view(1, 1, self.H, 1) * F.softplus(f.view(B, T, self.H, self.Kd))
        beta = torch.sigmoid(self.b_proj(x).float())
        return g, beta

    def forward(self, x, cache: dict | None = None, mode: str = "chunked", chunk: int = 32):
        B, T, _ = x.shape
        prev = cache or {}
        q, cq = self._conv(self.q_conv1d, self.q_proj(x), prev.get("conv_q"))
        k, ck = self._conv(self.k_conv1d, self.k_proj(x), prev.get("conv_k"))
        v, cv = self._conv(self.v_conv1d, self.v_proj(x), prev.get("conv_v"))
        q = l2norm(q.view(B, T, self.H, self.Kd))
        k = l2norm(k.view(B, T, self.H, self.Kd))
        v = v.view(B, T, self.H, self.Kd).float()
        g, beta = self.gates(x)
        fn = kda_chunked if mode == "chunked" else kda_recurrent
        kw = {"chunk": chunk} if mode == "chunked" else {}
        o, S = fn(q, k, v, g, beta, self.Kd ** -0.5, prev.get("state"), **kw)
        gate = torch.sigmoid(self.g_b_proj(self.g_a_proj(x)).float()).view(B, T, self.H, self.Kd)
        o = (self.o_norm(o) * gate).to(x.dtype).reshape(B, T, self.H * self.Kd)
        return self.o_proj(o), {"conv_q": cq, "conv_k": ck, "conv_v": cv, "state": S}


class MLAAttention(nn.Module):
    """Multi-head latent attention with NoPE (mla_use_nope). x: [B, T, hidden]."""

    def __init__(self, c: KimiConfig):
        super().__init__()
        self.H, self.nope, self.rope, self.vd, self.r = (c.num_attention_heads, c.qk_nope_head_dim,
                                                         c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank)
        D = c.hidden_size
        self.q_proj = linear(D, self.H * (self.nope + self.rope))
        self.kv_a_proj_with_mqa = linear(D, self.r + self.rope)
        self.kv_a_layernorm = RMSNorm(self.r, c.rms_norm_eps)
        self.kv_b_proj = linear(self.r, self.H * (self.nope + self.vd))
        self.o_proj = linear(self.H * self.vd, D)

    def forward(self, x, cache: dict | None = None, **_):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.nope + self.rope)
        kv = self.kv_a_proj_with_mqa(x)
        latent = self.kv_a_layernorm(kv[..., :self.r])
        k_pe = kv[..., self.r:]
        if cache is not None and cache.get("latent") is not None:
            latent = torch.cat([cache["latent"].to(latent.dtype), latent], dim=1)
            k_pe = torch.cat([cache["k_pe"].to(k_pe.dtype), k_pe], dim=1)
        S = latent.shape[1]
        kvb = self.kv_b_proj(latent).view(B, S, self.H, self.nope + self.vd)
        k = torch.cat([kvb[..., :self.nope], k_pe[:, :, None, :].expand(B, S, self.H, self.rope)], dim=-1)
        v = kvb[..., self.nope:]
        scale = (self.nope + self.rope) ** -0.5
        att = torch.einsum("bthd,bshd->bhts", q.float(), k.float()) * scale
        past = S - T
        mask = torch.arange(S, device=x.device)[None, :] <= (past + torch.arange(T, device=x.device))[:, None]
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        o = torch.einsum("bhts,bshd->bthd", att, v.float()).to(x.dtype).reshape(B, T, self.H * self.vd)
        return self.o_proj(o), {"latent": latent, "k_pe": k_pe}


class DenseMLP(nn.Module):
    def __init__(self, D: int, inter: int):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = linear(D, inter), linear(D, inter), linear(inter, D)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Expert(nn.Module):
    def __init__(self, D: int, inter: int):
        super().__init__()
        self.w1, self.w2, self.w3 = linear(D, inter), linear(inter, D), linear(D, inter)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoEGate(nn.Module):
    def __init__(self, c: KimiConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c.num_experts, c.hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(c.num_experts), requires_grad=False)
        self.top_k, self.scale, self.renorm = c.num_experts_per_token, c.routed_scaling_factor, c.moe_renormalize

    def forward(self, x: torch.Tensor):
        """x: [N, hidden] → (expert ids [N, k] int64, weights [N, k] fp32)."""
        scores = torch.sigmoid(x.float() @ self.weight.float().t())
        ids = torch.topk(scores + self.e_score_correction_bias.float(), self.top_k, dim=-1).indices
        w = scores.gather(-1, ids)
        if self.renorm:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return ids, w * self.scale


class SparseMoE(nn.Module):
    """Routed SwiGLU experts + shared expert. x: [B, T, hidden]."""

    def __init__(self, c: KimiConfig):
        super().__init__()
        self.gate = MoEGate(c)
        self.experts = nn.ModuleList(Expert(c.hidden_size, c.moe_intermediate_size) for _ in range(c.num_experts))
        self.shared_experts = DenseMLP(c.hidden_size, c.moe_intermediate_size * c.num_shared_experts)
        self.last_ids: torch.Tensor | None = None

    def forward(self, x):
        B, T, D = x.shape
        xf = x.reshape(-1, D)
        ids, w = self.gate(xf)
        self.last_ids = ids.detach()
        out = torch.zeros(xf.shape, dtype=torch.float32, device=x.device)
        for e, expert in enumerate(self.experts):
            tok, slot = (ids == e).nonzero(as_tuple=True)
            if tok.numel():
                out.index_add_(0, tok, expert(xf[tok]).float() * w[tok, slot][:, None])
        out = out + self.shared_experts(xf).float()
        return out.to(x.dtype).view(B, T, D)


class DecoderLayer(nn.Module):
    def __init__(self, c: KimiConfig, i: int):
        super().__init__()
        self.kind = "kda" if c.is_kda(i) else "mla"
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = KDAAttention(c) if self.kind == "kda" else MLAAttention(c)
        if i < c.first_k_dense_replace:
            self.mlp = DenseMLP(c.hidden_size, c.intermediate_size)
        else:
            self.block_sparse_moe = SparseMoE(c)

    def ffn(self, x):
        return self.mlp(x) if hasattr(self, "mlp") else self.block_sparse_moe(x)

    def forward(self, h, cache=None, **kw):
        a, new_cache = self.self_attn(self.input_layernorm(h), cache, **kw)
        h = h + a
        h = h + self.ffn(self.post_attention_layernorm(h))
        return h, new_cache


class KimiModel(nn.Module):
    def __init__(self, c: KimiConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class KimiForCausalLM(nn.Module):
    """The target. forward(ids [B,T]) → logits [B,T,V] fp32, hidden_states (L+1)×[B,T,D], caches."""

    def __init__(self, c: KimiConfig):
        super().__init__()
        self.config = c
        self.model = KimiModel(c)
        self.lm_head = linear(c.hidden_size, c.vocab_size)

    def init_weights(self, std: float = 0.02):
        for name, p in self.named_parameters():
            if p.dim() >= 2 and "conv1d" not in name:
                nn.init.normal_(p, std=std)
            elif "conv1d" in name:
                nn.init.normal_(p, std=0.2)
            elif name.endswith("A_log"):
                nn.init.uniform_(p, -1.0, 1.0)  # A = exp(A_log) in [0.37, 2.7]
            elif name.endswith("dt_bias"):
                nn.init.uniform_(p, -4.0, -1.0)
        for n, p in self.named_parameters():
            if n.endswith("o_proj.weight") or n.endswith("down_proj.weight") or n.endswith(".w2.weight"):
                p.data.mul_(1 / (2 * self.config.num_hidden_layers) ** 0.5)

    def forward(self, ids: torch.Tensor, caches: list | None = None, mode: str = "chunked",
                chunk: int = 32, keep_hidden: bool = True):
        h = self.model.embed_tokens(ids)
        hidden = [h] if keep_hidden else None
        new = []
        for i, layer in enumerate(self.model.layers):
            h, c = layer(h, caches[i] if caches else None, mode=mode, chunk=chunk)
            new.append(c)
            if keep_hidden:
                hidden.append(h)
        logits = self.lm_head(self.model.norm(h)).float()
        return logits, hidden, new

    def moe_layers(self):
        return [l.block_sparse_moe for l in self.model.layers if hasattr(l, "block_sparse_moe")]


def hf_config(c: KimiConfig, model_type: str = "kimi_k3", **extra) -> dict:
    """The config.json for a KimiConfig, in Kimi-Linear's field names."""
    return {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": model_type,
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_hidden_layers, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_attention_heads,
        "kv_lora_rank": c.kv_lora_rank, "q_lora_rank": None,
        "qk_nope_head_dim": c.qk_nope_head_dim, "qk_rope_head_dim": c.qk_rope_head_dim,
        "v_head_dim": c.v_head_dim, "mla_use_nope": True,
        "linear_attn_config": {"kda_layers": c.kda_layers, "full_attn_layers": c.full_attn_layers,
                               "num_heads": c.kda_num_heads, "head_dim": c.kda_head_dim,
                               "short_conv_kernel_size": c.short_conv_kernel_size},
        "num_experts": c.num_experts, "num_experts_per_token": c.num_experts_per_token,
        "num_shared_experts": c.num_shared_experts, "moe_intermediate_size": c.moe_intermediate_size,
        "first_k_dense_replace": c.first_k_dense_replace, "moe_layer_freq": 1,
        "moe_router_activation_func": "sigmoid", "moe_renormalize": c.moe_renormalize,
        "routed_scaling_factor": c.routed_scaling_factor, "num_expert_group": 1, "topk_group": 1,
        "use_grouped_topk": True, "hidden_act": "silu", "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": None,
        "num_nextn_predict_layers": 0, "torch_dtype": "bfloat16", "use_cache": True, **extra,
    }
