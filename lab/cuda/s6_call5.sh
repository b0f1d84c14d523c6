#!/usr/bin/env bash
# Session 6, call 5 (staged gate_up epilogue, 04423cc): per-kernel durations and clocks of one
# Mixtral T = 4096 forward, moex and transformers' compiled grouped_mm (ncu, SpeedOfLight only),
# then the shape-static side by side of session 5's table on the new binary. carry: build-pack
set -u
. lab/cuda/device_env.sh
Q="--section SpeedOfLight --clock-control none --csv --print-units base"
timeout 120 ncu $Q --launch-skip 20 --launch-count 10 build-gpu/moex bench experts --device cuda \
  --backends grouped_mm --graph off --no-check --min-iters 3 --budget-s 0.05 --bandwidth-gbs 4268 \
  --peak-tflops 800 --shape mixtral-8x7b --tokens 4096 > "$OUT/moex_kernels.csv" 2>&1
timeout 200 ncu $Q --profile-from-start off python3 lab/cuda/hf_ncu.py mixtral-8x7b 4096 > "$OUT/hf_kernels.csv" 2>&1
python3 - "$OUT" >> "$S" 2>&1 <<'PY'
import csv, sys, os, io
for r in ("moex_kernels", "hf_kernels"):
    txt = open(os.path.join(sys.argv[1], r + ".csv")).read()
    lines = [l for l in txt.splitlines() if l.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    hdr = rows[0]; ki = hdr.index("Kernel Name"); mi = hdr.index("Metric Name"); vi = hdr.index("Metric Value"); ii = hdr.index("ID")
    d = {}
    for row in rows[1:]:
        d.setdefault(row[ii], {"name": row[ki][:70]})[row[mi]] = row[vi]
    tot = 0
    for k, v in d.items():
        ns = float(v.get("Duration", "0").replace(",", "")); tot += ns
        print(r, k, v["name"], "ns", int(ns), "MHz", v.get("SM Frequency", "?"))
    print(r, "sum ns", int(tot))
PY
PYTHONUNBUFFERED=1 timeout 300 python3 bench/side_by_side.py --moex build-gpu/moex \
  --shapes mixtral-8x7b,deepseek-v3,qwen1.5-moe-a2.7b --tokens 256,1024,4096,16384 --hf-impls grouped_mm \
  --compile yes --compile-mode default --compile-dynamic static --batched-max-tokens 64 \
  --moex-args "--budget-s 1 --min-iters 10" --json-out "$OUT/sbs_static.json" > "$OUT/sbs_static.log" 2>&1
echo "== side_by_side static rc=$?" >> "$S"
grep -E "^\||compiled|took" "$OUT/sbs_static.log" >> "$S"
cat "$S"
