#!/usr/bin/env python3
"""Reference token ids for the SmolLM2-135M-Instruct GGUF tokenizer → test/fixtures/smollm2-tokenizer-ids.json.

Builds the tokenizer the way transformers does from a GGUF (`AutoTokenizer.from_pretrained(dir,
gguf_file=...)` → `transformers.integrations.gguf.convert_gguf_tokenizer`), then encodes ~300 strings
(prose, code, numbers, unicode, whitespace runs, control tokens, chat-template-rendered
conversations) with add_special_tokens=False.

Two tokenizers are compared and both recorded:
  * `ids`: transformers' GGUF tokenizer with the pre-tokenizer of HF SmolLM2's own tokenizer.json
    (Digits(individual_digits) + ByteLevel(add_prefix_space=False)), which is also what llama.cpp does
    for `tokenizer.ggml.pre == "smollm"` (a \\p{N} split, then the GPT-2 regex). specd must match these.
  * `transformersGgufIds` (only where different): transformers' GGUF tokenizer as it comes. Its
    converter has no "smollm" entry and leaves out the Digits step, so it differs on digit runs.

Why not AutoTokenizer.from_pretrained directly: transformers ≥ 5's GGUF reader imports torch, which is
not needed for tokenizers; we read the metadata with the `gguf` package and call the same converter.

Usage (CPU; `pip install gguf transformers jinja2`, no torch):
  npm run models:fetch
  python3 tools/reference/gguf_tokenizer_check.py [--gguf PATH] [--out PATH]
"""

import argparse
import json
import os
import random
import sys

from gguf import GGUFReader
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import pre_tokenizers
from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_GGUF = os.path.join(ROOT, "models", "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_OUT = os.path.join(ROOT, "test", "fixtures", "smollm2-tokenizer-ids.json")


def field_value(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    return f.contents()


def tokenizer_dict_from_gguf(path):
    """The dict `get_gguf_tokenizer` builds, read with the gguf package (no torch)."""
    reader = GGUFReader(path)
    tok = {}
    for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items():
        v = field_value(reader, f"tokenizer.{key}")
        if v is not None:
            tok[name] = v
    arch = field_value(reader, "general.architecture")
    template = field_value(reader, "tokenizer.chat_template")
    tokens = tok["tokens"]
    specials = {
        name: tokens[field_value(reader, f"tokenizer.ggml.{key}")]
        for name, key in [("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")]
        if field_value(reader, f"tokenizer.ggml.{key}") is not None
    }
    return arch, tok, template, specials


def corpus(rng):
    prose = [
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "Speculative decoding drafts several tokens and verifies them in one forward pass of the target model.",
        "It's a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
        "I'm sure they'll say we've done what you'd expect; isn't it?",
        "What is the capital of France? Paris is the capital of France.",
        "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1e-5 0x1F 2024-11-30 10:45:07",
        "Prices rose 7.5% to $1,299.99 in Q3 2023 (vs. $1,208.50).",
        "Call +1 (555) 010-9999 or email someone@example.com.",
        "Mr. Smith, Dr. Jones and Prof. O'Neil met at 221B Baker St.",
        "UPPERCASE lowercase MiXeD CaSe camelCase snake_case kebab-case",
        "",
        " ",
        "a",
        "  leading spaces",
        "trailing spaces   ",
        "tabs\tand\ttabs\t\t",
        "new\nlines\n\nand\r\ncarriage returns\r",
        "multiple     spaces     between     words",
        "\n\n\n",
        " \t \n \u00a0 \u2003 mixed whitespace",
    ]
    code = [
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
        "for (let i = 0; i < n; i++) {\n\tsum += a[i] * b[i];\n}",
        "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
        "const x = {a: 1, 'b': [2, 3], \"c\": null};  // comment",
        "<div class=\"row\"><span>text</span></div>",
        "$ npm run build:ts && npx vitest run packages/core/test/io/gguf.test.ts",
        "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
        "x = np.zeros((576, 1536), dtype=np.float32) @ w.T",
        "    if (x) {\n        return y;\n    }\n",
        "{\"key\": \"value\", \"list\": [1, 2, 3], \"nested\": {\"a\": true}}",
        "https://github.com/ggml-org/ggml/blob/master/docs/gguf.md#file-structure",
    ]
    unicode = [
        "Café naïve résumé façade coöperate",
        "Größe Straße Übermaß",
        "日本語のテキストです。東京は日本の首都です。",
        "中文文本：我爱自然语言处理。",
        "한국어 문장입니다.",
        "Русский текст, ещё один.",
        "Ελληνικά: αβγδε",
        "עברית וערבית: مرحبا بالعالم",
        "हिन्दी पाठ",
        "Emoji: 😀👍🏽🎉 👨‍👩‍👧‍👦 🇫🇷",
        "Math: ∀x∈ℝ, x² ≥ 0; ∑ᵢ aᵢ = ∫ f(x) dx ≈ π",
        "Arrows → ← ↔ and dashes – — and quotes “ ” ‘ ’ « »",
        "Zero width: a\u200bb\u200cc\u200dd\ufeffe",
        "Combining: e\u0301 a\u0308 n\u0303",
        "Full-width: ＡＢＣ１２３",
        "٠١٢٣٤٥٦٧٨٩ ۱۲۳ १२३ ①②③ ½ ¾",
        "\u0000\u0001\u0007\u001b[31m",
    ]
    specials = [
        "<|im_start|>user\nHi<|im_end|>",
        "<|endoftext|>",
        "text<|endoftext|>more text",
        "<|im_start|><|im_end|><|im_start|>",
        "<repo_name>specd<file_sep>src/index.ts",
        "not special: <|im_start without end, <im_start|>",
    ]
    out = prose + code + unicode + specials
    # Chat-template-rendered conversations (the prompts the engine actually encodes).
    convs = [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
        [{"role": "user", "content": "Write a haiku about GPUs."}, {"role": "assistant", "content": "Silicon rivers\nflow with a thousand warm threads\nweights wake into words"}, {"role": "user", "content": "Another one, about 8192 tokens."}],
        [{"role": "user", "content": "Translate to French: the cat sleeps."}],
        [{"role": "user", "content": "def f(x):\n    return x * 2\nWhat does f(21) return?"}],
    ]
    # Random-word sentences and random character soup (deterministic).
    words = "the of and to in is that for it as with was on be by this are from at or an have not but which one all were can we their there been has more if will would so what about when who up out into than time some could them only other new these two may first then do any like my now over such our man me even most made after also did many before must through back years where much your way well down should because each just those people how too little state good very make world still own see men work long get here between both life being under never day same another know while last might us great old year off come since against go came right used take three".split()
    for _ in range(120):
        n = rng.randint(1, 30)
        s = " ".join(rng.choice(words) for _ in range(n))
        if rng.random() < 0.3:
            s = s.capitalize() + rng.choice([".", "!", "?", ",", ";", "...", ""])
        if rng.random() < 0.2:
            s += " " + str(rng.randint(0, 10 ** rng.randint(1, 12)))
        out.append(s)
    alphabet = "abcxyzABCXYZ0123456789 \t\n.,;:!?'\"()[]{}<>/\\|@#$%^&*-_=+~`éüß日本😀ж"
    for _ in range(100):
        n = rng.randint(1, 60)
        out.append("".join(rng.choice(alphabet) for _ in range(n)))
    return out, convs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=DEFAULT_GGUF)
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    if not os.path.exists(args.gguf):
        sys.exit(f"{args.gguf} is missing: run `npm run models:fetch` first")

    arch, tok_dict, template, specials = tokenizer_dict_from_gguf(args.gguf)
    assert tok_dict.get("pre_tokenizer_type") == "smollm", tok_dict.get("pre_tokenizer_type")
    as_is, _ = convert_gguf_tokenizer(arch, tok_dict)
    fixed, _ = convert_gguf_tokenizer(arch, tok_dict)
    fixed.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)]
    )

    rng = random.Random(20241130)
    texts, convs = corpus(rng)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    tmpl = env.from_string(template)
    rendered = []
    for conv in convs:
        for gen in (True, False):
            rendered.append(tmpl.render(messages=conv, add_generation_prompt=gen, **specials))
    texts = texts + rendered

    cases = []
    differ = 0
    for text in texts:
        ids = fixed.encode(text, add_special_tokens=False).ids
        ids_tf = as_is.encode(text, add_special_tokens=False).ids
        case = {"text": text, "ids": ids}
        if ids_tf != ids:
            case["transformersGgufIds"] = ids_tf
            differ += 1
        # Round trip through the decoder must give the text back (byte-level BPE is lossless).
        assert fixed.decode(ids, skip_special_tokens=False) == text, text
        cases.append(case)

    chat = {
        "messages": convs[1],
        "addGenerationPrompt": True,
        "rendered": tmpl.render(messages=convs[1], add_generation_prompt=True, **specials),
    }
    doc = {
        "source": "tools/reference/gguf_tokenizer_check.py",
        "gguf": os.path.basename(args.gguf),
        "note": "ids: transformers' GGUF tokenizer with HF SmolLM2's pre-tokenizer (Digits + ByteLevel), as llama.cpp's 'smollm'; transformersGgufIds: transformers' GGUF tokenizer as-is, only where different",
        "specialTokens": specials,
        "chat": chat,
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"{len(cases)} strings → {args.out} ({os.path.getsize(args.out)} bytes); transformers-as-is differs on {differ}")


if __name__ == "__main__":
    main()
