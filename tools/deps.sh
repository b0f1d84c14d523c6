#!/usr/bin/env bash
# Installs the Debian packages moex needs to build and test (idempotent; quick when present).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(build-essential cmake ninja-build pkg-config libgtest-dev libgmock-dev libbenchmark-dev
      nlohmann-json3-dev clang libclang-rt-14-dev libomp-14-dev
      libpcre2-dev libutf8proc-dev
      pybind11-dev python3-dev python3-numpy)  # the Python module (python/) and its tests
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# CUDA machines: the header-only cuDNN frontend for the prompt attention path (CMakeLists.txt finds
# it in .deps/; libcudnn is opened at run time). Skipped without nvcc or when already present.
frontend=1.32.0
if { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; } &&
   [ ! -f ".deps/cudnn-frontend-$frontend/include/cudnn_frontend.h" ]; then
  command -v unzip >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1 || {
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-pip unzip
  }
  tmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cudnn-frontend==$frontend"; then
    mkdir -p ".deps/cudnn-frontend-$frontend"
    unzip -q -o "$tmp"/nvidia_cudnn_frontend-*.whl 'include/*' -d ".deps/cudnn-frontend-$frontend"
  else
    echo "note: could not download nvidia-cudnn-frontend; the CUDA build runs prompts on its own attention kernels"
  fi
  rm -rf "$tmp"
fi
