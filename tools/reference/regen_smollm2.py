"""Drafter data for SmolLM2-135M-Instruct: the target's own outputs on chat-style and plain-text prompts.

  # CPU, once (needs the corpus work dir: corpus.py; and the `tokenizers` package):
  python regen_smollm2.py prompts --work work --gguf G --out smollm2/prompts
  # GPU (or a tiny CPU smoke run): token ids only, no tokenizer needed
  python regen_smollm2.py gen --gguf G --prompts smollm2/prompts --out R --sequences 4096 --length 320

`prompts` writes (then run `ngram_check.py filter`: no training prompt may share a content 8-gram with a held-out
one), from the shipped corpora (work/corpus: brown, nlp, sotu prose and TypeScript code):
  train_prompts.u16 (concatenated ids), train_prompts.len.u16 (one length per prompt),
  train_prompts.json (kind per prompt and counts) — half chat, half plain, from the train splits;
  chat.jsonl, plain.jsonl — held-out prompt sets (from the held-out splits) for eval_tau.py and goldens,
  in test/prompts' format {"id", "kind", "domain", "prompt", "prompt_token_ids"}.
Chat prompts = SmolLM2's ChatML template (default system turn) around a user turn made of an instruction
("Summarize …", "Continue the story …", "Explain this code …", …) and a corpus snippet of 16–64 tokens;
plain prompts = a raw corpus snippet of 24–96 tokens. Snippets containing control tokens are skipped.

`gen` writes R/tokens.u16 [sequences, length] (prompt then continuation, EOS ignored, as eval_tau),
R/prompt_lens.u16 [sequences], R/meta.json. Prompts are sorted by length and generated in left-padded
batches with a KV cache; batches alternate greedy and T=0.8 (--temperatures). --max-seconds stops
starting new batches (what is done is written).
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch

from specd_ref.llama import SMOL_MASK_ID, chatml, generate, load_gguf, load_tokenizer

PROSE = ["brown", "nlp", "sotu"]
PROSE_TASKS = [
    "Summarize the following text:\n\n{x}",
    "Continue the story:\n\n{x}",
    "Rewrite this passage in simpler words:\n\n{x}",
    "What is the main idea of this paragraph?\n\n{x}",
    "Write a short reply to this:\n\n{x}",
    "Explain the following passage to a high-school student:\n\n{x}",
    "List three questions a reader might ask about this text:\n\n{x}",
    "Write a title for this text:\n\n{x}",
    "{x}\n\nWhat happens next?",
    "Is the tone of this text positive or negative? Explain.\n\n{x}",
]
CODE_TASKS = [
    "Explain this code:\n\n```ts\n{x}\n```",
    "What does this TypeScript code do?\n\n```ts\n{x}\n```",
    "Add comments to this code:\n\n```ts\n{x}\n```",
    "Find possible bugs in this code:\n\n```ts\n{x}\n```",
    "Rewrite this code in Python:\n\n```ts\n{x}\n```",
    "Write documentation for this code:\n\n```ts\n{x}\n```",
]
N_CONTROL = 17  # ids 0..16 are control tokens in SmolLM2's vocabulary


def read_docs(work: Path, domain: str, split: str) -> list[str]:
    with open(work / "corpus" / f"{domain}.{split}.jsonl") as f:
        return [json.loads(l)["text"] for l in f]


def snippet(tok, rng: random.Random, text: str, n: int) -> str | None:
    """~n tokens of text starting at a line/word boundary, decoded back to text (clean UTF-8)."""
    if len(text) < 200:
        return None
    start = rng.randrange(0, max(1, len(text) - n * 8))
    nl = text.find("\n", start)
    sp = text.find(" ", start)
    cut = nl + 1 if 0 <= nl < start + 200 else (sp + 1 if sp >= 0 else start)
    ids = tok.encode(text[cut:cut + n * 10]).ids[:n]
    if len(ids) < n or min(ids) < N_CONTROL:
        return None
    s = tok.decode(ids)
    if "\ufffd" in s:
        return None
    return s.strip("\n")


def make_prompt(tok, rng: random.Random, docs: dict, kind: str, split_name: str):
    while True:
        domain = rng.choice(PROSE + ["code"] if kind == "chat" else PROSE + ["code", "code"])
        text = rng.choice(docs[domain])
        if kind == "chat":
            x = snippet(tok, rng, text, rng.randint(16, 64))
            if x is None:
                continue
            task = rng.choice(CODE_TASKS if domain == "code" else PROSE_TASKS)
            prompt = chatml([{"role": "user", "content": task.format(x=x)}])
        else:
            x = snippet(tok, rng, text, rng.randint(24, 96))
            if x is None:
                continue
            prompt = x
        ids = tok.encode(prompt).ids
        if SMOL_MASK_ID in ids:
            continue
        return domain, prompt, ids


def build_prompts(work: Path, gguf: str, out: Path, train_n: int, heldout_n: int, seed: int = 7) -> dict:
    tok = load_tokenizer(gguf)
    out.mkdir(parents=True, exist_ok=True)
    stats = {}
    for split in ("train", "heldout"):
        docs = {d: read_docs(work, d, split) for d in PROSE + ["code"]}
        rng = random.Random(seed + (split == "heldout"))
        if split == "train":
            ids_all, lens, kinds = [], [], []
            for i in range(train_n):
                kind = "chat" if i % 2 == 0 else "plain"
                _, _, ids = make_prompt(tok, rng, docs, kind, split)
                ids_all.extend(ids)
                lens.append(len(ids))
                kinds.append(kind)
            np.asarray(ids_all, dtype=np.uint16).tofile(out / "train_prompts.u16")
            np.asarray(lens, dtype=np.uint16).tofile(out / "train_prompts.len.u16")
            (out / "train_prompts.json").write_text(json.dumps(
                {"prompts": train_n, "kinds": kinds, "tokens": int(sum(lens)), "max_len": max(lens),
                 "mean_len": float(np.mean(lens)), "source": "work/corpus *.train.jsonl", "seed": seed}) + "\n")
            stats["train"] = {"prompts": train_n, "mean_len": float(np.mean(lens)), "max_len": max(lens)}
        else:
            for kind in ("chat", "plain"):
                with open(out / f"{kind}.jsonl", "w") as f:
                    for i in range(heldout_n):
                        domain, prompt, ids = make_prompt(tok, rng, docs, kind, split)
                        f.write(json.dumps({"id": f"{kind}-{i:03d}", "kind": kind, "domain": domain,
                                            "prompt": prompt, "prompt_token_ids": ids}) + "\n")
            stats["heldout"] = heldout_n
    return stats


def load_train_prompts(folder: Path) -> list[list[int]]:
    flat = np.fromfile(folder / "train_prompts.u16", dtype=np.uint16).astype(np.int64)
    lens = np.fromfile(folder / "train_prompts.len.u16", dtype=np.uint16).astype(np.int64)
    offs = np.concatenate([[0], np.cumsum(lens)])
    return [flat[offs[i]:offs[i + 1]].tolist() for i in range(len(lens))]


def gen(gguf: str, prompts_dir: Path, out: Path, sequences: int, length: int, batch: int,
        temperatures: list[float], max_seconds: float, seed: int = 1, max_prompt: int = 128,
        min_new: int = 16):
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    model, _ = load_gguf(gguf, device=dev)
    t_load = time.time() - t0
    # prompts that leave at least min_new generated tokens in a row of `length` (all of them at 320)
    limit = min(max_prompt, length - min_new)
    prompts = [p for p in load_train_prompts(prompts_dir) if len(p) <= limit][:sequences]
    if len(prompts) < sequences:
        raise ValueError(f"only {len(prompts)} training prompts of ≤ {limit} tokens in {prompts_dir}")
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    gen_ = torch.Generator(device=dev).manual_seed(seed)
    rows, plens, temps = [], [], []
    t1 = time.time()
    n_tok = 0
    starts = list(range(0, sequences, batch))
    random.Random(seed).shuffle(starts)  # length-sorted batches in random order: a time box keeps a mix
    for bi, s in enumerate(starts):
        if time.time() - t1 > max_seconds:
            print(f"regen: time box {max_seconds}s reached after {len(rows)} sequences", flush=True)
            break
        idx = order[s:s + batch]
        ps = [prompts[i] for i in idx]
        temp = temperatures[bi % len(temperatures)]
        n_new = length - min(len(p) for p in ps)
        outs = generate(model, ps, n_new, temp, gen_, autocast=dev.type == "cuda")
        for p, o in zip(ps, outs):
            rows.append((p + o)[:length])
            plens.append(len(p))
            temps.append(temp)
        n_tok += len(ps) * n_new
        el = time.time() - t1
        print(f"regen {len(rows)}/{sequences} T={temp} new={n_new} {el:.1f}s "
              f"({n_tok / el:.0f} generated tok/s)", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    # shuffle rows so the trainer's first rows (its validation split) mix lengths and temperatures
    perm = np.random.default_rng(seed).permutation(len(rows))
    arr = np.asarray([rows[i] for i in perm], dtype=np.uint16)
    arr.tofile(out / "tokens.u16")
    np.asarray([plens[i] for i in perm], dtype=np.uint16).tofile(out / "prompt_lens.u16")
    meta = {"sequences": int(arr.shape[0]), "length": length, "prompt_lens": "prompt_lens.u16",
            "temperatures": temperatures, "temperature_counts": {str(t): temps.count(t) for t in temperatures},
            "mean_prompt_len": float(np.mean(plens)), "eos": "ignored", "batch": batch,
            "target": "SmolLM2-135M-Instruct (GGUF Q4_1, fp32 weights, bf16 autocast)" if dev.type == "cuda"
            else "SmolLM2-135M-Instruct (GGUF Q4_1, fp32)",
            "device": dev.type, "load_seconds": t_load, "seconds": time.time() - t1,
            "generated_tokens": n_tok, "generated_tok_per_s": n_tok / max(time.time() - t1, 1e-9)}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps({k: v for k, v in meta.items()}), flush=True)
    return meta


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["prompts", "gen"])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--work", type=Path, default=Path("work"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, default=Path("smollm2/prompts"))
    ap.add_argument("--train-prompts", type=int, default=32768)
    ap.add_argument("--heldout", type=int, default=32)
    ap.add_argument("--sequences", type=int, default=4096)
    ap.add_argument("--length", type=int, default=320)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--temperatures", default="0,0.8")
    ap.add_argument("--max-seconds", type=float, default=1e9)
    ap.add_argument("--seed", type=int, default=1,
                    help="sampling and batch-order seed (another seed: other T > 0 rows, other batches greedy)")
    a = ap.parse_args()
    if a.cmd == "prompts":
        print(json.dumps(build_prompts(a.work, a.gguf, a.out, a.train_prompts, a.heldout)))
    else:
        gen(a.gguf, a.prompts, a.out, a.sequences, a.length, a.batch,
            [float(t) for t in a.temperatures.split(",")], a.max_seconds, a.seed)
