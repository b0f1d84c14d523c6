#!/usr/bin/env python3
"""A random-weight DeepSeek-V3-style FP8 checkpoint, written tensor by tensor in the layout the
hub's FP8 checkpoints use, for end-to-end runs at sizes transformers cannot save in bf16 on one
machine (the DeepSeek-V3 shape of hf_checkpoints.py with 256 experts is 68 GB in bf16, 34 GB in
FP8).

Layout (as tests/data/hf-tiny/deepseek_v3_fp8_float, which transformers 5.17 wrote):
  - config.json: the model config + quantization_config {quant_method fp8, fmt e4m3,
    activation_scheme dynamic, weight_block_size [128, 128], scale_fmt float | ue8m0};
  - F8_E4M3 weights with `weight_scale_inv` [ceil(N/128), ceil(K/128)] (F32, or F8_E8M0 powers
    of two) for every linear but embeddings, lm_head, the router and kv_a_proj_with_mqa (BF16);
  - per-expert tensors model.layers.L.mlp.experts.E.{gate,up,down}_proj, one shard per layer,
    model.safetensors.index.json.
Values: normal(0, 0.02) per weight (transformers' initializer_range), quantized per 128 x 128
block with scale = amax / 448 (UE8M0: rounded up to a power of two), norms 1, router bias 0.

Needs torch (CUDA used when present, for speed) and safetensors.

  python3 bench/fp8_checkpoint.py --out /tmp/dsv3_fp8 [--shape deepseek-v3] [--layers 4]
      [--experts 256] [--scale-fmt float|ue8m0] [--seed 0] [--override JSON]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_checkpoints import MODELS, log, resolve  # noqa: E402


def quantize_block(w, torch, ue8m0):
    """[N, K] float -> (e4m3 [N, K], scale [ceil(N/128), ceil(K/128)] float32): w ~ q * scale."""
    N, K = w.shape
    nb, kb = (N + 127) // 128, (K + 127) // 128
    pad = torch.zeros(nb * 128, kb * 128, dtype=torch.float32, device=w.device)
    pad[:N, :K] = w
    blocks = pad.view(nb, 128, kb, 128)
    scale = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12) / 448.0
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (blocks / scale[:, None, :, None]).clamp(-448, 448).view(nb * 128, kb * 128)[:N, :K]
    return q.to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="deepseek-v3")
    ap.add_argument("--layers", type=int, default=0, help="default: the shape's")
    ap.add_argument("--experts", type=int, default=0, help="routed experts (default: the shape's)")
    ap.add_argument("--scale-fmt", default="float", choices=["float", "ue8m0"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--override", default="{}",
                    help='JSON of config fields to change, e.g. \'{"hidden_size": 256}\' for a small smoke run')
    args = ap.parse_args()
    import torch
    from safetensors.torch import save_file

    model_type, cfg = MODELS[resolve(args.shape)]
    if model_type != "deepseek_v3":
        sys.exit("fp8_checkpoint.py: only DeepSeek-V3-style shapes (MLA, per-expert tensors)")
    cfg = dict(cfg)
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    if args.experts:
        cfg["n_routed_experts"] = args.experts
    cfg.update(json.loads(args.override))
    cfg["qk_head_dim"] = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    cfg["head_dim"] = cfg["qk_rope_head_dim"]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(args.seed)
    ue8m0 = args.scale_fmt == "ue8m0"
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    heads, qr, kvr = cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    E, I, Id = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["intermediate_size"]
    os.makedirs(args.out, exist_ok=True)

    def normal(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * 0.02

    def bf16(*shape):
        return normal(*shape).to(torch.bfloat16).cpu()

    def fp8(out, name, N, K):
        q, s = quantize_block(normal(N, K), torch, ue8m0)
        out[name + ".weight"] = q.cpu()
        if ue8m0:  # F8_E8M0: the exponent byte of a power of two
            e = (torch.log2(s).round() + 127).clamp(0, 254).to(torch.uint8).cpu()
            out[name + ".weight_scale_inv"] = e.view(torch.float8_e8m0fnu)
        else:
            out[name + ".weight_scale_inv"] = s.cpu()

    layers = cfg["num_hidden_layers"]
    shards = []
    weight_map = {}

    def save(tensors, i):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, layers + 1)
        t0 = time.time()
        save_file(tensors, os.path.join(args.out, name), metadata={"format": "pt"})
        for k in tensors:
            weight_map[k] = name
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        log("%s: %d tensors, %.2f GB, %.1f s" % (name, len(tensors), size / 1e9, time.time() - t0))
        shards.append(name)

    for L in range(layers):
        t = {}
        p = "model.layers.%d." % L
        t[p + "input_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        t[p + "post_attention_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        a = p + "self_attn."
        fp8(t, a + "q_a_proj", qr, H)
        t[a + "q_a_layernorm.weight"] = torch.ones(qr, dtype=torch.bfloat16)
        fp8(t, a + "q_b_proj", heads * (nope + rope), qr)
        t[a + "kv_a_proj_with_mqa.weight"] = bf16(kvr + rope, H)
        t[a + "kv_a_layernorm.weight"] = torch.ones(kvr, dtype=torch.bfloat16)
        fp8(t, a + "kv_b_proj", heads * (nope + vd), kvr)
        fp8(t, a + "o_proj", H, heads * vd)
        m = p + "mlp."
        if L < cfg["first_k_dense_replace"]:
            fp8(t, m + "gate_proj", Id, H)
            fp8(t, m + "up_proj", Id, H)
            fp8(t, m + "down_proj", H, Id)
        else:
            t[m + "gate.weight"] = bf16(E, H)
            t[m + "gate.e_score_correction_bias"] = torch.zeros(E, dtype=torch.float32)
            S = I * cfg["n_shared_experts"]
            fp8(t, m + "shared_experts.gate_proj", S, H)
            fp8(t, m + "shared_experts.up_proj", S, H)
            fp8(t, m + "shared_experts.down_proj", H, S)
            for e in range(E):
                x = m + "experts.%d." % e
                fp8(t, x + "gate_proj", I, H)
                fp8(t, x + "up_proj", I, H)
                fp8(t, x + "down_proj", H, I)
        save(t, L)
    save({"model.embed_tokens.weight": bf16(V, H), "lm_head.weight": bf16(V, H),
          "model.norm.weight": torch.ones(H, dtype=torch.bfloat16)}, layers)

    config = dict(cfg, architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
                  hidden_act="silu", torch_dtype="bfloat16", bos_token_id=0, eos_token_id=1,
                  initializer_range=0.02, rope_interleave=True, attention_bias=False,
                  rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
                  quantization_config={"quant_method": "fp8", "fmt": "e4m3",
                                       "activation_scheme": "dynamic",
                                       "weight_block_size": [128, 128],
                                       "scale_fmt": args.scale_fmt})
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    total = sum(os.path.getsize(os.path.join(args.out, s)) for s in shards)
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    log("wrote %s: %d shards, %.2f GB" % (args.out, len(shards), total / 1e9))


if __name__ == "__main__":
    main()
