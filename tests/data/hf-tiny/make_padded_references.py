#!/usr/bin/env python3
"""Left-padded batch references made by transformers for three of the hf-tiny fixtures.

A batch of four prompts of lengths 13, 9, 1 and 5 (seeded ids), left-padded to 13 with a
different in-vocabulary id per row (0, 67, 134, 201: the padding content must not matter) and an
attention mask, as a tokenizer with padding_side="left" returns them, run by transformers on the
fixture checkpoints of this folder:

  hf-tiny/<model_type>/padded_reference.safetensors
    input_ids       int64 [4, 13]  the padded batch
    attention_mask  int64 [4, 13]  0 = padding, 1 = token
    logits_fp32     float32 [4, 13, vocab]  model(input_ids, attention_mask=...) in fp32
    logits_bf16     float32 [4, 13, vocab]  the same with checkpoint_bf16 run in bf16
    greedy_fp32     int64 [4, 21]  generate(input_ids, attention_mask=..., max_new_tokens=8,
                                   do_sample=False) in fp32, stop tokens off, prompts included

Logits at padding positions are whatever transformers computes there (its attention masks every
key of a padding query); compare only the real positions. Models: qwen2_moe (shared expert,
sdpa attention), gpt_oss (eager attention with sinks, sliding window 8 on layer 0, shorter than
the longest prompt), deepseek_v3 (MLA attention, interleaved rope). Experts run by transformers'
default backend (grouped_mm; the three backends agree to ~1e-6, see README.md).

Rerunnable: the same versions give the same bytes (CPU, float32 math; the versions are written
to padded_reference.json because safetensors stores its metadata map in no fixed order).

  python3 tests/data/hf-tiny/make_padded_references.py [--root tests/data/hf-tiny]
Needs torch and transformers 5.17 (made with transformers 5.17.0 and torch 2.15.0, CPU).
"""
import argparse
import json
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

MODELS = ("qwen2_moe", "gpt_oss", "deepseek_v3")
LENGTHS = (13, 9, 1, 5)
PAD_IDS = (0, 67, 134, 201)
NEW_TOKENS = 8
SEED = 7


def batch(vocab: int):
    gen = torch.Generator().manual_seed(SEED)
    width = max(LENGTHS)
    ids = torch.empty(len(LENGTHS), width, dtype=torch.int64)
    mask = torch.zeros(len(LENGTHS), width, dtype=torch.int64)
    for b, (n, pad_id) in enumerate(zip(LENGTHS, PAD_IDS)):
        ids[b, : width - n] = pad_id
        ids[b, width - n :] = torch.randint(0, vocab, (n,), generator=gen)
        mask[b, width - n :] = 1
    return ids, mask


def load(path: str, dtype: torch.dtype):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.abspath(__file__)))
    args = parser.parse_args()
    torch.manual_seed(0)
    for name in MODELS:
        root = os.path.join(args.root, name)
        fp32 = load(os.path.join(root, "checkpoint_fp32"), torch.float32)
        ids, mask = batch(fp32.config.vocab_size)
        out = {"input_ids": ids, "attention_mask": mask}
        with torch.no_grad():
            out["logits_fp32"] = fp32(input_ids=ids, attention_mask=mask).logits.float().contiguous()
            # Stop tokens off, so that every row runs all steps (moex pads finished rows with their
            # stop token, transformers with pad_token_id: equal only while nothing stops).
            fp32.generation_config.eos_token_id = None
            out["greedy_fp32"] = fp32.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                                               min_new_tokens=NEW_TOKENS, do_sample=False,
                                               pad_token_id=0, eos_token_id=None).contiguous()
            bf16 = load(os.path.join(root, "checkpoint_bf16"), torch.bfloat16)
            out["logits_bf16"] = bf16(input_ids=ids, attention_mask=mask).logits.float().contiguous()
        save_file(out, os.path.join(root, "padded_reference.safetensors"))
        meta = {"transformers": transformers.__version__, "torch": torch.__version__,
                "lengths": list(LENGTHS), "pad_ids": list(PAD_IDS), "seed": SEED,
                "max_new_tokens": NEW_TOKENS,
                "attn_implementation": fp32.config._attn_implementation,
                "experts_implementation": fp32.get_experts_implementation()
                if hasattr(fp32, "get_experts_implementation") else None}
        with open(os.path.join(root, "padded_reference.json"), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
        print(name, {k: list(v.shape) for k, v in out.items()}, meta["attn_implementation"])


if __name__ == "__main__":
    main()
