#!/usr/bin/env bash
# Issue 16's CPU goals on the lent GPU machine's HOST: an Intel Xeon with AMX-INT8 / AMX-BF16, where the Kimi stage's
# dense GEMMs take the split-bf16 AMX path (defaultKimiActivations: 'bf16x2') that the AMD development VMs lack. Two
# threads pinned (taskset -c 0,1), as the goals are stated; no GPU is used. Over consecutive calls while the machine
# stays warm (files outside the repository stay for its 30 s idle window):
#
#   setup   unpacks Node (.gpu/node.xz) and the built JavaScript with its production node_modules and the CPU addon
#           (.gpu/runtime.tar.xz, made here by `bash tools/gpu/llama-gpu.sh pack-runtime`); no CUDA build
#   verify  writes $OUT/verify-dense-kimi.{txt,json}: bench/verify-dense.mjs --model kimi --profile, default activations
#           (bf16x2 on AMX; the 1.2 GB dense synthetic is written there, ~10 s), and $OUT/verify-dense-kimi-f32.txt:
#           the same with SPECD_KIMI_ACTIVATIONS=f32 (~3 min in all)
#   spec    with the Kimi models staged by tools/gpu/stage.sh in STAGE (default /root/stage: files/kimi.tar holds
#           models/kimi-k3-tiny and its drafters) writes $OUT/spec-kimi.{txt,json}: bench/spec.mjs on kimi-k3-tiny,
#           every prompt, 128 tokens, SPEC_CONC (default 1,8) sequences, greedy (the issue's kimi-k3-tiny goals; up
#           to ~8 min)
#   bound   (after spec, or with the models staged) writes $OUT/spec-bound-kimi.txt: bench/spec-bound.mjs on kimi-k3-tiny
#           + EAGLE-3 at 1 and 8 sequences, the speed-up drafting could reach with both engines at their floors on
#           this host's measured rates (bench:spec prints the same beside its goal lines; ~1 min)
#   moe     (after spec: it unpacks the staged models) writes $OUT/decode.txt: bench/decode.mjs --quick on kimi-k3-tiny
#           and the 3.5 GB MoE synthetic (written there), whose goal line is the MoE verify against its expert-union
#           floor (~5 min)
#   load    with SmolLM2 staged in STAGE (files/smol.tar: models/smollm2-135m-instruct with its GGUF and
#           generation_config.json, and models/smollm2-135m-instruct-eagle3) writes $OUT/load-smol.{txt,json}:
#           bench/load.mjs on SmolLM2 + EAGLE-3 at LOAD_CONC (default 4,8,16) sequences, LOAD_REPS (default 2)
#           repetitions, the default cost policy against --no-spec (issue 16's load goals; up to ~9 min); LOAD_ARGS: more
#           bench:load options (e.g. --trace "$OUT/trace.jsonl"), LOAD_TAG: a suffix for the output files' names
#   ab      (after setup; carry BASE_NODE, default .gpu/old.node: another build's specd_native.node, e.g. the one of
#           the runtime before a kernel change) writes $OUT/ab-{amx-int16,vnni-int16,amx-int8}.txt: bench/quant-ab.mjs
#           --kernels-only, SmolLM2's GEMM shapes, the base build against this runtime's, alternated, outputs compared
#           bit for bit; int16 with the AMX tiles forced from one row (SPECD_QUANT_AMX_MIN_ROWS_WIDE=1), the same on
#           VNNI (SPECD_QUANT_AMX=0), and int8 on AMX tiles from one row (~3 min)
#   phases  (with the models staged) writes $OUT/batch-phases-kimi.txt: bench/batch-phases.mjs on kimi-k3-tiny + EAGLE-3
#           at 8 sequences, plain vs one draft a sequence, every native call timed by phase (~1 min); with
#           PHASES_TARGET=smollm2 (smol.tar staged) $OUT/batch-phases-smollm2.txt: SmolLM2 + EAGLE-3 at 8 sequences,
#           plain vs one and two drafts a sequence, 16 prompts (~3 min)
# Each of verify, spec, bound, moe, load, ab and phases is one call (the device runs 10 minutes at most per call).
#
# Here, before the calls (the models are tracked, so take them out of the carried tree; put them back afterwards):
#   bash tools/gpu/llama-gpu.sh pack-runtime
#   tar cf /tmp/kimi.tar -C models kimi-k3-tiny kimi-k3-tiny-dflash kimi-k3-tiny-dspark kimi-k3-tiny-eagle3
#   bash tools/gpu/stage.sh pack .gpu/stage-kimi 48 /tmp/kimi.tar
#   # the carried tree must stay under 64 MiB with the 42 MB kimi.tar: untrack what no call reads (27 → 6 MB)
#   UNTRACK="models test/goldens test/goldens-smollm2 test/fixtures tools/reference/smollm2/prompts/train_prompts.u16"
#   git rm -r -q --cached $UNTRACK && printf '/%s\n' $UNTRACK >> .git/info/exclude
#   run (carry [".gpu/node.xz", ".gpu/runtime.tar.xz"]; 34 MB): bash tools/gpu/cpu-amx.sh setup &&
#       bash tools/gpu/cpu-amx.sh verify
#   run (carry [".gpu/stage-kimi/call1"]; 42 MB, within 30 s of the first):
#       bash tools/gpu/stage.sh take .gpu/stage-kimi/call1 /root/stage && bash tools/gpu/stage.sh join /root/stage &&
#       bash tools/gpu/cpu-amx.sh spec
#   run (no carry, within 30 s): bash tools/gpu/cpu-amx.sh moe
# For `load` (after setup; SmolLM2's 105 MB in two calls of ~53 MiB, with the same UNTRACK):
#   tar cf /tmp/smol.tar models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
#       models/smollm2-135m-instruct/generation_config.json models/smollm2-135m-instruct-eagle3
#   bash tools/gpu/stage.sh pack .gpu/stage-smol 53 /tmp/smol.tar
#   run (carry [".gpu/stage-smol/call1"]): bash tools/gpu/stage.sh take .gpu/stage-smol/call1 /root/stage
#   run (carry [".gpu/stage-smol/call2"], within 30 s): bash tools/gpu/stage.sh take .gpu/stage-smol/call2 \
#       /root/stage && bash tools/gpu/stage.sh join /root/stage && bash tools/gpu/cpu-amx.sh load
# For `ab` (after setup, no models): keep the base build before repacking the runtime, carry it beside node and runtime:
#   tar -xJOf .gpu/runtime.tar.xz native/build/Release/specd_native.node > .gpu/old.node   (then rebuild, pack-runtime)
#   run (carry [".gpu/node.xz", ".gpu/runtime.tar.xz", ".gpu/old.node"]): bash tools/gpu/cpu-amx.sh setup &&
#       bash tools/gpu/cpu-amx.sh ab
#   git reset -q $UNTRACK   (and remove those lines from .git/info/exclude)
# (Sizes on 2026-12-05: node.xz 24 MB, runtime.tar.xz 10 MB, kimi.tar 42 MB, the tracked tree without $UNTRACK 6 MB.
# A call's tree replaces the last one's there, so moe unpacks the staged models again.)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
STAGE=${STAGE:-/root/stage}
COMMIT=${COMMIT:-unknown}
CPUS=${CPUS:-0,1}
mkdir -p "$OUT"

header() {
  echo "# $1 — $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $COMMIT"
  echo "# host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, pinned to $CPUS," \
    "amx: $(grep -o -m1 'amx_[a-z0-9]*' /proc/cpuinfo | sort -u | xargs), node $(node --version)," \
    "load $(cut -d' ' -f1-3 /proc/loadavg)"
}

case "${1:-}" in
setup)
  mkdir -p /root/nbin
  xz -dc .gpu/node.xz > /root/nbin/node && chmod +x /root/nbin/node
  export PATH=/root/nbin:$PATH
  tar -xJf .gpu/runtime.tar.xz
  node -e "import('@specd/native').then((m) => console.log(JSON.stringify(m.isa())))"
  ;;
verify)
  export PATH=/root/nbin:$PATH
  { header "node bench/verify-dense.mjs --model kimi --profile (default activations)"
    timeout "${VERIFY_TIMEOUT:-240}" taskset -c "$CPUS" node bench/verify-dense.mjs --model kimi --profile \
      --json "$OUT/verify-dense-kimi.json"; } > "$OUT/verify-dense-kimi.txt" 2>&1
  { header "SPECD_KIMI_ACTIVATIONS=f32 node bench/verify-dense.mjs --model kimi"
    SPECD_KIMI_ACTIVATIONS=f32 timeout "${VERIFY_TIMEOUT:-240}" taskset -c "$CPUS" node bench/verify-dense.mjs \
      --model kimi; } > "$OUT/verify-dense-kimi-f32.txt" 2>&1
  tail -n 12 "$OUT/verify-dense-kimi.txt"; tail -n 4 "$OUT/verify-dense-kimi-f32.txt"
  ;;
spec)
  export PATH=/root/nbin:$PATH
  if [ -f "$STAGE/files/kimi.tar" ]; then mkdir -p models && tar -xf "$STAGE/files/kimi.tar" -C models; fi
  if [ -f models/kimi-k3-tiny/config.json ]; then
    { header "node bench/spec.mjs --prompts 64 --tokens 128 --conc ${SPEC_CONC:-1,8} --reps 2 --settings 0 --split-ks 0"
      timeout "${SPEC_TIMEOUT:-560}" taskset -c "$CPUS" node bench/spec.mjs --prompts 64 --tokens 128 \
        --conc "${SPEC_CONC:-1,8}" \
        --reps 2 --settings 0 --split-ks 0 --json "$OUT/spec-kimi.json"; } > "$OUT/spec-kimi.txt" 2>&1
  else
    echo "cpu-amx.sh: models/kimi-k3-tiny is missing (stage kimi.tar): bench:spec skipped" > "$OUT/spec-kimi.txt"
  fi
  tail -n 20 "$OUT/spec-kimi.txt"
  ;;
bound)
  export PATH=/root/nbin:$PATH
  if [ -f "$STAGE/files/kimi.tar" ]; then mkdir -p models && tar -xf "$STAGE/files/kimi.tar" -C models; fi
  { header "node bench/spec-bound.mjs --target kimi --drafters eagle3 --conc 1,8"
    timeout "${BOUND_TIMEOUT:-300}" taskset -c "$CPUS" node bench/spec-bound.mjs --target kimi --drafters eagle3 \
      --conc 1,8; } > "$OUT/spec-bound-kimi.txt" 2>&1
  grep -E "best:|plain step" "$OUT/spec-bound-kimi.txt"; tail -n 2 "$OUT/spec-bound-kimi.txt"
  ;;
moe)
  export PATH=/root/nbin:$PATH
  if [ -f "$STAGE/files/kimi.tar" ]; then mkdir -p models && tar -xf "$STAGE/files/kimi.tar" -C models; fi
  { header "node bench/decode.mjs --quick (kimi-k3-tiny and the MoE synthetic)"
    timeout "${DECODE_TIMEOUT:-540}" taskset -c "$CPUS" node bench/decode.mjs --quick --threads 2; } \
    > "$OUT/decode.txt" 2>&1
  grep -E "goal|^\| (t_step|t_verify)" "$OUT/decode.txt"; tail -n 5 "$OUT/decode.txt"
  ;;
load)
  export PATH=/root/nbin:$PATH
  tag=${LOAD_TAG:+-$LOAD_TAG}
  if [ -f "$STAGE/files/smol.tar" ]; then mkdir -p models && tar -xf "$STAGE/files/smol.tar"; fi
  if [ -f models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
    # shellcheck disable=SC2086 # LOAD_ARGS is a word list
    { header "node bench/load.mjs --drafters eagle3 --conc ${LOAD_CONC:-4,8,16} --reps ${LOAD_REPS:-2} ${LOAD_ARGS:-}"
      timeout "${LOAD_TIMEOUT:-560}" taskset -c "$CPUS" node bench/load.mjs --drafters eagle3 \
        --conc "${LOAD_CONC:-4,8,16}" --reps "${LOAD_REPS:-2}" --json "$OUT/load-smol$tag.json" ${LOAD_ARGS:-}; } \
      > "$OUT/load-smol$tag.txt" 2>&1
  else
    echo "cpu-amx.sh: the SmolLM2 GGUF is missing (stage smol.tar): bench:load skipped" > "$OUT/load-smol$tag.txt"
  fi
  tail -n 24 "$OUT/load-smol$tag.txt"
  ;;
phases)
  export PATH=/root/nbin:$PATH
  target=${PHASES_TARGET:-kimi}
  if [ "$target" = smollm2 ]; then
    if [ -f "$STAGE/files/smol.tar" ]; then mkdir -p models && tar -xf "$STAGE/files/smol.tar"; fi
    args="--target smollm2 --drafter eagle3 --conc 8 --ks plain,1,2 --prompts 16 --tokens 128 --reps 1"
  else
    if [ -f "$STAGE/files/kimi.tar" ]; then mkdir -p models && tar -xf "$STAGE/files/kimi.tar" -C models; fi
    args="--target kimi --conc 8 --ks plain,1"
  fi
  # shellcheck disable=SC2086 # args is a word list
  { header "node bench/batch-phases.mjs $args"
    timeout "${PHASES_TIMEOUT:-300}" taskset -c "$CPUS" node bench/batch-phases.mjs $args \
      --json "$OUT/batch-phases-$target.json"; } > "$OUT/batch-phases-$target.txt" 2>&1
  head -n 40 "$OUT/batch-phases-$target.txt"
  ;;
ab)
  export PATH=/root/nbin:$PATH
  base=${BASE_NODE:-.gpu/old.node}
  ab() {  # $1 file, then the environment and arguments of bench/quant-ab.mjs
    local file=$1
    shift
    { header "$* --base $base"
      env "$@" --base "$base"; } > "$OUT/$file" 2>&1
    tail -n 12 "$OUT/$file"
  }
  run="timeout ${AB_TIMEOUT:-200} taskset -c $CPUS node bench/quant-ab.mjs --kernels-only --reps 3"
  # shellcheck disable=SC2086 # run is a word list
  ab ab-amx-int16.txt SPECD_QUANT_AMX_MIN_ROWS_WIDE=1 $run --acts int16 --ms 1,4,8,12,16,24,32
  # shellcheck disable=SC2086
  ab ab-vnni-int16.txt SPECD_QUANT_AMX=0 $run --acts int16 --ms 4,8,12,16
  # shellcheck disable=SC2086
  ab ab-amx-int8.txt SPECD_QUANT_AMX_MIN_ROWS=1 $run --acts int8 --ms 8,16,96
  ;;
*)
  echo "usage: cpu-amx.sh setup | verify | spec | bound | moe | load | ab | phases" >&2
  exit 1
  ;;
esac
