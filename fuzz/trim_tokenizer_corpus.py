#!/usr/bin/env python3
"""Seed corpus for fuzz_tokenizer_json: the tokenizers of tests/data/tokenizers cut down to their
first KEEP vocab ids (and the merges that stay inside them), so that each seed is a few KB and the
fuzzer spends its time on structure, not on a large vocab. Run from the repository root."""
import json
import pathlib

KEEP = 300
SOURCES = ["deepseek_v3_bytelevel", "llama_sentencepiece_bpe", "o200k_bytelevel", "qwen2_bytelevel",
           "variants/gpt2_regex_nfkc_flags", "variants/llama_unk_fused", "variants/split_contiguous_invert",
           "variants/split_mergedwithnext"]
root = pathlib.Path("tests/data/tokenizers")
out = pathlib.Path("fuzz/corpus_tokenizer_json")
out.mkdir(exist_ok=True)
for name in SOURCES:
    t = json.loads((root / name / "tokenizer.json").read_text())
    vocab = {k: v for k, v in t["model"]["vocab"].items() if v < KEEP}
    merges = []
    for m in t["model"].get("merges", []):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    t["model"]["vocab"] = vocab
    t["model"]["merges"] = merges
    t["added_tokens"] = [a for a in t.get("added_tokens", []) if a["id"] < KEEP or a["special"]]
    (out / (name.replace("/", "_") + ".json")).write_text(json.dumps(t, ensure_ascii=False, separators=(",", ":")))
