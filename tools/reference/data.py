"""Tokenizer training, corpus encoding and the held-out prompt sets.

  python data.py tokenizer --work W        byte-level BPE (HF tokenizer.json) on the train splits
  python data.py encode    --work W        W/data/<domain>.<split>.u16  (uint16 ids, docs joined by EOS)
  python data.py prompts   --work W --out test/prompts   prose.jsonl / code.jsonl (held-out only)

The tokenizer has VOCAB_SIZE entries; the special tokens come first so their ids are stable:
  0 <|endoftext|> (EOS and document separator), 1 <|mask|> (DFlash / DSpark mask token),
  2 <|pad|>, 3 <|im_start|>, 4 <|im_end|>.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np

VOCAB_SIZE = 8192
SPECIALS = ["<|endoftext|>", "<|mask|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
EOS_ID, MASK_ID, PAD_ID = 0, 1, 2
DOMAINS = ["brown", "nlp", "sotu", "code"]
PROSE = ["brown", "nlp", "sotu"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def read_docs(work: Path, domain: str, split: str):
    with open(work / "corpus" / f"{domain}.{split}.jsonl") as f:
        for line in f:
            yield json.loads(line)


def train_tokenizer(work: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)

    def texts():
        for d in DOMAINS:
            for doc in read_docs(work, d, "train"):
                yield doc["text"]

    tok.train_from_iterator(texts(), trainer=trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, f"special token {s} got id {tok.token_to_id(s)}"
    out = work / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    return out


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|pad|>",
        "mask_token": "<|mask|>",
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }


def load_tokenizer(path: Path):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(path / "tokenizer.json") if path.is_dir() else str(path))


def encode(work: Path) -> dict:
    tok = load_tokenizer(work / "tokenizer")
    out = work / "data"
    out.mkdir(parents=True, exist_ok=True)
    stats = {}
    for d in DOMAINS:
        for split in ("train", "heldout"):
            docs = [doc["text"] for doc in read_docs(work, d, split)]
            ids: list[int] = []
            for enc in tok.encode_batch(docs, add_special_tokens=False):
                ids.extend(enc.ids)
                ids.append(EOS_ID)
            arr = np.asarray(ids, dtype=np.uint16)
            arr.tofile(out / f"{d}.{split}.u16")
            stats[f"{d}.{split}"] = int(arr.size)
    (out / "stats.json").write_text(json.dumps(stats, indent=2))
    return stats


def make_prompts(work: Path, out: Path, per_domain: int = 48, keep: int = 32, seed: int = 1234) -> dict:
    """Held-out prompts: a window of 32..160 tokens from a held-out document, decoded to text.

    prose.jsonl mixes the three prose domains round-robin; code.jsonl is the code domain.
    `per_domain` rows are drawn per set (this fixes the random stream) and the first `keep` are written.
    Each line: {"id", "domain", "prompt", "prompt_token_ids"}.
    """
    tok = load_tokenizer(work / "tokenizer")
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, domains in (("prose", PROSE), ("code", ["code"])):
        pools = {d: [doc for doc in read_docs(work, d, "heldout")] for d in domains}
        rows = []
        i = 0
        while len(rows) < per_domain:
            d = domains[i % len(domains)]
            i += 1
            doc = rng.choice(pools[d])
            ids = tok.encode(doc["text"], add_special_tokens=False).ids
            n = rng.randint(32, 160)
            if len(ids) < n + 130:
                continue
            start = rng.randint(0, len(ids) - n - 130)
            text = tok.decode(ids[start:start + n])
            if "\ufffd" in text:
                continue
            rows.append({"id": f"{name}-{len(rows):03d}", "domain": d, "source": doc["id"],
                         "prompt": text,
                         "prompt_token_ids": tok.encode(text, add_special_tokens=False).ids})
        rows = rows[:keep]
        with open(out / f"{name}.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        counts[name] = len(rows)
    return counts


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["tokenizer", "encode", "prompts"])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.cmd == "tokenizer":
        print(train_tokenizer(a.work))
    elif a.cmd == "encode":
        print(json.dumps(encode(a.work), indent=2))
    else:
        print(make_prompts(a.work, a.out or Path("test/prompts")))
