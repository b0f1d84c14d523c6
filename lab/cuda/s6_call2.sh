#!/usr/bin/env bash
# Session 6, call 2: the ncu comparison of next_gateup_stalls.sh with the CUTLASS kernel found
# (torch names it cutlass::device_kernel<...>, so the regex is device_kernel), and the full text
# of both reports (details, raw stall-sampling metrics, SASS source view with stall samples of
# moex's gate_up) under $OUT, since there is no ncu on the build machine. carry: build-pack
set -u
. lab/cuda/device_env.sh
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SourceCounters --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis"
timeout 200 ncu $SECTIONS --import-source yes --clock-control none --kernel-name regex:grouped_gemm_wgmma \
  --launch-skip 4 --launch-count 2 -o "$OUT/moex" build-gpu/moex bench experts \
  --device cuda --backends grouped_mm --graph off --no-check --min-iters 3 --budget-s 0.05 \
  --bandwidth-gbs 4268 --peak-tflops 800 --shape mixtral-8x7b --tokens 4096 > "$OUT/moex_ncu.log" 2>&1
echo "moex ncu rc=$?" >> "$S"
timeout 240 ncu $SECTIONS --clock-control none --profile-from-start off --kernel-name regex:device_kernel \
  --launch-count 2 -o "$OUT/cutlass" python3 lab/cuda/hf_ncu.py mixtral-8x7b 4096 > "$OUT/hf_ncu.log" 2>&1
echo "cutlass ncu rc=$?" >> "$S"
for r in moex cutlass; do
  [ -e "$OUT/$r.ncu-rep" ] || continue
  ncu --import "$OUT/$r.ncu-rep" --page details --print-units base > "$OUT/$r.details.txt" 2>&1
  ncu --import "$OUT/$r.ncu-rep" --page raw --csv > "$OUT/$r.raw.csv" 2>&1
  ncu --import "$OUT/$r.ncu-rep" --page source --csv --print-source sass > "$OUT/$r.sass.csv" 2>&1
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|DRAM Throughput|Issued Warp|No Eligible|Registers Per|Dynamic Shared|Grid Size|Block Size" "$OUT/$r.details.txt" | sed -E "s/ +/ /g; s/^/$r: /" >> "$S"
done
python3 - "$OUT" >> "$S" 2>&1 <<'PY'
import csv, sys, os
out = sys.argv[1]
for r in ("moex", "cutlass"):
    p = os.path.join(out, r + ".raw.csv")
    if not os.path.exists(p): continue
    rows = list(csv.reader(open(p)))
    hdr = rows[0]
    for row in rows[2:]:
        d = dict(zip(hdr, row))
        print(r, d.get("Kernel Name", "")[:60])
        keys = [k for k in hdr if ("pcsamp_warps_issue_stalled" in k and not k.endswith("not_issued")) or k.startswith("dram__bytes_read.sum") or k.startswith("dram__bytes_write.sum") or k.startswith("lts__t_sector_hit_rate") or k.startswith("gpc__cycles_elapsed.max") or k.startswith("sm__pipe_tensor_op_hmma_cycles_active")]
        vals = sorted(((k, d[k]) for k in keys), key=lambda kv: -float(kv[1].replace(",", "") or 0) if kv[1].replace(",", "").replace(".", "").isdigit() else 0)
        for k, v in vals[:40]:
            print("   ", k, v)
PY
cat "$S"
