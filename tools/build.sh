#!/usr/bin/env bash
# Configures and builds moex into build/ (CUDA code too when the CUDA toolkit is installed,
# even without a GPU: GPU tests then skip at run time).
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda=ON
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=$cuda "$@" >/dev/null
cmake --build build -j"$(nproc)"
