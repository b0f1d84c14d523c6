#!/usr/bin/env bash
# Installs the Debian packages moex needs to build and test (idempotent; quick when present).
set -euo pipefail
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
