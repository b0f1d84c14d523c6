#!/bin/sh
# Builds the CPU kernel labs against the objects of a CPU build directory (default build-cpu:
# `ninja -C build-cpu moex` first; experts_lab and pack_lab need only the src/core and src/cpu objects); amx_lab is
# standalone; dense_linear_lab and attention_cpu_lab link libmoex.so of that directory.
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-cpu}
objs=$(find "$build/CMakeFiles/moex.dir/src/core" "$build/CMakeFiles/moex.dir/src/cpu" -name '*.o')
g++ -std=c++20 -O2 -fopenmp -I"$root/include" -I"$root/src" "$root/lab/cpu/experts_lab.cpp" $objs \
  -o "$build/experts_lab"
g++ -std=c++20 -O2 -fopenmp -I"$root/include" -I"$root/src" "$root/lab/cpu/pack_lab.cpp" $objs \
  -o "$build/pack_lab"
g++ -std=c++20 -O2 "$root/lab/cpu/amx_lab.cpp" -o "$build/amx_lab"  # standalone, no engine objects
# The dense linear lab links the library itself (it times ops::linear's plain loop as "before").
g++ -std=c++20 -O2 -fopenmp -I"$root/include" -I"$root/src" "$root/lab/cpu/dense_linear_lab.cpp" \
  -L"$build" -lmoex -Wl,-rpath,"$build" -o "$build/dense_linear_lab"
# The attention lab calls host ops (src/ops/cpu): links the library itself.
g++ -std=c++20 -O2 -fopenmp -I"$root/include" -I"$root/src" "$root/lab/cpu/attention_cpu_lab.cpp" \
  -L"$build" -lmoex -Wl,-rpath,"$build" -o "$build/attention_cpu_lab"
echo "$build/experts_lab $build/pack_lab $build/amx_lab $build/dense_linear_lab $build/attention_cpu_lab"
