#!/usr/bin/env python3
"""Condenses an `ncu --csv --print-units base --metrics gpu__time_duration.sum,dram__bytes_read.sum`
log of a `moex generate` run into one decode step: steps are split at the embedding kernel (the
first kernel of every forward), the last complete step is kept, and its kernels are summed per
name (templates and arguments cut): total us, launches, MB read, GB/s, share of the step.
Usage: decode_step_profile.py LOG.csv"""
import collections
import csv
import re
import sys


def short(name):
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    name = re.sub(r"\(.*", "", name)
    name = re.sub(r"<.*", "", name)
    name = name.replace("void ", "").strip()
    return name[-60:]


def main(path, prompt=False):
    launches = collections.OrderedDict()  # id -> [name, us, bytes]
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for row in csv.DictReader(lines):
        k = row["ID"]
        e = launches.setdefault(k, [row["Kernel Name"], 0.0, 0.0])
        v = float(row["Metric Value"].replace(",", "") or 0)
        if row["Metric Name"] == "gpu__time_duration.sum":
            e[1] = v / 1e3  # ns -> us
        elif row["Metric Name"] == "dram__bytes_read.sum":
            e[2] = v
    steps, cur = [], []
    for name, us, b in launches.values():
        if "embedding_kernel" in name and cur:
            steps.append(cur)
            cur = []
        cur.append((name, us, b))
    if cur:
        steps.append(cur)
    print(f"forwards seen: {len(steps)} (launches per forward: {[len(s) for s in steps]})")
    if prompt:
        if not steps:
            print("no forward seen")
            return
        step = steps[0]
    elif len(steps) < 3:
        print("not enough forwards to pick a decode step")
        return
    else:
        step = steps[-2]  # the last one may be cut by the run's end
    tot_us = sum(u for _, u, _ in step)
    tot_b = sum(b for _, _, b in step)
    agg = collections.defaultdict(lambda: [0.0, 0, 0.0])
    for name, us, b in step:
        a = agg[short(name)]
        a[0] += us
        a[1] += 1
        a[2] += b
    print(f"{'prompt' if prompt else 'decode step'}: {len(step)} kernels, {tot_us:.0f} us of kernel time, {tot_b / 1e6:.0f} MB read "
          f"({tot_b / max(tot_us, 1e-9) / 1e3:.0f} GB/s over the kernel time)")
    print(f"{'kernel':60s} {'us':>8s} {'n':>5s} {'us/launch':>9s} {'MB':>8s} {'GB/s':>6s} {'share':>6s}")
    for name, (us, n, b) in sorted(agg.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:60s} {us:8.1f} {n:5d} {us / n:9.2f} {b / 1e6:8.1f} {b / max(us, 1e-9) / 1e3:6.0f} "
              f"{100 * us / tot_us:5.1f}%")


if __name__ == "__main__":
    main(sys.argv[1], "--prompt" in sys.argv[2:])
