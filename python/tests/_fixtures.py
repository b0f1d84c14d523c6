"""Shared by the Python tests: a numpy-only safetensors reader, the fixture paths, the experts
weights of a fixture model read from its checkpoint as the hub stores them, and the
skip-as-exit-77 runner that lets CTest count a skipped file."""
import json
import os
import struct
import sys
import unittest

import numpy as np

DATA = os.environ.get("MOEX_TEST_DATA") or os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data")
HF_TINY = os.path.join(DATA, "hf-tiny")
EXPERTS_MODELS = ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "deepseek_v3", "gpt_oss")
MODELS = EXPERTS_MODELS + ("qwen3_vl_moe",)

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
           "I32": np.int32, "U8": np.uint8, "I8": np.int8, "BOOL": np.bool_}


def read_safetensors(path):
    """{name: numpy array}; BF16 tensors are widened to float32 (exactly)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        raw = blob[base + begin:base + end]
        if meta["dtype"] == "BF16":
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, _DTYPES[meta["dtype"]])
        out[name] = a.reshape(meta["shape"]).copy()
    return out


def rel_l2(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def experts_fixture(model):
    """(weights dict for moex.experts_forward, layout kwargs, cases dict) of the experts module
    meta.json names, fused from the checkpoint's per-expert tensors where the hub stores them so."""
    d = os.path.join(HF_TINY, model)
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    with open(os.path.join(d, "checkpoint_fp32", "config.json")) as f:
        config = json.load(f)
    ckpt = read_safetensors(os.path.join(d, "checkpoint_fp32", "model.safetensors"))
    flags = meta["experts_flags"]
    prefix = meta["experts_module"]
    w = {}
    if prefix + ".gate_up_proj" in ckpt:  # stored fused (gpt-oss)
        w["gate_up_proj"] = ckpt[prefix + ".gate_up_proj"]
        w["down_proj"] = ckpt[prefix + ".down_proj"]
        if flags["has_bias"]:
            w["gate_up_proj_bias"] = ckpt[prefix + ".gate_up_proj_bias"]
            w["down_proj_bias"] = ckpt[prefix + ".down_proj_bias"]
    else:  # one tensor per expert and projection; Mixtral names them w1 (gate), w3 (up), w2 (down)
        names = ("gate_proj", "up_proj", "down_proj")
        if prefix + ".0.gate_proj.weight" not in ckpt:
            prefix = prefix.replace(".mlp.", ".block_sparse_moe.")
            names = ("w1", "w3", "w2")
        E = sum(1 for k in ckpt if k.startswith(prefix + ".") and k.endswith("." + names[0] + ".weight"))
        get = lambda e, n: ckpt[f"{prefix}.{e}.{n}.weight"]  # noqa: E731
        w["gate_up_proj"] = np.stack([np.concatenate([get(e, names[0]), get(e, names[1])]) for e in range(E)])
        w["down_proj"] = np.stack([get(e, names[2]) for e in range(E)])
    layout = dict(has_gate=flags["has_gate"], is_transposed=flags["is_transposed"],
                  is_concatenated=flags["is_concatenated"], activation=config.get("hidden_act", "silu"))
    if model == "gpt_oss":
        layout.update(activation="swiglu_oai", swiglu_limit=float(config.get("swiglu_limit", 7.0)), swiglu_alpha=1.702)
    cases = read_safetensors(os.path.join(d, "experts_cases.safetensors"))
    return w, layout, cases


def main():
    """unittest.main that exits 77 when every test was skipped (CTest: SKIP_RETURN_CODE)."""
    prog = unittest.main(exit=False, verbosity=2)
    r = prog.result
    if not r.wasSuccessful():
        sys.exit(1)
    if r.testsRun and len(r.skipped) == r.testsRun:
        sys.exit(77)
    sys.exit(0)
