"""moex.from_pretrained on the fixture checkpoints: logits and greedy generate against what
transformers recorded, bf16 within bf16 tolerance, run-time backend switching and the errors of
the model API. Needs numpy only."""
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import _fixtures  # noqa: E402

import moex  # noqa: E402

BF16_TOL = 4.0 * 2.0 ** -8  # as tests/test_model_fixtures.cpp: a few bf16 units


def checkpoint(model, kind="fp32"):
    return os.path.join(_fixtures.HF_TINY, model, f"checkpoint_{kind}")


def reference(model):
    return _fixtures.read_safetensors(os.path.join(_fixtures.HF_TINY, model, "reference.safetensors"))


class ModelFixtures(unittest.TestCase):
    def test_logits_and_greedy_fp32(self):
        for model in _fixtures.EXPERTS_MODELS:
            ref = reference(model)
            for backend in ("eager", "batched_mm", "grouped_mm"):
                with self.subTest(model=model, backend=backend):
                    lm = moex.from_pretrained(checkpoint(model), experts_implementation=backend)
                    logits = lm.logits(ref["input_ids"])
                    self.assertEqual(logits.dtype, np.float32)
                    self.assertEqual(logits.shape, ref[f"logits_fp32_{backend}"].shape)
                    self.assertLessEqual(_fixtures.rel_l2(logits, ref[f"logits_fp32_{backend}"]), 1e-5)
            greedy = ref["greedy_fp32"]
            prompt = ref["input_ids"][:1]
            seq = lm.generate(prompt, max_new_tokens=greedy.shape[1] - prompt.shape[1])
            np.testing.assert_array_equal(seq, greedy, err_msg=model)
            # The CPU never switches the decode stage: it ran the caller's backend.
            stats = lm.last_generation_stats
            self.assertEqual(stats["new_tokens"], greedy.shape[1] - prompt.shape[1])
            self.assertEqual(stats["decode_experts_implementation"][""], "grouped_mm")
            self.assertEqual(stats["decode_switch_note"], "")

    def test_bf16(self):
        ref = reference("qwen2_moe")
        lm = moex.from_pretrained(checkpoint("qwen2_moe", "bf16"), dtype="bfloat16")
        self.assertEqual(lm.info["dtype"], "bfloat16")
        err = _fixtures.rel_l2(lm.logits(ref["input_ids"]), ref["logits_bf16_grouped_mm"])
        self.assertLessEqual(err, BF16_TOL)

    def test_sub_configs_and_switching(self):
        model = "qwen3_vl_moe"
        ref = reference(model)
        lm = moex.from_pretrained(checkpoint(model), experts_implementation={"text_config": "eager"})
        self.assertEqual(lm.get_experts_implementation()["text_config"], "eager")
        self.assertLessEqual(_fixtures.rel_l2(lm.logits(ref["input_ids"].tolist()), ref["logits_fp32_text_only"]), 1e-4)
        lm.set_experts_implementation("batched_mm")
        self.assertEqual(set(lm.get_experts_implementation().values()), {"batched_mm"})
        with self.assertRaisesRegex(moex.UnknownName, "unknown experts backend 'nope'"):
            lm.set_experts_implementation({"": "nope"})
        self.assertEqual(set(lm.get_experts_implementation().values()), {"batched_mm"})  # unchanged

    def test_errors(self):
        with self.assertRaises(moex.Error):
            moex.from_pretrained(os.path.join(_fixtures.HF_TINY, "no_such_model"))
        with self.assertRaisesRegex(ValueError, "device"):
            moex.from_pretrained(checkpoint("olmoe"), device="tpu")
        lm = moex.from_pretrained(checkpoint("olmoe"))
        vocab = lm.info["vocab_size"]
        with self.assertRaisesRegex(moex.InvalidInput, "outside the vocabulary"):
            lm.logits([[1, 2, vocab]])
        with self.assertRaisesRegex(moex.InvalidInput, "empty prompt"):
            lm.logits(np.zeros((1, 0), np.int64))
        with self.assertRaisesRegex(ValueError, "decode_switch"):
            lm.generate([[1, 2]], decode_switch="sometimes")


if __name__ == "__main__":
    _fixtures.main()
