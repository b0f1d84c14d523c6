#!/usr/bin/env python3
"""Condenses ncu --metrics logs (one block per kernel launch) into one line per launch: kernel
(CUTLASS names shortened to their schedule, stages, cluster and tile), time, SM clock, SM busy,
DRAM and L2 throughput and bytes. Launches under 20 us are left out. Usage: ncu_condense.py LOG..."""
import re
import sys

KEYS = [("gpu__time_duration.sum", "t"), ("sm__cycles_elapsed.avg.per_second", "GHz"),
        ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm%"),
        ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram%"),
        ("dram__bytes_read.sum", "dram_read"), ("lts__t_bytes.sum", "l2_bytes"),
        ("lts__t_sector_hit_rate.pct", "l2_hit%"),
        ("lts__throughput.avg.pct_of_peak_sustained_elapsed", "l2%"),
        ("launch__cluster_dim_x", "cluster_x"), ("launch__grid_size", "grid"),
        ("sm__cycles_active.avg.pct_of_peak_sustained_elapsed", "sm_active%")]


def short(name):
    if "cutlass" not in name:
        return re.sub(r"[<(].*", "", name)
    sched = re.search(r"KernelPtrArray\w+", name)
    main = re.search(r"WarpSpecialized<(\d+), cute::tuple<cute::C<(\d+)>, cute::C<(\d+)>", name)
    tile = re.search(r">, cute::tuple<cute::C<(\d+)>, cute::C<(\d+)>, cute::C<(\d+)>>", name)
    return "cutlass %s stages=%s cluster=%sx%s tile=%s" % (
        sched.group(0) if sched else "?", *(main.groups() if main else "???"),
        "x".join(tile.groups()) if tile else "?")


for path in sys.argv[1:]:
    print("==", path.split("/")[-1])
    rows, cur = [], None
    for line in open(path, errors="replace"):
        m = re.match(r"^  (\S.*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line)
        if m:
            cur = {"name": short(m.group(1))}
            rows.append(cur)
            continue
        m = re.match(r"^    ([a-z_]+__[a-z_.]+)\s+(\S+)?\s+([\d,.]+)\s*$", line)
        if m and cur is not None:
            cur[m.group(1)] = (m.group(3).replace(",", ""), m.group(2) or "")
    for r in rows:
        t = r.get("gpu__time_duration.sum", ("0", "us"))
        if t[1] == "us" and float(t[0]) < 20:
            continue
        cells = ["%s=%s%s" % (lab, *r[k]) for k, lab in KEYS if k in r]
        print("  %-80s %s" % (r["name"][:100], " ".join(cells)))
