"""Random strings and random id lists for the four fixtures, with what Hugging Face `tokenizers`
makes of them (run: python3 make_random.py; needs the `tokenizers` package). The alphabet mixes
the characters the split regexes treat specially: whitespace kinds (NBSP, U+0085, U+2028, ideographic
space), combining marks, digits of other scripts, CJK, emoji, contractions in both cases, and the
texts of special and byte tokens."""
import json
import os
import random

import tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
POOL = (list("abcXYZ  \t\n\r\n'sllvedm0123456789.,;:!?-_()[]{}<>|/\\\"") + list("éÅåñüßøçÉ") +
        ["e\u0301", "A\u030a", "\u00a0", "\u2003", "\u3000", "\u200b", "\u0085", "\u2028", "\u000b",
         "\u000c", "\u001c", "\ufffd", "\u0000"] +
        list("混合专家模型カタカナひらがな한국어ΕλληνικάРусскийعربي🤖🚀١٢٣①²½Ⅻ") +
        ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<0x41>", "▁", "Ġ", "'S", "'LL"])


def main():
    for name in ["qwen2_bytelevel", "o200k_bytelevel", "deepseek_v3_bytelevel", "llama_sentencepiece_bpe"]:
        rng = random.Random(name)
        tok = tokenizers.Tokenizer.from_file(os.path.join(os.path.dirname(HERE), name, "tokenizer.json"))
        cases = []
        for _ in range(200):
            t = "".join(rng.choice(POOL) for _ in range(rng.randint(0, 60)))
            e = tok.encode(t)
            ns = tok.encode(t, add_special_tokens=False)
            rnd = [rng.randrange(tok.get_vocab_size()) for _ in range(rng.randint(0, 12))]
            cases.append({"text": t, "ids": e.ids, "ids_no_special": ns.ids,
                          "decoded": tok.decode(ns.ids, skip_special_tokens=False),
                          "decoded_skip_special": tok.decode(e.ids, skip_special_tokens=True),
                          "random_ids": rnd, "random_ids_decoded": tok.decode(rnd, skip_special_tokens=False)})
        with open(os.path.join(HERE, name + ".json"), "w", encoding="utf-8") as f:
            json.dump({"tokenizers_version": tokenizers.__version__, "cases": cases}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
