#!/bin/sh
# Builds the CPU kernel lab against the objects of a CPU build directory (default build-cpu:
# `ninja -C build-cpu moex` first; only src/core and src/cpu objects are needed).
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-cpu}
objs=$(find "$build/CMakeFiles/moex.dir/src/core" "$build/CMakeFiles/moex.dir/src/cpu" -name '*.o')
g++ -std=c++20 -O2 -fopenmp -I"$root/include" -I"$root/src" "$root/lab/cpu/experts_lab.cpp" $objs \
  -o "$build/experts_lab"
echo "$build/experts_lab"
