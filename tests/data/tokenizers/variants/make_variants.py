"""Makes tokenizer variants of the fixtures for options the four fixtures do not exercise, and
their reference outputs from Hugging Face `tokenizers` (run: python3 make_variants.py; needs the
`tokenizers` package). "tokens" here is id_to_token of each id (what Tokenizer::tokens(ids)
returns); Encoding.tokens differs only for lstrip / rstrip added tokens, whose text it shows. Each variant edits one fixture's tokenizer.json and records, for the
fixture's strings plus a few targeted ones, what `tokenizers` produces."""
import copy
import json
import os

import tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = os.path.dirname(HERE)

EXTRA = ["a <mask> b", "a  <mask>  b", "x<mask>y", "<mask>", " <mask>", "hello <extra> world",
         "HELLO <Extra> there", "ﬁve ① ㎏ Ｆｕｌｌ", "tabs\tand  spaces   ", "<|im_start|>user\nhi<|im_end|>",
         "zzz ¤¤ \u0000 end", "123 4567 89", "It's   OK,   they'll"]


def load(name):
    with open(os.path.join(BASE, name, "tokenizer.json"), encoding="utf-8") as f:
        return json.load(f)


def texts(name):
    with open(os.path.join(BASE, name, "reference.json"), encoding="utf-8") as f:
        return [c["text"] for c in json.load(f)["cases"]] + EXTRA


def added(tj, content, **kw):
    # `tokenizers` numbers new added tokens after the model vocab (and ignores other ids).
    id_ = max([len(tj["model"]["vocab"])] + [a["id"] + 1 for a in tj["added_tokens"]])
    t = {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": False}
    t.update(kw)
    return t


def variants():
    q = load("qwen2_bytelevel")
    v = copy.deepcopy(q)
    v["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    v["normalizer"] = {"type": "NFKC"}
    v["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]},
                                              "<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}}
    for content, kw in [("<mask>", dict(lstrip=True, special=True)), ("<extra>", dict(rstrip=True, normalized=True)),
                        ("there", dict(single_word=True, normalized=True))]:
        v["added_tokens"].append(added(v, content, **kw))
    yield "gpt2_regex_nfkc_flags", v

    v = copy.deepcopy(q)
    split = v["pre_tokenizer"]["pretokenizers"][0]
    for i, (behavior, invert) in enumerate([("Removed", False), ("MergedWithPrevious", False),
                                            ("MergedWithNext", False), ("Contiguous", True)]):
        w = copy.deepcopy(v)
        w["pre_tokenizer"]["pretokenizers"] = [
            {"type": "Split", "pattern": {"String": " "}, "behavior": behavior, "invert": invert},
            w["pre_tokenizer"]["pretokenizers"][1]]
        yield f"split_{behavior.lower()}{'_invert' if invert else ''}", w
    del split

    l = load("llama_sentencepiece_bpe")
    v = copy.deepcopy(l)
    v["model"]["byte_fallback"] = False
    v["added_tokens"].append(added(v, "<mask>", single_word=True, special=True))
    yield "llama_unk_fused", v
    v = copy.deepcopy(v)
    v["model"]["fuse_unk"] = False
    v["model"]["ignore_merges"] = True
    yield "llama_unk_ignore_merges", v


def main():
    for name, tj in variants():
        d = os.path.join(HERE, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False)
        tok = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        base = "llama_sentencepiece_bpe" if name.startswith("llama") else "qwen2_bytelevel"
        cases = []
        for t in texts(base):
            e = tok.encode(t, add_special_tokens=True)
            ns = tok.encode(t, add_special_tokens=False)
            cases.append({"text": t, "ids": e.ids, "ids_no_special": ns.ids, "tokens": [tok.id_to_token(i) for i in ns.ids],
                          "decoded": tok.decode(ns.ids, skip_special_tokens=False),
                          "decoded_skip_special": tok.decode(e.ids, skip_special_tokens=True)})
        with open(os.path.join(d, "reference.json"), "w", encoding="utf-8") as f:
            json.dump({"tokenizers_version": tokenizers.__version__, "cases": cases}, f, ensure_ascii=False)
        print(name, len(cases))


if __name__ == "__main__":
    main()
