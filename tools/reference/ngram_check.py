"""No SmolLM2 drafter-training prompt shares an 8-gram of content with a held-out prompt.

  python ngram_check.py check  --gguf G --prompts smollm2/prompts      # exit 1 and examples on a violation
  python ngram_check.py filter --gguf G --prompts smollm2/prompts      # drop the violating training prompts

The held-out prompts (`chat.jsonl`, `plain.jsonl`: τ and goldens) come from the corpus' held-out documents and the
training prompts (`train_prompts.u16`) from its train documents, but the corpus repeats itself across documents
(speeches quote each other, code shares boilerplate), so a training prompt can still contain a held-out passage.
The check works on token ids: an 8-gram of a training prompt that also occurs in a held-out prompt is a violation
unless it is **template**: an 8-gram of the fixed text `regen_smollm2.py` wraps around every snippet (the ChatML
system/user/assistant turns and the task instructions), as the target's own tokenizer splits it in a whole prompt
(the ids two renderings with different snippets share). The template 8-grams are written to
`template_8grams.json` so that a test can re-check the shipped files without a tokenizer
(test/train-prompts-ngrams.test.ts), and `filter` records what it removed in `train_prompts.json`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from regen_smollm2 import CODE_TASKS, PROSE_TASKS, load_train_prompts
from specd_ref.llama import chatml, load_tokenizer

N = 8


def grams(ids: list[int], n: int = N) -> set[tuple[int, ...]]:
    return {tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)}


def template_grams(tok) -> set[tuple[int, ...]]:
    """8-grams of the text around `{x}` in every chat task rendered with ChatML: the token ids shared by two
    renderings with different snippets (common prefix and suffix). A snippet that merges differently with the text
    next to it (a leading space or digit) makes its boundary 8-grams count as content: the check errs towards
    dropping."""
    out: set[tuple[int, ...]] = set()
    for task in PROSE_TASKS + CODE_TASKS:
        a, b = (tok.encode(chatml([{"role": "user", "content": task.format(x=x)}])).ids
                for x in ("Apples grow on trees.", "zebra 42 quux"))  # both start with a letter, as most snippets
        pre = next(i for i, (u, v) in enumerate(zip(a, b)) if u != v)
        suf = next(i for i, (u, v) in enumerate(zip(a[::-1], b[::-1])) if u != v)
        out |= grams(a[:pre]) | grams(a[len(a) - suf:])
    return out


def heldout(prompt_dir: Path) -> list[tuple[str, list[int]]]:
    rows = []
    for kind in ("chat", "plain"):
        for line in open(prompt_dir / f"{kind}.jsonl"):
            r = json.loads(line)
            rows.append((r["id"], r["prompt_token_ids"]))
    return rows


def violations(train: list[list[int]], held: list[tuple[str, list[int]]], template: set) -> list[tuple[int, str]]:
    """(training prompt index, held-out id) for every training prompt sharing a non-template 8-gram."""
    owner: dict[tuple[int, ...], str] = {}
    for hid, ids in held:
        for g in grams(ids) - template:
            owner.setdefault(g, hid)
    bad = []
    for i, ids in enumerate(train):
        for k in range(len(ids) - N + 1):
            g = tuple(ids[k:k + N])
            if g in owner:
                bad.append((i, owner[g]))
                break
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["check", "filter"])
    ap.add_argument("--gguf", required=True, help="the target GGUF (its tokenizer renders the template)")
    ap.add_argument("--prompts", type=Path, default=Path("smollm2/prompts"))
    a = ap.parse_args()
    tok = load_tokenizer(a.gguf)
    template = template_grams(tok)
    train = load_train_prompts(a.prompts)
    held = heldout(a.prompts)
    bad = violations(train, held, template)
    print(f"{len(train)} training prompts, {len(held)} held-out prompts, {len(template)} template {N}-grams: "
          f"{len(bad)} training prompts share a content {N}-gram with a held-out prompt")
    (a.prompts / "template_8grams.json").write_text(json.dumps(
        {"n": N, "source": "tools/reference/ngram_check.py", "grams": sorted(list(g) for g in template)}) + "\n")
    if a.cmd == "check":
        for i, hid in bad[:5]:
            print(f"  train #{i} ~ {hid}: {tok.decode(train[i])[:160]!r}")
        sys.exit(1 if bad else 0)
    drop = {i for i, _ in bad}
    keep = [i for i in range(len(train)) if i not in drop]
    meta = json.loads((a.prompts / "train_prompts.json").read_text())
    kept = [train[i] for i in keep]
    np.asarray([t for p in kept for t in p], dtype=np.uint16).tofile(a.prompts / "train_prompts.u16")
    np.asarray([len(p) for p in kept], dtype=np.uint16).tofile(a.prompts / "train_prompts.len.u16")
    lens = [len(p) for p in kept]
    meta.update({"prompts": len(kept), "kinds": [meta["kinds"][i] for i in keep], "tokens": int(sum(lens)),
                 "max_len": max(lens), "mean_len": float(np.mean(lens))})
    meta["heldout_filter"] = {"removed": len(drop) + meta.get("heldout_filter", {}).get("removed", 0), "n": N,
                              "rule": "no content 8-gram shared with chat.jsonl/plain.jsonl (ngram_check.py)"}
    (a.prompts / "train_prompts.json").write_text(json.dumps(meta) + "\n")
    print(f"filter: kept {len(kept)}, removed {len(drop)}")


if __name__ == "__main__":
    main()
