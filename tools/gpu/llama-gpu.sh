#!/usr/bin/env bash
# The whole-model GPU stage of issue 18 on the lent GPU machine (no Node, no network, no npm there): SmolLM2 on
# the CUDA stage, its GPU tests, bench:gpu and the PyTorch baseline, each output with the nvidia-smi line and the
# commit, for docs/gpu-runs/. Two steps, over consecutive calls while the machine stays warm:
#
#   setup   unpacks Node (.gpu/node.xz) and the built JavaScript with its production node_modules
#           (.gpu/runtime.tar.xz, made here by `bash tools/gpu/llama-gpu.sh pack-runtime`), builds
#           @specd/native-cuda with nvcc; writes $OUT/build-gpu.txt
#   run     with the GGUF and the drafters staged by tools/gpu/stage.sh in STAGE (default /root/stage: files/
#           holds SmolLM2-135M-Instruct.Q4_1.gguf, generation_config.json and drafters.tar): the GPU tests
#           (node --test packages/native-cuda/test-gpu/), bench-gpu/gemm.mjs, bench-gpu/llama.mjs and
#           tools/gpu/bench_torch.py; writes $OUT/{test-gpu,bench-gpu,bench-torch}.txt and the benches' JSON
#
# Here, before the calls:
#   bash tools/gpu/llama-gpu.sh pack-runtime      # .gpu/runtime.tar.xz (~12 MB): dist, native addon, node_modules
#   tar cf /tmp/drafters.tar -C models smollm2-135m-instruct-eagle3 smollm2-135m-instruct-dflash
#   bash tools/gpu/stage.sh pack .gpu/stage 48 models/smollm2-135m-instruct/*.gguf \
#       models/smollm2-135m-instruct/generation_config.json /tmp/drafters.tar
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
STAGE=${STAGE:-/root/stage}
COMMIT=${COMMIT:-unknown}
mkdir -p "$OUT"

header() {
  echo "# $1 — $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $COMMIT"
  echo "# $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"
  echo "# host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, node $(node --version)"
}

case "${1:-}" in
pack-runtime)
  # the production dependency closure of the workspaces, the built packages and the CPU addon
  npm ls --omit=dev --all --parseable 2>/dev/null | grep /node_modules/ | sed "s#^$PWD/##" | sort -u > /tmp/rt.txt
  { echo node_modules/@specd; ls -d packages/*/dist native/dist; echo native/build/Release/specd_native.node; } \
    >> /tmp/rt.txt
  mkdir -p .gpu
  tar -cf - --exclude='*.map' --exclude='*.d.ts' --exclude='node_modules/zeromq/prebuilds/*win*' \
    --exclude='node_modules/zeromq/prebuilds/*darwin*' --exclude='node_modules/zeromq/prebuilds/*arm*' -T /tmp/rt.txt |
    xz -T2 -6 > .gpu/runtime.tar.xz
  ls -la .gpu/runtime.tar.xz
  ;;
setup)
  mkdir -p /root/nbin
  xz -dc .gpu/node.xz > /root/nbin/node && chmod +x /root/nbin/node
  export PATH=/root/nbin:$PATH
  tar -xJf .gpu/runtime.tar.xz
  {
    header "npm run build:cuda"
    NODE_INCLUDE=$PWD/.gpu/include/node NAPI_INCLUDE=$PWD/.gpu/node-addon-api \
      bash packages/native-cuda/scripts/build.sh
    node -e "import('@specd/native-cuda').then((m) => console.log(JSON.stringify(m.loadCuda().info)))"
  } > "$OUT/build-gpu.txt" 2>&1
  tail -n 5 "$OUT/build-gpu.txt"
  ;;
run)
  export PATH=/root/nbin:$PATH
  mkdir -p "$STAGE/smol" "$STAGE/drafters"
  ln -sf "$STAGE/files/SmolLM2-135M-Instruct.Q4_1.gguf" "$STAGE/smol/"
  cp "$STAGE/files/generation_config.json" "$STAGE/smol/" 2>/dev/null
  tar -xf "$STAGE/files/drafters.tar" -C "$STAGE/drafters" 2>/dev/null
  export SPECD_GGUF_DIR=$STAGE/smol SPECD_DRAFTERS_DIR=$STAGE/drafters
  { header "npm run test:gpu (node --test packages/native-cuda/test-gpu/)"
    timeout "${TEST_TIMEOUT:-300}" node --test --test-reporter=spec packages/native-cuda/test-gpu/; } \
    > "$OUT/test-gpu.txt" 2>&1
  { header "npm run bench:gpu (bench-gpu/gemm.mjs, bench-gpu/llama.mjs)"
    timeout 60 node packages/native-cuda/bench-gpu/gemm.mjs
    timeout "${BENCH_TIMEOUT:-200}" node packages/native-cuda/bench-gpu/llama.mjs --json "$OUT/bench-gpu.json"; } \
    > "$OUT/bench-gpu.txt" 2>&1
  { header "python3 tools/gpu/bench_torch.py (PyTorch + transformers, same GPU)"
    python3 -c "import torch, transformers; print('# torch', torch.__version__, 'transformers', transformers.__version__)"
    timeout "${TORCH_TIMEOUT:-200}" python3 tools/gpu/bench_torch.py --gguf "$STAGE/smol/SmolLM2-135M-Instruct.Q4_1.gguf" \
      --json "$OUT/bench-torch.json"; } > "$OUT/bench-torch.txt" 2>&1
  tail -n 25 "$OUT/test-gpu.txt"; tail -n 30 "$OUT/bench-gpu.txt"; tail -n 20 "$OUT/bench-torch.txt"
  ;;
*)
  echo "usage: llama-gpu.sh pack-runtime | setup | run" >&2
  exit 1
  ;;
esac
