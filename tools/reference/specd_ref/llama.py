"""A readable Llama reference (SmolLM2-135M-Instruct) loaded from a GGUF (REFERENCE.md §10).

RMSNorm → GQA attention with RoPE → residual → RMSNorm → SwiGLU MLP → residual, final RMSNorm, tied
lm_head (= the token embedding). Weights come from the GGUF, dequantised to fp32 (Q4_1 linear
weights, Q8_0 embedding) and kept in fp32 (dtype="float32", the default) or bf16 storage.

RoPE layout (pinned): llama.cpp's converter permutes the rows of attn_q / attn_k per head so that
its kernel can rotate ADJACENT pairs (GPT-J style, "interleaved"). We UN-permute them back to the
HF order at load time (`unpermute_qk`, the inverse of convert_hf_to_gguf.py's `permute`) and use
HF's rotate_half ("neox") RoPE, common.apply_rope — the same RoPE the drafters use. Keeping the
GGUF order with interleaved RoPE is mathematically identical (check_llama.py verifies it).

Interface (the same as KimiForCausalLM, so train_drafters.py / eval_tau.py / goldens use it as is):
  forward(ids [B,T], caches=None, keep_hidden=True, pad=None) → (logits [B,T,V] fp32,
  hidden: list of L+1 [B,T,D] (tap i = residual entering layer i; 0 = embeddings, L = final
  pre-norm hidden; REFERENCE.md §2), caches: list per layer of {"k","v"} [B,S,KV,hd]).
  Caches are functional: the passed-in caches are never modified (eval_tau replays from them).
  pad [B] int64 (optional): left-padding count per row for batched generation; padded keys are
  masked and positions start at 0 on each row's first real token.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .common import RMSNorm, linear

# ChatML special tokens of the SmolLM2 vocabulary (token_type 3 = control).
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2
# DFlash / DSpark mask token: a control token chat never produces (jupyter-notebook marker,
# neither im_start / im_end / endoftext nor used by the chat template).
SMOL_MASK_ID = 16  # "<empty_output>"
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@dataclass
class LlamaConfig:
    vocab_size: int = 49152
    hidden_size: int = 576
    num_hidden_layers: int = 30
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    head_dim: int = 64
    intermediate_size: int = 1536
    rope_theta: float = 100000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = True

    @staticmethod
    def from_gguf_meta(m: dict) -> "LlamaConfig":
        a = m["general.architecture"]
        H = int(m[f"{a}.embedding_length"])
        nh = int(m[f"{a}.attention.head_count"])
        return LlamaConfig(
            vocab_size=int(m.get(f"{a}.vocab_size") or len(m["tokenizer.ggml.tokens"])), hidden_size=H,
            num_hidden_layers=int(m[f"{a}.block_count"]), num_attention_heads=nh,
            num_key_value_heads=int(m[f"{a}.attention.head_count_kv"]),
            head_dim=int(m.get(f"{a}.rope.dimension_count") or H // nh),
            intermediate_size=int(m[f"{a}.feed_forward_length"]),
            rope_theta=float(m.get(f"{a}.rope.freq_base", 10000.0)),
            # stored as f32 in the GGUF (9.99999975e-06): use the HF config's exact 1e-5
            rms_norm_eps=round(float(m[f"{a}.attention.layer_norm_rms_epsilon"]), 9),
            max_position_embeddings=int(m.get(f"{a}.context_length", 8192)))

    def to_hf(self) -> dict:
        d = asdict(self)
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", **d}


def rope_tables(pos: torch.Tensor, dim: int, theta: float):
    """Neox RoPE tables for positions pos [...] int64 → cos, sin [..., dim] fp32."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, device=pos.device, dtype=torch.float32) / dim))
    ang = pos.float()[..., None] * inv
    ang = torch.cat([ang, ang], -1)
    return ang.cos(), ang.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B,T,h,d]; cos/sin [B,T,d] (or [T,d]). HF rotate_half."""
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    c, s = cos[:, :, None, :].to(x.dtype), sin[:, :, None, :].to(x.dtype)
    x1, x2 = x.chunk(2, -1)
    return x * c + torch.cat([-x2, x1], -1) * s


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.H, self.KV, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = linear(c.hidden_size, self.H * self.hd)
        self.k_proj = linear(c.hidden_size, self.KV * self.hd)
        self.v_proj = linear(c.hidden_size, self.KV * self.hd)
        self.o_proj = linear(self.H * self.hd, c.hidden_size)

    def forward(self, x, cos, sin, cache, mask):
        B, T, _ = x.shape
        q = rotate(self.q_proj(x).view(B, T, self.H, self.hd), cos, sin)
        k = rotate(self.k_proj(x).view(B, T, self.KV, self.hd), cos, sin)
        v = self.v_proj(x).view(B, T, self.KV, self.hd)
        if cache is not None:
            k = torch.cat([cache["k"], k], 1)
            v = torch.cat([cache["v"], v], 1)
        new = {"k": k, "v": v}
        rep = self.H // self.KV
        qh = q.transpose(1, 2)                                              # [B,H,T,d]
        kh = k.repeat_interleave(rep, 2).transpose(1, 2)                    # [B,H,S,d]
        vh = v.repeat_interleave(rep, 2).transpose(1, 2)
        if hasattr(F, "scaled_dot_product_attention") and x.is_cuda:
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask[:, None] if mask is not None else None)
        else:
            att = (qh.float() @ kh.float().transpose(-1, -2)) * self.hd ** -0.5
            if mask is not None:
                att = att.masked_fill(~mask[:, None], float("-inf"))
            o = (att.softmax(-1) @ vh.float()).to(x.dtype)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.H * self.hd)), new


class Layer(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = linear(c.hidden_size, c.intermediate_size)
        self.mlp.up_proj = linear(c.hidden_size, c.intermediate_size)
        self.mlp.down_proj = linear(c.intermediate_size, c.hidden_size)

    def forward(self, h, cos, sin, cache, mask):
        a, new = self.self_attn(self.input_layernorm(h), cos, sin, cache, mask)
        h = h + a
        x = self.post_attention_layernorm(h)
        h = h + self.mlp.down_proj(F.silu(self.mlp.gate_proj(x)) * self.mlp.up_proj(x))
        return h, new


class LlamaModel(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """forward(ids [B,T]) → logits [B,T,V] fp32, hidden_states (L+1)×[B,T,D], caches."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.config = c
        self.model = LlamaModel(c)
        self.lm_head = linear(c.hidden_size, c.vocab_size)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids: torch.Tensor, caches: list | None = None, mode: str = "chunked",
                chunk: int = 32, keep_hidden: bool = True, pad: torch.Tensor | None = None,
                logits_last: bool = False):
        """mode/chunk are accepted for interface compatibility with the Kimi target (unused)."""
        c = self.config
        B, T = ids.shape
        dev = ids.device
        past = caches[0]["k"].shape[1] if caches else 0
        S = past + T
        qpos = torch.arange(past, S, device=dev)
        mask = None
        if pad is not None:
            pos = (qpos[None] - pad[:, None]).clamp_min(0)                      # [B,T]
            kidx = torch.arange(S, device=dev)
            # padded queries attend to themselves only (keeps them finite); real ones never see pads
            mask = (kidx[None, None, :] <= qpos[None, :, None]) & (
                (kidx[None, None, :] >= pad[:, None, None]) | (kidx[None, None, :] == qpos[None, :, None]))
        else:
            pos = qpos
            if T > 1:
                kidx = torch.arange(S, device=dev)
                mask = (kidx[None, :] <= qpos[:, None])[None].expand(B, T, S)
        cos, sin = rope_tables(pos, c.head_dim, c.rope_theta)
        h = self.model.embed_tokens(ids)
        hidden = [h] if keep_hidden else None
        new = []
        for i, layer in enumerate(self.model.layers):
            h, nc = layer(h, cos, sin, caches[i] if caches else None, mask)
            new.append(nc)
            if keep_hidden:
                hidden.append(h)
        if logits_last:
            h = h[:, -1:]
        logits = self.lm_head(self.model.norm(h)).float()
        return logits, hidden, new


# --- loading -------------------------------------------------------------------------------------
def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp convert_hf_to_gguf.py permute(): GGUF (adjacent-pair) rows → HF rows."""
    out, inp = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's permute (HF → GGUF rows), for the equivalence check."""
    out, inp = w.shape
    return w.reshape(n_head, 2, out // n_head // 2, inp).swapaxes(1, 2).reshape(out, inp)


def hf_state_from_gguf(tensors: dict, c: LlamaConfig) -> dict:
    """GGUF tensor names → HF LlamaForCausalLM names (q/k un-permuted to HF order), numpy fp32."""
    st = {"model.embed_tokens.weight": tensors["token_embd.weight"],
          "model.norm.weight": tensors["output_norm.weight"]}
    if "output.weight" in tensors:
        st["lm_head.weight"] = tensors["output.weight"]
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    for i in range(c.num_hidden_layers):
        for g, h in names.items():
            w = tensors[f"blk.{i}.{g}.weight"]
            if g == "attn_q":
                w = unpermute_qk(w, c.num_attention_heads)
            elif g == "attn_k":
                w = unpermute_qk(w, c.num_key_value_heads)
            st[f"model.layers.{i}.{h}.weight"] = w
    return st


def load_gguf(path: str | Path, device="cpu", dtype: str = "float32", use_pip: bool | None = None):
    """→ (LlamaForCausalLM frozen in eval mode, gguf metadata)."""
    from .gguf_io import read_gguf
    meta, tensors = read_gguf(path, use_pip=use_pip)
    c = LlamaConfig.from_gguf_meta(meta)
    c.tie_word_embeddings = "output.weight" not in tensors
    model = LlamaForCausalLM(c)
    st = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in hf_state_from_gguf(tensors, c).items()}
    missing, unexpected = model.load_state_dict(st, strict=False)
    missing = [m for m in missing if not (c.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"GGUF → Llama mismatch: missing {missing} unexpected {unexpected}")
    model.to(device=device, dtype=torch.bfloat16 if dtype == "bfloat16" else torch.float32).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, meta


# --- tokenizer and chat template -----------------------------------------------------------------
def tokenizer_from_gguf_meta(meta: dict):
    """A `tokenizers` Tokenizer equal to the GGUF's (gpt2 BPE, pre "smollm": digits split one by one,
    then GPT-2 byte-level regex; control tokens are special)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    toks = list(meta["tokenizer.ggml.tokens"])
    types = list(meta["tokenizer.ggml.token_type"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"tokenizer model {meta.get('tokenizer.ggml.model')} not supported")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(toks)}, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(toks, types) if ty == 3])
    return tok


def load_tokenizer(gguf_path: str | Path):
    from .gguf_io import read_gguf
    try:
        from gguf import GGUFReader  # metadata only: fast
        r = GGUFReader(str(gguf_path))
        meta = {k: r.fields[k].contents() for k in
                ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                 "tokenizer.ggml.model")}
    except ImportError:
        meta, _ = read_gguf(gguf_path, use_pip=False)
    return tokenizer_from_gguf_meta(meta)


def chatml(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """SmolLM2's chat template (the GGUF's tokenizer.chat_template): a default system turn is added
    when the first message is not a system message."""
    s = ""
    if messages and messages[0]["role"] != "system":
        s += f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n"
    for m in messages:
        s += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    if add_generation_prompt:
        s += "<|im_start|>assistant\n"
    return s


@torch.no_grad()
def generate(model: LlamaForCausalLM, prompts: list[list[int]], new_tokens: int, temperature: float = 0.0,
             gen: torch.Generator | None = None, autocast: bool = False) -> list[list[int]]:
    """Batched generation with a KV cache (prompts left-padded; EOS ignored). → new tokens per prompt."""
    dev = next(model.parameters()).device
    B = len(prompts)
    Pm = max(len(p) for p in prompts)
    ids = torch.zeros(B, Pm, dtype=torch.long, device=dev)
    pad = torch.tensor([Pm - len(p) for p in prompts], device=dev)
    for i, p in enumerate(prompts):
        ids[i, Pm - len(p):] = torch.tensor(p, device=dev)
    out = []
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
        logits, _, caches = model(ids, keep_hidden=False, pad=pad, logits_last=True)
        for step in range(new_tokens):
            lg = logits[:, -1].float()
            if temperature > 0:
                nxt = torch.multinomial(torch.softmax(lg / temperature, -1), 1, generator=gen)[:, 0]
            else:
                nxt = lg.argmax(-1)
            out.append(nxt)
            if step + 1 < new_tokens:
                logits, _, caches = model(nxt[:, None], caches, keep_hidden=False, pad=pad)
    return torch.stack(out, 1).tolist()


def save_target_config(folder: Path, c: LlamaConfig, gguf_path: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**c.to_hf(), "gguf": str(gguf_path)}, indent=2) + "\n")
