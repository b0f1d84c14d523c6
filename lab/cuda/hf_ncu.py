#!/usr/bin/env python3
"""One transformers experts forward (grouped_mm, compiled shape-static) inside a profiler range,
for ncu --profile-from-start off: which kernels torch runs for the MoE GEMMs (the names carry the
CUTLASS tile and cluster shapes), their times, clocks and DRAM / L2 traffic, next to moex's.
Usage: ncu --profile-from-start off --metrics ... python3 lab/cuda/hf_ncu.py mixtral-8x7b 4096"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import torch  # noqa: E402
from side_by_side import SHAPES, make_hf_experts, set_impl  # noqa: E402

shape, T = sys.argv[1], int(sys.argv[2])
E, k, H, I = SHAPES[shape]
ex, cfg = make_hf_experts(E, H, I, torch)
set_impl(cfg, "grouped_mm")
g = torch.Generator(device="cuda").manual_seed(1000 + T)
hidden = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g)
top = torch.rand(T, E, device="cuda", generator=g).topk(k, dim=-1)
idx, w = top.indices, torch.softmax(top.values, dim=-1).to(torch.float32)
fn = torch.compile(ex.forward, dynamic=False)
with torch.no_grad():
    for _ in range(5):
        fn(hidden, idx, w)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(2):
        fn(hidden, idx, w)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
print("done")
