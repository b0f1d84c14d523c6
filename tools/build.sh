#!/usr/bin/env bash
# Configures and builds moex into build/ (CUDA code too when the CUDA toolkit is installed,
# even without a GPU: GPU tests then skip at run time), with the Python module in build/python
# (PYTHONPATH=build/python), built for the system Python that tools/deps.sh gives numpy to.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda=ON
  export PATH="/usr/local/cuda/bin:$PATH"
fi
py=()
[ -x /usr/bin/python3 ] && py=(-DPython_EXECUTABLE=/usr/bin/python3)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=$cuda -DMOEX_PYTHON=ON "${py[@]}" "$@" >/dev/null
cmake --build build -j"$(nproc)"
