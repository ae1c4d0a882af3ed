"""Cross-check the reference KDA against fla's independent naive recurrent KDA (fla-core 0.6.0).

  python check_kda.py      exits non-zero on a mismatch; prints relative errors.

Checks, on random inputs with a random initial state and a wide range of decays:
  1. specd_ref.kda_recurrent  vs  fla.ops.kda.naive.naive_recurrent_kda   (output and final state)
  2. specd_ref.kda_chunked    vs  specd_ref.kda_recurrent                  (chunk sizes 8, 16, 32, 64;
     lengths not multiples of the chunk)
  3. a full KDA layer with random weights: chunked vs recurrent, and prefill split in two calls
     (state carried through the cache) vs one call.
fla is imported from its file so its Triton kernels (GPU only) are never loaded.
"""
import importlib.util
import sys
from pathlib import Path

import torch

from specd_ref.kimi import KDAAttention, KimiConfig, kda_chunked, kda_recurrent, l2norm


def load_fla_naive():
    import importlib.metadata as md
    dist = md.distribution("fla-core")
    path = Path(dist.locate_file("fla/ops/kda/naive.py"))
    spec = importlib.util.spec_from_file_location("fla_kda_naive", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.naive_recurrent_kda, dist.version


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def random_inputs(B, T, H, K, V, gen):
    q = l2norm(torch.randn(B, T, H, K, generator=gen))
    k = l2norm(torch.randn(B, T, H, K, generator=gen))
    v = torch.randn(B, T, H, V, generator=gen)
    # log decays from ~0 (no decay) to -8 (strong) per channel
    g = -torch.rand(B, T, H, K, generator=gen) ** 3 * 8
    beta = torch.rand(B, T, H, generator=gen)
    S0 = torch.randn(B, H, K, V, generator=gen) * 0.5
    return q, k, v, g, beta, S0


def main() -> int:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    naive, version = load_fla_naive()
    failures = []

    def check(name, err, tol):
        status = "ok" if err <= tol else "FAIL"
        print(f"{status:4s} {name}: rel err {err:.2e} (tol {tol:.0e})")
        if err > tol:
            failures.append(name)

    print(f"fla-core {version}")
    for (B, T, H, K, V) in [(2, 37, 3, 16, 16), (1, 100, 2, 64, 64), (3, 5, 4, 32, 24)]:
        q, k, v, g, beta, S0 = random_inputs(B, T, H, K, V, gen)
        scale = K ** -0.5
        o_ref, S_ref = naive(q.double(), k.double(), v.double(), g.double(), beta.double(), scale,
                             S0.double(), True)
        o, S = kda_recurrent(q, k, v, g, beta, scale, S0)
        check(f"recurrent vs fla o  B{B} T{T} H{H} K{K} V{V}", rel(o.double(), o_ref.double()), 1e-5)
        check(f"recurrent vs fla S  B{B} T{T} H{H} K{K} V{V}", rel(S.double(), S_ref.double()), 1e-5)
        for chunk in (8, 16, 32, 64):
            oc, Sc = kda_chunked(q, k, v, g, beta, scale, S0, chunk=chunk)
            check(f"chunked({chunk}) vs recurrent o  T{T}", rel(oc, o), 1e-4)
            check(f"chunked({chunk}) vs recurrent S  T{T}", rel(Sc, S), 1e-4)

    cfg = KimiConfig(vocab_size=64, hidden_size=48, num_hidden_layers=1, intermediate_size=64,
                     num_attention_heads=2, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                     v_head_dim=8, kda_layers=[1], full_attn_layers=[], kda_num_heads=3, kda_head_dim=16,
                     short_conv_kernel_size=4, num_experts=4, num_experts_per_token=2,
                     num_shared_experts=1, moe_intermediate_size=16, first_k_dense_replace=1,
                     routed_scaling_factor=2.0, rms_norm_eps=1e-5)
    layer = KDAAttention(cfg)
    for n, p in layer.named_parameters():
        torch.nn.init.normal_(p, std=0.3 if p.dim() > 1 else 0.5)
    x = torch.randn(2, 45, 48, generator=gen)
    with torch.no_grad():
        y_rec, c_rec = layer(x, mode="recurrent")
        y_chk, c_chk = layer(x, mode="chunked", chunk=16)
        y_a, c_a = layer(x[:, :29], mode="chunked", chunk=16)
        y_b, c_b = layer(x[:, 29:], c_a, mode="recurrent")
    check("layer chunked vs recurrent", rel(y_chk, y_rec), 1e-4)
    check("layer state chunked vs recurrent", rel(c_chk["state"], c_rec["state"]), 1e-4)
    check("layer split prefill (chunked 29 + recurrent 16) vs one call", rel(torch.cat([y_a, y_b], 1), y_rec), 1e-4)
    check("layer split prefill conv state", rel(c_b["conv_q"], c_rec["conv_q"]), 1e-6)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all KDA checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
