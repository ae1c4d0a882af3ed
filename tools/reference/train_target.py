"""Stage 1 (GPU): train the kimi-k3-tiny target; stage 2: regenerate drafter training data with it.

  python train_target.py target --work W [--minutes 6.5] [--resume]
      trains on W/data/*.train.u16 while held-out loss falls; keeps the best checkpoint in
      W/target/best.pt (fp32 weights, optimizer, step, rng) and writes W/target/log.json.
  python train_target.py regen --work W [--sequences 16384] [--length 256] [--target HF_FOLDER] [--seed 1]
                               [--greedy-every 2] [--max-seconds S] [--regen-out DIR]
      the target's own continuations of train-split windows: one batch in --greedy-every sampled at T=1, the others
      greedy (default 2: half and half); writes W/regen/tokens.u16 ([N, length] uint16) and W/regen/meta.json (or
      into --regen-out). --target: the shipped HF folder instead of W/target/best.pt; --max-seconds: stop before the
      first batch that starts after it (the rows so far are kept).
Seeded; each stage fits one 10-minute run on one H200.
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

from specd_ref.kimi import KimiForCausalLM
from specd_ref.targets import DOMAINS, TokenData, tiny_config


def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@torch.no_grad()
def heldout_nll(model, data: TokenData, length=512, max_windows=64, batch=16) -> dict:
    model.eval()
    out = {}
    dev = next(model.parameters()).device
    for d in DOMAINS:
        w = data.windows(d, length + 1, max_windows)
        tot, n = 0.0, 0
        for i in range(0, len(w), batch):
            x = w[i:i + batch].to(dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                logits, _, _ = model(x[:, :-1], keep_hidden=False)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
            tot += loss.item()
            n += x[:, 1:].numel()
        out[d] = tot / n
    model.train()
    return out


def train_target(work: Path, minutes: float, resume: bool, seed: int = 0, batch: int = 64,
                 length: int = 512, lr: float = 2e-3, max_steps: int = 4000, eval_every: int = 250):
    dev = device()
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train, held = TokenData(work / "data", "train"), TokenData(work / "data", "heldout")
    cfg = tiny_config()
    model = KimiForCausalLM(cfg).to(dev)
    model.init_weights()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                            betas=(0.9, 0.95), weight_decay=0.1)
    out = work / "target"
    out.mkdir(parents=True, exist_ok=True)
    step, log, best = 0, [], math.inf
    if resume and (out / "last.pt").exists():
        ck = torch.load(out / "last.pt", map_location=dev)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, log, best = ck["step"], ck["log"], ck["best"]
        rng = np.random.default_rng(seed + step)
    t0 = time.time()
    warm = 100
    stale = 0
    while step < max_steps and time.time() - t0 < minutes * 60:
        frac = min(step / warm, 1.0) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step / max_steps, 1.0))))
        for gparam in opt.param_groups:
            gparam["lr"] = lr * frac
        x = train.batch(rng, batch, length + 1).to(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits, _, _ = model(x[:, :-1], keep_hidden=False)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free load balancing (DeepSeek-V3 §2.1.2)
            for moe in model.moe_layers():
                counts = torch.bincount(moe.last_ids.flatten(), minlength=cfg.num_experts).float()
                moe.gate.e_score_correction_bias += 1e-3 * torch.sign(counts.mean() - counts)
        step += 1
        if step % eval_every == 0 or step == max_steps:
            nll = heldout_nll(model, held)
            mean = float(np.mean(list(nll.values())))
            rec = {"step": step, "train_loss": loss.item(), "heldout_nll": nll, "heldout_mean": mean,
                   "tokens": step * batch * length, "seconds": time.time() - t0}
            log.append(rec)
            print(json.dumps(rec), flush=True)
            if mean < best - 1e-3:
                best, stale = mean, 0
                torch.save({"model": model.state_dict(), "config": cfg.__dict__, "step": step}, out / "best.pt")
            else:
                stale += 1
                if stale >= 2:
                    print("held-out loss stopped falling; stopping", flush=True)
                    break
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "log": log, "best": best},
               out / "last.pt")
    (out / "log.json").write_text(json.dumps({"log": log, "best_heldout_mean": best,
                                              "params": sum(p.numel() for p in model.parameters())}, indent=2))


def load_target(work: Path, dev=None) -> KimiForCausalLM:
    dev = dev or device()
    ck = torch.load(work / "target" / "best.pt", map_location=dev)
    model = KimiForCausalLM(tiny_config()).to(dev)
    model.load_state_dict(ck["model"])
    model.eval()
    return model


@torch.no_grad()
def generate(model, prompts: torch.Tensor, new_tokens: int, temperature: float, gen: torch.Generator | None):
    """Batched incremental decoding with caches. prompts: [B, L0] (all the same length)."""
    dev = prompts.device
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        logits, _, caches = model(prompts, keep_hidden=False)
        out = [prompts]
        last = logits[:, -1].float()
        for _ in range(new_tokens):
            if temperature <= 0:
                nxt = last.argmax(-1)
            else:
                nxt = torch.multinomial(torch.softmax(last / temperature, -1), 1, generator=gen)[:, 0]
            out.append(nxt[:, None])
            logits, _, caches = model(nxt[:, None], caches, mode="recurrent", keep_hidden=False)
            last = logits[:, -1].float()
    return torch.cat(out, dim=1)


def regen(work: Path, sequences: int, length: int, prompt_len: int = 48, batch: int = 1024, seed: int = 1,
          target: Path | None = None, greedy_every: int = 2, max_seconds: float = 1e9, out: Path | None = None):
    dev = device()
    if target is not None:
        from train_drafters import load_target_hf
        model = load_target_hf(target, dev)
    else:
        model = load_target(work, dev)
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=dev).manual_seed(seed)
    train = TokenData(work / "data", "train")
    rows = []
    t0 = time.time()
    for i in range(0, sequences, batch):
        if time.time() - t0 > max_seconds:
            print(f"regen: time box {max_seconds}s reached after {sum(len(r) for r in rows)} sequences", flush=True)
            break
        # batch j is sampled at T=1 when j % greedy_every == greedy_every - 1 (default 2: alternating, greedy first)
        temp = 1.0 if greedy_every > 0 and (i // batch) % greedy_every == greedy_every - 1 else 0.0
        prompts = train.batch(rng, min(batch, sequences - i), prompt_len).to(dev)
        rows.append(generate(model, prompts, length - prompt_len, temp, gen).cpu().numpy().astype(np.uint16))
        print(f"regen {i + len(rows[-1])}/{sequences} T={temp} {time.time() - t0:.0f}s", flush=True)
    out = out or work / "regen"
    out.mkdir(parents=True, exist_ok=True)
    arr = np.concatenate(rows)
    arr.tofile(out / "tokens.u16")
    (out / "meta.json").write_text(json.dumps({"sequences": int(arr.shape[0]), "length": length,
                                               "prompt_len": prompt_len, "seed": seed,
                                               "greedy_and_t1": f"one batch of {batch} in {greedy_every} at T=1",
                                               "target": str(target) if target else "W/target/best.pt",
                                               "seconds": time.time() - t0}))


def export_target(work: Path, out: Path) -> None:
    """Write the best checkpoint as an HF folder: config.json, bf16 safetensors (sharded ≤ 15 MiB),
    tokenizer.json, tokenizer_config.json, generation_config.json."""
    from specd_ref.common import save_hf_folder
    from specd_ref.kimi import hf_config
    ck = torch.load(work / "target" / "best.pt", map_location="cpu")
    cfg = tiny_config()
    tok_dir = work / "tokenizer"
    extra = {
        "tokenizer.json": (tok_dir / "tokenizer.json").read_text(),
        "tokenizer_config.json": (tok_dir / "tokenizer_config.json").read_text(),
        "generation_config.json": json.dumps({"eos_token_id": 0, "pad_token_id": 2, "do_sample": False,
                                              "max_new_tokens": 128}, indent=2) + "\n",
    }
    save_hf_folder(out, ck["model"], hf_config(cfg, eos_token_id=0, pad_token_id=2, bos_token_id=None,
                                               max_position_embeddings=4096), extra_files=extra)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stage", choices=["target", "regen", "export"])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=6.5)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--sequences", type=int, default=16384)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--max-steps", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--target", type=Path, help="regen: the target's HF folder (default W/target/best.pt)")
    ap.add_argument("--seed", type=int, default=1, help="regen: prompt windows and sampling seed")
    ap.add_argument("--greedy-every", type=int, default=2, help="regen: one batch in N sampled at T=1")
    ap.add_argument("--max-seconds", type=float, default=1e9, help="regen: time box")
    ap.add_argument("--regen-out", type=Path, help="regen: output folder (default W/regen)")
    a = ap.parse_args()
    if a.stage == "target":
        train_target(a.work, a.minutes, a.resume, max_steps=a.max_steps, batch=a.batch)
    elif a.stage == "regen":
        regen(a.work, a.sequences, a.length, seed=a.seed, target=a.target, greedy_every=a.greedy_every,
              max_seconds=a.max_seconds, out=a.regen_out)
    else:
        export_target(a.work, a.out)
