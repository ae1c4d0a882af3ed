"""Reference acceptance length τ of a drafter on the committed held-out prompt sets.

  python eval_tau.py --target models/kimi-k3-tiny --drafter models/kimi-k3-tiny-dflash \
      --prompts test/prompts --temperature 0 [--block-size 7] [--limit N] --out tau.json

A real speculative-decoding loop in fp32 (no autocast, TF32 off) on the bf16-rounded checkpoint
weights: prefill → propose → verify (one target forward over [bonus, drafts]) → accept → commit.
- Greedy: accept the longest prefix equal to the target argmax, then one bonus token.
- Temperature > 0: rejection sampling (Leviathan et al. 2211.17192): accept d with prob
  min(1, p(d)/q(d)); at the first rejection sample from norm(max(0, p − q)); bonus from p.
- Commit: the target state for the committed tokens is rebuilt by replaying them from the
  pre-verify caches (reference simplicity); the taps of the committed tokens come from the verify pass.
- 128 new tokens per prompt, EOS ignored (as `ignore_eos`); the last step drafts at most the tokens
  still needed (as z-lab's loop).
SmolLM2 target: --gguf PATH instead of --target, prompts from regen_smollm2.py (--prompts smollm2/prompts
--domains chat,plain); the target runs in fp32 on the dequantised GGUF weights.
τ = mean over verify steps of (accepted + 1). The standard error treats prompts as clusters
(delta method for the ratio Σ committed / Σ steps).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from specd_ref.common import load_hf_state
from specd_ref.dflash import DFlashConfig, DFlashDraft
from specd_ref.eagle3 import Eagle3Config, Eagle3Draft
from train_drafters import load_target, load_target_hf  # noqa: F401 (load_target_hf: goldens.py)


def load_drafter(folder: Path, dev):
    cfg = json.loads((folder / "config.json").read_text())
    arch = cfg["architectures"][0]
    if arch == "LlamaForCausalLMEagle3":
        m = Eagle3Draft(Eagle3Config.from_hf(cfg))
    else:
        m = DFlashDraft(DFlashConfig.from_hf(cfg))
    m.load_state_dict(load_hf_state(folder))
    return m.to(dev).eval()


def probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, -1)


class Proposer:
    """Wraps a drafter: propose(ctx_taps [1, p, n·D], tokens [p+1], k) → (drafts [k], q [k, V] | None)."""

    def __init__(self, drafter, target, temperature: float, gen: torch.Generator, block_size: int | None):
        self.d, self.t, self.temp, self.gen = drafter, target, temperature, gen
        self.is_eagle = isinstance(drafter, Eagle3Draft)
        self.block = None if self.is_eagle else (block_size or drafter.config.block_size)
        self.chain = 6

    @property
    def taps(self):
        return self.d.config.taps

    @property
    def max_drafts(self):
        if self.is_eagle:
            return self.chain
        return self.block if self.d.config.method == "dspark" else self.block - 1

    def pick(self, logits):
        if self.temp <= 0:
            return logits.argmax(-1), None
        q = probs(logits, self.temp)
        return torch.multinomial(q, 1, generator=self.gen)[:, 0], q

    def propose(self, taps: torch.Tensor, tokens: torch.Tensor, k: int):
        if self.is_eagle:
            return self._eagle(taps, tokens, k)
        c = self.d.config
        p = tokens.numel() - 1                           # position of the bonus token
        dev = tokens.device
        f = self.d.context(taps)
        B = self.block
        pos = torch.arange(p, p + B, device=dev)[None]
        blk = torch.full((1, B), c.mask_token_id, dtype=torch.long, device=dev)
        blk[0, 0] = tokens[-1]
        emb = self.t.model.embed_tokens(blk)
        ctx_pos = torch.arange(p, device=dev)[None]
        valid = torch.ones(1, 1, p, dtype=torch.bool, device=dev)
        h = self.d.forward_blocks(f, ctx_pos, valid, emb, pos, torch.zeros(B, dtype=torch.long, device=dev))[0]
        if c.method == "dflash":
            d, q = self.pick(self.t.lm_head(h[1:1 + k]).float())
            return d, q
        base = self.t.lm_head(h).float()
        prev = tokens[-1]
        ds, qs = [], []
        for j in range(k):
            lj = base[j] + self.d.markov_bias(prev[None])[0].float()
            dj, qj = self.pick(lj[None])
            ds.append(dj[0])
            if qj is not None:
                qs.append(qj[0])
            prev = dj[0]
        return torch.stack(ds), (torch.stack(qs) if qs else None)

    def _eagle(self, taps, tokens, k):
        d = self.d
        c = d.config
        p = tokens.numel() - 1
        dev = tokens.device
        g = d.fc(taps)                                               # [1, p, H]
        emb = self.t.model.embed_tokens(tokens[1:][None])            # x_{t+1} for t = 0..p−1
        pos = torch.arange(p, device=dev)[None]
        q, K, V = d.qkv(emb, g, pos)
        rep = c.num_attention_heads // c.num_key_value_heads
        K, V = K.repeat_interleave(rep, 2), V.repeat_interleave(rep, 2)
        scale = c.head_dim ** -0.5
        qa = q[:, -1:]                                               # anchor t = p−1
        ga = g[:, -1:]
        ds, qs = [], []
        for j in range(k):
            att = (torch.einsum("bqhd,bshd->bhqs", qa.float(), K.float()) * scale).softmax(-1)
            o = torch.einsum("bhqs,bshd->bqhd", att, V.float()).reshape(1, 1, -1)
            ga = d.finish(ga, o)
            dj, qj = self.pick(d.logits(ga)[0])
            tj = d.draft_to_target(dj)
            ds.append(tj[0])
            if qj is not None:
                full = torch.zeros(1, c.vocab_size, device=dev)
                full[0, d.draft_to_target(torch.arange(c.draft_vocab_size, device=dev))] = qj[0]
                qs.append(full[0])
            if j + 1 < k:
                qa, kj, vj = d.qkv(self.t.model.embed_tokens(tj[None]), ga,
                                   torch.tensor([[p + j]], device=dev))
                K = torch.cat([K, kj.repeat_interleave(rep, 2)], 1)
                V = torch.cat([V, vj.repeat_interleave(rep, 2)], 1)
        return torch.stack(ds), (torch.stack(qs) if qs else None)


def accept(drafts, q, logits, temperature, gen):
    """logits: [k+1, V] target logits at [bonus, d_0..d_{k−1}] → (n accepted, next token)."""
    k = drafts.numel()
    if temperature <= 0:
        tgt = logits.argmax(-1)
        n = 0
        while n < k and drafts[n] == tgt[n]:
            n += 1
        return n, tgt[n]
    p = probs(logits, temperature)
    for i in range(k):
        x = drafts[i]
        qx = q[i, x] if q is not None else torch.tensor(1.0)
        if torch.rand((), generator=gen, device=p.device) * qx < p[i, x]:
            continue
        resid = (p[i] - (q[i] if q is not None else torch.nn.functional.one_hot(x, p.shape[-1]).float())).clamp_min(0)
        resid = resid / resid.sum() if resid.sum() > 0 else p[i]
        return i, torch.multinomial(resid, 1, generator=gen)[0]
    return k, torch.multinomial(p[k], 1, generator=gen)[0]


@torch.no_grad()
def spec_generate(target, prop: Proposer, prompt_ids: list[int], new_tokens: int, temperature: float, gen):
    dev = next(target.parameters()).device
    ids = torch.tensor(prompt_ids, device=dev)
    logits, hidden, caches = target(ids[None])
    taps = torch.cat([hidden[t] for t in prop.taps], -1)             # [1, p, n·D]
    first, _ = prop.pick(logits[:, -1]) if temperature > 0 else (logits[0, -1].argmax()[None], None)
    tokens = torch.cat([ids, first.view(1)])
    steps = []
    while tokens.numel() - len(prompt_ids) < new_tokens:
        remaining = new_tokens - (tokens.numel() - len(prompt_ids))
        k = min(prop.max_drafts, remaining)
        if k > 0:
            drafts, q = prop.propose(taps, tokens, k)
        else:
            drafts, q = tokens[:0], None
        block = torch.cat([tokens[-1:], drafts])
        vlogits, vhidden, _ = target(block[None], caches, mode="chunked", chunk=32)
        n, nxt = accept(drafts, q, vlogits[0], temperature, gen)
        _, _, caches = target(block[None, : n + 1], caches, mode="chunked", chunk=32, keep_hidden=False)
        vt = torch.cat([vhidden[t] for t in prop.taps], -1)[:, : n + 1]
        taps = torch.cat([taps, vt], 1)
        tokens = torch.cat([tokens, drafts[:n], nxt.view(1)])
        steps.append(n + 1)
    return tokens[len(prompt_ids):].tolist(), steps


@torch.no_grad()
def plain_greedy(target, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """Plain greedy decoding (one token per target forward), the losslessness reference."""
    dev = next(target.parameters()).device
    logits, _, caches = target(torch.tensor(prompt_ids, device=dev)[None], keep_hidden=False)
    out = [int(logits[0, -1].argmax())]
    while len(out) < new_tokens:
        logits, _, caches = target(torch.tensor([[out[-1]]], device=dev), caches, mode="recurrent",
                                   keep_hidden=False)
        out.append(int(logits[0, -1].argmax()))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=Path, help="Kimi target HF folder")
    ap.add_argument("--gguf", help="Llama-family GGUF target (SmolLM2-135M-Instruct) instead of --target")
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--block-size", type=int)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--domains", default="prose,code", help="comma-separated prompt sets to run")
    ap.add_argument("--no-plain-check", action="store_true",
                    help="skip comparing greedy speculative output with plain greedy decoding")
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if not (a.target or a.gguf):
        ap.error("one of --target / --gguf is required")
    target = load_target(a.target, a.gguf, dev)
    drafter = load_drafter(a.drafter, dev)
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    prop = Proposer(drafter, target, a.temperature, gen, a.block_size)
    result = {"target": str(a.gguf or a.target), "drafter": str(a.drafter), "temperature": a.temperature,
              "block_size": prop.block, "max_drafts": prop.max_drafts, "new_tokens": a.new_tokens,
              "definition": "mean over verify steps of (accepted + 1)", "domains": {}}
    t0 = time.time()
    result["device"] = dev.type
    for name in a.domains.split(","):
        rows = [json.loads(l) for l in open(a.prompts / f"{name}.jsonl")][: a.limit]
        per = []
        mismatches = 0
        for r in rows:
            out, steps = spec_generate(target, prop, r["prompt_token_ids"], a.new_tokens, a.temperature, gen)
            if a.temperature <= 0 and not a.no_plain_check:
                plain = plain_greedy(target, r["prompt_token_ids"], a.new_tokens)
                n_same = next((i for i, (x, y) in enumerate(zip(out, plain)) if x != y), len(plain))
                if n_same < a.new_tokens:
                    print(f"warning: {r['id']} speculative output differs from plain greedy at token {n_same}")
                mismatches = mismatches + (n_same < a.new_tokens)
            per.append({"id": r["id"], "steps": len(steps), "committed": sum(steps),
                        "hist": steps, **({"output_ids": out} if a.temperature <= 0 else {})})
        S = sum(x["steps"] for x in per)
        A = sum(x["committed"] for x in per)
        tau = A / S
        n = len(per)
        se = math.sqrt(n / max(n - 1, 1) * sum((x["committed"] - tau * x["steps"]) ** 2 for x in per)) / S
        pos = [0] * (prop.max_drafts + 1)
        for x in per:
            for s in x["hist"]:
                for i in range(s - 1):
                    pos[i] += 1
        result["domains"][name] = {
            "tau": tau, "tau_se": se, "verify_steps": S, "prompts": n,
            "tau_mean_of_request_means": sum(x["committed"] / x["steps"] for x in per) / n,
            "per_position_acceptance": [c / S for c in pos[: prop.max_drafts]],
            **({"outputs_differing_from_plain_greedy": mismatches}
               if a.temperature <= 0 and not a.no_plain_check else {}),
            "requests": per,
        }
        print(f"{name}: tau {tau:.3f} ± {se:.3f} over {S} verify steps, {n} prompts ({time.time() - t0:.0f}s)",
              flush=True)
        if a.out:  # written after each domain so a time-limited run keeps what it finished
            a.out.write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
