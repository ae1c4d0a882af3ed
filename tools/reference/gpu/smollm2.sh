#!/usr/bin/env bash
# One GPU call for the SmolLM2-135M-Instruct drafters. Run from the repo root (or anywhere):
#   OUT=… bash tools/reference/gpu/smollm2.sh /path/to/SmolLM2-135M-Instruct.Q4_1.gguf [WORK]
# Stages (each time-boxed, timings printed and kept in logs.tar.gz/timings.txt):
#   regen  regen_smollm2.py gen: SEQ prompts (smollm2/prompts, committed) → SEQ rows of LEN tokens
#          (greedy / T=0.8 batches, GEN_BATCH per batch, stops starting batches after GEN_SECONDS; SEED, default 1,
#          picks the batch order and the sampled rows: a later stage with another seed regenerates other rows)
#   train  the METHODS drafters (default dflash dspark eagle3) concurrently on the one GPU, MIN minutes each
#          (or MAX_STEPS)
#   eval   τ of every drafter at the temperatures EVAL_TEMPS (default "0 1": greedy and T=1), EVAL_LIMIT chat +
#          EVAL_LIMIT plain held-out prompts, NEW new tokens, all evaluations concurrently, each cut at
#          EVAL_TIMEOUT seconds
# STAGES="regen train eval" by default; without regen, REGEN=<dir with tokens.u16 meta.json> is used.
# RESUME=1: train continues from $W/<method>/last.pt (an earlier call on the same warm machine); MIN is then the
# total minutes of training, earlier calls included. STOP_AFTER=N: each trainer leaves this call after N minutes
# (last.pt kept) — a GPU call is limited to 10 minutes, so a long MIN is spread over calls (RESUME=1 in the next).
# GAMMA=x: DFlash/DSpark's loss decay γ over block positions (train_drafters.py --decay-gamma; default 7 / 4);
# GAMMA_dflash=x / GAMMA_dspark=x set it for one method (over GAMMA).
# LR=x: the trainers' AdamW learning rate (default 1e-3; a lower one for fine-tuning rounds of a warm start).
# INIT=DIR: start each drafter from DIR/smollm2-135m-instruct-<method> (the shipped checkpoints, staged by
# tools/gpu/stage.sh) instead of random weights.
# $OUT (≤ 8 files ≤ 16 MiB): drafters.tar.part* (<method>/{config.json,*.safetensors,MODEL_CARD.md} for every
#   trained method, split in 15 MiB parts: `cat drafters.tar.part* | tar x`), logs.tar.gz, regen.tar.gz
# Offline: torch, numpy, safetensors only (the GGUF is read by specd_ref/gguf_io.py's numpy reader
# when the pip `gguf` package is missing; no tokenizer is needed on the GPU).
set -uo pipefail
G=$(realpath "${1:?path to SmolLM2-135M-Instruct.Q4_1.gguf}")
cd "$(dirname "$0")/.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
W=${2:-/root/smol}; O=${OUT:-$W/out}
SEQ=${SEQ:-4096}; LEN=${LEN:-320}; GEN_BATCH=${GEN_BATCH:-512}; GEN_SECONDS=${GEN_SECONDS:-90}
SEED=${SEED:-1}; MIN=${MIN:-3.25}; BATCH=${BATCH:-32}; MAX_STEPS=${MAX_STEPS:-100000}; EVAL_EVERY=${EVAL_EVERY:-200}
EVAL_LIMIT=${EVAL_LIMIT:-16}; EVAL_TEMPS=${EVAL_TEMPS:-0 1}; NEW=${NEW:-128}; EVAL_TIMEOUT=${EVAL_TIMEOUT:-170}
STAGES=${STAGES:-regen train eval}; PY=${PY:-python3}; INIT=${INIT:-}; P=smollm2/prompts; METHODS=${METHODS:-dflash dspark eagle3}
R=${REGEN:-$W/regen}
mkdir -p "$W" "$O"
T0=$(date +%s)
# the loss decay γ of method $1: GAMMA_<method>, else GAMMA, else none (the trainer's default; EAGLE-3 has no γ)
gamma_of() { local g=GAMMA_$1; [ "$1" = eagle3 ] || echo "${!g:-${GAMMA:-}}"; }
tm() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$W/timings.txt"; }
tm "start: gguf $G work $W out $O; SEQ=$SEQ LEN=$LEN MIN=$MIN BATCH=$BATCH EVAL_LIMIT=$EVAL_LIMIT NEW=$NEW"
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'

if [[ " $STAGES " == *" regen "* ]]; then
  tm "regen start"
  $PY regen_smollm2.py gen --gguf "$G" --prompts $P --out "$R" --sequences "$SEQ" --length "$LEN" \
      --batch "$GEN_BATCH" --max-seconds "$GEN_SECONDS" --seed "$SEED" 2>&1 | tee "$W/regen.log"
  tm "regen done"
fi

if [[ " $STAGES " == *" train "* ]]; then
  tm "train start ($METHODS concurrently, $MIN min each)"
  for m in $METHODS; do
    gamma=$(gamma_of "$m")
    $PY train_drafters.py $m --gguf "$G" --regen "$R" --out "$W/$m" --minutes "$MIN" --batch "$BATCH" \
        --max-steps "$MAX_STEPS" --eval-every "$EVAL_EVERY" ${LR:+--lr "$LR"} ${gamma:+--decay-gamma "$gamma"} ${RESUME:+--resume} ${STOP_AFTER:+--stop-after "$STOP_AFTER"} \
        $(if [ -n "$INIT" ] && [ -d "$INIT/smollm2-135m-instruct-$m" ]; then echo --init "$INIT/smollm2-135m-instruct-$m"; fi) \
        >> "$W/train_$m.log" 2>&1 &
  done
  wait
  tail -n 3 "$W"/train_*.log
  tm "train done"
fi

if [[ " $STAGES " == *" eval "* ]]; then
  tm "eval start"
  # one process per (drafter, temperature, prompt set), all at once; then one JSON per (drafter, temperature)
  ev() { timeout "$EVAL_TIMEOUT" $PY eval_tau.py --gguf "$G" --drafter "$W/$1/hf" --prompts $P --domains "$3" \
         --limit "$EVAL_LIMIT" --new-tokens "$NEW" --temperature "$2" --out "$W/tau_$1_t$2_$3.json" \
         > "$W/eval_$1_t$2_$3.log" 2>&1; }
  for m in $METHODS; do for t in $EVAL_TEMPS; do for d in chat plain; do ev "$m" $t $d & done; done; done
  wait
  for m in $METHODS; do for t in $EVAL_TEMPS; do
    $PY - "$W/tau_${m}_t$t.json" "$W/tau_${m}_t${t}_chat.json" "$W/tau_${m}_t${t}_plain.json" <<'PYEOF'
import json, sys, pathlib
parts = [json.loads(pathlib.Path(f).read_text()) for f in sys.argv[2:] if pathlib.Path(f).exists()]
if parts:
    merged = parts[0]
    for p in parts[1:]:
        merged["domains"].update(p["domains"])
    pathlib.Path(sys.argv[1]).write_text(json.dumps(merged) + "\n")
PYEOF
  done; done
  tail -n 3 "$W"/eval_*.log
  tm "eval done"
fi

D=$W/drafters; rm -rf "$D"; mkdir -p "$D"
for m in $METHODS; do
  if [ -f "$W/$m/hf/config.json" ]; then
    mkdir -p "$D/$m"; cp "$W/$m"/hf/*.json "$W/$m"/hf/*.safetensors "$D/$m/"  # config, shard index
    $PY cards_smollm2.py --method $m --hf "$W/$m/hf" --work "$W" --regen "$R" --batch "$BATCH" --out "$D/$m/MODEL_CARD.md" \
        --methods "$(echo $METHODS | wc -w)" --gpu "one $($PY -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU")' 2>/dev/null || echo GPU)" \
        --command "METHODS=\"$METHODS\" $(v=$(gamma_of "$m"); [ -z "$v" ] || echo "GAMMA_$m=$v ")${LR:+LR=$LR }SEED=$SEED ${INIT:+INIT=<the shipped checkpoints> }SEQ=$SEQ LEN=$LEN GEN_SECONDS=$GEN_SECONDS MIN=$MIN BATCH=$BATCH EVAL_LIMIT=$EVAL_LIMIT NEW=$NEW \
bash tools/reference/gpu/smollm2.sh (training time spread over calls with RESUME=1)" || true
  fi
done
tar cf - -C "$D" . | split -b 15M - "$O/drafters.tar.part"

tm "all done"
(cd "$W" && tar czf "$O/logs.tar.gz" --ignore-failed-read timings.txt regen.log train_*.log eval_*.log tau_*.json \
   */log.json regen/meta.json 2>/dev/null)
[ -f "$R/tokens.u16" ] && tar czf "$O/regen.tar.gz" -C "$R" tokens.u16 prompt_lens.u16 meta.json
ls -la "$O" "$O"/*
