#!/usr/bin/env bash
# GPU call: (re)train DSpark while the reference tau of the already-trained drafters is measured,
# then measure DSpark's tau. $OUT: dspark/{config.json,model.safetensors}, logs.tar.gz.
# usage: gpu/finish.sh TARGET_DIR REGEN_DIR DRAFTERS_DIR [DSPARK_MINUTES] [WORK]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
T=${1:?target}; R=${2:?regen}; D=${3:?folder with dflash/ and eagle3/}; MIN=${4:-3}; W=${5:-/root/dw}
O=${OUT:-$W/out}; P=../../test/prompts
mkdir -p "$W" "$O"
python3 train_drafters.py dspark --target "$T" --regen "$R" --out "$W/dspark" --minutes "$MIN" > "$W/train_dspark.log" 2>&1 &
TP=$!
ev() { timeout "$1" python3 eval_tau.py --target "$T" --drafter "$2" --prompts $P --temperature "$3" ${5:-} --out "$W/tau_$4.json" > "$W/eval_$4.log" 2>&1; }
ev 400 "$D/dflash" 0 dflash_t0 &
ev 400 "$D/dflash" 1 dflash_t1 --no-plain-check &
ev 400 "$D/dflash" 0 dflash_b7_t0 "--block-size 7 --no-plain-check" &
ev 400 "$D/eagle3" 0 eagle3_t0 --no-plain-check &
ev 400 "$D/eagle3" 1 eagle3_t1 --no-plain-check &
wait $TP
ev 290 "$W/dspark/hf" 0 dspark_t0 --no-plain-check &
ev 290 "$W/dspark/hf" 1 dspark_t1 --no-plain-check &
wait
tail -n 3 "$W"/train_dspark.log "$W"/eval_*.log
mkdir -p "$O/dspark"; cp "$W/dspark/hf/config.json" "$W/dspark/hf/model.safetensors" "$O/dspark/"
(cd "$W" && tar czf "$O/logs.tar.gz" train_*.log eval_*.log tau_*.json dspark/log.json)
ls -la "$O" "$O"/*
