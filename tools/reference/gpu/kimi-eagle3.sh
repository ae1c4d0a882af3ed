#!/usr/bin/env bash
# GPU stages for training kimi-k3-tiny's EAGLE-3 further (warm-started from the shipped checkpoint), spread over
# back-to-back 10-minute calls that share the work folder W (an ignored folder the lent machine keeps while warm):
#   regen  the target's own continuations of new train-split windows (train_target.py regen --target, seeded)
#   train  train_drafters.py eagle3 --init INIT on them (fresh AdamW, cosine schedule over MINUTES)
#   eval   reference τ (eval_tau.py) of the new drafter, greedy and T = 1, the first EVAL_LIMIT prompts of each set
#   golden test/goldens regenerated on the CPU with the new drafter (goldens.py; take only eagle3.first_proposal
#          from them: another CPU's fp32 differs from the committed tensors by ~1e-6)
# usage: STAGES="regen train" OUT=… gpu/kimi-eagle3.sh TARGET_DIR INIT_DIR W
#   env: SEQUENCES (32768), REGEN_SECONDS (150), GREEDY_EVERY (3: two batches greedy, one at T = 1), SEED (2),
#        MINUTES (5), LR (1e-3), BATCH (64), EVAL_LIMIT (8), EVAL_TIMEOUT (240).
#        W must hold data/ (data.py encode, as the target was trained on).
#   $OUT: eagle3/{config.json,model.safetensors}, logs.tar.gz, goldens.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
T=${1:?target HF folder}; INIT=${2:?the drafter to start from}; W=${3:?work folder with data/}
O=${OUT:-$W/out}
STAGES=${STAGES:-regen train eval golden}
mkdir -p "$W" "$O"
has() { [[ " $STAGES " == *" $1 "* ]]; }
if has regen; then
  python3 train_target.py regen --work "$W" --target "$T" --sequences "${SEQUENCES:-32768}" --seed "${SEED:-2}" \
    --greedy-every "${GREEDY_EVERY:-3}" --max-seconds "${REGEN_SECONDS:-150}" --regen-out "$W/regen" \
    > "$W/regen.log" 2>&1
  tail -n 2 "$W/regen.log"; cat "$W/regen/meta.json"; echo
fi
if has train; then
  python3 train_drafters.py eagle3 --target "$T" --regen "$W/regen" --out "$W/eagle3" --init "$INIT" \
    --minutes "${MINUTES:-5}" --lr "${LR:-1e-3}" --batch "${BATCH:-64}" > "$W/train.log" 2>&1
  grep -E '^\{' "$W/train.log" | tail -n 4; tail -n 1 "$W/train.log"
fi
if has eval; then
  # one process per (temperature, prompt set), the first EVAL_LIMIT prompts of each: a whole set takes ~4 minutes
  # on the GPU (greedy runs also decode plainly to check the outputs), past a call's budget with the stages beside it
  P=../../test/prompts
  ev() { timeout "${EVAL_TIMEOUT:-240}" python3 eval_tau.py --target "$T" --drafter "$W/eagle3/hf" --prompts $P \
    --temperature "$1" --domains "$2" --limit "${EVAL_LIMIT:-8}" --out "$W/tau_t$1_$2.json" \
    > "$W/eval_t$1_$2.log" 2>&1; }
  ev 0 prose & ev 0 code & ev 1 prose & ev 1 code &
  wait
  tail -n 2 "$W"/eval_*.log
fi
if has golden; then
  M="$W/models"
  rm -rf "$M" && mkdir -p "$M"
  # the target and the other drafters as they are; EAGLE-3 the new one
  for d in "$T" "$(dirname "$T")"/kimi-k3-tiny-dflash "$(dirname "$T")"/kimi-k3-tiny-dspark; do
    ln -s "$(realpath "$d")" "$M/"
  done
  mkdir -p "$M/kimi-k3-tiny-eagle3"
  cp "$W/eagle3/hf/config.json" "$W/eagle3/hf/model.safetensors" "$M/kimi-k3-tiny-eagle3/"
  CUDA_VISIBLE_DEVICES= python3 goldens.py --models "$M" --prompts ../../test/prompts --out "$W/goldens" \
    > "$W/goldens.log" 2>&1
  tail -n 4 "$W/goldens.log"
  (cd "$W" && tar czf "$O/goldens.tar.gz" goldens)
fi
if [ -f "$W/eagle3/hf/model.safetensors" ]; then
  mkdir -p "$O/eagle3" && cp "$W/eagle3/hf/config.json" "$W/eagle3/hf/model.safetensors" "$O/eagle3/"
fi
(cd "$W" && tar czf "$O/logs.tar.gz" --ignore-failed-read ./*.log tau_*.json regen/meta.json eagle3/log.json \
  2>/dev/null)
ls -la "$O" "$O"/* 2>/dev/null | head -20
