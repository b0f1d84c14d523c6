#!/usr/bin/env python3
"""Experts cases made by transformers for the activations the model fixtures do not cover.

The hf-tiny fixtures (tests/data/hf-tiny) all use silu (or gpt-oss's clamped SwiGLU). This script
builds transformers' own experts module (Qwen2MoeExperts: gate_up_proj [E, 2I, H], down_proj
[E, H, I], concatenated gate/up halves) with hidden_act = gelu (exact erf) and relu, gives it
random weights and records its output, as experts_cases.safetensors does for the models:

  tests/data/activation-experts/<act>/experts_cases.safetensors
    gate_up_proj [E, 2I, H], down_proj [E, H, I]           float32, the module's weights
    T{T}_hidden [T, H], T{T}_top_k_index [T, k] int64, T{T}_top_k_weights [T, k], T{T}_out [T, H]
  tests/data/activation-experts/<act>/meta.json
    hidden_act, the module and activation classes, transformers and torch versions, seed

for T = 1, 7, 64. tests/test_experts_activation_fixtures.cpp reads them. Rerunnable: the same
versions and seed give the same bytes (CPU, float32; the versions live in meta.json because
safetensors writes its metadata map in no fixed order).

  python3 tools/make_activation_experts_cases.py [--out tests/data/activation-experts]
Needs torch and transformers (the fixtures were made with torch 2.11.0, transformers 5.17.0).
"""
import argparse
import json
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import Qwen2MoeConfig
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeExperts

E, H, I, K = 6, 32, 24, 2
SEED = 1
ACTIVATIONS = ("gelu", "relu")


def make_module(act: str) -> torch.nn.Module:
    config = Qwen2MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E,
                            num_experts_per_tok=K, hidden_act=act)
    # The plain loop over experts; the fixtures show the three implementations agree to ~1e-6.
    config._experts_implementation = "eager"
    experts = Qwen2MoeExperts(config).float().eval()
    with torch.no_grad():
        # Large enough that the activations see both signs and their curved region.
        experts.gate_up_proj.uniform_(-2.0 / H**0.5, 2.0 / H**0.5)
        experts.down_proj.uniform_(-1.0 / I**0.5, 1.0 / I**0.5)
    return experts


def routing(tokens: int, gen: torch.Generator):
    hidden = torch.empty(tokens, H).uniform_(-2.0, 2.0, generator=gen)
    scores = torch.randn(tokens, E, generator=gen)
    top_w, top_i = torch.topk(torch.softmax(scores, dim=-1), K, dim=-1)
    return hidden, top_i.to(torch.int64), top_w.float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                      "data", "activation-experts"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    for act in ACTIVATIONS:
        torch.manual_seed(SEED)
        experts = make_module(act)
        assert type(experts.act_fn).__name__ in ("GELUActivation", "ReLU", "GELU"), experts.act_fn
        gen = torch.Generator().manual_seed(SEED + 1000)
        tensors = {
            "gate_up_proj": experts.gate_up_proj.detach().clone().contiguous(),
            "down_proj": experts.down_proj.detach().clone().contiguous(),
        }
        for tokens in (1, 7, 64):
            hidden, idx, w = routing(tokens, gen)
            with torch.no_grad():
                out = experts(hidden, idx, w)
            p = f"T{tokens}_"
            tensors[p + "hidden"] = hidden.contiguous()
            tensors[p + "top_k_index"] = idx.contiguous()
            tensors[p + "top_k_weights"] = w.contiguous()
            tensors[p + "out"] = out.detach().float().contiguous()
        folder = os.path.join(args.out, act)
        os.makedirs(folder, exist_ok=True)
        meta = {"hidden_act": act, "experts_class": type(experts).__name__,
                "act_fn": type(experts.act_fn).__name__,
                "transformers": transformers.__version__, "torch": torch.__version__,
                "seed": SEED, "E": E, "H": H, "I": I, "top_k": K}
        path = os.path.join(folder, "experts_cases.safetensors")
        save_file(tensors, path)
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
        print(path, json.dumps(meta))


if __name__ == "__main__":
    main()
