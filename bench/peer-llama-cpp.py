"""bench:peer's llama.cpp built for this machine: a worker that bench/peer.mjs drives over stdin/stdout.

Runs in the venv that scripts/install-llama-cpp-python.mjs makes (llama-cpp-python from PyPI, its bundled
llama.cpp compiled with GGML_NATIVE=ON, i.e. -march=native). Never imported by the project's tests.

    python bench/peer-llama-cpp.py --model GGUF --threads N --ctx TOKENS --lookup-ctx TOKENS

Protocol: one JSON object per line in, one per line out, in order.
  {"op": "info"} -> {"version", "system_info"}: llama_cpp.__version__ and llama_print_system_info()
      (the ISA features the build uses, e.g. "AVX512_VNNI = 1", "AMX_INT8 = 1").
  {"op": "generate", "mode": "plain" | "lookup", "ids": [int], "n": int}
      -> {"tokens": [int] (n), "t0": s, "times": [s] (n)}: greedy (temp 0, the sampler chain
      penalties(1.0) -> greedy), EOS not checked (generate() never stops by itself), `times` =
      time.perf_counter() when each token was yielded, `t0` = before generate() was called.
      The state is reset first (n_tokens = 0: the KV cache is cleared by eval, no prefix reuse).
      "lookup" = the second model with draft_model = LlamaPromptLookupDecoding(max_ngram_size=2,
      num_pred_tokens=10), llama-cpp-python's speculative mode: prompt-lookup decoding (arXiv
      2304.04487 "Inference with Reference", apoorvumang/prompt-lookup-decoding): the last 2 (else 1)
      tokens of prompt + output are searched for in the context, the up to 10 tokens that followed
      the first match are drafted, one batched eval verifies them, the greedy-matching prefix is
      kept. That model runs with logits_all (llama-cpp-python requires it with a draft model), so
      its context is `--lookup-ctx` tokens to bound the logits buffer (ctx x vocab f32).
  {"op": "quit"} -> exits.
Errors: a bad request writes {"error": message} and the worker goes on.
"""

import argparse
import json
import sys
import time

import llama_cpp
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--lookup-ctx", type=int, default=1024)
    a = p.parse_args()
    common = dict(
        model_path=a.model,
        n_batch=512,
        n_ubatch=512,
        n_threads=a.threads,
        n_threads_batch=a.threads,
        verbose=False,
    )
    models = {
        "plain": Llama(n_ctx=a.ctx, **common),
        "lookup": Llama(
            n_ctx=a.lookup_ctx,
            draft_model=LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10),
            **common,
        ),
    }
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "quit":
                break
            if op == "info":
                info = llama_cpp.llama_print_system_info()
                res = {
                    "version": llama_cpp.__version__,
                    "system_info": info.decode() if isinstance(info, bytes) else str(info),
                }
            elif op == "generate":
                llm = models[req["mode"]]
                n = int(req["n"])
                llm.reset()
                tokens, times = [], []
                t0 = time.perf_counter()
                for t in llm.generate(list(req["ids"]), temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
                    times.append(time.perf_counter())
                    tokens.append(int(t))
                    if len(tokens) >= n:
                        break
                res = {"tokens": tokens, "t0": t0, "times": times}
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as e:  # noqa: BLE001 - reported to the driver, which names the request
            res = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(res) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
