#!/usr/bin/env bash
# Session 4's third device call: the half-empty-tile change (a consumer warpgroup with no rows
# in a 128-row tile issues no MMAs) on build-gpu, main's kernels on build-gpu-base.
# 1. CUDA suites on build-gpu; 2. grouped_mm base vs new on the compute-bound rows (timings only,
# new / base / new); 3. side by side with transformers' grouped_mm compiled shape-static (its
# best backend on these rows in every earlier table), T = 256..16384; 4. raster group sizes.
# carry: build-pack (see s4_check.sh)
set -u
for p in build-pack/*.tar.xz; do [ -e "$p" ] && tar xJf "$p"; done
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"; L=$(mktemp -d); S="$OUT/summary.txt"
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
with() { local d=$1; shift; LD_LIBRARY_PATH=$PWD/$d:/usr/local/cuda/lib64 "$@"; }
trap 'tar czf "$OUT/logs.tgz" -C "$L" .' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> "$S"
for v in default MOEX_WGMMA_PINGPONG=both MOEX_CUDA_GEMM=mma; do
  f="$L/tests_${v//=/_}.log"; filter=""; [ "$v" = default ] || filter="--gtest_filter=*CudaConsistency*:*CudaGraph*"
  env ${v/default/X=1} LD_LIBRARY_PATH=$PWD/build-gpu timeout 150 build-gpu/tests/test_cuda_backends --gtest_brief=1 $filter > "$f" 2>&1
  echo "test_cuda_backends $v rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$f" | tr '\n' ' ')" >> "$S"
  grep -E "^\[  FAILED  \]" "$f" | head -5 >> "$S"
done
for t in test_experts_fixtures test_experts_consistency; do
  with build-gpu timeout 120 build-gpu/tests/$t --gtest_brief=1 > "$L/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$L/$t.log" | tr '\n' ' ')" >> "$S"
  grep -E "^\[  FAILED  \]" "$L/$t.log" | head -5 >> "$S"
done
cat "$S"
for d in build-gpu build-gpu-base build-gpu; do
  for s in mixtral-8x7b:256,1024,4096,16384 qwen1.5-moe-a2.7b:256,1024,4096,16384 deepseek-v3:1024,4096,16384; do
    with $d timeout 60 $d/moex bench experts --device cuda --backends grouped_mm --graph on --no-check \
      --min-iters 5 --budget-s 0.5 --shape "${s%%:*}" --tokens "${s#*:}" 2>&1 |
      grep -E "grouped_mm|error" | sed -E "s/^/${s%%:*} $d /; s/ +/ /g" >> "$S"
  done
done
t0=$SECONDS
PYTHONUNBUFFERED=1 with build-gpu timeout 300 python3 bench/side_by_side.py --moex build-gpu/moex \
  --shapes mixtral-8x7b,deepseek-v3,qwen1.5-moe-a2.7b --tokens 256,1024,4096,16384 --hf-impls grouped_mm \
  --compile yes --compile-mode default --compile-dynamic static --batched-max-tokens 64 \
  --moex-args "--budget-s 1 --min-iters 10" --json-out "$OUT/sbs_static.json" > "$L/sbs_static.log" 2>&1
echo "== side_by_side static rc=$? $((SECONDS-t0)) s" >> "$S"
grep -E "^\||compiled:" "$L/sbs_static.log" >> "$S"
for r in 4 16 32; do
  for s in deepseek-v3:4096,16384 mixtral-8x7b:4096,16384; do
    MOEX_WGMMA_RASTER=$r with build-gpu timeout 60 build-gpu/moex bench experts --device cuda --backends grouped_mm \
      --graph on --no-check --min-iters 5 --budget-s 0.5 --shape "${s%%:*}" --tokens "${s#*:}" 2>&1 |
      grep -E "grouped_mm|error" | sed -E "s/^/${s%%:*} raster=$r /; s/ +/ /g" >> "$S"
  done
done
cat "$S"
