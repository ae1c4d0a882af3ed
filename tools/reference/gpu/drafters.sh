#!/usr/bin/env bash
# GPU stage 3+4 in one 10-minute call: train DFlash, DSpark and EAGLE-3 concurrently on one H200,
# then run every reference tau evaluation concurrently. Results go to $OUT (≤ 8 files):
#   {dflash,dspark,eagle3}/{config.json,model.safetensors}  and  logs.tar.gz (training logs, tau JSON).
# usage: gpu/drafters.sh TARGET_DIR REGEN_DIR [MINUTES] [WORK]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
T=${1:?target HF folder}; R=${2:?regen folder with tokens.u16 and meta.json}; MIN=${3:-5}; W=${4:-/root/dw}
O=${OUT:-$W/out}
mkdir -p "$W" "$O"
for m in dflash dspark eagle3; do
  python3 train_drafters.py $m --target "$T" --regen "$R" --out "$W/$m" --minutes "$MIN" > "$W/train_$m.log" 2>&1 &
done
wait
tail -n 2 "$W"/train_*.log
P=../../test/prompts
ev() { timeout "${EVAL_TIMEOUT:-210}" python3 eval_tau.py --target "$T" --drafter "$W/$1/hf" --prompts $P --temperature "$2" ${4:-} --out "$W/tau_$3.json" > "$W/eval_$3.log" 2>&1; }
ev dflash 0 dflash_t0 & ev dflash 1 dflash_t1 &
ev dflash 0 dflash_b7_t0 "--block-size 7" & ev dflash 1 dflash_b7_t1 "--block-size 7" &
ev dspark 0 dspark_t0 & ev dspark 1 dspark_t1 &
ev eagle3 0 eagle3_t0 & ev eagle3 1 eagle3_t1 &
wait
tail -n 3 "$W"/eval_*.log
for m in dflash dspark eagle3; do mkdir -p "$O/$m"; cp "$W/$m/hf/config.json" "$W/$m/hf/model.safetensors" "$O/$m/"; done
(cd "$W" && tar czf "$O/logs.tar.gz" train_*.log eval_*.log tau_*.json */log.json)
ls -la "$O" "$O"/*
