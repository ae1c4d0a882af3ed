"""Stage 3 (GPU): train the DFlash, DSpark and EAGLE-3 drafters against the frozen bf16 target.

  python train_drafters.py {dflash|dspark|eagle3} --target models/kimi-k3-tiny --regen W/regen \
      --out W/drafters/<method> [--minutes 6]

Data: the target's own regenerated sequences (train_target.py regen). The target runs online on each
batch (frozen, bf16 weights as shipped) to give the taps and its probabilities for distillation.
Objectives (REFERENCE.md §3-5):
  dflash  random anchors, block = anchor + masks, CE + soft CE to the target, decay exp(−(k−1)/γ), γ=7
  dspark  0.1·CE + 0.9·L1(p_d − p_t) + BCE(confidence, 1 − ½‖p_d − p_t‖₁), decay γ=4
  (--decay-gamma sets γ: the DFlash paper's 7 suits a drafter whose positions are reached with probability
  ~0.9 each; for a weaker one the chance of reaching position k falls faster, and a smaller γ weighs the
  positions by how often verification reaches them)
  eagle3  training-time test over 6 chained steps, soft CE to the target restricted to the draft
          vocabulary + CE, weight 0.8^j
Writes <out>/best.pt, <out>/log.json and the HF folder <out>/hf.

SmolLM2-135M-Instruct target (GGUF): pass --gguf PATH instead of --target (data from
regen_smollm2.py gen; drafter sizes in SMOL_SIZES, REFERENCE.md §10):
  python train_drafters.py dflash --gguf G --regen R --out W/dflash --minutes 3.5
When R/prompt_lens.u16 exists, DFlash anchors are drawn from the generated part of each row only.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specd_ref.common import decay_weights, load_hf_state, save_hf_folder
from specd_ref.dflash import DFlashConfig, DFlashDraft
from specd_ref.eagle3 import Eagle3Config, Eagle3Draft
from specd_ref.kimi import KimiConfig, KimiForCausalLM
from specd_ref.targets import MASK_ID


def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_target(target: Path | None, gguf: str | None, dev):
    """The frozen target: a Kimi HF folder (--target) or a Llama GGUF (--gguf, SmolLM2)."""
    if gguf:
        from specd_ref.llama import load_gguf
        return load_gguf(gguf, device=dev)[0]
    return load_target_hf(target, dev)


def load_target_hf(folder: Path, dev) -> KimiForCausalLM:
    cfg = json.loads((folder / "config.json").read_text())
    model = KimiForCausalLM(KimiConfig.from_hf(cfg))
    missing, unexpected = model.load_state_dict(load_hf_state(folder), strict=False)
    if [m for m in missing if "e_score" not in m] or unexpected:
        raise ValueError(f"target checkpoint mismatch: missing {missing} unexpected {unexpected}")
    model.to(dev).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


# SmolLM2-135M drafters (hidden 576, 30 layers). Sized so both bf16 checkpoints fit 24 MB together:
#   DFlash 3 layers × (attn 0.885M + MLP 3·576·384) + fc 4·576² ≈ 5.98M params ≈ 11.96 MB
#   EAGLE-3 fc 3·576² + attn (2H in) 1.66M + MLP 3·576·512 + lm_head 4096·576 ≈ 5.68M ≈ 11.4 MB (+d2t/t2d 81 KB)
SMOL_SIZES = {"dflash_layers": 3, "dflash_intermediate": 384, "eagle3_intermediate": 512,
              "draft_vocab": 4096}


def smol_drafter_config(method: str, tcfg):
    """Drafters for the SmolLM2 target: the target's heads/head_dim (9 / 3 KV / 64), RoPE θ 100000.
    DFlash target_layer_ids follow z-lab's build_target_layer_ids (evenly from layer 1 to L−3):
    L=30, 4 taps → [1, 10, 18, 27] (taps 2, 11, 19, 28). EAGLE-3 taps (2, L//2, L−3) = [2, 15, 27]."""
    from specd_ref.llama import SMOL_MASK_ID
    D, L = tcfg.hidden_size, tcfg.num_hidden_layers
    H, KV, hd = tcfg.num_attention_heads, tcfg.num_key_value_heads, tcfg.head_dim
    if method in ("dflash", "dspark"):
        n = SMOL_SIZES["dflash_layers"]
        ntap = 4
        ids = [round(1 + i * (L - 4) / (ntap - 1)) for i in range(ntap)]
        return DFlashConfig(hidden_size=D, num_hidden_layers=n, num_attention_heads=H, num_key_value_heads=KV,
                            head_dim=hd, intermediate_size=SMOL_SIZES["dflash_intermediate"],
                            vocab_size=tcfg.vocab_size, block_size=16 if method == "dflash" else 7,
                            mask_token_id=SMOL_MASK_ID, target_layer_ids=ids,
                            layer_types=["full_attention"] * n, sliding_window=0, rope_theta=tcfg.rope_theta,
                            rms_norm_eps=1e-6, method=method, markov_rank=64 if method == "dspark" else 0)
    return Eagle3Config(hidden_size=D, num_attention_heads=H, num_key_value_heads=KV, head_dim=hd,
                        intermediate_size=SMOL_SIZES["eagle3_intermediate"], vocab_size=tcfg.vocab_size,
                        draft_vocab_size=SMOL_SIZES["draft_vocab"], aux_layer_ids=[2, L // 2, L - 3],
                        rope_theta=tcfg.rope_theta, rms_norm_eps=1e-6)


def drafter_config(method: str, tcfg: KimiConfig):
    if not isinstance(tcfg, KimiConfig):
        return smol_drafter_config(method, tcfg)
    D = tcfg.hidden_size
    if method == "dflash":
        return DFlashConfig(hidden_size=D, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=64, intermediate_size=512, vocab_size=tcfg.vocab_size, block_size=16,
                            mask_token_id=MASK_ID, target_layer_ids=[0, 2, 4, 6],
                            layer_types=["full_attention", "full_attention", "sliding_attention"],
                            sliding_window=128, method="dflash")
    if method == "dspark":
        return DFlashConfig(hidden_size=D, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=64, intermediate_size=512, vocab_size=tcfg.vocab_size, block_size=7,
                            mask_token_id=MASK_ID, target_layer_ids=[1, 3, 5, 6],
                            layer_types=["full_attention"] * 3, sliding_window=0, method="dspark",
                            markov_rank=64)
    L = tcfg.num_hidden_layers
    return Eagle3Config(hidden_size=D, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                        intermediate_size=768, vocab_size=tcfg.vocab_size, draft_vocab_size=4096,
                        aux_layer_ids=[2, L // 2, L - 3])


def make_drafter(method: str, tcfg: KimiConfig):
    c = drafter_config(method, tcfg)
    return (Eagle3Draft(c) if method == "eagle3" else DFlashDraft(c)), c


def block_inputs(target, seqs: torch.Tensor, anchors: torch.Tensor, B: int, mask_id: int = MASK_ID):
    """Block embeddings/positions for anchors [Bt, nb]: tokens [s_a, MASK…] at a..a+B−1."""
    Bt, nb = anchors.shape
    dev = seqs.device
    pos = anchors[:, :, None] + torch.arange(B, device=dev)[None, None, :]        # [Bt, nb, B]
    toks = torch.full((Bt, nb, B), mask_id, dtype=torch.long, device=dev)
    toks[:, :, 0] = seqs.gather(1, anchors)
    emb = target.model.embed_tokens(toks.view(Bt, nb * B))
    return emb, pos.view(Bt, nb * B), pos


def dflash_loss(model: DFlashDraft, target, seqs, hidden, tlogits, rng, nb: int, lo=None,
                gamma: float | None = None):
    """DFlash / DSpark block loss; `gamma`: the position decay exp(−(k−1)/γ), default 7 (DFlash) / 4 (DSpark)."""
    c = model.config
    B = c.block_size
    Bt, T = seqs.shape
    dev = seqs.device
    taps = torch.cat([hidden[t] for t in c.taps], -1)
    f = model.context(taps)
    if lo is None:
        anchors = torch.from_numpy(rng.integers(16, T - B - 1, size=(Bt, nb))).to(dev)
    else:  # per-row lower bound (the last prompt token: blocks start in the generated part)
        lo = np.minimum(np.maximum(np.asarray(lo), 16), T - B - 2)
        anchors = torch.from_numpy(rng.integers(lo[:, None], T - B - 1, size=(Bt, nb))).to(dev)
    emb, bpos, pos3 = block_inputs(target, seqs, anchors, B, c.mask_token_id)
    ctx_pos = torch.arange(T, device=dev)[None].expand(Bt, T)
    ctx_valid = ctx_pos[:, None, :] < anchors[:, :, None]                         # [Bt, nb, T]
    blk_id = torch.arange(nb, device=dev).repeat_interleave(B)
    h = model.forward_blocks(f, ctx_pos, ctx_valid, emb, bpos, blk_id).view(Bt, nb, B, -1)
    if c.method == "dflash":
        slots = torch.arange(1, B, device=dev)                                    # predicts own position
        hs = h[:, :, 1:]
        lab_pos = pos3[:, :, 1:]
        w = decay_weights(B - 1, 7.0 if gamma is None else gamma, dev)
    else:
        slots = torch.arange(0, B, device=dev)                                    # predicts next token
        hs = h
        lab_pos = pos3 + 1
        w = decay_weights(B, 4.0 if gamma is None else gamma, dev)
    labels = seqs.gather(1, lab_pos.reshape(Bt, -1)).view_as(lab_pos)
    rows = torch.arange(Bt, device=dev)[:, None]
    p_t = tlogits[rows, (lab_pos - 1).reshape(Bt, -1)].float().softmax(-1).view(*lab_pos.shape, -1)
    logits = target.lm_head(hs).float()
    if c.method == "dflash":
        logp = logits.log_softmax(-1)
        ce = -logp.gather(-1, labels[..., None])[..., 0]
        soft = -(p_t * logp).sum(-1)
        per = 0.5 * ce + 0.5 * soft
        loss = (per * w).sum(-1).mean() / w.sum()
        acc = (logits.argmax(-1) == labels).float().mean(dim=(0, 1))
        return loss, {"acc_per_slot": acc.tolist()}
    prev = seqs.gather(1, pos3.reshape(Bt, -1)).view_as(pos3)                    # token at p+j
    logits = logits + model.markov_bias(prev).float()
    logp = logits.log_softmax(-1)
    p_d = logp.exp()
    ce = -logp.gather(-1, labels[..., None])[..., 0]
    tv = 0.5 * (p_d - p_t).abs().sum(-1)
    bce = F.binary_cross_entropy_with_logits(model.confidence_logit(hs, prev), (1 - tv).detach().float())
    per = 0.1 * ce + 0.9 * 2 * tv
    loss = (per * w).sum(-1).mean() / w.sum() + bce
    acc = (logits.argmax(-1) == labels).float().mean(dim=(0, 1))
    return loss, {"acc_per_slot": acc.tolist(), "bce": bce.item()}


def eagle3_loss(model: Eagle3Draft, target, seqs, hidden, tlogits, steps: int = 6):
    c = model.config
    Bt, T = seqs.shape
    dev = seqs.device
    taps = torch.cat([hidden[t] for t in c.taps], -1)
    emb_all = target.model.embed_tokens(seqs)
    emb_next = [torch.cat([emb_all[:, j + 1:], emb_all[:, :j + 1] * 0], 1) for j in range(steps)]
    hs = model.ttt_forward(taps, emb_next, steps)
    vocab = torch.nonzero(model.t2d, as_tuple=True)[0]
    tot, accs = 0.0, []
    for j, h in enumerate(hs):
        n = T - j - 2                                   # anchors t with label x_{t+j+2} inside
        logp = model.logits(h[:, :n]).log_softmax(-1)
        p_t = tlogits[:, j + 1:j + 1 + n].float().softmax(-1)[..., vocab]
        p_t = p_t / p_t.sum(-1, keepdim=True).clamp_min(1e-9)
        soft = -(p_t * logp).sum(-1)
        labels = seqs[:, j + 2:j + 2 + n]
        in_vocab = model.t2d[labels]
        dlab = torch.searchsorted(vocab, labels).clamp_max(len(vocab) - 1)
        ce = -logp.gather(-1, dlab[..., None])[..., 0] * in_vocab
        tot = tot + (0.8 ** j) * (0.5 * soft + 0.5 * ce).mean()
        accs.append(((model.draft_to_target(logp.argmax(-1)) == labels).float().mean()).item())
    return tot / sum(0.8 ** j for j in range(steps)), {"acc_per_step": accs}


def train(method: str, target_dir: Path, regen_dir: Path, out: Path, minutes: float, seed: int = 0,
          batch: int = 32, lr: float = 1e-3, max_steps: int = 6000, gguf: str | None = None,
          eval_every: int = 200, resume: bool = False, init: Path | None = None,
          stop_after: float | None = None, decay_gamma: float | None = None):
    """Trains one drafter for `minutes` of wall time in all (with `resume`, across calls: each call
    continues from out/last.pt — model, optimiser, step, log, RNG, seconds spent — until the total
    budget or `max_steps` is used; the LR schedule runs over the total).
    `init`: an HF folder of the same drafter (config equal to this one's) to start from instead of random
    weights — a shipped checkpoint trained further on new data; fresh optimiser, step 0, schedule from the
    start; the EAGLE-3 draft vocabulary is the checkpoint's (`d2t`/`t2d` come with its state).
    `stop_after`: leave this call after that many minutes (last.pt saved) although the budget is not
    used up; the next call continues with `resume` (a GPU call is limited to 10 minutes).
    `decay_gamma`: DFlash/DSpark's position decay γ (None: 7 / 4; `dflash_loss`)."""
    if decay_gamma is not None and (method == "eagle3" or not decay_gamma > 0):
        raise ValueError(f"--decay-gamma {decay_gamma}: a positive γ, for dflash or dspark only")
    dev = device()
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    t_load = time.time()
    target = load_target(target_dir, gguf, dev)
    meta = json.loads((regen_dir / "meta.json").read_text())
    data = torch.from_numpy(np.fromfile(regen_dir / "tokens.u16", dtype=np.uint16).astype(np.int64)
                            .reshape(meta["sequences"], meta["length"]))
    n_val = min(256, meta["sequences"] // 8)
    val, trn = data[:n_val], data[n_val:]
    plens = None
    if (regen_dir / "prompt_lens.u16").exists():
        plens = np.fromfile(regen_dir / "prompt_lens.u16", dtype=np.uint16).astype(np.int64) - 1
    print(f"{method}: target loaded in {time.time() - t_load:.1f}s; {len(trn)} train / {n_val} val rows "
          f"of {meta['length']} tokens", flush=True)
    model, cfg = make_drafter(method, target.config)
    model.init_weights()
    if method == "eagle3":
        counts = torch.bincount(trn.flatten(), minlength=cfg.vocab_size)
        top = torch.topk(counts, cfg.draft_vocab_size).indices.sort().values
        model.set_vocab(top)
        print(f"eagle3: draft vocab {cfg.draft_vocab_size} covers {counts[top].sum().item() / counts.sum().item():.4f}"
              f" of the training tokens", flush=True)
    init_info = None
    if init is not None:
        icfg = json.loads((init / "config.json").read_text())
        if type(cfg).from_hf(icfg) != cfg:
            raise ValueError(f"--init {init}: its config.json describes another drafter than this {method} "
                             f"one: {type(cfg).from_hf(icfg)} vs {cfg}")
        model.load_state_dict(load_hf_state(init), strict=True)
        init_info = {"folder": str(init)}
        out.mkdir(parents=True, exist_ok=True)
        (out / "init.json").write_text(json.dumps(init_info) + "\n")
        print(f"{method}: weights from {init}", flush=True)
    model.to(dev)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                            betas=(0.9, 0.95), weight_decay=0.01)
    out.mkdir(parents=True, exist_ok=True)
    log, best, step, t0 = [], math.inf, 0, time.time()
    budget = minutes * 60
    if resume and (out / "last.pt").exists():
        ck = torch.load(out / "last.pt", map_location=dev, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, log, best = ck["step"], ck["log"], ck["best"]
        rng = ck["rng"]
        t0 = time.time() - ck["seconds"]  # the schedule and the budget count the earlier calls
        if decay_gamma is None:
            decay_gamma = ck.get("decay_gamma")  # the γ the earlier calls trained with
        elif ck.get("decay_gamma") != decay_gamma:
            raise ValueError(f"--decay-gamma {decay_gamma}: {out / 'last.pt'} was trained with γ "
                             f"{ck.get('decay_gamma')} (None: the default)")
        print(f"{method}: resumed at step {step} ({ck['seconds']:.0f}s spent, best val {best:.4f})", flush=True)

    def save_last():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "log": log, "best": best,
                    "rng": rng, "seconds": time.time() - t0, "decay_gamma": decay_gamma}, out / "last.pt")

    def run_batch(seqs, train_mode, lo=None):
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            tlogits, hidden, _ = target(seqs)
        hidden = [h.detach() for h in hidden]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            if method == "eagle3":
                return eagle3_loss(model, target, seqs, hidden, tlogits)
            return dflash_loss(model, target, seqs, hidden, tlogits, rng, nb=8 if method == "dflash" else 16,
                               lo=lo, gamma=decay_gamma)

    t_call = time.time()
    while step < max_steps and time.time() - t0 < budget:
        if stop_after is not None and time.time() - t_call > stop_after * 60:
            print(f"{method}: leaving this call after {stop_after} min at step {step} "
                  f"({time.time() - t0:.0f}s of {budget:.0f}s spent)", flush=True)
            save_last()
            return
        frac = min(step / 100, 1.0) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min((time.time() - t0) / budget, 1))))
        for g in opt.param_groups:
            g["lr"] = lr * frac
        idx = torch.from_numpy(rng.integers(0, len(trn), size=batch))
        loss, info = run_batch(trn[idx].to(dev), True, None if plens is None else plens[n_val:][idx.numpy()])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % eval_every == 0:
            model.eval()
            with torch.no_grad():
                vl, vi = [], None
                vrng = np.random.default_rng(123)
                for i in range(0, n_val, batch):
                    saved = rng
                    rng = vrng
                    l, vi = run_batch(val[i:i + batch].to(dev), False,
                                      None if plens is None else plens[:n_val][i:i + batch])
                    rng = saved
                    vl.append(l.item())
            model.train()
            rec = {"step": step, "train_loss": loss.item(), "val_loss": float(np.mean(vl)), **vi,
                   "seconds": time.time() - t0}
            log.append(rec)
            print(json.dumps(rec), flush=True)
            if rec["val_loss"] < best:
                best = rec["val_loss"]
                torch.save({"model": model.state_dict(), "step": step}, out / "best.pt")
            save_last()
    save_last()
    if not (out / "best.pt").exists():
        torch.save({"model": model.state_dict(), "step": step}, out / "best.pt")
    if init_info is None and (out / "init.json").exists():
        init_info = json.loads((out / "init.json").read_text())
    (out / "log.json").write_text(json.dumps({"log": log, "best_val": best, "steps": step, "init": init_info,
                                              "decay_gamma": decay_gamma, "lr": lr,
                                              "seconds": time.time() - t0,
                                              "params": sum(p.numel() for p in model.parameters())}, indent=2))
    model.load_state_dict(torch.load(out / "best.pt", map_location=dev)["model"])
    names = save_hf_folder(out / "hf", model.state_dict(), cfg.to_hf())
    print(f"{method}: {step} steps in {time.time() - t0:.0f}s, best val {best:.4f}; wrote {out / 'hf'} "
          f"({sum((out / 'hf' / n).stat().st_size for n in names) / 1e6:.2f} MB)", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("method", choices=["dflash", "dspark", "eagle3"])
    ap.add_argument("--target", type=Path, help="Kimi target HF folder")
    ap.add_argument("--gguf", help="Llama-family GGUF target (SmolLM2-135M-Instruct) instead of --target")
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--draft-vocab", type=int, help="SmolLM2 EAGLE-3 draft vocabulary (default 4096)")
    ap.add_argument("--regen", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=6.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-steps", type=int, default=6000)
    ap.add_argument("--resume", action="store_true",
                    help="continue from OUT/last.pt; --minutes is then the total budget over all calls")
    ap.add_argument("--init", type=Path, help="start from this HF folder of the same drafter (not with a last.pt)")
    ap.add_argument("--stop-after", type=float, help="leave this call after N minutes (resume later)")
    ap.add_argument("--decay-gamma", type=float,
                    help="DFlash/DSpark loss decay γ over block positions, exp(-(k-1)/γ) (default 7 / 4)")
    a = ap.parse_args()
    if not (a.target or a.gguf):
        ap.error("one of --target / --gguf is required")
    if a.draft_vocab:
        SMOL_SIZES["draft_vocab"] = a.draft_vocab
    train(a.method, a.target, a.regen, a.out, a.minutes, batch=a.batch, max_steps=a.max_steps, gguf=a.gguf,
          eval_every=a.eval_every, lr=a.lr, resume=a.resume, init=a.init, stop_after=a.stop_after,
          decay_gamma=a.decay_gamma)
