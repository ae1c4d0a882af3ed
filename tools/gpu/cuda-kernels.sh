#!/usr/bin/env bash
# One call on the GPU machine (no Node, no network): unpacks the Node binary carried in .gpu/ (see
# scripts/stage-gpu.sh), builds @specd/native-cuda with nvcc, runs its GPU tests and bench, and writes their raw output
# with the nvidia-smi line and the commit to $OUT/test-gpu.txt and $OUT/bench-gpu.txt (committed under docs/gpu-runs/).
#   COMMIT=<hash> bash tools/gpu/cuda-kernels.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/nbin
xz -dc .gpu/node.xz > /tmp/nbin/node && chmod +x /tmp/nbin/node
export PATH=/tmp/nbin:$PATH
head() {
  echo "# $1 — $(date -u +%Y-%m-%dT%H:%M:%SZ), commit ${COMMIT:-unknown}"
  echo "# $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
  echo "# host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), node $(node --version)"
}
{
  head "npm run build:cuda"
  NODE_INCLUDE=$PWD/.gpu/include/node NAPI_INCLUDE=$PWD/.gpu/node-addon-api bash packages/native-cuda/scripts/build.sh
} > "$OUT/build-gpu.txt" 2>&1
{ head "npm run test:gpu (node --test packages/native-cuda/test-gpu/)"; node --test packages/native-cuda/test-gpu/; } \
  > "$OUT/test-gpu.txt" 2>&1
{ head "npm run bench:gpu"; node packages/native-cuda/bench-gpu/gemm.mjs; } > "$OUT/bench-gpu.txt" 2>&1
tail -n 30 "$OUT"/build-gpu.txt "$OUT"/test-gpu.txt "$OUT"/bench-gpu.txt
