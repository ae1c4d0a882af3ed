#!/usr/bin/env bash
# Builds build/specd_cuda.node with nvcc: kernels.cu + binding.cc, the Llama, EAGLE-3 and DFlash runners, sampling.cu,
# cuBLASLt. Only on a machine with the CUDA toolkit (CUDA 13 tried); CI and `npm run build` never run it.
#   CUDA_ARCH   the GPU architecture (default sm_90a: Hopper, the H200; e.g. sm_80, sm_89, sm_100a)
#   NVCC        the compiler (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc)
#   NODE_INCLUDE  Node's headers (default: <node>/../../include/node); NAPI_INCLUDE node-addon-api's
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [[ ! -x "$NVCC" ]]; then
  echo "build:cuda: nvcc not found: the CUDA backend builds only where the CUDA toolkit is installed (set NVCC)" >&2
  exit 1
fi
ARCH=${CUDA_ARCH:-sm_90a}
NODE_INCLUDE=${NODE_INCLUDE:-$(node -p "require('path').join(process.execPath, '../../include/node')")}
NAPI_INCLUDE=${NAPI_INCLUDE:-$(node -p "require('path').dirname(require.resolve('node-addon-api/package.json'))")}
mkdir -p build
"$NVCC" -O3 -std=c++17 -arch="$ARCH" -shared -Xcompiler -fPIC,-fvisibility=hidden \
  -DNAPI_VERSION=8 -DNAPI_CPP_EXCEPTIONS -DNODE_ADDON_API_DISABLE_DEPRECATED \
  -I"$NODE_INCLUDE" -I"$NAPI_INCLUDE" -o build/specd_cuda.node src/kernels.cu src/llama.cu src/binding.cc src/llama_runner.cc \
  src/eagle3.cu src/eagle3_runner.cc src/dflash.cu src/dflash_runner.cc src/sampling.cu -lcublasLt
echo "build:cuda: built build/specd_cuda.node for $ARCH with $("$NVCC" --version | tail -n 2 | head -n 1)"
