#!/usr/bin/env python3
"""torch's sdpa backends (flash attention 2, cuDNN fused attention) on the shapes of
attention_lab.cpp, timed with triton.testing.do_bench: the libraries moex's own attention kernels
are weighed against (lab/cuda/attention_compare.sh runs both). One JSON line per case/backend."""
import json
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import triton.testing

CASES = [("qwen prefill 4096", 1, 0, 4096, 16, 16, 128), ("qwen decode b1 4096", 1, 4096, 1, 16, 16, 128),
         ("qwen decode b32 256", 32, 256, 1, 16, 16, 128), ("qwen decode b32 4096", 32, 4096, 1, 16, 16, 128),
         ("mixtral prefill 4096", 1, 0, 4096, 32, 8, 128), ("mixtral decode b32 4096", 32, 4096, 1, 32, 8, 128),
         ("gpt-oss prefill 4096", 1, 0, 4096, 64, 8, 64)]
for name, B, past, T, H, KV, D in CASES:
    q = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, KV, past + T, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    # A decode query sees every cached key (causal is trivially true); prefill is causal.
    causal = past == 0
    for label, be in (("torch flash", SDPBackend.FLASH_ATTENTION), ("torch cudnn", SDPBackend.CUDNN_ATTENTION),
                      ("torch efficient", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with sdpa_kernel(be):
                fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=KV != H)
                fn()
                ms = triton.testing.do_bench(fn)
        except Exception as e:  # a backend that does not take the shape
            print(json.dumps({"case": name, "engine": label, "error": str(e)[:120]}))
            continue
        print(json.dumps({"case": name, "engine": label, "ms": round(ms, 4)}))
