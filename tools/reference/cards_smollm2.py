"""MODEL_CARD.md of a SmolLM2-135M-Instruct drafter from its training log and τ JSONs (gpu/smollm2.sh).

  python cards_smollm2.py --method dflash --hf W/dflash/hf --work W --regen W/regen --out MODEL_CARD.md
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", choices=["dflash", "dspark", "eagle3"], required=True)
    ap.add_argument("--hf", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--regen", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batch", type=int, default=32, help="rows per training step (smollm2.sh BATCH)")
    ap.add_argument("--methods", type=int, default=3,
                    help="drafters trained concurrently on the GPU in that run (smollm2.sh METHODS; 1: alone)")
    ap.add_argument("--gpu", default="one GPU", help="the GPU the run trained on, in words")
    ap.add_argument("--command", default="tools/reference/gpu/smollm2.sh",
                    help="the exact command (with its settings) that trained and evaluated this drafter")
    a = ap.parse_args()
    c = json.loads((a.hf / "config.json").read_text())
    log = json.loads((a.work / a.method / "log.json").read_text())
    meta = json.loads((a.regen / "meta.json").read_text())
    size = sum(p.stat().st_size for p in a.hf.glob("*.safetensors"))
    name = f"smollm2-135m-instruct-{a.method}"
    title = {"dflash": "DFlash", "dspark": "DSpark", "eagle3": "EAGLE-3"}[a.method]
    L = ["# " + name, "",
         f"A{'n' if title[0] in 'AEIOU' else ''} {title} drafter for SmolLM2-135M-Instruct "
         f"(`models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf`; `architectures` {c['architectures']}). "
         f"Reference implementation: `tools/reference/specd_ref/{'eagle3' if a.method == 'eagle3' else 'dflash'}.py`; "
         "target: `tools/reference/specd_ref/llama.py` (GGUF dequantised to fp32).", "", "## Architecture"]
    if a.method in ("dflash", "dspark"):
        d = c["dflash_config"]
        L += [f"- {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, {c['num_attention_heads']} heads / "
              f"{c['num_key_value_heads']} KV heads × {c['head_dim']}, MLP {c['intermediate_size']}, RoPE θ {c['rope_theta']}.",
              f"- Taps: {d['target_layer_ids']} via `target_layer_ids` (output of layer k → tap k+1).",
              f"- Block size {c['block_size']}, mask token {d['mask_token_id']} (`<empty_output>`, a control token "
              f"chat never produces), layer types {c['layer_types']}.",
              "- Uses the target's (tied) embedding and lm_head."]
        if a.method == "dspark":
            L += ["- DSpark heads: slot j predicts the next token (a block of "
                  f"{c['block_size']} gives {c['block_size']} drafts); a Markov head of rank "
                  f"{c['dspark_config']['markov_rank']} over the previous token and "
                  "a confidence head (the cost policy's survival budget)."]
    else:
        L += [f"- One layer, hidden {c['hidden_size']}, {c['num_attention_heads']} heads / {c['num_key_value_heads']} KV "
              f"heads × {c['head_dim']}, MLP {c['intermediate_size']}, RoPE θ {c['rope_theta']}.",
              f"- Taps (used as given): {c['eagle_config']['eagle_aux_hidden_state_layer_ids']}.",
              f"- Own lm_head over a draft vocabulary of {c['draft_vocab_size']} (the most frequent tokens of the "
              f"training data; `d2t`/`t2d`); uses the target's embedding."]
    L += [f"- Parameters: **{log['params'] / 1e6:.2f} M**; checkpoint {size / 1e6:.2f} MB (bf16 safetensors).", "",
          "## Data and training",
          f"The target's own continuations (`regen_smollm2.py gen`): {meta['sequences']} rows of {meta['length']} tokens "
          f"= a prompt (mean {meta['mean_prompt_len']:.0f} tokens; half ChatML chat turns built from corpus snippets with "
          f"instructions, half raw corpus snippets, from the train splits of brown/nlp/sotu/TypeScript, none sharing a "
          f"content 8-gram with a held-out prompt: `ngram_check.py`) + the target's "
          f"continuation (EOS ignored), batches alternating temperatures {meta['temperatures']}. "
          f"Generation: {meta['seconds']:.0f} s on {meta['device']}.",
          f"{log['steps']} steps in {log['seconds'] / 60:.1f} min (" + (f"alone on {a.gpu}" if a.methods == 1 else
                 f"trained concurrently with {a.methods - 1} other drafter(s) on {a.gpu}") + "), "
          f"AdamW lr {log.get('lr') or 1e-3:g}, bf16 autocast, seed 0"
          + (f", loss decay γ = {log['decay_gamma']:g} over the block's positions" if log.get("decay_gamma") else "")
          + "; best validation "
          f"loss {log['best_val']:.4f}. Command: `{a.command}`.", ""]
    if log.get("init"):
        L += [f"Warm start: training began from the weights of the checkpoint shipped before it (`models/"
              f"{Path(log['init']['folder']).name}` as committed before), with a fresh optimiser and LR schedule; that "
              "checkpoint's own training (its card, in git history) is not counted in the steps and tokens here.", ""]
    L += [
          "## Acceptance length τ (held-out prompts `tools/reference/smollm2/prompts/{chat,plain}.jsonl`)",
          "τ = mean over verify steps of (accepted + 1), EOS ignored, fp32 target; ± is the standard error with prompts "
          "as clusters. t0 greedy, t1 temperature 1.", "",
          "| run | prompts | τ | verify steps | new tokens | per-position acceptance (first 8) |",
          "| --- | --- | --- | --- | --- | --- |"]
    for t in ("0", "1"):
        f = a.work / f"tau_{a.method}_t{t}.json"
        if not f.exists():
            continue
        r = json.loads(f.read_text())
        for dom, v in r["domains"].items():
            pp = ", ".join(f"{x:.2f}" for x in v["per_position_acceptance"][:8])
            L.append(f"| t{t} | {dom} ({v['prompts']}) | {v['tau']:.3f} ± {v['tau_se']:.3f} | {v['verify_steps']} | "
                     f"{r['new_tokens']} | {pp} |")
    L += ["", "## Training curve",
          f"Validation rows (teacher-forced), one row per {max(len(log['log']) // 8, 1)} evaluations. Tokens seen = steps × "
          f"{a.batch} rows × {meta['length']} tokens. τ estimate = 1 + Σ_k Π_(j≤k) acc_j from the per-position "
          "accuracies (independence assumed: a trend, not a measured τ; the measured τ is above).", "",
          "| step | tokens seen (M) | val loss | accuracy, positions 1–4 | τ estimate |", "| --- | --- | --- | --- | --- |"]
    recs = log["log"]
    k = max(len(recs) // 8, 1)
    rows = recs[k - 1::k]
    rows += [] if not recs or rows[-1] is recs[-1] else recs[-1:]  # no evaluation yet: no rows
    ests = []
    for r in rows:
        acc = r.get("acc_per_slot") or r.get("acc_per_step") or []
        est, prod = 1.0, 1.0
        for x in acc:
            prod *= x
            est += prod
        ests.append(est)
        L.append(f"| {r['step']} | {r['step'] * a.batch * meta['length'] / 1e6:.1f} | {r['val_loss']:.4f} | "
                 f"{', '.join(f'{x:.2f}' for x in acc[:4])} | {est:.2f} |")
    if not ests:
        L += ["", "No validation ran (fewer steps than --eval-every)."]
        a.out.write_text("\n".join(L) + "\n")
        return
    mid = ests[len(ests) // 2]
    L += ["", f"The estimate went from {mid:.2f} at mid-training to {ests[-1]:.2f} at the end: " +
          ("still rising when the time box stopped training (more data and steps should raise τ further)."
           if ests[-1] - mid > 0.05 else "flat over the second half: more of the same data and steps will not "
           "raise τ much; the drafter's capacity or the data is the limit.")]
    a.out.write_text("\n".join(L) + "\n")


if __name__ == "__main__":
    main()
